#include "server/anthropic.h"

#include <fmt/format.h>

#include <algorithm>

#include "server/json-fields.h"

namespace td::server {
namespace {

using ojson = nlohmann::ordered_json;
using json = nlohmann::json;

// Text content: a string, or text blocks (as the chat path's parts).
Result<ojson> text_content(const ojson &v, const std::string &where) {
    if (v.is_string()) return ojson(v);
    if (!v.is_array())
        return invalid_input("'{}' must be a string or an array of blocks, got {}", where, type_name(v));
    ojson parts = ojson::array();
    for (size_t j = 0; j < v.size(); ++j) {
        const std::string at = fmt::format("{}[{}]", where, j);
        if (!v[j].is_object()) return invalid_input("'{}' must be an object, got {}", at, type_name(v[j]));
        std::string type, text;
        TD_TRY(get_required_string(v[j], "type", at, type));
        if (type != "text")
            return invalid_input("'{}.type' '{}' is not supported here: this server takes text only", at,
                                 type);
        TD_TRY(get_required_string(v[j], "text", at, text));
        parts.push_back({{"type", "text"}, {"text", std::move(text)}});
    }
    return parts;
}

// One Anthropic message as chat messages: a user's tool results become tool messages (first, as Anthropic
// puts them), an assistant's tool_use blocks its tool_calls.
Status add_message(const ojson &m, size_t i, ojson &out) {
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) return invalid_input("'{}' must be an object, got {}", at, type_name(m));
    std::string role;
    TD_TRY(get_required_string(m, "role", at, role));
    if (role != "user" && role != "assistant")
        return invalid_input("'{}.role' must be user or assistant, got '{}'", at, role);
    const ojson *content = field(m, "content");
    if (content == nullptr) return invalid_input("'{}.content' is required", at);
    if (content->is_string()) {
        out.push_back({{"role", role}, {"content", *content}});
        return {};
    }
    if (!content->is_array())
        return invalid_input("'{}.content' must be a string or an array of blocks, got {}", at,
                             type_name(*content));
    ojson parts = ojson::array(), calls = ojson::array(), results = ojson::array();
    for (size_t j = 0; j < content->size(); ++j) {
        const ojson &b = (*content)[j];
        const std::string bat = fmt::format("{}.content[{}]", at, j);
        if (!b.is_object()) return invalid_input("'{}' must be an object, got {}", bat, type_name(b));
        std::string type;
        TD_TRY(get_required_string(b, "type", bat, type));
        if (type == "text") {
            std::string text;
            TD_TRY(get_required_string(b, "text", bat, text));
            parts.push_back({{"type", "text"}, {"text", std::move(text)}});
        } else if (type == "tool_use" && role == "assistant") {
            std::string id, name;
            TD_TRY(get_required_string(b, "id", bat, id));
            TD_TRY(get_required_string(b, "name", bat, name));
            const ojson *input = field(b, "input");
            if (input == nullptr || !input->is_object())
                return invalid_input("'{}.input' must be an object", bat);
            calls.push_back({{"id", id},
                             {"type", "function"},
                             {"function", {{"name", name}, {"arguments", input->dump()}}}});
        } else if (type == "tool_result" && role == "user") {
            std::string id;
            TD_TRY(get_required_string(b, "tool_use_id", bat, id));
            ojson result = "";
            if (const ojson *c = field(b, "content")) {
                TD_ASSIGN_OR_RETURN(result, text_content(*c, bat + ".content"));
            }
            results.push_back({{"role", "tool"}, {"tool_call_id", id}, {"content", std::move(result)}});
        } else if (type == "thinking" || type == "redacted_thinking") {
            continue;  // a reasoning model's earlier thoughts: not shown again
        } else {
            return invalid_input(
                "'{}.type' '{}' is not supported in a{} {} message: this server takes text and tools", bat,
                type, role == "assistant" ? "n" : "", role);
        }
    }
    for (ojson &r : results) out.push_back(std::move(r));
    if (role == "assistant") {
        ojson content = parts.empty() ? (calls.empty() ? ojson("") : ojson(nullptr)) : std::move(parts);
        ojson msg = {{"role", "assistant"}, {"content", std::move(content)}};
        if (!calls.empty()) msg["tool_calls"] = std::move(calls);
        out.push_back(std::move(msg));
    } else if (!parts.empty() || results.empty()) {
        out.push_back({{"role", "user"}, {"content", parts.empty() ? ojson("") : std::move(parts)}});
    }
    return {};
}

Result<ojson> chat_tools(const ojson &tools) {
    if (!tools.is_array()) return invalid_input("'tools' must be an array, got {}", type_name(tools));
    ojson out = ojson::array();
    for (size_t i = 0; i < tools.size(); ++i) {
        const ojson &t = tools[i];
        const std::string at = fmt::format("tools[{}]", i);
        if (!t.is_object()) return invalid_input("'{}' must be an object, got {}", at, type_name(t));
        if (const ojson *type = field(t, "type"); type != nullptr && *type != "custom")
            return invalid_input("'{}.type' '{}' is not supported: this server runs custom tools only", at,
                                 type->is_string() ? type->get<std::string>() : type->dump());
        std::string name;
        TD_TRY(get_required_string(t, "name", at, name));
        const ojson *schema = field(t, "input_schema");
        if (schema == nullptr) return invalid_input("'{}.input_schema' is required", at);
        ojson fn = {{"name", name}, {"parameters", *schema}};
        if (const ojson *d = field(t, "description")) fn["description"] = *d;
        out.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    return out;
}

Status chat_tool_choice(const ojson &v, ojson &chat) {
    if (!v.is_object()) return invalid_input("'tool_choice' must be an object, got {}", type_name(v));
    std::string type;
    TD_TRY(get_required_string(v, "type", "tool_choice", type));
    if (type == "auto") {
        chat["tool_choice"] = "auto";
    } else if (type == "any") {
        chat["tool_choice"] = "required";
    } else if (type == "none") {
        chat["tool_choice"] = "none";
    } else if (type == "tool") {
        std::string name;
        TD_TRY(get_required_string(v, "name", "tool_choice", name));
        chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    } else {
        return invalid_input("'tool_choice.type' must be auto, any, tool or none, got '{}'", type);
    }
    if (const ojson *d = field(v, "disable_parallel_tool_use")) {
        if (!d->is_boolean())
            return invalid_input("'tool_choice.disable_parallel_tool_use' must be a boolean, got {}",
                                 type_name(*d));
        chat["parallel_tool_calls"] = !d->get<bool>();
    }
    return {};
}

}  // namespace

Result<MessagesRequest> parse_messages_request(std::string_view body) {
    TD_ASSIGN_OR_RETURN(ojson j, parse_object_in_order(body));
    MessagesRequest out;
    ojson chat = ojson::object();
    static const char *const own[] = {"messages",
                                      "system",
                                      "stop_sequences",
                                      "tools",
                                      "tool_choice",
                                      "metadata",
                                      "thinking",
                                      "service_tier",
                                      "stream",
                                      "container",
                                      "mcp_servers",
                                      "output_format",
                                      "context_management",
                                      "n",
                                      "response_format",
                                      "stop",
                                      "logprobs",
                                      "top_logprobs",
                                      "stream_options",
                                      "max_completion_tokens"};
    for (auto it = j.begin(); it != j.end(); ++it)
        if (std::none_of(std::begin(own), std::end(own), [&](const char *k) { return it.key() == k; }))
            chat[it.key()] = it.value();

    ojson messages = ojson::array();
    if (const ojson *s = field(j, "system")) {
        TD_ASSIGN_OR_RETURN(ojson system, text_content(*s, "system"));
        if (!(system.is_string() && system.get<std::string>().empty()) &&
            !(system.is_array() && system.empty()))
            messages.push_back({{"role", "system"}, {"content", std::move(system)}});
    }
    const ojson *ms = field(j, "messages");
    if (ms == nullptr) return invalid_input("'messages' is required");
    if (!ms->is_array() || ms->empty())
        return invalid_input("'messages' must be a non-empty array, got {}",
                             ms->is_array() ? "an empty array" : type_name(*ms));
    for (size_t i = 0; i < ms->size(); ++i) TD_TRY(add_message((*ms)[i], i, messages));
    chat["messages"] = std::move(messages);

    if (const ojson *s = field(j, "stop_sequences")) {
        if (!s->is_array())
            return invalid_input("'stop_sequences' must be an array of strings, got {}", type_name(*s));
        for (const ojson &x : *s) {
            if (!x.is_string())
                return invalid_input("'stop_sequences' must hold strings, got {}", type_name(x));
            out.stop_sequences.push_back(x.get<std::string>());
        }
        chat["stop"] = *s;
    }
    if (const ojson *t = field(j, "tools")) {
        TD_ASSIGN_OR_RETURN(ojson tools, chat_tools(*t));
        chat["tools"] = std::move(tools);
    }
    if (const ojson *tc = field(j, "tool_choice")) TD_TRY(chat_tool_choice(*tc, chat));
    if (const ojson *f = field(j, "output_format")) {
        if (!f->is_object()) return invalid_input("'output_format' must be an object, got {}", type_name(*f));
        std::string type;
        TD_TRY(get_required_string(*f, "type", "output_format", type));
        if (type != "json_schema")
            return invalid_input("'output_format.type' must be json_schema, got '{}'", type);
        const ojson *schema = field(*f, "schema");
        if (schema == nullptr) return invalid_input("'output_format.schema' is required");
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"schema", *schema}}}};
    }
    if (const ojson *s = field(j, "stream")) {
        if (!s->is_boolean()) return invalid_input("'stream' must be a boolean, got {}", type_name(*s));
        out.stream = s->get<bool>();
    }
    TD_ASSIGN_OR_RETURN(out.api, parse_chat_request(chat.dump()));
    return out;
}

const char *messages_stop_reason(const MessagesRequest &req, const StreamEvent &done, bool has_calls,
                                 std::string &stop_sequence) {
    stop_sequence.clear();
    if (has_calls) return "tool_use";
    if (done.finish == FinishReason::length) return "max_tokens";
    if (!done.stop_word.empty() && std::find(req.stop_sequences.begin(), req.stop_sequences.end(),
                                             done.stop_word) != req.stop_sequences.end()) {
        stop_sequence = done.stop_word;
        return "stop_sequence";
    }
    return "end_turn";
}

json tool_use_block(const ToolCall &call) {
    json input = json::parse(call.arguments, nullptr, false);
    if (!input.is_object()) input = json::object();
    return {{"type", "tool_use"}, {"id", call.id}, {"name", call.name}, {"input", std::move(input)}};
}

json messages_usage(const StreamEvent &done) {
    return {{"input_tokens", std::max(done.n_prompt - done.n_cached, 0)},
            {"cache_creation_input_tokens", 0},
            {"cache_read_input_tokens", done.n_cached},
            {"output_tokens", done.n_generated}};
}

json message_json(const std::string &id, const std::string &model, const std::string &text,
                  const std::vector<ToolCall> &calls, const char *stop_reason,
                  const std::string &stop_sequence, const StreamEvent &done) {
    json content = json::array();
    if (!text.empty()) content.push_back({{"type", "text"}, {"text", text}});
    for (const ToolCall &c : calls) content.push_back(tool_use_block(c));
    return {{"id", id},
            {"type", "message"},
            {"role", "assistant"},
            {"model", model},
            {"content", std::move(content)},
            {"stop_reason", stop_reason},
            {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)},
            {"usage", messages_usage(done)}};
}

json anthropic_error_json(int http_status, std::string_view message) {
    const char *type = "api_error";
    switch (http_status) {
        case 400:
        case 405:
        case 408:
        case 411:
        case 431:
        case 505:
            type = "invalid_request_error";
            break;
        case 401:
            type = "authentication_error";
            break;
        case 403:
            type = "permission_error";
            break;
        case 404:
            type = "not_found_error";
            break;
        case 413:
            type = "request_too_large";
            break;
        case 429:
            type = "rate_limit_error";
            break;
        case 503:
        case 529:
            type = "overloaded_error";
            break;
        default:
            break;
    }
    return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
}

}  // namespace td::server
