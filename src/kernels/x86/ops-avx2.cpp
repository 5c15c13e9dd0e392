// AVX2 (+F16C) row ops. Compiled with -mavx2 -mfma -mf16c; called only on CPUs that have them (ops.cpp).
// Same linkage rule as vec-dot-avx2.cpp: no inline functions from shared headers; exp is libm's expf, the
// function the reference's std::exp(float) calls.
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include <cstdint>

#include "kernels/ref/ops-ref.h"
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

inline float fma1(float a, float b, float c) {
    return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), the reference's fold of eight lanes.
inline float hsum8(__m256 v) {
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

// Asks for the cache lines of [p, p + n).
inline void prefetch_bytes(const uint8_t *p, size_t n) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + n;
    for (uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63}; a < end; a += 64)
        _mm_prefetch(reinterpret_cast<const char *>(a), _MM_HINT_T0);
}

// q.k for an f16 cache in the reference's order (ref/ops-ref.cpp dot_f16_q): 64 lanes of fused
// multiply-adds as eight registers (acc[m] = lanes 8m..8m+7), the 16-lane fold, then the rest in double.
inline float dot_f16_q(const float *q, const uint16_t *k, int32_t n) {
    __m256 acc[8];
    for (__m256 &a : acc) a = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int m = 0; m < 8; ++m)
            acc[m] = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8 * m), load8(k, i + 8 * m, true), acc[m]);
    const __m256 lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    const __m256 hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    double sum = hsum8(_mm256_add_ps(lo, hi));
    for (; i < n; ++i) sum += static_cast<double>(q[i] * _cvtsh_ss(k[i]));
    return static_cast<float>(sum);
}

// 32 levels of a q8_0 or q4_0 K block (q4_0: its nibbles minus 8, low ones first) as int8.
inline __m256i k_levels(const uint8_t *block, bool q4) {
    if (!q4) return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(block + 2));
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(block + 2));
    const __m256i nibbles =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
    return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
}

// The scores q.k of 8 consecutive positions of a q8_0 or q4_0 K (row p at k0 + p * row_bytes) against the
// query in q8_0 (nb <= 8 blocks at qq), each the reference's vec_dot bit for bit: block b's integer sum, then
// 0 + (dk * dq) * sumi in lane b, folded as dot_lanes_sum folds. The 8 positions' sums come out of one
// transposing add instead of a horizontal sum each.
inline __m256 dot8_q8_0(const uint8_t *k0, size_t row_bytes, const uint8_t *qq, int nb, bool q4) {
    const size_t k_block = q4 ? 18 : 34, q_block = 34;
    __m256 a[8];
    for (__m256 &x : a) x = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
        const uint8_t *qb = qq + static_cast<size_t>(b) * q_block;
        const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(qb + 2));
        uint16_t dq;
        memcpy(&dq, qb, sizeof dq);
        alignas(16) uint16_t dk[8];
        __m256i part[8];
        for (int p = 0; p < 8; ++p) {
            const uint8_t *kb = k0 + static_cast<size_t>(p) * row_bytes + static_cast<size_t>(b) * k_block;
            memcpy(&dk[p], kb, sizeof dk[p]);
            const __m256i x = k_levels(kb, q4);
            // |x| * (y * sign(x)), exact: the query's levels are never -128 (from_float never writes it).
            part[p] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)),
                                        _mm256_set1_epi16(1));
        }
        const __m256i h0 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(part[0], part[1]), _mm256_hadd_epi32(part[2], part[3]));
        const __m256i h1 =
            _mm256_hadd_epi32(_mm256_hadd_epi32(part[4], part[5]), _mm256_hadd_epi32(part[6], part[7]));
        const __m256i sums = _mm256_add_epi32(_mm256_permute2x128_si256(h0, h1, 0x20),
                                              _mm256_permute2x128_si256(h0, h1, 0x31));  // [8] positions
        const __m256 scale =
            _mm256_mul_ps(_mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(dk))),
                          _mm256_set1_ps(_cvtsh_ss(dq)));
        a[b] = _mm256_add_ps(_mm256_setzero_ps(), _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sums)));
    }
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                         _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])));
}

// e^x on 8 lanes with the reference's arithmetic (ref/ops-ref.cpp expf_poly); lanes whose 2^n is not a
// normal float (|n| > 126, NaN) are finished one by one the way the reference does.
inline __m256 expf_poly8(__m256 x) {
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r), r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256i p2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    const __m256 res = _mm256_mul_ps(j, _mm256_castsi256_ps(p2));
    // Not (|n| <= 126): also true for NaN.
    const int special = _mm256_movemask_ps(_mm256_cmp_ps(abs_n, _mm256_set1_ps(126.0f), _CMP_NLE_UQ));
    if (special == 0) return res;
    alignas(32) float out[8], nv[8], jv[8];
    _mm256_store_ps(out, res);
    _mm256_store_ps(nv, n);
    _mm256_store_ps(jv, j);
    for (int l = 0; l < 8; ++l) {
        if (!(special >> l & 1)) continue;
        if (nv[l] != nv[l]) {
            out[l] = nv[l];
        } else if (nv[l] > 192.0f || nv[l] < -192.0f) {
            out[l] = nv[l] > 0.0f ? INFINITY : 0.0f;
        } else {
            out[l] = ldexpf(jv[l], static_cast<int>(nv[l]));
        }
    }
    return _mm256_load_ps(out);
}

}  // namespace

void attention_group(const float *q, int32_t n_q, const void *k, const void *v, bool kv_f16,
                     int64_t kv_stride, int32_t head_dim, int32_t n_kv, float scale, float softcap,
                     float *scores, float *out) {
    const DType type = kv_f16 ? DType::f16 : DType::f32;
    const size_t row_bytes = static_cast<size_t>(kv_stride) * (kv_f16 ? sizeof(uint16_t) : sizeof(float));
    attention_group_typed(q, n_q, {k, type, row_bytes}, {v, type, row_bytes}, ref::KvReaders{}, head_dim,
                          n_kv, scale, softcap, scores, out);
}

void attention_group_typed(const float *q, int32_t n_q, const KvRows &k, const KvRows &v,
                           const ref::KvReaders &rd, int32_t head_dim, int32_t n_kv, float scale,
                           float softcap, float *scores, float *out) {
    // The reference's flash-attention arithmetic (ref/ops-ref.cpp attention_head_typed), with the work moved
    // around: all scores first, then the softmax's scalar side (ref::softmax_weights), then the weighted sum
    // of V rows with the head dimension across lanes, kG heads interleaved (their update chains are
    // independent); a V row of a block type is dequantized once for all of them.
    constexpr int kG = 4;
    alignas(32) float qr[kG][1024];        // [head_dim] the queries at an f16 or f32 K's precision
    alignas(32) uint8_t qk[kG][4 * 1024];  // the queries in K's vec_dot_type (other K types)
    alignas(32) float acc[kG][1024];       // [head_dim] running weighted sums of V rows
    alignas(32) float vrow[1024];          // [head_dim] a dequantized V row
    const bool k_f16 = k.type == DType::f16, k_f32 = k.type == DType::f32;
    const bool v_f16 = v.type == DType::f16, v_f32 = v.type == DType::f32;
    const uint8_t *kb = static_cast<const uint8_t *>(k.data);
    const uint8_t *vb = static_cast<const uint8_t *>(v.data);
    const size_t k_head_bytes = dtype_row_bytes(k.type, head_dim),
                 v_head_bytes = dtype_row_bytes(v.type, head_dim);
    if (softcap != 0.0f) scale /= softcap;
    for (int32_t g0 = 0; g0 < n_q; g0 += kG) {
        const int n_g = n_q - g0 < kG ? n_q - g0 : kG;
        float *w = scores;                                          // [n_g][n_kv] scores, then weights
        float *rescale = scores + static_cast<size_t>(n_g) * n_kv;  // [n_g][n_kv]
        for (int g = 0; g < n_g; ++g) {
            const float *qg = q + static_cast<size_t>(g0 + g) * head_dim;
            for (int32_t d = 0; d < head_dim; ++d) qr[g][d] = k_f16 ? round_f16(qg[d]) : qg[d];
            if (!k_f16 && !k_f32) rd.q_to_k(qg, qk[g], head_dim);
            for (int32_t d = 0; d < head_dim; ++d) acc[g][d] = 0.0f;
        }

        // w[g][j] = (q_g.k_j) * scale. The rows are strided and usually out of cache (see ops-avx512.cpp):
        // while the first head reads them, K is asked for kAhead rows ahead, each V row with its K row.
        constexpr int32_t kAhead = 8;
        if (g0 == 0)
            for (int32_t j = 0; j < kAhead && j < n_kv; ++j)
                prefetch_bytes(kb + static_cast<size_t>(j) * k.row_bytes, k_head_bytes);
        // A q8_0 or q4_0 K of up to 8 blocks a head scores 8 positions at a time (dot8_q8_0).
        const bool k_q8 = (k.type == DType::q8_0 || k.type == DType::q4_0) && head_dim <= 256;
        for (int g = 0; g < n_g; ++g) {
            float *wg = w + static_cast<size_t>(g) * n_kv;
            int32_t j = 0;
            if (k_q8)
                for (; j + 8 <= n_kv; j += 8) {
                    if (g0 + g == 0)
                        for (int32_t p = j; p < j + 8; ++p) {
                            if (p + kAhead < n_kv)
                                prefetch_bytes(kb + static_cast<size_t>(p + kAhead) * k.row_bytes,
                                               k_head_bytes);
                            prefetch_bytes(vb + static_cast<size_t>(p) * v.row_bytes, v_head_bytes);
                        }
                    const __m256 dot = dot8_q8_0(kb + static_cast<size_t>(j) * k.row_bytes, k.row_bytes,
                                                 qk[g], head_dim / 32, k.type == DType::q4_0);
                    _mm256_storeu_ps(wg + j, _mm256_mul_ps(dot, _mm256_set1_ps(scale)));
                }
            for (; j < n_kv; ++j) {
                const void *kj = kb + static_cast<size_t>(j) * k.row_bytes;
                if (g0 + g == 0) {
                    if (j + kAhead < n_kv)
                        prefetch_bytes(kb + static_cast<size_t>(j + kAhead) * k.row_bytes, k_head_bytes);
                    prefetch_bytes(vb + static_cast<size_t>(j) * v.row_bytes, v_head_bytes);
                }
                float dot;
                if (k_f16) {
                    dot = dot_f16_q(qr[g], static_cast<const uint16_t *>(kj), head_dim);
                } else if (k_f32) {
                    vec_dot_f32_f32(head_dim, &dot, kj, qr[g]);
                } else {
                    rd.k_dot(head_dim, &dot, kj, qk[g]);
                }
                wg[j] = dot * scale;
            }
        }
        float sum[kG];
        for (int g = 0; g < n_g; ++g)
            sum[g] = ref::softmax_weights(w + static_cast<size_t>(g) * n_kv, n_kv, softcap,
                                          w + static_cast<size_t>(g) * n_kv,
                                          rescale + static_cast<size_t>(g) * n_kv);

        // acc = acc * ms (rounded to f16 with an f16 V) when the max grew; ms == 1 leaves the accumulator as
        // it is, so it is skipped. Then acc = v_j * vs + acc (rounded likewise).
        for (int32_t j = 0; j < n_kv; ++j) {
            const void *vj = vb + static_cast<size_t>(j) * v.row_bytes;
            if (!v_f16 && !v_f32) {
                rd.v_to_float(vj, vrow, head_dim);
                vj = vrow;
            }
            for (int g = 0; g < n_g; ++g) {
                float *ag = acc[g];
                const float ms = rescale[static_cast<size_t>(g) * n_kv + j];
                if (ms != 1.0f) {
                    const __m256 vms = _mm256_set1_ps(ms);
                    int32_t d = 0;
                    for (; d + 8 <= head_dim; d += 8) {
                        const __m256 a = _mm256_mul_ps(_mm256_load_ps(ag + d), vms);
                        _mm256_store_ps(ag + d, v_f16 ? round_f16(a) : a);
                    }
                    for (; d < head_dim; ++d) ag[d] = v_f16 ? round_f16(ag[d] * ms) : ag[d] * ms;
                }
                const float vs = w[static_cast<size_t>(g) * n_kv + j];
                const __m256 vvs = _mm256_set1_ps(vs);
                int32_t d = 0;
                for (; d + 8 <= head_dim; d += 8) {
                    const __m256 a = _mm256_fmadd_ps(load8(vj, d, v_f16), vvs, _mm256_load_ps(ag + d));
                    _mm256_store_ps(ag + d, v_f16 ? round_f16(a) : a);
                }
                for (; d < head_dim; ++d) {
                    const float a = fma1(load1(vj, d, v_f16), vs, ag[d]);
                    ag[d] = v_f16 ? round_f16(a) : a;
                }
            }
        }
        for (int g = 0; g < n_g; ++g) {
            const float inv = sum[g] == 0.0f ? 0.0f : 1.0f / sum[g];
            float *og = out + static_cast<size_t>(g0 + g) * head_dim;
            for (int32_t d = 0; d < head_dim; ++d) og[d] = acc[g][d] * inv;
        }
    }
}

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps) {
    // The squares eight at a time; their sum in double in the reference's order (one chain: the order decides
    // the rounding); then y = (x * scale) * w eight at a time.
    double ss = 0.0;
    int64_t i = 0;
    alignas(32) float sq[8];
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        _mm256_store_ps(sq, _mm256_mul_ps(v, v));
        for (int l = 0; l < 8; ++l) ss += static_cast<double>(sq[l]);
    }
    for (; i < n; ++i) ss += static_cast<double>(x[i] * x[i]);
    const float scale = 1.0f / sqrtf(static_cast<float>(ss / static_cast<double>(n)) + eps);
    const __m256 vs = _mm256_set1_ps(scale);
    i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs), _mm256_loadu_ps(w + i)));
    for (; i < n; ++i) y[i] = (x[i] * scale) * w[i];
}

void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p) {
    // The reference's angles (ref::rope_angles) and its rounding: a = fma(x0, c, -(x1 * s)),
    // b = fma(x0, s, x1 * c), eight lanes at a time.
    alignas(32) float cos_t[512], sin_t[512];
    const int32_t half = ref::rope_angles(pos, p, cos_t, sin_t);
    const bool adjacent = p.order == RopeOrder::adjacent;
    // Adjacent pairs: lanes (x0, x1) x 4 with cos/sin repeated per pair.
    alignas(32) float cos2[1024], sin2[1024];
    if (adjacent)
        for (int32_t i = 0; i < half; ++i) {
            cos2[2 * i] = cos2[2 * i + 1] = cos_t[i];
            sin2[2 * i] = sin2[2 * i + 1] = sin_t[i];
        }
    for (int32_t h = 0; h < n_head; ++h) {
        float *v = x + static_cast<int64_t>(h) * head_dim;
        int32_t i = 0;
        if (adjacent) {
            for (; i + 4 <= half; i += 4) {
                const __m256 xv = _mm256_loadu_ps(v + 2 * i);
                const __m256 sw = _mm256_permute_ps(xv, 0xB1);  // (x1, x0) per pair
                const __m256 c = _mm256_load_ps(cos2 + 2 * i), sn = _mm256_load_ps(sin2 + 2 * i);
                const __m256 even =
                    _mm256_fmadd_ps(xv, c, _mm256_xor_ps(_mm256_mul_ps(sw, sn), _mm256_set1_ps(-0.0f)));
                const __m256 odd = _mm256_fmadd_ps(sw, sn, _mm256_mul_ps(xv, c));
                _mm256_storeu_ps(v + 2 * i, _mm256_blend_ps(even, odd, 0xAA));
            }
        } else {
            for (; i + 8 <= half; i += 8) {
                const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                const __m256 c = _mm256_load_ps(cos_t + i), sn = _mm256_load_ps(sin_t + i);
                _mm256_storeu_ps(
                    v + i,
                    _mm256_fmadd_ps(x0, c, _mm256_xor_ps(_mm256_mul_ps(x1, sn), _mm256_set1_ps(-0.0f))));
                _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(x0, sn, _mm256_mul_ps(x1, c)));
            }
        }
        for (; i < half; ++i) {
            const int32_t a = adjacent ? 2 * i : i;
            const int32_t b = adjacent ? 2 * i + 1 : i + half;
            const float x0 = v[a], x1 = v[b];
            v[a] = fma1(x0, cos_t[i], -(x1 * sin_t[i]));
            v[b] = fma1(x0, sin_t[i], x1 * cos_t[i]);
        }
    }
}

void add_inplace(float *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] += x[i];
}

void store_row(const float *src, void *dst, bool to_f16, int64_t n) {
    if (!to_f16) {
        memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    }
    // F16C rounds to nearest even and keeps NaNs quiet with their top payload bits, as fp32_to_fp16().
    uint16_t *d = static_cast<uint16_t *>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i *>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) d[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT);
}

void swiglu(const float *gate, const float *up, float *out, int64_t n) {
    // The reference's order: the polynomial e^x for whole groups of 16, libm's expf for the last n % 16.
    const int64_t n_poly = n - n % 16;
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i < n_poly; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = expf_poly8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        _mm256_storeu_ps(out + i,
                         _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    for (; i < n; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

}  // namespace td::kernels::avx2
