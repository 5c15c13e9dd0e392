// NEON kernels (aarch64, where NEON is baseline): declared here, named in dispatch.cpp's NEON table, tested
// bit for bit against the scalar reference like every other ISA (tests/test-kernels*.cpp run each ISA this
// architecture has). Only baseline ARMv8.0 instructions: no dot-product extension is assumed.
#pragma once

#include <cstdint>

namespace td::kernels::neon {

void from_float_q8_0(const float *src, void *dst, int64_t n);
void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *x, const void *y);

}  // namespace td::kernels::neon
