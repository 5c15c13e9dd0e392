// Scalar reference kernels for every supported tensor type: the oracle each ISA variant is tested against.
//
// to_float_T(src, dst, n):    dst[0..n) = the values of n elements of type T            (dequantize)
// from_float_T(src, dst, n):  n floats -> n elements of type T, bytes identical to ggml's reference
//                             quantizer (quantize_row_T_ref), so files and activations match llama.cpp
// vec_dot_T_U(n, s, x, y):    *s = dot(x, y) over n elements, x of type T, y of type U (T's vec_dot_type)
//
// For the block types n must be a multiple of 32 (asserted). Block dot products follow the lane order of
// kernels/blocks.h; float dot products accumulate in double.
#pragma once

#include <cstdint>

namespace td::kernels::ref {

void to_float_f32(const void *src, float *dst, int64_t n);
void to_float_f16(const void *src, float *dst, int64_t n);
void to_float_bf16(const void *src, float *dst, int64_t n);
void to_float_q4_0(const void *src, float *dst, int64_t n);
void to_float_q4_1(const void *src, float *dst, int64_t n);
void to_float_q5_0(const void *src, float *dst, int64_t n);
void to_float_q5_1(const void *src, float *dst, int64_t n);
void to_float_q8_0(const void *src, float *dst, int64_t n);
void to_float_q8_1(const void *src, float *dst, int64_t n);

void from_float_f32(const float *src, void *dst, int64_t n);
void from_float_f16(const float *src, void *dst, int64_t n);
void from_float_bf16(const float *src, void *dst, int64_t n);
void from_float_q4_0(const float *src, void *dst, int64_t n);
void from_float_q4_1(const float *src, void *dst, int64_t n);
void from_float_q5_0(const float *src, void *dst, int64_t n);
void from_float_q5_1(const float *src, void *dst, int64_t n);
void from_float_q8_0(const float *src, void *dst, int64_t n);
void from_float_q8_1(const float *src, void *dst, int64_t n);

void vec_dot_f32_f32(int64_t n, float *s, const void *x, const void *y);
void vec_dot_f16_f16(int64_t n, float *s, const void *x, const void *y);
void vec_dot_bf16_bf16(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_1_q8_1(int64_t n, float *s, const void *x, const void *y);

}  // namespace td::kernels::ref
