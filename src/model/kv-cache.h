// KV cache for the layers a context runs, one region per sequence slot.
// Layout per layer: K and V each [n_seq][n_ctx][n_embd_kv] of their types (f16 by default; f32, bf16, or
// a block type as llama.cpp's --cache-type-k/-v: q8_0, q4_0, q4_1, q5_0, q5_1), so the rows one attention
// head reads for a sequence are one row apart. A block type's blocks never straddle two heads (the context
// checks that head_dim is a multiple of the block size).
//
// Memory is reserved, not committed: the regions are one anonymous mapping whose pages the OS backs when a
// position is first written, and seq_clear hands a sequence's pages back (madvise). So every slot may hold up
// to n_ctx positions while the memory in use follows the positions actually filled, as a paged KV pool's
// does, with the pages of the OS as its blocks and the attention kernels reading contiguous rows unchanged;
// the server's scheduler bounds the positions all slots hold together (its KV pool, --ctx-size).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "tensor/dtype.h"

namespace td {

// Numbered as on the wire (net LoadStage.kv_type_k/v): f16 and f32 kept the ids they had alone.
enum class KvType : uint32_t { f16 = 0, f32 = 1, bf16 = 2, q8_0 = 3, q4_0 = 4, q4_1 = 5, q5_0 = 6, q5_1 = 7 };
inline constexpr uint32_t kKvTypeCount = 8;
DType kv_dtype(KvType type);
inline const char *kv_type_name(KvType type) {
    return dtype_name(kv_dtype(type));
}
// Bytes per cached value, the mean of K's and V's (f16 2, q8_0 34/32, q4_0 18/32).
double kv_bytes_per_value(KvType type_k, KvType type_v);
// "f16", "q8_0", ... (llama.cpp's names, any case); the error names the accepted ones.
Result<KvType> kv_type_from_name(std::string_view name);

class KvCache {
public:
    KvCache() = default;
    // n_layer: layers held (a stage's range); errors (invalid_input) on zero sizes or if the allocation would
    // exceed `max_bytes` (0 = no limit) with the size in the message.
    // n_embd_kv must be a multiple of a block type's block size.
    static Result<KvCache> create(int32_t n_layer, int32_t n_seq, int32_t n_ctx, int32_t n_embd_kv,
                                  KvType type_k, KvType type_v, size_t max_bytes = 0);

    int32_t n_seq() const { return n_seq_; }
    int32_t n_ctx() const { return n_ctx_; }
    KvType type_k() const { return type_k_; }
    KvType type_v() const { return type_v_; }
    size_t k_row_bytes() const { return k_row_bytes_; }
    size_t v_row_bytes() const { return v_row_bytes_; }
    size_t bytes() const { return k_region_bytes_ + v_region_bytes_; }  // reserved (address space)
    size_t bytes_in_use() const;                                        // what the filled positions take
    static size_t bytes_per_token(int32_t n_layer, int32_t n_embd_kv, KvType type_k, KvType type_v);

    // Row for (layer, seq, pos): n_embd_kv elements of the K or V type.
    uint8_t *k_row(int32_t il, int32_t seq, int32_t pos) { return k_ + offset(il, seq, pos) * k_row_bytes_; }
    uint8_t *v_row(int32_t il, int32_t seq, int32_t pos) { return v_ + offset(il, seq, pos) * v_row_bytes_; }

    // Number of positions filled for a sequence (next position to write).
    int32_t seq_len(int32_t seq) const { return len_[seq]; }
    void seq_set_len(int32_t seq, int32_t len) {
        len_[seq] = len;
        if (len > high_[seq]) high_[seq] = len;
    }
    // Keeps the first n positions of a sequence (a new prompt that starts with the tokens they hold).
    void seq_keep(int32_t seq, int32_t n) { len_[seq] = std::min(len_[seq], std::max(n, 0)); }
    // Replaces `dst` with the first n positions of `src` (at most what src holds), copied: a prompt that
    // starts with the tokens another sequence was fed. dst == src keeps them (seq_keep); n <= 0 clears dst.
    void seq_copy(int32_t src, int32_t dst, int32_t n);
    // Forgets a sequence (its slot can be reused at once) and gives its pages back.
    void seq_clear(int32_t seq);
    void clear();

private:
    size_t offset(int32_t il, int32_t seq, int32_t pos) const {  // in rows
        return (static_cast<size_t>(il) * n_seq_ + seq) * n_ctx_ + pos;
    }

    struct Unmap {
        size_t bytes;  // no default initializer: the class must be complete for one
        void operator()(uint8_t *p) const;
    };

    int32_t n_layer_ = 0, n_seq_ = 0, n_ctx_ = 0, n_embd_kv_ = 0;
    KvType type_k_ = KvType::f16, type_v_ = KvType::f16;
    size_t k_row_bytes_ = 0, v_row_bytes_ = 0;
    size_t k_region_bytes_ = 0, v_region_bytes_ = 0;  // page-aligned
    std::unique_ptr<uint8_t, Unmap> mapping_;         // K then V
    uint8_t *k_ = nullptr, *v_ = nullptr;             // [n_layer][n_seq][n_ctx][n_embd_kv] of their types
    std::vector<int32_t> len_;                    // [n_seq]
    std::vector<int32_t> high_;                   // [n_seq] positions written since the last clear
};

}  // namespace td
