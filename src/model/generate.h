// Single-sequence generation on an Engine: prefill the prompt in chunks (queued back to back, so a pipeline
// overlaps them), then sample token by token. Used by `tandem run` and the tests; the server's scheduler
// batches many sequences instead.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/draft.h"
#include "model/drafter.h"
#include "model/engine.h"
#include "model/sampler.h"

namespace td {

struct GenerateParams {
    int32_t n_predict = -1;    // tokens to generate; -1 = until end of generation or the context is full
    int32_t n_batch = 512;     // prompt tokens per step
    int32_t seq = 0;           // sequence slot to use (restarted first)
    bool want_logits = false;  // pass each step's logits row to the callback
    DraftParams draft;         // speculative decoding (draft.n_max 0: off): up to n_max guesses per step
    Drafter *drafter = nullptr;  // where the guesses come from; null: prompt lookup (LookupDrafter)
    // Constrained sampling (a grammar, a JSON schema): when set, each token is what pick draws from its
    // step's logits ([n_vocab]); the engine's own draw (greedy) is not used, and no guesses are made. An
    // error from pick ends the generation with it.
    std::function<Result<int32_t>(const float *logits)> pick;
};

enum class StopReason { length, eog, context_full, callback };
const char *stop_reason_name(StopReason reason);

struct GenerateStats {
    int32_t n_prompt = 0;
    int32_t n_generated = 0;
    double prompt_seconds = 0.0;  // until the first token is sampled
    double gen_seconds = 0.0;     // from the first sampled token to the last
    int32_t n_steps = 0;          // generation steps (fewer than n_generated when drafts were accepted)
    int32_t n_drafted = 0;        // tokens guessed
    int32_t n_accepted = 0;       // of them, the ones the sampler drew
    StopReason stop = StopReason::length;
};

// Called for each sampled token; `logits` is the row it was drawn from ([n_vocab]) when
// params.want_logits, else null. Return false to stop. End-of-generation tokens are reported too, then
// generation stops.
using TokenCallback = std::function<bool(int32_t token, const float *logits)>;

// Errors: empty prompt; prompt not shorter than the context ("prompt has 600 tokens but the context holds
// 512; raise -c or shorten the prompt"); any engine error. `is_eog` says which tokens end generation.
Result<GenerateStats> generate(Engine &engine, const SamplerParams &sampling, const std::vector<int32_t> &prompt,
                               const GenerateParams &params, const std::function<bool(int32_t)> &is_eog,
                               const TokenCallback &on_token);

}  // namespace td
