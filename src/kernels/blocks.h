// ggml's block layouts for the 32-element quant types, byte for byte (these bytes are what GGUF files hold),
// and the accumulation order every ISA's block dot product follows.
//
// Shared by the reference and the ISA files. Everything here is a plain struct or has internal linkage
// (static inline): an ISA file is compiled with -mavx2 etc., and an inline function with external linkage
// compiled there could be the copy the linker keeps for the whole program, which would then crash on a CPU
// without that ISA.
#pragma once

#include <cstdint>

namespace td::kernels {

constexpr int kQK = 32;  // elements per block, for every type in this file

// All scales (d, m, s) are IEEE half (tensor/fp16.h). Element j of a block is called x[j], 0 <= j < 32.

// q4_0: x[j] = d * (q[j] - 8), q in 0..15.
// Byte j of qs holds q[j] in its low nibble and q[j + 16] in its high nibble.
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kQK / 2];
};

// q4_1: x[j] = d * q[j] + m, q in 0..15, nibbles as q4_0.
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[kQK / 2];
};

// q5_0: x[j] = d * (q[j] - 16), q in 0..31. The low 4 bits are stored as q4_0's nibbles; bit 4 of q[j] is
// bit j of qh read as a little-endian uint32.
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};

// q5_1: x[j] = d * q[j] + m, q in 0..31, bits as q5_0.
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};

// q8_0: x[j] = d * q[j], q in -127..127 (as written by the quantizer; -128 is never produced).
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQK];
};

// q8_1: as q8_0 plus s = d * sum_j q[j], which folds q4_1/q5_1's offset m into one product per block.
struct BlockQ8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[kQK];
};

static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
              sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36);

// What the 4- and 5-bit kernels branch on at compile time: a minimum (q4_1, q5_1: x = d q + m, paired with
// q8_1 activations whose s adds mx * sy per block) and fifth bits in qh (q5_0, q5_1, q5_k).
template <typename Block>
constexpr bool kBlockHasMin = requires(const Block &b) {
    b.m;
};
template <typename Block>
constexpr bool kBlockHasQh = requires(const Block &b) {
    b.qh;
};

// Block dot products: the integer sum of block b is exact (int32); its scaled value is added into lane
// b % kDotLanes of a float accumulator, and the lanes are added in the fixed tree below at the end. A SIMD
// version keeps one vector lane per accumulator lane, so every ISA returns bit-identical results.
constexpr int kDotLanes = 8;

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): what folding an 8-float vector in halves gives.
static inline float dot_lanes_sum(const float *acc) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// ---- K-quants: super-blocks of 256 elements (ggml's block_q2_K .. block_q8_K, ggml-common.h)
// ---------------- Element e of a super-block is e = 0..255. "Chunk" c is a run of 128 (q2_k, q3_k, q6_k) or
// 64 (q4_k, q5_k) elements that share one stretch of qs. d, dmin are IEEE half except q8_k's d (f32).
constexpr int kQK_K = 256;

// q2_k: x[e] = d * (sc & 15) * q - dmin * (sc >> 4), sc = scales[e / 16], q in 0..3 at bits 2k..2k+1 of
// qs[32 c + l] for e = 128 c + 32 k + l.
struct BlockQ2_K {
    uint8_t scales[kQK_K / 16];
    uint8_t qs[kQK_K / 4];
    uint16_t d;
    uint16_t dmin;
};

// q3_k: x[e] = d * (s - 32) * (q - 4), q = low 2 bits as q2_k plus 4 * (bit e / 32 of hmask[e % 32]);
// s = 6-bit scale of group e / 16: low 4 bits from scales[g] (g < 8) or scales[g - 8] >> 4, high 2 bits at
// bits 2 (g / 4) of scales[8 + g % 4].
struct BlockQ3_K {
    uint8_t hmask[kQK_K / 8];
    uint8_t qs[kQK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};

// q3_k's 16 six-bit scales s (0..63, before the - 32) as bytes: byte g of *lo8 is group g (g < 8), byte g of
// *hi8 group 8 + g. Integer code only, for the SIMD kernels, which load the two words into a vector.
static inline void q3_k_scales(const uint8_t *scales, uint64_t *lo8, uint64_t *hi8) {
    uint64_t low = 0;
    uint32_t high = 0;
    for (int i = 0; i < 8; ++i) low |= static_cast<uint64_t>(scales[i]) << (8 * i);
    for (int i = 0; i < 4; ++i) high |= static_cast<uint32_t>(scales[8 + i]) << (8 * i);
    constexpr uint64_t kNibbles = 0x0F0F0F0F0F0F0F0Full;
    constexpr uint32_t kCrumbs = 0x03030303u;
    // Byte j of `high` holds the top bits of groups j, 4 + j, 8 + j, 12 + j at bits 0, 2, 4, 6.
    const uint64_t top_lo = (high & kCrumbs) | (static_cast<uint64_t>((high >> 2) & kCrumbs) << 32);
    const uint64_t top_hi = ((high >> 4) & kCrumbs) | (static_cast<uint64_t>((high >> 6) & kCrumbs) << 32);
    *lo8 = (low & kNibbles) | (top_lo << 4);
    *hi8 = ((low >> 4) & kNibbles) | (top_hi << 4);
}

// q4_k / q5_k's eight 6-bit scales and mins (get_scale_min_k4) as bytes: byte j of *sc is sc[j], of *mn m[j].
static inline void q4_k_scales(const uint8_t *scales, uint64_t *sc, uint64_t *mn) {
    uint32_t u[3] = {};
    for (int i = 0; i < 12; ++i) u[i / 4] |= static_cast<uint32_t>(scales[i]) << (8 * (i % 4));
    const uint32_t sc_hi = (u[2] & 0x0F0F0F0Fu) | ((u[0] >> 2) & 0x30303030u);
    const uint32_t mn_hi = ((u[2] >> 4) & 0x0F0F0F0Fu) | ((u[1] >> 2) & 0x30303030u);
    *sc = (u[0] & 0x3F3F3F3Fu) | (static_cast<uint64_t>(sc_hi) << 32);
    *mn = (u[1] & 0x3F3F3F3Fu) | (static_cast<uint64_t>(mn_hi) << 32);
}

// q4_k: x[e] = d * sc[j] * q - dmin * m[j], j = e / 32 (6-bit sc, m packed in scales, get_scale_min_k4);
// q = low nibble of qs[32 (j / 2) + e % 32] for even j, high nibble for odd j.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qs[kQK_K / 2];
};

// q5_k: as q4_k with q += 16 * (bit j of qh[e % 32]).
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[kQK_K / 8];
    uint8_t qs[kQK_K / 2];
};

// q6_k: x[e] = d * scales[e / 16] * (q - 32), e = 128 c + 32 k + l: low 4 bits from ql[64 c + 32 (k & 1) + l]
// (low nibble for k < 2, high for k >= 2), high 2 bits at bits 2k of qh[32 c + l].
struct BlockQ6_K {
    uint8_t ql[kQK_K / 2];
    uint8_t qh[kQK_K / 4];
    int8_t scales[kQK_K / 16];
    uint16_t d;
};

// q8_k (activations): x[e] = d * qs[e], qs in -127..127; bsums[g] = sum of qs[16 g .. 16 g + 15].
struct BlockQ8_K {
    float d;
    int8_t qs[kQK_K];
    int16_t bsums[kQK_K / 16];
};

static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
              sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292);

// K-quant dot products use the same lane scheme per super-block: each super-block's integer sums are exact
// int32, its float value is formed by one fixed expression (kquants-ref.h) and added into lane b % kDotLanes.

}  // namespace td::kernels
