// Matrix-vector kernels (one token) for AVX-512 VNNI: y[r] = vec_dot(n, w row r, x) for a tile of 8 weight
// rows at a time. Compiled with the AVX-512 + VNNI flags; gemv.cpp hands them out only when cpuid reports
// avx512vnni. Same linkage rule as vec-dot-avx2.cpp: no inline function with external linkage from a shared
// header here.
//
// Row lanes: the 8 rows of a tile are the 8 float lanes of one vector. The reference adds block b's scaled
// sum into accumulator lane b % 8 of its row; here accumulator vector `lanes[b % 8]` holds that lane for all
// 8 rows, so each row's float operations are exactly the reference's (same operands, same order, no fused
// multiply-add), and the final fold ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) is done element-wise.
// The integer sum of each block is exact in int32 whatever order it is formed in, so results equal the
// scalar reference bit for bit. The activation vector is loaded once per block for all 8 rows.
//
// Unsigned operands: vpdpbusd multiplies unsigned by signed bytes, so weights enter as unsigned levels and
// the signed offset is taken out with the activation block's sum: sum (q - o) y = sum q y - o sum y.
#include <immintrin.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/blocks.h"
#include "kernels/x86/kernels-x86.h"
#include "kernels/x86/kquants-x86.h"

// GCC 12 reports the unused "undefined" operands inside its own AVX-512 intrinsic headers as maybe
// uninitialized (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace td::kernels::avx512 {
namespace {

constexpr int kTileRows = 8;

// a: 128-bit lane i holds four int32 partial sums of row i; b: the same for row 4 + i.
// Returns [sum row 0 .. sum row 7].
inline __m256i reduce_rows_4x4(__m512i a, __m512i b) {
    __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    // lane i: [a0 + a2, b0 + b2, a1 + a3, b1 + b3]
    t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));  // lane i: [sa, sb, sa, sb]
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, t));
}

// v[r]: sixteen int32 partial sums of row r. Returns [sum row 0 .. sum row 7].
inline __m256i reduce_rows_8x16(const __m512i v[8]) {
    auto pair32 = [](__m512i a, __m512i b) {
        return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    };
    const __m512i p01 = pair32(v[0], v[1]), p23 = pair32(v[2], v[3]);
    const __m512i p45 = pair32(v[4], v[5]), p67 = pair32(v[6], v[7]);
    // Each 128-bit lane of r03 holds one partial of rows 0..3 (r47: rows 4..7).
    const __m512i r03 = _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
    const __m512i r47 = _mm512_add_epi32(_mm512_unpacklo_epi64(p45, p67), _mm512_unpackhi_epi64(p45, p67));
    const __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(r03, r47, _MM_SHUFFLE(1, 0, 1, 0)),
                                       _mm512_shuffle_i64x2(r03, r47, _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512i t = _mm512_add_epi32(s, _mm512_shuffle_i64x2(s, s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm512_castsi512_si256(_mm512_shuffle_i64x2(t, t, _MM_SHUFFLE(0, 0, 2, 0)));
}

// 8 half-precision values at byte offset `off` of each tile row's block (rows `row_off` bytes from `base`),
// taken from the low (or high) 16 bits of a 32-bit gather that stays inside the block.
inline __m256 gather_halves(const uint8_t *base, __m256i row_off, bool high) {
    __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int *>(base), row_off, 1);
    if (high) v = _mm256_srli_epi32(v, 16);
    return _mm256_cvtph_ps(_mm256_cvtepi32_epi16(v));
}

inline float half_to_float(uint16_t h) {
    return _cvtsh_ss(h);
}

// The tile skeleton shared by every type. `block(b, rows, row_off)` returns block (or super-block) b's
// contribution for the 8 rows as floats, computed with the reference's expression; it is added into lane
// b % 8. Rows past n_rows repeat the last row and are not stored.
template <typename Block>
inline void gemv_tiles(int64_t nb, const uint8_t *w, size_t w_stride, float *y, int64_t n_rows, Block block) {
    for (int64_t r0 = 0; r0 < n_rows; r0 += kTileRows) {
        const int64_t n_valid = n_rows - r0 < kTileRows ? n_rows - r0 : kTileRows;
        const uint8_t *rows[kTileRows];
        alignas(32) int32_t off[kTileRows];
        for (int r = 0; r < kTileRows; ++r) {
            const int64_t rr = r < n_valid ? r : n_valid - 1;
            rows[r] = w + static_cast<size_t>(r0 + rr) * w_stride;
            off[r] = static_cast<int32_t>(static_cast<size_t>(rr) * w_stride);
        }
        const __m256i row_off = _mm256_load_si256(reinterpret_cast<const __m256i *>(off));
        // The 8 rows are read as 8 interleaved short streams, which the hardware prefetchers hardly learn;
        // the next tile (contiguous memory) is prefetched while this one is computed, a slice per block.
        // Into L2 (hint T1): prefetching into L1 evicts the lines of the current tile before they are used.
        const int64_t next_end = n_rows < r0 + 2 * kTileRows ? n_rows : r0 + 2 * kTileRows;
        const uint8_t *pf = w + static_cast<size_t>(r0 + kTileRows) * w_stride;
        const uint8_t *pf_end = next_end > r0 + kTileRows ? w + static_cast<size_t>(next_end) * w_stride : pf;
        const size_t pf_step = (static_cast<size_t>(pf_end - pf) + static_cast<size_t>(nb) - 1) / nb;
        auto prefetch_slice = [&] {
            const uint8_t *stop = pf + pf_step < pf_end ? pf + pf_step : pf_end;
            for (; pf < stop; pf += 64) _mm_prefetch(reinterpret_cast<const char *>(pf), _MM_HINT_T1);
        };
        __m256 lanes[kDotLanes];
        for (auto &l : lanes) l = _mm256_setzero_ps();
        int64_t b = 0;
        for (; b + kDotLanes <= nb; b += kDotLanes) {
#pragma GCC unroll 8
            for (int k = 0; k < kDotLanes; ++k) {
                prefetch_slice();
                lanes[k] = _mm256_add_ps(lanes[k], block(b + k, rows, row_off));
            }
        }
        for (int k = 0; b < nb; ++b, ++k) {
            prefetch_slice();
            lanes[k] = _mm256_add_ps(lanes[k], block(b, rows, row_off));
        }
        const __m256 sum = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(lanes[0], lanes[4]), _mm256_add_ps(lanes[2], lanes[6])),
            _mm256_add_ps(_mm256_add_ps(lanes[1], lanes[5]), _mm256_add_ps(lanes[3], lanes[7])));
        _mm256_mask_storeu_ps(y + r0, static_cast<__mmask8>((1u << n_valid) - 1), sum);
    }
}

// The gather offsets are int32: a tile spans 8 rows.
inline bool tile_offsets_fit(size_t w_stride) {
    return w_stride <= static_cast<size_t>(INT32_MAX) / kTileRows;
}

// q4_0, q5_0, q4_1 and q5_1: four rows per zmm (one 128-bit quarter each, 16 bytes of qs: low nibbles are
// elements 0..15, high nibbles 16..31). The 5-bit types add 16 where bit e of the row's qh is set, through
// byte masks. q4_0 and q5_0 take their offset (8, 16) out through the activation sums; q4_1 and q5_1 (q8_1
// activations) add mx * sy per block instead.
template <typename BlockX>
void gemv_4_5_bit_one(int64_t n, const uint8_t *w, size_t w_stride, const void *vx, float *y,
                      int64_t n_rows) {
    constexpr bool kFifthBit = kBlockHasQh<BlockX>;
    constexpr bool kMin = kBlockHasMin<BlockX>;
    using BlockY = std::conditional_t<kMin, BlockQ8_1, BlockQ8_0>;
    const auto *x = static_cast<const BlockY *>(vx);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i offset = _mm512_set1_epi8(kMin ? 0 : (kFifthBit ? 16 : 8));
    gemv_tiles(n / kQK, w, w_stride, y, n_rows, [&](int64_t b, const uint8_t *const *rows, __m256i row_off) {
        const BlockY &yb = x[b];
        const __m512i ylo = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(yb.qs)));
        const __m512i yhi =
            _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i *>(yb.qs + 16)));
        // -offset * sum y, spread over the four lanes of each row.
        const __m512i init =
            kMin ? _mm512_setzero_si512()
                 : _mm512_sub_epi32(
                       _mm512_setzero_si512(),
                       _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), offset, ylo), offset,
                                           yhi));
        const size_t block_at = static_cast<size_t>(b) * sizeof(BlockX);
        const size_t at = block_at + offsetof(BlockX, qs);
        auto load4 = [&](int r) {
            __m512i v =
                _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i *>(rows[r] + at)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i *>(rows[r + 1] + at)),
                                   1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i *>(rows[r + 2] + at)),
                                   2);
            return _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i *>(rows[r + 3] + at)),
                                      3);
        };
        auto dot4 = [&](int r) {
            const __m512i q = load4(r);
            __m512i lo = _mm512_and_si512(q, m4);
            __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
            if constexpr (kFifthBit) {
                // Byte j of quarter i: bit j (low nibbles) or 16 + j (high) of row r + i's qh.
                uint64_t lo_bits = 0, hi_bits = 0;
                for (int i = 0; i < 4; ++i) {
                    uint32_t qh;
                    std::memcpy(&qh, rows[r + i] + block_at + offsetof(BlockX, qh), sizeof qh);
                    lo_bits |= static_cast<uint64_t>(qh & 0xFFFFu) << (16 * i);
                    hi_bits |= static_cast<uint64_t>(qh >> 16) << (16 * i);
                }
                const __m512i sixteen = _mm512_set1_epi8(16);
                lo = _mm512_mask_add_epi8(lo, static_cast<__mmask64>(lo_bits), lo, sixteen);
                hi = _mm512_mask_add_epi8(hi, static_cast<__mmask64>(hi_bits), hi, sixteen);
            }
            return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(init, lo, ylo), hi, yhi);
        };
        const __m256i sumi = reduce_rows_4x4(dot4(0), dot4(4));
        const __m256 dx = gather_halves(rows[0] + block_at, row_off, false);
        const __m256 scale = _mm256_mul_ps(dx, _mm256_set1_ps(half_to_float(yb.d)));
        const __m256 v = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(sumi));
        if constexpr (kMin) {
            // m follows d in the block: the high half of the same 32-bit gather.
            const __m256 mx = gather_halves(rows[0] + block_at, row_off, true);
            return _mm256_add_ps(v, _mm256_mul_ps(mx, _mm256_set1_ps(half_to_float(yb.s))));
        } else {
            return v;
        }
    });
}

// q4_k and q5_k (the same scales, mins and nibbles; q5_k adds a fifth bit: element 32j + l takes bit j of
// qh[l], added as 16 to its level).
template <typename Block>
void gemv_q4_q5_k_one(int64_t n, const uint8_t *w, size_t w_stride, const BlockQ8_K *x, float *y,
                      int64_t n_rows) {
    constexpr bool kFifth = kBlockHasQh<Block>;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    // Word i of the scale vector for run pair c: scale of run 2c (i < 16) or 2c + 1.
    __m512i sc_idx[4];
    for (int c = 0; c < 4; ++c)
        sc_idx[c] = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<short>(2 * c)),
                                            _mm512_set1_epi16(static_cast<short>(2 * c + 1)));
    gemv_tiles(
        n / kQK_K, w, w_stride, y, n_rows, [&](int64_t b, const uint8_t *const *rows, __m256i row_off) {
            const BlockQ8_K &yb = x[b];
            __m512i yq[4];
            for (int c = 0; c < 4; ++c) yq[c] = _mm512_loadu_si512(yb.qs + 64 * c);
            // Sums of the 32-element runs: bsums pairs, as int16 (|sum| <= 32 * 127).
            const __m256i pair32 = _mm256_madd_epi16(
                _mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb.bsums)), _mm256_set1_epi16(1));
            const __m128i pair16 =
                _mm_packs_epi32(_mm256_castsi256_si128(pair32), _mm256_extracti128_si256(pair32, 1));
            const size_t at = static_cast<size_t>(b) * sizeof(Block);
            __m512i acc[kTileRows];
            __m128i msum[kTileRows];
#pragma GCC unroll 8
            for (int r = 0; r < kTileRows; ++r) {
                const Block *xb = reinterpret_cast<const Block *>(rows[r] + at);
                uint64_t sc, mn;
                q4_k_scales(xb->scales, &sc, &mn);
                const __m512i sc16 =
                    _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(sc))));
                msum[r] =
                    _mm_madd_epi16(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<long long>(mn))), pair16);
                __m512i a = _mm512_setzero_si512();
                for (int c = 0; c < 4; ++c) {
                    // [low nibbles (run 2c) | high nibbles (run 2c + 1)] of the 32 bytes of pair c.
                    const __m512i raw = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xb->qs + 32 * c)));
                    __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(raw, 0xFFFF0000u, raw, 4), m4);
                    if constexpr (kFifth) {
                        // Bit 2c of qh[l] for run 2c (low half), bit 2c + 1 for run 2c + 1, moved to bit 4.
                        const __m512i hq = _mm512_broadcast_i64x4(
                            _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xb->qh)));
                        const __m512i h =
                            _mm512_mask_srli_epi16(_mm512_srli_epi16(hq, 2 * c), 0xFFFF0000u, hq, 2 * c + 1);
                        q = _mm512_or_si512(q,
                                            _mm512_slli_epi16(_mm512_and_si512(h, _mm512_set1_epi8(1)), 4));
                    }
                    const __m512i p = _mm512_maddubs_epi16(q, yq[c]);  // pairs <= 2 * 31 * 127
                    a = _mm512_dpwssd_epi32(a, p, _mm512_permutexvar_epi16(sc_idx[c], sc16));
                }
                acc[r] = a;
            }
            const __m256i sumi = reduce_rows_8x16(acc);
            __m512i ma = _mm512_castsi128_si512(msum[0]);
            __m512i mb = _mm512_castsi128_si512(msum[4]);
            // The lane index must be an immediate (clang insists even where the loop would unroll).
            ma = _mm512_inserti32x4(ma, msum[1], 1);
            ma = _mm512_inserti32x4(ma, msum[2], 2);
            ma = _mm512_inserti32x4(ma, msum[3], 3);
            mb = _mm512_inserti32x4(mb, msum[5], 1);
            mb = _mm512_inserti32x4(mb, msum[6], 2);
            mb = _mm512_inserti32x4(mb, msum[7], 3);
            const __m256i summ = reduce_rows_4x4(ma, mb);
            const uint8_t *base = rows[0] + at;
            const __m256 yd = _mm256_set1_ps(yb.d);
            const __m256 dall = _mm256_mul_ps(gather_halves(base, row_off, false), yd);
            const __m256 dmin = _mm256_mul_ps(gather_halves(base, row_off, true), yd);
            return _mm256_sub_ps(_mm256_mul_ps(dall, _mm256_cvtepi32_ps(sumi)),
                                 _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(summ)));
        });
}

void gemv_q6_k_one(int64_t n, const uint8_t *w, size_t w_stride, const BlockQ8_K *x, float *y,
                   int64_t n_rows) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i m30 = _mm512_set1_epi8(0x30);
    // High 2 bits to bits 4..5: runs k = 0, 1 shift qh left by 4, 2 (lower / upper half); k = 2, 3 shift it
    // right by 0, 2.
    const __m512i shl01 = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(4), _mm512_set1_epi16(2));
    const __m512i shr23 = _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(0), _mm512_set1_epi16(2));
    // Word i of the scale vector for groups g0 .. g0 + 3: scale g0 + i / 8.
    __m512i sc_idx[4];
    for (int j = 0; j < 4; ++j) {
        alignas(64) int16_t idx[32];
        for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(4 * j + i / 8);
        sc_idx[j] = _mm512_load_si512(idx);
    }
    gemv_tiles(
        n / kQK_K, w, w_stride, y, n_rows, [&](int64_t b, const uint8_t *const *rows, __m256i row_off) {
            const BlockQ8_K &yb = x[b];
            __m512i yq[4];
            for (int c = 0; c < 4; ++c) yq[c] = _mm512_loadu_si512(yb.qs + 64 * c);
            const __m512i bsums =
                _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb.bsums)));
            const size_t at = static_cast<size_t>(b) * sizeof(BlockQ6_K);
            __m512i acc[kTileRows];
#pragma GCC unroll 8
            for (int r = 0; r < kTileRows; ++r) {
                const BlockQ6_K *xb = reinterpret_cast<const BlockQ6_K *>(rows[r] + at);
                const __m256i sc16 =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i *>(xb->scales)));
                const __m512i scz = _mm512_castsi256_si512(sc16);
                // Levels are 0..63; - 32 sum_g scale_g bsum_g takes the offset out (|32 scale| <= 4096).
                __m512i a = _mm512_dpwssd_epi32(_mm512_setzero_si512(),
                                                _mm512_zextsi256_si512(_mm256_sub_epi16(
                                                    _mm256_setzero_si256(), _mm256_slli_epi16(sc16, 5))),
                                                bsums);
                for (int c = 0; c < 2; ++c) {
                    const __m512i ql = _mm512_loadu_si512(xb->ql + 64 * c);  // [ql0 | ql1]
                    const __m512i qh = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xb->qh + 32 * c)));
                    const __m512i q01 = _mm512_or_si512(_mm512_and_si512(ql, m4),
                                                        _mm512_and_si512(_mm512_sllv_epi16(qh, shl01), m30));
                    const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                        _mm512_and_si512(_mm512_srlv_epi16(qh, shr23), m30));
                    // pairs <= 2 * 63 * 127
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(q01, yq[2 * c]),
                                            _mm512_permutexvar_epi16(sc_idx[2 * c], scz));
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(q23, yq[2 * c + 1]),
                                            _mm512_permutexvar_epi16(sc_idx[2 * c + 1], scz));
                }
                acc[r] = a;
            }
            const __m256i sumi = reduce_rows_8x16(acc);
            // d sits in the last 2 bytes of the block: gather the 4 bytes ending there.
            const __m256 d = gather_halves(rows[0] + at + sizeof(BlockQ6_K) - 4, row_off, true);
            const __m256 dall = _mm256_mul_ps(d, _mm256_set1_ps(yb.d));
            return _mm256_mul_ps(dall, _mm256_cvtepi32_ps(sumi));
        });
}

// q2_k and q3_k: 2-bit crumbs, element 128c + 32k + l at bits 2k of qs[32c + l], in groups of 16 with a scale
// each. q2_k: scale and min are the low and high nibble of scales[g]; q3_k: 6-bit scales (s - 32, signed) and
// a third bit (4) where bit 4c + k of hmask[l] is set, the level offset 4 taken out through the bsums.
//
// All 64 bytes of qs are one vector: crumb k of it holds elements [32k, 32k + 32) and [128 + 32k, 160 + 32k),
// one scale group per 128-bit lane, met by an activation vector built once per super-block for all 8 rows.
// The group scales become words through pshufb from the 16 scale bytes in every lane: q2_k's in the low byte
// (0..15); q3_k's signed s - 32 in the high byte, so the dot products are 256 times too large and shifted
// back after the row sums. That is exact: |sum| <= 256 * 7 * 32 * 127 * 256 < 2^31, and int32 adds wrap.
template <typename Block>
void gemv_q2_q3_k_one(int64_t n, const uint8_t *w, size_t w_stride, const BlockQ8_K *x, float *y,
                      int64_t n_rows) {
    constexpr bool kQ3 = std::is_same_v<Block, BlockQ3_K>;
    const __m512i m3 = _mm512_set1_epi8(3);
    __m512i sc_shuf[4];  // crumb k: lane L takes group 2k + L (L < 2) or 8 + 2k + L - 2
    __m512i hbit[4];     // q3_k, crumb k: hmask bit k (chunk 0, lower half), 4 + k (chunk 1, upper half)
    for (int k = 0; k < 4; ++k) {
        alignas(64) uint8_t idx[64], bits[64];
        for (int i = 0; i < 64; ++i) {
            const int lane = i / 16;
            const int g = lane < 2 ? 2 * k + lane : 8 + 2 * k + lane - 2;
            const bool low_byte = i % 2 == 0;
            idx[i] = (low_byte != kQ3) ? static_cast<uint8_t>(g) : 0x80;
            bits[i] = static_cast<uint8_t>(1 << (i < 32 ? k : 4 + k));
        }
        sc_shuf[k] = _mm512_load_si512(idx);
        hbit[k] = _mm512_load_si512(bits);
    }
    gemv_tiles(
        n / kQK_K, w, w_stride, y, n_rows, [&](int64_t b, const uint8_t *const *rows, __m256i row_off) {
            const BlockQ8_K &yb = x[b];
            __m512i yq[4];
            for (int k = 0; k < 4; ++k)
                yq[k] = _mm512_inserti64x4(
                    _mm512_castsi256_si512(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb.qs + 32 * k))),
                    _mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb.qs + 128 + 32 * k)), 1);
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(yb.bsums));
            const size_t at = static_cast<size_t>(b) * sizeof(Block);
            __m512i acc[kTileRows];
            __m128i bsum_dot[kTileRows];  // q2_k: sum_g min_g bsum_g; q3_k: -4 sum_g (s_g - 32) bsum_g
#pragma GCC unroll 8
            for (int r = 0; r < kTileRows; ++r) {
                const Block *xb = reinterpret_cast<const Block *>(rows[r] + at);
                __m128i sc8;   // group scales as bytes
                __m256i bw16;  // the words that meet bsums
                if constexpr (kQ3) {
                    uint64_t lo8, hi8;
                    q3_k_scales(xb->scales, &lo8, &hi8);
                    sc8 =
                        _mm_sub_epi8(_mm_set_epi64x(static_cast<long long>(hi8), static_cast<long long>(lo8)),
                                     _mm_set1_epi8(32));
                    bw16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), 2);  // |4 (s - 32)| <= 128
                } else {
                    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i *>(xb->scales));
                    sc8 = _mm_and_si128(s, _mm_set1_epi8(0x0F));
                    bw16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(0x0F)));
                }
                const __m256i m = _mm256_madd_epi16(bw16, bsums);
                bsum_dot[r] = _mm_add_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
                const __m512i sc = _mm512_broadcast_i32x4(sc8);
                const __m512i q = _mm512_loadu_si512(xb->qs);
                __m512i hm;
                if constexpr (kQ3)
                    hm = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256(reinterpret_cast<const __m256i *>(xb->hmask)));
                __m512i a = _mm512_setzero_si512();
                for (int k = 0; k < 4; ++k) {
                    __m512i c = _mm512_and_si512(k == 0 ? q : _mm512_srli_epi16(q, 2 * k), m3);
                    if constexpr (kQ3)
                        c = _mm512_mask_add_epi8(c, _mm512_test_epi8_mask(hm, hbit[k]), c,
                                                 _mm512_set1_epi8(4));
                    // pairs <= 2 * 7 * 127
                    a = _mm512_dpwssd_epi32(a, _mm512_maddubs_epi16(c, yq[k]),
                                            _mm512_shuffle_epi8(sc, sc_shuf[k]));
                }
                acc[r] = a;
            }
            __m256i sumi = reduce_rows_8x16(acc);
            __m512i ba = _mm512_castsi128_si512(bsum_dot[0]);
            __m512i bb = _mm512_castsi128_si512(bsum_dot[4]);
            ba = _mm512_inserti32x4(ba, bsum_dot[1], 1);  // immediates, as above
            ba = _mm512_inserti32x4(ba, bsum_dot[2], 2);
            ba = _mm512_inserti32x4(ba, bsum_dot[3], 3);
            bb = _mm512_inserti32x4(bb, bsum_dot[5], 1);
            bb = _mm512_inserti32x4(bb, bsum_dot[6], 2);
            bb = _mm512_inserti32x4(bb, bsum_dot[7], 3);
            const __m256i bdot = reduce_rows_4x4(ba, bb);
            const __m256 yd = _mm256_set1_ps(yb.d);
            if constexpr (kQ3) {
                sumi = _mm256_sub_epi32(_mm256_srai_epi32(sumi, 8), bdot);
                // d sits in the last 2 bytes of the block: gather the 4 bytes ending there.
                const __m256 d = gather_halves(rows[0] + at + sizeof(Block) - 4, row_off, true);
                return _mm256_mul_ps(_mm256_mul_ps(d, yd), _mm256_cvtepi32_ps(sumi));
            } else {
                const uint8_t *dd = rows[0] + at + offsetof(Block, d);  // d, then dmin
                const __m256 dall = _mm256_mul_ps(gather_halves(dd, row_off, false), yd);
                const __m256 dmin = _mm256_mul_ps(gather_halves(dd, row_off, true), yd);
                return _mm256_sub_ps(_mm256_mul_ps(dall, _mm256_cvtepi32_ps(sumi)),
                                     _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(bdot)));
            }
        });
}

// Runs `one` per token; falls back to `vec_dot` per row when the tile's gather offsets would not fit int32.
template <typename BY, typename One>
void gemv_tokens(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                 int64_t y_stride, int64_t n_rows, int64_t n_tokens, One one,
                 void (*vec_dot)(int64_t, float *, const void *, const void *)) {
    const uint8_t *wb = static_cast<const uint8_t *>(w);
    for (int64_t t = 0; t < n_tokens; ++t) {
        const uint8_t *xt = static_cast<const uint8_t *>(x) + static_cast<size_t>(t) * x_stride;
        float *yt = y + t * y_stride;  // [n_rows]
        if (!tile_offsets_fit(w_stride)) {
            for (int64_t r = 0; r < n_rows; ++r)
                vec_dot(n, &yt[r], wb + static_cast<size_t>(r) * w_stride, xt);
            continue;
        }
        one(n, wb, w_stride, reinterpret_cast<const BY *>(xt), yt, n_rows);
    }
}

}  // namespace

void gemv_q4_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_4_5_bit_one<BlockQ4_0>, avx2::vec_dot_q4_0_q8_0);
}

void gemv_q5_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_4_5_bit_one<BlockQ5_0>, avx2::vec_dot_q5_0_q8_0);
}

void gemv_q4_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_1>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_4_5_bit_one<BlockQ4_1>, avx2::vec_dot_q4_1_q8_1);
}

void gemv_q5_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_1>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_4_5_bit_one<BlockQ5_1>, avx2::vec_dot_q5_1_q8_1);
}

void gemv_q2_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_K>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_q2_q3_k_one<BlockQ2_K>, avx2::vec_dot_q2_k_q8_k);
}

void gemv_q3_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_K>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_q2_q3_k_one<BlockQ3_K>, avx2::vec_dot_q3_k_q8_k);
}

void gemv_q4_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_K>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_q4_q5_k_one<BlockQ4_K>, avx2::vec_dot_q4_k_q8_k);
}

void gemv_q5_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_K>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens,
                           gemv_q4_q5_k_one<BlockQ5_K>, avx2::vec_dot_q5_k_q8_k);
}

void gemv_q6_k_q8_k(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    gemv_tokens<BlockQ8_K>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens, gemv_q6_k_one,
                           avx2::vec_dot_q6_k_q8_k);
}

}  // namespace td::kernels::avx512
