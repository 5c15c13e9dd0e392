// Perplexity of a text, as llama.cpp's llama-perplexity measures it: the tokens are cut into chunks of n_ctx,
// each chunk is run from an empty cache (its first token replaced by BOS where the vocabulary adds one), and
// the second half of each chunk is scored: the negative log-likelihood of every token from position
// n_ctx/2 + 1 on, under the logits of the position before it. PPL = exp(mean NLL). Runs on any Engine, so a
// pipeline or a tensor-parallel cluster scores a model no single machine holds; chunks go to the engine's
// sequence slots side by side, and steps are queued up to max_in_flight so a pipeline's stages overlap.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "core/status.h"
#include "model/engine.h"

namespace td {

struct PerplexityParams {
    int32_t n_ctx = 512;     // tokens per chunk (llama-perplexity's -c); at most the engine's n_ctx
    int32_t n_batch = 2048;  // rows per step at most
    int32_t n_chunks = -1;   // score at most this many chunks; -1: every whole chunk of the text
    int32_t bos = -1;  // each chunk's first token is replaced by this id (llama.cpp with add_bos); -1: kept
};

struct PerplexityResult {
    int32_t n_chunks = 0;   // chunks scored
    int64_t n_scored = 0;   // tokens scored: n_chunks * (n_ctx - 1 - n_ctx / 2)
    double nll_sum = 0.0;   // sum of -log p(token)
    double nll2_sum = 0.0;  // sum of its squares
    double ppl() const;
    // llama.cpp's "+/-": the standard error of the mean NLL, times ppl (first-order error of exp). 0 with
    // fewer than two scored tokens.
    double ppl_error() const;
};

// Scores `tokens`. on_chunk (optional) is called once per chunk, in chunk order, with the chunk's index and
// the totals up to and including it (llama-perplexity's running "[i]ppl"). Uses the engine's slots
// 0..min(n_seq, chunks)-1 and restarts them (seq_start); leaves them started. Each scored token is a score
// row (kOutScore): the engine returns its log-probability, computed where the logits are.
// Errors: n_ctx < 4 or above the engine's context, fewer than n_ctx tokens, a token or bos out of the
// vocabulary (invalid_input); the engine's errors as they are.
Result<PerplexityResult> perplexity(
    Engine &engine, std::span<const int32_t> tokens, const PerplexityParams &params,
    const std::function<void(int32_t chunk, const PerplexityResult &so_far)> &on_chunk = {});

}  // namespace td
