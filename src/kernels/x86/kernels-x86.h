// x86 SIMD kernels, one namespace per ISA. Each *-avx2.cpp file is compiled with -mavx2 -mfma -mf16c (and
// *-avx512.cpp with the AVX-512 flags) and nothing else is: dispatch.cpp calls them only after cpuid says the
// CPU has the ISA. Contracts are those of the reference functions of the same name (ref/quants-ref.h).
#pragma once

#include <cstdint>

namespace td::kernels::avx2 {

void from_float_f16(const float *src, void *dst, int64_t n);
void from_float_q8_0(const float *src, void *dst, int64_t n);

void vec_dot_f32_f32(int64_t n, float *s, const void *x, const void *y);
void vec_dot_f16_f16(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *x, const void *y);

}  // namespace td::kernels::avx2
