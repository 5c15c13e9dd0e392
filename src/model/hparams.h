// Hyperparameters of a decoder-only transformer, read from GGUF metadata ("<arch>.block_count", ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"

namespace td {

enum class RopeScaling { none = 0, linear = 1, llama3 = 2 };

// How an embedding is made of a prompt's final-normed hidden states (GGUF `<arch>.pooling_type`, llama.cpp's
// values): none = one vector per token, mean = their average, cls = the first token's, last = the last's.
// unset: the file does not say (rank, 4, is a reranker's and not supported).
enum class Pooling { unset = -1, none = 0, mean = 1, cls = 2, last = 3 };
const char *pooling_name(Pooling p);  // "none", "mean", "cls", "last", "unset"
// "none" | "mean" | "cls" | "last" -> the pooling; anything else invalid_input.
Result<Pooling> parse_pooling(const std::string &name);

struct HParams {
    std::string arch;  // general.architecture
    std::string name;  // general.name (may be empty)
    int32_t n_vocab = 0;
    int32_t n_ctx_train = 0;
    int32_t n_embd = 0;
    int32_t n_layer = 0;
    int32_t n_head = 0;
    int32_t n_head_kv = 0;
    int32_t head_dim = 0;  // n_embd / n_head unless attention.key_length says otherwise
    int32_t n_ff = 0;
    float rms_eps = 1e-5f;

    int32_t n_rot = 0;  // rope.dimension_count
    float rope_freq_base = 10000.0f;
    kernels::RopeOrder rope_order = kernels::RopeOrder::adjacent;
    RopeScaling rope_scaling = RopeScaling::none;
    float rope_scale_factor = 1.0f;  // linear: positions divided by it
    // llama3 scaling (when no rope_freqs tensor ships): per-frequency factors are computed from these.
    float rope_llama3_low_freq_factor = 1.0f;
    float rope_llama3_high_freq_factor = 4.0f;
    int32_t rope_orig_ctx = 8192;

    // Sliding-window attention (`attention.sliding_window`): a query at position p sees keys at positions
    // p - n_swa + 1 .. p in the layers swa_layers marks; n_swa 0 = every layer attends to the whole context.
    int32_t n_swa = 0;
    std::vector<uint8_t> swa_layers;  // [n_layer] 1 = sliding window; filled when n_swa > 0
    bool layer_is_swa(int32_t il) const { return n_swa > 0 && swa_layers[static_cast<size_t>(il)] != 0; }

    // Gemma 2: logit soft-capping s -> c * tanh(s / c) of the attention scores and of the output logits
    // (0 = none), and a query scale of its own: when attn_q_scale > 0 the queries are multiplied by it (in
    // f32, after RoPE) and the scores are not scaled again; 0 = scores scaled by 1/sqrt(head_dim).
    float attn_softcap = 0.0f;
    float final_softcap = 0.0f;
    float attn_q_scale = 0.0f;

    Pooling pooling = Pooling::unset;  // pooling_type

    int32_t n_embd_q() const { return n_head * head_dim; }
    int32_t n_embd_kv() const { return n_head_kv * head_dim; }
    int32_t n_gqa() const { return n_head / n_head_kv; }
};

// What an architecture assumes when the file leaves the sliding window out.
struct SwaDefaults {
    int32_t n_swa = 0;   // window when attention.sliding_window is absent (0: none)
    int32_t period = 0;  // when attention.sliding_window_pattern is absent: layer il slides when
                         // il % period < period - 1 (2: every even layer, gemma2); 0: every layer slides
};

// Reads the keys every llama-family architecture shares under the "<arch>." prefix and validates them
// (positive sizes, n_head divisible by n_head_kv, ...). Errors name the file and key.
Result<HParams> read_hparams(const gguf::File &file, std::string_view arch,
                             const SwaDefaults &swa_defaults = {});

// Weights and KV memory, in bytes, of one layer (for `info` and placement).
struct LayerMemory {
    size_t weights = 0;
    size_t kv_per_token = 0;  // K + V for one position, at the cache type
};

}  // namespace td
