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
#include <type_traits>

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

// sum_g w[g] * bsums[g] over the 16 groups, w as 16 int16: 8 int32 partial sums.
inline __m256i weighted_bsums(__m256i w, const BlockQ8_K &y) {
    return _mm256_madd_epi16(w, load_256(y.bsums));
}

// Lane j: the sum of the 8 lanes of v[j].
inline __m256i hsum_8x8(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    // a: [v0 v1 v2 v3 of the low 128 bits | of the high 128 bits]; b likewise for v4..v7.
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// One super-block's exact integer sums as 8 int32 partials each: sumi, and summ for the types with mins.
struct SuperInts {
    __m256i sumi;
    __m256i summ;
};

// The x side's float scales of a super-block: d (q8_k's is f32) and, with kMin, dmin.
template <typename Block, bool kMin>
inline void x_scales(const Block &xb, float *d, float *dmin) {
    if constexpr (std::is_same_v<Block, BlockQ8_K>) {
        *d = xb.d;
    } else {
        *d = half_to_float(xb.d);
    }
    if constexpr (kMin) *dmin = half_to_float(xb.dmin);
}

// *s = sum over super-blocks of their scaled sums, super-block b in accumulator lane b % 8 and the lanes
// folded in the canonical tree, as the reference. ints(x, y) gives a super-block's SuperInts. The float
// expression is the reference's: kMin: (dx y.d) sumi - (dminx y.d) summ, else (dx y.d) sumi. Eight
// consecutive super-blocks fill the 8 lanes of one vector, so their horizontal sums and float work are done
// 8 at a time; the rest one by one.
template <typename Block, bool kMin, typename Ints>
void superblock_dot(int64_t n, float *s, const void *vx, const void *vy, Ints ints) {
    const Block *x = static_cast<const Block *>(vx);          // [n / 256]
    const BlockQ8_K *y = static_cast<const BlockQ8_K *>(vy);  // [n / 256]
    const int64_t nb = n / kQK_K;
    __m256 lanes = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + kDotLanes <= nb; b += kDotLanes) {
        __m256i vi[kDotLanes], vm[kDotLanes];
        alignas(32) float dx[kDotLanes], dmx[kDotLanes], dy[kDotLanes];
        for (int j = 0; j < kDotLanes; ++j) {
            const SuperInts r = ints(x[b + j], y[b + j]);
            vi[j] = r.sumi;
            vm[j] = r.summ;
            x_scales<Block, kMin>(x[b + j], &dx[j], &dmx[j]);
            dy[j] = y[b + j].d;
        }
        const __m256 yd = _mm256_load_ps(dy);
        __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(dx), yd), _mm256_cvtepi32_ps(hsum_8x8(vi)));
        if constexpr (kMin)
            f = _mm256_sub_ps(
                f, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(dmx), yd), _mm256_cvtepi32_ps(hsum_8x8(vm))));
        lanes = _mm256_add_ps(lanes, f);
    }
    alignas(32) float l[kDotLanes];
    _mm256_store_ps(l, lanes);
    for (; b < nb; ++b) {
        const SuperInts r = ints(x[b], y[b]);
        float d, dmin;
        x_scales<Block, kMin>(x[b], &d, &dmin);
        float f = d * y[b].d * static_cast<float>(hsum_i32x8(r.sumi));
        if constexpr (kMin) f -= dmin * y[b].d * static_cast<float>(hsum_i32x8(r.summ));
        l[b % kDotLanes] += f;
    }
    *s = dot_lanes_sum(l);
}

// pshufb index that puts scale byte 0 (low 128-bit lane) and 1 (high lane) into byte `pos` of every word, the
// other byte zeroed. Adding 2 * j to every byte selects bytes 2j, 2j + 1; the zeroing bytes (0x80 + 2j, up to
// 0x8E) keep their high bit.
inline __m256i scale_word_index(int pos) {
    alignas(32) uint8_t idx[32];
    for (int i = 0; i < 32; ++i) idx[i] = i % 2 == pos ? static_cast<uint8_t>(i / 16) : 0x80;
    return _mm256_load_si256(reinterpret_cast<const __m256i *>(idx));
}

// q4_k and q5_k: levels(c, &lo, &hi) gives chunk c's two 32-element runs of levels as bytes; 6-bit scales
// and mins. Pairs <= 2 * 31 * 127, times scale <= 63. Run j's scale reaches madd's words through pshufb of
// the scale bytes (in both 128-bit lanes) with index j in the low byte of every word.
template <typename Block, typename Levels>
[[gnu::always_inline]] inline SuperInts scale_min_superblock(const Block &xb, const BlockQ8_K &yb,
                                                             Levels levels) {
    uint64_t sc8, mn8;
    q4_k_scales(xb.scales, &sc8, &mn8);
    const __m256i sc = _mm256_broadcastsi128_si256(_mm_cvtsi64_si128(static_cast<long long>(sc8)));
    // Word index for run j in both lanes: byte j in the low byte of every word.
    __m256i idx = _mm256_set1_epi16(static_cast<int16_t>(0x8000));
    const __m256i one = _mm256_set1_epi8(1);
    __m256i acc = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
        __m256i lo, hi;
        levels(c, &lo, &hi);
        const __m256i plo = _mm256_maddubs_epi16(lo, load_256(yb.qs + 64 * c));
        const __m256i phi = _mm256_maddubs_epi16(hi, load_256(yb.qs + 64 * c + 32));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_shuffle_epi8(sc, idx)));
        idx = _mm256_add_epi8(idx, one);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, _mm256_shuffle_epi8(sc, idx)));
        idx = _mm256_add_epi8(idx, one);
    }
    // summ = sum_j m[j] (bsums[2j] + bsums[2j + 1]): each min twice, against bsums in order.
    const __m128i mn = _mm_cvtsi64_si128(static_cast<long long>(mn8));
    return {acc, weighted_bsums(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn)), yb)};
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

// q2_k and q3_k: run (c, k) holds elements 128c + 32k + l, crumb k of qs[32c + l]; its maddubs pairs are
// groups 8c + 2k (low 128-bit lane) and 8c + 2k + 1 (high lane), whose scales reach madd's words through
// pshufb of the 16 scale bytes (in both lanes) with scale_word_index stepped by 2 per run.

// Pairs <= 2 * 3 * 127, times scale <= 15.
void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i idx0 = scale_word_index(0);
    const __m256i two = _mm256_set1_epi8(2);
    superblock_dot<BlockQ2_K, true>(n, s, vx, vy, [&](const BlockQ2_K &xb, const BlockQ8_K &yb) {
        const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i *>(xb.scales));
        const __m256i sc = _mm256_and_si256(_mm256_broadcastsi128_si256(sm), m4);
        __m256i idx = idx0;
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            for (int k = 0; k < 4; ++k) {
                const __m256i q = _mm256_and_si256(k == 0 ? raw : _mm256_srli_epi16(raw, 2 * k), m3);
                const __m256i p = _mm256_maddubs_epi16(q, load_256(yb.qs + 128 * c + 32 * k));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, idx)));
                idx = _mm256_add_epi8(idx, two);
            }
        }
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
        return SuperInts{acc, weighted_bsums(mins, yb)};
    });
}

// Levels 0..7 (2 low bits + 4 * hmask bit), pairs <= 2 * 7 * 127. The signed scales s - 32 enter as the high
// byte of their words, so every product is 256 times too large; shifted back per lane, which is exact as
// each lane's |sum| <= 256 * 7 * 32 * 127 * 256 < 2^31. Then - 4 sum (s - 32) bsum takes the offset out.
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m256i four = _mm256_set1_epi8(4);
    const __m256i idx0 = scale_word_index(1);
    const __m256i two = _mm256_set1_epi8(2);
    superblock_dot<BlockQ3_K, false>(n, s, vx, vy, [&](const BlockQ3_K &xb, const BlockQ8_K &yb) {
        uint64_t lo8, hi8;
        q3_k_scales(xb.scales, &lo8, &hi8);
        const __m128i s8 = _mm_sub_epi8(
            _mm_set_epi64x(static_cast<long long>(hi8), static_cast<long long>(lo8)), _mm_set1_epi8(32));
        const __m256i sc = _mm256_broadcastsi128_si256(s8);
        const __m256i hm = load_256(xb.hmask);
        __m256i idx = idx0;
        __m256i acc = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            for (int k = 0; k < 4; ++k) {
                // Bit 4c + k of hmask moved to bit 2 (the level's 4); shifts stay inside each byte.
                const int bit = 4 * c + k;
                const __m256i h = _mm256_and_si256(
                    bit <= 2 ? _mm256_slli_epi16(hm, 2 - bit) : _mm256_srli_epi16(hm, bit - 2), four);
                const __m256i q =
                    _mm256_or_si256(_mm256_and_si256(k == 0 ? raw : _mm256_srli_epi16(raw, 2 * k), m3), h);
                const __m256i p = _mm256_maddubs_epi16(q, load_256(yb.qs + 128 * c + 32 * k));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_shuffle_epi8(sc, idx)));
                idx = _mm256_add_epi8(idx, two);
            }
        }
        const __m256i offset = _mm256_slli_epi32(weighted_bsums(_mm256_cvtepi8_epi16(s8), yb), 2);
        return SuperInts{_mm256_sub_epi32(_mm256_srai_epi32(acc, 8), offset), _mm256_setzero_si256()};
    });
}

// Pairs <= 2 * 15 * 127, times scale <= 63.
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    superblock_dot<BlockQ4_K, true>(n, s, vx, vy, [&](const BlockQ4_K &xb, const BlockQ8_K &yb) {
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
    const __m256i sixteen = _mm256_set1_epi8(16);
    superblock_dot<BlockQ5_K, true>(n, s, vx, vy, [&](const BlockQ5_K &xb, const BlockQ8_K &yb) {
        const __m256i hb = load_256(xb.qh);
        return scale_min_superblock(xb, yb, [&](int c, __m256i *lo, __m256i *hi) {
            const __m256i raw = load_256(xb.qs + 32 * c);
            // Bit 2c (lo) and 2c + 1 (hi) of qh moved to bit 4; shifts stay inside each byte.
            auto fifth = [&](int bit) {
                return _mm256_and_si256(
                    bit <= 4 ? _mm256_slli_epi16(hb, 4 - bit) : _mm256_srli_epi16(hb, bit - 4), sixteen);
            };
            *lo = _mm256_or_si256(_mm256_and_si256(raw, m4), fifth(2 * c));
            *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4), fifth(2 * c + 1));
        });
    });
}

// Levels 0..63, pairs <= 2 * 63 * 127, times |scale| <= 128; then - 32 sum scale bsum.
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m2 = _mm256_set1_epi8(0x03);
    const __m256i idx0 = scale_word_index(1);
    const __m256i two = _mm256_set1_epi8(2);
    superblock_dot<BlockQ6_K, false>(n, s, vx, vy, [&](const BlockQ6_K &xb, const BlockQ8_K &yb) {
        const __m128i s8 = _mm_loadu_si128(reinterpret_cast<const __m128i *>(xb.scales));
        const __m256i sc16 = _mm256_cvtepi8_epi16(s8);
        // Signed scales as words: pshufb of the bytes into the high byte, sign-extended by an arithmetic
        // shift.
        const __m256i sc = _mm256_broadcastsi128_si256(s8);
        __m256i idx = idx0;
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
                const __m256i w = _mm256_srai_epi16(_mm256_shuffle_epi8(sc, idx), 8);
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, w));
                idx = _mm256_add_epi8(idx, two);
            }
        }
        const __m256i offset = _mm256_slli_epi32(weighted_bsums(sc16, yb), 5);
        return SuperInts{_mm256_sub_epi32(acc, offset), _mm256_setzero_si256()};
    });
}

// Signs moved onto y so maddubs sees |x|: pairs <= 2 * 127 * 127 (neither side is ever -128).
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    const __m256i ones16 = _mm256_set1_epi16(1);
    superblock_dot<BlockQ8_K, false>(n, s, vx, vy, [&](const BlockQ8_K &xb, const BlockQ8_K &yb) {
        __m256i acc = _mm256_setzero_si256();
        for (int r = 0; r < kQK_K / 32; ++r) {
            const __m256i xv = load_256(xb.qs + 32 * r);
            const __m256i yv = load_256(yb.qs + 32 * r);
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(xv, xv), _mm256_sign_epi8(yv, xv));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones16));
        }
        return SuperInts{acc, _mm256_setzero_si256()};
    });
}

}  // namespace td::kernels::avx2
