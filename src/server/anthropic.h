// Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens), as llama-server, vLLM and
// Ollama serve it for Claude Code and the Anthropic SDKs: a request is turned into a chat request
// (server/openai.h) and runs on the chat path; the reply comes back as content blocks (text, tool_use) with
// Anthropic's stop reasons and usage, and, streamed, as its SSE events (message_start, content_block_start,
// content_block_delta, content_block_stop, message_delta, message_stop).
//
// Request fields honoured:
//   messages        [{role: user | assistant, content: a string or blocks}]; blocks: text, tool_use (an
//                   assistant's: id, name, input), tool_result (a user's: tool_use_id, content as a string or
//                   text blocks, is_error); thinking blocks are skipped; images and documents are refused
//   system          a string or text blocks: the system message
//   max_tokens, temperature, top_p, top_k, stop_sequences, stream, and the chat path's extras (min_p, seed,
//   ...) tools           [{name, description, input_schema}] (custom tools; Anthropic's server tools are
//   refused) tool_choice     {type: auto | any | tool (name) | none, disable_parallel_tool_use}
// metadata, thinking and service_tier are accepted and ignored.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "server/openai.h"
#include "text/tool-calls.h"

namespace td::server {

struct MessagesRequest {
    ApiRequest api;                           // kind chat
    std::vector<std::string> stop_sequences;  // the client's (a stop on one of them is "stop_sequence")
    bool stream = false;
};

Result<MessagesRequest> parse_messages_request(std::string_view body);

// Anthropic's stop_reason: "tool_use" when the reply made calls, "max_tokens" when it was cut,
// "stop_sequence" when it ended on one of the client's stop sequences (stop_sequence is then set), else
// "end_turn".
const char *messages_stop_reason(const MessagesRequest &req, const StreamEvent &done, bool has_calls,
                                 std::string &stop_sequence);

// A tool_use block of `call` (its arguments parsed back to the input object).
nlohmann::json tool_use_block(const ToolCall &call);

// usage: input_tokens are the prompt's computed ones, cache_read_input_tokens the ones taken from the prefix
// cache (Anthropic counts them apart).
nlohmann::json messages_usage(const StreamEvent &done);

// The whole reply (stream false).
nlohmann::json message_json(const std::string &id, const std::string &model, const std::string &text,
                            const std::vector<ToolCall> &calls, const char *stop_reason,
                            const std::string &stop_sequence, const StreamEvent &done);

// {"type": "error", "error": {"type": ..., "message": ...}} with Anthropic's error type for the HTTP status.
nlohmann::json anthropic_error_json(int http_status, std::string_view message);

}  // namespace td::server
