// Architectures: how each GGUF `general.architecture` differs from the common decoder block.
// A new architecture is a new file in this folder that registers an Architecture; never a new case in a
// switch elsewhere.
#pragma once

#include <string_view>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace td {

// The feed-forward block's gate activation: out = act(W_gate x) * (W_up x).
enum class FfnAct { silu, gelu };

struct Architecture {
    std::string_view name;  // general.architecture value, e.g. "llama"
    // Reads and validates the hyperparameters (most use read_hparams plus their own rope order).
    Result<HParams> (*load_hparams)(const gguf::File &file) = nullptr;
    bool has_qkv_bias = false;  // attn_q/k/v.bias tensors are required
    bool has_qk_norm = false;   // attn_q_norm / attn_k_norm weights are required
    bool scale_embd = false;    // token embeddings are multiplied by sqrt(n_embd) (gemma)
    // post_attention_norm / post_ffw_norm weights are required: RMSNorm of the attention and of the FFN
    // output before each residual add (gemma2)
    bool has_post_norms = false;
    FfnAct ffn_act = FfnAct::silu;
};

// nullptr when unknown.
const Architecture *find_architecture(std::string_view name);
// Names of all registered architectures, for error messages.
std::vector<std::string_view> architecture_names();

const Architecture &arch_llama();
const Architecture &arch_qwen2();
const Architecture &arch_qwen3();
const Architecture &arch_gemma();
const Architecture &arch_gemma2();

}  // namespace td
