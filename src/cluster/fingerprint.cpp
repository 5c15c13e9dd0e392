#include "cluster/fingerprint.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>

namespace td::cluster {
namespace {

bool is_layer_tensor(const std::string &name, int32_t first, int32_t last) {
    if (name.compare(0, 4, "blk.") != 0) return false;
    int32_t il = 0;
    size_t i = 4;
    if (i >= name.size() || name[i] < '0' || name[i] > '9') return false;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && il < (1 << 20))
        il = il * 10 + (name[i++] - '0');
    return i < name.size() && name[i] == '.' && il >= first && il < last;
}

// Hashes [data, data + n) of `file`'s mapping in chunks and unmaps each chunk's pages from this process once
// hashed (the page cache keeps them): hashing a range then costs its bytes of RSS for one chunk at a time,
// not for the whole range (a head or a rank that never computes those layers keeps none of them).
void hash_mapped(XXH3_state_t *state, const gguf::File &file, const uint8_t *data, size_t n) {
    constexpr size_t kChunk = size_t{32} << 20;
    const MappedFile &map = file.mapping();
    for (size_t done = 0; done < n; done += kChunk) {
        const size_t len = std::min(kChunk, n - done);
        XXH3_64bits_update(state, data + done, len);
        map.drop_pages(static_cast<size_t>(data + done - map.data()), len);
    }
}

}  // namespace

std::vector<const gguf::TensorInfo *> stage_tensors(const gguf::File &file, int32_t layer_first,
                                                    int32_t layer_last, int32_t n_layer) {
    const bool is_last = layer_last == n_layer;
    const bool tied = file.find_tensor("output.weight") == nullptr;
    std::vector<const gguf::TensorInfo *> out;
    for (const gguf::TensorInfo &t : file.tensors()) {
        bool take = is_layer_tensor(t.name, layer_first, layer_last) || t.name == "rope_freqs.weight";
        if (t.name == "token_embd.weight") take = layer_first == 0 || (is_last && tied);
        if (t.name == "output_norm.weight" || t.name == "output.weight") take = is_last;
        if (take) out.push_back(&t);
    }
    return out;
}

uint64_t stage_fingerprint(const gguf::File &file, int32_t layer_first, int32_t layer_last, int32_t n_layer) {
    XXH3_state_t *state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (const gguf::TensorInfo *t : stage_tensors(file, layer_first, layer_last, n_layer)) {
        XXH3_64bits_update(state, t->name.data(), t->name.size());
        const uint32_t type = static_cast<uint32_t>(t->type);
        XXH3_64bits_update(state, &type, sizeof(type));
        XXH3_64bits_update(state, t->ne, sizeof(int64_t) * static_cast<size_t>(t->n_dims));
        hash_mapped(state, file, t->data, t->n_bytes);
    }
    const uint64_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return h;
}

uint64_t slice_fingerprint(const gguf::File &file, const std::vector<TpSliceTensor> &plan) {
    XXH3_state_t *state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (const TpSliceTensor &t : plan) {
        XXH3_64bits_update(state, t.name.data(), t.name.size());
        const uint32_t type = static_cast<uint32_t>(t.type);
        XXH3_64bits_update(state, &type, sizeof(type));
        XXH3_64bits_update(state, t.ne.data(), sizeof(int64_t) * t.ne.size());
        t.for_each_span([&](size_t offset, size_t n) { XXH3_64bits_update(state, t.src->data + offset, n); });
        file.mapping().drop_pages(static_cast<size_t>(t.src->data - file.mapping().data()), t.src->n_bytes);
    }
    const uint64_t h = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return h;
}

uint64_t stage_weight_bytes(const gguf::File &file, int32_t layer_first, int32_t layer_last,
                            int32_t n_layer) {
    uint64_t total = 0;
    for (const gguf::TensorInfo *t : stage_tensors(file, layer_first, layer_last, n_layer))
        total += t->n_bytes;
    return total;
}

Status write_stage_file(const gguf::File &file, int32_t layer_first, int32_t layer_last, int32_t n_layer,
                        const std::string &path) {
    gguf::Writer w(file.alignment());
    for (const auto &[key, value] : file.metadata()) {
        if (key == "general.alignment") continue;  // the writer adds it from its constructor
        w.set_value(key, value);
    }
    for (const gguf::TensorInfo *t : stage_tensors(file, layer_first, layer_last, n_layer))
        w.add_tensor(t->name, t->type, std::vector<int64_t>(t->ne, t->ne + t->n_dims), t->data, t->n_bytes);
    return w.write(path);
}

std::string fingerprint_hex(uint64_t fp) {
    return fmt::format("{:016x}", fp);
}

}  // namespace td::cluster
