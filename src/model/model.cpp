#include "model/model.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/log.h"
#include "kernels/kernels.h"

namespace td {
namespace {

std::string shape_str(const int64_t *ne, int n_dims) {
    std::string s = "[";
    for (int i = 0; i < n_dims; ++i) s += fmt::format("{}{}", i ? ", " : "", ne[i]);
    return s + "]";
}

// Looks up a tensor and checks its shape; `required` false returns an empty view when absent.
// `f32_only` is for norms and biases, which every converter stores as f32.
Result<TensorView> get_tensor(const gguf::File &file, const std::string &name,
                              std::initializer_list<int64_t> shape, bool required = true,
                              bool f32_only = false) {
    const gguf::TensorInfo *t = file.find_tensor(name);
    if (t == nullptr) {
        if (!required) return TensorView{};
        return make_error(ErrorKind::invalid_input, "{}: missing tensor '{}'", file.path(), name);
    }
    const int n = static_cast<int>(shape.size());
    bool match = t->n_dims == n;
    int i = 0;
    for (int64_t want : shape) match = match && t->ne[i++] == want;
    if (!match) {
        std::vector<int64_t> want(shape);
        return invalid_input("{}: tensor '{}' has shape {}, expected {}", file.path(), name,
                             shape_str(t->ne, t->n_dims), shape_str(want.data(), n));
    }
    if (f32_only && t->type != DType::f32)
        return make_error(ErrorKind::unimplemented, "{}: tensor '{}' is {}, expected f32", file.path(), name,
                          dtype_name(t->type));
    if (kernels::type_kernels(t->type) == nullptr)
        return make_error(ErrorKind::unimplemented,
                          "{}: tensor '{}' has type {}, which tandem cannot compute yet", file.path(), name,
                          dtype_name(t->type));
    return t->view();
}

// llama3 rope scaling computed from the keys, when the file ships no rope_freqs tensor:
// long wavelengths are slowed by `factor`, short ones kept, smooth blend in between.
std::vector<float> llama3_freq_factors(const HParams &hp) {
    std::vector<float> ff(hp.n_rot / 2);
    const float low_wavelen = static_cast<float>(hp.rope_orig_ctx) / hp.rope_llama3_low_freq_factor;
    const float high_wavelen = static_cast<float>(hp.rope_orig_ctx) / hp.rope_llama3_high_freq_factor;
    for (int32_t i = 0; i < hp.n_rot / 2; ++i) {
        const float freq =
            std::pow(hp.rope_freq_base, -2.0f * static_cast<float>(i) / static_cast<float>(hp.n_rot));
        const float wavelen = 2.0f * static_cast<float>(M_PI) / freq;
        if (wavelen < high_wavelen) {
            ff[i] = 1.0f;
        } else if (wavelen > low_wavelen) {
            ff[i] = hp.rope_scale_factor;
        } else {
            const float smooth =
                (static_cast<float>(hp.rope_orig_ctx) / wavelen - hp.rope_llama3_low_freq_factor) /
                (hp.rope_llama3_high_freq_factor - hp.rope_llama3_low_freq_factor);
            ff[i] = 1.0f / ((1.0f - smooth) / hp.rope_scale_factor + smooth);
        }
    }
    return ff;
}

}  // namespace

Result<std::shared_ptr<Model>> Model::load(const std::string &path, const ModelLoadOptions &options) {
    TD_ASSIGN_OR_RETURN(gguf::File file, gguf::File::open(path));
    return load(std::move(file), options);
}

Result<std::shared_ptr<Model>> Model::load(gguf::File file, const ModelLoadOptions &options) {
    std::shared_ptr<Model> model(new Model());
    model->file_ = std::move(file);
    TD_TRY(model->bind(options));
    if (!options.pack_dir.empty()) model->pack_matrices(options.pack_dir);
    if (options.huge_pages) model->advise_pages();
    return model;
}

Status Model::bind(const ModelLoadOptions &options) {
    const gguf::File &f = file_;
    TD_ASSIGN_OR_RETURN(std::string arch_name, f.get_string("general.architecture"));
    arch_ = find_architecture(arch_name);
    if (arch_ == nullptr)
        return make_error(ErrorKind::unimplemented, "{}: architecture '{}' is not supported (supported: {})",
                          f.path(), arch_name, fmt::join(architecture_names(), ", "));
    TD_ASSIGN_OR_RETURN(hp_, arch_->load_hparams(f));

    layer_first_ = options.layer_first;
    layer_last_ = options.layer_last < 0 ? hp_.n_layer : options.layer_last;
    if (layer_first_ < 0 || layer_first_ > layer_last_ || layer_last_ > hp_.n_layer)
        return invalid_input("{}: layer range [{}, {}) is outside the model's {} layers", f.path(),
                             layer_first_, layer_last_, hp_.n_layer);

    // The embedding defines n_vocab when no key did. A pipeline stage's file may lack the embedding; its
    // vocabulary size then comes from the keys (vocab_size or the token list).
    const gguf::TensorInfo *embd = f.find_tensor("token_embd.weight");
    if (hp_.n_vocab <= 0) {
        if (embd == nullptr) return invalid_input("{}: missing tensor 'token_embd.weight'", f.path());
        hp_.n_vocab = static_cast<int32_t>(embd->ne[1]);
    }
    const int64_t n_vocab = hp_.n_vocab;
    TD_ASSIGN_OR_RETURN(slice_, tp_slice_read(f, hp_));
    const int64_t n_embd = hp_.n_embd, n_q = n_embd_q_local(), n_kv = n_embd_kv_local(), n_ff = n_ff_local();

    if (layer_first_ == 0) {
        TD_ASSIGN_OR_RETURN(tok_embd_, get_tensor(f, "token_embd.weight", {n_embd, n_vocab}));
    }
    if (layer_last_ == hp_.n_layer) {
        TD_ASSIGN_OR_RETURN(output_norm_, get_tensor(f, "output_norm.weight", {n_embd}, true, true));
        // A slice file always has its own output rows; a whole model may tie them to the embedding.
        TD_ASSIGN_OR_RETURN(output_,
                            get_tensor(f, "output.weight", {n_embd, n_vocab_local()}, is_slice()));
        if (output_.data == nullptr) {  // tied embeddings
            TD_ASSIGN_OR_RETURN(output_, get_tensor(f, "token_embd.weight", {n_embd, n_vocab}));
        }
    }

    layers_.assign(hp_.n_layer, LayerWeights{});
    for (int32_t il = layer_first_; il < layer_last_; ++il) {
        auto name = [il](const char *what) { return fmt::format("blk.{}.{}", il, what); };
        LayerWeights &l = layers_[il];
        TD_ASSIGN_OR_RETURN(l.attn_norm, get_tensor(f, name("attn_norm.weight"), {n_embd}, true, true));
        TD_ASSIGN_OR_RETURN(l.wq, get_tensor(f, name("attn_q.weight"), {n_embd, n_q}));
        TD_ASSIGN_OR_RETURN(l.wk, get_tensor(f, name("attn_k.weight"), {n_embd, n_kv}));
        TD_ASSIGN_OR_RETURN(l.wv, get_tensor(f, name("attn_v.weight"), {n_embd, n_kv}));
        TD_ASSIGN_OR_RETURN(l.wo, get_tensor(f, name("attn_output.weight"), {n_q, n_embd}));
        TD_ASSIGN_OR_RETURN(l.ffn_norm, get_tensor(f, name("ffn_norm.weight"), {n_embd}, true, true));
        TD_ASSIGN_OR_RETURN(l.w_gate, get_tensor(f, name("ffn_gate.weight"), {n_embd, n_ff}));
        TD_ASSIGN_OR_RETURN(l.w_up, get_tensor(f, name("ffn_up.weight"), {n_embd, n_ff}));
        TD_ASSIGN_OR_RETURN(l.w_down, get_tensor(f, name("ffn_down.weight"), {n_ff, n_embd}));
        const bool bias = arch_->has_qkv_bias;
        TD_ASSIGN_OR_RETURN(l.bq, get_tensor(f, name("attn_q.bias"), {n_q}, bias, true));
        TD_ASSIGN_OR_RETURN(l.bk, get_tensor(f, name("attn_k.bias"), {n_kv}, bias, true));
        TD_ASSIGN_OR_RETURN(l.bv, get_tensor(f, name("attn_v.bias"), {n_kv}, bias, true));
        const bool qk_norm = arch_->has_qk_norm;
        TD_ASSIGN_OR_RETURN(l.q_norm,
                            get_tensor(f, name("attn_q_norm.weight"), {hp_.head_dim}, qk_norm, true));
        TD_ASSIGN_OR_RETURN(l.k_norm,
                            get_tensor(f, name("attn_k_norm.weight"), {hp_.head_dim}, qk_norm, true));
        const bool post_norms = arch_->has_post_norms;
        TD_ASSIGN_OR_RETURN(l.attn_post_norm,
                            get_tensor(f, name("post_attention_norm.weight"), {n_embd}, post_norms, true));
        TD_ASSIGN_OR_RETURN(l.ffn_post_norm,
                            get_tensor(f, name("post_ffw_norm.weight"), {n_embd}, post_norms, true));
        l.loaded = true;
    }

    TD_TRY(own_small_tensors());

    // RoPE frequency factors: a rope_freqs tensor (llama 3.1+ converters) wins over the keys.
    if (const gguf::TensorInfo *rf = f.find_tensor("rope_freqs.weight")) {
        if (rf->type != DType::f32 || rf->n_dims != 1 || rf->ne[0] != hp_.n_rot / 2)
            return invalid_input("{}: tensor 'rope_freqs.weight' must be f32 [{}]", f.path(), hp_.n_rot / 2);
        const float *p = reinterpret_cast<const float *>(rf->data);
        rope_freqs_.assign(p, p + hp_.n_rot / 2);
    } else if (hp_.rope_scaling == RopeScaling::llama3) {
        rope_freqs_ = llama3_freq_factors(hp_);
    }
    return {};
}

Status Model::own_small_tensors() {
    std::vector<TensorView *> views;
    if (output_norm_.data != nullptr) views.push_back(&output_norm_);
    for (int32_t il = layer_first_; il < layer_last_; ++il) {
        LayerWeights &l = layers_[il];
        for (TensorView *v : {&l.attn_norm, &l.ffn_norm, &l.bq, &l.bk, &l.bv, &l.q_norm, &l.k_norm,
                              &l.attn_post_norm, &l.ffn_post_norm})
            if (v->data != nullptr) views.push_back(v);
    }
    // Each tensor starts at a multiple of 16 floats of small_.
    auto padded = [](const TensorView *v) { return (static_cast<size_t>(v->n_elements()) + 15) / 16 * 16; };
    size_t total = 0;
    for (const TensorView *v : views) total += padded(v);
    small_.assign(total, 0.0f);
    const int fd = ::open(file_.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return make_error(ErrorKind::io, "{}: cannot open for reading: {}", file_.path(),
                          std::strerror(errno));
    size_t at = 0;
    for (TensorView *v : views) {
        const size_t bytes = v->n_bytes();
        const auto offset =
            static_cast<off_t>(static_cast<const uint8_t *>(v->data) - file_.mapping().data());
        float *dst = &small_[at];
        if (::pread(fd, dst, bytes, offset) != static_cast<ssize_t>(bytes)) {
            const int err = errno;
            ::close(fd);
            return make_error(ErrorKind::io, "{}: cannot read tensor '{}': {}", file_.path(), v->name,
                              err != 0 ? std::strerror(err) : "short read");
        }
        v->data = dst;
        at += padded(v);
    }
    ::close(fd);
    return {};
}

void Model::pack_matrices(const std::string &dir) {
    std::vector<TensorView *> views;
    // The output head, unless it is the embedding (whose rows are looked up in the GGUF layout).
    if (output_.data != nullptr && output_.name != "token_embd.weight") views.push_back(&output_);
    for (int32_t il = layer_first_; il < layer_last_; ++il) {
        LayerWeights &l = layers_[il];
        for (TensorView *v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) views.push_back(v);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto r = pack_weights(file_, views, dir);
    if (!r.ok()) {
        log_warn("{}; running on the unpacked rows (slower)", r.status().message());
        return;
    }
    pack_ = std::move(r).value();
    if (pack_.n_tensors == 0) return;
    if (pack_.memory != nullptr)
        log_warn(
            "{}; packed {} matrices ({:.1f} MiB) in memory instead, to be packed again at the next start",
            pack_.unwritten, pack_.n_tensors, static_cast<double>(pack_.n_bytes) / (1 << 20));
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (pack_.reused)
        log_debug("packed weights: {} matrices from {}", pack_.n_tensors, pack_.path);
    else
        log_info("packed {} matrices ({:.1f} MiB) into {} in {:.1f} s", pack_.n_tensors,
                 static_cast<double>(pack_.n_bytes) / (1 << 20), pack_.path, s);
}

void Model::advise_pages() {
    // Below this, a 4 KiB-page TLB miss per 4 KiB is not worth a page-cache check.
    constexpr size_t kMinStreamedBytes = size_t{64} << 20;
    auto report = [](const MappedFile &m, HugePages h) {
        if (h == HugePages::refreshed)
            log_info("{}: re-reading the weights in 2 MiB pages (the page cache held some in 4 KiB pages)",
                     m.path());
        else
            log_debug("{}: 2 MiB pages {}", m.path(), huge_pages_name(h));
    };
    if (pack_.map != nullptr && pack_.map->size() >= kMinStreamedBytes)
        report(*pack_.map, pack_.map->prefer_huge_pages(0, pack_.map->size()));

    // The GGUF: the matrices matmul reads from it (those not packed) are streamed every token.
    size_t streamed = 0;
    auto count = [&](const TensorView &v) {
        if (v.data != nullptr && v.packed == nullptr) streamed += v.n_bytes();
    };
    count(output_);
    for (int32_t il = layer_first_; il < layer_last_; ++il) {
        const LayerWeights &l = layers_[il];
        for (const TensorView *v : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) count(*v);
    }
    const MappedFile &gguf = file_.mapping();
    const size_t data_begin = std::min(gguf.size(), file_.data_offset()), data_len = gguf.size() - data_begin;
    if (streamed < kMinStreamedBytes) {
        // Only embedding rows are read through this mapping (norms and biases were copied out): in 2 MiB
        // pages each row would map (and count in RSS) the 2 MiB around it.
        gguf.avoid_huge_pages(data_begin, data_len);
        return;
    }
    report(gguf, gguf.prefer_huge_pages(data_begin, data_len));
    // The embedding is read a row per token; unless it is also the output head read from these bytes.
    const bool embd_streamed = output_.data == tok_embd_.data && output_.packed == nullptr;
    if (tok_embd_.data != nullptr && !embd_streamed)
        gguf.avoid_huge_pages(static_cast<size_t>(static_cast<const uint8_t *>(tok_embd_.data) - gguf.data()),
                              tok_embd_.n_bytes());
}

size_t Model::layer_weight_bytes(int32_t il) const {
    size_t total = 0;
    const std::string prefix = fmt::format("blk.{}.", il);
    for (const auto &t : file_.tensors())
        if (t.name.compare(0, prefix.size(), prefix) == 0) total += t.n_bytes;
    return total;
}

size_t Model::tensor_bytes_total() const {
    size_t total = 0;
    for (const auto &t : file_.tensors()) total += t.n_bytes;
    return total;
}

}  // namespace td
