// NEON q8_0 quantization and the q4_0, q8_0, q4_k and q6_k dot products. Integer sums are exact (int8
// products widened to int16, pairs to int32); each block's float value is the reference's expression,
// added into lane b % 8 and folded with dot_lanes_sum, so the results equal the reference bit for bit.
#include <arm_neon.h>

#include <cmath>

#include "core/check.h"
#include "kernels/arm/kernels-arm.h"
#include "kernels/blocks.h"
#include "tensor/fp16.h"

namespace td::kernels::neon {
namespace {

int64_t n_blocks(int64_t n, int64_t block, const char *type) {
    TD_ASSERT(n >= 0 && n % block == 0, "{}: {} elements is not a multiple of the block size {}", type, n,
              block);
    return n / block;
}

// Products of 16 int8 pairs summed into 4 int32 lanes (|a * b| <= 128 * 128 fits int16).
inline int32x4_t dot16(int8x16_t a, int8x16_t b) {
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vpadalq_s16(vpaddlq_s16(lo), hi);
}

// The low and the high nibbles of 16 bytes, as int8.
inline int8x16_t low_nibbles(uint8x16_t q) {
    return vreinterpretq_s8_u8(vandq_u8(q, vdupq_n_u8(0x0F)));
}
inline int8x16_t high_nibbles(uint8x16_t q) {
    return vreinterpretq_s8_u8(vshrq_n_u8(q, 4));
}

}  // namespace

void from_float_q8_0(const float *src, void *dst, int64_t n) {
    auto *y = static_cast<BlockQ8_0 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, kQK, "q8_0"); ++b) {
        const float *x = src + b * kQK;  // [32]
        float32x4_t v[8];
        float32x4_t amax = vdupq_n_f32(0.0f);
        for (int i = 0; i < 8; ++i) {
            v[i] = vld1q_f32(x + 4 * i);
            amax = vmaxq_f32(amax, vabsq_f32(v[i]));
        }
        // As the reference: d = absmax / 127, q = round(x * (1 / d)) with ties away from zero (vcvtaq).
        const float d = vmaxvq_f32(amax) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int i = 0; i < 8; i += 2) {
            const int32x4_t q0 = vcvtaq_s32_f32(vmulq_n_f32(v[i], id));
            const int32x4_t q1 = vcvtaq_s32_f32(vmulq_n_f32(v[i + 1], id));
            const int16x8_t q01 = vcombine_s16(vmovn_s32(q0), vmovn_s32(q1));
            vst1_s8(y[b].qs + 4 * i, vmovn_s16(q01));
        }
    }
}

void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const auto *x = static_cast<const BlockQ4_0 *>(vx);  // [n / 32]
    const auto *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    const int8x16_t eight = vdupq_n_s8(8);
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, kQK, "q4_0"); ++b) {
        const uint8x16_t q = vld1q_u8(x[b].qs);  // byte j: element j (low), element j + 16 (high)
        const int8x16_t lo = vsubq_s8(low_nibbles(q), eight), hi = vsubq_s8(high_nibbles(q), eight);
        const int32_t sumi =
            vaddvq_s32(vaddq_s32(dot16(lo, vld1q_s8(y[b].qs)), dot16(hi, vld1q_s8(y[b].qs + 16))));
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const auto *x = static_cast<const BlockQ8_0 *>(vx);  // [n / 32]
    const auto *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, kQK, "q8_0"); ++b) {
        const int32_t sumi = vaddvq_s32(vaddq_s32(dot16(vld1q_s8(x[b].qs), vld1q_s8(y[b].qs)),
                                                  dot16(vld1q_s8(x[b].qs + 16), vld1q_s8(y[b].qs + 16))));
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

// Runs j = 2c (low nibbles) and 2c + 1 (high nibbles) are bytes 32c..32c+31 of qs; the 6-bit scales and mins
// as get_scale_min_k4. v = dall * sumi - dmin * summ (kquants-ref.h).
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const auto *x = static_cast<const BlockQ4_K *>(vx);  // [n / 256]
    const auto *y = static_cast<const BlockQ8_K *>(vy);  // [n / 256]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, kQK_K, "q4_k"); ++b) {
        const uint8_t *sc = x[b].scales;
        int32_t scale[8], min[8];
        for (int j = 0; j < 8; ++j) {
            scale[j] = j < 4 ? sc[j] & 63 : (sc[j + 4] & 0x0F) | ((sc[j - 4] >> 6) << 4);
            min[j] = j < 4 ? sc[j + 4] & 63 : (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
        }
        int32_t sumi = 0, summ = 0;
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t q0 = vld1q_u8(x[b].qs + 32 * c), q1 = vld1q_u8(x[b].qs + 32 * c + 16);
            const int8_t *y_lo = y[b].qs + 64 * c, *y_hi = y_lo + 32;  // runs 2c and 2c + 1
            const int32_t lo = vaddvq_s32(vaddq_s32(dot16(low_nibbles(q0), vld1q_s8(y_lo)),
                                                    dot16(low_nibbles(q1), vld1q_s8(y_lo + 16))));
            const int32_t hi = vaddvq_s32(vaddq_s32(dot16(high_nibbles(q0), vld1q_s8(y_hi)),
                                                    dot16(high_nibbles(q1), vld1q_s8(y_hi + 16))));
            sumi += scale[2 * c] * lo + scale[2 * c + 1] * hi;
        }
        for (int j = 0; j < 8; ++j) summ += min[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        const float dall = fp16_to_fp32(x[b].d) * y[b].d;
        const float dmin = fp16_to_fp32(x[b].dmin) * y[b].d;
        acc[b % kDotLanes] += dall * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
    }
    *s = dot_lanes_sum(acc);
}

// Element 128c + 32k + l: low bits from ql[64c + 32(k & 1) + l] (low nibble for k < 2, high for k >= 2), two
// high bits from qh[32c + l] >> 2k, minus 32; 16 groups of 16 with signed 8-bit scales. v = (d * y.d) * sumi.
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const auto *x = static_cast<const BlockQ6_K *>(vx);  // [n / 256]
    const auto *y = static_cast<const BlockQ8_K *>(vy);  // [n / 256]
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03);
    const int8x16_t m32 = vdupq_n_s8(32);
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, kQK_K, "q6_k"); ++b) {
        int32_t sumi = 0;
        for (int c = 0; c < 2; ++c) {
            const uint8_t *ql = x[b].ql + 64 * c, *qh = x[b].qh + 32 * c;
            for (int half = 0; half < 2; ++half) {  // l in [16 half, 16 half + 16)
                const uint8x16_t l0 = vld1q_u8(ql + 16 * half), l1 = vld1q_u8(ql + 32 + 16 * half);
                const uint8x16_t h = vld1q_u8(qh + 16 * half);
                const uint8x16_t nib[4] = {vandq_u8(l0, m4), vandq_u8(l1, m4), vshrq_n_u8(l0, 4),
                                           vshrq_n_u8(l1, 4)};
                const uint8x16_t top[4] = {vandq_u8(h, m2), vandq_u8(vshrq_n_u8(h, 2), m2),
                                           vandq_u8(vshrq_n_u8(h, 4), m2), vshrq_n_u8(h, 6)};
                for (int k = 0; k < 4; ++k) {
                    const int8x16_t q =
                        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib[k], vshlq_n_u8(top[k], 4))), m32);
                    const int e0 = 128 * c + 32 * k + 16 * half;
                    sumi += x[b].scales[e0 / 16] * vaddvq_s32(dot16(q, vld1q_s8(y[b].qs + e0)));
                }
            }
        }
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * y[b].d * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

}  // namespace td::kernels::neon
