// Internal to kernels/: the tile-kernel signature matmul() dispatches to, and where each path is chosen.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace td::kernels {

// y[t * y_stride + r] = vec_dot(n, w row r, x row t) for r < n_rows, t < n_tokens, bit for bit: w rows are
// w_stride bytes apart, x rows (already in the weight type's vec_dot_type) x_stride bytes apart.
using GemmFn = void (*)(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                        int64_t y_stride, int64_t n_rows, int64_t n_tokens);

// The active ISA's matrix-matrix kernel for a weight type (n_tokens > 1), or nullptr: vec_dot per element.
GemmFn gemm_for(DType type);
// The K-quant part of gemm_for (gemm-kquants.cpp): q2_K..q6_K weights, or nullptr.
GemmFn gemm_kquants_for(DType type);
// The active ISA's matrix-vector kernel for a weight type (n_tokens == 1), or nullptr: vec_dot per row
// (gemv.cpp).
GemmFn gemv_for(DType type);
// The active ISA's kernel on packed weights (kernels/pack.h) for a batch of n_tokens, or nullptr: matmul then
// runs gemm_from_packed_for's kernel, or unpacks each chunk of rows and runs gemm_for / gemv_for on it
// (gemv.cpp).
GemmFn gemm_packed_for(DType type, int64_t n_tokens);
// Where gemm_packed_for has no kernel for a batch: a row-major tile kernel that reads packed groups itself
// (w at the group holding the call's first row, rows in multiples of 16), or nullptr: matmul unpacks chunks
// of rows first (gemm-kquants.cpp).
GemmFn gemm_from_packed_for(DType type);

}  // namespace td::kernels
