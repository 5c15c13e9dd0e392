// The packed weight layout: the same quantized blocks as the GGUF rows, regrouped so a SIMD register holds
// one 4-byte slice of 16 different rows. A matrix-vector kernel on this layout reads one linear stream and
// needs no horizontal sums: 32-bit lane i of every product belongs to row i of the group.
//
// q4_0, groups of kPackRows = 16 rows (n_rows must be a multiple of 16). Group g holds rows 16g..16g+15 in
// 16 * row_bytes bytes starting at byte 16g * row_bytes (so row r's group starts where row r would), block
// after block. Block b of a group is 16 * 18 = 288 bytes:
//
//   +---------------------------+--------------------+--------------------+-----+--------------------+
//   | d of rows 0..15 (16 x f16)| qs[0..3] of rows    | qs[4..7] of rows   | ... | qs[12..15] of rows |
//   |          32 bytes         | 0..15 (16 x 4 B)    | 0..15 (16 x 4 B)   |     | 0..15 (16 x 4 B)   |
//   +---------------------------+--------------------+--------------------+-----+--------------------+
//
// Byte j of a row's qs holds element j (low nibble) and element j + 16 (high nibble), as in BlockQ4_0.
//
// q5_0, the same 16-row groups; block b of a group is 16 * 22 = 352 bytes: [0, 32) d of rows 0..15, [32, 96)
// qh of rows 0..15 (4 bytes each: bit e is element e's fifth bit), then qs as q4_0's, 64 bytes per 4-byte
// slice at 96 + 64k. q4_1 (320 bytes) and q5_1 (384): d, then the 16 m (32 bytes), then (q5_1) qh, then qs.
//
// q8_0, the same 16-row groups; block b of a group is 16 * 34 = 544 bytes: [0, 32) d of rows 0..15, then
// for k < 8, 64 bytes at 32 + 64k: qs[4k..4k+3] of each row (signed, as in BlockQ8_0).
//
// q4_k, the same 16-row groups; super-block b of a group is 16 * 144 = 2304 bytes:
//   [0, 32) d of rows 0..15 | [32, 64) dmin | [64, 256) scales: bytes 4w..4w+3 of each row, w = 0..2
//   (64 bytes per w) | [256, 2304) qs: bytes 32c + 4k .. + 3 of each row, for chunk c < 4 and slice k < 8
//   (64 bytes per (c, k); low nibbles are elements 64c + 4k.., high nibbles 64c + 32 + 4k..).
// q5_k, super-block b of a group is 16 * 176 = 2816 bytes: as q4_k's, with [256, 768) qh: bytes 4k..4k+3 of
//   each row, k < 8 (64 bytes per k), and qs at [768, 2816).
//
// q6_k, super-block b of a group is 16 * 210 = 3360 bytes:
//   [0, 32) d | [32, 288) scales: bytes 4w..4w+3 of each row, w < 4 | [288, 3360) for half h < 2 and slice
//   k < 8, 192 bytes at 288 + 192 (8h + k): ql bytes 64h + 4k.., ql bytes 64h + 32 + 4k.., qh bytes 32h +
//   4k.. of each row (64 bytes each), in the order the kernel reads them.
// Packing moves bytes and never changes one, so matmul on a packed matrix equals matmul on the rows bit for
// bit.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace td::kernels {

constexpr int64_t kPackRows = 16;

// Whether a [n_rows rows of n] matrix of `type` has a packed layout (q4_0, q4_1, q5_0, q5_1, q8_0, q4_k,
// q5_k or q6_k, n_rows a multiple of 16).
bool packable(DType type, int64_t n, int64_t n_rows);
// Whether the active ISA has a kernel for packed `type` (matmul otherwise unpacks chunks of rows first, which
// is correct but slower than the rows): worth packing.
bool pack_pays(DType type);
// Packs rows [0, n_rows) of `src` (row-major, dtype_row_bytes(type, n) bytes per row) into `dst` (the same
// size). Requires packable(type, n, n_rows).
void pack_rows(DType type, const void *src, int64_t n, int64_t n_rows, void *dst);
// The inverse for rows [row_begin, row_begin + n_rows) of a packed matrix (row_begin and n_rows multiples
// of kPackRows): writes them row-major to `dst`. `packed` points at the matrix's first byte.
void unpack_rows(DType type, const void *packed, int64_t n, int64_t row_begin, int64_t n_rows, void *dst);

}  // namespace td::kernels
