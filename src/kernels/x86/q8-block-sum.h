// The exact sum of a q8_0 block's 32 signed bytes, for kernels that take an unsigned-weight offset back out
// (sum_j (u_j - c) y_j = sum_j u_j y_j - c sum_j y_j). AVX2; included only by x86 ISA files and kept in an
// anonymous namespace, so each gets its own copy compiled with its own flags (vec-dot-avx2.cpp's rule).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/blocks.h"

namespace td::kernels {
namespace {  // NOLINT: one copy per ISA file, compiled with that file's flags

// sad of (y + 128) against zero, then 32 * 128 taken off.
inline int32_t block_sum_i8(const int8_t *qs) {
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qs));
    const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(y, _mm256_set1_epi8(-128)), _mm256_setzero_si256());
    const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return _mm_cvtsi128_si32(_mm_add_epi64(h, _mm_unpackhi_epi64(h, h))) - kQK * 128;
}

}  // namespace
}  // namespace td::kernels
