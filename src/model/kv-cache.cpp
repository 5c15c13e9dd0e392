#include "model/kv-cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace td {

namespace {

size_t page_bytes() {
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return page;
}

}  // namespace

void KvCache::Unmap::operator()(uint8_t *p) const {
    if (p != nullptr) munmap(p, bytes);
}

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
    const size_t page = page_bytes();
    c.region_bytes_ = std::max<size_t>((each + page - 1) / page * page, page);
    // Reserved address space: no page is backed (or counted against overcommit) before it is written.
    void *p = mmap(nullptr, 2 * c.region_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return make_error(ErrorKind::io, "cannot reserve {} MiB of address space for the KV cache: {}",
                          (2 * c.region_bytes_) >> 20, std::strerror(errno));
    c.mapping_ = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t *>(p), Unmap{2 * c.region_bytes_});
    c.k_ = c.mapping_.get();
    c.v_ = c.k_ + c.region_bytes_;
    c.len_.assign(n_seq, 0);
    c.high_.assign(n_seq, 0);
    return c;
}

void KvCache::seq_clear(int32_t seq) {
    len_[seq] = 0;
    if (high_[seq] == 0) return;
    // The pages wholly inside the positions this sequence wrote, per layer, in K and in V. A page shared with
    // a neighbouring slot's rows stays.
    const size_t page = page_bytes();
    const size_t used = static_cast<size_t>(high_[seq]) * row_bytes_;
    for (uint8_t *base : {k_, v_})
        for (int32_t il = 0; il < n_layer_; ++il) {
            const uintptr_t b = reinterpret_cast<uintptr_t>(base + offset(il, seq, 0));
            const uintptr_t first = (b + page - 1) / page * page, last = (b + used) / page * page;
            if (last > first) madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
        }
    high_[seq] = 0;
}

void KvCache::seq_copy(int32_t src, int32_t dst, int32_t n) {
    if (n <= 0) return seq_clear(dst);  // gives its pages back
    if (src == dst) return seq_keep(dst, n);
    n = std::min(n, len_[src]);
    seq_clear(dst);
    if (n == 0) return;
    // Positions of one sequence in one layer are contiguous: one copy per layer, in K and in V.
    const size_t bytes = static_cast<size_t>(n) * row_bytes_;
    for (uint8_t *base : {k_, v_})
        for (int32_t il = 0; il < n_layer_; ++il)
            std::memcpy(base + offset(il, dst, 0), base + offset(il, src, 0), bytes);
    seq_set_len(dst, n);
}

void KvCache::clear() {
    for (int32_t s = 0; s < n_seq_; ++s) seq_clear(s);
}

size_t KvCache::bytes_in_use() const {
    size_t positions = 0;
    for (int32_t h : high_) positions += static_cast<size_t>(h);
    return positions * static_cast<size_t>(n_layer_) * 2 * row_bytes_;
}

}  // namespace td
