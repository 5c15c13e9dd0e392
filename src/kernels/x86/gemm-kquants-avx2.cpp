// AVX2 matrix-matrix tiles for K-quant weights (q2_k .. q6_k) x q8_k activations, for CPUs without
// AVX-512 VNNI. Compiled with -mavx2 -mfma -mf16c; called only on CPUs that have them.
//
// The same panels as gemm-kquants-avx512vnni.cpp (gemm-kquants-panel.h) with 8 rows per ymm. maddubs gives
// each row's pair sums as int16; a few words are summed in int16 while that is exact (kWords16: q2_k and q3_k
// 4, a whole group, 2 * 7 * 128 * 4 = 7168; q4_k 8 words, 2 * 15 * 128 * 8 = 30720; q5_k 4,
// 2 * 31 * 128 * 4 = 31744; q6_k 2, 2 * 63 * 128 * 2 = 32256, all below 32767) and then madd by the group
// scale widens them to int32. The float part is the reference's expression per super-block, so every output
// equals vec_dot bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/x86/gemm-kquants-panel.h"
#include "kernels/x86/kquants-x86.h"

namespace td::kernels::avx2 {
namespace {

using kgemm::PanelBlock;

constexpr int kRows = 8;    // rows per panel: one ymm of int32
constexpr int kTokens = 4;  // tokens per tile

inline __m256i bcast_word(const void *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return _mm256_set1_epi32(v);
}

inline __m256i load_aligned(const void *p) {
    return _mm256_load_si256(static_cast<const __m256i *>(p));
}

template <int G, bool kMin, int kWords16>
struct Tiles {
    using Panel = PanelBlock<kRows, G>;
    static constexpr int kWords = kQK_K / 4 / G;  // 4-level words per scale group

    template <int NT>
    struct Tile {
        static void run(const Panel *panel, int64_t nb, const BlockQ8_K *const *xt, const int32_t *const *st,
                        float *y, int64_t y_stride, int nr) {
            alignas(32) float lanes[NT][kDotLanes]
                                   [kRows];  // [token][b % 8][row]; lane l is written first at b = l
            for (int64_t b = 0; b < nb; ++b) {
                const Panel &p = panel[b];
                const BlockQ8_K *xb[NT];
                for (int t = 0; t < NT; ++t) xb[t] = xt[t] + b;
                __m256i sumi[NT];
                for (int t = 0; t < NT; ++t) sumi[t] = _mm256_setzero_si256();
                for (int g = 0; g < G; ++g) {
                    // (scale, scale) as int16 pairs, so madd gives scale * (pair sum + pair sum).
                    const __m256i s = load_aligned(p.scale[g]);
                    const __m256i sc2 = _mm256_or_si256(_mm256_slli_epi32(s, 16),
                                                        _mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)));
                    for (int k0 = 0; k0 < kWords; k0 += kWords16) {
                        __m256i acc[NT];
                        for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_si256();
                        for (int k = k0; k < k0 + kWords16; ++k) {
                            const int v = g * kWords + k;
                            const __m256i wq = load_aligned(p.q[v]);
                            for (int t = 0; t < NT; ++t)
                                acc[t] = _mm256_add_epi16(
                                    acc[t], _mm256_maddubs_epi16(wq, bcast_word(xb[t]->qs + 4 * v)));
                        }
                        for (int t = 0; t < NT; ++t)
                            sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(acc[t], sc2));
                    }
                }
                const __m256 d = _mm256_load_ps(p.d);
                const __m256 dmin = _mm256_load_ps(p.dmin);
                for (int t = 0; t < NT; ++t) {
                    __m256i corr = _mm256_setzero_si256();
                    // G == 8: the sums over 32 elements; otherwise q8_k's bsums over 16.
                    const void *pairs = G == 8 ? static_cast<const void *>(st[t] + 4 * b) : xb[t]->bsums;
                    for (int i = 0; i < kgemm::kCorrPairs<G>; ++i)
                        corr = _mm256_add_epi32(
                            corr, _mm256_madd_epi16(load_aligned(p.corr[i]),
                                                    bcast_word(static_cast<const int32_t *>(pairs) + i)));
                    const __m256 yd = _mm256_set1_ps(xb[t]->d);
                    const __m256 dall = _mm256_mul_ps(d, yd);
                    __m256 f;
                    if constexpr (kMin) {
                        f = _mm256_sub_ps(_mm256_mul_ps(dall, _mm256_cvtepi32_ps(sumi[t])),
                                          _mm256_mul_ps(_mm256_mul_ps(dmin, yd), _mm256_cvtepi32_ps(corr)));
                    } else {
                        f = _mm256_mul_ps(dall, _mm256_cvtepi32_ps(_mm256_add_epi32(sumi[t], corr)));
                    }
                    float *lane = lanes[t][b % kDotLanes];
                    // The reference's lanes start at +0.0f: the first add makes a -0.0f product +0.0f.
                    _mm256_store_ps(
                        lane, _mm256_add_ps(b < kDotLanes ? _mm256_setzero_ps() : _mm256_load_ps(lane), f));
                }
            }
            for (int t = 0; t < NT; ++t) {
                __m256 l[kDotLanes];
                for (int k = 0; k < kDotLanes; ++k)
                    l[k] = k < nb ? _mm256_load_ps(lanes[t][k]) : _mm256_setzero_ps();
                const __m256 s = kgemm::lanes_tree(l, [](__m256 a, __m256 c) { return _mm256_add_ps(a, c); });
                if (nr == kRows) {
                    _mm256_storeu_ps(y + t * y_stride, s);
                } else {
                    alignas(32) float out[kRows];
                    _mm256_store_ps(out, s);
                    std::memcpy(y + t * y_stride, out, static_cast<size_t>(nr) * sizeof(float));
                }
            }
        }
    };

    static void tile(const Panel *panel, int64_t nb, const BlockQ8_K *const *xt, const int32_t *const *st,
                     int nt, float *y, int64_t y_stride, int nr) {
        kgemm::run_tile<Tile, kTokens>(nt, panel, nb, xt, st, y, y_stride, nr);
    }
};

template <int G, bool kMin, int kWords16, typename Unpack>
void gemm(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
          int64_t y_stride, int64_t n_rows, int64_t n_tokens, Unpack unpack) {
    kgemm::gemm_panels<kRows, G, kTokens>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, unpack,
                                          Tiles<G, kMin, kWords16>::tile);
}

}  // namespace

void gemm_q2_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, true, 4>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                      kgemm::unpack_q2_q3_k<kRows, false>);
}

void gemm_q3_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, false, 4>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                       kgemm::unpack_q2_q3_k<kRows, true>);
}

void gemm_q4_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<8, true, 8>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                     kgemm::unpack_q4_k_like<kRows, false>);
}

void gemm_q5_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<8, true, 4>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                     kgemm::unpack_q4_k_like<kRows, true>);
}

void gemm_q6_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, false, 2>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, kgemm::unpack_q6_k<kRows>);
}

}  // namespace td::kernels::avx2
