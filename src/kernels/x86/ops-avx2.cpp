// AVX2 (+F16C) row ops. Compiled with -mavx2 -mfma -mf16c; called only on CPUs that have them (ops.cpp).
// Same linkage rule as vec-dot-avx2.cpp: no inline functions from shared headers; exp is libm's expf, the
// function the reference's std::exp(float) calls.
#include <immintrin.h>
#include <math.h>

#include <cstdint>

#include "kernels/x86/kernels-x86.h"

namespace td::kernels::avx2 {
namespace {

// f32 -> f16 -> f32 for 8 lanes: round to nearest even, as fp32_to_fp16().
inline __m256 round_f16(__m256 v) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

inline float round_f16(float v) {
    return _cvtsh_ss(_cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT));
}

// Loads 8 elements of a K/V row as floats.
inline __m256 load8(const void *row, int32_t d, bool f16) {
    if (f16)
        return _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(row) + d)));
    return _mm256_loadu_ps(static_cast<const float *>(row) + d);
}

inline float load1(const void *row, int32_t d, bool f16) {
    return f16 ? _cvtsh_ss(static_cast<const uint16_t *>(row)[d]) : static_cast<const float *>(row)[d];
}

// dots[j] = sum_d double(qr[d] * k_j[d]) for 4 keys, each summed in d order like the reference: the keys go
// across the double lanes, so every key's sum sees the same additions in the same order.
inline void dot4(const float *qr, const void *const k[4], bool f16, int32_t head_dim, double *dots) {
    __m256d acc = _mm256_setzero_pd();
    int32_t d = 0;
    for (; d + 8 <= head_dim; d += 8) {
        __m256 r0 = load8(k[0], d, f16), r1 = load8(k[1], d, f16);
        __m256 r2 = load8(k[2], d, f16), r3 = load8(k[3], d, f16);
        // 4x8 -> 8 columns of 4 keys: two 4x4 transposes (one per 128-bit half).
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 c0 = _mm256_shuffle_ps(t0, t2, 0x44), c1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 c2 = _mm256_shuffle_ps(t1, t3, 0x44), c3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 cols[4] = {c0, c1, c2, c3};  // cols[i] half h = dim d + 4h + i across keys 0..3
        for (int h = 0; h < 2; ++h) {
            for (int i = 0; i < 4; ++i) {
                const __m128 col =
                    h == 0 ? _mm256_castps256_ps128(cols[i]) : _mm256_extractf128_ps(cols[i], 1);
                const __m128 prod = _mm_mul_ps(_mm_set1_ps(qr[d + 4 * h + i]), col);
                acc = _mm256_add_pd(acc, _mm256_cvtps_pd(prod));
            }
        }
    }
    for (; d < head_dim; ++d) {
        const __m128 col =
            _mm_setr_ps(load1(k[0], d, f16), load1(k[1], d, f16), load1(k[2], d, f16), load1(k[3], d, f16));
        acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm_mul_ps(_mm_set1_ps(qr[d]), col)));
    }
    _mm256_storeu_pd(dots, acc);
}

}  // namespace

void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float *scores, float *out) {
    // The reference's flash-attention order (ref/ops-ref.cpp), with the work moved around: all scores first
    // (keys across SIMD lanes), then the online softmax over keys with the head dimension across lanes.
    float qr[1024];   // [head_dim] the query at the cache's precision
    float acc[1024];  // [head_dim] running weighted sum of V rows
    const size_t elt = kv_f16 ? sizeof(uint16_t) : sizeof(float);
    const uint8_t *kb = static_cast<const uint8_t *>(k);
    const uint8_t *vb = static_cast<const uint8_t *>(v);
    const size_t row_bytes = static_cast<size_t>(kv_stride) * elt;
    for (int32_t d = 0; d < head_dim; ++d) qr[d] = kv_f16 ? round_f16(q[d]) : q[d];
    for (int32_t d = 0; d < head_dim; ++d) acc[d] = 0.0f;

    // scores[j] = float(sum_d qr[d] k_j[d]) * scale
    int32_t j = 0;
    for (; j < n_kv; j += 4) {
        const void *rows[4];
        for (int i = 0; i < 4; ++i)
            rows[i] = kb + static_cast<size_t>(j + (j + i < n_kv ? i : 0)) * row_bytes;
        double dots[4];
        dot4(qr, rows, kv_f16, head_dim, dots);
        for (int i = 0; i < 4 && j + i < n_kv; ++i) scores[j + i] = static_cast<float>(dots[i]) * scale;
    }

    float m = -INFINITY, sum = 0.0f;
    for (j = 0; j < n_kv; ++j) {
        const float s = scores[j];
        float ms = 1.0f;  // rescales the accumulator when the max grows
        float vs = 1.0f;  // weight of this row: e^(s - M)
        if (s > m) {
            ms = expf(m - s);
            m = s;
            const __m256 vms = _mm256_set1_ps(ms);
            int32_t d = 0;
            for (; d + 8 <= head_dim; d += 8) {
                __m256 a = _mm256_mul_ps(_mm256_loadu_ps(acc + d), vms);
                _mm256_storeu_ps(acc + d, kv_f16 ? round_f16(a) : a);
            }
            for (; d < head_dim; ++d) acc[d] = kv_f16 ? round_f16(acc[d] * ms) : acc[d] * ms;
        } else {
            vs = expf(s - m);
        }
        const void *vj = vb + static_cast<size_t>(j) * row_bytes;
        const __m256 vvs = _mm256_set1_ps(vs);
        int32_t d = 0;
        for (; d + 8 <= head_dim; d += 8) {
            const __m256 a =
                _mm256_add_ps(_mm256_loadu_ps(acc + d), _mm256_mul_ps(load8(vj, d, kv_f16), vvs));
            _mm256_storeu_ps(acc + d, kv_f16 ? round_f16(a) : a);
        }
        for (; d < head_dim; ++d) {
            const float a = acc[d] + load1(vj, d, kv_f16) * vs;
            acc[d] = kv_f16 ? round_f16(a) : a;
        }
        sum = sum * ms + vs;
    }
    for (int32_t d = 0; d < head_dim; ++d) out[d] = sum > 0.0f ? acc[d] / sum : 0.0f;
}

}  // namespace td::kernels::avx2
