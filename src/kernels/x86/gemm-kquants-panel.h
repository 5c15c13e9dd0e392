// Internal to the K-quant tile kernels (gemm-kquants-avx2.cpp, gemm-kquants-avx512vnni.cpp): a panel of NR
// weight rows unpacked, one super-block at a time, into the layout a row-interleaved dot product wants.
// Only included by files compiled with at least -mavx2 -mf16c; everything here has internal linkage (see
// blocks.h for why).
//
// Layout of one super-block of the panel (PanelBlock): q[v][r] holds the 4 unsigned levels of elements
// 4v .. 4v + 3 of row r (one byte each: q2_k 0..3, q3_k 0..7, q4_k 0..15, q5_k 0..31, q6_k 0..63), so a
// vector of NR such 32-bit words times one broadcast 32-bit word of a q8_k row gives NR partial dot products
// at once. The integer sum of a super-block is then
//     sumi = sum_g scale[g] * (sum over the words v of group g of q . y)  +  corr . bsums
// where a group is 32 elements (q4_k, q5_k: corr holds the mins, paired with the token's sums over 32
// elements, counted separately as summ) or 16, paired with q8_k's bsums (q2_k: corr holds the mins, counted
// separately as summ; q3_k, q6_k: the level offset times the scale, folded into sumi). These are exact int32
// sums equal to the reference's (ref/kquants-dot-ref.cpp), so the float expression applied to them gives
// the same bits.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/blocks.h"

namespace td::kernels::kgemm {
namespace {

// Token sums the corr pairs meet: G = 8 (q4_k, q5_k): the 8 sums over 32 elements (TokenSums32), 4 pairs;
// G = 16 (q2_k, q3_k, q6_k): q8_k's 16 bsums, 8 pairs.
template <int G>
constexpr int kCorrPairs = G == 8 ? 4 : 8;

// NR rows (a multiple of 8), G scale groups per super-block (8 or 16).
template <int NR, int G>
struct alignas(64) PanelBlock {
    uint32_t q[kQK_K / 4][NR];        // 4 levels of elements 4v .. 4v + 3, per row
    int32_t scale[G][NR];             // group scale (q2_k 0..15, q3_k -32..31, q4_k/q5_k 0..63, q6_k signed)
    int32_t corr[kCorrPairs<G>][NR];  // int16 pairs: coefficients of the token's sums 2i, 2i + 1
    float d[NR];                      // super-block scale
    float dmin[NR];                   // q2_k/q4_k/q5_k: scale of the mins; unused for q3_k, q6_k
};

inline __m256i load_256(const void *p) {
    return _mm256_loadu_si256(static_cast<const __m256i *>(p));
}

// rows[r] holds dwords 0..7 of row r; afterwards rows[k] holds dword k of rows 0..7 (lane r).
inline void transpose_8x8_i32(__m256i rows[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);      // d0 d0 d1 d1 | d4 d4 d5 d5
        t[2 * i + 1] = _mm256_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);  // d2 d2 d3 d3 | d6 d6 d7 d7
    }
    for (int h = 0; h < 2; ++h) {  // rows 0..3, rows 4..7
        const __m256i *s = t + 4 * h;
        u[4 * h + 0] = _mm256_unpacklo_epi64(s[0], s[2]);  // d0 x4 | d4 x4
        u[4 * h + 1] = _mm256_unpackhi_epi64(s[0], s[2]);  // d1 | d5
        u[4 * h + 2] = _mm256_unpacklo_epi64(s[1], s[3]);  // d2 | d6
        u[4 * h + 3] = _mm256_unpackhi_epi64(s[1], s[3]);  // d3 | d7
    }
    for (int k = 0; k < 4; ++k) {
        rows[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
        rows[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
}

// 32 bytes at byte offset `off` of each of 8 rows, transposed: out[k] lane r = bytes 4k .. 4k + 3 of row r.
inline void load_transposed(const uint8_t *const rows[8], size_t off, __m256i out[8]) {
    for (int r = 0; r < 8; ++r) out[r] = load_256(rows[r] + off);
    transpose_8x8_i32(out);
}

inline void store_256(uint32_t *p, __m256i v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), v);
}

inline float half_to_float(uint16_t h) {
    return _cvtsh_ss(h);
}

inline int32_t pair_i16(int lo, int hi) {
    return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// Super-block b of rows[0 .. NR) (rows is NR pointers to row starts; pad with repeats of a valid row).
template <int NR, bool kHigh>  // kHigh: q5_k (a fifth bit from qh) rather than q4_k
void unpack_q4_k_like(const uint8_t *const *rows, int64_t b, PanelBlock<NR, 8> &p) {
    using Block = std::conditional_t<kHigh, BlockQ5_K, BlockQ4_K>;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m1 = _mm256_set1_epi8(0x01);
    for (int r0 = 0; r0 < NR; r0 += 8) {
        const uint8_t *blk[8];
        for (int r = 0; r < 8; ++r) blk[r] = rows[r0 + r] + static_cast<size_t>(b) * sizeof(Block);
        __m256i hb[8];
        if constexpr (kHigh) load_transposed(blk, offsetof(Block, qh), hb);
        for (int c = 0; c < 4; ++c) {  // elements 64c .. 64c + 63: sub-blocks 2c (low nibbles), 2c + 1
            __m256i raw[8];
            load_transposed(blk, offsetof(Block, qs) + 32 * c, raw);
            for (int k = 0; k < 8; ++k) {
                __m256i lo = _mm256_and_si256(raw[k], m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw[k], 4), m4);
                if constexpr (kHigh) {
                    lo = _mm256_or_si256(
                        lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb[k], 2 * c), m1), 4));
                    hi = _mm256_or_si256(
                        hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb[k], 2 * c + 1), m1), 4));
                }
                store_256(&p.q[16 * c + k][r0], lo);
                store_256(&p.q[16 * c + 8 + k][r0], hi);
            }
        }
    }
    for (int r = 0; r < NR; ++r) {
        const Block &x = *reinterpret_cast<const Block *>(rows[r] + static_cast<size_t>(b) * sizeof(Block));
        uint64_t sc8, mn8;
        q4_k_scales(x.scales, &sc8, &mn8);
        auto byte = [](uint64_t v, int j) { return static_cast<int>((v >> (8 * j)) & 0xFF); };
        for (int j = 0; j < 8; ++j) p.scale[j][r] = byte(sc8, j);
        // summ = sum_j m_j (bsums[2j] + bsums[2j + 1])
        for (int i = 0; i < 4; ++i) p.corr[i][r] = pair_i16(byte(mn8, 2 * i), byte(mn8, 2 * i + 1));
        p.d[r] = half_to_float(x.d);
        p.dmin[r] = half_to_float(x.dmin);
    }
}

template <int NR>
void unpack_q6_k(const uint8_t *const *rows, int64_t b, PanelBlock<NR, 16> &p) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i m3 = _mm256_set1_epi8(0x03);
    for (int r0 = 0; r0 < NR; r0 += 8) {
        const uint8_t *blk[8];
        for (int r = 0; r < 8; ++r) blk[r] = rows[r0 + r] + static_cast<size_t>(b) * sizeof(BlockQ6_K);
        for (int c = 0; c < 2; ++c) {  // elements 128c + 32k + l
            __m256i l0[8], l1[8], h[8];
            load_transposed(blk, offsetof(BlockQ6_K, ql) + 64 * c, l0);
            load_transposed(blk, offsetof(BlockQ6_K, ql) + 64 * c + 32, l1);
            load_transposed(blk, offsetof(BlockQ6_K, qh) + 32 * c, h);
            for (int m = 0; m < 8; ++m) {
                const __m256i low[4] = {_mm256_and_si256(l0[m], m4), _mm256_and_si256(l1[m], m4),
                                        _mm256_and_si256(_mm256_srli_epi16(l0[m], 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(l1[m], 4), m4)};
                for (int k = 0; k < 4; ++k) {
                    const __m256i high =
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h[m], 2 * k), m3), 4);
                    store_256(&p.q[32 * c + 8 * k + m][r0], _mm256_or_si256(low[k], high));
                }
            }
        }
    }
    for (int r = 0; r < NR; ++r) {
        const BlockQ6_K &x =
            *reinterpret_cast<const BlockQ6_K *>(rows[r] + static_cast<size_t>(b) * sizeof(BlockQ6_K));
        for (int g = 0; g < 16; ++g) p.scale[g][r] = x.scales[g];
        // The levels are stored unsigned (q + 32): take 32 * scale * bsum back out per group of 16.
        for (int i = 0; i < 8; ++i) p.corr[i][r] = pair_i16(-32 * x.scales[2 * i], -32 * x.scales[2 * i + 1]);
        p.d[r] = half_to_float(x.d);
        p.dmin[r] = 0.0f;
    }
}

// q2_k (kQ3 false) and q3_k: crumb k of qs[32c + l] is element 128c + 32k + l, as q6_k's layout; q3_k adds 4
// where bit 4c + k of hmask[l] is set. Groups of 16: q2_k's scale and min are the nibbles of scales[g] (corr
// holds the mins, paired with bsums); q3_k's scale is s - 32 and corr -4 (s - 32), the level offset.
template <int NR, bool kQ3>
void unpack_q2_q3_k(const uint8_t *const *rows, int64_t b, PanelBlock<NR, 16> &p) {
    using Block = std::conditional_t<kQ3, BlockQ3_K, BlockQ2_K>;
    const __m256i m3 = _mm256_set1_epi8(0x03);
    const __m256i m1 = _mm256_set1_epi8(0x01);
    for (int r0 = 0; r0 < NR; r0 += 8) {
        const uint8_t *blk[8];
        for (int r = 0; r < 8; ++r) blk[r] = rows[r0 + r] + static_cast<size_t>(b) * sizeof(Block);
        __m256i hb[8];
        if constexpr (kQ3) load_transposed(blk, offsetof(Block, hmask), hb);
        for (int c = 0; c < 2; ++c) {
            __m256i raw[8];
            load_transposed(blk, offsetof(Block, qs) + 32 * c, raw);
            for (int m = 0; m < 8; ++m) {
                for (int k = 0; k < 4; ++k) {
                    __m256i q = _mm256_and_si256(_mm256_srli_epi16(raw[m], 2 * k), m3);
                    if constexpr (kQ3)
                        q = _mm256_or_si256(
                            q,
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb[m], 4 * c + k), m1), 2));
                    store_256(&p.q[32 * c + 8 * k + m][r0], q);
                }
            }
        }
    }
    for (int r = 0; r < NR; ++r) {
        const Block &x = *reinterpret_cast<const Block *>(rows[r] + static_cast<size_t>(b) * sizeof(Block));
        int sc[16], corr[16];
        if constexpr (kQ3) {
            uint64_t lo8, hi8;
            q3_k_scales(x.scales, &lo8, &hi8);
            for (int g = 0; g < 16; ++g) {
                sc[g] = static_cast<int>(((g < 8 ? lo8 : hi8) >> (8 * (g % 8))) & 0xFF) - 32;
                corr[g] = -4 * sc[g];
            }
            p.dmin[r] = 0.0f;
        } else {
            for (int g = 0; g < 16; ++g) {
                sc[g] = x.scales[g] & 0x0F;
                corr[g] = x.scales[g] >> 4;
            }
            p.dmin[r] = half_to_float(x.dmin);
        }
        for (int g = 0; g < 16; ++g) p.scale[g][r] = sc[g];
        for (int i = 0; i < 8; ++i) p.corr[i][r] = pair_i16(corr[2 * i], corr[2 * i + 1]);
        p.d[r] = half_to_float(x.d);
    }
}

// The final lane sum of dot_lanes_sum(), element-wise over vectors: lanes[l] is lane l of every output.
template <typename V, typename Add>
V lanes_tree(const V lanes[8], Add add) {
    return add(add(add(lanes[0], lanes[4]), add(lanes[2], lanes[6])),
               add(add(lanes[1], lanes[5]), add(lanes[3], lanes[7])));
}

// Per token and super-block, q8_k's bsums added in pairs (the sums over elements 32j .. 32j + 31, |s| <=
// 4096) as int16 pairs: word i holds sums 2i (low half) and 2i + 1. [n_tokens][nb][4]
inline void token_sums32(const uint8_t *x, size_t x_stride, int64_t n_tokens, int64_t nb, int32_t *out) {
    for (int64_t t = 0; t < n_tokens; ++t) {
        const BlockQ8_K *xt = reinterpret_cast<const BlockQ8_K *>(x + static_cast<size_t>(t) * x_stride);
        for (int64_t b = 0; b < nb; ++b) {
            int32_t *o = out + (t * nb + b) * 4;
            for (int i = 0; i < 4; ++i) {
                const int16_t *bs = xt[b].bsums + 4 * i;
                o[i] = pair_i16(bs[0] + bs[1], bs[2] + bs[3]);
            }
        }
    }
}

// y[t * y_stride + r] for the whole matrix: each panel of NR rows is unpacked once (all its super-blocks,
// into a per-thread buffer) and then every token meets it, kNtMax tokens per tile.
//   unpack(rows, b, PanelBlock &): super-block b of the NR rows.
//   tile(panel, nb, xt, st, nt, y, y_stride, nr): nt <= kNtMax tokens (xt: their q8_k rows; st: for G == 8
//   their token_sums32 rows, else null) x the panel's first nr rows.
template <int NR, int G, int kNtMax, typename Unpack, typename Tile>
void gemm_panels(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                 int64_t y_stride, int64_t n_rows, int64_t n_tokens, Unpack unpack, Tile tile) {
    const int64_t nb = n / kQK_K;
    thread_local std::vector<PanelBlock<NR, G>> panel;  // [nb], grows to the widest row seen
    if (static_cast<int64_t>(panel.size()) < nb) panel.resize(static_cast<size_t>(nb));
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const uint8_t *xb = static_cast<const uint8_t *>(x);
    thread_local std::vector<int32_t> sums;  // G == 8: [n_tokens][nb][4], token_sums32
    if constexpr (G == 8) {
        const size_t need = static_cast<size_t>(n_tokens * nb * 4);
        if (sums.size() < need) sums.resize(need);
        token_sums32(xb, x_stride, n_tokens, nb, sums.data());
    }
    for (int64_t r0 = 0; r0 < n_rows; r0 += NR) {
        const int nr = static_cast<int>(n_rows - r0 < NR ? n_rows - r0 : NR);
        const uint8_t *rows[NR];
        for (int r = 0; r < NR; ++r) rows[r] = wb + static_cast<size_t>(r0 + (r < nr ? r : 0)) * w_stride;
        for (int64_t b = 0; b < nb; ++b) unpack(rows, b, panel[static_cast<size_t>(b)]);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kNtMax) {
            const int nt = static_cast<int>(n_tokens - t0 < kNtMax ? n_tokens - t0 : kNtMax);
            const BlockQ8_K *xt[kNtMax];
            const int32_t *st[kNtMax] = {};
            for (int t = 0; t < nt; ++t) {
                xt[t] = reinterpret_cast<const BlockQ8_K *>(xb + static_cast<size_t>(t0 + t) * x_stride);
                if constexpr (G == 8) st[t] = sums.data() + (t0 + t) * nb * 4;
            }
            tile(panel.data(), nb, xt, st, nt, y + t0 * y_stride + r0, y_stride, nr);
        }
    }
}

// Calls Tile<nt>::run(args...) for a run-time nt in 1 .. kNtMax.
template <template <int> class Tile, int kNtMax, typename... Args>
void run_tile(int nt, Args... args) {
    if constexpr (kNtMax >= 1) {
        if (nt == kNtMax) return Tile<kNtMax>::run(args...);
        if constexpr (kNtMax > 1) return run_tile<Tile, kNtMax - 1>(nt, args...);
    }
}

}  // namespace
}  // namespace td::kernels::kgemm
