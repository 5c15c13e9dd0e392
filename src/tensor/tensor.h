// A non-owning view of a tensor in memory (usually inside the mmapped GGUF file).
// ne[0] is the innermost (row) dimension, as in GGUF: a weight matrix W of shape [n_out, n_in] has
// ne = {n_in, n_out}; row r starts at data + r * row_bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tensor/dtype.h"

namespace td {

struct TensorView {
    std::string name;
    DType type = DType::f32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};  // [ne0 = row length, ne1 = rows, ne2, ne3]
    const void *data = nullptr;
    // The same matrix in the packed layout of kernels/pack.h (faster matmul), or nullptr. data stays valid:
    // row lookups, hashing and streaming read the GGUF bytes.
    const void *packed = nullptr;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
    size_t row_bytes() const { return dtype_row_bytes(type, ne[0]); }
    size_t n_bytes() const { return row_bytes() * static_cast<size_t>(n_rows()); }
    const uint8_t *row(int64_t r) const {
        return static_cast<const uint8_t *>(data) + static_cast<size_t>(r) * row_bytes();
    }
};

}  // namespace td
