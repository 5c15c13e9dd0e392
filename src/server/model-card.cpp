#include "server/model-card.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "server/infill.h"

namespace td::server {

ModelCard model_card(const Model &model, const Vocab &vocab, const ChatFormatter &chat_template) {
    const gguf::File &f = model.file();
    const HParams &hp = model.hparams();
    ModelCard c;
    c.path = f.path();
    c.size_bytes = f.file_size();
    struct stat st {};
    if (::stat(c.path.c_str(), &st) == 0) c.modified_unix = st.st_mtime;
    // The header and tensor table say what the file holds; hashing gigabytes of weights at start would not.
    const size_t n = std::min(f.data_offset(), f.file_size());
    c.digest = fmt::format("xxh3:{:016x}", XXH3_64bits_withSeed(f.mapping().data(), n, c.size_bytes));
    c.arch = hp.arch;
    c.name = hp.name;
    std::map<DType, uint64_t> bytes_by_type;
    for (const gguf::TensorInfo &t : f.tensors()) {
        c.n_params += static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
        bytes_by_type[t.type] += t.n_bytes;
    }
    const auto most = std::max_element(bytes_by_type.begin(), bytes_by_type.end(),
                                       [](const auto &a, const auto &b) { return a.second < b.second; });
    if (most != bytes_by_type.end()) {
        c.quantization = dtype_name(most->first);
        for (char &ch : c.quantization) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    }
    c.n_ctx_train = hp.n_ctx_train;
    c.n_embd = hp.n_embd;
    c.n_layer = hp.n_layer;
    c.n_head = hp.n_head;
    c.n_head_kv = hp.n_head_kv;
    c.n_vocab = hp.n_vocab;
    if (auto t = f.get_string_opt("tokenizer.chat_template"); t.ok() && t->has_value()) c.chat_template = **t;
    c.template_family = chat_template.name();
    c.has_template = !chat_template.fallback();
    c.fill_in_middle = infill_supported(vocab).ok();
    return c;
}

std::string parameter_size(uint64_t n) {
    const double v = static_cast<double>(n);
    if (v >= 1e9) return fmt::format("{:.1f}B", v / 1e9);
    if (v >= 1e6) return fmt::format("{:.1f}M", v / 1e6);
    if (v >= 1e3) return fmt::format("{:.0f}K", v / 1e3);
    return fmt::format("{}", n);
}

}  // namespace td::server
