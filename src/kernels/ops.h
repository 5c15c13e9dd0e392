// Element-wise and row ops used by the forward pass: RMSNorm, RoPE, softmax, SwiGLU, attention.
// Scalar reference implementations (ref/ops-ref.cpp) that read like llama2.c; vectorised variants come in
// with the SIMD kernels and are tested against these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace td::kernels {

// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]        x, y, w: [n]   (y may alias x)
void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);

enum class RopeOrder {
    adjacent = 0,  // rotate pairs (x[2i], x[2i+1])          - llama ("normal" in ggml)
    halves = 1,    // rotate pairs (x[i], x[i + n_rot/2])     - gpt-neox, qwen2 ("neox" in ggml)
};

struct RopeParams {
    int32_t n_rot = 0;  // rotated dims per head (<= head_dim; the rest pass through)
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;              // 1 / linear scaling factor
    const float *freq_factors = nullptr;  // [n_rot/2] per-frequency divisors (llama3 rope_freqs), or null
    RopeOrder order = RopeOrder::adjacent;
};

// Rotates each of n_head heads of x in place for position pos.   x: [n_head, head_dim]
//   theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factors[i]
void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p);

// x = softmax(x) in place, numerically stable.   x: [n]
void softmax(float *x, int64_t n);

// out[i] = silu(gate[i]) * up[i], silu(v) = v / (1 + e^-v).   gate, up, out: [n] (out may alias gate)
// Call it once per row (n = n_ff): like ggml on AVX-512, e^-v comes from a polynomial for the first
// n - n % 16 elements and from libm for the rest, so the result depends on an element's place in the row.
void swiglu(const float *gate, const float *up, float *out, int64_t n);

// y[i] += x[i]   [n]
void add_inplace(float *y, const float *x, int64_t n);

// One attention head for one query over n_kv cached positions; causal masking is done by the caller (it
// passes only positions <= the query's). K and V rows are f16 (kv_f16) or f32, row stride kv_stride elements.
//   s_j = scale * q.k_j,  or with logit soft-capping (softcap c > 0, gemma2):  s_j = c * tanh(s_j / c)
//   out = sum_j softmax(s)_j v_j
// computed with the rounding of ggml's CPU flash attention (ref/ops-ref.cpp says how). softcap 0 = none.
//   q: [head_dim]   k, v: [n_kv rows, stride]   out: [head_dim]   scores: [2 * n_kv] scratch
void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores, float *out);

// attention_head for n_q query heads that share one K/V head (grouped-query attention): head g reads
// q + g * head_dim and writes out + g * head_dim, bit for bit what attention_head gives for it alone. The
// K and V rows are read once for all of them.   q, out: [n_q, head_dim]   scores: [2 * n_q * n_kv] scratch
void attention_group(const float *q, int32_t n_q, const void *k, const void *v, bool kv_f16,
                     int64_t kv_stride, int32_t head_dim, int32_t n_kv, float scale, float softcap,
                     float *scores, float *out);

// dst[i] = f16(src[i]) or a plain copy, for writing K/V into the cache.
void store_row(const float *src, void *dst, bool to_f16, int64_t n);

// The K or V rows of one K/V head in a cache of any of these types: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0,
// q5_1 (llama.cpp's --cache-type-k/-v; a block type needs head_dim a multiple of 32). `data` is the head's
// part of the first row, the rows are `row_bytes` apart.
struct KvRows {
    const void *data = nullptr;
    DType type = DType::f16;
    size_t row_bytes = 0;
};
bool kv_type_supported(DType type);

// attention_group over K and V of any supported types, as ggml's CPU flash attention computes it for them:
// the query is converted to K's vec_dot_type once and each score is K's vec_dot (f16 and f32 K: as
// attention_group); V rows that are f16 accumulate rounded to f16 after every update (as attention_group),
// any other type is dequantized row by row and accumulates in f32. K and V both f16, or both f32, give
// attention_group's result; block types give the reference's result bit for bit on every ISA.
void attention_group_typed(const float *q, int32_t n_q, const KvRows &k, const KvRows &v, int32_t head_dim,
                           int32_t n_kv, float scale, float softcap, float *scores, float *out);

// Writes one row of n elements into a cache of `type` (kv_type_supported): f16 and f32 as store_row, other
// types through their from_float, which writes the same bytes on every ISA.
void store_row_typed(const float *src, void *dst, DType type, int64_t n);

}  // namespace td::kernels
