// Scalar reference row ops (kernels/ops.h has the contracts; kernels/ops.cpp dispatches to ISA variants).
#include "kernels/ref/ops-ref.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/ref/quants-ref.h"
#include "tensor/fp16.h"

namespace td::kernels::ref {

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    // Squares summed in double, as ggml does, so a 4096-wide row loses nothing to rounding.
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

int32_t rope_angles(int32_t pos, const RopeParams &p, float *cos_out, float *sin_out) {
    TD_ASSERT(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= 1024, "n_rot {}", p.n_rot);
    const int32_t half = p.n_rot / 2;
    // theta for pair i is pos * base^(-2i/n_rot); computed by repeated multiplication like ggml so the
    // angles (and so the logits) agree with llama.cpp to the last bits.
    const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
    float theta_base = static_cast<float>(pos);
    for (int32_t i = 0; i < half; ++i) {
        const float ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
        const float theta = p.freq_scale * (theta_base / ff);
        cos_out[i] = std::cos(theta);
        sin_out[i] = std::sin(theta);
        theta_base *= theta_scale;
    }
    return half;
}

void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p) {
    TD_ASSERT(p.n_rot > 0 && p.n_rot <= head_dim && p.n_rot % 2 == 0, "n_rot {} head_dim {}", p.n_rot,
              head_dim);
    float cos_t[512], sin_t[512];  // [n_rot / 2]
    const int32_t half = rope_angles(pos, p, cos_t, sin_t);
    for (int32_t h = 0; h < n_head; ++h) {
        float *v = x + static_cast<int64_t>(h) * head_dim;
        for (int32_t i = 0; i < half; ++i) {
            const int32_t a = p.order == RopeOrder::adjacent ? 2 * i : i;
            const int32_t b = p.order == RopeOrder::adjacent ? 2 * i + 1 : i + half;
            const float c = cos_t[i], s = sin_t[i];
            const float x0 = v[a], x1 = v[b];
            // One product rounded, the other fused: the rounding gcc gives ggml's x0*c - x1*s, x0*s + x1*c.
            v[a] = std::fma(x0, c, -(x1 * s));
            v[b] = std::fma(x0, s, x1 * c);
        }
    }
}

void softmax(float *x, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// e^x as ggml_v_expf computes it in one AVX-512 lane: x = n ln2 + b (ln2 in two parts), a degree-5
// polynomial in b, scaled by 2^n (one rounding, as scalef); |n| > 192 saturates to 0 or infinity.
static float expf_poly(float x) {
    const float r = 0x1.8p23f;  // adding it rounds x / ln2 to an integer
    const float n = std::fma(x, 0x1.715476p+0f, r) - r;
    const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = std::fma(
        std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
        u, std::fma(0x1.ffffecp-1f, b, 1.0f));
    if (std::fabs(n) <= 126.0f) {  // 2^n is a normal float: the product rounds once
        const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
        float p2;
        std::memcpy(&p2, &bits, sizeof p2);
        return j * p2;
    }
    if (std::isnan(n)) return n;
    if (std::fabs(n) > 192.0f) return n > 0.0f ? INFINITY : 0.0f;
    return std::ldexp(j, static_cast<int>(n));
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    // ggml's AVX-512 order: whole groups of 16 use the polynomial e^x, the last n % 16 use libm's expf.
    const int64_t n_poly = n - n % 16;
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        const float e = i < n_poly ? expf_poly(0.0f - g) : std::exp(-g);
        out[i] = g / (1.0f + e) * up[i];
    }
}

void add_inplace(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

// q.k for an f16 cache, ggml_vec_dot_f16's order on AVX-512: 64 lanes a[j][l] take q[64b + 16j + l] *
// k[...] with fused multiply-adds (exact products of halves), fold like vec_dot_f32_f32, then the last
// n % 64 products add in double.
static float dot_f16_q(const float *q, const uint16_t *k, int32_t n) {
    float a[4][16] = {};  // [accumulator][lane]
    int32_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 16; ++l)
                a[j][l] = std::fma(q[i + 16 * j + l], fp16_to_fp32(k[i + 16 * j + l]), a[j][l]);
    float h[8], r[4];
    for (int l = 0; l < 16; ++l) a[0][l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
    for (int l = 0; l < 8; ++l) h[l] = a[0][l] + a[0][l + 8];
    for (int l = 0; l < 4; ++l) r[l] = h[l] + h[l + 4];
    double sum = (r[0] + r[2]) + (r[1] + r[3]);
    for (; i < n; ++i) sum += static_cast<double>(q[i] * fp16_to_fp32(k[i]));
    return static_cast<float>(sum);
}

void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores, float *out) {
    (void)scores;
    const DType type = kv_f16 ? DType::f16 : DType::f32;
    const size_t row_bytes = static_cast<size_t>(kv_stride) * (kv_f16 ? sizeof(uint16_t) : sizeof(float));
    attention_head_typed(q, {k, type, row_bytes}, {v, type, row_bytes}, KvReaders{}, head_dim, n_kv, scale,
                         softcap, out);
}

void attention_head_typed(const float *q, const KvRows &k, const KvRows &v, const KvReaders &rd,
                          int32_t head_dim, int32_t n_kv, float scale, float softcap, float *out) {
    // ggml's CPU flash attention (one pass, online softmax), rounding for rounding:
    //   s_j = scale * q.k_j ;  M = running max ;  acc = sum_j e^(s_j - M) v_j ;  S = sum_j e^(s_j - M)
    //   out = acc * (1 / S)
    // Soft-capping folds 1/c into the scale once (scale' = scale / c, in f32) and then s_j = c * tanhf(q.k_j
    // * scale'), libm's tanhf, as ggml does.
    // q.k in the order of ggml's f16 or f32 dot, or K's own vec_dot with the query in its vec_dot_type;
    // acc += v_j * e^(s_j - M) and S = S * e^(M_old - M) + e^(..) are fused multiply-adds. With an f16 K the
    // query is rounded to f16 first; with an f16 V the accumulator is rounded to f16 after every update,
    // other V types are dequantized a row at a time and accumulate in f32.
    TD_ASSERT(head_dim <= 1024, "head_dim {}", head_dim);
    const bool k_f16 = k.type == DType::f16, k_f32 = k.type == DType::f32;
    const bool v_f16 = v.type == DType::f16, v_f32 = v.type == DType::f32;
    float qr[1024];  // [head_dim] the query at an f16 or f32 K's precision
    for (int32_t d = 0; d < head_dim; ++d) qr[d] = k_f16 ? fp16_to_fp32(fp32_to_fp16(q[d])) : q[d];
    alignas(64) uint8_t qk[4 * 1024];  // the query in K's vec_dot_type (other K types)
    if (!k_f16 && !k_f32) rd.q_to_k(q, qk, head_dim);

    float acc[1024];  // [head_dim] running sum of weighted V rows
    float vrow[1024];  // [head_dim] a dequantized V row
    for (int32_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
    if (softcap != 0.0f) scale /= softcap;
    const uint8_t *kb = static_cast<const uint8_t *>(k.data), *vb = static_cast<const uint8_t *>(v.data);
    float m = -INFINITY, sum = 0.0f;
    for (int32_t j = 0; j < n_kv; ++j) {
        const uint8_t *kj = kb + static_cast<size_t>(j) * k.row_bytes;
        float dot;
        if (k_f16) {
            dot = dot_f16_q(qr, reinterpret_cast<const uint16_t *>(kj), head_dim);
        } else if (k_f32) {
            vec_dot_f32_f32(head_dim, &dot, kj, qr);
        } else {
            rd.k_dot(head_dim, &dot, kj, qk);
        }
        float s = dot * scale;
        if (softcap != 0.0f) s = softcap * std::tanh(s);
        float ms = 1.0f;  // rescales the accumulator when the max grows
        float vs = 1.0f;  // weight of this row: e^(s - M)
        if (s > m) {
            ms = std::exp(m - s);
            m = s;
            for (int32_t d = 0; d < head_dim; ++d)
                acc[d] = v_f16 ? fp16_to_fp32(fp32_to_fp16(acc[d] * ms)) : acc[d] * ms;
        } else {
            vs = std::exp(s - m);
        }
        const uint8_t *vj = vb + static_cast<size_t>(j) * v.row_bytes;
        if (v_f16) {
            const uint16_t *vh = reinterpret_cast<const uint16_t *>(vj);
            for (int32_t d = 0; d < head_dim; ++d)
                acc[d] = fp16_to_fp32(fp32_to_fp16(std::fma(fp16_to_fp32(vh[d]), vs, acc[d])));
        } else {
            const float *vf = reinterpret_cast<const float *>(vj);
            if (!v_f32) {
                rd.v_to_float(vj, vrow, head_dim);
                vf = vrow;
            }
            for (int32_t d = 0; d < head_dim; ++d) acc[d] = std::fma(vf[d], vs, acc[d]);
        }
        sum = std::fma(sum, ms, vs);
    }
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int32_t d = 0; d < head_dim; ++d) out[d] = acc[d] * inv;
}

float softmax_weights(const float *s, int32_t n_kv, float softcap, float *w, float *rescale) {
    float m = -INFINITY, sum = 0.0f;
    for (int32_t j = 0; j < n_kv; ++j) {
        float sj = s[j];
        if (softcap != 0.0f) sj = softcap * std::tanh(sj);
        float ms = 1.0f, vs = 1.0f;
        if (sj > m) {
            ms = std::exp(m - sj);
            m = sj;
        } else {
            vs = std::exp(sj - m);
        }
        w[j] = vs;
        rescale[j] = ms;
        sum = std::fma(sum, ms, vs);
    }
    return sum;
}

void store_row(const float *src, void *dst, bool to_f16, int64_t n) {
    if (to_f16) {
        uint16_t *d = static_cast<uint16_t *>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(src[i]);
    } else {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    }
}

}  // namespace td::kernels::ref
