// q4_0, q5_0, q8_0 x q8_0, q4_1, q5_1 x q8_1, q4_k, q5_k and q6_k x q8_k on packed weights (kernels/pack.h)
// with AVX-512 VNNI: one zmm holds a 4-byte slice of each of the 16 rows of a group, so vpdpbusd with a
// broadcast 4-byte slice of the activations adds each row's products into its own int32 lane: no horizontal
// sums, no gathers, and the weights are one linear stream. Compiled with the AVX-512 + VNNI flags; matmul
// calls it only when cpuid reports avx512vnni. Same linkage rule as vec-dot-avx2.cpp: no inline function with
// external linkage from a shared header here.
//
// Bit-exact with the reference vec_dot: a block's integer sum is exact whatever the order; offsets of
// unsigned levels come back out through the activation block sums; the scaled sum of (super-)block b is
// formed with the reference's float expression and added into accumulator lane b % 8 of its row, and the
// lanes are folded in the reference's tree.
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/pack.h"
#include "kernels/x86/kernels-x86.h"
#include "kernels/x86/q8-block-sum.h"

// g++ 12 reports the deliberately undefined pass-through operands inside its AVX-512 intrinsics
// (_mm512_cvtepi32_ps, _mm512_srli_epi32, ...) as (maybe) uninitialized once inlined into an unrolled loop.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace td::kernels::avx512 {
namespace {

inline int32_t load_i32(const int8_t *p) {
    int32_t v;
    std::memcpy(&v, p, sizeof(v));
    return v;
}

// Prefetches block b (block_bytes long) of the group at pf into L2; pf == nullptr: nothing.
inline void prefetch_block(const uint8_t *pf, int64_t b, size_t block_bytes) {
    if (pf == nullptr) return;
    const uint8_t *p = pf + b * block_bytes;
    for (size_t off = 0; off < block_bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char *>(p + off), _MM_HINT_T1);
}

// Two int16 values as one int32 (lo in the low half), for vpdpwssd's pairs.
inline int32_t pair16(int32_t lo, int32_t hi) {
    return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) per row (dot_lanes_sum), stored to y[0..16).
inline void fold_store(const __m512 *a, float *y) {
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                     _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
    _mm512_storeu_ps(y, sum);
}

// ---- q4_0
// --------------------------------------------------------------------------------------------------

constexpr size_t kGroupBlockBytes = kPackRows * sizeof(BlockQ4_0);  // 288: 16 scales, 4 slices of 64 bytes

// One token's activations: its q8_0 blocks, and per block -8 * sum(qs) and the scale as float.
struct TokenRow {
    const BlockQ8_0 *x;
    const int32_t *offset;  // [nb]
    const float *dx;        // [nb]
    float *y;               // the token's output row, at the call's first row
};

// The levels of one packed 4- or 5-bit block: slice k (64 bytes at qs + 64k) gives lo[k] (elements 4k..4k+3
// of each row) and hi[k] (elements 16 + 4k..). With qh (lane i: row i's 32 fifth bits; nullptr for 4-bit
// types), 16 is added where the element's bit is set: for slice k, byte j of a lane takes bit 4k + j (lo) or
// 16 + 4k + j (hi).
inline void unpack_4_5_bit(const uint8_t *qs, const uint8_t *qh, __m512i lo[4], __m512i hi[4]) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int k = 0; k < 4; ++k) {
        const __m512i q = _mm512_loadu_si512(qs + 64 * k);
        lo[k] = _mm512_and_si512(q, m4);
        hi[k] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    }
    if (qh == nullptr) return;
    const __m512i sixteen = _mm512_set1_epi8(16);
    // byte[m]: byte m of each lane's qh in all four of the lane's bytes (vpshufb works per 128 bits).
    const __m512i lane_base =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
    const __m512i h = _mm512_loadu_si512(qh);
    __m512i byte[4];
    for (int m = 0; m < 4; ++m)
        byte[m] = _mm512_shuffle_epi8(h, _mm512_add_epi8(lane_base, _mm512_set1_epi8(static_cast<char>(m))));
    const __m512i bits[2] = {_mm512_set1_epi32(0x08040201), _mm512_set1_epi32(static_cast<int>(0x80402010u))};
    for (int k = 0; k < 4; ++k) {
        lo[k] = _mm512_mask_add_epi8(lo[k], _mm512_test_epi8_mask(byte[k / 2], bits[k % 2]), lo[k], sixteen);
        hi[k] =
            _mm512_mask_add_epi8(hi[k], _mm512_test_epi8_mask(byte[2 + k / 2], bits[k % 2]), hi[k], sixteen);
    }
}

// The block's integer dot for one token (xq: its 32 activation bytes), from `init`: two dependency chains of
// 4 (the low and the high nibbles) instead of one of 8.
inline __m512i dot_4_5_bit(const __m512i lo[4], const __m512i hi[4], const int8_t *xq, __m512i init) {
    __m512i s = init, s_hi = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
        s = _mm512_dpbusd_epi32(s, lo[k], _mm512_set1_epi32(load_i32(xq + 4 * k)));
        s_hi = _mm512_dpbusd_epi32(s_hi, hi[k], _mm512_set1_epi32(load_i32(xq + 16 + 4 * k)));
    }
    return _mm512_add_epi32(s, s_hi);
}

// q4_0 and q5_0: levels stored + 8 (+ 16), taken back out through the token's block offsets. q4_0's block
// is [0, 32) d then the qs slices; q5_0's has its qh at [32, 96) before them (pack.h).
template <typename Block>
struct OffsetBlock {
    static constexpr bool kFifth = kBlockHasQh<Block>;
    using Token = TokenRow;
    static constexpr size_t kBlockBytes = kPackRows * sizeof(Block);  // 288 or 352
    static constexpr int32_t kOffsetPerSum = kFifth ? -16 : -8;

    template <int NT>
    static void block(const uint8_t *g, int64_t b, const TokenRow *tok, __m512 (&acc)[NT][kDotLanes],
                      int lane) {
        __m512i lo[4], hi[4];
        unpack_4_5_bit(g + (kFifth ? 96 : 32), kFifth ? g + 32 : nullptr, lo, hi);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g)));
        for (int t = 0; t < NT; ++t) {
            const __m512i s = dot_4_5_bit(lo, hi, tok[t].x[b].qs, _mm512_set1_epi32(tok[t].offset[b]));
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(tok[t].dx[b]));
            acc[t][lane] = _mm512_add_ps(acc[t][lane], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(s)));
        }
    }
};
using Q4_0 = OffsetBlock<BlockQ4_0>;
using Q5_0 = OffsetBlock<BlockQ5_0>;

// One token's q8_1 activations with each block's scale and s (dy * sum q) as floats.
struct TokenRow1 {
    const BlockQ8_1 *x;
    const float *dx;  // [nb]
    const float *sx;  // [nb]
    float *y;         // the token's output row, at the call's first row
};

// q4_1 and q5_1 (x = d q + m): unsigned levels, no offset; block b adds (dw dy) sumi + mw sy, the reference's
// expression. Packed as [0, 32) d, [32, 64) m, (q5_1) [64, 128) qh, then qs.
template <typename Block>
struct MinBlock {
    static constexpr bool kFifth = kBlockHasQh<Block>;
    using Token = TokenRow1;
    static constexpr size_t kBlockBytes = kPackRows * sizeof(Block);  // 320 or 384

    template <int NT>
    static void block(const uint8_t *g, int64_t b, const TokenRow1 *tok, __m512 (&acc)[NT][kDotLanes],
                      int lane) {
        __m512i lo[4], hi[4];
        unpack_4_5_bit(g + (kFifth ? 128 : 64), kFifth ? g + 64 : nullptr, lo, hi);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g)));
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g + 32)));
        for (int t = 0; t < NT; ++t) {
            const __m512i s = dot_4_5_bit(lo, hi, tok[t].x[b].qs, _mm512_setzero_si512());
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(tok[t].dx[b]));
            const __m512 v = _mm512_add_ps(_mm512_mul_ps(scale, _mm512_cvtepi32_ps(s)),
                                           _mm512_mul_ps(mw, _mm512_set1_ps(tok[t].sx[b])));
            acc[t][lane] = _mm512_add_ps(acc[t][lane], v);
        }
    }
};

// q8_0: vpdpbusd takes one unsigned operand, so the signed weights are flipped to w + 128 (xor 0x80) as
// they are loaded; the extra 128 * sum(x) comes back out through the token's block offset (-128 * sum(qs)).
struct Q8_0 {
    using Token = TokenRow;
    static constexpr size_t kBlockBytes = kPackRows * sizeof(BlockQ8_0);  // 544: 16 scales, 8 slices of 64 B
    static constexpr int32_t kOffsetPerSum = -128;

    template <int NT>
    static void block(const uint8_t *g, int64_t b, const TokenRow *tok, __m512 (&acc)[NT][kDotLanes],
                      int lane) {
        const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
        __m512i q[8];
        for (int k = 0; k < 8; ++k) q[k] = _mm512_xor_si512(_mm512_loadu_si512(g + 32 + 64 * k), flip);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g)));
        for (int t = 0; t < NT; ++t) {
            const int8_t *xq = tok[t].x[b].qs;
            __m512i s = _mm512_set1_epi32(tok[t].offset[b]), s_odd = _mm512_setzero_si512();
            for (int k = 0; k < 8; k += 2) {
                s = _mm512_dpbusd_epi32(s, q[k], _mm512_set1_epi32(load_i32(xq + 4 * k)));
                s_odd = _mm512_dpbusd_epi32(s_odd, q[k + 1], _mm512_set1_epi32(load_i32(xq + 4 * k + 4)));
            }
            s = _mm512_add_epi32(s, s_odd);
            const __m512 scale = _mm512_mul_ps(dw, _mm512_set1_ps(tok[t].dx[b]));
            acc[t][lane] = _mm512_add_ps(acc[t][lane], _mm512_mul_ps(scale, _mm512_cvtepi32_ps(s)));
        }
    }
};

// R groups (16R rows: group r at g + r * group_bytes) x NT tokens at once, for batches: each unpacked weight
// vector feeds NT tokens and each broadcast activation slice feeds R groups, which takes about a quarter of
// the instructions per product off group_tokens<2>. The 8 lane accumulators of each (group, token) live in
// `acc` (in L1). pf: the next R groups to prefetch, or nullptr.
template <int R, int NT>
void tile_tokens(int64_t nb, const uint8_t *g, size_t group_bytes, const TokenRow *tok, int64_t row,
                 const uint8_t *pf) {
    alignas(64) float acc[R][NT][kDotLanes][kPackRows];
    std::memset(acc, 0, sizeof(acc));
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; ++b) {
        const int lane = static_cast<int>(b % kDotLanes);
        __m512i lo[R][4], hi[R][4];
        __m512 dw[R];
        for (int r = 0; r < R; ++r) {
            const uint8_t *gb = g + r * group_bytes + b * kGroupBlockBytes;
            if (pf != nullptr) prefetch_block(pf + r * group_bytes, b, kGroupBlockBytes);
            for (int k = 0; k < 4; ++k) {
                const __m512i q = _mm512_loadu_si512(gb + 32 + 64 * k);
                lo[r][k] = _mm512_and_si512(q, m4);
                hi[r][k] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            }
            dw[r] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(gb)));
        }
        for (int t = 0; t < NT; ++t) {
            const int8_t *xq = tok[t].x[b].qs;
            __m512i a[8];
            for (int k = 0; k < 4; ++k) {
                a[2 * k] = _mm512_set1_epi32(load_i32(xq + 4 * k));
                a[2 * k + 1] = _mm512_set1_epi32(load_i32(xq + 16 + 4 * k));
            }
            const __m512i off = _mm512_set1_epi32(tok[t].offset[b]);
            const __m512 dx = _mm512_set1_ps(tok[t].dx[b]);
            for (int r = 0; r < R; ++r) {
                __m512i sum = off;
                for (int k = 0; k < 4; ++k) {
                    sum = _mm512_dpbusd_epi32(sum, lo[r][k], a[2 * k]);
                    sum = _mm512_dpbusd_epi32(sum, hi[r][k], a[2 * k + 1]);
                }
                float *ap = acc[r][t][lane];
                const __m512 v = _mm512_mul_ps(_mm512_mul_ps(dw[r], dx), _mm512_cvtepi32_ps(sum));
                _mm512_store_ps(ap, _mm512_add_ps(_mm512_load_ps(ap), v));
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < NT; ++t) {
            __m512 l[kDotLanes];
            for (int i = 0; i < kDotLanes; ++i) l[i] = _mm512_load_ps(acc[r][t][i]);
            fold_store(l, tok[t].y + row + r * kPackRows);
        }
}

// Every token of the call over R groups starting at g: tiles of 4 tokens, then 2, then 1.
template <int R>
void tile_all_tokens(int64_t nb, const uint8_t *g, size_t group_bytes, const TokenRow *tok, int64_t n_tokens,
                     int64_t row, const uint8_t *pf) {
    int64_t t = 0;
    for (; t + 4 <= n_tokens; t += 4)
        tile_tokens<R, 4>(nb, g, group_bytes, tok + t, row, t == 0 ? pf : nullptr);
    if (t + 2 <= n_tokens) {
        tile_tokens<R, 2>(nb, g, group_bytes, tok + t, row, t == 0 ? pf : nullptr);
        t += 2;
    }
    if (t < n_tokens) tile_tokens<R, 1>(nb, g, group_bytes, tok + t, row, t == 0 ? pf : nullptr);
}

// ---- K-quants
// -----------------------------------------------------------------------------------------------

// One token's q8_K activations and, per super-block, activation sums as int16 pairs for vpdpwssd (the layout
// is the kernel's: K::kPairs per super-block).
struct TokenRowK {
    const BlockQ8_K *x;
    const int32_t *pairs;  // [nb][K::kPairs]
    float *y;
};

// q4_k and q5_k (Block): q5_k's packed super-block has its qh slices at [256, 768) and qs after them
// (pack.h); slice k of qh holds bytes 4k..4k+3, whose bit 2c (2c + 1) is the fifth bit of the low (high)
// nibbles of the same bytes of qs chunk c.
template <typename Block>
struct Q4_5_K {
    static constexpr bool kFifth = kBlockHasQh<Block>;
    static constexpr size_t kQsAt = kFifth ? 256 + 8 * 64 : 256;
    using Token = TokenRowK;
    static constexpr size_t kBlockBytes = kPackRows * sizeof(Block);  // 2304, 2816
    static constexpr int kPairs = 4;
    // Sums of the eight 32-element runs (|.| <= 32 * 127: int16), paired as (0, 2), (1, 3), (4, 6), (5, 7) to
    // match the min vectors built in block().
    static void pairs(const BlockQ8_K &x, int32_t *pr) {
        int32_t run[8];
        for (int j = 0; j < 8; ++j) run[j] = x.bsums[2 * j] + x.bsums[2 * j + 1];
        pr[0] = pair16(run[0], run[2]);
        pr[1] = pair16(run[1], run[3]);
        pr[2] = pair16(run[4], run[6]);
        pr[3] = pair16(run[5], run[7]);
    }

    // Super-block b of one group for NT tokens: lane b % 8 += dall * sumi - dmin * summ for 16 rows.
    template <int NT>
    static void block(const uint8_t *g, int64_t b, const TokenRowK *tok, __m512 (&acc)[NT][kDotLanes],
                      int lane) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i low6 = _mm512_set1_epi8(0x3F);
        const __m512i top2 = _mm512_set1_epi8(0x30);
        const __m512i byte0 = _mm512_set1_epi32(0xFF);
        const __m512i even16 = _mm512_set1_epi32(0x00FF00FF);
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        // The 12 scale bytes of each row, as three dwords across the 16 lanes (get_scale_min_k4, lane-wise).
        const __m512i u0 = _mm512_loadu_si512(g + 64), u1 = _mm512_loadu_si512(g + 128),
                      u2 = _mm512_loadu_si512(g + 192);
        const __m512i sc03 = _mm512_and_si512(u0, low6);
        const __m512i sc47 =
            _mm512_or_si512(_mm512_and_si512(u2, m4), _mm512_and_si512(_mm512_srli_epi32(u0, 2), top2));
        const __m512i mn03 = _mm512_and_si512(u1, low6);
        const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                                             _mm512_and_si512(_mm512_srli_epi32(u1, 2), top2));
        __m512i sumi[NT];
        for (int t = 0; t < NT; ++t) sumi[t] = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c) {
            const __m512i scv = c < 2 ? sc03 : sc47;
            const __m512i sc_lo = _mm512_and_si512(_mm512_srli_epi32(scv, 16 * (c % 2)), byte0);  // run 2c
            const __m512i sc_hi =
                _mm512_and_si512(_mm512_srli_epi32(scv, 16 * (c % 2) + 8), byte0);  // run 2c+1
            __m512i lo_sum[NT], hi_sum[NT];
            for (int t = 0; t < NT; ++t) lo_sum[t] = hi_sum[t] = _mm512_setzero_si512();
            for (int k = 0; k < 8; ++k) {
                const __m512i q = _mm512_loadu_si512(g + kQsAt + 64 * (8 * c + k));
                __m512i lo = _mm512_and_si512(q, m4);                        // elements 64c + 4k ..
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);  // elements 64c + 32 + 4k ..
                if constexpr (kFifth) {
                    // Bit 2c (lo) and 2c + 1 (hi) of the qh bytes moved to bit 4 (shifts stay inside bytes),
                    // or'd in under the mask 0x10 (ternlog 0xF8: a | (b & c)).
                    const __m512i h = _mm512_loadu_si512(g + 256 + 64 * k);
                    auto to_bit4 = [&](int bit) {
                        return bit <= 4 ? _mm512_slli_epi16(h, 4 - bit) : _mm512_srli_epi16(h, bit - 4);
                    };
                    lo = _mm512_ternarylogic_epi32(lo, to_bit4(2 * c), bit4, 0xF8);
                    hi = _mm512_ternarylogic_epi32(hi, to_bit4(2 * c + 1), bit4, 0xF8);
                }
                for (int t = 0; t < NT; ++t) {
                    const int8_t *xq = tok[t].x[b].qs + 64 * c + 4 * k;
                    lo_sum[t] = _mm512_dpbusd_epi32(lo_sum[t], lo, _mm512_set1_epi32(load_i32(xq)));
                    hi_sum[t] = _mm512_dpbusd_epi32(hi_sum[t], hi, _mm512_set1_epi32(load_i32(xq + 32)));
                }
            }
            for (int t = 0; t < NT; ++t)
                sumi[t] = _mm512_add_epi32(sumi[t], _mm512_add_epi32(_mm512_mullo_epi32(sc_lo, lo_sum[t]),
                                                                     _mm512_mullo_epi32(sc_hi, hi_sum[t])));
        }
        // Mins as int16 pairs: (m0, m2), (m1, m3), (m4, m6), (m5, m7) per lane.
        const __m512i m02 = _mm512_and_si512(mn03, even16),
                      m13 = _mm512_and_si512(_mm512_srli_epi32(mn03, 8), even16);
        const __m512i m46 = _mm512_and_si512(mn47, even16),
                      m57 = _mm512_and_si512(_mm512_srli_epi32(mn47, 8), even16);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g)));
        const __m512 dminw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g + 32)));
        for (int t = 0; t < NT; ++t) {
            const int32_t *pr = tok[t].pairs + 4 * b;
            __m512i summ = _mm512_dpwssd_epi32(_mm512_setzero_si512(), m02, _mm512_set1_epi32(pr[0]));
            summ = _mm512_dpwssd_epi32(summ, m13, _mm512_set1_epi32(pr[1]));
            summ = _mm512_dpwssd_epi32(summ, m46, _mm512_set1_epi32(pr[2]));
            summ = _mm512_dpwssd_epi32(summ, m57, _mm512_set1_epi32(pr[3]));
            const __m512 yd = _mm512_set1_ps(tok[t].x[b].d);
            const __m512 dall = _mm512_mul_ps(dw, yd), dmin = _mm512_mul_ps(dminw, yd);
            const __m512 v = _mm512_sub_ps(_mm512_mul_ps(dall, _mm512_cvtepi32_ps(sumi[t])),
                                           _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(summ)));
            acc[t][lane] = _mm512_add_ps(acc[t][lane], v);
        }
    }
};

struct Q6_K {
    using Token = TokenRowK;
    static constexpr size_t kBlockBytes = kPackRows * sizeof(BlockQ6_K);  // 3360
    static constexpr int kPairs = 8;
    // The 16 group sums (|.| <= 16 * 127), paired as (4w, 4w + 2), (4w + 1, 4w + 3) for w < 4.
    static void pairs(const BlockQ8_K &x, int32_t *pr) {
        for (int w = 0; w < 4; ++w) {
            pr[2 * w] = pair16(x.bsums[4 * w], x.bsums[4 * w + 2]);
            pr[2 * w + 1] = pair16(x.bsums[4 * w + 1], x.bsums[4 * w + 3]);
        }
    }

    // Super-block b of one group for NT tokens: lane b % 8 += (d * dy) * sumi, where
    // sumi = sum_g scale_g * (sum_e q_e y_e) - 32 * sum_g scale_g * bsum_g (levels q_e = 0..63).
    template <int NT>
    static void block(const uint8_t *g, int64_t b, const TokenRowK *tok, __m512 (&acc)[NT][kDotLanes],
                      int lane) {
        const __m512i m4 = _mm512_set1_epi8(0x0F);
        const __m512i m30 = _mm512_set1_epi8(0x30);
        __m512i scw[4];  // lane r: the signed scales 4w..4w+3 of row r
        for (int w = 0; w < 4; ++w) scw[w] = _mm512_loadu_si512(g + 32 + 64 * w);
        __m512i sumi[NT];
        // The offset part first: -32 * sum_g scale_g bsum_g, with the scales as sign-extended int16 pairs.
        for (int t = 0; t < NT; ++t) {
            const int32_t *pr = tok[t].pairs + 8 * b;
            __m512i s = _mm512_setzero_si512();
            for (int w = 0; w < 4; ++w) {
                const __m512i even = _mm512_srai_epi16(_mm512_slli_epi16(scw[w], 8), 8);  // scales 4w, 4w+2
                const __m512i odd = _mm512_srai_epi16(scw[w], 8);                         // scales 4w+1, 4w+3
                s = _mm512_dpwssd_epi32(s, even, _mm512_set1_epi32(pr[2 * w]));
                s = _mm512_dpwssd_epi32(s, odd, _mm512_set1_epi32(pr[2 * w + 1]));
            }
            sumi[t] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(s, 5));
        }
        for (int h = 0; h < 2; ++h) {
            for (int half = 0; half < 2; ++half) {  // slices k < 4 or k >= 4: the first or second group of 16
                __m512i isum[NT][4];
                for (auto &row : isum)
                    for (auto &v : row) v = _mm512_setzero_si512();
#pragma GCC unroll 4
                for (int k = 4 * half; k < 4 * half + 4; ++k) {
                    const uint8_t *qk = g + 288 + 192 * (8 * h + k);
                    const __m512i qa = _mm512_loadu_si512(qk);        // ql bytes 64h + 4k ..
                    const __m512i qb = _mm512_loadu_si512(qk + 64);   // ql bytes 64h + 32 + 4k ..
                    const __m512i qh = _mm512_loadu_si512(qk + 128);  // qh bytes 32h + 4k ..
                    __m512i q[4];
                    q[0] = _mm512_or_si512(_mm512_and_si512(qa, m4),
                                           _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
                    q[1] = _mm512_or_si512(_mm512_and_si512(qb, m4),
                                           _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
                    q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qa, 4), m4),
                                           _mm512_and_si512(qh, m30));
                    q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(qb, 4), m4),
                                           _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
                    for (int t = 0; t < NT; ++t) {
                        const int8_t *xq = tok[t].x[b].qs + 128 * h + 4 * k;
                        for (int j = 0; j < 4; ++j)
                            isum[t][j] = _mm512_dpbusd_epi32(isum[t][j], q[j],
                                                             _mm512_set1_epi32(load_i32(xq + 32 * j)));
                    }
                }
                for (int j = 0; j < 4; ++j) {
                    const int grp = 8 * h + 2 * j + half;  // elements 16 grp .. 16 grp + 15
                    const __m512i sc =
                        _mm512_srai_epi32(_mm512_slli_epi32(scw[grp / 4], 24 - 8 * (grp % 4)), 24);
                    for (int t = 0; t < NT; ++t)
                        sumi[t] = _mm512_add_epi32(sumi[t], _mm512_mullo_epi32(sc, isum[t][j]));
                }
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(g)));
        for (int t = 0; t < NT; ++t) {
            const __m512 dall = _mm512_mul_ps(dw, _mm512_set1_ps(tok[t].x[b].d));
            acc[t][lane] = _mm512_add_ps(acc[t][lane], _mm512_mul_ps(dall, _mm512_cvtepi32_ps(sumi[t])));
        }
    }
};

// Per-token activation pairs for kernel K, computed once per call (they serve every group of the call).
template <typename K>
const TokenRowK *k_tokens(const void *x, size_t x_stride, float *y, int64_t y_stride, int64_t n_tokens,
                          int64_t nb) {
    thread_local std::vector<int32_t> pairs;     // [n_tokens][nb][K::kPairs]
    thread_local std::vector<TokenRowK> tokens;  // [n_tokens]
    const size_t need = static_cast<size_t>(n_tokens * nb * K::kPairs);
    if (pairs.size() < need) pairs.resize(need);
    if (tokens.size() < static_cast<size_t>(n_tokens)) tokens.resize(static_cast<size_t>(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto *xt = reinterpret_cast<const BlockQ8_K *>(static_cast<const uint8_t *>(x) + t * x_stride);
        int32_t *pr = pairs.data() + t * nb * K::kPairs;
        for (int64_t b = 0; b < nb; ++b) K::pairs(xt[b], pr + b * K::kPairs);
        tokens[t] = TokenRowK{xt, pr, y + t * y_stride};
    }
    return tokens.data();
}

// Per-token block offsets (K::kOffsetPerSum * sum(qs)) and scales of q8_0 activations, computed once per call
// (each serves every group of the call).
template <typename K>
const TokenRow *q8_0_tokens(const void *x, size_t x_stride, float *y, int64_t y_stride, int64_t n_tokens,
                            int64_t nb) {
    thread_local std::vector<int32_t> offsets;  // [n_tokens][nb]
    thread_local std::vector<float> scales;     // [n_tokens][nb]
    thread_local std::vector<TokenRow> tokens;  // [n_tokens]
    const size_t need = static_cast<size_t>(n_tokens * nb);
    if (offsets.size() < need) offsets.resize(need), scales.resize(need);
    if (tokens.size() < static_cast<size_t>(n_tokens)) tokens.resize(static_cast<size_t>(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto *xt = reinterpret_cast<const BlockQ8_0 *>(static_cast<const uint8_t *>(x) + t * x_stride);
        int32_t *off = offsets.data() + t * nb;
        float *dx = scales.data() + t * nb;
        for (int64_t b = 0; b < nb; ++b) {
            off[b] = K::kOffsetPerSum * block_sum_i8(xt[b].qs);
            dx[b] = _cvtsh_ss(xt[b].d);
        }
        tokens[t] = TokenRow{xt, off, dx, y + t * y_stride};
    }
    return tokens.data();
}

// Per-token scales and sums of q8_1 activations, computed once per call.
const TokenRow1 *q8_1_tokens(const void *x, size_t x_stride, float *y, int64_t y_stride, int64_t n_tokens,
                             int64_t nb) {
    thread_local std::vector<float> scales, sums;  // [n_tokens][nb]
    thread_local std::vector<TokenRow1> tokens;    // [n_tokens]
    const size_t need = static_cast<size_t>(n_tokens * nb);
    if (scales.size() < need) scales.resize(need), sums.resize(need);
    if (tokens.size() < static_cast<size_t>(n_tokens)) tokens.resize(static_cast<size_t>(n_tokens));
    for (int64_t t = 0; t < n_tokens; ++t) {
        const auto *xt = reinterpret_cast<const BlockQ8_1 *>(static_cast<const uint8_t *>(x) + t * x_stride);
        float *dx = scales.data() + t * nb;
        float *sx = sums.data() + t * nb;
        for (int64_t b = 0; b < nb; ++b) {
            dx[b] = _cvtsh_ss(xt[b].d);
            sx[b] = _cvtsh_ss(xt[b].s);
        }
        tokens[t] = TokenRow1{xt, dx, sx, y + t * y_stride};
    }
    return tokens.data();
}

// ---- the shared skeleton
// -----------------------------------------------------------------------------------

// All blocks of one group (16 rows at g) for NT tokens through K::block; writes y rows [row, row + 16).
// The 8 lane accumulators per token stay in registers (the block loop is unrolled by 8). pf: the next group
// to prefetch, a block's worth per block, or nullptr.
template <typename K, int NT>
void group_tokens(int64_t nb, const uint8_t *g, const typename K::Token *tok, int64_t row,
                  const uint8_t *pf) {
    __m512 acc[NT][kDotLanes];
    for (auto &a : acc)
        for (auto &l : a) l = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + kDotLanes <= nb; b += kDotLanes) {
#pragma GCC unroll 8
        for (int l = 0; l < kDotLanes; ++l) {
            prefetch_block(pf, b + l, K::kBlockBytes);
            K::template block<NT>(g + (b + l) * K::kBlockBytes, b + l, tok, acc, l);
        }
    }
    for (int l = 0; b < nb; ++b, ++l) {
        prefetch_block(pf, b, K::kBlockBytes);
        K::template block<NT>(g + b * K::kBlockBytes, b, tok, acc, l);
    }
    for (int t = 0; t < NT; ++t) fold_store(acc[t], tok[t].y + row);
}

// Every group of the call, tokens in fours, then pairs, then a last single one (a group's block is unpacked
// once for the tokens of a pass; with four, the lane accumulators spill to L1, which costs less than
// unpacking the block twice). With several passes over a group (more than 2 tokens), the first also fetches
// the next group so its bytes arrive while this one is computed (the later passes read this group from
// cache); one pass streams faster on the hardware prefetchers alone.
template <typename K>
void run_groups(int64_t nb, const void *w, size_t w_stride, const typename K::Token *tok, int64_t n_rows,
                int64_t n_tokens) {
    const auto *wb = static_cast<const uint8_t *>(w);
    const size_t group_bytes = kPackRows * w_stride;
    for (int64_t r = 0; r < n_rows; r += kPackRows) {
        const uint8_t *g = wb + static_cast<size_t>(r / kPackRows) * group_bytes;
        const uint8_t *next = n_tokens > 2 && r + kPackRows < n_rows ? g + group_bytes : nullptr;
        int64_t t = 0;
        for (; t + 4 <= n_tokens; t += 4) group_tokens<K, 4>(nb, g, tok + t, r, t == 0 ? next : nullptr);
        for (; t + 2 <= n_tokens; t += 2) group_tokens<K, 2>(nb, g, tok + t, r, t == 0 ? next : nullptr);
        if (t < n_tokens) group_tokens<K, 1>(nb, g, tok + t, r, t == 0 ? next : nullptr);
    }
}

}  // namespace

void gemm_q4_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    const TokenRow *tokens = q8_0_tokens<Q4_0>(x, x_stride, y, y_stride, n_tokens, nb);
    const auto *wb = static_cast<const uint8_t *>(w);
    const size_t group_bytes = kPackRows * w_stride;
    if (n_tokens > 2) {  // batches: tiles of 2 groups x 4 tokens, prefetching the next 2 groups
        for (int64_t r = 0; r < n_rows; r += 2 * kPackRows) {
            const uint8_t *g = wb + static_cast<size_t>(r / kPackRows) * group_bytes;
            const bool two = r + 2 * kPackRows <= n_rows;
            const uint8_t *next = r + 2 * kPackRows < n_rows ? g + 2 * group_bytes : nullptr;
            if (two) {
                // The next tile may be a single group: prefetch only what exists.
                tile_all_tokens<2>(nb, g, group_bytes, tokens, n_tokens, r,
                                   next != nullptr && r + 4 * kPackRows <= n_rows ? next : nullptr);
            } else {
                tile_all_tokens<1>(nb, g, group_bytes, tokens, n_tokens, r, nullptr);
            }
        }
        return;
    }
    run_groups<Q4_0>(nb, w, w_stride, tokens, n_rows, n_tokens);
}

void gemm_q5_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    run_groups<Q5_0>(nb, w, w_stride, q8_0_tokens<Q5_0>(x, x_stride, y, y_stride, n_tokens, nb), n_rows,
                     n_tokens);
}

void gemm_q4_1x16_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    run_groups<MinBlock<BlockQ4_1>>(nb, w, w_stride, q8_1_tokens(x, x_stride, y, y_stride, n_tokens, nb),
                                    n_rows, n_tokens);
}

void gemm_q5_1x16_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    run_groups<MinBlock<BlockQ5_1>>(nb, w, w_stride, q8_1_tokens(x, x_stride, y, y_stride, n_tokens, nb),
                                    n_rows, n_tokens);
}

void gemm_q8_0x16_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK;
    run_groups<Q8_0>(nb, w, w_stride, q8_0_tokens<Q8_0>(x, x_stride, y, y_stride, n_tokens, nb), n_rows,
                     n_tokens);
}

void gemm_q4_kx16_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK_K;
    run_groups<Q4_5_K<BlockQ4_K>>(nb, w, w_stride,
                                  k_tokens<Q4_5_K<BlockQ4_K>>(x, x_stride, y, y_stride, n_tokens, nb), n_rows,
                                  n_tokens);
}

void gemm_q5_kx16_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK_K;
    run_groups<Q4_5_K<BlockQ5_K>>(nb, w, w_stride,
                                  k_tokens<Q4_5_K<BlockQ5_K>>(x, x_stride, y, y_stride, n_tokens, nb), n_rows,
                                  n_tokens);
}

void gemm_q6_kx16_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                       int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    const int64_t nb = n / kQK_K;
    run_groups<Q6_K>(nb, w, w_stride, k_tokens<Q6_K>(x, x_stride, y, y_stride, n_tokens, nb), n_rows,
                     n_tokens);
}

}  // namespace td::kernels::avx512
