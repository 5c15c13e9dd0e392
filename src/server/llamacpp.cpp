#include "server/llamacpp.h"

#include <algorithm>
#include <limits>

#include "server/json-fields.h"

namespace td::server {

using nlohmann::json;

namespace {

constexpr int64_t max_probs = 20;

json probabilities_json(const std::vector<TokenLogprob> &lps) {
    json out = json::array();
    for (const TokenLogprob &lp : lps) {
        json top = json::array();
        for (const TokenAlternative &t : lp.top)
            top.push_back(
                {{"id", t.id}, {"token", t.piece}, {"logprob", t.logprob}, {"bytes", bytes_json(t.piece)}});
        out.push_back({{"id", lp.id},
                       {"token", lp.piece},
                       {"logprob", lp.logprob},
                       {"bytes", bytes_json(lp.piece)},
                       {"top_logprobs", std::move(top)}});
    }
    return out;
}

double per_second(int32_t n, double ms) {
    return ms > 0.0 ? 1e3 * n / ms : 0.0;
}

}  // namespace

Result<ApiRequest> parse_llama_completion(std::string_view body, bool prompt_required) {
    TD_ASSIGN_OR_RETURN(ApiRequest r, parse_completion_request(body, prompt_required));
    if (r.n_choices != 1)
        return invalid_input("/completion returns one reply per prompt; 'n' is for /v1/completions");
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    int64_t n = 0;
    bool has = false;
    TD_TRY(get_int(j, "n_predict", n, has));
    if (has) {
        if (n == 0 || n < -1 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'n_predict' must be -1 (until the context is full) or at least 1, got {}",
                                 n);
        r.max_tokens = static_cast<int32_t>(n);
    }
    TD_TRY(get_int(j, "repeat_last_n", n, has));
    if (has) {
        if (n < -1 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'repeat_last_n' must be -1 (all) or >= 0, got {}", n);
        r.sampling.repeat_last_n = static_cast<int32_t>(n);
    }
    r.n_logprobs = -1;  // /v1/completions' "logprobs" means nothing here; n_probs does
    TD_TRY(get_int(j, "n_probs", n, has));
    if (has) {
        if (n < 0 || n > max_probs)
            return invalid_input("'n_probs' must be in [0, {}], got {}", max_probs, n);
        if (n > 0) r.n_logprobs = static_cast<int32_t>(n);
    }
    if (const json *schema = field(j, "json_schema")) {
        if (!schema->is_object())
            return invalid_input("'json_schema' must be an object, got {}", type_name(*schema));
        if (!r.constraint_from.empty())
            return invalid_input("give '{}' or 'json_schema', not both", r.constraint_from);
        TD_TRY(constrain_to_schema(r, text_in_order(body, {"json_schema"}, *schema)));
        r.constraint_from = "json_schema";
    }
    return r;
}

Result<ApiRequest> parse_llama_infill(std::string_view body) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    if (const json *p = field(j, "prompt"); p != nullptr && !p->is_string())
        return invalid_input("'prompt' must be a string, got {}", type_name(*p));
    InfillInput in;
    for (const auto &[key, out] : {std::pair<const char *, std::string *>{"input_prefix", &in.prefix},
                                   std::pair<const char *, std::string *>{"input_suffix", &in.suffix}}) {
        const json *v = field(j, key);
        if (v == nullptr) return invalid_input("'{}' is required", key);
        if (!v->is_string()) return invalid_input("'{}' must be a string, got {}", key, type_name(*v));
        *out = v->get<std::string>();
    }
    if (const json *extra = field(j, "input_extra")) {
        if (!extra->is_array() || extra->size() > kMaxInfillChunks)
            return invalid_input(
                "'input_extra' must be an array of at most {} {{\"filename\": string, \"text\": string}}",
                kMaxInfillChunks);
        for (const json &chunk : *extra) {
            InfillChunk c;
            const json *text = chunk.is_object() ? field(chunk, "text") : nullptr;
            if (text == nullptr || !text->is_string())
                return invalid_input("each 'input_extra' chunk needs a \"text\" string");
            c.text = text->get<std::string>();
            if (const json *name = field(chunk, "filename")) {
                if (!name->is_string())
                    return invalid_input("an 'input_extra' chunk's \"filename\" must be a string");
                c.filename = name->get<std::string>();
            }
            in.extra.push_back(std::move(c));
        }
    }
    TD_ASSIGN_OR_RETURN(ApiRequest r, parse_llama_completion(body, /*prompt_required=*/false));
    r.infill = std::move(in);
    return r;
}

json llama_sampling_json(const SamplerParams &sp, int32_t n_predict) {
    return {{"n_predict", n_predict},
            {"seed", sp.seed == SamplerParams::seed_random ? json(-1) : json(sp.seed)},
            {"temperature", sp.temperature},
            {"top_k", sp.top_k},
            {"top_p", sp.top_p},
            {"min_p", sp.min_p},
            {"typical_p", sp.typical_p},
            {"top_n_sigma", sp.top_n_sigma},
            {"xtc_probability", sp.xtc_probability},
            {"xtc_threshold", sp.xtc_threshold},
            {"dynatemp_range", sp.dynatemp_range},
            {"dynatemp_exponent", sp.dynatemp_exponent},
            {"mirostat", sp.mirostat},
            {"mirostat_tau", sp.mirostat_tau},
            {"mirostat_eta", sp.mirostat_eta},
            {"dry_multiplier", sp.dry_multiplier},
            {"dry_base", sp.dry_base},
            {"dry_allowed_length", sp.dry_allowed_length},
            {"dry_penalty_last_n", sp.dry_penalty_last_n},
            {"repeat_penalty", sp.repeat_penalty},
            {"repeat_last_n", sp.repeat_last_n},
            {"presence_penalty", sp.presence_penalty},
            {"frequency_penalty", sp.frequency_penalty}};
}

json llama_final_json(const ApiRequest &r, size_t index, const LlamaFinal &f, const std::string &content,
                      const std::vector<TokenLogprob> &logprobs) {
    const char *stop_type = f.finish == FinishReason::length ? "limit" : f.stop_word.empty() ? "eos" : "word";
    const SamplerParams &sp = r.sampling;
    const int32_t prompt_n = f.n_prompt - f.n_cached;  // what was computed
    json j = {{"index", index},
              {"content", content},
              {"tokens", json::array()},
              {"id_slot", -1},
              {"stop", true},
              {"model", f.model},
              {"tokens_predicted", f.n_generated},
              {"tokens_evaluated", f.n_prompt},
              {"tokens_cached", f.n_cached},
              {"truncated", false},
              {"stop_type", stop_type},
              {"stopping_word", f.stop_word},
              {"generation_settings", llama_sampling_json(sp, r.max_tokens)},
              {"timings",
               {{"prompt_n", prompt_n},
                {"prompt_ms", f.prompt_ms},
                {"prompt_per_token_ms", prompt_n > 0 ? f.prompt_ms / prompt_n : 0.0},
                {"prompt_per_second", per_second(prompt_n, f.prompt_ms)},
                {"predicted_n", f.n_generated},
                {"predicted_ms", f.predicted_ms},
                {"predicted_per_token_ms", f.n_generated > 0 ? f.predicted_ms / f.n_generated : 0.0},
                {"predicted_per_second", per_second(f.n_generated, f.predicted_ms)}}}};
    j["generation_settings"]["ignore_eos"] = r.ignore_eos;
    j["generation_settings"]["n_probs"] = std::max(r.n_logprobs, 0);
    j["generation_settings"]["stop"] = r.stop;
    if (r.n_logprobs >= 0) j["completion_probabilities"] = probabilities_json(logprobs);
    return j;
}

json llama_chunk_json(size_t index, const std::string &content, int32_t n_logprobs,
                      const std::vector<TokenLogprob> &logprobs) {
    json j = {
        {"index", index}, {"content", content}, {"tokens", json::array()}, {"stop", false}, {"id_slot", -1}};
    if (n_logprobs >= 0 && !logprobs.empty()) j["completion_probabilities"] = probabilities_json(logprobs);
    return j;
}

json llama_slots_json(const std::vector<SlotInfo> &slots, int32_t n_ctx) {
    json out = json::array();
    for (const SlotInfo &s : slots) {
        const int32_t remain = s.max_tokens > 0 ? std::max(s.max_tokens - s.n_decoded, 0) : -1;
        json params = llama_sampling_json(s.sampling, s.max_tokens);
        params["max_tokens"] = s.max_tokens;
        params["speculative.n_max"] = s.n_draft;
        out.push_back({{"id", s.id},
                       {"id_task", s.task},
                       {"n_ctx", n_ctx},
                       {"speculative", s.n_draft > 0},
                       {"is_processing", s.processing},
                       {"n_prompt_tokens", s.n_prompt},
                       {"n_prompt_tokens_processed", s.n_processed},
                       {"n_prompt_tokens_cache", s.n_cached},
                       {"n_cached_positions", s.n_held},
                       {"params", std::move(params)},
                       {"next_token",
                        {{"has_next_token", s.processing && s.n_remain > 0},
                         {"has_new_line", false},
                         {"n_remain", remain},
                         {"n_decoded", s.n_decoded}}}});
    }
    return out;
}

bool query_flag(std::string_view query, std::string_view name) {
    while (!query.empty()) {
        const size_t amp = query.find('&');
        const std::string_view part = query.substr(0, amp);
        query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
        const size_t eq = part.find('=');
        if (part.substr(0, eq) != name) continue;
        const std::string_view value =
            eq == std::string_view::npos ? std::string_view() : part.substr(eq + 1);
        return !value.empty() && value != "0" && value != "false";
    }
    return false;
}

}  // namespace td::server
