// AVX2 K-quant kernels: the q8_k activation quantizer and the dot products of every K type with q8_k.
// Compiled with -mavx2 -mfma -mf16c; called only on CPUs that have them. Same linkage rule as
// vec-dot-avx2.cpp: no inline functions with external linkage from shared headers in this file.
//
// The integer sums of a super-block are computed with maddubs/madd (exact: the bounds are noted at each
// kernel) in whatever order is fastest; the float expression per super-block and the lane it lands in are
// written exactly as in ref/kquants-dot-ref.cpp, so the results equal the reference bit for bit.
//
// Unsigned levels: maddubs multiplies unsigned bytes by signed bytes, so the weights enter as their unsigned
// level (q2: 0..3, q3: 0..7, q4: 0..15, q5: 0..31, q6: 0..63) and a signed offset (q3: -4, q6: -32) is taken
// out afterwards with q8_k's per-16 sums: sum (q - o) y = sum q y - o * bsum.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/x86/kquants-x86.h"

namespace td::kernels::avx2 {
namespace {

inline int32_t hsum_i32x8(__m256i v) {
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 1));
    return _mm_cvtsi128_si32(q);
}

inline float half_to_float(uint16_t h) {
    return _cvtsh_ss(h);
}

inline __m256i load_256(const void *p) {
    return _mm256_loadu_si256(static_cast<const __m256i *>(p));
}

// 16 int16: the low 8 are `lo`, the high 8 are `hi`, matching maddubs pairs of bytes 0..15 and 16..31.
inline __m256i scale_pair(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(hi)),
                            _mm_set1_epi16(static_cast<int16_t>(lo)));
}

// sum_g w[g] * bsums[g] over the 16 groups, w as 16 int16.
inline int32_t weighted_bsums(__m256i w, const BlockQ8_K &y) {
    return hsum_i32x8(_mm256_madd_epi16(w, load_256(y.bsums)));
}

// Bytes of `bits` whose bit `bit` is set become `value`, the others 0.
inline __m256i select_bit(__m256i bits, int bit, char value) {
    const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, m), m), _mm256_set1_epi8(value));
}

void scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// *s = sum over super-blocks of dot(x[b], y[b]) in accumulator lane b % 8, folded in the canonical tree
// (the loop every K-quant dot shares; dot returns the super-block's scaled float, as the reference's).
template <typename Block, typename SuperDot>
void superblock_dot(int64_t n, float *s, const void *vx, const void *vy, SuperDot dot) {
    const Block *x = static_cast<const Block *>(vx);          // [n / 256]
    const BlockQ8_K *y = static_cast<const BlockQ8_K *>(vy);  // [n / 256]
    float lanes[kDotLanes] = {};
    for (int64_t b = 0; b < n / kQK_K; ++b) lanes[b % kDotLanes] += dot(x[b], y[b]);
    *s = dot_lanes_sum(lanes);
}

// q4_k and q5_k: levels(c, &lo, &hi) gives chunk c's two 32-element runs of levels as bytes; 6-bit scales
// and mins. Pairs <= 2 * 31 * 127, times scale <= 63.
template <typename Block, typename Levels>
float scale_min_superblock(const Block &xb, const BlockQ8_K &yb, Levels levels) {
    int sc[8], m[8];
    for (int j = 0; j < 8; ++j) scale_min_k4(j, xb.scales, &sc[j], &m[j]);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
        __m256i lo, hi;
        levels(c, &lo, &hi);
        const __m256i plo = _mm256_maddubs_epi16(lo, load_256(yb.qs + 64 * c));
        const __m256i phi = _mm256_maddubs_epi16(hi, load_256(yb.qs + 64 * c + 32));
        acc =
            _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_set1_epi16(static_cast<int16_t>(sc[2 * c]))));
        acc = _mm256_add_epi32(
            acc, _mm256_madd_epi16(phi, _mm256_set1_epi16(static_cast<int16_t>(sc[2 * c + 1]))));
    }
    const int32_t sumi = hsum_i32x8(acc);
    int32_t summ = 0;
    for (int j = 0; j < 8; ++j) summ += m[j] * (yb.bsums[2 * j] + yb.bsums[2 * j + 1]);
    const float dall = half_to_float(xb.d) * yb.d;
    const float dmin = half_to_float(xb.dmin) * yb.d;
    return dall * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
}

}  // namespace

void from_float_q8_k(const float *src, void *dst, int64_t n) {
    BlockQ8_K *y = static_cast<BlockQ8_K *>(dst);  // [n / 256]
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / kQK_K; ++b) {
        const float *x = src + b * kQK_K;  // [256]
        __m256 amax8 = _mm256_setzero_ps();
        for (int k = 0; k < kQK_K / 8; ++k)
            amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + 8 * k)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
        if (amax == 0.0f) {
            std::memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        // The first element whose magnitude is amax gives the sign, as in the reference's scan.
        float max = 0.0f;
        const __m256 vamax = _mm256_set1_ps(amax);
        for (int k = 0; k < kQK_K / 8; ++k) {
            const __m256 ax = _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + 8 * k));
            const int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, vamax, _CMP_EQ_OQ));
            if (mask != 0) {
                max = x[8 * k + __builtin_ctz(static_cast<unsigned>(mask))];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vis = _mm256_set1_ps(iscale);
        const __m256i limit = _mm256_set1_epi32(127);
        const __m256i ones8 = _mm256_set1_epi8(1);
        const __m256i ones16 = _mm256_set1_epi16(1);
        for (int r = 0; r < kQK_K / 32; ++r) {
            // cvtps rounds to nearest even under the default MXCSR, like nearest_int.
            __m256i q[4];  // [4][8] int32
            for (int k = 0; k < 4; ++k)
                q[k] = _mm256_min_epi32(
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * r + 8 * k), vis)), limit);
            const __m256i q8 =
                _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            const __m256i ordered =
                _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(reinterpret_cast<__m256i *>(y[b].qs + 32 * r), ordered);
            // Sums of 4 consecutive elements: lanes 0..3 cover elements 0..15, lanes 4..7 elements 16..31.
            alignas(32) int32_t s4[8];
            _mm256_store_si256(reinterpret_cast<__m256i *>(s4),
                               _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, ordered), ones16));
            y[b].bsums[2 * r] = static_cast<int16_t>(s4[0] + s4[1] + s4[2] + s4[3]);
            y[b].bsums[2 * r + 1] = static_cast<int16_t>(s4[4] + s4[5] + s4[6] + s4[7]);
        }
        y[b].d = 1.0f / iscale;
    }
}

// Per 32-element run: maddubs pairs <= 2 * 3 * 127, times scale <= 15.
void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m3 = _mm256_set1_epi8(3);
    superblock_dot<BlockQ2_K>(n, s, vx, vy, [&](const BlockQ2_K &xb, const BlockQ8_K &yb) {
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            for (int k = 0; k < 4; ++k) {
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw, 2 * k), m3);
                const __m256i p = _mm256_maddubs_epi16(q, load_256(yb.qs + 128 * c + 32 * k));
                const int g = 8 * c + 2 * k;
                acc = _mm256_add_epi32(
                    acc, _mm256_madd_epi16(p, scale_pair(xb.scales[g] & 0x0F, xb.scales[g + 1] & 0x0F)));
            }
        }
        const int32_t sumi = hsum_i32x8(acc);
        const __m256i mins = _mm256_srli_epi16(
            _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(xb.scales))), 4);
        const int32_t summ = weighted_bsums(mins, yb);
        const float dall = half_to_float(xb.d) * yb.d;
        const float dmin = half_to_float(xb.dmin) * yb.d;
        return dall * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
    });
}

// Levels 0..7 (2 low bits + 4 * hmask bit), pairs <= 2 * 7 * 127, times |s - 32| <= 32; then - 4 sum s bsum.
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m3 = _mm256_set1_epi8(3);
    superblock_dot<BlockQ3_K>(n, s, vx, vy, [&](const BlockQ3_K &xb, const BlockQ8_K &yb) {
        alignas(32) int16_t sc[16];
        for (int g = 0; g < 16; ++g) {
            const int lo = g < 8 ? (xb.scales[g] & 0x0F) : (xb.scales[g - 8] >> 4);
            const int hi = (xb.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
            sc[g] = static_cast<int16_t>((lo | (hi << 4)) - 32);
        }
        const __m256i hm = load_256(xb.hmask);
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            for (int k = 0; k < 4; ++k) {
                const __m256i q = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 2 * k), m3),
                                                  select_bit(hm, 4 * c + k, 4));
                const __m256i p = _mm256_maddubs_epi16(q, load_256(yb.qs + 128 * c + 32 * k));
                const int g = 8 * c + 2 * k;
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(sc[g], sc[g + 1])));
            }
        }
        const int32_t offset = weighted_bsums(_mm256_load_si256(reinterpret_cast<const __m256i *>(sc)), yb);
        const int32_t sumi = hsum_i32x8(acc) - 4 * offset;
        return half_to_float(xb.d) * yb.d * static_cast<float>(sumi);
    });
}

// Pairs <= 2 * 15 * 127, times scale <= 63.
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    superblock_dot<BlockQ4_K>(n, s, vx, vy, [&](const BlockQ4_K &xb, const BlockQ8_K &yb) {
        return scale_min_superblock(xb, yb, [&](int c, __m256i *lo, __m256i *hi) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            *lo = _mm256_and_si256(raw, m4);
            *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        });
    });
}

// Pairs <= 2 * 31 * 127, times scale <= 63.
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    superblock_dot<BlockQ5_K>(n, s, vx, vy, [&](const BlockQ5_K &xb, const BlockQ8_K &yb) {
        const __m256i hb = load_256(xb.qh);
        return scale_min_superblock(xb, yb, [&](int c, __m256i *lo, __m256i *hi) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            *lo = _mm256_or_si256(_mm256_and_si256(raw, m4), select_bit(hb, 2 * c, 16));
            *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                  select_bit(hb, 2 * c + 1, 16));
        });
    });
}

// Levels 0..63, pairs <= 2 * 63 * 127, times |scale| <= 128; then - 32 sum scale bsum.
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    superblock_dot<BlockQ6_K>(n, s, vx, vy, [&](const BlockQ6_K &xb, const BlockQ8_K &yb) {
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(xb.scales)));
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i ql0 = load_256(xb.ql + 64 * c);
            const __m256i ql1 = load_256(xb.ql + 64 * c + 32);
            const __m256i qh = load_256(xb.qh + 32 * c);
            const __m256i low[4] = {_mm256_and_si256(ql0, m4), _mm256_and_si256(ql1, m4),
                                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4)};
            for (int k = 0; k < 4; ++k) {
                const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2), 4);
                const __m256i q = _mm256_or_si256(low[k], high);
                const __m256i p = _mm256_maddubs_epi16(q, load_256(yb.qs + 128 * c + 32 * k));
                const int g = 8 * c + 2 * k;
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale_pair(xb.scales[g], xb.scales[g + 1])));
            }
        }
        const int32_t sumi = hsum_i32x8(acc) - 32 * weighted_bsums(sc16, yb);
        return half_to_float(xb.d) * yb.d * static_cast<float>(sumi);
    });
}

// Signs moved onto y so maddubs sees |x|: pairs <= 2 * 127 * 127 (neither side is ever -128).
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    superblock_dot<BlockQ8_K>(n, s, vx, vy, [&](const BlockQ8_K &xb, const BlockQ8_K &yb) {
        __m256i acc = _mm256_setzero_si256();
        for (int r = 0; r < kQK_K / 32; ++r) {
            const __m256i xv = load_256(xb.qs + 32 * r);
            const __m256i yv = load_256(yb.qs + 32 * r);
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones16));
        }
        return xb.d * yb.d * static_cast<float>(hsum_i32x8(acc));
    });
}

}  // namespace td::kernels::avx2
