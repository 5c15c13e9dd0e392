// AVX2 (+FMA, F16C) dot products. Compiled with -mavx2 -mfma -mf16c; called only on CPUs that have them.
//
// Nothing here may use an inline function with external linkage from a shared header (fp16.h, fmt, std
// algorithms): the AVX2 copy could become the program's copy. Halves are converted with F16C instead, which
// is exact like the reference conversion.
//
// Block types: the integer sum of each block is exact, and block b's scaled sum goes into vector lane b % 8,
// the reference's accumulation order (kernels/blocks.h), so the results equal the reference bit for bit.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/x86/kernels-x86.h"

namespace td::kernels::avx2 {
namespace {

// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), the same tree as dot_lanes_sum().
inline float hsum_f32x8(__m256 v) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

inline int32_t hsum_i32x8(__m256i v) {
    __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    q = _mm_add_epi32(q, _mm_unpackhi_epi64(q, q));
    q = _mm_add_epi32(q, _mm_shuffle_epi32(q, 1));
    return _mm_cvtsi128_si32(q);
}

inline float half_to_float(uint16_t h) {
    return _cvtsh_ss(h);
}

// 32 int8 x 32 int8 -> 8 int32 partial sums, exact. maddubs wants an unsigned first operand, so the signs
// move onto y: |x| * (y * sign(x)). Pairs of products stay within int16 (2 * 128 * 127 < 32768) as long as
// y is never -128, which from_float guarantees (-128 * -1 would overflow int8).
inline __m256i dot_i8x32(__m256i x, __m256i y) {
    const __m256i ax = _mm256_sign_epi8(x, x);
    const __m256i sy = _mm256_sign_epi8(y, x);
    const __m256i pairs = _mm256_maddubs_epi16(ax, sy);     // [16] int16
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));  // [8] int32
}

// Eight blocks' 8-lane partial sums -> one vector [S0 .. S7] of the blocks' totals.
inline __m256i sum_blocks_i32x8(const __m256i s[8]) {
    // hadd works inside each 128-bit half: after two rounds, half 0 holds the sums of lanes 0..3 of four
    // blocks and half 1 the sums of lanes 4..7; the two halves are then added.
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    const __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    const __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    return _mm256_add_epi32(lo, hi);
}

inline __m256i load_i8x32(const int8_t *p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
}

// Eight consecutive halves, one per block, as floats: field(block k) gives block k's half.
template <typename B, typename Field>
inline __m256 block_halves(const B *blocks, Field field) {
    alignas(16) uint16_t h[8];
    for (int k = 0; k < 8; ++k) h[k] = field(blocks[k]);
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(h)));
}

// The skeleton of every 32-element block dot: `block_dot(x, y)` gives one block's 8 int32 partials; block b
// adds dx * dy * sumi (+ mx * sy), computed as the reference writes it, into lane b % 8.
template <typename BX, typename BY, typename BlockDot>
inline float dot_blocks(int64_t n, const BX *x, const BY *y, BlockDot block_dot) {
    const int64_t nb = n / kQK;
    __m256 acc = _mm256_setzero_ps();  // lane k: blocks b with b % 8 == k
    int64_t b = 0;
    for (; b + kDotLanes <= nb; b += kDotLanes) {
        __m256i partial[kDotLanes];
        for (int k = 0; k < kDotLanes; ++k) partial[k] = block_dot(x[b + k], y[b + k]);
        const __m256 sumf = _mm256_cvtepi32_ps(sum_blocks_i32x8(partial));
        const __m256 scales = _mm256_mul_ps(block_halves(x + b, [](const BX &v) { return v.d; }),
                                            block_halves(y + b, [](const BY &v) { return v.d; }));
        __m256 v = _mm256_mul_ps(scales, sumf);
        if constexpr (kBlockHasMin<BX>)
            v = _mm256_add_ps(v, _mm256_mul_ps(block_halves(x + b, [](const BX &u) { return u.m; }),
                                               block_halves(y + b, [](const BY &u) { return u.s; })));
        acc = _mm256_add_ps(acc, v);
    }
    alignas(32) float lanes[kDotLanes];
    _mm256_store_ps(lanes, acc);
    for (; b < nb; ++b) {
        const float sumi = static_cast<float>(hsum_i32x8(block_dot(x[b], y[b])));
        float v = half_to_float(x[b].d) * half_to_float(y[b].d) * sumi;
        if constexpr (kBlockHasMin<BX>) v = v + half_to_float(x[b].m) * half_to_float(y[b].s);
        lanes[b % kDotLanes] += v;
    }
    return dot_lanes_sum(lanes);
}

// q4 nibbles (low: elements 0..15, high: 16..31) as 32 unsigned levels in element order.
inline __m256i unpack_nibbles(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}

// q5 levels: the nibbles plus 16 where bit i of qh (element i's fifth bit) is set.
inline __m256i unpack_q5(const uint8_t *qs, const uint8_t *qh) {
    uint32_t bits;
    std::memcpy(&bits, qh, sizeof bits);
    // Byte i gets byte i / 8 of bits; OR-ing every bit but i % 8 makes it all ones exactly when bit i is set.
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE)),
                                          _mm256_set1_epi8(-1));
    return _mm256_or_si256(unpack_nibbles(qs), _mm256_and_si256(set, _mm256_set1_epi8(16)));
}

// Unsigned levels (<= 31) times signed int8: maddubs pairs <= 2 * 31 * 128, exact.
inline __m256i dot_u8x32(__m256i levels, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(levels, y), _mm256_set1_epi16(1));
}

}  // namespace

void vec_dot_f32_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = static_cast<const float *>(vx);  // [n]
    const float *y = static_cast<const float *>(vy);  // [n]
    // The reference's 64 lanes as eight registers: acc[m] holds lanes 8m..8m+7, i.e. x[64b + 8m + 0..7].
    __m256 acc[8];
    for (__m256 &a : acc) a = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int m = 0; m < 8; ++m)
            acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * m), _mm256_loadu_ps(y + i + 8 * m), acc[m]);
    // a0 = (a0 + a2) + (a1 + a3) on 16 lanes (two registers), then hsum_f32x8(lanes 0..7 + lanes 8..15) is
    // the reference's 16-lane fold.
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    float sum = hsum_f32x8(_mm256_add_ps(lo, hi));
    const int64_t fused = n - n % 8;  // first product of the fused tail
    for (; i < fused; ++i) sum += x[i] * y[i];
    for (; i < n; ++i) sum = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(x[i]), _mm_set_ss(y[i]), _mm_set_ss(sum)));
    *s = sum;
}

void vec_dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = static_cast<const uint16_t *>(vx);  // [n] half
    const uint16_t *y = static_cast<const uint16_t *>(vy);  // [n] half
    auto load = [](const uint16_t *p) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
    };
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm256_fmadd_ps(load(x + i), load(y + i), acc0);
        acc1 = _mm256_fmadd_ps(load(x + i + 8), load(y + i + 8), acc1);
        acc2 = _mm256_fmadd_ps(load(x + i + 16), load(y + i + 16), acc2);
        acc3 = _mm256_fmadd_ps(load(x + i + 24), load(y + i + 24), acc3);
    }
    for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load(x + i), load(y + i), acc0);
    float sum = hsum_f32x8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
    for (; i < n; ++i) sum += half_to_float(x[i]) * half_to_float(y[i]);
    *s = sum;
}

void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ4_0 *x = static_cast<const BlockQ4_0 *>(vx);  // [n / 32]
    const BlockQ8_0 *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    *s = dot_blocks(n, x, y, [](const BlockQ4_0 &bx, const BlockQ8_0 &by) {
        return dot_i8x32(_mm256_sub_epi8(unpack_nibbles(bx.qs), _mm256_set1_epi8(8)), load_i8x32(by.qs));
    });
}

void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ4_1 *x = static_cast<const BlockQ4_1 *>(vx);  // [n / 32]
    const BlockQ8_1 *y = static_cast<const BlockQ8_1 *>(vy);  // [n / 32]
    *s = dot_blocks(n, x, y, [](const BlockQ4_1 &bx, const BlockQ8_1 &by) {
        return dot_u8x32(unpack_nibbles(bx.qs), load_i8x32(by.qs));
    });
}

void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ5_0 *x = static_cast<const BlockQ5_0 *>(vx);  // [n / 32]
    const BlockQ8_0 *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    *s = dot_blocks(n, x, y, [](const BlockQ5_0 &bx, const BlockQ8_0 &by) {
        return dot_i8x32(_mm256_sub_epi8(unpack_q5(bx.qs, bx.qh), _mm256_set1_epi8(16)), load_i8x32(by.qs));
    });
}

void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ5_1 *x = static_cast<const BlockQ5_1 *>(vx);  // [n / 32]
    const BlockQ8_1 *y = static_cast<const BlockQ8_1 *>(vy);  // [n / 32]
    *s = dot_blocks(n, x, y, [](const BlockQ5_1 &bx, const BlockQ8_1 &by) {
        return dot_u8x32(unpack_q5(bx.qs, bx.qh), load_i8x32(by.qs));
    });
}

void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(vx);  // [n / 32]
    const BlockQ8_0 *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    *s = dot_blocks(n, x, y, [](const BlockQ8_0 &bx, const BlockQ8_0 &by) {
        return dot_i8x32(load_i8x32(bx.qs), load_i8x32(by.qs));
    });
}

void vec_dot_q8_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ8_1 *x = static_cast<const BlockQ8_1 *>(vx);  // [n / 32]
    const BlockQ8_1 *y = static_cast<const BlockQ8_1 *>(vy);  // [n / 32]
    *s = dot_blocks(n, x, y, [](const BlockQ8_1 &bx, const BlockQ8_1 &by) {
        return dot_i8x32(load_i8x32(bx.qs), load_i8x32(by.qs));
    });
}

}  // namespace td::kernels::avx2
