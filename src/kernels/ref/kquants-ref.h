// Scalar reference kernels for the K-quants (q2_k, q3_k, q4_k, q5_k, q6_k and the activation type q8_k):
// the oracle each ISA variant is tested against. Layouts: kernels/blocks.h (ggml's block_q*_K).
//
// to_float_T(src, dst, n):    dst[0..n) = the values of n elements of type T            (dequantize)
// from_float_T(src, dst, n):  n floats -> n elements of type T, bytes identical to ggml's quantize_row_T_ref
//                             (what llama-quantize writes without an importance matrix). q8_k: one
//                             deviation, an all-zero super-block gets bsums = 0 (ggml leaves them unset).
// vec_dot_T_q8_k(n, s, x, y): *s = dot(x, y) over n elements, y of type q8_k (every K type's vec_dot_type).
//
// n must be a multiple of 256 (asserted). y operands must come from from_float_q8_k (qs never -128).
//
// Dot product order (every ISA reproduces it bit for bit): per super-block b, the integer sums are exact
// int32, then one float expression per type gives the block's value v, which is added into lane b % 8 of an
// accumulator; the lanes are summed with dot_lanes_sum (kernels/blocks.h):
//   q2_k, q4_k, q5_k: v = (half(x.d) * y.d) * float(sumi) - (half(x.dmin) * y.d) * float(summ)
//                     sumi = sum_g sc_g * sum_{e in g} q_e y_e,  summ = sum_g m_g * sum_{e in g} y_e
//   q3_k, q6_k:       v = (half(x.d) * y.d) * float(sumi),  sumi = sum_g s_g * sum_{e in g} q_e y_e (signed
//   q) q8_k:             v = (x.d * y.d) * float(sumi)
#pragma once

#include <cstdint>

namespace td::kernels::ref {

void to_float_q2_k(const void *src, float *dst, int64_t n);
void to_float_q3_k(const void *src, float *dst, int64_t n);
void to_float_q4_k(const void *src, float *dst, int64_t n);
void to_float_q5_k(const void *src, float *dst, int64_t n);
void to_float_q6_k(const void *src, float *dst, int64_t n);
void to_float_q8_k(const void *src, float *dst, int64_t n);

void from_float_q2_k(const float *src, void *dst, int64_t n);
void from_float_q3_k(const float *src, void *dst, int64_t n);
void from_float_q4_k(const float *src, void *dst, int64_t n);
void from_float_q5_k(const float *src, void *dst, int64_t n);
void from_float_q6_k(const float *src, void *dst, int64_t n);
void from_float_q8_k(const float *src, void *dst, int64_t n);

void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *x, const void *y);

}  // namespace td::kernels::ref
