// NEON row ops (aarch64): RMSNorm, RoPE, SwiGLU, the residual add and f16 K/V stores, bit-identical to the
// reference (ref/ops-ref.cpp): the same operations in the same order, four lanes at a time; fused
// multiply-adds exactly where the reference has std::fma. The reference's scalar pieces (RoPE's angles, the
// double sum of RMSNorm, libm's expf for SwiGLU's tail) stay scalar.
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "kernels/arm/kernels-arm.h"
#include "kernels/ref/ops-ref.h"

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
    if (!to_f16) {
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    // fcvtn rounds to nearest even (the default FPCR mode) and keeps NaNs quiet with their top payload bits,
    // as fp32_to_fp16().
    auto *d = static_cast<uint16_t *>(dst);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(d + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; ++i) {
        const float16x4_t h = vcvt_f16_f32(vdupq_n_f32(src[i]));
        d[i] = vget_lane_u16(vreinterpret_u16_f16(h), 0);
    }
}

}  // namespace td::kernels::neon
