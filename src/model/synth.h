// Random-weight llama models with a real shape and a real vocabulary, for tests and benchmarks
// (`tandem synth`). The files are standard GGUF v3 that llama.cpp loads too.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/thread-pool.h"
#include "tensor/dtype.h"

namespace td {

// llama.cpp's per-tensor mixes (llama-quantize's for the llama architecture, without an imatrix):
// - Q4_K_M / Q5_K_M: the base K type (q4_k / q5_k) for most matrices; q6_k for output.weight (or
//   token_embd.weight when the output is tied) and for attn_v / ffn_down in the layers llama.cpp's
//   use_more_bits picks (the first and last eighth, and every third layer in between).
// - Q3_K_M: q3_k for most matrices; q6_k for the output; attn_v q5_k in layers 0 and 1, else q4_k; ffn_down
//   q5_k in the first sixteenth of the layers, else q4_k; attn_output q4_k.
enum class SynthMix { none, q3_k_m, q4_k_m, q5_k_m };

struct SynthParams {
    // general.architecture: "llama", "qwen2" (adds Q/K/V biases), "qwen3" (adds per-head Q/K norms),
    // "gemma" (GeGLU, scaled embeddings, always tied output) or "gemma2" (gemma plus post-attention and
    // post-FFN norms, logit soft-capping keys, the window on every other layer).
    std::string arch = "llama";
    int32_t n_embd = 256;
    int32_t n_layer = 4;
    int32_t n_head = 8;
    int32_t n_head_kv = 4;
    int32_t head_dim = 0;  // 0: n_embd / n_head; otherwise written as attention.key_length/value_length
    int32_t n_ff = 768;
    int32_t n_ctx = 2048;
    int32_t n_swa = 0;  // > 0: attention.sliding_window, every layer (Mistral style; gemma2: even layers)
    float attn_softcap = 50.0f;   // gemma2: attn_logit_softcapping
    float final_softcap = 30.0f;  // gemma2: final_logit_softcapping
    float rope_freq_base = 10000.0f;
    DType type = DType::f32;        // every matrix; norms stay f32
    SynthMix mix = SynthMix::none;  // when set, overrides `type` per tensor (synth_tensor_type)
    bool tied_output = false;       // no output.weight: logits use the token embedding
    uint64_t seed = 42;
    std::string vocab_from;  // a GGUF whose tokenizer.* keys are copied (its token count sets n_vocab)
    std::string name = "tandem-synth";
};

// Parses a --type value: a dtype name ("q8_0", "q6_k", case-insensitive) sets `type` and clears `mix`; a mix
// name ("q3_k_m", "q4_k_m", "q5_k_m") sets `mix`. Error: any other name, listing the accepted ones.
Status synth_parse_type(std::string_view name, SynthParams &params);
// The type synth writes matrix `tensor` (a GGUF name such as "blk.3.attn_v.weight", rows of n_in elements)
// with; `layer` is its block index (ignored for tensors outside the blocks). Where n_in is not a multiple of
// the type's block size, llama.cpp's fallback: q2_k, q3_k -> q4_0, q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0,
// and f16 where no block type fits.
DType synth_tensor_type(const SynthParams &params, std::string_view tensor, int32_t layer, int64_t n_in);

// Writes the model to `path`. Weights are uniform with the variance of N(0, 0.02^2) (deterministic for a
// seed), quantized to `type` with the reference quantizer; biases, Q/K norm and gemma2 post-norm weights are
// random f32 too (norms around 1), so a forward pass that ignores them gives different logits. Errors:
// unknown arch, non-positive soft-caps, shape problems (n_embd not a multiple of n_head, n_head not a
// multiple of n_head_kv), unreadable vocab file, i/o. Rows that do not fit the type take
// synth_tensor_type's fallback, as llama.cpp's quantizer does.
Status synth_model(const SynthParams &params, const std::string &path, ThreadPool &pool);

}  // namespace td
