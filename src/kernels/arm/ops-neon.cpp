// NEON row ops (aarch64): RMSNorm, RoPE, SwiGLU, the residual add and f16 K/V stores, bit-identical to the
// reference (ref/ops-ref.cpp): the same operations in the same order, four lanes at a time; fused
// multiply-adds exactly where the reference has std::fma. The reference's scalar pieces (RoPE's angles, the
// double sum of RMSNorm, libm's expf for SwiGLU's tail) stay scalar.
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "kernels/arm/kernels-arm.h"
#include "kernels/ref/ops-ref.h"
#include "tensor/fp16.h"

namespace td::kernels::neon {
namespace {

// ggml's polynomial e^x (ref/ops-ref.cpp expf_poly) on four lanes; lanes whose 2^n is not a normal float
// (|n| > 126, NaN) are finished one by one as the reference does.
inline float32x4_t expf_poly4(float32x4_t x) {
    const float32x4_t r = vdupq_n_f32(0x1.8p23f);
    const float32x4_t n = vsubq_f32(vfmaq_f32(r, x, vdupq_n_f32(0x1.715476p+0f)), r);
    const float32x4_t b =
        vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f)), n, vdupq_n_f32(0x1.7f7d1cp-20f));
    const float32x4_t u = vmulq_f32(b, b);
    const float32x4_t t1 = vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b);
    const float32x4_t t2 = vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b);
    const float32x4_t t4 = vfmaq_f32(vdupq_n_f32(1.0f), vdupq_n_f32(0x1.ffffecp-1f), b);
    const float32x4_t j = vfmaq_f32(t4, vfmaq_f32(t2, t1, u), u);
    const int32x4_t p2 = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t res = vmulq_f32(j, vreinterpretq_f32_s32(p2));
    // |n| <= 126 is false for NaN too.
    const uint32x4_t normal = vcleq_f32(vabsq_f32(n), vdupq_n_f32(126.0f));
    if (vminvq_u32(normal) != 0) return res;
    float out[4], nv[4], jv[4];
    uint32_t ok[4];
    vst1q_f32(out, res);
    vst1q_f32(nv, n);
    vst1q_f32(jv, j);
    vst1q_u32(ok, normal);
    for (int l = 0; l < 4; ++l) {
        if (ok[l]) continue;
        if (std::isnan(nv[l])) {
            out[l] = nv[l];
        } else if (nv[l] > 192.0f || nv[l] < -192.0f) {
            out[l] = nv[l] > 0.0f ? INFINITY : 0.0f;
        } else {
            out[l] = std::ldexp(jv[l], static_cast<int>(nv[l]));
        }
    }
    return vld1q_f32(out);
}

// f32 -> f16 -> f32, round to nearest even (fp32_to_fp16()).
inline float32x4_t round_f16(float32x4_t v) {
    return vcvt_f32_f16(vcvt_f16_f32(v));
}
inline float round_f16(float v) {
    return fp16_to_fp32(fp32_to_fp16(v));
}

// q.k for an f16 cache in the reference's order (ref/ops-ref.cpp dot_f16_q): ggml's four 16-lane
// accumulators as 4 x 4 registers (a[j][m] = lanes 4m..4m+3 of accumulator j), the same fold, then the rest
// of the row in double.
inline float dot_f16_q(const float *q, const uint16_t *k, int32_t n) {
    float32x4_t a[4][4];
    for (auto &aj : a)
        for (auto &am : aj) am = vdupq_n_f32(0.0f);
    int32_t i = 0;
    for (; i + 64 <= n; i += 64) {
        for (int j = 0; j < 4; ++j) {
            const float *qj = q + i + 16 * j;
            const float16x8_t k0 = vreinterpretq_f16_u16(vld1q_u16(k + i + 16 * j));
            const float16x8_t k1 = vreinterpretq_f16_u16(vld1q_u16(k + i + 16 * j + 8));
            a[j][0] = vfmaq_f32(a[j][0], vld1q_f32(qj), vcvt_f32_f16(vget_low_f16(k0)));
            a[j][1] = vfmaq_f32(a[j][1], vld1q_f32(qj + 4), vcvt_high_f32_f16(k0));
            a[j][2] = vfmaq_f32(a[j][2], vld1q_f32(qj + 8), vcvt_f32_f16(vget_low_f16(k1)));
            a[j][3] = vfmaq_f32(a[j][3], vld1q_f32(qj + 12), vcvt_high_f32_f16(k1));
        }
    }
    float32x4_t t[4];
    for (int m = 0; m < 4; ++m) t[m] = vaddq_f32(vaddq_f32(a[0][m], a[2][m]), vaddq_f32(a[1][m], a[3][m]));
    const float32x4_t r = vaddq_f32(vaddq_f32(t[0], t[2]), vaddq_f32(t[1], t[3]));
    double sum =
        (vgetq_lane_f32(r, 0) + vgetq_lane_f32(r, 2)) + (vgetq_lane_f32(r, 1) + vgetq_lane_f32(r, 3));
    for (; i < n; ++i) sum += static_cast<double>(q[i] * fp16_to_fp32(k[i]));
    return static_cast<float>(sum);
}

// Asks for the cache lines of [p, p + n).
inline void prefetch_bytes(const uint8_t *p, size_t n) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
    for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
        __builtin_prefetch(reinterpret_cast<const void *>(a), 0, 3);
}

}  // namespace

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    // The squares four at a time; their sum in double in the reference's order (one chain); then
    // y = (x * scale) * w four at a time.
    double ss = 0.0;
    int64_t i = 0;
    float sq[4];
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        vst1q_f32(sq, vmulq_f32(v, v));
        for (int l = 0; l < 4; ++l) ss += static_cast<double>(sq[l]);
    }
    for (; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + eps);
    const float32x4_t vs = vdupq_n_f32(scale);
    i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vmulq_f32(vmulq_f32(vld1q_f32(x + i), vs), vld1q_f32(w + i)));
    for (; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p) {
    // a = fma(x0, c, -(x1 * s)), b = fma(x0, s, x1 * c) with the reference's angles. Adjacent pairs are
    // split into their even and odd elements on load (vld2q) and interleaved again on store.
    float cos_t[512], sin_t[512];
    const int32_t half = ref::rope_angles(pos, p, cos_t, sin_t);
    const bool adjacent = p.order == RopeOrder::adjacent;
    for (int32_t h = 0; h < n_head; ++h) {
        float *v = x + static_cast<int64_t>(h) * head_dim;
        int32_t i = 0;
        for (; i + 4 <= half; i += 4) {
            const float32x4_t c = vld1q_f32(cos_t + i), s = vld1q_f32(sin_t + i);
            float32x4_t x0, x1;
            if (adjacent) {
                const float32x4x2_t xy = vld2q_f32(v + 2 * i);
                x0 = xy.val[0];
                x1 = xy.val[1];
            } else {
                x0 = vld1q_f32(v + i);
                x1 = vld1q_f32(v + i + half);
            }
            const float32x4_t a = vfmaq_f32(vnegq_f32(vmulq_f32(x1, s)), x0, c);
            const float32x4_t b = vfmaq_f32(vmulq_f32(x1, c), x0, s);
            if (adjacent) {
                vst2q_f32(v + 2 * i, float32x4x2_t{{a, b}});
            } else {
                vst1q_f32(v + i, a);
                vst1q_f32(v + i + half, b);
            }
        }
        for (; i < half; ++i) {
            const int32_t ia = adjacent ? 2 * i : i;
            const int32_t ib = adjacent ? 2 * i + 1 : i + half;
            const float x0 = v[ia], x1 = v[ib];
            v[ia] = std::fma(x0, cos_t[i], -(x1 * sin_t[i]));
            v[ib] = std::fma(x0, sin_t[i], x1 * cos_t[i]);
        }
    }
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    // The reference's order: the polynomial e^x for whole groups of 16, libm's expf for the last n % 16.
    const int64_t n_poly = n - n % 16;
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i < n_poly; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t e = expf_poly4(vsubq_f32(vdupq_n_f32(0.0f), g));
        vst1q_f32(out + i, vmulq_f32(vdivq_f32(g, vaddq_f32(one, e)), vld1q_f32(up + i)));
    }
    for (; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
    }
}

void add_inplace(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vaddq_f32(vld1q_f32(y + i), vld1q_f32(x + i)));
    for (; i < n; ++i) y[i] += x[i];
}

void store_row(const float *src, void *dst, bool to_f16, int64_t n) {
    if (to_f16) return from_float_f16(src, dst, n);
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

}  // namespace td::kernels::neon

namespace td::kernels::neon {

void attention_group_f16(const float *q, int32_t n_q, const void *k, const void *v, int64_t kv_stride,
                         int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores,
                         float *out) {
    // As the AVX2 kernel (x86/ops-avx2.cpp): all scores first, the softmax's scalar side
    // (ref::softmax_weights), then the weighted sum of V rows four lanes at a time, kG heads interleaved.
    constexpr int kG = 4;
    float qr[kG][1024];   // the queries rounded to f16, as the reference
    float acc[kG][1024];  // running weighted sums of V rows, rounded to f16 after every update
    const auto *kh = static_cast<const uint16_t *>(k);
    const auto *vh = static_cast<const uint16_t *>(v);
    const size_t head_bytes = static_cast<size_t>(head_dim) * sizeof(uint16_t);
    if (softcap != 0.0f) scale /= softcap;
    for (int32_t g0 = 0; g0 < n_q; g0 += kG) {
        const int n_g = n_q - g0 < kG ? n_q - g0 : kG;
        float *w = scores;                                          // [n_g][n_kv] scores, then weights
        float *rescale = scores + static_cast<size_t>(n_g) * n_kv;  // [n_g][n_kv]
        for (int g = 0; g < n_g; ++g) {
            const float *qg = q + static_cast<size_t>(g0 + g) * head_dim;
            for (int32_t d = 0; d < head_dim; ++d) {
                qr[g][d] = round_f16(qg[d]);
                acc[g][d] = 0.0f;
            }
        }
        // The rows are strided and usually out of cache: while the first head reads them, K is asked for
        // kAhead rows ahead, each V row with its K row.
        constexpr int32_t kAhead = 8;
        for (int g = 0; g < n_g; ++g) {
            float *wg = w + static_cast<size_t>(g) * n_kv;
            for (int32_t j = 0; j < n_kv; ++j) {
                const uint16_t *kj = kh + static_cast<size_t>(j) * kv_stride;
                if (g0 + g == 0) {
                    if (j + kAhead < n_kv)
                        prefetch_bytes(reinterpret_cast<const uint8_t *>(kj + kAhead * kv_stride),
                                       head_bytes);
                    prefetch_bytes(reinterpret_cast<const uint8_t *>(vh + static_cast<size_t>(j) * kv_stride),
                                   head_bytes);
                }
                wg[j] = dot_f16_q(qr[g], kj, head_dim) * scale;
            }
        }
        float sum[kG];
        for (int g = 0; g < n_g; ++g)
            sum[g] = ref::softmax_weights(w + static_cast<size_t>(g) * n_kv, n_kv, softcap,
                                          w + static_cast<size_t>(g) * n_kv,
                                          rescale + static_cast<size_t>(g) * n_kv);
        // acc = round_f16(acc * ms) when the max grew (ms == 1 changes no bit, so it is skipped), then
        // acc = round_f16(v_j * vs + acc).
        for (int32_t j = 0; j < n_kv; ++j) {
            const uint16_t *vj = vh + static_cast<size_t>(j) * kv_stride;
            for (int g = 0; g < n_g; ++g) {
                float *ag = acc[g];
                const float ms = rescale[static_cast<size_t>(g) * n_kv + j];
                if (ms != 1.0f) {
                    const float32x4_t vms = vdupq_n_f32(ms);
                    int32_t d = 0;
                    for (; d + 4 <= head_dim; d += 4)
                        vst1q_f32(ag + d, round_f16(vmulq_f32(vld1q_f32(ag + d), vms)));
                    for (; d < head_dim; ++d) ag[d] = round_f16(ag[d] * ms);
                }
                const float vs = w[static_cast<size_t>(g) * n_kv + j];
                const float32x4_t vvs = vdupq_n_f32(vs);
                int32_t d = 0;
                for (; d + 4 <= head_dim; d += 4) {
                    const float32x4_t vf = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(vj + d)));
                    vst1q_f32(ag + d, round_f16(vfmaq_f32(vld1q_f32(ag + d), vf, vvs)));
                }
                for (; d < head_dim; ++d) ag[d] = round_f16(std::fma(fp16_to_fp32(vj[d]), vs, ag[d]));
            }
        }
        for (int g = 0; g < n_g; ++g) {
            const float inv = sum[g] == 0.0f ? 0.0f : 1.0f / sum[g];
            float *og = out + static_cast<size_t>(g0 + g) * head_dim;
            for (int32_t d = 0; d < head_dim; ++d) og[d] = acc[g][d] * inv;
        }
    }
}

}  // namespace td::kernels::neon
