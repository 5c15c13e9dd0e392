// NEON kernels (aarch64, where NEON is baseline): declared here, named in dispatch.cpp's NEON table, tested
// bit for bit against the scalar reference like every other ISA (tests/test-kernels*.cpp run each ISA this
// architecture has). Only baseline ARMv8.0 instructions: no dot-product extension is assumed.
#pragma once

#include <cstdint>

#include "kernels/ops.h"

namespace td::kernels::neon {

// Quantizers and dot products (quants-neon.cpp), one per kernels.h table entry.
void from_float_f16(const float *src, void *dst, int64_t n);
void from_float_q8_0(const float *src, void *dst, int64_t n);
void from_float_q8_1(const float *src, void *dst, int64_t n);
void from_float_q8_k(const float *src, void *dst, int64_t n);
void vec_dot_f32_f32(int64_t n, float *s, const void *x, const void *y);
void vec_dot_f16_f16(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *x, const void *y);

// kernels/ops.h row ops (ops-neon.cpp).
void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
void add_inplace(float *y, const float *x, int64_t n);
void store_row(const float *src, void *dst, bool to_f16, int64_t n);
// kernels/ops.h attention_group over an f16 cache (ops-neon.cpp).
void attention_group_f16(const float *q, int32_t n_q, const void *k, const void *v, int64_t kv_stride,
                         int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores,
                         float *out);

}  // namespace td::kernels::neon
