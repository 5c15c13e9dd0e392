// Scalar reference row ops (kernels/ops.h has the contracts; kernels/ops.cpp dispatches to ISA variants).
#include "kernels/ref/ops-ref.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "tensor/fp16.h"

namespace td::kernels::ref {

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    // Squares summed in double, as ggml does, so a 4096-wide row loses nothing to rounding.
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p) {
    TD_ASSERT(p.n_rot > 0 && p.n_rot <= head_dim && p.n_rot % 2 == 0, "n_rot {} head_dim {}", p.n_rot,
              head_dim);
    const int32_t half = p.n_rot / 2;
    TD_ASSERT(half <= 512, "n_rot {} too large", p.n_rot);
    // theta for pair i is pos * base^(-2i/n_rot); computed by repeated multiplication like ggml so the
    // angles (and so the logits) agree with llama.cpp to the last bits.
    const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
    float cos_sin[2 * 512];  // [half][cos, sin]
    float theta_base = static_cast<float>(pos);
    for (int32_t i = 0; i < half; ++i) {
        const float ff = p.freq_factors ? p.freq_factors[i] : 1.0f;
        const float theta = p.freq_scale * (theta_base / ff);
        cos_sin[2 * i] = std::cos(theta);
        cos_sin[2 * i + 1] = std::sin(theta);
        theta_base *= theta_scale;
    }
    for (int32_t h = 0; h < n_head; ++h) {
        float *v = x + static_cast<int64_t>(h) * head_dim;
        for (int32_t i = 0; i < half; ++i) {
            const int32_t a = p.order == RopeOrder::adjacent ? 2 * i : i;
            const int32_t b = p.order == RopeOrder::adjacent ? 2 * i + 1 : i + half;
            const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
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

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void add_inplace(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float *scores, float *out) {
    // Flash-attention order (one pass, online softmax), as ggml's CPU kernel does it:
    //   s_j = scale * q.k_j ;  M = running max ;  acc = sum_j e^(s_j - M) v_j ;  S = sum_j e^(s_j - M)
    //   out = acc / S
    // With an f16 cache the query is rounded to f16 first and the accumulator is f16 too, so an f16 cache
    // reproduces llama.cpp's numbers; an f32 cache accumulates in f32.
    (void)scores;
    float qr[1024];  // [head_dim] the query at the cache's precision
    TD_ASSERT(head_dim <= 1024, "head_dim {}", head_dim);
    for (int32_t d = 0; d < head_dim; ++d) qr[d] = kv_f16 ? fp16_to_fp32(fp32_to_fp16(q[d])) : q[d];

    float
        acc[1024];  // [head_dim] running sum of weighted V rows (rounded to f16 after each step when kv_f16)
    for (int32_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;
    float m = -INFINITY, sum = 0.0f;
    for (int32_t j = 0; j < n_kv; ++j) {
        double dot = 0.0;
        if (kv_f16) {
            const uint16_t *kj = static_cast<const uint16_t *>(k) + j * kv_stride;
            for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(qr[d] * fp16_to_fp32(kj[d]));
        } else {
            const float *kj = static_cast<const float *>(k) + j * kv_stride;
            for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(qr[d] * kj[d]);
        }
        const float s = static_cast<float>(dot) * scale;
        float ms = 1.0f;  // rescales the accumulator when the max grows
        float vs = 1.0f;  // weight of this row: e^(s - M)
        if (s > m) {
            ms = std::exp(m - s);
            m = s;
            for (int32_t d = 0; d < head_dim; ++d)
                acc[d] = kv_f16 ? fp16_to_fp32(fp32_to_fp16(acc[d] * ms)) : acc[d] * ms;
        } else {
            vs = std::exp(s - m);
        }
        if (kv_f16) {
            const uint16_t *vj = static_cast<const uint16_t *>(v) + j * kv_stride;
            for (int32_t d = 0; d < head_dim; ++d)
                acc[d] = fp16_to_fp32(fp32_to_fp16(acc[d] + fp16_to_fp32(vj[d]) * vs));
        } else {
            const float *vj = static_cast<const float *>(v) + j * kv_stride;
            for (int32_t d = 0; d < head_dim; ++d) acc[d] += vj[d] * vs;
        }
        sum = sum * ms + vs;
    }
    for (int32_t d = 0; d < head_dim; ++d) out[d] = sum > 0.0f ? acc[d] / sum : 0.0f;
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
