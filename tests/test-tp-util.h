// Shared by the tensor-parallel tests (test-tp.cpp in one process, test-tp-cluster.cpp over workers).
#pragma once

#include <cstdint>
#include <string>

#include "core/thread-pool.h"
#include "model/sampler.h"
#include "model/synth.h"
#include "test-util.h"

namespace td::test {

// A small synthesized model of `arch` (8 query and 4 KV heads, so 2 and 3 ranks both split it; 3 layers,
// stories260K's vocabulary) written to `path`. Seed 3: its first near tie (top-2 margin < 1e-3) comes late
// enough for every registered architecture. gemma2: a window of 8 and an attention cap below its largest
// scores (~0.1), so both change the result.
inline Status synth_tp_model(const std::string &arch, DType type, const std::string &path) {
    SynthParams p;
    p.arch = arch;
    p.n_embd = 128;
    p.n_layer = 3;
    p.n_head = 8;
    p.n_head_kv = 4;
    p.n_ff = 256;
    p.n_ctx = 256;
    p.n_swa = arch == "gemma2" ? 8 : 0;
    p.attn_softcap = 0.05f;
    p.final_softcap = 2.0f;
    p.type = type;
    p.seed = 3;
    p.vocab_from = shared_path("models/stories260K.gguf");
    ThreadPool pool(2);
    return synth_model(p, path, pool);
}

// Greedy decoding, and the seeded sampling both sides must draw the same text from.
inline SamplerParams greedy() {
    SamplerParams sp;
    sp.temperature = 0.0f;
    return sp;
}

inline SamplerParams seeded(uint64_t seed) {
    SamplerParams sp;
    sp.temperature = 0.8f;
    sp.top_p = 0.9f;
    sp.seed = seed;
    return sp;
}

}  // namespace td::test
