#include "kernels/pack.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/blocks.h"

namespace td::kernels {
namespace {

// A packed layout is a list of slices: bytes [src, src + size) of each row's block go to byte
// dst + r * size of the group's block, for rows r < 16. Every byte of a block is in exactly one slice.
struct Slice {
    uint16_t src, size, dst;
};

// Every slice is 2 or 4 bytes: fixed-size copies compile to one load and one store each, where a call to
// memcpy per slice cost a tenth of a batch's time on the unpacking path.
inline void copy_slice(uint8_t *to, const uint8_t *from, uint16_t size) {
    if (size == 4) {
        std::memcpy(to, from, 4);
    } else if (size == 2) {
        std::memcpy(to, from, 2);
    } else {
        std::memcpy(to, from, size);
    }
}

struct Layout {
    size_t block_bytes = 0;   // of one row's block
    int64_t block_elems = 0;  // elements per block
    std::vector<Slice> slices;
};

// q4_0 and q8_0: d, then the quants in 4-byte slices, 64 bytes (16 rows) each: 4 slices for q4_0's 16 bytes,
// 8 for q8_0's 32.
Layout make_x_0(size_t block_bytes) {
    Layout l{block_bytes, kQK, {}};
    l.slices.push_back({0, 2, 0});  // d
    for (uint16_t k = 0; k < (block_bytes - 2) / 4; ++k)
        l.slices.push_back({static_cast<uint16_t>(2 + 4 * k), 4, static_cast<uint16_t>(32 + 64 * k)});
    return l;
}

// q4_1, q5_0, q5_1: the 16 rows' d, then (q4_1, q5_1) their m, then (q5_0, q5_1) their qh as one 4-byte slice
// each, then qs as q4_0's.
template <typename Block>
Layout make_4_5_bit() {
    Layout l{sizeof(Block), kQK, {}};
    auto u16 = [](size_t v) { return static_cast<uint16_t>(v); };
    size_t at = 0;
    l.slices.push_back({u16(offsetof(Block, d)), 2, u16(at)});
    at += 2 * kPackRows;
    if constexpr (kBlockHasMin<Block>) {
        l.slices.push_back({u16(offsetof(Block, m)), 2, u16(at)});
        at += 2 * kPackRows;
    }
    if constexpr (kBlockHasQh<Block>) {
        l.slices.push_back({u16(offsetof(Block, qh)), 4, u16(at)});
        at += 4 * kPackRows;
    }
    for (size_t k = 0; k < 4; ++k)
        l.slices.push_back({u16(offsetof(Block, qs) + 4 * k), 4, u16(at + 64 * k)});
    return l;
}

// q4_k and q5_k: d, dmin, the scales in three 4-byte slices, (q5_k) qh in eight, then qs in 32.
template <typename Block>
Layout make_q4_5_k() {
    Layout l{sizeof(Block), kQK_K, {}};
    auto u16 = [](size_t v) { return static_cast<uint16_t>(v); };
    l.slices.push_back({u16(offsetof(Block, d)), 2, 0});
    l.slices.push_back({u16(offsetof(Block, dmin)), 2, 32});
    for (size_t w = 0; w < 3; ++w)
        l.slices.push_back({u16(offsetof(Block, scales) + 4 * w), 4, u16(64 + 64 * w)});
    size_t at = 256;
    if constexpr (kBlockHasQh<Block>) {
        for (size_t k = 0; k < 8; ++k)
            l.slices.push_back({u16(offsetof(Block, qh) + 4 * k), 4, u16(at + 64 * k)});
        at += 8 * 64;
    }
    for (size_t c = 0; c < 4; ++c)
        for (size_t k = 0; k < 8; ++k)
            l.slices.push_back({u16(offsetof(Block, qs) + 32 * c + 4 * k), 4, u16(at + 64 * (8 * c + k))});
    return l;
}

// q6_k: the quant bytes in the order the kernel reads them (see pack.h), so it streams forward.
Layout make_q6_k() {
    Layout l{sizeof(BlockQ6_K), kQK_K, {}};
    auto u16 = [](size_t v) { return static_cast<uint16_t>(v); };
    l.slices.push_back({u16(offsetof(BlockQ6_K, d)), 2, 0});
    for (size_t w = 0; w < 4; ++w)
        l.slices.push_back({u16(offsetof(BlockQ6_K, scales) + 4 * w), 4, u16(32 + 64 * w)});
    for (size_t s = 0; s < 32; ++s) {  // ql bytes 4s..4s+3: half h = s / 16, slice k and position
        const size_t h = s / 16, k = s % 8, pos = (s % 16) / 8;
        l.slices.push_back(
            {u16(offsetof(BlockQ6_K, ql) + 4 * s), 4, u16(288 + 192 * (8 * h + k) + 64 * pos)});
    }
    for (size_t s = 0; s < 16; ++s)  // qh bytes 4s..4s+3
        l.slices.push_back({u16(offsetof(BlockQ6_K, qh) + 4 * s), 4, u16(288 + 192 * s + 128)});
    return l;
}

const Layout *layout_of(DType type) {
    static const Layout q4_0 = make_x_0(sizeof(BlockQ4_0)), q4_1 = make_4_5_bit<BlockQ4_1>(),
                        q5_0 = make_4_5_bit<BlockQ5_0>(), q5_1 = make_4_5_bit<BlockQ5_1>(),
                        q8_0 = make_x_0(sizeof(BlockQ8_0)), q4_k = make_q4_5_k<BlockQ4_K>(),
                        q5_k = make_q4_5_k<BlockQ5_K>(), q6_k = make_q6_k();
    switch (type) {
        case DType::q4_0:
            return &q4_0;
        case DType::q4_1:
            return &q4_1;
        case DType::q5_0:
            return &q5_0;
        case DType::q5_1:
            return &q5_1;
        case DType::q8_0:
            return &q8_0;
        case DType::q4_k:
            return &q4_k;
        case DType::q5_k:
            return &q5_k;
        case DType::q6_k:
            return &q6_k;
        default:
            return nullptr;
    }
}

}  // namespace

bool packable(DType type, int64_t n, int64_t n_rows) {
    const Layout *l = layout_of(type);
    return l != nullptr && n > 0 && n % l->block_elems == 0 && n_rows > 0 && n_rows % kPackRows == 0;
}

void pack_rows(DType type, const void *src, int64_t n, int64_t n_rows, void *dst) {
    TD_ASSERT(packable(type, n, n_rows), "pack_rows: {} [{} rows of {}] has no packed layout",
              dtype_name(type), n_rows, n);
    const Layout &l = *layout_of(type);
    const int64_t nb = n / l.block_elems;
    const size_t group_block = kPackRows * l.block_bytes;
    const auto *in = static_cast<const uint8_t *>(src);  // [n_rows][nb][block_bytes]
    auto *out = static_cast<uint8_t *>(dst);
    for (int64_t g = 0; g < n_rows / kPackRows; ++g)
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t *p = out + static_cast<size_t>(g * nb + b) * group_block;
            for (int64_t r = 0; r < kPackRows; ++r) {
                const uint8_t *blk = in + (static_cast<size_t>((g * kPackRows + r) * nb + b)) * l.block_bytes;
                for (const Slice &s : l.slices) copy_slice(p + s.dst + r * s.size, blk + s.src, s.size);
            }
        }
}

void unpack_rows(DType type, const void *packed, int64_t n, int64_t row_begin, int64_t n_rows, void *dst) {
    TD_ASSERT(packable(type, n, n_rows) && row_begin % kPackRows == 0,
              "unpack_rows: {} rows {}+{} of {} are not whole packed groups", dtype_name(type), row_begin,
              n_rows, n);
    const Layout &l = *layout_of(type);
    const int64_t nb = n / l.block_elems;
    const size_t group_block = kPackRows * l.block_bytes;
    const auto *in = static_cast<const uint8_t *>(packed);
    auto *out = static_cast<uint8_t *>(dst);  // [n_rows][nb][block_bytes]
    for (int64_t g = 0; g < n_rows / kPackRows; ++g) {
        const int64_t group = row_begin / kPackRows + g;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t *p = in + static_cast<size_t>(group * nb + b) * group_block;
            for (int64_t r = 0; r < kPackRows; ++r) {
                uint8_t *blk = out + (static_cast<size_t>((g * kPackRows + r) * nb + b)) * l.block_bytes;
                for (const Slice &s : l.slices) copy_slice(blk + s.src, p + s.dst + r * s.size, s.size);
            }
        }
    }
}

}  // namespace td::kernels
