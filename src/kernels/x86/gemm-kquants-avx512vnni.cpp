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
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/pack.h"
#include "kernels/x86/gemm-kquants-panel.h"
#include "kernels/x86/kquants-x86.h"

// g++ 12 reports the undefined pass-through operands inside its AVX-512 intrinsics (_mm512_srli_epi32, ...)
// as (maybe) uninitialized once inlined into an unrolled loop (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

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

// Panels read straight from packed weights (kernels/pack.h): a panel of 16 rows is one packed group, whose
// super-block b already holds each 4-byte slice of the 16 rows side by side, so the panel's words are the
// slices' nibbles (crumbs) with no transposing. `rows[0]` is the group's first byte (gemm_panels passes row
// pointers; a packed group starts where its first row would).
inline __m512i load_512u(const uint8_t *p) {
    return _mm512_loadu_si512(p);
}

// q4_k and q5_k: [0, 32) d, [32, 64) dmin, [64, 256) the scale dwords w = 0..2, (q5_k) [256, 768) qh slices,
// then the qs slices (c, k). The slice decode repeats Q4_5_K::block's in gemm-packed-avx512vnni.cpp on
// purpose: one shared inline helper for both made one-token Q4_K_M generation up to 6% slower (measured in
// A/B pairs), so the one-token kernel keeps its own.
template <bool kFifth>
void unpack_q4_5_k_packed(const uint8_t *const *rows, int64_t b, PanelBlock<kRows, 8> &p) {
    using Block = std::conditional_t<kFifth, BlockQ5_K, BlockQ4_K>;
    const uint8_t *g = rows[0] + static_cast<size_t>(b) * kRows * sizeof(Block);
    const __m512i m4 = _mm512_set1_epi8(0x0F), low6 = _mm512_set1_epi8(0x3F), top2 = _mm512_set1_epi8(0x30);
    const __m512i byte0 = _mm512_set1_epi32(0xFF), bit4 = _mm512_set1_epi8(0x10);
    _mm512_store_ps(p.d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g))));
    _mm512_store_ps(p.dmin, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g + 32))));
    // get_scale_min_k4 lane-wise: bytes 0..3 of sc03 are sc[0..3], of sc47 sc[4..7]; likewise the mins.
    const __m512i u0 = load_512u(g + 64), u1 = load_512u(g + 128), u2 = load_512u(g + 192);
    const __m512i sc[2] = {
        _mm512_and_si512(u0, low6),
        _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), top2))};
    const __m512i mn[2] = {_mm512_and_si512(u1, low6),
                           _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi32(u1, 2), top2))};
    for (int j = 0; j < 8; ++j)
        _mm512_store_si512(p.scale[j], _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), byte0));
    // corr[i]: the int16 pair (m[2i], m[2i + 1]).
    const __m512i lo_word = _mm512_set1_epi32(0x000000FF), hi_word = _mm512_set1_epi32(0x00FF0000);
    for (int i = 0; i < 4; ++i) {
        const __m512i v = _mm512_srli_epi32(mn[i / 2], 16 * (i % 2));  // m[2i] in byte 0, m[2i + 1] in byte 1
        _mm512_store_si512(p.corr[i], _mm512_or_si512(_mm512_and_si512(v, lo_word),
                                                      _mm512_and_si512(_mm512_slli_epi32(v, 8), hi_word)));
    }
    constexpr size_t kQsAt = kFifth ? 256 + 8 * 64 : 256;
    for (int c = 0; c < 4; ++c) {
        for (int k = 0; k < 8; ++k) {
            const __m512i q = load_512u(g + kQsAt + 64 * (8 * c + k));
            __m512i lo = _mm512_and_si512(q, m4);                        // elements 64c + 4k ..
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);  // elements 64c + 32 + 4k ..
            if constexpr (kFifth) {
                const __m512i h = load_512u(g + 256 + 64 * k);
                auto to_bit4 = [&](int bit) {
                    return bit <= 4 ? _mm512_slli_epi16(h, 4 - bit) : _mm512_srli_epi16(h, bit - 4);
                };
                lo = _mm512_ternarylogic_epi32(lo, to_bit4(2 * c), bit4, 0xF8);  // lo | (h' & 0x10)
                hi = _mm512_ternarylogic_epi32(hi, to_bit4(2 * c + 1), bit4, 0xF8);
            }
            _mm512_store_si512(p.q[16 * c + k], lo);
            _mm512_store_si512(p.q[16 * c + 8 + k], hi);
        }
    }
}

// q6_k: [0, 32) d, [32, 288) the scale dwords w = 0..3, then for half h and slice k, 192 bytes: ql bytes
// 64h + 4k.., ql bytes 64h + 32 + 4k.., qh bytes 32h + 4k...
void unpack_q6_k_packed(const uint8_t *const *rows, int64_t b, PanelBlock<kRows, 16> &p) {
    const uint8_t *g = rows[0] + static_cast<size_t>(b) * kRows * sizeof(BlockQ6_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m3 = _mm512_set1_epi8(0x03);
    _mm512_store_ps(p.d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g))));
    _mm512_store_ps(p.dmin, _mm512_setzero_ps());
    __m512i s[16];  // the signed scale of group 4w + j, sign-extended
    for (int w = 0; w < 4; ++w) {
        const __m512i v = load_512u(g + 32 + 64 * w);
        for (int j = 0; j < 4; ++j) s[4 * w + j] = _mm512_srai_epi32(_mm512_slli_epi32(v, 24 - 8 * j), 24);
    }
    const __m512i lo_half = _mm512_set1_epi32(0xFFFF);
    for (int gi = 0; gi < 16; ++gi) _mm512_store_si512(p.scale[gi], s[gi]);
    // corr[i]: the int16 pair (-32 s[2i], -32 s[2i + 1]), the level offset.
    for (int i = 0; i < 8; ++i) {
        const __m512i a = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s[2 * i], 5));
        const __m512i c = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s[2 * i + 1], 5));
        _mm512_store_si512(p.corr[i],
                           _mm512_or_si512(_mm512_and_si512(a, lo_half), _mm512_slli_epi32(c, 16)));
    }
    for (int h = 0; h < 2; ++h) {
        for (int k = 0; k < 8; ++k) {
            const uint8_t *sl = g + 288 + 192 * (8 * h + k);
            const __m512i l0 = load_512u(sl), l1 = load_512u(sl + 64), qh = load_512u(sl + 128);
            const __m512i low[4] = {_mm512_and_si512(l0, m4), _mm512_and_si512(l1, m4),
                                    _mm512_and_si512(_mm512_srli_epi16(l0, 4), m4),
                                    _mm512_and_si512(_mm512_srli_epi16(l1, 4), m4)};
            for (int kk = 0; kk < 4; ++kk) {
                const __m512i high =
                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(qh, 2 * kk), m3), 4);
                _mm512_store_si512(p.q[32 * h + 8 * kk + k], _mm512_or_si512(low[kk], high));
            }
        }
    }
}

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

void gemm_q4_k_packed_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,
                           float *y, int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<8, true>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, unpack_q4_5_k_packed<false>);
}

void gemm_q5_k_packed_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,
                           float *y, int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<8, true>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, unpack_q4_5_k_packed<true>);
}

void gemm_q6_k_packed_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride,
                           float *y, int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<16, false>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, unpack_q6_k_packed);
}

}  // namespace td::kernels::avx512
