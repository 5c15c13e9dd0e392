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

// Block dot products: the integer sum of block b is exact (int32); its scaled value is added into lane
// b % kDotLanes of a float accumulator, and the lanes are added in the fixed tree below at the end. A SIMD
// version keeps one vector lane per accumulator lane, so every ISA returns bit-identical results.
constexpr int kDotLanes = 8;

// ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)): what folding an 8-float vector in halves gives.
static inline float dot_lanes_sum(const float *acc) {
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace td::kernels
