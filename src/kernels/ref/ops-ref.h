// Scalar reference row ops: the oracle every ISA variant is tested against. Contracts are those of the
// functions of the same name in kernels/ops.h, which dispatch here or to an ISA variant.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace td::kernels::ref {

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p);
void softmax(float *x, int64_t n);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
void add_inplace(float *y, const float *x, int64_t n);
void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores, float *out);
void store_row(const float *src, void *dst, bool to_f16, int64_t n);

}  // namespace td::kernels::ref
