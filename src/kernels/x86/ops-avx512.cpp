// AVX-512 row ops. Compiled with AVX-512 F/BW/VL (CMakeLists.txt); called only when isa_active() is avx512
// (ops.cpp). Same linkage rule as ops-avx2.cpp: no inline functions from shared headers; the softmax's exp
// and tanh come from the reference's own scalar pass (ref::softmax_weights).
#include <immintrin.h>
#include <math.h>

#include <cstdint>

#include "kernels/ref/ops-ref.h"
#include "kernels/x86/kernels-x86.h"

// GCC 12 reports the undefined source operand of the masked intrinsics behind _mm512_cvtps_ph and the 256-bit
// extract (avx512fintrin.h) as (maybe) uninitialized once inlined into the unrolled loops: a known false
// positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace td::kernels::avx512 {
namespace {

// f32 -> f16 -> f32 on 16 lanes, round to nearest even (fp32_to_fp16()).
inline __m512 round_f16(__m512 v) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

inline __m512 load_f16(const uint16_t *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
}

// The reference's fold of ggml's four 16-lane accumulators (ref/ops-ref.cpp dot_f16_q): lanes
// (a0 + a2) + (a1 + a3), then l + (l + 8), l + (l + 4), and (r0 + r2) + (r1 + r3).
inline float fold4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
    const __m512 a = _mm512_add_ps(_mm512_add_ps(a0, a2), _mm512_add_ps(a1, a3));
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(a),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
    const __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 s = _mm_add_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// Asks for the cache lines of an f16 row of kD elements.
template <int kD>
inline void prefetch_row(const uint16_t *row) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(row + kD);
    for (uintptr_t a = reinterpret_cast<uintptr_t>(row) & ~uintptr_t{63}; a < end; a += 64)
        _mm_prefetch(reinterpret_cast<const char *>(a), _MM_HINT_T0);
}

// kG query heads against one f16 K/V head of kD16 * 16 dimensions (a multiple of 64). The accumulators of
// every head stay in registers: kG * kD16 <= 16.
template <int kD16, int kG>
void attention_f16(const float *q, const uint16_t *k, const uint16_t *v, int64_t kv_stride, int32_t n_kv,
                   float scale, float softcap, float *scores, float *out) {
    static_assert(kD16 % 4 == 0 && kG * kD16 <= 16);
    constexpr int kD = kD16 * 16;
    __m512 qr[kG][kD16];  // the queries rounded to f16, as the reference
    for (int g = 0; g < kG; ++g)
        for (int c = 0; c < kD16; ++c) qr[g][c] = round_f16(_mm512_loadu_ps(q + g * kD + 16 * c));

    // Scores of every head, one K row at a time (each row converted once for all the heads).
    // The cache rows are strided (other heads between them) and usually not in cache any more (a token's
    // weights stream through it between two layers' attention): they are asked for ahead of use, the K rows
    // kAhead rows ahead and each V row when its K row is read, so the misses overlap.
    constexpr int32_t kAhead = 8;
    for (int32_t j = 0; j < kAhead && j < n_kv; ++j) prefetch_row<kD>(k + static_cast<size_t>(j) * kv_stride);
    if (softcap != 0.0f) scale /= softcap;
    for (int32_t j = 0; j < n_kv; ++j) {
        const uint16_t *kj = k + static_cast<size_t>(j) * kv_stride;
        if (j + kAhead < n_kv) prefetch_row<kD>(kj + kAhead * kv_stride);
        prefetch_row<kD>(v + static_cast<size_t>(j) * kv_stride);
        __m512 acc[kG][4];
        for (int g = 0; g < kG; ++g)
            for (int m = 0; m < 4; ++m) acc[g][m] = _mm512_setzero_ps();
        for (int c = 0; c < kD16; c += 4) {
            for (int m = 0; m < 4; ++m) {
                const __m512 kz = load_f16(kj + 16 * (c + m));
                for (int g = 0; g < kG; ++g) acc[g][m] = _mm512_fmadd_ps(qr[g][c + m], kz, acc[g][m]);
            }
        }
        for (int g = 0; g < kG; ++g)
            scores[static_cast<size_t>(g) * n_kv + j] =
                fold4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]) * scale;
    }

    // The online softmax's scalar side, head by head (ref::softmax_weights): each row's weight vs, the
    // accumulator's rescale ms, and their sum. Kept apart from the vector loop below because libm calls there
    // would spill every accumulator register around each call.
    float *w = scores;                                         // [kG][n_kv] s, then vs
    float *rescale = scores + static_cast<size_t>(kG) * n_kv;  // [kG][n_kv] ms
    float sum[kG];
    for (int g = 0; g < kG; ++g)
        sum[g] =
            ref::softmax_weights(w + static_cast<size_t>(g) * n_kv, n_kv, softcap,
                                 w + static_cast<size_t>(g) * n_kv, rescale + static_cast<size_t>(g) * n_kv);

    // acc = round_f16(acc * ms) when the max grew (ms == 1 leaves an f16-rounded accumulator as it is, so
    // skipping it changes no bit), then acc = round_f16(v_j * vs + acc); the heads' chains are independent.
    __m512 acc[kG][kD16];
    for (int g = 0; g < kG; ++g)
        for (int c = 0; c < kD16; ++c) acc[g][c] = _mm512_setzero_ps();
    for (int32_t j = 0; j < n_kv; ++j) {
        const uint16_t *vj = v + static_cast<size_t>(j) * kv_stride;
        __m512 vz[kD16];
        for (int c = 0; c < kD16; ++c) vz[c] = load_f16(vj + 16 * c);
        for (int g = 0; g < kG; ++g) {
            const float ms = rescale[static_cast<size_t>(g) * n_kv + j];
            if (ms != 1.0f) {
                const __m512 vms = _mm512_set1_ps(ms);
                for (int c = 0; c < kD16; ++c) acc[g][c] = round_f16(_mm512_mul_ps(acc[g][c], vms));
            }
            const __m512 vvs = _mm512_set1_ps(w[static_cast<size_t>(g) * n_kv + j]);
            for (int c = 0; c < kD16; ++c) acc[g][c] = round_f16(_mm512_fmadd_ps(vz[c], vvs, acc[g][c]));
        }
    }
    for (int g = 0; g < kG; ++g) {
        const __m512 inv = _mm512_set1_ps(sum[g] == 0.0f ? 0.0f : 1.0f / sum[g]);
        for (int c = 0; c < kD16; ++c) _mm512_storeu_ps(out + g * kD + 16 * c, _mm512_mul_ps(acc[g][c], inv));
    }
}

// Heads [0, n_q) in blocks of kG, the last block narrower.
template <int kD16, int kG>
void attention_blocks(const float *q, int32_t n_q, const uint16_t *k, const uint16_t *v, int64_t kv_stride,
                      int32_t n_kv, float scale, float softcap, float *scores, float *out) {
    constexpr int kD = kD16 * 16;
    int32_t g = 0;
    for (; g + kG <= n_q; g += kG)
        attention_f16<kD16, kG>(q + g * kD, k, v, kv_stride, n_kv, scale, softcap, scores, out + g * kD);
    if constexpr (kG > 1) {
        if (n_q - g > 0)
            attention_blocks<kD16, kG / 2>(q + g * kD, n_q - g, k, v, kv_stride, n_kv, scale, softcap, scores,
                                           out + g * kD);
    }
}

}  // namespace

bool attention_group_f16(const float *q, int32_t n_q, const void *k, const void *v, int64_t kv_stride,
                         int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores,
                         float *out) {
    const auto *kh = static_cast<const uint16_t *>(k);
    const auto *vh = static_cast<const uint16_t *>(v);
    switch (head_dim) {
        case 64:
            attention_blocks<4, 4>(q, n_q, kh, vh, kv_stride, n_kv, scale, softcap, scores, out);
            return true;
        case 128:
            attention_blocks<8, 2>(q, n_q, kh, vh, kv_stride, n_kv, scale, softcap, scores, out);
            return true;
        case 256:
            attention_blocks<16, 1>(q, n_q, kh, vh, kv_stride, n_kv, scale, softcap, scores, out);
            return true;
        default:
            return false;
    }
}

}  // namespace td::kernels::avx512
