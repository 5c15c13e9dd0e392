// AVX2 matrix-matrix tiles for q4_0 and q8_0 weights x q8_0 activations: a tile of up to 4 weight rows x 4
// tokens, so each weight block is unpacked once and used for every token of the tile. Compiled with -mavx2
// -mfma -mf16c; same linkage rule as vec-dot-avx2.cpp.
//
// Every output element follows vec_dot's canonical order exactly: block b's integer sum is exact (int32),
// is scaled by (dx_b * dy_b) in float and added into lane b % 8; the lanes are summed with dot_lanes_sum's
// tree. So a tile's result equals vec_dot bit for bit, and the batch a token came in does not matter.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/x86/kernels-x86.h"

namespace td::kernels::avx2 {
namespace {

constexpr int kTile = 4;  // rows and tokens per tile

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

// Eight blocks' 8-lane partial sums -> [S0 .. S7], the blocks' totals (exact int32 adds).
inline __m256i sum_blocks_i32x8(const __m256i s[8]) {
    const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    const __m256i lo = _mm256_permute2x128_si256(h0123, h4567, 0x20);
    const __m256i hi = _mm256_permute2x128_si256(h0123, h4567, 0x31);
    return _mm256_add_epi32(lo, hi);
}

// u8 x s8 -> 8 int32 partial sums (exact while |u| * 2 * 127 < 32768, i.e. u <= 128).
inline __m256i madd_u8_i8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

inline __m256i load_i8x32(const int8_t *p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
}

// The scales of blocks [b, b + 8) of a row, as floats.
template <typename B>
inline __m256 scales8(const B *blocks) {
    alignas(16) uint16_t d[8];
    for (int k = 0; k < 8; ++k) d[k] = blocks[k].d;
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(d)));
}

// q4_0 nibbles 0..15 in element order (the -8 offset is applied through the activations' block sums).
inline __m256i nibbles_q4_0(const uint8_t *qs) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i *>(qs));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0F));
}

// One weight type's block arithmetic. prepare() turns 8 weight blocks into what dot8() reads (in a small
// per-row buffer); dot8() gives the 8 exact block sums of a prepared row against 8 activation blocks.
struct Q4_0 {
    using Block = BlockQ4_0;
    struct Prepared {
        __m256i u[8];  // nibbles
    };
    static void prepare(const Block *w, Prepared &p) {
        for (int k = 0; k < 8; ++k) p.u[k] = nibbles_q4_0(w[k].qs);
    }
    // Per token: 8 * sum_j y_j of each block, subtracted from sum_j q_j y_j to give sum_j (q_j - 8) y_j.
    struct TokenExtra {
        __m256i sum8;
    };
    static TokenExtra token_extra(const __m256i y[8]) {
        __m256i s[8];
        for (int k = 0; k < 8; ++k) s[k] = madd_u8_i8(_mm256_set1_epi8(1), y[k]);
        return {_mm256_slli_epi32(sum_blocks_i32x8(s), 3)};
    }
    static __m256i dot8(const Prepared &p, const Block *, const __m256i y[8], const TokenExtra &e) {
        __m256i s[8];
        for (int k = 0; k < 8; ++k) s[k] = madd_u8_i8(p.u[k], y[k]);
        return _mm256_sub_epi32(sum_blocks_i32x8(s), e.sum8);
    }
    static int32_t dot1(const Block &w, const BlockQ8_0 &y) {
        const __m256i q = _mm256_sub_epi8(nibbles_q4_0(w.qs), _mm256_set1_epi8(8));
        const __m256i yv = load_i8x32(y.qs);
        return hsum_i32x8(madd_u8_i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(yv, q)));
    }
};

struct Q8_0 {
    using Block = BlockQ8_0;
    struct Prepared {
        __m256i a[8];  // |x| (as u8: |-128| reads as 128)
    };
    static void prepare(const Block *w, Prepared &p) {
        for (int k = 0; k < 8; ++k) {
            const __m256i x = load_i8x32(w[k].qs);
            p.a[k] = _mm256_sign_epi8(x, x);
        }
    }
    struct TokenExtra {};
    static TokenExtra token_extra(const __m256i *) { return {}; }
    // |x| * (y * sign(x)): y is never -128 (from_float), so the sign flip cannot overflow.
    static __m256i dot8(const Prepared &p, const Block *w, const __m256i y[8], const TokenExtra &) {
        __m256i s[8];
        for (int k = 0; k < 8; ++k) s[k] = madd_u8_i8(p.a[k], _mm256_sign_epi8(y[k], load_i8x32(w[k].qs)));
        return sum_blocks_i32x8(s);
    }
    static int32_t dot1(const Block &w, const BlockQ8_0 &y) {
        const __m256i x = load_i8x32(w.qs);
        return hsum_i32x8(madd_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(load_i8x32(y.qs), x)));
    }
};

template <typename T, int NR, int NT>
void tile(int64_t nb, const uint8_t *w, size_t w_stride, const uint8_t *x, size_t x_stride, float *y,
          int64_t y_stride) {
    using Block = typename T::Block;
    const Block *wr[NR];      // [NR] rows of nb blocks
    const BlockQ8_0 *xt[NT];  // [NT] rows of nb blocks
    for (int r = 0; r < NR; ++r)
        wr[r] = reinterpret_cast<const Block *>(w + static_cast<size_t>(r) * w_stride);
    for (int t = 0; t < NT; ++t)
        xt[t] = reinterpret_cast<const BlockQ8_0 *>(x + static_cast<size_t>(t) * x_stride);

    __m256 acc[NR][NT];  // lane k: blocks b with b % 8 == k
    for (int r = 0; r < NR; ++r)
        for (int t = 0; t < NT; ++t) acc[r][t] = _mm256_setzero_ps();

    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        typename T::Prepared prep[NR];
        __m256 dw[NR];
        for (int r = 0; r < NR; ++r) {
            T::prepare(wr[r] + b, prep[r]);
            dw[r] = scales8(wr[r] + b);
        }
        for (int t = 0; t < NT; ++t) {
            __m256i yv[8];
            for (int k = 0; k < 8; ++k) yv[k] = load_i8x32(xt[t][b + k].qs);
            const auto extra = T::token_extra(yv);
            const __m256 dy = scales8(xt[t] + b);
            for (int r = 0; r < NR; ++r) {
                const __m256 sumf = _mm256_cvtepi32_ps(T::dot8(prep[r], wr[r] + b, yv, extra));
                acc[r][t] = _mm256_add_ps(acc[r][t], _mm256_mul_ps(_mm256_mul_ps(dw[r], dy), sumf));
            }
        }
    }
    for (int r = 0; r < NR; ++r) {
        for (int t = 0; t < NT; ++t) {
            alignas(32) float lanes[kDotLanes];
            _mm256_store_ps(lanes, acc[r][t]);
            for (int64_t bt = b; bt < nb; ++bt) {
                const float sumi = static_cast<float>(T::dot1(wr[r][bt], xt[t][bt]));
                lanes[bt % kDotLanes] += _cvtsh_ss(wr[r][bt].d) * _cvtsh_ss(xt[t][bt].d) * sumi;
            }
            y[t * y_stride + r] = dot_lanes_sum(lanes);
        }
    }
}

template <typename T, int NR>
void tile_rows(int nt, int64_t nb, const uint8_t *w, size_t ws, const uint8_t *x, size_t xs, float *y,
               int64_t ys) {
    switch (nt) {
        case 1:
            return tile<T, NR, 1>(nb, w, ws, x, xs, y, ys);
        case 2:
            return tile<T, NR, 2>(nb, w, ws, x, xs, y, ys);
        case 3:
            return tile<T, NR, 3>(nb, w, ws, x, xs, y, ys);
        default:
            return tile<T, NR, 4>(nb, w, ws, x, xs, y, ys);
    }
}

template <typename T>
void gemm(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
          int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const uint8_t *xb = static_cast<const uint8_t *>(x);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTile) {
        const int nt = static_cast<int>(n_tokens - t0 < kTile ? n_tokens - t0 : kTile);
        const uint8_t *xt = xb + static_cast<size_t>(t0) * x_stride;
        float *yt = y + t0 * y_stride;
        for (int64_t r0 = 0; r0 < n_rows; r0 += kTile) {
            const int nr = static_cast<int>(n_rows - r0 < kTile ? n_rows - r0 : kTile);
            const uint8_t *wt = wb + static_cast<size_t>(r0) * w_stride;
            switch (nr) {
                case 1:
                    tile_rows<T, 1>(nt, nb, wt, w_stride, xt, x_stride, yt + r0, y_stride);
                    break;
                case 2:
                    tile_rows<T, 2>(nt, nb, wt, w_stride, xt, x_stride, yt + r0, y_stride);
                    break;
                case 3:
                    tile_rows<T, 3>(nt, nb, wt, w_stride, xt, x_stride, yt + r0, y_stride);
                    break;
                default:
                    tile_rows<T, 4>(nt, nb, wt, w_stride, xt, x_stride, yt + r0, y_stride);
                    break;
            }
        }
    }
}

}  // namespace

void gemm_q4_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<Q4_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

void gemm_q8_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemm<Q8_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

}  // namespace td::kernels::avx2
