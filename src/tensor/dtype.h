// Element types and block layouts, numbered exactly as GGUF/ggml numbers them (the ids are on disk).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace td {

enum class DType : uint32_t {
    f32 = 0,
    f16 = 1,
    q4_0 = 2,
    q4_1 = 3,
    q5_0 = 6,
    q5_1 = 7,
    q8_0 = 8,
    q8_1 = 9,
    q2_k = 10,
    q3_k = 11,
    q4_k = 12,
    q5_k = 13,
    q6_k = 14,
    q8_k = 15,
    i8 = 24,
    i16 = 25,
    i32 = 26,
    i64 = 27,
    f64 = 28,
    bf16 = 30,
};

struct DTypeTraits {
    const char *name;    // lower case, as llama.cpp prints: "f32", "q4_0", "q6_k"
    int64_t block_size;  // elements per block (1 for plain types)
    size_t block_bytes;  // bytes per block
    bool quantized;
    bool supported;  // tandem can compute with it (dequantize + dot); false = known but not yet
};

// True for every id ggml defines that tandem knows the layout of (supported or not).
bool dtype_is_known(uint32_t id);
// Traits of a known type; asserts on an unknown id (check dtype_is_known first for file data).
const DTypeTraits &dtype_traits(DType type);
inline const char *dtype_name(DType type) {
    return dtype_traits(type).name;
}
// Parses "q4_0", "Q4_0", "f16", ... Error names the accepted values.
Result<DType> dtype_from_name(std::string_view name);

// Bytes for one row of n elements. n must be a multiple of the block size (asserted).
size_t dtype_row_bytes(DType type, int64_t n);

}  // namespace td
