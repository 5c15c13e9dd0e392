// x86 SIMD kernels, one namespace per ISA. Each *-avx2.cpp file is compiled with -mavx2 -mfma -mf16c (and
// *-avx512.cpp with the AVX-512 flags) and nothing else is: dispatch.cpp calls them only after cpuid says the
// CPU has the ISA. Contracts are those of the reference functions of the same name (ref/quants-ref.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/ops.h"
#include "kernels/ref/ops-ref.h"

namespace td::kernels::avx2 {

void from_float_f16(const float *src, void *dst, int64_t n);
void from_float_q8_0(const float *src, void *dst, int64_t n);
void from_float_q8_1(const float *src, void *dst, int64_t n);
void to_float_q8_0(const void *src, float *dst, int64_t n);
void to_float_q4_0(const void *src, float *dst, int64_t n);

void vec_dot_f32_f32(int64_t n, float *s, const void *x, const void *y);
void vec_dot_f16_f16(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_1_q8_1(int64_t n, float *s, const void *x, const void *y);

// y[t * y_stride + r] = vec_dot(n, w row r, x row t) for r < n_rows, t < n_tokens, bit for bit: panels of 16
// weight rows unpacked once per call, then tiles of 16 rows x 4 tokens (gemm-avx2.cpp, gemm-panel.h). w rows
// are w_stride bytes apart, x (q8_0) rows x_stride. Best called with many rows (a multiple of 32) at once.
void gemm_q4_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q4_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q8_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
// The same contract on packed q4_0 weights (kernels/pack.h): w is the packed matrix at the call's first row
// (a multiple of 16), w_stride the row size of the unpacked matrix, n_rows a multiple of 16
// (gemm-packed-avx2.cpp). Group-outer, token-inner: for a few tokens.
void gemm_q4_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);

// kernels/ops.h attention_group (and so attention_head), bit-identical to the reference (ops-avx2.cpp).
void attention_group(const float *q, int32_t n_q, const void *k, const void *v, bool kv_f16,
                     int64_t kv_stride, int32_t head_dim, int32_t n_kv, float scale, float softcap,
                     float *scores, float *out);
// kernels/ops.h attention_group_typed, reading K and V of other types than f16 and f32 through `rd`:
// bit-identical to ref::attention_head_typed per head given readers that agree with the reference's.
void attention_group_typed(const float *q, int32_t n_q, const KvRows &k, const KvRows &v,
                           const ref::KvReaders &rd, int32_t head_dim, int32_t n_kv, float scale,
                           float softcap, float *scores, float *out);
// kernels/ops.h rmsnorm, rope, add_inplace and store_row, bit-identical to the reference (ops-avx2.cpp).
void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p);
void add_inplace(float *y, const float *x, int64_t n);
void store_row(const float *src, void *dst, bool to_f16, int64_t n);
// kernels/ops.h swiglu, bit-identical to the reference (ops-avx2.cpp).
void swiglu(const float *gate, const float *up, float *out, int64_t n);

}  // namespace td::kernels::avx2

namespace td::kernels::avx512 {

// kernels/ops.h attention_group over an f16 cache, bit-identical to the reference, for head sizes 64, 128 and
// 256 (ops-avx512.cpp); false, and nothing written, for other head sizes.
bool attention_group_f16(const float *q, int32_t n_q, const void *k, const void *v, int64_t kv_stride,
                         int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores,
                         float *out);

// As avx2::gemm_*, with AVX-512 VNNI: panels of 32 rows, tiles of 32 rows x 8 tokens (gemm-avx512vnni.cpp);
// only for CPUs with avx512vnni.
void gemm_q4_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q4_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q8_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);

// Matrix-vector kernels (one token per pass, 8 weight rows per tile sharing the activation loads), with
// AVX-512 VNNI (gemv-avx512vnni.cpp); only for CPUs with avx512vnni. Contract of GemmFn (kernels/gemm.h):
// y[t * y_stride + r] = the reference vec_dot(n, w row r, x row t), bit for bit. Meant for n_tokens == 1.
// (q8_0 has none: it is memory-bound, and vec_dot streaming one row at a time reads memory faster.)
void gemv_q4_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q5_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q4_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q5_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q2_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q3_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q4_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q5_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemv_q6_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
// As avx2::gemm_q4_0x16_q8_0 with vpdpbusd on 16 rows per zmm, two tokens per pass over a block
// (gemm-packed-avx512vnni.cpp); only for CPUs with avx512vnni. The q8_0 one takes packed q8_0 weights; the
// q4_k, q5_k and q6_k ones take packed K-quant weights and q8_k activations.
void gemm_q4_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q4_1x16_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_1x16_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q8_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q4_kx16_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_kx16_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q6_kx16_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens);

}  // namespace td::kernels::avx512
