// q4_0 x q8_0 on packed weights (kernels/pack.h) with AVX2: a ymm holds a 4-byte slice of 8 rows (half a
// packed group), so vpmaddubsw + vpmaddwd with a broadcast 4-byte slice of the activations put each row's
// products into its own int32 lane, as the AVX-512 VNNI kernel does with vpdpbusd. Compiled with the AVX2
// flags; matmul calls it only when the CPU has AVX2. Same linkage rule as vec-dot-avx2.cpp.
//
// Exact integer sums: vpmaddubsw adds two nibble x int8 products (|.| <= 2 * 15 * 127), and the eight such
// int16 sums of a block stay within 8 * 3810 = 30480 < 32767, so nothing saturates; -8 * sum(activation
// block) takes the nibble offset back out. Floats as the reference: lane b % 8 += (dw * dx) * float(sumi).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/pack.h"
#include "kernels/x86/kernels-x86.h"
#include "kernels/x86/q8-block-sum.h"

namespace td::kernels::avx2 {
namespace {

constexpr size_t kGroupBlockBytes = kPackRows * sizeof(BlockQ4_0);  // 288
constexpr int kHalfRows = 8;

inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

// Block b of rows [8h, 8h + 8) of a group: (dw * dx) * sumi for the 8 rows.
inline __m256 half_block(const uint8_t *g, int h, const BlockQ8_0 &xb, int32_t offset, float dx) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i p = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(g + 32 + 64 * k + 32 * h));
        const __m256i lo = _mm256_and_si256(q, m4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(lo, _mm256_set1_epi32(load_i32(xb.qs + 4 * k))));
        p = _mm256_add_epi16(p, _mm256_maddubs_epi16(hi, _mm256_set1_epi32(load_i32(xb.qs + 16 + 4 * k))));
    }
    const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)), _mm256_set1_epi32(offset));
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(g + 16 * h)));
    return _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(s));
}

// All blocks of rows [8h, 8h + 8) of the group at `g` for one token; returns the 8 dot products.
inline __m256 half_rows(int64_t nb, const uint8_t *g, int h, const BlockQ8_0 *x, const int32_t *offset,
                        const float *dx) {
    __m256 acc[kDotLanes];
    for (auto &a : acc) a = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + kDotLanes <= nb; b += kDotLanes) {
#pragma GCC unroll 8
        for (int l = 0; l < kDotLanes; ++l) {
            const int64_t bb = b + l;
            acc[l] =
                _mm256_add_ps(acc[l], half_block(g + bb * kGroupBlockBytes, h, x[bb], offset[bb], dx[bb]));
        }
    }
    for (int l = 0; b < nb; ++b, ++l)
        acc[l] = _mm256_add_ps(acc[l], half_block(g + b * kGroupBlockBytes, h, x[b], offset[b], dx[b]));
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                         _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])));
}

}  // namespace

void gemm_q4_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    // Per-token block offsets (-8 * sum of the activation block) and scales, once per call.
    thread_local std::vector<int32_t> offsets;  // [n_tokens][nb]
    thread_local std::vector<float> scales;     // [n_tokens][nb]
    const size_t need = static_cast<size_t>(n_tokens * nb);
    if (offsets.size() < need) offsets.resize(need), scales.resize(need);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto *xt = reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + t * x_stride);
        for (int64_t b = 0; b < nb; ++b) {
            offsets[t * nb + b] = -8 * block_sum_i8(xt[b].qs);
            scales[t * nb + b] = _cvtsh_ss(xt[b].d);
        }
    }
    const auto *wb = static_cast<const uint8_t *>(w);
    const size_t group_bytes = kPackRows * w_stride;
    // Group-outer: a group's bytes are read from memory once and from cache by the other tokens.
    for (int64_t r = 0; r < n_rows; r += kPackRows) {
        const uint8_t *g = wb + static_cast<size_t>(r / kPackRows) * group_bytes;
        for (int64_t t = 0; t < n_tokens; ++t) {
            const auto *xt =
                reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + t * x_stride);
            for (int h = 0; h < 2; ++h)
                _mm256_storeu_ps(y + t * y_stride + r + kHalfRows * h,
                                 half_rows(nb, g, h, xt, offsets.data() + t * nb, scales.data() + t * nb));
        }
    }
}

}  // namespace td::kernels::avx2
