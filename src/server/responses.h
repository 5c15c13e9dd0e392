// OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}), as vLLM, llama-server and
// Ollama serve it: a request is turned into a chat request (server/openai.h) and runs on the chat path, so
// its sampling fields, constraints and tool calls mean what they mean there; the reply comes back as output
// items (a message with output_text, function_call items) and, streamed, as the API's typed events.
//
// Request fields honoured:
//   input                 a string (one user message) or items: messages {role: user | assistant | system |
//                         developer, content: a string or [{type: input_text | output_text | text, text}]},
//                         {type: function_call, call_id, name, arguments}, {type: function_call_output,
//                         call_id, output}; reasoning items are skipped
//   instructions          a system message first (not carried over by previous_response_id, as OpenAI says)
//   previous_response_id  continues a stored response's conversation
//   store                 bool (default true): keep the response for previous_response_id and GET
//   max_output_tokens, temperature, top_p, stream, parallel_tool_calls, and the chat path's extras (top_k,
//   min_p, seed, ...)
//   tools                 [{type: function, name, description, parameters}]; other tool types are refused
//   tool_choice           auto | none | required | {type: function, name}
//   text.format           {type: text | json_object | json_schema (name, schema, strict)}
// Images and files are refused (tandem serves text models).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "server/openai.h"
#include "text/tool-calls.h"

namespace td::server {

struct ResponsesInput {
    nlohmann::ordered_json chat;          // a chat-completions body without its messages (key order kept)
    nlohmann::ordered_json instructions;  // a system message, or null
    nlohmann::ordered_json input;         // the input as chat messages
    std::string previous_response_id;     // "" when absent
    bool store = true;
    bool stream = false;
    nlohmann::json echo;  // the fields the response object repeats (instructions, tools, text, ...)
};

Result<ResponsesInput> parse_responses_input(std::string_view body);

// The chat request: instructions, then `history` (the stored conversation of previous_response_id, chat
// messages; [] for none), then the input.
Result<ApiRequest> responses_chat_request(const ResponsesInput &in, const nlohmann::ordered_json &history);

// Output items.
nlohmann::json message_item(const std::string &id, const std::string &text, const char *status);
nlohmann::json function_call_item(const std::string &id, const ToolCall &call, const char *status);

// The response object. status: "in_progress", "completed", "incomplete" (max_output_tokens reached) or
// "failed"; output: the items.
nlohmann::json response_json(const std::string &id, int64_t created_at, const std::string &model,
                             const ResponsesInput &in, const char *status, const nlohmann::json &output,
                             const Usage *usage);

// The reply as chat messages (what a later previous_response_id feeds the template): an assistant message
// with the text and the calls.
nlohmann::ordered_json reply_messages(const std::string &text, const std::vector<ToolCall> &calls);

// What a server keeps of stored responses.
inline constexpr size_t kMaxStoredResponses = 1000;
inline constexpr size_t kMaxStoredResponseBytes = size_t{64} << 20;

// Stored responses (store: true), in memory: at most max_count of them and max_bytes of their JSON, the
// oldest dropped first.
class ResponseStore {
public:
    ResponseStore(size_t max_count, size_t max_bytes) : max_count_(max_count), max_bytes_(max_bytes) {}
    struct Entry {
        nlohmann::json response;
        nlohmann::ordered_json
            conversation;  // every message up to and including the reply, instructions left out
    };
    void put(const std::string &id, Entry entry);
    std::optional<Entry> get(const std::string &id) const;
    bool erase(const std::string &id);
    size_t size() const;

private:
    mutable std::mutex mu_;
    size_t max_count_;
    size_t max_bytes_;
    size_t bytes_ = 0;
    std::map<std::string, std::pair<Entry, size_t>> entries_;  // id -> (entry, its bytes)
    std::deque<std::string> order_;                            // oldest first (may hold erased ids)
};

}  // namespace td::server
