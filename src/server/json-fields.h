// Reading fields of a request's JSON body, for the API layers (openai.*, ollama.*): each reader leaves the
// output alone when the field is absent or null, and returns invalid_input naming the field when it has the
// wrong type ("'temperature' must be a number, got a string").
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/chat-template.h"

namespace td::server {

// "null", "an object", "a string", "an integer", ... for messages.
const char *type_name(const nlohmann::json &v);
const char *type_name(const nlohmann::ordered_json &v);

// The field `key` of `obj`, or nullptr when absent or null.
const nlohmann::json *field(const nlohmann::json &obj, const char *key);

// A finite number.
Status get_number(const nlohmann::json &obj, const char *key, float &out);
// An integer; a float with an integral value (1.0) is accepted, as JavaScript clients send those.
Status get_int(const nlohmann::json &obj, const char *key, int64_t &out, bool &present);
Status get_bool(const nlohmann::json &obj, const char *key, bool &out);
// A string or an array of at most `max` strings, appended to `out`.
Status get_strings(const nlohmann::json &obj, const char *key, size_t max, std::vector<std::string> &out);
// 'messages': a non-empty array of objects, each with a string 'role'; `content` reads the rest of message i
// (its content, what the API allows beside it) into the ChatMessage whose role is set.
Status get_messages(const nlohmann::json &obj, std::vector<ChatMessage> &out,
                    const std::function<Status(const nlohmann::json &, size_t, ChatMessage &)> &content);
// 'tools' (OpenAI's and Ollama's): [{"type": "function", "function": {"name", "description"?,
// "parameters"?}}], into `out` as given; names are 1-64 letters, digits, '_' or '-', each once. Absent: `out`
// unchanged.
Status get_tools(const nlohmann::json &obj, nlohmann::json &out);
// Message i's 'tool_calls' (an assistant's): [{"id"?, "type"?, "function": {"name", "arguments"}}], arguments
// a JSON text (OpenAI) or an object (Ollama).
Status get_tool_calls(const nlohmann::json &m, size_t index, std::vector<ToolCall> &out);
// The body as a JSON object: "the request body is not valid JSON", "... must be a JSON object, got ...".
Result<nlohmann::json> parse_object(std::string_view body);

// The same for a body read with its keys in the client's order (the Responses and Messages APIs, which pass
// schemas on to the chat path).
Result<nlohmann::ordered_json> parse_object_in_order(std::string_view body);
const nlohmann::ordered_json *field(const nlohmann::ordered_json &obj, const char *key);
// The string `key` of `obj`: "'where.key' is required" when absent, "'where.key' must be a string, got ..."
// when it is not one.
Status get_required_string(const nlohmann::ordered_json &obj, const char *key, std::string_view where,
                           std::string &out);

// The value at `path` in a request body as JSON text, its objects' keys in the client's order (json sorts
// them, and a JSON schema's properties are generated in the order given); fallback's text when the path is
// not there.
std::string text_in_order(std::string_view body, std::initializer_list<const char *> path,
                          const nlohmann::json &fallback);

}  // namespace td::server
