// NEON quantizers (f16, q8_0, q8_k) and the dot product of every weight type with its activation type.
// Integer sums are exact (int8 products widened to int16, pairs to int32); each block's float value is the
// reference's expression, added into lane b % 8 and folded with dot_lanes_sum, so the results equal the
// reference bit for bit. The f32 and f16 dots keep the reference's lanes in registers and fold them in its
// tree (ref/vec-dot-ref.cpp).
#include <arm_neon.h>

#include <cmath>
#include <cstring>

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

// Byte i is 0x10 where bit i % 8 of b0 (i < 8) or b1 (i >= 8) is set: the fifth bits of q5 levels.
inline uint8x16_t fifth_bits(uint8_t b0, uint8_t b1) {
    static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t v = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    return vandq_u8(vtstq_u8(v, vld1q_u8(kBit)), vdupq_n_u8(0x10));
}

// Bits 2k..2k+1 of each byte of r (the 2-bit levels of q2_k and q3_k).
inline uint8x16_t crumb(uint8x16_t r, int k) {
    return vandq_u8(vshlq_u8(r, vdupq_n_s8(static_cast<int8_t>(-2 * k))), vdupq_n_u8(3));
}

// Byte l of `bits` shifted right by `shift`, its lowest bit kept.
inline uint8x16_t bit_of(uint8x16_t bits, int shift) {
    return vandq_u8(vshlq_u8(bits, vdupq_n_s8(static_cast<int8_t>(-shift))), vdupq_n_u8(1));
}

// (q[0] + q[2]) + (q[1] + q[3]): the last two steps of the reference's f32 and f16 folds.
inline float fold4(float32x4_t q) {
    const float32x2_t p = vadd_f32(vget_low_f32(q), vget_high_f32(q));
    return vget_lane_f32(p, 0) + vget_lane_f32(p, 1);
}

inline float32x4_t load_half4(const uint16_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

// sum over the 16 groups of w[g] * y.bsums[g], w as 16 unsigned bytes.
inline int32_t weighted_bsums(uint8x16_t w, const BlockQ8_K &y) {
    const int16x8_t w0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(w)));
    const int16x8_t w1 = vreinterpretq_s16_u16(vmovl_u8(vget_high_u8(w)));
    const int32x4_t s =
        vmlal_s16(vmull_s16(vget_low_s16(w0), vld1_s16(y.bsums)), vget_high_s16(w0), vld1_s16(y.bsums + 4));
    const int32x4_t t = vmlal_s16(vmull_s16(vget_low_s16(w1), vld1_s16(y.bsums + 8)), vget_high_s16(w1),
                                  vld1_s16(y.bsums + 12));
    return vaddvq_s32(vaddq_s32(s, t));
}

// *s = sum over blocks of dot(x[b], y[b]) in accumulator lane b % 8, folded in the canonical tree: the loop
// every block dot shares. dot returns the block's scaled float, written as the reference writes it.
template <typename BX, typename BY, typename BlockDot>
void lanes_dot(int64_t n, int64_t block, const char *type, float *s, const void *vx, const void *vy,
               BlockDot dot) {
    const auto *x = static_cast<const BX *>(vx);  // [n / block]
    const auto *y = static_cast<const BY *>(vy);  // [n / block]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, block, type); ++b) acc[b % kDotLanes] += dot(x[b], y[b]);
    *s = dot_lanes_sum(acc);
}

// The 6-bit scales and mins of q4_k and q5_k (get_scale_min_k4).
void scales_mins_k4(const uint8_t *sc, int32_t *scale, int32_t *min) {
    uint64_t sc8, mn8;
    q4_k_scales(sc, &sc8, &mn8);
    for (int j = 0; j < 8; ++j) {
        scale[j] = static_cast<int32_t>((sc8 >> (8 * j)) & 0xFF);
        min[j] = static_cast<int32_t>((mn8 >> (8 * j)) & 0xFF);
    }
}

// q4_k and q5_k: levels(c, q) fills chunk c's runs 2c and 2c + 1 as four 16-byte vectors of levels.
// v = dall * sum_j scale_j (run j . y) - dmin * sum_j min_j bsum_j (kquants-ref.h).
template <typename Block, typename Levels>
float scale_min_superblock(const Block &xb, const BlockQ8_K &yb, Levels levels) {
    int32_t scale[8], min[8];
    scales_mins_k4(xb.scales, scale, min);
    int32x4_t acc = vdupq_n_s32(0);
    for (int c = 0; c < 4; ++c) {
        int8x16_t q[4];  // run 2c: q[0], q[1]; run 2c + 1: q[2], q[3]
        levels(c, q);
        const int8_t *y_lo = yb.qs + 64 * c, *y_hi = y_lo + 32;
        acc = vmlaq_n_s32(acc, vaddq_s32(dot16(q[0], vld1q_s8(y_lo)), dot16(q[1], vld1q_s8(y_lo + 16))),
                          scale[2 * c]);
        acc = vmlaq_n_s32(acc, vaddq_s32(dot16(q[2], vld1q_s8(y_hi)), dot16(q[3], vld1q_s8(y_hi + 16))),
                          scale[2 * c + 1]);
    }
    int32_t summ = 0;
    for (int j = 0; j < 8; ++j) summ += min[j] * (yb.bsums[2 * j] + yb.bsums[2 * j + 1]);
    const float dall = fp16_to_fp32(xb.d) * yb.d;
    const float dmin = fp16_to_fp32(xb.dmin) * yb.d;
    return dall * static_cast<float>(vaddvq_s32(acc)) - dmin * static_cast<float>(summ);
}

// One block of 32 as q8_0 and q8_1 quantize it, as the reference: d = absmax / 127, q = round(x * (1 / d))
// with ties away from zero (vcvtaq); returns d.
float quantize_block_q8(const float *x, int8_t *qs) {
    float32x4_t v[8];
    float32x4_t amax = vdupq_n_f32(0.0f);
    for (int i = 0; i < 8; ++i) {
        v[i] = vld1q_f32(x + 4 * i);
        amax = vmaxq_f32(amax, vabsq_f32(v[i]));
    }
    const float d = vmaxvq_f32(amax) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int i = 0; i < 8; i += 2) {
        const int32x4_t q0 = vcvtaq_s32_f32(vmulq_n_f32(v[i], id));
        const int32x4_t q1 = vcvtaq_s32_f32(vmulq_n_f32(v[i + 1], id));
        vst1_s8(qs + 4 * i, vmovn_s16(vcombine_s16(vmovn_s32(q0), vmovn_s32(q1))));
    }
    return d;
}

}  // namespace

void from_float_q8_0(const float *src, void *dst, int64_t n) {
    auto *y = static_cast<BlockQ8_0 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, kQK, "q8_0"); ++b)
        y[b].d = fp32_to_fp16(quantize_block_q8(src + b * kQK, y[b].qs));
}

// As q8_0, plus s = d * sum(q).
void from_float_q8_1(const float *src, void *dst, int64_t n) {
    auto *y = static_cast<BlockQ8_1 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, kQK, "q8_1"); ++b) {
        const float d = quantize_block_q8(src + b * kQK, y[b].qs);
        y[b].d = fp32_to_fp16(d);
        const int32_t sum = vaddlvq_s8(vld1q_s8(y[b].qs)) + vaddlvq_s8(vld1q_s8(y[b].qs + 16));
        y[b].s = fp32_to_fp16(static_cast<float>(sum) * d);
    }
}

// q4_0, q4_1, q5_0, q5_1: the nibbles (byte j: element j low, j + 16 high), plus 16 where the element's bit
// of qh is set in the 5-bit types. q4_0 and q5_0 subtract their offset (8, 16); q4_1 and q5_1 keep the levels
// and add mx * sy: v = dx * dy * sumi (+ mx * sy), the reference's expression.
template <typename BX, typename BY>
void dot_4_5_bit(int64_t n, float *s, const void *vx, const void *vy, const char *type) {
    lanes_dot<BX, BY>(n, kQK, type, s, vx, vy, [](const BX &xb, const BY &yb) {
        constexpr bool kFifth = kBlockHasQh<BX>;
        constexpr bool kMin = kBlockHasMin<BX>;
        const uint8x16_t q = vld1q_u8(xb.qs);
        uint8x16_t lo = vandq_u8(q, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(q, 4);
        if constexpr (kFifth) {
            lo = vorrq_u8(lo, fifth_bits(xb.qh[0], xb.qh[1]));
            hi = vorrq_u8(hi, fifth_bits(xb.qh[2], xb.qh[3]));
        }
        int8x16_t l = vreinterpretq_s8_u8(lo), h = vreinterpretq_s8_u8(hi);
        if constexpr (!kMin) {
            const int8x16_t offset = vdupq_n_s8(kFifth ? 16 : 8);
            l = vsubq_s8(l, offset);
            h = vsubq_s8(h, offset);
        }
        const int32_t sumi = vaddvq_s32(vaddq_s32(dot16(l, vld1q_s8(yb.qs)), dot16(h, vld1q_s8(yb.qs + 16))));
        const float v = fp16_to_fp32(xb.d) * fp16_to_fp32(yb.d) * static_cast<float>(sumi);
        if constexpr (kMin) {
            return v + fp16_to_fp32(xb.m) * fp16_to_fp32(yb.s);
        } else {
            return v;
        }
    });
}

void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    dot_4_5_bit<BlockQ4_0, BlockQ8_0>(n, s, vx, vy, "q4_0");
}

void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    dot_4_5_bit<BlockQ4_1, BlockQ8_1>(n, s, vx, vy, "q4_1");
}

void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    dot_4_5_bit<BlockQ5_0, BlockQ8_0>(n, s, vx, vy, "q5_0");
}

void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    dot_4_5_bit<BlockQ5_1, BlockQ8_1>(n, s, vx, vy, "q5_1");
}

// q8_0 and q8_1 weights (q8_1's s unused): a plain int8 dot per block.
template <typename Block>
void dot_q8_blocks(int64_t n, float *s, const void *vx, const void *vy, const char *type) {
    lanes_dot<Block, Block>(n, kQK, type, s, vx, vy, [](const Block &xb, const Block &yb) {
        const int32_t sumi = vaddvq_s32(vaddq_s32(dot16(vld1q_s8(xb.qs), vld1q_s8(yb.qs)),
                                                  dot16(vld1q_s8(xb.qs + 16), vld1q_s8(yb.qs + 16))));
        return fp16_to_fp32(xb.d) * fp16_to_fp32(yb.d) * static_cast<float>(sumi);
    });
}

void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    dot_q8_blocks<BlockQ8_0>(n, s, vx, vy, "q8_0");
}

void vec_dot_q8_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    dot_q8_blocks<BlockQ8_1>(n, s, vx, vy, "q8_1");
}

// Runs j = 2c (low nibbles) and 2c + 1 (high nibbles) are bytes 32c..32c+31 of qs.
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    lanes_dot<BlockQ4_K, BlockQ8_K>(
        n, kQK_K, "q4_k", s, vx, vy, [](const BlockQ4_K &xb, const BlockQ8_K &yb) {
            return scale_min_superblock(xb, yb, [&xb](int c, int8x16_t *q) {
                const uint8x16_t q0 = vld1q_u8(xb.qs + 32 * c), q1 = vld1q_u8(xb.qs + 32 * c + 16);
                q[0] = low_nibbles(q0);
                q[1] = low_nibbles(q1);
                q[2] = high_nibbles(q0);
                q[3] = high_nibbles(q1);
            });
        });
}

// As q4_k, plus a fifth bit: element 32j + l takes bit j of qh[l].
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    lanes_dot<BlockQ5_K, BlockQ8_K>(
        n, kQK_K, "q5_k", s, vx, vy, [](const BlockQ5_K &xb, const BlockQ8_K &yb) {
            const uint8x16_t h0 = vld1q_u8(xb.qh), h1 = vld1q_u8(xb.qh + 16);
            return scale_min_superblock(xb, yb, [&](int c, int8x16_t *q) {
                const uint8x16_t q0 = vld1q_u8(xb.qs + 32 * c), q1 = vld1q_u8(xb.qs + 32 * c + 16);
                auto level = [](uint8x16_t nibble, uint8x16_t h, int bit) {
                    return vreinterpretq_s8_u8(vorrq_u8(nibble, vshlq_n_u8(bit_of(h, bit), 4)));
                };
                q[0] = level(vandq_u8(q0, vdupq_n_u8(0x0F)), h0, 2 * c);
                q[1] = level(vandq_u8(q1, vdupq_n_u8(0x0F)), h1, 2 * c);
                q[2] = level(vshrq_n_u8(q0, 4), h0, 2 * c + 1);
                q[3] = level(vshrq_n_u8(q1, 4), h1, 2 * c + 1);
            });
        });
}

// Element 128c + 32k + l: (qs[32c + l] >> 2k) & 3; 16 groups of 16 with 4-bit scales and 4-bit mins.
// v = dall * sumi - dmin * summ.
void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    lanes_dot<BlockQ2_K, BlockQ8_K>(
        n, kQK_K, "q2_k", s, vx, vy, [](const BlockQ2_K &xb, const BlockQ8_K &yb) {
            int32x4_t acc = vdupq_n_s32(0);
            for (int c = 0; c < 2; ++c) {
                const uint8x16_t r0 = vld1q_u8(xb.qs + 32 * c), r1 = vld1q_u8(xb.qs + 32 * c + 16);
                for (int k = 0; k < 4; ++k) {
                    const int8x16_t q0 = vreinterpretq_s8_u8(crumb(r0, k));
                    const int8x16_t q1 = vreinterpretq_s8_u8(crumb(r1, k));
                    const int8_t *yq = yb.qs + 128 * c + 32 * k;
                    const int g = 8 * c + 2 * k;
                    acc = vmlaq_n_s32(acc, dot16(q0, vld1q_s8(yq)), xb.scales[g] & 0x0F);
                    acc = vmlaq_n_s32(acc, dot16(q1, vld1q_s8(yq + 16)), xb.scales[g + 1] & 0x0F);
                }
            }
            const int32_t summ = weighted_bsums(vshrq_n_u8(vld1q_u8(xb.scales), 4), yb);
            const float dall = fp16_to_fp32(xb.d) * yb.d;
            const float dmin = fp16_to_fp32(xb.dmin) * yb.d;
            return dall * static_cast<float>(vaddvq_s32(acc)) - dmin * static_cast<float>(summ);
        });
}

// Element 128c + 32k + l: ((qs[32c + l] >> 2k) & 3) - (bit 4c + k of hmask[l] ? 0 : 4); 16 groups of 16 with
// 6-bit scales minus 32. v = (d * y.d) * sumi.
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    lanes_dot<BlockQ3_K, BlockQ8_K>(
        n, kQK_K, "q3_k", s, vx, vy, [](const BlockQ3_K &xb, const BlockQ8_K &yb) {
            uint64_t lo8, hi8;
            q3_k_scales(xb.scales, &lo8, &hi8);
            int32_t sc[16];
            for (int g = 0; g < 16; ++g)
                sc[g] = static_cast<int32_t>(((g < 8 ? lo8 : hi8) >> (8 * (g % 8))) & 0xFF) - 32;
            const uint8x16_t h0 = vld1q_u8(xb.hmask), h1 = vld1q_u8(xb.hmask + 16);
            const int8x16_t four = vdupq_n_s8(4);
            int32x4_t acc = vdupq_n_s32(0);
            for (int c = 0; c < 2; ++c) {
                const uint8x16_t r0 = vld1q_u8(xb.qs + 32 * c), r1 = vld1q_u8(xb.qs + 32 * c + 16);
                for (int k = 0; k < 4; ++k) {
                    auto level = [&](uint8x16_t r, uint8x16_t h) {
                        const uint8x16_t u = vorrq_u8(crumb(r, k), vshlq_n_u8(bit_of(h, 4 * c + k), 2));
                        return vsubq_s8(vreinterpretq_s8_u8(u), four);
                    };
                    const int8_t *yq = yb.qs + 128 * c + 32 * k;
                    const int g = 8 * c + 2 * k;
                    acc = vmlaq_n_s32(acc, dot16(level(r0, h0), vld1q_s8(yq)), sc[g]);
                    acc = vmlaq_n_s32(acc, dot16(level(r1, h1), vld1q_s8(yq + 16)), sc[g + 1]);
                }
            }
            return fp16_to_fp32(xb.d) * yb.d * static_cast<float>(vaddvq_s32(acc));
        });
}

// Element 128c + 32k + l: low bits from ql[64c + 32(k & 1) + l] (low nibble for k < 2, high for k >= 2), two
// high bits from qh[32c + l] >> 2k, minus 32; 16 groups of 16 with signed 8-bit scales. v = (d * y.d) * sumi.
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    lanes_dot<BlockQ6_K, BlockQ8_K>(
        n, kQK_K, "q6_k", s, vx, vy, [](const BlockQ6_K &xb, const BlockQ8_K &yb) {
            const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03);
            const int8x16_t m32 = vdupq_n_s8(32);
            int32x4_t acc = vdupq_n_s32(0);
            for (int c = 0; c < 2; ++c) {
                const uint8_t *ql = xb.ql + 64 * c, *qh = xb.qh + 32 * c;
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
                        acc = vmlaq_n_s32(acc, dot16(q, vld1q_s8(yb.qs + e0)), xb.scales[e0 / 16]);
                    }
                }
            }
            return fp16_to_fp32(xb.d) * yb.d * static_cast<float>(vaddvq_s32(acc));
        });
}

// |sumi| <= 256 * 127 * 127: from_float_q8_k never writes -128.
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    lanes_dot<BlockQ8_K, BlockQ8_K>(
        n, kQK_K, "q8_k", s, vx, vy, [](const BlockQ8_K &xb, const BlockQ8_K &yb) {
            int32x4_t acc = vdupq_n_s32(0);
            for (int r = 0; r < kQK_K / 16; ++r)
                acc = vaddq_s32(acc, dot16(vld1q_s8(xb.qs + 16 * r), vld1q_s8(yb.qs + 16 * r)));
            return xb.d * yb.d * static_cast<float>(vaddvq_s32(acc));
        });
}

// The reference's 64 lanes a[j][l] (j < 4, l < 16) as 16 registers: acc[4j + m] holds a[j][4m..4m+3], i.e.
// x[64b + 4(4j + m) + 0..3].
void vec_dot_f32_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const auto *x = static_cast<const float *>(vx);  // [n]
    const auto *y = static_cast<const float *>(vy);  // [n]
    float32x4_t acc[16];
    for (float32x4_t &a : acc) a = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int r = 0; r < 16; ++r)
            acc[r] = vfmaq_f32(acc[r], vld1q_f32(x + i + 4 * r), vld1q_f32(y + i + 4 * r));
    // a0 = (a0 + a2) + (a1 + a3) on 16 lanes, h = lanes 0..7 + lanes 8..15, q = h[0..3] + h[4..7].
    float32x4_t a0[4];
    for (int m = 0; m < 4; ++m)
        a0[m] = vaddq_f32(vaddq_f32(acc[m], acc[8 + m]), vaddq_f32(acc[4 + m], acc[12 + m]));
    float sum = fold4(vaddq_f32(vaddq_f32(a0[0], a0[2]), vaddq_f32(a0[1], a0[3])));
    const int64_t fused = n - n % 8;  // first product of the fused tail
    for (; i < fused; ++i) sum += x[i] * y[i];
    for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
    *s = sum;
}

// The reference's 32 lanes as 8 registers (lanes 4r..4r+3 in acc[r]); whole blocks of 8 go into lanes 0..7.
void vec_dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const auto *x = static_cast<const uint16_t *>(vx);  // [n] half
    const auto *y = static_cast<const uint16_t *>(vy);  // [n] half
    float32x4_t acc[8];
    for (float32x4_t &a : acc) a = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int r = 0; r < 8; ++r)
            acc[r] = vfmaq_f32(acc[r], load_half4(x + i + 4 * r), load_half4(y + i + 4 * r));
    for (; i + 8 <= n; i += 8)
        for (int r = 0; r < 2; ++r)
            acc[r] = vfmaq_f32(acc[r], load_half4(x + i + 4 * r), load_half4(y + i + 4 * r));
    // v[l] = (a[l] + a[l+8]) + (a[l+16] + a[l+24]) for l < 8, then q = v[0..3] + v[4..7].
    const float32x4_t v0 = vaddq_f32(vaddq_f32(acc[0], acc[2]), vaddq_f32(acc[4], acc[6]));
    const float32x4_t v1 = vaddq_f32(vaddq_f32(acc[1], acc[3]), vaddq_f32(acc[5], acc[7]));
    float sum = fold4(vaddq_f32(v0, v1));
    for (; i < n; ++i) sum += fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]);
    *s = sum;
}

// fcvtn rounds to nearest even (the default FPCR mode) and keeps NaNs quiet with their top payload bits, as
// fp32_to_fp16().
void from_float_f16(const float *src, void *dst, int64_t n) {
    auto *d = static_cast<uint16_t *>(dst);  // [n]
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(d + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; ++i) d[i] = vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(src[i]))), 0);
}

// As the reference: the first element of largest magnitude maps to -127 (iscale = -127 / max), the others
// round to nearest even (fcvtns, as nearest_int for these magnitudes) and are capped at 127.
void from_float_q8_k(const float *src, void *dst, int64_t n) {
    auto *y = static_cast<BlockQ8_K *>(dst);  // [n / 256]
    for (int64_t b = 0; b < n_blocks(n, kQK_K, "q8_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        float32x4_t amax4 = vdupq_n_f32(0.0f);
        for (int k = 0; k < kQK_K / 4; ++k) amax4 = vmaxnmq_f32(amax4, vabsq_f32(vld1q_f32(x + 4 * k)));
        const float amax = vmaxnmvq_f32(amax4);
        if (amax == 0.0f) {
            std::memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        float max = 0.0f;
        for (int e = 0; e < kQK_K; ++e) {
            if (std::fabs(x[e]) == amax) {
                max = x[e];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const int32x4_t limit = vdupq_n_s32(127);
        for (int g = 0; g < kQK_K / 16; ++g) {
            int16x8_t q16[2];
            for (int h = 0; h < 2; ++h) {
                const float *xg = x + 16 * g + 8 * h;
                const int32x4_t a = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xg), iscale)), limit);
                const int32x4_t c = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(xg + 4), iscale)), limit);
                q16[h] = vcombine_s16(vmovn_s32(a), vmovn_s32(c));
            }
            const int8x16_t q8 = vcombine_s8(vmovn_s16(q16[0]), vmovn_s16(q16[1]));
            vst1q_s8(y[b].qs + 16 * g, q8);
            y[b].bsums[g] = vaddlvq_s8(q8);
        }
        y[b].d = 1.0f / iscale;
    }
}

}  // namespace td::kernels::neon
