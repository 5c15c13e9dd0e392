#include "server/openai.h"

#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "core/printable.h"
#include "server/dry-breakers.h"
#include "server/json-fields.h"
#include "text/json-schema-grammar.h"
#include "text/regex-grammar.h"

namespace td::server {

using nlohmann::json;

namespace {

constexpr int32_t max_stop_strings = 16;
constexpr int32_t max_top_logprobs = 20;
constexpr size_t kMaxRequestLogitBias = kMaxLogitBias / 2;  // the rest is room for ignore_eos's bans

// A request's JSON for an error message, cut short (a body may hold megabytes).
std::string quoted(const json &v) {
    return printable(v.is_string() ? v.get<std::string>() : v.dump(), 37);
}

// One logit_bias value: a number in [-100, 100] (OpenAI's range), or false to ban the token (llama.cpp).
Status bias_value(const json &v, const std::string &key, float &out) {
    if (v.is_boolean() && !v.get<bool>()) {
        out = -std::numeric_limits<float>::infinity();
        return {};
    }
    const double b = v.is_number() ? v.get<double>() : std::nan("");
    if (!(b >= -100.0 && b <= 100.0))
        return invalid_input(
            "'logit_bias' of token {} must be a number in [-100, 100] (or false to ban it), got {}", key,
            quoted(v));
    out = static_cast<float>(b);
    return {};
}

// 'logit_bias': OpenAI's object of token id -> bias ({"15043": -100}), or llama.cpp's array of pairs
// ([[15043, -100], [2, false]]). Token ids only: the vocabulary check is the scheduler's.
Status get_logit_bias(const json &j, std::vector<LogitBias> &out) {
    const json *v = field(j, "logit_bias");
    if (v == nullptr) return {};
    auto add = [&](const json &id, const json &bias) -> Status {
        int64_t t = -1;
        if (id.is_number_integer()) {
            t = id.get<int64_t>();
        } else if (id.is_string()) {
            const std::string &k = id.get_ref<const std::string &>();
            const auto [end, ec] = std::from_chars(k.data(), k.data() + k.size(), t);
            if (ec != std::errc{} || end != k.data() + k.size()) t = -1;
        }
        const std::string key = quoted(id);
        if (t < 0 || t > std::numeric_limits<int32_t>::max())
            return invalid_input("'logit_bias' keys must be token ids (integers >= 0), got '{}'", key);
        if (out.size() == kMaxRequestLogitBias)
            return invalid_input("'logit_bias' has more than {} entries", kMaxRequestLogitBias);
        LogitBias b;
        b.id = static_cast<int32_t>(t);
        TD_TRY(bias_value(bias, key, b.bias));
        out.push_back(b);
        return {};
    };
    if (v->is_object()) {
        for (const auto &[k, bias] : v->items()) TD_TRY(add(json(k), bias));
        return {};
    }
    if (v->is_array()) {
        for (const json &pair : *v) {
            if (!pair.is_array() || pair.size() != 2)
                return invalid_input("'logit_bias' as an array holds [token id, bias] pairs, got {}",
                                     quoted(pair));
            TD_TRY(add(pair[0], pair[1]));
        }
        return {};
    }
    return invalid_input("'logit_bias' must be an object of token id -> bias, got {}", type_name(*v));
}

// Fields both endpoints share.
// The one constraint a reply may have: OpenAI's response_format, llama-server's grammar, or vLLM's
// guided_json / guided_regex / guided_choice / guided_grammar and structured_outputs {json, regex, choice,
// grammar}. A second one is an error naming both.
Status parse_constraint(const json &j, std::string_view body, ApiRequest &r) {
    auto take = [&](std::string_view name) -> Status {
        if (!r.constraint_from.empty())
            return invalid_input("give '{}' or '{}', not both", r.constraint_from, name);
        r.constraint_from = name;
        return {};
    };
    auto with = [](std::string_view name, Status s) {
        return s.ok() ? s : s.with_context(fmt::format("'{}'", name));
    };
    // A JSON schema given as an object (or as its text, as vLLM takes it), at `path` in the body.
    auto schema_from = [&](std::string_view name, const json &v, std::initializer_list<const char *> path) {
        TD_TRY(take(name));
        if (!v.is_object() && !v.is_string())
            return invalid_input("'{}' must be a JSON schema (an object), got {}", name, type_name(v));
        return with(name, constrain_to_schema(r, v.is_string() ? v.get_ref<const std::string &>()
                                                               : text_in_order(body, path, v)));
    };
    auto grammar_from = [&](std::string_view name, Result<std::string> gbnf) -> Status {
        TD_TRY(take(name));
        if (!gbnf.ok()) return with(name, gbnf.status());
        auto g = Grammar::compile(*gbnf);
        if (!g.ok()) return with(name, g.status());
        r.grammar = *g;
        return {};
    };
    auto text_of = [](std::string_view name, const json &v, std::string_view what) -> Result<std::string> {
        if (!v.is_string())
            return invalid_input("'{}' must be a string ({}), got {}", name, what, type_name(v));
        return v.get<std::string>();
    };
    auto choices_of = [](std::string_view name, const json &v) -> Result<std::string> {
        if (!v.is_array() || v.empty())
            return invalid_input("'{}' must be a non-empty list of strings", name);
        std::vector<std::string> choices;
        for (const json &c : v) {
            if (!c.is_string()) return invalid_input("'{}' must be a non-empty list of strings", name);
            choices.push_back(c.get<std::string>());
        }
        return choices_to_gbnf(choices);
    };
    auto regex_of = [&](std::string_view name, const json &v) -> Result<std::string> {
        TD_ASSIGN_OR_RETURN(std::string re, text_of(name, v, "a regular expression"));
        return regex_to_gbnf(re);
    };

    if (const json *rf = field(j, "response_format")) {
        const json *type = rf->is_object() ? field(*rf, "type") : nullptr;
        if (type == nullptr || !type->is_string())
            return invalid_input("'response_format' must be an object with a 'type'");
        const std::string t = type->get<std::string>();
        if (t == "json_object") {
            TD_TRY(take("response_format"));
            r.schema = JsonSchema::any_object();
        } else if (t == "json_schema") {
            const json *js = field(*rf, "json_schema");
            const json *schema = js != nullptr && js->is_object() ? field(*js, "schema") : nullptr;
            if (schema == nullptr)
                return invalid_input("'response_format.json_schema.schema' is required for type json_schema");
            TD_TRY(take("response_format"));
            TD_TRY(constrain_to_schema(
                r, text_in_order(body, {"response_format", "json_schema", "schema"}, *schema)));
        } else if (t != "text") {
            return invalid_input("'response_format.type' must be text, json_object or json_schema, got '{}'",
                                 t);
        }
    }
    for (const char *name : {"grammar", "guided_grammar"})
        if (const json *g = field(j, name)) {  // GBNF; llama-server takes "" as none
            TD_ASSIGN_OR_RETURN(std::string text, text_of(name, *g, "GBNF"));
            if (!text.empty()) TD_TRY(grammar_from(name, text));
        }
    if (const json *v = field(j, "guided_json")) TD_TRY(schema_from("guided_json", *v, {"guided_json"}));
    if (const json *v = field(j, "guided_regex"))
        TD_TRY(grammar_from("guided_regex", regex_of("guided_regex", *v)));
    if (const json *v = field(j, "guided_choice"))
        TD_TRY(grammar_from("guided_choice", choices_of("guided_choice", *v)));
    if (const json *so = field(j, "structured_outputs")) {
        if (!so->is_object())
            return invalid_input("'structured_outputs' must be an object, got {}", type_name(*so));
        if (const json *v = field(*so, "json"))
            TD_TRY(schema_from("structured_outputs.json", *v, {"structured_outputs", "json"}));
        if (const json *v = field(*so, "regex"))
            TD_TRY(grammar_from("structured_outputs.regex", regex_of("structured_outputs.regex", *v)));
        if (const json *v = field(*so, "choice"))
            TD_TRY(grammar_from("structured_outputs.choice", choices_of("structured_outputs.choice", *v)));
        if (const json *v = field(*so, "grammar"))
            TD_TRY(grammar_from("structured_outputs.grammar",
                                text_of("structured_outputs.grammar", *v, "GBNF")));
    }
    return {};
}

Status parse_common(const json &j, std::string_view body, ApiRequest &r) {
    if (const json *v = field(j, "model")) {
        if (!v->is_string()) return invalid_input("'model' must be a string, got {}", type_name(*v));
        r.model = v->get<std::string>();
    }
    int64_t n = 1;
    bool has = false;
    TD_TRY(get_int(j, "n", n, has));
    if (has && (n < 1 || n > kMaxChoices)) return invalid_input("'n' must be 1..{}, got {}", kMaxChoices, n);
    if (has) r.n_choices = static_cast<int32_t>(n);

    TD_TRY(get_int(j, "max_tokens", n, has));
    if (has) {
        if (n < 1 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'max_tokens' must be at least 1, got {}", n);
        r.max_tokens = static_cast<int32_t>(n);
    }
    TD_TRY(get_int(j, "max_completion_tokens", n, has));
    if (has) {
        if (n < 1 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'max_completion_tokens' must be at least 1, got {}", n);
        r.max_tokens = static_cast<int32_t>(n);
    }

    SamplerParams &sp = r.sampling;
    TD_TRY(get_number(j, "temperature", sp.temperature));
    TD_TRY(get_number(j, "top_p", sp.top_p));
    TD_TRY(get_number(j, "min_p", sp.min_p));
    TD_TRY(get_number(j, "presence_penalty", sp.presence_penalty));
    TD_TRY(get_number(j, "frequency_penalty", sp.frequency_penalty));
    TD_TRY(get_number(j, "repeat_penalty", sp.repeat_penalty));
    // llama-server's further samplers (not OpenAI's): typical_p, top_n_sigma, XTC, the dynamic temperature,
    // Mirostat, DRY.
    TD_TRY(get_number(j, "typical_p", sp.typical_p));
    TD_TRY(get_number(j, "top_n_sigma", sp.top_n_sigma));
    TD_TRY(get_number(j, "xtc_probability", sp.xtc_probability));
    TD_TRY(get_number(j, "xtc_threshold", sp.xtc_threshold));
    TD_TRY(get_number(j, "dynatemp_range", sp.dynatemp_range));
    TD_TRY(get_number(j, "dynatemp_exponent", sp.dynatemp_exponent));
    TD_TRY(get_int(j, "mirostat", n, has));
    if (has) {
        if (n < 0 || n > 2) return invalid_input("'mirostat' must be 0 (off), 1 or 2, got {}", n);
        sp.mirostat = static_cast<int32_t>(n);
    }
    TD_TRY(get_number(j, "mirostat_tau", sp.mirostat_tau));
    TD_TRY(get_number(j, "mirostat_eta", sp.mirostat_eta));
    TD_TRY(get_number(j, "dry_multiplier", sp.dry_multiplier));
    TD_TRY(get_number(j, "dry_base", sp.dry_base));
    TD_TRY(get_int(j, "dry_allowed_length", n, has));
    if (has) {
        if (n < 0 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'dry_allowed_length' must be >= 0, got {}", n);
        sp.dry_allowed_length = static_cast<int32_t>(n);
    }
    TD_TRY(get_int(j, "dry_penalty_last_n", n, has));
    if (has) {
        if (n < -1 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'dry_penalty_last_n' must be -1 (all), 0 (off) or more, got {}", n);
        sp.dry_penalty_last_n = static_cast<int32_t>(n);
    }
    if (field(j, "dry_sequence_breakers") != nullptr) {
        std::vector<std::string> breakers;
        TD_TRY(get_strings(j, "dry_sequence_breakers", kMaxDryBreakerStrings, breakers));
        if (breakers.empty())
            return invalid_input("'dry_sequence_breakers' must be a non-empty array of strings");
        r.dry_sequence_breakers = std::move(breakers);
    }
    if (sp.temperature < 0.0f || sp.temperature > 2.0f)
        return invalid_input("'temperature' must be in [0, 2], got {}", sp.temperature);
    if (std::fabs(sp.presence_penalty) > 2.0f)
        return invalid_input("'presence_penalty' must be in [-2, 2], got {}", sp.presence_penalty);
    if (std::fabs(sp.frequency_penalty) > 2.0f)
        return invalid_input("'frequency_penalty' must be in [-2, 2], got {}", sp.frequency_penalty);
    TD_TRY(get_int(j, "top_k", n, has));
    if (has) {
        if (n < 0 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'top_k' must be >= 0, got {}", n);
        sp.top_k = static_cast<int32_t>(n);
    }
    TD_TRY(get_int(j, "seed", n, has));
    sp.seed = (has && n >= 0) ? static_cast<uint64_t>(n) : SamplerParams::seed_random;
    TD_TRY(get_logit_bias(j, sp.logit_bias));
    TD_TRY(sampler_params_validate(sp));

    TD_TRY(get_strings(j, "stop", max_stop_strings, r.stop));

    TD_TRY(get_bool(j, "ignore_eos", r.ignore_eos));
    TD_TRY(get_bool(j, "stream", r.stream));
    TD_TRY(get_bool(j, "cache_prompt", r.cache_prompt));
    TD_TRY(get_int(j, "speculative.n_max", n, has));
    if (has) {
        if (n < 0 || n > kMaxDraft)
            return invalid_input("'speculative.n_max' must be in [0, {}], got {}", kMaxDraft, n);
        r.n_draft = static_cast<int32_t>(n);
    }
    TD_TRY(parse_constraint(j, body, r));
    if (const json *v = field(j, "stream_options")) {
        if (!v->is_object())
            return invalid_input("'stream_options' must be an object, got {}", type_name(*v));
        TD_TRY(get_bool(*v, "include_usage", r.include_usage));
    }
    return {};
}

// Chat content: a string, null (an assistant turn with only tool calls), or an array of parts of which we
// understand text.
Status parse_content(const json &v, size_t index, std::string &out) {
    if (v.is_null()) return {};
    if (v.is_string()) {
        out = v.get<std::string>();
        return {};
    }
    if (!v.is_array())
        return invalid_input("'messages[{}].content' must be a string or an array of parts, got {}", index,
                             type_name(v));
    for (const json &part : v) {
        const json *type = part.is_object() ? field(part, "type") : nullptr;
        const json *text = part.is_object() ? field(part, "text") : nullptr;
        if (type == nullptr || !type->is_string() || type->get<std::string>() != "text" || text == nullptr ||
            !text->is_string())
            return invalid_input(
                "'messages[{}].content' parts must be {{\"type\": \"text\", \"text\": ...}}; "
                "this server takes text only",
                index);
        out += text->get<std::string>();
    }
    return {};
}

// Chat: {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
json chat_logprobs_json(const std::vector<TokenLogprob> &lps) {
    json content = json::array();
    for (const TokenLogprob &lp : lps) {
        json top = json::array();
        for (const TokenAlternative &alt : lp.top)
            top.push_back({{"token", alt.piece}, {"logprob", alt.logprob}, {"bytes", bytes_json(alt.piece)}});
        content.push_back({{"token", lp.piece},
                           {"logprob", lp.logprob},
                           {"bytes", bytes_json(lp.piece)},
                           {"top_logprobs", std::move(top)}});
    }
    return {{"content", std::move(content)}};
}

// Completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{piece: logprob}], "text_offset"}.
json completion_logprobs_json(const std::vector<TokenLogprob> &lps, size_t offset0) {
    json tokens = json::array(), token_lps = json::array(), tops = json::array(), offsets = json::array();
    size_t offset = offset0;
    for (const TokenLogprob &lp : lps) {
        tokens.push_back(lp.piece);
        // An echoed prompt's first token has no log-probability: null, as OpenAI and vLLM give it.
        const bool none = std::isnan(lp.logprob);
        token_lps.push_back(none ? json(nullptr) : json(lp.logprob));
        json top = json::object();
        for (const TokenAlternative &alt : lp.top) top[alt.piece] = alt.logprob;
        tops.push_back(none ? json(nullptr) : std::move(top));
        offsets.push_back(offset);
        offset += lp.piece.size();
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_lps)},
            {"top_logprobs", std::move(tops)},
            {"text_offset", std::move(offsets)}};
}

json usage_json(const Usage &u) {
    return {{"prompt_tokens", u.n_prompt},
            {"completion_tokens", u.n_generated},
            {"total_tokens", u.n_prompt + u.n_generated},
            {"prompt_tokens_details", {{"cached_tokens", u.n_cached}}}};
}

const char *finish_name(FinishReason f) {
    return f == FinishReason::length ? "length" : "stop";
}

json tool_calls_json(const std::vector<ToolCall> &calls, bool with_index) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
        json c = {{"id", calls[i].id},
                  {"type", "function"},
                  {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
        if (with_index) c["index"] = i;
        out.push_back(std::move(c));
    }
    return out;
}

}  // namespace

std::string random_hex(size_t n) {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    static const char digits[] = "0123456789abcdef";
    std::string s(n, '0');
    for (char &c : s) c = digits[rng() & 15];
    return s;
}

json bytes_json(const std::string &piece) {
    json b = json::array();
    for (unsigned char c : piece) b.push_back(static_cast<int>(c));
    return b;
}

Status apply_tool_choice(ApiRequest &r) {
    if (r.tool_choice != ToolChoice::required && r.tool_choice != ToolChoice::named) return {};
    if (!r.constraint_from.empty())
        return invalid_input("'{}' cannot be combined with a required tool call ('tool_choice')",
                             r.constraint_from);
    json names = json::array();
    const json *params = nullptr;
    for (const json &t : r.tools) {
        const json &fn = t["function"];
        const std::string name = fn["name"].get<std::string>();
        if (r.tool_choice == ToolChoice::named && name != r.tool_name) continue;
        names.push_back(name);
        if (auto p = fn.find("parameters"); p != fn.end()) params = &*p;
    }
    if (names.empty())
        return invalid_input("'tool_choice' names the function '{}', which is not in 'tools'", r.tool_name);
    // {"name": ..., "arguments": ...} in that order, whichever form the schema takes.
    const auto call = [&](const json &arguments) {
        return fmt::format(R"({{"type": "object", "properties": {{"name": {}, "arguments": {}}}, )"
                           R"("required": ["name", "arguments"]}})",
                           json{{"enum", names}}.dump(), arguments.dump());
    };
    // A call is data, not prose: one whitespace character at most between tokens, so a model cannot pad.
    if (names.size() == 1 && params != nullptr && constrain_to_schema(r, call(*params), 1).ok()) return {};
    const Status s = constrain_to_schema(r, call(json{{"type", "object"}}), 1);  // any object
    return s.ok() ? s : s.with_context("tool_choice");
}

Status constrain_to_schema(ApiRequest &r, std::string_view schema_json, int max_whitespace) {
    TD_ASSIGN_OR_RETURN(JsonConstraint c, compile_json_constraint(schema_json, max_whitespace));
    r.schema = std::move(c.schema);
    r.grammar = std::move(c.grammar);
    return {};
}

std::vector<ToolCall> finish_tool_calls(std::vector<ToolCall> calls, bool parallel,
                                        const std::function<std::string()> &new_id) {
    if (!parallel && calls.size() > 1) calls.resize(1);
    for (ToolCall &c : calls) c.id = new_id();
    return calls;
}

json tool_calls_chunk_json(const ResponseMeta &meta, int32_t index, const std::vector<ToolCall> &calls) {
    json choice = {{"index", index},
                   {"delta", {{"tool_calls", tool_calls_json(calls, true)}}},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr}};
    return {{"id", meta.id},
            {"object", "chat.completion.chunk"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", json::array({std::move(choice)})}};
}

Result<ApiRequest> parse_chat_request(std::string_view body) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    ApiRequest r;
    r.kind = ApiKind::chat;
    TD_TRY(parse_common(j, body, r));
    TD_TRY(get_messages(j, r.messages, [](const json &m, size_t i, ChatMessage &cm) -> Status {
        auto content = m.find("content");
        if (content != m.end()) TD_TRY(parse_content(*content, i, cm.content));
        TD_TRY(get_tool_calls(m, i, cm.tool_calls));
        if (const json *id = field(m, "tool_call_id")) {
            if (!id->is_string()) return invalid_input("'messages[{}].tool_call_id' must be a string", i);
            cm.tool_call_id = id->get<std::string>();
        }
        if (const json *name = field(m, "name"); name != nullptr && name->is_string())
            cm.name = name->get<std::string>();
        return {};
    }));
    // A tool result's function name, when the client left it out, from the call it answers.
    for (ChatMessage &m : r.messages) {
        if (m.role != "tool" || !m.name.empty() || m.tool_call_id.empty()) continue;
        for (const ChatMessage &a : r.messages)
            for (const ToolCall &c : a.tool_calls)
                if (c.id == m.tool_call_id) m.name = c.name;
    }
    TD_TRY(get_tools(j, r.tools));
    TD_TRY(get_bool(j, "parallel_tool_calls", r.parallel_tool_calls));
    if (const json *tc = field(j, "tool_choice")) {
        if (tc->is_string()) {
            const std::string c = tc->get<std::string>();
            if (c == "auto")
                r.tool_choice = ToolChoice::auto_;
            else if (c == "none")
                r.tool_choice = ToolChoice::none;
            else if (c == "required")
                r.tool_choice = ToolChoice::required;
            else
                return invalid_input(
                    "'tool_choice' must be \"auto\", \"none\", \"required\" or a function, got \"{}\"", c);
        } else if (tc->is_object()) {
            const json *fn = field(*tc, "function");
            const json *name = fn != nullptr && fn->is_object() ? field(*fn, "name") : nullptr;
            if (name == nullptr || !name->is_string())
                return invalid_input(
                    "'tool_choice' must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}");
            r.tool_choice = ToolChoice::named;
            r.tool_name = name->get<std::string>();
        } else {
            return invalid_input("'tool_choice' must be a string or an object, got {}", type_name(*tc));
        }
        if ((r.tool_choice == ToolChoice::required || r.tool_choice == ToolChoice::named) && r.tools.empty())
            return invalid_input("'tool_choice' asks for a tool call, but 'tools' is empty");
    }
    TD_TRY(apply_tool_choice(r));
    bool want_lp = false;
    TD_TRY(get_bool(j, "logprobs", want_lp));
    int64_t top = 0;
    bool has_top = false;
    TD_TRY(get_int(j, "top_logprobs", top, has_top));
    if (has_top && (top < 0 || top > max_top_logprobs))
        return invalid_input("'top_logprobs' must be in [0, {}], got {}", max_top_logprobs, top);
    if (has_top && !want_lp) return invalid_input("'top_logprobs' needs 'logprobs': true");
    if (want_lp) r.n_logprobs = static_cast<int32_t>(top);
    return r;
}

Result<ApiRequest> parse_completion_request(std::string_view body, bool prompt_required) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    ApiRequest r;
    r.kind = ApiKind::completion;
    TD_TRY(parse_common(j, body, r));
    const json empty_prompt = "";
    const json *p = field(j, "prompt");
    if (p == nullptr && prompt_required) return invalid_input("'prompt' is required");
    if (p == nullptr) p = &empty_prompt;
    // One prompt: a string or token ids.
    const auto one = [](const json &v, ApiRequest::Prompt &out) -> Status {
        if (v.is_string()) {
            out.text = v.get<std::string>();
            return {};
        }
        if (!v.is_array() || v.empty())
            return invalid_input("'prompt' must be a string, token ids, or an array of either, got {}",
                                 v.is_array() ? "an empty array" : type_name(v));
        for (const json &t : v) {
            if (!t.is_number_integer() && !t.is_number_unsigned())
                return invalid_input("'prompt' token ids must be integers, got {}", type_name(t));
            const int64_t id = t.get<int64_t>();
            if (id < 0 || id > std::numeric_limits<int32_t>::max())
                return invalid_input("'prompt' token id {} is out of range", id);
            out.tokens.push_back(static_cast<int32_t>(id));
        }
        out.is_tokens = true;
        return {};
    };
    if (p->is_array() && !p->empty() && ((*p)[0].is_string() || (*p)[0].is_array())) {
        if (p->size() * static_cast<size_t>(r.n_choices) > static_cast<size_t>(kMaxChoices))
            return invalid_input("'prompt' holds {} prompts and 'n' is {}: at most {} choices per request",
                                 p->size(), r.n_choices, kMaxChoices);
        for (const json &v : *p) TD_TRY(one(v, r.prompts.emplace_back()));
    } else {
        TD_TRY(one(*p, r.prompts.emplace_back()));
    }
    if (const json *lp = field(j, "logprobs")) {
        // Legacy completions: logprobs is the number of top tokens (0..20); a boolean true means 0.
        if (lp->is_boolean()) {
            if (lp->get<bool>()) r.n_logprobs = 0;
        } else {
            int64_t n = 0;
            bool has = false;
            TD_TRY(get_int(j, "logprobs", n, has));
            if (n < 0 || n > max_top_logprobs)
                return invalid_input("'logprobs' must be in [0, {}], got {}", max_top_logprobs, n);
            r.n_logprobs = static_cast<int32_t>(n);
        }
    }
    return r;
}

Result<ApiRequest> parse_openai_completion(std::string_view body) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    bool echo = false;
    TD_TRY(get_bool(j, "echo", echo));
    // OpenAI's max_tokens 0 with echo: the prompt alone, with its log-probabilities when asked (how lm-eval
    // and others score a text). The common parser, which the other APIs share, takes at least 1.
    const json *max_tokens = field(j, "max_tokens");
    const bool score_only =
        echo && max_tokens != nullptr && max_tokens->is_number_integer() && max_tokens->get<int64_t>() == 0;
    std::string rest;
    if (score_only) {
        j.erase("max_tokens");
        rest = j.dump();
    }
    TD_ASSIGN_OR_RETURN(ApiRequest r, parse_completion_request(score_only ? std::string_view(rest) : body));
    r.echo = echo;
    if (score_only) r.max_tokens = 0;
    if (echo && (r.n_logprobs >= 0 || score_only)) r.n_prompt_logprobs = std::max(r.n_logprobs, 0);
    int64_t best_of = 0;
    bool has = false;
    TD_TRY(get_int(j, "best_of", best_of, has));
    if (has && best_of != r.n_choices)
        return invalid_input(
            "'best_of' is not supported (as in llama-server and vLLM); 'n' asks for {} choices", r.n_choices);
    if (const json *v = field(j, "suffix")) {
        if (!v->is_string()) return invalid_input("'suffix' must be a string, got {}", type_name(*v));
        if (!v->get<std::string>().empty()) {
            if (r.prompts.size() != 1 || r.prompts[0].is_tokens)
                return invalid_input(
                    "'suffix' needs one prompt given as text (the text before the insertion)");
            if (r.n_prompt_logprobs >= 0)
                return invalid_input(
                    "'suffix' cannot be used with 'echo' and 'logprobs' or 'max_tokens': 0: the model reads "
                    "a fill-in-the-middle prompt, not the text it would score");
            r.infill = InfillInput{std::move(r.prompts[0].text), v->get<std::string>(), {}};
            r.prompts[0] = ApiRequest::Prompt{};
        }
    }
    return r;
}

ResponseMeta make_response_meta(ApiKind kind, std::string model) {
    ResponseMeta m;
    m.kind = kind;
    m.id = (kind == ApiKind::chat ? "chatcmpl-" : "cmpl-") + random_hex(24);
    m.created =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    m.model = std::move(model);
    return m;
}

json completion_json(const ResponseMeta &meta, const std::vector<ChoiceResult> &choices, const Usage &usage,
                     int32_t n_logprobs) {
    json out = json::array();
    for (size_t i = 0; i < choices.size(); ++i) {
        const ChoiceResult &c = choices[i];
        json choice = {{"index", i},
                       {"finish_reason", c.tool_calls.empty() ? finish_name(c.finish) : "tool_calls"}};
        if (meta.kind == ApiKind::chat) {
            choice["message"] = {{"role", "assistant"}, {"content", c.text}};
            if (!c.tool_calls.empty()) {
                if (c.text.empty()) choice["message"]["content"] = nullptr;
                choice["message"]["tool_calls"] = tool_calls_json(c.tool_calls, false);
            }
            choice["logprobs"] = n_logprobs >= 0 ? chat_logprobs_json(c.logprobs) : json(nullptr);
        } else {
            choice["text"] = c.text;
            choice["logprobs"] = n_logprobs >= 0 ? completion_logprobs_json(c.logprobs, 0) : json(nullptr);
        }
        out.push_back(std::move(choice));
    }
    return {{"id", meta.id},
            {"object", meta.kind == ApiKind::chat ? "chat.completion" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", std::move(out)},
            {"usage", usage_json(usage)}};
}

json chunk_json(const ResponseMeta &meta, int32_t index, const std::string &text, bool role_first,
                const char *finish, int32_t n_logprobs, const std::vector<TokenLogprob> &logprobs) {
    json choice = {{"index", index}, {"finish_reason", finish ? json(finish) : json(nullptr)}};
    const bool with_lp = n_logprobs >= 0 && !logprobs.empty();
    if (meta.kind == ApiKind::chat) {
        json delta = json::object();
        if (role_first) delta["role"] = "assistant";
        if (role_first || !text.empty() || finish == nullptr) delta["content"] = text;
        choice["delta"] = std::move(delta);
        choice["logprobs"] = with_lp ? chat_logprobs_json(logprobs) : json(nullptr);
    } else {
        choice["text"] = text;
        choice["logprobs"] = with_lp ? completion_logprobs_json(logprobs, 0) : json(nullptr);
    }
    return {{"id", meta.id},
            {"object", meta.kind == ApiKind::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", json::array({std::move(choice)})}};
}

json usage_chunk_json(const ResponseMeta &meta, const Usage &usage) {
    return {{"id", meta.id},
            {"object", meta.kind == ApiKind::chat ? "chat.completion.chunk" : "text_completion"},
            {"created", meta.created},
            {"model", meta.model},
            {"choices", json::array()},
            {"usage", usage_json(usage)}};
}

std::string sse_event(const json &j) {
    return "data: " + json_dump(j) + "\n\n";
}

std::string sse_done() {
    return "data: [DONE]\n\n";
}

json error_json(int http_status, std::string_view message) {
    const char *type = "server_error";
    switch (http_status) {
        case 400:
        case 405:
        case 408:
        case 411:
        case 413:
        case 431:
        case 505:
            type = "invalid_request_error";
            break;
        case 401:
            type = "authentication_error";
            break;
        case 404:
            type = "not_found_error";
            break;
        case 429:
            type = "rate_limit_error";
            break;
        case 503:
            type = "unavailable_error";
            break;
        default:
            break;
    }
    return {{"error", {{"message", std::string(message)}, {"type", type}, {"code", http_status}}}};
}

int http_status_for(const Status &status) {
    switch (status.kind()) {
        case ErrorKind::invalid_input:
            return 400;
        case ErrorKind::not_found:
            return 404;
        case ErrorKind::overloaded:
            return 503;
        case ErrorKind::unimplemented:
            return 501;
        default:
            return 500;
    }
}

std::string json_dump(const json &j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace td::server
