#include "server/ollama.h"

#include <fmt/format.h>

#include <chrono>
#include <ctime>
#include <limits>

#include "server/json-fields.h"

namespace td::server {

using nlohmann::json;

namespace {

constexpr size_t max_stop_strings = 16;

// Sampling options that tandem's sampler does not have: refused unless they hold their "off" value.
struct Unsupported {
    const char *key;
    double off;
};
constexpr Unsupported unsupported_options[] = {{"tfs_z", 1.0}};

// `options` (Ollama's defaults first) and the fields both endpoints share.
Status parse_common(const json &j, std::string_view body, ApiRequest &r) {
    if (const json *v = field(j, "model")) {
        if (!v->is_string()) return invalid_input("'model' must be a string, got {}", type_name(*v));
        r.model = v->get<std::string>();
    }
    r.stream = true;  // Ollama streams unless told not to
    TD_TRY(get_bool(j, "stream", r.stream));
    if (const json *v = field(j, "format");
        v != nullptr && !(v->is_string() && v->get<std::string>().empty())) {
        if (v->is_string() && v->get<std::string>() == "json") {
            r.schema = JsonSchema::any_object();
        } else if (v->is_object()) {
            TD_TRY(constrain_to_schema(r, text_in_order(body, {"format"}, *v)));
        } else {
            return invalid_input("'format' must be \"json\" or a JSON schema object");
        }
    }
    TD_TRY(get_tools(j, r.tools));

    SamplerParams &sp = r.sampling;
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.9f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.1f;
    sp.repeat_last_n = 64;
    sp.seed = SamplerParams::seed_random;
    const json *o = field(j, "options");
    if (o == nullptr) return sampler_params_validate(sp);
    if (!o->is_object()) return invalid_input("'options' must be an object, got {}", type_name(*o));
    for (const Unsupported &u : unsupported_options) {
        float v = static_cast<float>(u.off);
        TD_TRY(get_number(*o, u.key, v));
        if (v != static_cast<float>(u.off)) return invalid_input("'options.{}' is not supported", u.key);
    }
    TD_TRY(get_number(*o, "temperature", sp.temperature));
    TD_TRY(get_number(*o, "top_p", sp.top_p));
    TD_TRY(get_number(*o, "min_p", sp.min_p));
    TD_TRY(get_number(*o, "typical_p", sp.typical_p));
    TD_TRY(get_number(*o, "repeat_penalty", sp.repeat_penalty));
    TD_TRY(get_number(*o, "presence_penalty", sp.presence_penalty));
    TD_TRY(get_number(*o, "frequency_penalty", sp.frequency_penalty));
    int64_t n = 0;
    bool has = false;
    TD_TRY(get_int(*o, "top_k", n, has));
    if (has) {
        if (n < 0 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'options.top_k' must be >= 0, got {}", n);
        sp.top_k = static_cast<int32_t>(n);
    }
    TD_TRY(get_int(*o, "repeat_last_n", n, has));
    if (has) {
        if (n < -1 || n > std::numeric_limits<int32_t>::max())
            return invalid_input("'options.repeat_last_n' must be -1 (the whole context) or >= 0, got {}", n);
        sp.repeat_last_n = static_cast<int32_t>(n);
    }
    TD_TRY(get_int(*o, "mirostat", n, has));
    if (has) {
        if (n < 0 || n > 2) return invalid_input("'options.mirostat' must be 0 (off), 1 or 2, got {}", n);
        sp.mirostat = static_cast<int32_t>(n);
    }
    TD_TRY(get_number(*o, "mirostat_tau", sp.mirostat_tau));
    TD_TRY(get_number(*o, "mirostat_eta", sp.mirostat_eta));
    TD_TRY(get_int(*o, "seed", n, has));
    if (has) sp.seed = n >= 0 ? static_cast<uint64_t>(n) : SamplerParams::seed_random;
    TD_TRY(get_int(*o, "num_predict", n, has));
    if (has) {
        if (n == 0 || n < -2 || n > std::numeric_limits<int32_t>::max())
            return invalid_input(
                "'options.num_predict' must be at least 1, or -1 (until the context is full), got {}", n);
        r.max_tokens = n > 0 ? static_cast<int32_t>(n) : -1;
    }
    TD_TRY(get_strings(*o, "stop", max_stop_strings, r.stop));
    return sampler_params_validate(sp).with_context("options");
}

Status refuse_images(const json &obj, std::string_view where) {
    const json *v = field(obj, "images");
    if (v != nullptr && !(v->is_array() && v->empty()))
        return invalid_input("'{}images': this model takes text only", where);
    return {};
}

json details(const ModelCard &c) {
    return {{"parent_model", ""},
            {"format", "gguf"},
            {"family", c.arch},
            {"families", json::array({c.arch})},
            {"parameter_size", parameter_size(c.n_params)},
            {"quantization_level", c.quantization}};
}

// "stories" is listed as "stories:latest", as Ollama names a model without a tag.
std::string tagged(const std::string &id) {
    return id.find(':') == std::string::npos ? id + ":latest" : id;
}

json model_entry(const ModelCard &c, const std::string &id) {
    return {
        {"name", tagged(id)},   {"model", tagged(id)}, {"modified_at", rfc3339(c.modified_unix * 1000000000)},
        {"size", c.size_bytes}, {"digest", c.digest},  {"details", details(c)}};
}

}  // namespace

Result<ApiRequest> parse_ollama_chat(std::string_view body) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    ApiRequest r;
    r.kind = ApiKind::chat;
    TD_TRY(parse_common(j, body, r));
    TD_TRY(get_messages(j, r.messages, [](const json &m, size_t i, ChatMessage &cm) -> Status {
        TD_TRY(refuse_images(m, fmt::format("messages[{}].", i)));
        if (const json *content = field(m, "content")) {
            if (!content->is_string())
                return invalid_input("'messages[{}].content' must be a string, got {}", i, type_name(*content));
            cm.content = content->get<std::string>();
        }
        TD_TRY(get_tool_calls(m, i, cm.tool_calls));
        for (const char *key : {"tool_name", "name"})
            if (const json *n = field(m, key); n != nullptr && n->is_string() && cm.name.empty())
                cm.name = n->get<std::string>();
        return {};
    }));
    return r;
}

Result<ApiRequest> parse_ollama_generate(std::string_view body, bool use_template) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    ApiRequest r;
    TD_TRY(parse_common(j, body, r));
    TD_TRY(refuse_images(j, ""));
    std::string prompt, system, suffix;
    if (const json *v = field(j, "suffix")) {
        if (!v->is_string()) return invalid_input("'suffix' must be a string, got {}", type_name(*v));
        suffix = v->get<std::string>();
    }
    if (const json *v = field(j, "prompt")) {
        if (!v->is_string()) return invalid_input("'prompt' must be a string, got {}", type_name(*v));
        prompt = v->get<std::string>();
    }
    if (const json *v = field(j, "system")) {
        if (!v->is_string()) return invalid_input("'system' must be a string, got {}", type_name(*v));
        system = v->get<std::string>();
    }
    bool raw = false;
    TD_TRY(get_bool(j, "raw", raw));
    if (!suffix.empty()) {  // fill in the middle: the prompt is the text before the cursor
        r.kind = ApiKind::completion;
        r.prompts.emplace_back();
        r.infill = InfillInput{prompt, suffix, {}};
        return r;
    }
    if (prompt.empty() && system.empty()) {  // Ollama's way to load a model: answered done at once
        r.kind = ApiKind::completion;
        return r;
    }
    if (use_template && !raw) {
        r.kind = ApiKind::chat;
        if (!system.empty()) r.messages.push_back({"system", system});
        r.messages.push_back({"user", prompt});
    } else {
        r.kind = ApiKind::completion;
        r.prompts.emplace_back().text = system.empty() ? prompt : system + "\n\n" + prompt;
    }
    return r;
}

Result<std::string> parse_ollama_show(std::string_view body) {
    TD_ASSIGN_OR_RETURN(json j, parse_object(body));
    for (const char *key : {"model", "name"}) {
        if (const json *v = field(j, key)) {
            if (!v->is_string()) return invalid_input("'{}' must be a string, got {}", key, type_name(*v));
            return v->get<std::string>();
        }
    }
    return invalid_input("'model' is required");
}

bool ollama_model_matches(std::string_view name, std::string_view id) {
    if (name.empty() || name == id) return true;
    const size_t colon = name.rfind(':');
    return colon != std::string_view::npos && name.substr(0, colon) == id;
}

json ollama_chunk(ApiKind kind, const std::string &model, const std::string &text) {
    json j = {{"model", model}, {"created_at", rfc3339(now_unix_ns())}};
    if (kind == ApiKind::chat)
        j["message"] = {{"role", "assistant"}, {"content", text}};
    else
        j["response"] = text;
    j["done"] = false;
    return j;
}

json ollama_final(ApiKind kind, const std::string &model, const std::string &text, FinishReason finish,
                  const OllamaStats &s) {
    json j = ollama_chunk(kind, model, text);
    j["done"] = true;
    j["done_reason"] = finish == FinishReason::length ? "length" : "stop";
    j["total_duration"] = s.total_ns;
    j["load_duration"] = 0;  // loaded at start
    j["prompt_eval_count"] = s.n_prompt;
    j["prompt_eval_duration"] = s.prompt_ns;
    j["eval_count"] = s.n_generated;
    j["eval_duration"] = s.eval_ns;
    return j;
}

json ollama_tool_calls(const std::vector<ToolCall> &calls) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
        json args = json::parse(calls[i].arguments, nullptr, false);
        if (args.is_discarded()) args = json::object();
        out.push_back(
            {{"function", {{"index", i}, {"name", calls[i].name}, {"arguments", std::move(args)}}}});
    }
    return out;
}

json ollama_error(std::string_view message) {
    return {{"error", std::string(message)}};
}

json ollama_tags(const ModelCard &card, const std::string &id) {
    return {{"models", json::array({model_entry(card, id)})}};
}

json ollama_ps(const ModelCard &card, const std::string &id) {
    json m = model_entry(card, id);
    m.erase("modified_at");
    m["expires_at"] = rfc3339(int64_t(4102444800) * 1000000000);  // 2100: loaded for as long as we serve
    m["size_vram"] = 0;
    m["context_length"] = card.n_ctx_train;
    return {{"models", json::array({std::move(m)})}};
}

json ollama_show(const ModelCard &c) {
    const std::string &a = c.arch;
    json info = {{"general.architecture", a},
                 {"general.parameter_count", c.n_params},
                 {a + ".context_length", c.n_ctx_train},
                 {a + ".embedding_length", c.n_embd},
                 {a + ".block_count", c.n_layer},
                 {a + ".attention.head_count", c.n_head},
                 {a + ".attention.head_count_kv", c.n_head_kv},
                 {a + ".vocab_size", c.n_vocab}};
    if (!c.name.empty()) info["general.name"] = c.name;
    return {{"license", ""},
            {"modelfile", fmt::format("# served by tandem (chat template family: {})\nFROM {}\n",
                                      c.template_family, c.path)},
            {"parameters", ""},
            {"template", c.chat_template},
            {"details", details(c)},
            {"model_info", std::move(info)},
            {"capabilities",
             c.fill_in_middle ? json::array({"completion", "insert"}) : json::array({"completion"})},
            {"modified_at", rfc3339(c.modified_unix * 1000000000)}};
}

json ollama_version() {
    return {{"version", TD_VERSION}};
}

int64_t now_unix_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

std::string rfc3339(int64_t unix_ns) {
    const std::time_t secs = static_cast<std::time_t>(unix_ns / 1000000000);
    std::tm tm{};
    gmtime_r(&secs, &tm);
    return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                       tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, unix_ns % 1000000000);
}

}  // namespace td::server
