// AVX2 (+F16C) quantizers for the activation side of a matmul (f16, q8_0, q8_1), each writing exactly the
// reference's bytes, and dequantizers for the KV cache's q8_0 and q4_0 rows, each giving the reference's
// floats. Same linkage rule as vec-dot-avx2.cpp: no inline functions from shared headers in this file.
#include <immintrin.h>

#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/x86/kernels-x86.h"

namespace td::kernels::avx2 {
namespace {

inline float hmax_f32x8(__m256 v) {
    __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    q = _mm_max_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_max_ss(q, _mm_shuffle_ps(q, q, 1)));
}

// roundf() for each lane: to nearest, ties away from zero. x - trunc(x) is exact in float, so comparing it
// with 0.5 decides the rounding without the error that floor(x + 0.5) has near 0.49999997.
inline __m256 round_half_away(__m256 x) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(x, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(x, t));
    const __m256 away = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_or_ps(_mm256_set1_ps(1.0f), _mm256_and_ps(x, sign_bit));  // +-1 with x's sign
    return _mm256_add_ps(t, _mm256_and_ps(away, step));
}

}  // namespace

void from_float_f16(const float *src, void *dst, int64_t n) {
    uint16_t *y = static_cast<uint16_t *>(dst);  // [n] half
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(y + i), h);
    }
    for (; i < n; ++i) y[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

namespace {

// One block of 32 as q8_0 and q8_1 quantize it: qs = round(x / d) (half away from zero), d = absmax / 127;
// returns d.
float quantize_block_q8(const float *x, int8_t *qs) {
    const __m256 sign_bit = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(x + 8 * k);
    const __m256 amax8 =
        _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign_bit, v[0]), _mm256_andnot_ps(sign_bit, v[1])),
                      _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[2]), _mm256_andnot_ps(sign_bit, v[3])));
    // Scalar d and 1/d exactly as the reference computes them (not 127 / amax, which rounds differently).
    const float d = hmax_f32x8(amax8) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];  // [4][8] int32 in -127..127
    for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(round_half_away(_mm256_mul_ps(v[k], vid)));
    // Packing works per 128-bit half, leaving 4-byte groups in the order 0 2 4 6 1 3 5 7 of the 8 groups
    // of 4 elements; the permute puts them back in element order.
    const __m256i q16a = _mm256_packs_epi32(q[0], q[1]);
    const __m256i q16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i q8 = _mm256_packs_epi16(q16a, q16b);
    const __m256i ordered = _mm256_permutevar8x32_epi32(q8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(qs), ordered);
    return d;
}

}  // namespace

void from_float_q8_0(const float *src, void *dst, int64_t n) {
    BlockQ8_0 *y = static_cast<BlockQ8_0 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n / kQK; ++b)
        y[b].d = _cvtss_sh(quantize_block_q8(src + b * kQK, y[b].qs), _MM_FROUND_TO_NEAREST_INT);
}

// As q8_0, plus s = d * sum(q).
void from_float_q8_1(const float *src, void *dst, int64_t n) {
    BlockQ8_1 *y = static_cast<BlockQ8_1 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = quantize_block_q8(src + b * kQK, y[b].qs);
        y[b].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        // maddubs(1, q) sums pairs, madd(., 1) quadruples; |sum| <= 32 * 127.
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(y[b].qs));
        const __m256i s4 =
            _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
        __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
        h = _mm_add_epi32(h, _mm_unpackhi_epi64(h, h));
        h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 1));
        y[b].s = _cvtss_sh(static_cast<float>(_mm_cvtsi128_si32(h)) * d, _MM_FROUND_TO_NEAREST_INT);
    }
}

// y = d * q, 8 lanes at a time: the reference's one float product per value (the conversions are exact).
void to_float_q8_0(const void *src, float *dst, int64_t n) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n / kQK; ++b) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[b].d));
        for (int k = 0; k < 4; ++k) {
            const __m128i q8 = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(x[b].qs + 8 * k));
            _mm256_storeu_ps(dst + b * kQK + 8 * k,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), d));
        }
    }
}

// y = (q - 8) * d: low nibbles are values 0..15 of the block, high nibbles 16..31.
void to_float_q4_0(const void *src, float *dst, int64_t n) {
    const BlockQ4_0 *x = static_cast<const BlockQ4_0 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n / kQK; ++b) {
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(x[b].d));
        const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i *>(x[b].qs));
        const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
        const __m128i hi =
            _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F)), _mm_set1_epi8(8));
        float *y = dst + b * kQK;
        for (int k = 0; k < 2; ++k) {
            const __m128i l = k == 0 ? lo : _mm_unpackhi_epi64(lo, lo);
            const __m128i h = k == 0 ? hi : _mm_unpackhi_epi64(hi, hi);
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(l)), d));
            _mm256_storeu_ps(y + 16 + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)), d));
        }
    }
}

}  // namespace td::kernels::avx2
