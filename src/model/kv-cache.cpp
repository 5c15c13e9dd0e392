#include "model/kv-cache.h"

#include <algorithm>

namespace td {

size_t KvCache::bytes_per_token(int32_t n_layer, int32_t n_embd_kv, KvType type) {
    return 2 * static_cast<size_t>(n_layer) * n_embd_kv * (type == KvType::f16 ? 2 : 4);
}

Result<KvCache> KvCache::create(int32_t n_layer, int32_t n_seq, int32_t n_ctx, int32_t n_embd_kv, KvType type,
                                size_t max_bytes) {
    if (n_layer < 0 || n_seq <= 0 || n_ctx <= 0 || n_embd_kv <= 0)
        return invalid_input("KV cache needs positive sizes (layers {}, sequences {}, context {})", n_layer,
                             n_seq, n_ctx);
    KvCache c;
    c.n_layer_ = n_layer;
    c.n_seq_ = n_seq;
    c.n_ctx_ = n_ctx;
    c.n_embd_kv_ = n_embd_kv;
    c.type_ = type;
    c.row_bytes_ = static_cast<size_t>(n_embd_kv) * (type == KvType::f16 ? 2 : 4);
    const size_t each = static_cast<size_t>(n_layer) * n_seq * n_ctx * c.row_bytes_;
    if (max_bytes != 0 && 2 * each > max_bytes)
        return invalid_input("KV cache of {} MiB exceeds the limit of {} MiB; lower --ctx-size",
                             (2 * each) >> 20, max_bytes >> 20);
    c.k_.assign(each, 0);
    c.v_.assign(each, 0);
    c.len_.assign(n_seq, 0);
    return c;
}

void KvCache::clear() {
    std::fill(len_.begin(), len_.end(), 0);
}

}  // namespace td
