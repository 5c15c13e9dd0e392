// AVX-512 VNNI matrix-matrix tiles for K-quant weights (q2_k .. q6_k) x q8_k activations. Compiled with
// the AVX-512 F/BW/VL + VNNI flags; gemm_kquants_for() picks these only when cpuid reports avx512vnni.
//
// A panel of 16 weight rows is unpacked once (gemm-kquants-panel.h) so that one zmm holds 4 levels of each of
// the 16 rows; vpdpbusd against a broadcast 4-byte word of a token's q8_k row then advances 16 dot products
// at once, and 8 tokens share every weight load. Per super-block and token the integer sums are exact and
// equal the reference's; the float expression and its lane b % 8 are the reference's
// (ref/kquants-dot-ref.cpp) evaluated for 16 rows at once, so every output equals vec_dot bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/x86/gemm-kquants-panel.h"
#include "kernels/x86/kquants-x86.h"

namespace td::kernels::avx512 {
namespace {

using kgemm::PanelBlock;

constexpr int kRows = 16;   // rows per panel: one zmm of int32
constexpr int kTokens = 8;  // tokens per tile

// A 4-byte word of a q8_k row in every lane. Read through a may_alias type (the bytes are int8 / int16) as a
// plain dereference, so that the compiler folds it into vpdpbusd's embedded-broadcast memory operand.
using AliasedI32 = int32_t __attribute__((may_alias, aligned(1)));
inline __m512i bcast_word(const void *p) {
    return _mm512_set1_epi32(*static_cast<const AliasedI32 *>(p));
}

// int32 -> float, round to nearest like cvtdq2ps everywhere (the zero-masked form: the plain one trips g++
// 12's maybe-uninitialized warning on its undefined pass-through operand).
inline __m512 to_float(__m512i v) {
    return _mm512_maskz_cvtepi32_ps(static_cast<__mmask16>(0xFFFF), v);
}

inline __m512i load_512(const void *p) {
    return _mm512_load_si512(p);
}

// kMin: q2_k/q4_k/q5_k (float d * sumi - dmin * summ); otherwise q3_k/q6_k (d * sumi). G: scale groups per
// super-block (8 of 32 elements: q4_k, q5_k; 16 of 16: q2_k, q3_k, q6_k).
template <int G, bool kMin>
struct Tiles {
    using Panel = PanelBlock<kRows, G>;
    static constexpr int kWords = kQK_K / 4 / G;  // 4-level words per scale group

    template <int NT>
    struct Tile {
        static void run(const Panel *panel, int64_t nb, const BlockQ8_K *const *xt, const int32_t *const *st,
                        float *y, int64_t y_stride, int nr) {
            alignas(64) float lanes[NT][kDotLanes]
                                   [kRows];  // [token][b % 8][row]; lane l is written first at b = l
            for (int64_t b = 0; b < nb; ++b) {
                const Panel &p = panel[b];
                const BlockQ8_K *xb[NT];
                for (int t = 0; t < NT; ++t) xb[t] = xt[t] + b;
                __m512i sumi[NT];
                for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
                for (int g = 0; g < G; ++g) {
                    __m512i acc[NT];
                    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_si512();
                    for (int k = 0; k < kWords; ++k) {
                        const int v = g * kWords + k;
                        const __m512i wq = load_512(p.q[v]);
                        for (int t = 0; t < NT; ++t)
                            acc[t] = _mm512_dpbusd_epi32(acc[t], wq, bcast_word(xb[t]->qs + 4 * v));
                    }
                    const __m512i sc = load_512(p.scale[g]);
                    for (int t = 0; t < NT; ++t)
                        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(acc[t], sc));
                }
                const __m512 d = _mm512_load_ps(p.d);
                const __m512 dmin = _mm512_load_ps(p.dmin);
                for (int t = 0; t < NT; ++t) {
                    __m512i corr = _mm512_setzero_si512();
                    // G == 8: the sums over 32 elements; otherwise q8_k's bsums over 16.
                    const void *pairs = G == 8 ? static_cast<const void *>(st[t] + 4 * b) : xb[t]->bsums;
                    for (int i = 0; i < kgemm::kCorrPairs<G>; ++i)
                        corr = _mm512_dpwssd_epi32(corr, load_512(p.corr[i]),
                                                   bcast_word(static_cast<const int32_t *>(pairs) + i));
                    const __m512 yd = _mm512_set1_ps(xb[t]->d);
                    const __m512 dall = _mm512_mul_ps(d, yd);
                    __m512 f;
                    if constexpr (kMin) {
                        f = _mm512_sub_ps(_mm512_mul_ps(dall, to_float(sumi[t])),
                                          _mm512_mul_ps(_mm512_mul_ps(dmin, yd), to_float(corr)));
                    } else {
                        f = _mm512_mul_ps(dall, to_float(_mm512_add_epi32(sumi[t], corr)));
                    }
                    float *lane = lanes[t][b % kDotLanes];
                    // The reference's lanes start at +0.0f: the first add makes a -0.0f product +0.0f.
                    _mm512_store_ps(
                        lane, _mm512_add_ps(b < kDotLanes ? _mm512_setzero_ps() : _mm512_load_ps(lane), f));
                }
            }
            const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
            for (int t = 0; t < NT; ++t) {
                __m512 l[kDotLanes];
                for (int k = 0; k < kDotLanes; ++k)
                    l[k] = k < nb ? _mm512_load_ps(lanes[t][k]) : _mm512_setzero_ps();
                const __m512 s = kgemm::lanes_tree(l, [](__m512 a, __m512 c) { return _mm512_add_ps(a, c); });
                _mm512_mask_storeu_ps(y + t * y_stride, mask, s);
            }
        }
    };

    static void tile(const Panel *panel, int64_t nb, const BlockQ8_K *const *xt, const int32_t *const *st,
                     int nt, float *y, int64_t y_stride, int nr) {
        kgemm::run_tile<Tile, kTokens>(nt, panel, nb, xt, st, y, y_stride, nr);
    }
};

template <int G, bool kMin, typename Unpack>
void gemm(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
          int64_t y_stride, int64_t n_rows, int64_t n_tokens, Unpack unpack) {
    kgemm::gemm_panels<kRows, G, kTokens>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, unpack,
                                          Tiles<G, kMin>::tile);
}

}  // namespace

void gemm_q2_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, true>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                   kgemm::unpack_q2_q3_k<kRows, false>);
}

void gemm_q3_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, false>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                    kgemm::unpack_q2_q3_k<kRows, true>);
}

void gemm_q4_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<8, true>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                  kgemm::unpack_q4_k_like<kRows, false>);
}

void gemm_q5_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<8, true>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                  kgemm::unpack_q4_k_like<kRows, true>);
}

void gemm_q6_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, false>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, kgemm::unpack_q6_k<kRows>);
}

}  // namespace td::kernels::avx512
