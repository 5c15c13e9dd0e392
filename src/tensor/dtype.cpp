#include "tensor/dtype.h"

#include <array>
#include <cctype>

#include "core/check.h"

namespace td {
namespace {

struct Entry {
    DType type;
    DTypeTraits traits;
};

// Block layouts (bytes per block) follow ggml's definitions:
//   q4_0: f16 d + 16 bytes of nibbles              = 18 per 32
//   q4_1: f16 d, f16 m + 16 bytes                  = 20 per 32
//   q5_0: f16 d + 4 bytes high bits + 16 bytes     = 22 per 32
//   q5_1: f16 d, f16 m + 4 + 16                    = 24 per 32
//   q8_0: f16 d + 32 int8                          = 34 per 32
//   q8_1: f16 d, f16 s + 32 int8                   = 36 per 32
//   q2_k: 16 scales + 64 qs + f16 d + f16 dmin     = 84 per 256
//   q3_k: 32 hmask + 64 qs + 12 scales + f16 d     = 110 per 256
//   q4_k: f16 d, f16 dmin + 12 scales + 128 qs     = 144 per 256
//   q5_k: f16 d, f16 dmin + 12 scales + 32 qh + 128 qs = 176 per 256
//   q6_k: 128 ql + 64 qh + 16 scales + f16 d       = 210 per 256
//   q8_k: f32 d + 256 int8 + 16 int16 bsums        = 292 per 256
constexpr std::array<Entry, 20> kTable = {{
    {DType::f32, {"f32", 1, 4, false, true}},       {DType::f16, {"f16", 1, 2, false, true}},
    {DType::q4_0, {"q4_0", 32, 18, true, true}},    {DType::q4_1, {"q4_1", 32, 20, true, true}},
    {DType::q5_0, {"q5_0", 32, 22, true, true}},    {DType::q5_1, {"q5_1", 32, 24, true, true}},
    {DType::q8_0, {"q8_0", 32, 34, true, true}},    {DType::q8_1, {"q8_1", 32, 36, true, true}},
    {DType::q2_k, {"q2_k", 256, 84, true, true}},  {DType::q3_k, {"q3_k", 256, 110, true, true}},
    {DType::q4_k, {"q4_k", 256, 144, true, true}}, {DType::q5_k, {"q5_k", 256, 176, true, true}},
    {DType::q6_k, {"q6_k", 256, 210, true, true}}, {DType::q8_k, {"q8_k", 256, 292, true, true}},
    {DType::i8, {"i8", 1, 1, false, false}},        {DType::i16, {"i16", 1, 2, false, false}},
    {DType::i32, {"i32", 1, 4, false, false}},      {DType::i64, {"i64", 1, 8, false, false}},
    {DType::f64, {"f64", 1, 8, false, false}},      {DType::bf16, {"bf16", 1, 2, false, true}},
}};

const Entry *find_entry(uint32_t id) {
    for (const auto &e : kTable)
        if (static_cast<uint32_t>(e.type) == id) return &e;
    return nullptr;
}

}  // namespace

bool dtype_is_known(uint32_t id) {
    return find_entry(id) != nullptr;
}

const DTypeTraits &dtype_traits(DType type) {
    const Entry *e = find_entry(static_cast<uint32_t>(type));
    TD_ASSERT(e != nullptr, "unknown dtype id {}", static_cast<uint32_t>(type));
    return e->traits;
}

Result<DType> dtype_from_name(std::string_view name) {
    std::string lower(name);
    for (auto &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (const auto &e : kTable)
        if (lower == e.traits.name) return e.type;
    std::string names;
    for (const auto &e : kTable) {
        if (!e.traits.supported) continue;
        if (!names.empty()) names += ", ";
        names += e.traits.name;
    }
    return invalid_input("unknown type '{}' (known: {})", name, names);
}

size_t dtype_row_bytes(DType type, int64_t n) {
    const DTypeTraits &t = dtype_traits(type);
    TD_ASSERT(n % t.block_size == 0, "{} elements is not a multiple of {}'s block size {}", n, t.name,
              t.block_size);
    return static_cast<size_t>(n / t.block_size) * t.block_bytes;
}

}  // namespace td
