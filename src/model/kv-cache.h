// KV cache for the layers a context runs, one region per sequence slot.
// Layout per layer: K and V each [n_seq][n_ctx][n_embd_kv] in f16 (default) or f32, so the rows one
// attention head reads for a sequence are contiguous with stride n_embd_kv.
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
#include <vector>

#include "core/status.h"

namespace td {

enum class KvType { f16 = 0, f32 = 1 };

class KvCache {
public:
    KvCache() = default;
    // n_layer: layers held (a stage's range); errors (invalid_input) on zero sizes or if the allocation would
    // exceed `max_bytes` (0 = no limit) with the size in the message.
    static Result<KvCache> create(int32_t n_layer, int32_t n_seq, int32_t n_ctx, int32_t n_embd_kv,
                                  KvType type, size_t max_bytes = 0);

    int32_t n_seq() const { return n_seq_; }
    int32_t n_ctx() const { return n_ctx_; }
    KvType type() const { return type_; }
    bool is_f16() const { return type_ == KvType::f16; }
    size_t bytes() const { return 2 * region_bytes_; }  // reserved (address space), not necessarily in use
    size_t bytes_in_use() const;                         // what the filled positions take, by pages
    static size_t bytes_per_token(int32_t n_layer, int32_t n_embd_kv, KvType type);

    // Row for (layer, seq, pos): n_embd_kv elements of the cache type.
    uint8_t *k_row(int32_t il, int32_t seq, int32_t pos) { return k_ + offset(il, seq, pos); }
    uint8_t *v_row(int32_t il, int32_t seq, int32_t pos) { return v_ + offset(il, seq, pos); }

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
    size_t offset(int32_t il, int32_t seq, int32_t pos) const {
        return ((static_cast<size_t>(il) * n_seq_ + seq) * n_ctx_ + pos) * row_bytes_;
    }

    struct Unmap {
        size_t bytes;  // no default initializer: the class must be complete for one
        void operator()(uint8_t *p) const;
    };

    int32_t n_layer_ = 0, n_seq_ = 0, n_ctx_ = 0, n_embd_kv_ = 0;
    KvType type_ = KvType::f16;
    size_t row_bytes_ = 0;
    size_t region_bytes_ = 0;                     // of K, and of V
    std::unique_ptr<uint8_t, Unmap> mapping_;     // K then V, each region_bytes_ (page-aligned)
    uint8_t *k_ = nullptr, *v_ = nullptr;         // [n_layer][n_seq][n_ctx][n_embd_kv] of the cache type
    std::vector<int32_t> len_;                    // [n_seq]
    std::vector<int32_t> high_;                   // [n_seq] positions written since the last clear
};

}  // namespace td
