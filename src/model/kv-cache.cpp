#include "model/kv-cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

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

DType kv_dtype(KvType type) {
    switch (type) {
        case KvType::f16:
            return DType::f16;
        case KvType::f32:
            return DType::f32;
        case KvType::bf16:
            return DType::bf16;
        case KvType::q8_0:
            return DType::q8_0;
        case KvType::q4_0:
            return DType::q4_0;
        case KvType::q4_1:
            return DType::q4_1;
        case KvType::q5_0:
            return DType::q5_0;
        case KvType::q5_1:
            return DType::q5_1;
    }
    return DType::f16;
}

Result<KvType> kv_type_from_name(std::string_view name) {
    std::string names;
    for (uint32_t i = 0; i < kKvTypeCount; ++i) {
        const auto type = static_cast<KvType>(i);
        const std::string_view n = kv_type_name(type);
        if (n.size() == name.size() &&
            std::equal(n.begin(), n.end(), name.begin(), [](char a, char b) { return a == std::tolower(b); }))
            return type;
        names += (i == 0 ? "" : ", ") + std::string(n);
    }
    return invalid_input("KV cache type '{}' is not one of {}", name, names);
}

double kv_bytes_per_value(KvType type_k, KvType type_v) {
    double sum = 0.0;
    for (KvType t : {type_k, type_v}) {
        const DTypeTraits &tr = dtype_traits(kv_dtype(t));
        sum += static_cast<double>(tr.block_bytes) / static_cast<double>(tr.block_size);
    }
    return sum / 2.0;
}

size_t KvCache::bytes_per_token(int32_t n_layer, int32_t n_embd_kv, KvType type_k, KvType type_v) {
    return static_cast<size_t>(n_layer) *
           (dtype_row_bytes(kv_dtype(type_k), n_embd_kv) + dtype_row_bytes(kv_dtype(type_v), n_embd_kv));
}

Result<KvCache> KvCache::create(int32_t n_layer, int32_t n_seq, int32_t n_ctx, int32_t n_embd_kv,
                                KvType type_k, KvType type_v, size_t max_bytes) {
    if (n_layer < 0 || n_seq <= 0 || n_ctx <= 0 || n_embd_kv <= 0)
        return invalid_input("KV cache needs positive sizes (layers {}, sequences {}, context {})", n_layer,
                             n_seq, n_ctx);
    for (KvType t : {type_k, type_v}) {
        if (static_cast<uint32_t>(t) >= kKvTypeCount)
            return invalid_input("unknown KV cache type {}", static_cast<uint32_t>(t));
        const int64_t block = dtype_traits(kv_dtype(t)).block_size;
        if (n_embd_kv % block != 0)
            return invalid_input("a {} KV cache needs rows of a multiple of {} values, not {}",
                                 kv_type_name(t), block, n_embd_kv);
    }
    KvCache c;
    c.n_layer_ = n_layer;
    c.n_seq_ = n_seq;
    c.n_ctx_ = n_ctx;
    c.n_embd_kv_ = n_embd_kv;
    c.type_k_ = type_k;
    c.type_v_ = type_v;
    c.k_row_bytes_ = dtype_row_bytes(kv_dtype(type_k), n_embd_kv);
    c.v_row_bytes_ = dtype_row_bytes(kv_dtype(type_v), n_embd_kv);
    const size_t rows = static_cast<size_t>(n_layer) * n_seq * n_ctx;
    const size_t total = rows * (c.k_row_bytes_ + c.v_row_bytes_);
    if (max_bytes != 0 && total > max_bytes)
        return invalid_input("KV cache of {} MiB exceeds the limit of {} MiB; lower --ctx-size", total >> 20,
                             max_bytes >> 20);
    const size_t page = page_bytes();
    c.k_region_bytes_ = std::max<size_t>((rows * c.k_row_bytes_ + page - 1) / page * page, page);
    c.v_region_bytes_ = std::max<size_t>((rows * c.v_row_bytes_ + page - 1) / page * page, page);
    const size_t reserve = c.k_region_bytes_ + c.v_region_bytes_;
    // Reserved address space: no page is backed (or counted against overcommit) before it is written.
    void *p =
        mmap(nullptr, reserve, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return make_error(ErrorKind::io, "cannot reserve {} MiB of address space for the KV cache: {}",
                          reserve >> 20, std::strerror(errno));
    c.mapping_ = std::unique_ptr<uint8_t, Unmap>(static_cast<uint8_t *>(p), Unmap{reserve});
    c.k_ = c.mapping_.get();
    c.v_ = c.k_ + c.k_region_bytes_;
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
    for (const auto &[base, row_bytes] : {std::pair{k_, k_row_bytes_}, std::pair{v_, v_row_bytes_}}) {
        const size_t used = static_cast<size_t>(high_[seq]) * row_bytes;
        for (int32_t il = 0; il < n_layer_; ++il) {
            const uintptr_t b = reinterpret_cast<uintptr_t>(base + offset(il, seq, 0) * row_bytes);
            const uintptr_t first = (b + page - 1) / page * page, last = (b + used) / page * page;
            if (last > first) madvise(reinterpret_cast<void *>(first), last - first, MADV_DONTNEED);
        }
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
    for (const auto &[base, row_bytes] : {std::pair{k_, k_row_bytes_}, std::pair{v_, v_row_bytes_}})
        for (int32_t il = 0; il < n_layer_; ++il)
            std::memcpy(base + offset(il, dst, 0) * row_bytes, base + offset(il, src, 0) * row_bytes,
                        static_cast<size_t>(n) * row_bytes);
    seq_set_len(dst, n);
}

void KvCache::clear() {
    for (int32_t s = 0; s < n_seq_; ++s) seq_clear(s);
}

size_t KvCache::bytes_in_use() const {
    size_t positions = 0;
    for (int32_t h : high_) positions += static_cast<size_t>(h);
    return positions * static_cast<size_t>(n_layer_) * (k_row_bytes_ + v_row_bytes_);
}

}  // namespace td
