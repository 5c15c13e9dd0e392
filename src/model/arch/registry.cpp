#include "model/arch/arch.h"

namespace td {
namespace {
const std::vector<const Architecture *> &registry() {
    static const std::vector<const Architecture *> all = {&arch_llama(), &arch_qwen2(), &arch_qwen3(),
                                                          &arch_gemma(), &arch_gemma2()};
    return all;
}
}  // namespace

const Architecture *find_architecture(std::string_view name) {
    for (const Architecture *a : registry())
        if (a->name == name) return a;
    return nullptr;
}

std::vector<std::string_view> architecture_names() {
    std::vector<std::string_view> names;
    for (const Architecture *a : registry()) names.push_back(a->name);
    return names;
}

}  // namespace td
