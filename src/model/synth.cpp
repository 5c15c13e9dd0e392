#include "model/synth.h"

#include <fmt/core.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/kernels.h"

namespace td {
namespace {

// splitmix64: a fast, well-mixed generator; each tensor gets its own stream so rows can fill in parallel.
uint64_t splitmix64(uint64_t &state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

struct TensorMaker {
    gguf::Writer &writer;
    ThreadPool &pool;
    uint64_t seed;
    int tensor_index = 0;

    // An f32 vector of n values uniform in [center - spread, center + spread] (biases, Q/K norm weights).
    Status vector(const std::string &name, int64_t n, float center, float spread) {
        ++tensor_index;
        uint64_t state = seed * 1000003ull + static_cast<uint64_t>(tensor_index);
        std::vector<float> v(n);  // [n]
        for (float &x : v) {
            const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
            x = center + static_cast<float>((2.0 * u - 1.0) * spread);
        }
        writer.add_tensor(name, DType::f32, {n}, v.data(), v.size() * sizeof(float));
        return {};
    }

    // A matrix [rows of n_in] in `type`, or a vector (rows == 0) of ones in f32 (norm weights).
    Status add(const std::string &name, int64_t n_in, int64_t rows, DType type) {
        ++tensor_index;
        if (rows == 0) {
            std::vector<float> ones(n_in, 1.0f);
            writer.add_tensor(name, DType::f32, {n_in}, ones.data(), ones.size() * sizeof(float));
            return {};
        }
        const kernels::TypeKernels *k = kernels::type_kernels_ref(type);
        if (type != DType::f32 && k == nullptr)
            return make_error(ErrorKind::unimplemented, "synth: type {} cannot be quantized yet",
                              dtype_name(type));
        if (n_in % dtype_traits(type).block_size != 0)
            return invalid_input("synth: tensor '{}' rows of {} are not a multiple of {}'s block size {}",
                                 name, n_in, dtype_name(type), dtype_traits(type).block_size);
        const size_t row_bytes = dtype_row_bytes(type, n_in);
        std::vector<uint8_t> data(row_bytes * rows);  // [rows, row_bytes]
        // Uniform in [-a, a] with a = 0.02 * sqrt(3) has the standard deviation 0.02 of common inits.
        const float a = 0.02f * std::sqrt(3.0f);
        const uint64_t tensor_seed = seed * 1000003ull + static_cast<uint64_t>(tensor_index);
        pool.parallel_for(
            rows,
            [&](int64_t b, int64_t e) {
                std::vector<float> row(n_in);  // [n_in]
                for (int64_t r = b; r < e; ++r) {
                    uint64_t state = tensor_seed ^ (static_cast<uint64_t>(r) * 0x2545f4914f6cdd1dull);
                    for (int64_t i = 0; i < n_in; ++i) {
                        const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;  // [0, 1)
                        row[i] = static_cast<float>((2.0 * u - 1.0) * a);
                    }
                    if (type == DType::f32) {
                        std::memcpy(&data[r * row_bytes], row.data(), row_bytes);
                    } else {
                        k->from_float(row.data(), &data[r * row_bytes], n_in);
                    }
                }
            },
            8);
        writer.add_tensor(name, type, {n_in, rows}, data.data(), data.size());
        return {};
    }
};

// llama.cpp's use_more_bits(i_layer, n_layers) from llama_tensor_get_type.
bool use_more_bits(int32_t il, int32_t n_layer) {
    return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
}

bool ends_with(std::string_view s, std::string_view suffix) {
    return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

Status synth_parse_type(std::string_view name, SynthParams &params) {
    std::string lower(name);
    for (auto &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const std::pair<std::string_view, SynthMix> mixes[] = {
        {"q3_k_m", SynthMix::q3_k_m}, {"q4_k_m", SynthMix::q4_k_m}, {"q5_k_m", SynthMix::q5_k_m}};
    for (const auto &[mix_name, mix] : mixes) {
        if (lower == mix_name) {
            params.mix = mix;
            return {};
        }
    }
    auto type = dtype_from_name(name);
    if (!type.ok())
        return invalid_input("{}; or a llama.cpp mix: q3_k_m, q4_k_m, q5_k_m", type.status().message());
    params.type = *type;
    params.mix = SynthMix::none;
    return {};
}

DType synth_tensor_type(const SynthParams &p, std::string_view tensor, int32_t layer, int64_t n_in) {
    DType type = p.type;
    if (p.mix == SynthMix::q3_k_m) {
        type = DType::q3_k;
        if (tensor == "output.weight" || (tensor == "token_embd.weight" && p.tied_output)) type = DType::q6_k;
        if (ends_with(tensor, ".attn_v.weight")) type = layer < 2 ? DType::q5_k : DType::q4_k;
        if (ends_with(tensor, ".ffn_down.weight")) type = layer < p.n_layer / 16 ? DType::q5_k : DType::q4_k;
        if (ends_with(tensor, ".attn_output.weight")) type = DType::q4_k;
    } else if (p.mix != SynthMix::none) {
        const DType base = p.mix == SynthMix::q4_k_m ? DType::q4_k : DType::q5_k;
        type = base;
        if (tensor == "output.weight") type = DType::q6_k;
        if (tensor == "token_embd.weight") type = p.tied_output ? DType::q6_k : base;
        if ((ends_with(tensor, ".attn_v.weight") || ends_with(tensor, ".ffn_down.weight")) &&
            use_more_bits(layer, p.n_layer))
            type = DType::q6_k;
    }
    if (n_in % dtype_traits(type).block_size == 0) return type;
    // llama.cpp's tensor_type_fallback: rows that are not a multiple of a K-quant's 256 take the 32-element
    // type of about the same size; rows that fit no block type stay f16.
    switch (type) {
        case DType::q2_k:
        case DType::q3_k:
            type = DType::q4_0;
            break;
        case DType::q4_k:
            type = DType::q5_0;
            break;
        case DType::q5_k:
            type = DType::q5_1;
            break;
        case DType::q6_k:
            type = DType::q8_0;
            break;
        default:
            break;
    }
    return n_in % dtype_traits(type).block_size == 0 ? type : DType::f16;
}

Status synth_model(const SynthParams &p, const std::string &path, ThreadPool &pool) {
    const bool gemma2 = p.arch == "gemma2";
    if (p.arch != "llama" && p.arch != "qwen2" && p.arch != "qwen3" && p.arch != "gemma" && !gemma2)
        return invalid_input(
            "synth: --arch '{}' is not one synth writes (llama, qwen2, qwen3, gemma, gemma2)", p.arch);
    if (gemma2 && !(p.attn_softcap > 0.0f && p.final_softcap > 0.0f))
        return invalid_input("synth: soft-caps must be positive (got {} and {})", p.attn_softcap,
                             p.final_softcap);
    if (p.n_embd <= 0 || p.n_layer <= 0 || p.n_head <= 0 || p.n_head_kv <= 0 || p.n_ff <= 0 || p.n_ctx <= 0)
        return invalid_input("synth: every size must be positive");
    if (p.n_swa < 0) return invalid_input("synth: --swa must not be negative");
    if (p.head_dim < 0) return invalid_input("synth: --head-dim must not be negative");
    if (p.head_dim == 0 && p.n_embd % p.n_head != 0)
        return invalid_input("synth: --dim {} is not a multiple of --heads {}", p.n_embd, p.n_head);
    if (p.n_head % p.n_head_kv != 0)
        return invalid_input("synth: --heads {} is not a multiple of --kv-heads {}", p.n_head, p.n_head_kv);
    const int32_t head_dim = p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
    if (head_dim % 2 != 0) return invalid_input("synth: head size {} must be even", head_dim);
    if (p.vocab_from.empty()) return invalid_input("synth: --vocab-from MODEL.gguf is required");
    TD_ASSIGN_OR_RETURN(gguf::File vocab_file, gguf::File::open(p.vocab_from));
    const gguf::Value *tokens = vocab_file.find("tokenizer.ggml.tokens");
    if (tokens == nullptr || tokens->array_size() == 0)
        return invalid_input("{}: has no tokenizer.ggml.tokens to copy", p.vocab_from);
    const int64_t n_vocab = static_cast<int64_t>(tokens->array_size());

    gguf::Writer w;
    auto key = [&](std::string_view suffix) { return fmt::format("{}.{}", p.arch, suffix); };
    w.set_string("general.architecture", p.arch);
    w.set_string("general.name", p.name);
    w.set_u32("general.quantization_version", 2);
    w.set_u32(key("context_length"), static_cast<uint32_t>(p.n_ctx));
    w.set_u32(key("embedding_length"), static_cast<uint32_t>(p.n_embd));
    w.set_u32(key("block_count"), static_cast<uint32_t>(p.n_layer));
    w.set_u32(key("feed_forward_length"), static_cast<uint32_t>(p.n_ff));
    w.set_u32(key("rope.dimension_count"), static_cast<uint32_t>(head_dim));
    w.set_u32(key("attention.head_count"), static_cast<uint32_t>(p.n_head));
    w.set_u32(key("attention.head_count_kv"), static_cast<uint32_t>(p.n_head_kv));
    if (p.head_dim > 0) {
        w.set_u32(key("attention.key_length"), static_cast<uint32_t>(head_dim));
        w.set_u32(key("attention.value_length"), static_cast<uint32_t>(head_dim));
    }
    w.set_f32(key("attention.layer_norm_rms_epsilon"), 1e-5f);
    if (p.n_swa > 0) w.set_u32(key("attention.sliding_window"), static_cast<uint32_t>(p.n_swa));
    if (gemma2) {
        w.set_f32(key("attn_logit_softcapping"), p.attn_softcap);
        w.set_f32(key("final_logit_softcapping"), p.final_softcap);
    }
    w.set_f32(key("rope.freq_base"), p.rope_freq_base);
    w.set_u32(key("vocab_size"), static_cast<uint32_t>(n_vocab));
    for (const auto &[key, value] : vocab_file.metadata())
        if (key.rfind("tokenizer.", 0) == 0) w.set_value(key, value);

    const int64_t n_embd = p.n_embd, n_q = static_cast<int64_t>(p.n_head) * head_dim,
                  n_kv = static_cast<int64_t>(p.n_head_kv) * head_dim;
    TensorMaker make{w, pool, p.seed};
    // A matrix named `name` of layer `il` (-1: outside the blocks), in the type the plan gives it.
    auto matrix = [&](const std::string &name, int64_t n_in, int64_t rows, int32_t il) {
        return make.add(name, n_in, rows, synth_tensor_type(p, name, il, n_in));
    };
    TD_TRY(matrix("token_embd.weight", n_embd, n_vocab, -1));
    TD_TRY(make.add("output_norm.weight", n_embd, 0, DType::f32));
    // Gemma always ties the output to the embedding.
    if (!p.tied_output && p.arch != "gemma" && !gemma2) TD_TRY(matrix("output.weight", n_embd, n_vocab, -1));
    for (int32_t il = 0; il < p.n_layer; ++il) {
        auto name = [il](const char *what) { return fmt::format("blk.{}.{}", il, what); };
        TD_TRY(make.add(name("attn_norm.weight"), n_embd, 0, DType::f32));
        TD_TRY(matrix(name("attn_q.weight"), n_embd, n_q, il));
        TD_TRY(matrix(name("attn_k.weight"), n_embd, n_kv, il));
        TD_TRY(matrix(name("attn_v.weight"), n_embd, n_kv, il));
        if (p.arch == "qwen2") {
            TD_TRY(make.vector(name("attn_q.bias"), n_q, 0.0f, 0.5f));
            TD_TRY(make.vector(name("attn_k.bias"), n_kv, 0.0f, 0.5f));
            TD_TRY(make.vector(name("attn_v.bias"), n_kv, 0.0f, 0.5f));
        }
        if (p.arch == "qwen3") {
            TD_TRY(make.vector(name("attn_q_norm.weight"), head_dim, 1.0f, 0.5f));
            TD_TRY(make.vector(name("attn_k_norm.weight"), head_dim, 1.0f, 0.5f));
        }
        TD_TRY(matrix(name("attn_output.weight"), n_q, n_embd, il));
        if (gemma2) TD_TRY(make.vector(name("post_attention_norm.weight"), n_embd, 1.0f, 0.5f));
        TD_TRY(make.add(name("ffn_norm.weight"), n_embd, 0, DType::f32));
        TD_TRY(matrix(name("ffn_gate.weight"), n_embd, p.n_ff, il));
        TD_TRY(matrix(name("ffn_up.weight"), n_embd, p.n_ff, il));
        TD_TRY(matrix(name("ffn_down.weight"), p.n_ff, n_embd, il));
        if (gemma2) TD_TRY(make.vector(name("post_ffw_norm.weight"), n_embd, 1.0f, 0.5f));
    }
    return w.write(path);
}

}  // namespace td
