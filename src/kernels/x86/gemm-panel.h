// The matrix-matrix kernel shared by gemm-avx2.cpp and gemm-avx512vnni.cpp: q4_0 / q5_0 / q8_0 weights x
// q8_0 activations and q4_1 / q5_1 weights x q8_1 activations, one int32 vector lane per weight row. Included
// only by those ISA files, inside an anonymous namespace, so each gets its own copy compiled with its own
// flags (blocks.h's linkage rule).
//
// A panel of up to R vectors of weight rows is unpacked once per call into unsigned bytes, interleaved so
// that vector (b, g) holds bytes 4g..4g+3 of block b of each row:
//   panel[b][g][l][v]: one vector per (block b, group g < 8, stored line l, row vector v < R)
// One multiply-add of that vector with the token's 4 activation bytes broadcast then adds 4 products into
// every row's lane, and the 8 groups give each row's exact block sum in its own lane, with no horizontal
// adds. Where the weights were made unsigned by an offset c (u = q for q4_0, c = 8; q5_0, c = 16; u = x + 128
// for q8_0 on VNNI), the lane starts at -c * sum_j y_j, a per-token block sum computed once per call.
//
// Canonical order (ref/vec-dot-ref.cpp): block b's exact sum is scaled by (dx_b * dy_b) in float, plus
// mx_b * sy_b for the types with a minimum, and added into accumulator lane b % 8; the 8 lanes are summed
// with dot_lanes_sum's tree at the end. The 8 accumulators of each (row, token) live in a small stack buffer,
// so every output equals vec_dot bit for bit whatever the batch, the tile or the thread.
//
// The ISA policy K provides (see the ISA files):
//   VI, VF                          integer and float vectors of kLanes 32-bit lanes
//   kLanes, kMaxRowVecs, kMaxTokens rows per vector; register tile: row vectors x tokens
//   kLinesPerGroup, kOffset         vectors stored per group; the offset c (0: none)
//   unpack(blk[kLanes], qs[kLanes], out)
//                                   one block of kLanes rows (qs: their quants) -> out[g * lines + l]
//   dot(acc, w, y)                  acc + the 4-byte group products of each lane (w: kLinesPerGroup lines)
//   set1_i, load_i, store_i, set1_f, load_f, store_f, add_f, mul_f, cvt_f, scales_f(d[kLanes] halves),
//   store_rows(y, v, n)             store the first n lanes
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/x86/q8-block-sum.h"

namespace td::kernels {
namespace {  // NOLINT: one copy per ISA file, compiled with that file's flags
namespace panel {

constexpr int kGroups = kQK / 4;  // 4-byte groups per block

// Weight types with a minimum (q4_1, q5_1) pair with q8_1 activations, whose s is dy * sum q; block b then
// adds dx dy sumi + mx sy (the reference's expression).
template <typename K>
constexpr bool kHasMin = kBlockHasMin<typename K::Block>;
template <typename K>
using XBlock = std::conditional_t<kHasMin<K>, BlockQ8_1, BlockQ8_0>;

// Per (token, block) values shared by every weight row: the activation scale, -c * sum_j y_j, and q8_1's s.
struct TokenBlock {
    float d;
    int32_t neg_offset;
    float s;
};

// One stored vector. A type of this file only, so std::vector<Line<K>> is instantiated per ISA file.
template <typename K>
struct alignas(sizeof(typename K::VI)) Line {
    typename K::VI v;
};

inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// out [n_tokens][nb]: every block's activation scale, -c * sum_j y_j and s.
template <typename K>
void token_blocks(int64_t nb, const uint8_t *x, size_t x_stride, int64_t n_tokens, TokenBlock *out) {
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto *xb = reinterpret_cast<const XBlock<K> *>(x + static_cast<size_t>(t) * x_stride);
        for (int64_t b = 0; b < nb; ++b) {
            const int32_t neg = K::kOffset == 0 ? 0 : -K::kOffset * block_sum_i8(xb[b].qs);
            float s = 0.0f;
            if constexpr (kHasMin<K>) s = _cvtsh_ss(xb[b].s);
            out[t * nb + b] = {_cvtsh_ss(xb[b].d), neg, s};
        }
    }
}

// Rows [0, n_rows) of w (n_rows <= R * kLanes; missing rows repeat the last one) -> panel
// [nb][kGroups][kLinesPerGroup][R], their scales -> scales [nb][R][kLanes] floats and (types with a minimum)
// their minimums -> mins, the same layout.
template <typename K, int R>
void unpack_panel(int64_t nb, const uint8_t *w, size_t w_stride, int n_rows, Line<K> *panel, float *scales,
                  float *mins) {
    using Block = typename K::Block;
    constexpr int kLines = kGroups * K::kLinesPerGroup;
    const Block *rows[R * K::kLanes];
    for (int r = 0; r < R * K::kLanes; ++r) {
        const int rr = r < n_rows ? r : n_rows - 1;
        rows[r] = reinterpret_cast<const Block *>(w + static_cast<size_t>(rr) * w_stride);
    }
    for (int64_t b = 0; b < nb; ++b) {
        Line<K> *pb = panel + b * kLines * R;
        for (int v = 0; v < R; ++v) {
            const Block *blk[K::kLanes];
            const uint8_t *qs[K::kLanes];
            alignas(32) uint16_t d[K::kLanes];
            alignas(32) uint16_t m[K::kLanes];
            for (int r = 0; r < K::kLanes; ++r) {
                blk[r] = &rows[v * K::kLanes + r][b];
                qs[r] = reinterpret_cast<const uint8_t *>(blk[r]->qs);
                d[r] = blk[r]->d;
                if constexpr (kHasMin<K>) m[r] = blk[r]->m;
            }
            typename K::VI u[kLines];
            K::unpack(blk, qs, u);
            for (int l = 0; l < kLines; ++l) K::store_i(&pb[l * R + v], u[l]);
            K::store_f(scales + (b * R + v) * K::kLanes, K::scales_f(d));
            if constexpr (kHasMin<K>) K::store_f(mins + (b * R + v) * K::kLanes, K::scales_f(m));
        }
    }
}

// y[t][v * kLanes + r] for R row vectors x NT tokens of a panel, over all nb blocks. tb: [NT][nb].
template <typename K, int R, int NT>
void tile(int64_t nb, const Line<K> *panel, const float *scales, const float *mins, const uint8_t *x,
          size_t x_stride, const TokenBlock *tb, float *y, int64_t y_stride, int n_rows) {
    using VI = typename K::VI;
    using VF = typename K::VF;
    constexpr int kLpg = K::kLinesPerGroup;
    alignas(64) float lanes[R][NT][kDotLanes][K::kLanes];  // the canonical 8 accumulators per output
    for (int v = 0; v < R; ++v)
        for (int t = 0; t < NT; ++t)
            for (int k = 0; k < kDotLanes; ++k) K::store_f(lanes[v][t][k], K::set1_f(0.0f));
    const XBlock<K> *xt[NT];  // [NT] rows of nb blocks
    for (int t = 0; t < NT; ++t)
        xt[t] = reinterpret_cast<const XBlock<K> *>(x + static_cast<size_t>(t) * x_stride);

    for (int64_t b = 0; b < nb; ++b) {
        const Line<K> *pb = panel + b * kGroups * kLpg * R;
        VI acc[R][NT];
        for (int t = 0; t < NT; ++t) {
            const VI start = K::set1_i(tb[t * nb + b].neg_offset);
            for (int v = 0; v < R; ++v) acc[v][t] = start;
        }
        for (int g = 0; g < kGroups; ++g) {
            VI w[R][kLpg];
            for (int v = 0; v < R; ++v)
                for (int l = 0; l < kLpg; ++l) w[v][l] = K::load_i(&pb[(g * kLpg + l) * R + v]);
            for (int t = 0; t < NT; ++t) {
                const VI yv = K::set1_i(load_i32(xt[t][b].qs + 4 * g));
                for (int v = 0; v < R; ++v) acc[v][t] = K::dot(acc[v][t], w[v], yv);
            }
        }
        VF dw[R];
        VF mw[R];
        for (int v = 0; v < R; ++v) {
            dw[v] = K::load_f(scales + (b * R + v) * K::kLanes);
            if constexpr (kHasMin<K>) mw[v] = K::load_f(mins + (b * R + v) * K::kLanes);
        }
        const int k = static_cast<int>(b % kDotLanes);
        for (int t = 0; t < NT; ++t) {
            const VF dy = K::set1_f(tb[t * nb + b].d);
            for (int v = 0; v < R; ++v) {
                VF p = K::mul_f(K::mul_f(dw[v], dy), K::cvt_f(acc[v][t]));
                if constexpr (kHasMin<K>) p = K::add_f(p, K::mul_f(mw[v], K::set1_f(tb[t * nb + b].s)));
                K::store_f(lanes[v][t][k], K::add_f(K::load_f(lanes[v][t][k]), p));
            }
        }
    }

    for (int v = 0; v < R; ++v) {
        const int valid = n_rows - v * K::kLanes;
        if (valid <= 0) break;
        for (int t = 0; t < NT; ++t) {
            const float(*a)[K::kLanes] = lanes[v][t];
            // ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)), dot_lanes_sum's tree, kLanes rows at once.
            const VF s0 = K::add_f(K::add_f(K::load_f(a[0]), K::load_f(a[4])),
                                   K::add_f(K::load_f(a[2]), K::load_f(a[6])));
            const VF s1 = K::add_f(K::add_f(K::load_f(a[1]), K::load_f(a[5])),
                                   K::add_f(K::load_f(a[3]), K::load_f(a[7])));
            K::store_rows(y + t * y_stride + v * K::kLanes, K::add_f(s0, s1), valid);
        }
    }
}

template <typename K, int R, int... NT>
void tile_n(int nt, std::integer_sequence<int, NT...>, int64_t nb, const Line<K> *panel, const float *scales,
            const float *mins, const uint8_t *x, size_t x_stride, const TokenBlock *tb, float *y,
            int64_t y_stride, int n_rows) {
    ((nt == NT + 1 ? tile<K, R, NT + 1>(nb, panel, scales, mins, x, x_stride, tb, y, y_stride, n_rows)
                   : void()),
     ...);
}

// Scratch kept per thread between calls (the pool's threads are persistent).
template <typename K>
struct Scratch {
    std::vector<Line<K>> panel;      // [nb][kGroups][kLinesPerGroup][kMaxRowVecs]
    std::vector<Line<K>> scales;     // [nb][kMaxRowVecs] kLanes floats each, then as many minimums
    std::vector<TokenBlock> tokens;  // [n_tokens][nb]
};

// The GemmFn contract (kernels/gemm.h) for weights of K::Block.
template <typename K>
void gemm(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
          int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    static_assert(K::kMaxRowVecs == 2, "a panel is one or two row vectors");
    constexpr int kPanelRows = K::kMaxRowVecs * K::kLanes;
    const int64_t nb = n / kQK;
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    const uint8_t *xb = static_cast<const uint8_t *>(x);
    thread_local Scratch<K> s;
    const size_t n_lines = static_cast<size_t>(nb) * kGroups * K::kLinesPerGroup * K::kMaxRowVecs;
    if (s.panel.size() < n_lines) s.panel.resize(n_lines);
    // Every container holds a type of this file only, so its code is this ISA file's own copy.
    const size_t n_scales = static_cast<size_t>(nb) * K::kMaxRowVecs;
    if (s.scales.size() < 2 * n_scales) s.scales.resize(2 * n_scales);
    float *scales = reinterpret_cast<float *>(s.scales.data());
    float *mins = reinterpret_cast<float *>(s.scales.data() + n_scales);
    const size_t n_tb = static_cast<size_t>(nb * n_tokens);
    if (s.tokens.size() < n_tb) s.tokens.resize(n_tb);
    token_blocks<K>(nb, xb, x_stride, n_tokens, s.tokens.data());

    const auto nts = std::make_integer_sequence<int, K::kMaxTokens>{};
    for (int64_t r0 = 0; r0 < n_rows; r0 += kPanelRows) {
        const int nr = static_cast<int>(n_rows - r0 < kPanelRows ? n_rows - r0 : kPanelRows);
        const uint8_t *wr = wb + static_cast<size_t>(r0) * w_stride;
        const bool full = nr > K::kLanes;  // both row vectors hold rows
        if (full)
            unpack_panel<K, K::kMaxRowVecs>(nb, wr, w_stride, nr, s.panel.data(), scales, mins);
        else
            unpack_panel<K, 1>(nb, wr, w_stride, nr, s.panel.data(), scales, mins);
        for (int64_t t0 = 0; t0 < n_tokens; t0 += K::kMaxTokens) {
            const int nt = static_cast<int>(n_tokens - t0 < K::kMaxTokens ? n_tokens - t0 : K::kMaxTokens);
            const uint8_t *xt = xb + static_cast<size_t>(t0) * x_stride;
            const TokenBlock *tb = s.tokens.data() + t0 * nb;
            float *yt = y + t0 * y_stride + r0;
            if (full)
                tile_n<K, K::kMaxRowVecs>(nt, nts, nb, s.panel.data(), scales, mins, xt, x_stride, tb, yt,
                                          y_stride, nr);
            else
                tile_n<K, 1>(nt, nts, nb, s.panel.data(), scales, mins, xt, x_stride, tb, yt, y_stride, nr);
        }
    }
}

}  // namespace panel
}  // namespace
}  // namespace td::kernels
