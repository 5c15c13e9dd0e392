#include "model/tp-slice.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>

namespace td {
namespace {

// Units [0, n_units) over ranks in proportion to shares, at least one each (largest remainder; ties to the
// lower rank). Returns the first unit of each rank plus n_units at the end.
Result<std::vector<int32_t>> split_units(int32_t n_units, const std::vector<double> &shares, const char *what) {
    const auto n = static_cast<int32_t>(shares.size());
    if (n_units < n)
        return invalid_input("{} {} cannot be split over {} nodes (each needs at least one)", n_units, what, n);
    const double total = std::accumulate(shares.begin(), shares.end(), 0.0);
    std::vector<int32_t> count(n);
    std::vector<double> ideal(n);
    int32_t used = 0;
    for (int32_t r = 0; r < n; ++r) {
        ideal[r] = shares[r] / total * n_units;
        count[r] = std::max(1, static_cast<int32_t>(std::floor(ideal[r])));
        used += count[r];
    }
    // Too many (the minimum of one pushed some up): take from the ranks furthest above their ideal.
    while (used > n_units) {
        int32_t best = -1;
        for (int32_t r = 0; r < n; ++r)
            if (count[r] > 1 && (best < 0 || count[r] - ideal[r] > count[best] - ideal[best])) best = r;
        --count[best];
        --used;
    }
    // Too few: give to the ranks furthest below their ideal.
    while (used < n_units) {
        int32_t best = 0;
        for (int32_t r = 1; r < n; ++r)
            if (ideal[r] - count[r] > ideal[best] - count[best]) best = r;
        ++count[best];
        ++used;
    }
    std::vector<int32_t> first(n + 1, 0);
    for (int32_t r = 0; r < n; ++r) first[r + 1] = first[r] + count[r];
    return first;
}

// Reads byte ranges of one GGUF's data section with pread.
struct SourceFile {
    int fd = -1;
    std::string path;
    size_t data_offset = 0;
    ~SourceFile() {
        if (fd >= 0) ::close(fd);
    }
    Status read(uint8_t *dst, size_t n, uint64_t offset) const {
        while (n > 0) {
            const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(data_offset + offset));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0)
                return make_error(ErrorKind::io, "{}: cannot read at byte {}: {}", path, data_offset + offset,
                                  got < 0 ? std::strerror(errno) : "end of file");
            dst += got;
            n -= static_cast<size_t>(got);
            offset += static_cast<uint64_t>(got);
        }
        return {};
    }
};

using Cut = TpSliceTensor::Cut;

struct TensorCut {
    Cut cut = Cut::whole;
    int64_t first = 0, last = 0;  // rows or columns [first, last)
};

TensorCut cut_of(const std::string &suffix, const HParams &hp, const TpSlice &s) {
    const int64_t hd = hp.head_dim, gqa = hp.n_gqa();
    const int64_t q0 = s.kv_first * gqa * hd, q1 = s.kv_last * gqa * hd;
    const int64_t k0 = s.kv_first * hd, k1 = s.kv_last * hd;
    if (suffix == "attn_q.weight") return {Cut::rows, q0, q1};
    if (suffix == "attn_k.weight" || suffix == "attn_v.weight") return {Cut::rows, k0, k1};
    if (suffix == "attn_q.bias") return {Cut::cols, q0, q1};
    if (suffix == "attn_k.bias" || suffix == "attn_v.bias") return {Cut::cols, k0, k1};
    if (suffix == "attn_output.weight") return {Cut::cols, q0, q1};
    if (suffix == "ffn_gate.weight" || suffix == "ffn_up.weight") return {Cut::rows, s.ff_first, s.ff_last};
    if (suffix == "ffn_down.weight") return {Cut::cols, s.ff_first, s.ff_last};
    return {};
}

Result<TpSliceTensor> plan_tensor(const gguf::File &file, const gguf::TensorInfo &t, const std::string &name,
                                  TensorCut c) {
    TpSliceTensor p;
    p.name = name;
    p.src = &t;
    p.type = t.type;
    p.ne.assign(t.ne, t.ne + t.n_dims);
    p.cut = c.cut;
    p.first = c.first;
    p.last = c.last;
    const size_t row_bytes = dtype_row_bytes(t.type, t.ne[0]);
    const int64_t n_rows = static_cast<int64_t>(t.n_bytes / std::max<size_t>(row_bytes, 1));
    switch (c.cut) {
        case Cut::whole:
            p.n_bytes = t.n_bytes;
            break;
        case Cut::rows:
            if (t.n_dims < 2 || c.first < 0 || c.last > n_rows || c.first >= c.last)
                return invalid_input("{}: tensor '{}' has {} rows, the slice needs rows {}..{}", file.path(),
                                     t.name, n_rows, c.first, c.last - 1);
            p.ne[1] = c.last - c.first;
            p.n_bytes = row_bytes * static_cast<size_t>(c.last - c.first);
            break;
        case Cut::cols: {
            const int64_t block = dtype_traits(t.type).block_size;
            if (c.first < 0 || c.last > t.ne[0] || c.first >= c.last || c.first % block != 0 ||
                c.last % block != 0)
                return invalid_input("{}: tensor '{}' ({}, rows of {}) cannot be cut at columns {}..{}",
                                     file.path(), t.name, dtype_name(t.type), t.ne[0], c.first, c.last - 1);
            p.ne[0] = c.last - c.first;
            p.n_bytes = dtype_row_bytes(t.type, c.last - c.first) * static_cast<size_t>(n_rows);
            break;
        }
    }
    return p;
}

// Produces a planned tensor's bytes with pread (the writer's source).
Status read_planned(const SourceFile &src, const TpSliceTensor &p, uint8_t *dst) {
    Status s;
    size_t at = 0;
    p.for_each_span([&](size_t offset, size_t bytes) {
        if (s.ok()) s = src.read(dst + at, bytes, p.src->offset + offset);
        at += bytes;
    });
    return s;
}

Result<std::pair<int32_t, int32_t>> read_range(const gguf::File &file, const char *key, int32_t limit) {
    TD_ASSIGN_OR_RETURN(std::vector<int32_t> v, file.get_i32_array(key));
    if (v.size() != 2 || v[0] < 0 || v[0] >= v[1] || v[1] > limit)
        return invalid_input("{}: key '{}' must be [first, last] with 0 <= first < last <= {}", file.path(), key,
                             limit);
    return std::pair{v[0], v[1]};
}

}  // namespace

TpSlice tp_slice_whole(const HParams &hp) {
    return {0, hp.n_head_kv, 0, hp.n_ff, 0, hp.n_vocab};
}

bool tp_slice_is_whole(const TpSlice &slice, const HParams &hp) {
    return slice == tp_slice_whole(hp);
}

std::string tp_slice_str(const TpSlice &s) {
    return fmt::format("kv {}-{} ff {}-{} vocab {}-{}", s.kv_first, s.kv_last - 1, s.ff_first, s.ff_last - 1,
                       s.vocab_first, s.vocab_last - 1);
}

int32_t tp_ff_unit(const gguf::File &file, int32_t layer_first, int32_t layer_last) {
    int64_t unit = 16;
    for (int32_t il = layer_first; il < layer_last; ++il)
        if (const gguf::TensorInfo *t = file.find_tensor(fmt::format("blk.{}.ffn_down.weight", il)))
            unit = std::lcm(unit, static_cast<int64_t>(dtype_traits(t->type).block_size));
    return static_cast<int32_t>(unit);
}

Result<std::vector<TpSlice>> tp_split(const HParams &hp, const std::vector<double> &shares, int32_t ff_unit) {
    if (shares.empty()) return invalid_input("a tensor-parallel group needs at least one node");
    for (double s : shares)
        if (!(s > 0.0) || !std::isfinite(s)) return invalid_input("node shares must be positive, got {}", s);
    TD_ASSIGN_OR_RETURN(auto kv, split_units(hp.n_head_kv, shares, "KV heads"));
    TD_ASSIGN_OR_RETURN(auto ff, split_units(hp.n_ff / ff_unit, shares,
                                             fmt::format("FFN row groups of {}", ff_unit).c_str()));
    TD_ASSIGN_OR_RETURN(auto voc, split_units(hp.n_vocab / kTpVocabUnit, shares,
                                              fmt::format("vocabulary row groups of {}", kTpVocabUnit).c_str()));
    const size_t n = shares.size();
    std::vector<TpSlice> out(n);
    for (size_t r = 0; r < n; ++r) {
        const bool last = r + 1 == n;
        out[r].kv_first = kv[r];
        out[r].kv_last = kv[r + 1];
        out[r].ff_first = ff[r] * ff_unit;
        out[r].ff_last = last ? hp.n_ff : ff[r + 1] * ff_unit;
        out[r].vocab_first = voc[r] * kTpVocabUnit;
        out[r].vocab_last = last ? hp.n_vocab : voc[r + 1] * kTpVocabUnit;
    }
    return out;
}

Result<TpSlice> tp_slice_read(const gguf::File &file, const HParams &hp) {
    TpSlice s = tp_slice_whole(hp);
    const bool any = file.has(kTpKeyKvHeads) || file.has(kTpKeyFf);
    if (!any) return s;
    TD_ASSIGN_OR_RETURN(auto kv, read_range(file, kTpKeyKvHeads, hp.n_head_kv));
    TD_ASSIGN_OR_RETURN(auto ff, read_range(file, kTpKeyFf, hp.n_ff));
    std::pair<int32_t, int32_t> voc{0, hp.n_vocab};  // absent: the file has no output head
    if (file.has(kTpKeyVocab)) {
        TD_ASSIGN_OR_RETURN(voc, read_range(file, kTpKeyVocab, hp.n_vocab));
    }
    s = {kv.first, kv.second, ff.first, ff.second, voc.first, voc.second};
    return s;
}

uint64_t tp_streamed_bytes(const std::vector<TpSliceTensor> &plan) {
    uint64_t n = 0;
    for (const TpSliceTensor &t : plan)
        if (t.name != "token_embd.weight") n += t.n_bytes;
    return n;
}

Result<std::vector<TpSliceTensor>> tp_slice_plan(const gguf::File &file, const HParams &hp, int32_t layer_first,
                                                 int32_t layer_last, const TpSlice &slice) {
    if (slice.kv_first < 0 || slice.kv_first >= slice.kv_last || slice.kv_last > hp.n_head_kv ||
        slice.ff_first < 0 || slice.ff_first >= slice.ff_last || slice.ff_last > hp.n_ff ||
        slice.vocab_first < 0 || slice.vocab_first >= slice.vocab_last || slice.vocab_last > hp.n_vocab)
        return invalid_input("{}: slice {} is outside the model (KV heads {}, FFN {}, vocabulary {})", file.path(),
                             tp_slice_str(slice), hp.n_head_kv, hp.n_ff, hp.n_vocab);
    if (layer_first < 0 || layer_first >= layer_last || layer_last > hp.n_layer)
        return invalid_input("{}: layer range {}-{} is outside the model's {} layers", file.path(), layer_first,
                             layer_last - 1, hp.n_layer);
    std::vector<TpSliceTensor> plan;
    auto add = [&](const gguf::TensorInfo &t, const std::string &name, TensorCut c) -> Status {
        TD_ASSIGN_OR_RETURN(TpSliceTensor p, plan_tensor(file, t, name, c));
        plan.push_back(std::move(p));
        return {};
    };
    const bool has_first = layer_first == 0, has_last = layer_last == hp.n_layer;
    const gguf::TensorInfo *output = file.find_tensor("output.weight");
    if (output == nullptr) output = file.find_tensor("token_embd.weight");  // tied
    for (const gguf::TensorInfo &t : file.tensors()) {
        const std::string &name = t.name;
        if (name == "token_embd.weight") {
            if (has_first) TD_TRY(add(t, name, {}));
            continue;
        }
        if (name == "rope_freqs.weight") {
            TD_TRY(add(t, name, {}));
            continue;
        }
        if (name == "output_norm.weight") {
            if (has_last) TD_TRY(add(t, name, {}));
            continue;
        }
        if (name.rfind("blk.", 0) != 0) continue;  // output.weight: below, after the layers
        const size_t dot = name.find('.', 4);
        if (dot == std::string::npos) continue;
        int32_t il = -1;
        const auto [end, ec] = std::from_chars(name.data() + 4, name.data() + dot, il);
        if (ec != std::errc{} || end != name.data() + dot) continue;
        if (il < layer_first || il >= layer_last) continue;
        TD_TRY(add(t, name, cut_of(name.substr(dot + 1), hp, slice)));
    }
    if (has_last) {
        if (output == nullptr) return invalid_input("{}: missing tensor 'output.weight'", file.path());
        TD_TRY(add(*output, "output.weight", {Cut::rows, slice.vocab_first, slice.vocab_last}));
    }
    return plan;
}

Status tp_write_slice_file(const gguf::File &file, const HParams &hp, int32_t layer_first, int32_t layer_last,
                           const TpSlice &slice, const std::string &path) {
    TD_ASSIGN_OR_RETURN(auto plan, tp_slice_plan(file, hp, layer_first, layer_last, slice));
    auto src = std::make_shared<SourceFile>();
    src->path = file.path();
    src->data_offset = file.data_offset();
    src->fd = ::open(file.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (src->fd < 0)
        return make_error(ErrorKind::io, "{}: cannot open for reading: {}", file.path(), std::strerror(errno));
    gguf::Writer w(file.alignment());
    for (const auto &[key, value] : file.metadata()) {
        if (key == "general.alignment") continue;  // the writer adds it from its constructor
        w.set_value(key, value);
    }
    w.set_i32_array(kTpKeyKvHeads, {slice.kv_first, slice.kv_last});
    w.set_i32_array(kTpKeyFf, {slice.ff_first, slice.ff_last});
    // Only a file with the output head has vocabulary rows: elsewhere the key would make files with the same
    // tensors differ (the cache names a slice file by its tensors' hash).
    if (layer_last == hp.n_layer) w.set_i32_array(kTpKeyVocab, {slice.vocab_first, slice.vocab_last});
    for (const TpSliceTensor &p : plan)
        w.add_tensor_from(p.name, p.type, p.ne, p.n_bytes,
                          [src, p](uint8_t *dst) { return read_planned(*src, p, dst); });
    return w.write(path);
}

}  // namespace td
