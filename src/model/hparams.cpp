#include "model/hparams.h"

#include <fmt/format.h>

namespace td {
namespace {

Result<int32_t> positive_i32(const gguf::File &file, const std::string &key) {
    TD_ASSIGN_OR_RETURN(int64_t v, file.get_int(key));
    if (v <= 0 || v > (int64_t{1} << 30))
        return invalid_input("{}: key '{}' = {} is out of range", file.path(), key, v);
    return static_cast<int32_t>(v);
}

Result<int32_t> optional_i32(const gguf::File &file, const std::string &key, int32_t fallback) {
    TD_ASSIGN_OR_RETURN(std::optional<int64_t> v, file.get_int_opt(key));
    if (!v) return fallback;
    if (*v <= 0 || *v > (int64_t{1} << 30))
        return invalid_input("{}: key '{}' = {} is out of range", file.path(), key, *v);
    return static_cast<int32_t>(*v);
}

}  // namespace

Result<HParams> read_hparams(const gguf::File &file, std::string_view arch_view,
                             const SwaDefaults &swa_defaults) {
    const std::string arch(arch_view);
    auto key = [&](std::string_view suffix) { return fmt::format("{}.{}", arch, suffix); };
    HParams hp;
    hp.arch = arch;
    TD_ASSIGN_OR_RETURN(auto name, file.get_string_opt("general.name"));
    hp.name = name.value_or("");

    TD_ASSIGN_OR_RETURN(hp.n_embd, positive_i32(file, key("embedding_length")));
    TD_ASSIGN_OR_RETURN(hp.n_layer, positive_i32(file, key("block_count")));
    TD_ASSIGN_OR_RETURN(hp.n_ff, positive_i32(file, key("feed_forward_length")));
    TD_ASSIGN_OR_RETURN(hp.n_head, positive_i32(file, key("attention.head_count")));
    TD_ASSIGN_OR_RETURN(hp.n_head_kv, optional_i32(file, key("attention.head_count_kv"), hp.n_head));
    TD_ASSIGN_OR_RETURN(hp.n_ctx_train, optional_i32(file, key("context_length"), 2048));
    if (hp.n_head % hp.n_head_kv != 0)
        return invalid_input("{}: head_count {} is not a multiple of head_count_kv {}", file.path(),
                             hp.n_head, hp.n_head_kv);
    TD_ASSIGN_OR_RETURN(hp.head_dim, optional_i32(file, key("attention.key_length"), hp.n_embd / hp.n_head));
    TD_ASSIGN_OR_RETURN(int32_t v_len, optional_i32(file, key("attention.value_length"), hp.head_dim));
    if (v_len != hp.head_dim)
        return make_error(ErrorKind::unimplemented, "{}: value_length {} differs from key_length {}",
                          file.path(), v_len, hp.head_dim);
    if (hp.head_dim % 2 != 0 || hp.head_dim > 1024)
        return invalid_input("{}: head size {} must be even and at most 1024", file.path(), hp.head_dim);

    TD_ASSIGN_OR_RETURN(auto eps, file.get_f32_opt(key("attention.layer_norm_rms_epsilon")));
    hp.rms_eps = eps.value_or(1e-5f);
    if (!(hp.rms_eps > 0.0f && hp.rms_eps < 1.0f))
        return invalid_input("{}: layer_norm_rms_epsilon {} out of range", file.path(), hp.rms_eps);

    TD_ASSIGN_OR_RETURN(hp.n_rot, optional_i32(file, key("rope.dimension_count"), hp.head_dim));
    if (hp.n_rot > hp.head_dim || hp.n_rot % 2 != 0)
        return invalid_input("{}: rope.dimension_count {} must be even and <= head size {}", file.path(),
                             hp.n_rot, hp.head_dim);
    TD_ASSIGN_OR_RETURN(auto base, file.get_f32_opt(key("rope.freq_base")));
    hp.rope_freq_base = base.value_or(10000.0f);
    if (!(hp.rope_freq_base > 0.0f))
        return invalid_input("{}: rope.freq_base {} must be positive", file.path(), hp.rope_freq_base);

    TD_ASSIGN_OR_RETURN(auto scaling, file.get_string_opt(key("rope.scaling.type")));
    TD_ASSIGN_OR_RETURN(auto factor, file.get_f32_opt(key("rope.scaling.factor")));
    // Older files carry only rope.scale_linear.
    TD_ASSIGN_OR_RETURN(auto scale_linear, file.get_f32_opt(key("rope.scale_linear")));
    if (scaling && *scaling == "linear") {
        hp.rope_scaling = RopeScaling::linear;
        hp.rope_scale_factor = factor.value_or(1.0f);
    } else if (scaling && *scaling == "llama3") {
        hp.rope_scaling = RopeScaling::llama3;
        hp.rope_scale_factor = factor.value_or(8.0f);
    } else if (scaling && *scaling != "none") {
        return make_error(ErrorKind::unimplemented,
                          "{}: rope scaling '{}' is not supported (linear, llama3 are)", file.path(),
                          *scaling);
    } else if (scale_linear && *scale_linear != 1.0f) {
        hp.rope_scaling = RopeScaling::linear;
        hp.rope_scale_factor = *scale_linear;
    }
    if (!(hp.rope_scale_factor > 0.0f))
        return invalid_input("{}: rope scaling factor {} must be positive", file.path(),
                             hp.rope_scale_factor);
    TD_ASSIGN_OR_RETURN(auto low, file.get_f32_opt(key("rope.scaling.low_freq_factor")));
    TD_ASSIGN_OR_RETURN(auto high, file.get_f32_opt(key("rope.scaling.high_freq_factor")));
    TD_ASSIGN_OR_RETURN(hp.rope_orig_ctx,
                        optional_i32(file, key("rope.scaling.original_context_length"), 8192));
    hp.rope_llama3_low_freq_factor = low.value_or(1.0f);
    hp.rope_llama3_high_freq_factor = high.value_or(4.0f);

    // Sliding window: all layers (Mistral style) unless a pattern (or the architecture's default period)
    // says which. The pattern is either an array of bools, one per layer, or a period n: layer il slides when
    // il % n < n - 1 (llama.cpp's rule: every n-th layer attends globally).
    TD_ASSIGN_OR_RETURN(std::optional<int64_t> swa, file.get_int_opt(key("attention.sliding_window")));
    if (!swa && swa_defaults.n_swa > 0) swa = swa_defaults.n_swa;
    if (swa && *swa > 0) {
        if (*swa > (int64_t{1} << 30))
            return invalid_input("{}: attention.sliding_window {} is out of range", file.path(), *swa);
        hp.n_swa = static_cast<int32_t>(*swa);
        hp.swa_layers.assign(static_cast<size_t>(hp.n_layer), 1);
        if (const gguf::Value *pattern = file.find(key("attention.sliding_window_pattern"))) {
            if (pattern->type == gguf::ValueType::array) {
                if (pattern->ints.size() != static_cast<size_t>(hp.n_layer))
                    return invalid_input("{}: attention.sliding_window_pattern has {} entries for {} layers",
                                         file.path(), pattern->ints.size(), hp.n_layer);
                for (int32_t il = 0; il < hp.n_layer; ++il) hp.swa_layers[il] = pattern->ints[il] != 0;
            } else {
                TD_ASSIGN_OR_RETURN(int32_t period,
                                    positive_i32(file, key("attention.sliding_window_pattern")));
                for (int32_t il = 0; il < hp.n_layer; ++il) hp.swa_layers[il] = il % period < period - 1;
            }
        } else if (const int32_t period = swa_defaults.period; period > 0) {
            for (int32_t il = 0; il < hp.n_layer; ++il) hp.swa_layers[il] = il % period < period - 1;
        }
    }

    TD_ASSIGN_OR_RETURN(auto pooling, file.get_int_opt(key("pooling_type")));
    // Another value (4: a reranker's rank) leaves it unset: the model still generates.
    if (pooling && *pooling >= 0 && *pooling <= static_cast<int64_t>(Pooling::last))
        hp.pooling = static_cast<Pooling>(*pooling);

    // The vocabulary size comes from the key when present, else from the tokenizer's token list.
    TD_ASSIGN_OR_RETURN(auto n_vocab, file.get_int_opt(key("vocab_size")));
    if (n_vocab) {
        hp.n_vocab = static_cast<int32_t>(*n_vocab);
    } else if (const gguf::Value *tokens = file.find("tokenizer.ggml.tokens")) {
        hp.n_vocab = static_cast<int32_t>(tokens->array_size());
    }
    return hp;
}

const char *pooling_name(Pooling p) {
    switch (p) {
        case Pooling::none:
            return "none";
        case Pooling::mean:
            return "mean";
        case Pooling::cls:
            return "cls";
        case Pooling::last:
            return "last";
        case Pooling::unset:
            break;
    }
    return "unset";
}

Result<Pooling> parse_pooling(const std::string &name) {
    for (Pooling p : {Pooling::none, Pooling::mean, Pooling::cls, Pooling::last})
        if (name == pooling_name(p)) return p;
    return invalid_input("pooling '{}' is not one of none, mean, cls, last", name);
}

}  // namespace td
