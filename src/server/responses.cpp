#include "server/responses.h"

#include <fmt/format.h>

#include <utility>

#include "server/json-fields.h"

namespace td::server {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// A message's content: a string, or parts of text (input_text, output_text, text) as the chat path's parts.
Result<ojson> content_of(const ojson &v, const std::string &where) {
    if (v.is_string()) return ojson(v);
    if (!v.is_array())
        return invalid_input("'{}' must be a string or an array of parts, got {}", where, type_name(v));
    ojson parts = ojson::array();
    for (size_t j = 0; j < v.size(); ++j) {
        const ojson &p = v[j];
        const std::string at = fmt::format("{}[{}]", where, j);
        if (!p.is_object()) return invalid_input("'{}' must be an object, got {}", at, type_name(p));
        std::string type;
        TD_TRY(get_required_string(p, "type", at, type));
        if (type == "input_text" || type == "output_text" || type == "text") {
            std::string text;
            TD_TRY(get_required_string(p, "text", at, text));
            parts.push_back({{"type", "text"}, {"text", std::move(text)}});
        } else if (type == "refusal") {
            std::string text;
            TD_TRY(get_required_string(p, "refusal", at, text));
            parts.push_back({{"type", "text"}, {"text", std::move(text)}});
        } else {
            return invalid_input("'{}.type' '{}' is not supported: this server takes text only", at, type);
        }
    }
    return parts;
}

// The input items as chat messages; consecutive function calls become one assistant message's tool_calls.
Result<ojson> input_messages(const ojson &input) {
    ojson out = ojson::array();
    if (input.is_string()) {
        out.push_back({{"role", "user"}, {"content", input.get<std::string>()}});
        return out;
    }
    if (!input.is_array())
        return invalid_input("'input' must be a string or an array of items, got {}", type_name(input));
    for (size_t i = 0; i < input.size(); ++i) {
        const ojson &item = input[i];
        const std::string at = fmt::format("input[{}]", i);
        if (!item.is_object()) return invalid_input("'{}' must be an object, got {}", at, type_name(item));
        std::string type = "message";
        if (const ojson *t = field(item, "type")) {
            if (!t->is_string())
                return invalid_input("'{}.type' must be a string, got {}", at, type_name(*t));
            type = t->get<std::string>();
        }
        if (type == "message") {
            std::string role;
            TD_TRY(get_required_string(item, "role", at, role));
            if (role == "developer") role = "system";
            if (role != "user" && role != "assistant" && role != "system")
                return invalid_input("'{}.role' must be user, assistant, system or developer, got '{}'", at,
                                     role);
            const ojson *c = field(item, "content");
            if (c == nullptr) return invalid_input("'{}.content' is required", at);
            TD_ASSIGN_OR_RETURN(ojson content, content_of(*c, at + ".content"));
            out.push_back({{"role", role}, {"content", std::move(content)}});
        } else if (type == "function_call") {
            std::string call_id, name, arguments;
            TD_TRY(get_required_string(item, "call_id", at, call_id));
            TD_TRY(get_required_string(item, "name", at, name));
            TD_TRY(get_required_string(item, "arguments", at, arguments));
            ojson call = {{"id", call_id},
                          {"type", "function"},
                          {"function", {{"name", name}, {"arguments", arguments}}}};
            if (!out.empty() && out.back()["role"] == "assistant" &&
                (!out.back().contains("tool_calls") || !out.back()["tool_calls"].empty())) {
                out.back()["tool_calls"].push_back(std::move(call));
            } else {
                out.push_back(
                    {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", ojson::array({call})}});
            }
        } else if (type == "function_call_output") {
            std::string call_id;
            TD_TRY(get_required_string(item, "call_id", at, call_id));
            const ojson *o = field(item, "output");
            if (o == nullptr) return invalid_input("'{}.output' is required", at);
            TD_ASSIGN_OR_RETURN(ojson content, content_of(*o, at + ".output"));
            out.push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", std::move(content)}});
        } else if (type == "reasoning") {
            continue;  // a reasoning model's summary from an earlier turn: not shown to the model again
        } else {
            return invalid_input(
                "'{}.type' '{}' is not supported (message, function_call, function_call_output)", at, type);
        }
    }
    return out;
}

Result<ojson> chat_tools(const ojson &tools) {
    if (!tools.is_array()) return invalid_input("'tools' must be an array, got {}", type_name(tools));
    ojson out = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const ojson &t = tools[i];
        const std::string at = fmt::format("tools[{}]", i);
        if (!t.is_object()) return invalid_input("'{}' must be an object, got {}", at, type_name(t));
        std::string type;
        TD_TRY(get_required_string(t, "type", at, type));
        if (type != "function")
            return invalid_input("'{}.type' '{}' is not supported: this server runs function tools only", at,
                                 type);
        ojson fn = ojson::object();
        for (const char *key : {"name", "description", "parameters", "strict"})
            if (const ojson *v = field(t, key)) fn[key] = *v;
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return out;
}

Result<ojson> chat_tool_choice(const ojson &v) {
    if (v.is_string()) return ojson(v);
    if (!v.is_object())
        return invalid_input("'tool_choice' must be a string or an object, got {}", type_name(v));
    std::string type, name;
    TD_TRY(get_required_string(v, "type", "tool_choice", type));
    if (type != "function") return invalid_input("'tool_choice.type' '{}' is not supported (function)", type);
    TD_TRY(get_required_string(v, "name", "tool_choice", name));
    return ojson{{"type", "function"}, {"function", {{"name", name}}}};
}

Result<ojson> chat_response_format(const ojson &text) {
    if (!text.is_object()) return invalid_input("'text' must be an object, got {}", type_name(text));
    const ojson *f = field(text, "format");
    if (f == nullptr) return ojson(nullptr);
    if (!f->is_object()) return invalid_input("'text.format' must be an object, got {}", type_name(*f));
    std::string type;
    TD_TRY(get_required_string(*f, "type", "text.format", type));
    if (type == "text") return ojson(nullptr);
    if (type == "json_object") return ojson{{"type", "json_object"}};
    if (type != "json_schema")
        return invalid_input("'text.format.type' must be text, json_object or json_schema, got '{}'", type);
    const ojson *schema = field(*f, "schema");
    if (schema == nullptr) return invalid_input("'text.format.schema' is required with json_schema");
    ojson js = {{"schema", *schema}};
    if (const ojson *n = field(*f, "name")) js["name"] = *n;
    if (const ojson *s = field(*f, "strict")) js["strict"] = *s;
    return ojson{{"type", "json_schema"}, {"json_schema", std::move(js)}};
}

}  // namespace

Result<ResponsesInput> parse_responses_input(std::string_view body) {
    TD_ASSIGN_OR_RETURN(ojson j, parse_object_in_order(body));
    ResponsesInput in;
    const ojson *input = field(j, "input");
    if (input == nullptr) return invalid_input("'input' is required");
    TD_ASSIGN_OR_RETURN(in.input, input_messages(*input));
    if (const ojson *v = field(j, "instructions")) {
        if (!v->is_string()) return invalid_input("'instructions' must be a string, got {}", type_name(*v));
        if (!v->get<std::string>().empty()) in.instructions = {{"role", "system"}, {"content", *v}};
    }
    if (const ojson *v = field(j, "previous_response_id")) {
        if (!v->is_string())
            return invalid_input("'previous_response_id' must be a string, got {}", type_name(*v));
        in.previous_response_id = v->get<std::string>();
    }
    for (auto [key, out] : {std::pair<const char *, bool *>{"store", &in.store}, {"stream", &in.stream}})
        if (const ojson *v = field(j, key)) {
            if (!v->is_boolean()) return invalid_input("'{}' must be a boolean, got {}", key, type_name(*v));
            *out = v->get<bool>();
        }

    // The chat body: the sampling fields as they are, the Responses API's own ones translated.
    in.chat = ojson::object();
    static const char *const own[] = {"input",
                                      "instructions",
                                      "previous_response_id",
                                      "store",
                                      "stream",
                                      "tools",
                                      "tool_choice",
                                      "text",
                                      "max_output_tokens",
                                      "metadata",
                                      "include",
                                      "reasoning",
                                      "truncation",
                                      "user",
                                      "background",
                                      "n",
                                      "messages",
                                      "max_tokens",
                                      "max_completion_tokens",
                                      "response_format",
                                      "logprobs",
                                      "top_logprobs",
                                      "stream_options",
                                      "prompt"};
    for (auto it = j.begin(); it != j.end(); ++it) {
        bool skip = false;
        for (const char *k : own) skip = skip || it.key() == k;
        if (!skip) in.chat[it.key()] = it.value();
    }
    if (const ojson *v = field(j, "max_output_tokens")) in.chat["max_tokens"] = *v;
    if (const ojson *v = field(j, "tools")) {
        TD_ASSIGN_OR_RETURN(ojson tools, chat_tools(*v));
        in.chat["tools"] = std::move(tools);
    }
    if (const ojson *v = field(j, "tool_choice")) {
        TD_ASSIGN_OR_RETURN(ojson choice, chat_tool_choice(*v));
        in.chat["tool_choice"] = std::move(choice);
    }
    if (const ojson *v = field(j, "text")) {
        TD_ASSIGN_OR_RETURN(ojson format, chat_response_format(*v));
        if (!format.is_null()) in.chat["response_format"] = std::move(format);
    }

    // What the response repeats, as OpenAI's does (null where the request left it to the server).
    const auto given = [&](const char *key, json fallback) {
        const ojson *v = field(j, key);
        return v == nullptr ? fallback : json::parse(v->dump());
    };
    in.echo = {{"instructions", given("instructions", nullptr)},
               {"max_output_tokens", given("max_output_tokens", nullptr)},
               {"metadata", given("metadata", json::object())},
               {"parallel_tool_calls", given("parallel_tool_calls", true)},
               {"previous_response_id", given("previous_response_id", nullptr)},
               {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
               {"store", in.store},
               {"temperature", given("temperature", nullptr)},
               {"text", given("text", {{"format", {{"type", "text"}}}})},
               {"tool_choice", given("tool_choice", "auto")},
               {"tools", given("tools", json::array())},
               {"top_p", given("top_p", nullptr)},
               {"truncation", "disabled"},
               {"user", given("user", nullptr)}};
    return in;
}

Result<ApiRequest> responses_chat_request(const ResponsesInput &in, const ojson &history) {
    ojson body = in.chat;
    ojson messages = ojson::array();
    if (!in.instructions.is_null()) messages.push_back(in.instructions);
    for (const ojson &m : history) messages.push_back(m);
    for (const ojson &m : in.input) messages.push_back(m);
    if (messages.empty()) return invalid_input("'input' holds no message");
    body["messages"] = std::move(messages);
    body.erase("stream");  // the Responses stream is written by its own format
    return parse_chat_request(body.dump());
}

json message_item(const std::string &id, const std::string &text, const char *status) {
    return {{"type", "message"},
            {"id", id},
            {"status", status},
            {"role", "assistant"},
            {"content",
             json::array({{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}}})}};
}

json function_call_item(const std::string &id, const ToolCall &call, const char *status) {
    return {{"type", "function_call"},     {"id", id},        {"call_id", call.id}, {"name", call.name},
            {"arguments", call.arguments}, {"status", status}};
}

json response_json(const std::string &id, int64_t created_at, const std::string &model,
                   const ResponsesInput &in, const char *status, const json &output, const Usage *usage) {
    json r = {{"id", id},         {"object", "response"}, {"created_at", created_at},
              {"status", status}, {"error", nullptr},     {"incomplete_details", nullptr},
              {"model", model},   {"output", output}};
    if (std::string_view(status) == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    for (auto it = in.echo.begin(); it != in.echo.end(); ++it) r[it.key()] = it.value();
    if (usage != nullptr) {
        r["usage"] = {{"input_tokens", usage->n_prompt},
                      {"input_tokens_details", {{"cached_tokens", usage->n_cached}}},
                      {"output_tokens", usage->n_generated},
                      {"output_tokens_details", {{"reasoning_tokens", 0}}},
                      {"total_tokens", usage->n_prompt + usage->n_generated}};
    } else {
        r["usage"] = nullptr;
    }
    return r;
}

ojson reply_messages(const std::string &text, const std::vector<ToolCall> &calls) {
    ojson m = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) {
        if (text.empty()) m["content"] = nullptr;
        m["tool_calls"] = ojson::array();
        for (const ToolCall &c : calls)
            m["tool_calls"].push_back({{"id", c.id},
                                       {"type", "function"},
                                       {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    return ojson::array({std::move(m)});
}

void ResponseStore::put(const std::string &id, Entry entry) {
    const size_t bytes = entry.response.dump().size() + entry.conversation.dump().size();
    std::lock_guard lock(mu_);
    if (bytes > max_bytes_ || max_count_ == 0) return;
    if (auto it = entries_.find(id); it != entries_.end()) {
        bytes_ -= it->second.second;
        entries_.erase(it);
    }
    entries_.emplace(id, std::make_pair(std::move(entry), bytes));
    order_.push_back(id);
    bytes_ += bytes;
    while ((entries_.size() > max_count_ || bytes_ > max_bytes_) && !order_.empty()) {
        auto it = entries_.find(order_.front());
        order_.pop_front();
        if (it == entries_.end() || it->first == id) continue;
        bytes_ -= it->second.second;
        entries_.erase(it);
    }
    // Erased ids and earlier puts of a re-stored id stay in order_ until they reach its front: compact it
    // when they outnumber the entries.
    if (order_.size() > 2 * entries_.size() + 64) {
        std::deque<std::string> kept;
        for (std::string &k : order_)
            if (entries_.contains(k)) kept.push_back(std::move(k));
        order_ = std::move(kept);
    }
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string &id) const {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return std::nullopt;
    return it->second.first;
}

bool ResponseStore::erase(const std::string &id) {
    std::lock_guard lock(mu_);
    auto it = entries_.find(id);
    if (it == entries_.end()) return false;
    bytes_ -= it->second.second;
    entries_.erase(it);
    return true;
}

size_t ResponseStore::size() const {
    std::lock_guard lock(mu_);
    return entries_.size();
}

}  // namespace td::server
