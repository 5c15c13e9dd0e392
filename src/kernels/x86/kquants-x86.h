// x86 SIMD kernels for the K-quants. kquants-avx2.cpp is compiled with -mavx2 -mfma -mf16c; dispatch.cpp
// calls these only after cpuid says the CPU has them. Contracts (including the exact float order the results
// reproduce bit for bit) are those of the reference functions of the same name (ref/kquants-ref.h).
#pragma once

#include <cstdint>

namespace td::kernels::avx2 {

void from_float_q8_k(const float *src, void *dst, int64_t n);

void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *x, const void *y);

}  // namespace td::kernels::avx2
