// llama-server's own completion API (POST /completion, also /completions): the request body -> ApiRequest,
// results -> its response objects, as scripts written against llama.cpp send and read them. Knows nothing
// about HTTP sockets or the scheduler's threads.
//
// Request: what /v1/completions takes (openai.h: a prompt, a string or token ids, or a list of them;
// sampling, stop, logit_bias as pairs or an object, ignore_eos, cache_prompt, stream), plus llama.cpp's
// names:
//   n_predict        tokens to generate; -1 (the default): until the context is full
//   repeat_last_n    the penalties' window (-1: the whole history)
//   n_probs          0..20: each generated token's logprob and that many top alternatives
//   json_schema      the reply is a JSON document this schema accepts
//   grammar          the reply is a sentence of this GBNF grammar (also on the OpenAI endpoints)
// Response: {content, stop: true, stop_type: "eos" | "word" | "limit", stopping_word, tokens_predicted,
// tokens_evaluated, tokens_cached, timings {prompt_n, prompt_ms, ..., predicted_per_second},
// generation_settings, completion_probabilities (with n_probs)}. Streamed: Server-Sent Events of
// {content, stop: false}, the last one the whole object with stop: true (no [DONE], as llama-server does).
// A list of prompts gets a list of those objects, in order, each with its prompt's `index`; streamed, every
// event names its prompt's `index`.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "server/openai.h"
#include "server/scheduler.h"

namespace td::server {

// Errors are invalid_input naming the field ("'n_predict' must be -1 or at least 1, got 0"). prompt_required
// false: a missing prompt is "".
Result<ApiRequest> parse_llama_completion(std::string_view body, bool prompt_required = true);

// POST /infill: /completion's fields (its prompt optional, a string: it continues the prefix) and
//   input_prefix, input_suffix   strings, required: the text before and after the cursor
//   input_extra                  [{"filename"?: string (default "tmp"), "text": string}], other files of the
//                                project (at most kMaxInfillChunks)
// The prompt is laid out by server/infill.h; the reply is /completion's.
inline constexpr size_t kMaxInfillChunks = 1024;
Result<ApiRequest> parse_llama_infill(std::string_view body);

// How the reply went, for the last object.
struct LlamaFinal {
    std::string model;
    FinishReason finish = FinishReason::stop;
    std::string stop_word;  // the stop string that ended it ("" for an end-of-generation token or the limit)
    int32_t n_prompt = 0, n_generated = 0, n_cached = 0;
    double prompt_ms = 0.0;     // from the request to the first token
    double predicted_ms = 0.0;  // from the first token to the last
};

// llama-server's sampling settings object (generation_settings, /props' default_generation_settings.params):
// n_predict, seed (-1: random), temperature, top_k, top_p, min_p and the penalties.
nlohmann::json llama_sampling_json(const SamplerParams &sp, int32_t n_predict);

// The whole reply to prompt `index` (`content` the generated text; empty in the last streamed object) with
// stop: true. probabilities: with n_logprobs >= 0, one entry per token.
nlohmann::json llama_final_json(const ApiRequest &r, size_t index, const LlamaFinal &f,
                                const std::string &content, const std::vector<TokenLogprob> &logprobs);
// A streamed piece of prompt `index`'s reply: {index, content, stop: false} (+ completion_probabilities).
nlohmann::json llama_chunk_json(size_t index, const std::string &content, int32_t n_logprobs,
                                const std::vector<TokenLogprob> &logprobs);

// GET /slots: per slot {id, id_task, n_ctx, speculative, is_processing, n_prompt_tokens,
// n_prompt_tokens_processed, n_prompt_tokens_cache, params, next_token {has_next_token, has_new_line,
// n_remain
// (-1: no limit), n_decoded}}, as llama-server answers it (without the prompt and generated texts).
nlohmann::json llama_slots_json(const std::vector<SlotInfo> &slots, int32_t n_ctx);

// Whether `name` is set in an undecoded query string ("a=1&fail_on_no_slot=1"): present with a value other
// than 0, false or empty.
bool query_flag(std::string_view query, std::string_view name);

}  // namespace td::server
