// Random-weight llama models with a real shape and a real vocabulary, for tests and benchmarks
// (`tandem synth`). The files are standard GGUF v3 that llama.cpp loads too.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/thread-pool.h"
#include "tensor/dtype.h"

namespace td {

struct SynthParams {
    int32_t n_embd = 256;
    int32_t n_layer = 4;
    int32_t n_head = 8;
    int32_t n_head_kv = 4;
    int32_t n_ff = 768;
    int32_t n_ctx = 2048;
    float rope_freq_base = 10000.0f;
    DType type = DType::f32;   // every matrix; norms stay f32
    bool tied_output = false;  // no output.weight: logits use the token embedding
    uint64_t seed = 42;
    std::string vocab_from;  // a GGUF whose tokenizer.* keys are copied (its token count sets n_vocab)
    std::string name = "tandem-synth";
};

// Writes the model to `path`. Weights are uniform with the variance of N(0, 0.02^2) (deterministic for a
// seed), quantized to `type` with the reference quantizer. Errors: shape problems (n_embd not a multiple
// of n_head or of the type's block size, n_head not a multiple of n_head_kv), unreadable vocab file, i/o.
Status synth_model(const SynthParams &params, const std::string &path, ThreadPool &pool);

}  // namespace td
