// x86 SIMD kernels for the K-quants. kquants-avx2.cpp is compiled with -mavx2 -mfma -mf16c; dispatch.cpp
// calls these only after cpuid says the CPU has them. Contracts (including the exact float order the results
// reproduce bit for bit) are those of the reference functions of the same name (ref/kquants-ref.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace td::kernels::avx2 {

void from_float_q8_k(const float *src, void *dst, int64_t n);

void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *x, const void *y);
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *x, const void *y);

// Matrix-matrix tiles for q2_k .. q6_k (gemm-kquants-avx2.cpp), kernels/gemm.h GemmFn contract:
// y[t * y_stride + r] = vec_dot(n, w row r, x row t) bit for bit, x rows in q8_k. Panels of 8 rows x 4
// tokens.
void gemm_q2_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q3_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q4_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q6_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);

}  // namespace td::kernels::avx2

namespace td::kernels::avx512 {

// As avx2::gemm_q*_k_q8_k with AVX-512 VNNI, panels of 16 rows x 8 tokens (gemm-kquants-avx512vnni.cpp);
// only for CPUs with avx512vnni.
void gemm_q2_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q3_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q4_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q6_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens);
// The same tiles on packed weights (kernels/pack.h): w is the packed group holding row 0 of the call and
// n_rows a multiple of 16; each group is one panel, read without unpacking it into rows first.
void gemm_q4_k_packed_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,
                           float *y, int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q5_k_packed_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,
                           float *y, int64_t y_stride, int64_t n_rows, int64_t n_tokens);
void gemm_q6_k_packed_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,
                           float *y, int64_t y_stride, int64_t n_rows, int64_t n_tokens);

}  // namespace td::kernels::avx512
