// KV cache for the layers a context runs, one region per sequence slot.
// Layout per layer: K and V each [n_seq][n_ctx][n_embd_kv] in f16 (default) or f32, so the rows one
// attention head reads for a sequence are contiguous with stride n_embd_kv.
#pragma once

#include <cstdint>
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
    size_t bytes() const { return k_.size() + v_.size(); }
    static size_t bytes_per_token(int32_t n_layer, int32_t n_embd_kv, KvType type);

    // Row for (layer, seq, pos): n_embd_kv elements of the cache type.
    uint8_t *k_row(int32_t il, int32_t seq, int32_t pos) { return k_.data() + offset(il, seq, pos); }
    uint8_t *v_row(int32_t il, int32_t seq, int32_t pos) { return v_.data() + offset(il, seq, pos); }

    // Number of positions filled for a sequence (next position to write).
    int32_t seq_len(int32_t seq) const { return len_[seq]; }
    void seq_set_len(int32_t seq, int32_t len) { len_[seq] = len; }
    // Forgets a sequence (its slot can be reused at once).
    void seq_clear(int32_t seq) { len_[seq] = 0; }
    void clear();

private:
    size_t offset(int32_t il, int32_t seq, int32_t pos) const {
        return ((static_cast<size_t>(il) * n_seq_ + seq) * n_ctx_ + pos) * row_bytes_;
    }

    int32_t n_layer_ = 0, n_seq_ = 0, n_ctx_ = 0, n_embd_kv_ = 0;
    KvType type_ = KvType::f16;
    size_t row_bytes_ = 0;
    std::vector<uint8_t> k_, v_;  // [n_layer][n_seq][n_ctx][n_embd_kv] of the cache type
    std::vector<int32_t> len_;    // [n_seq]
};

}  // namespace td
