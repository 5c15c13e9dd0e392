// OpenAI API JSON: request bodies -> ApiRequest (validated), results -> response bodies and SSE chunks.
// Knows nothing about HTTP sockets or the scheduler's threads.
//
// Requests (POST /v1/chat/completions, POST /v1/completions). Honoured fields:
//   model                    string; checked by the caller against the served model id
//   messages                 chat: [{role, content}], content a string, null, or [{type:"text", text}]
//   prompt                   completions: a string, [token ids], or a batch of either ([string], [[token
//   ids]]);
//                            prompts x n is at most 128 choices
//   max_tokens, max_completion_tokens   integer >= 1 (the latter wins when both are given)
//   temperature top_p top_k min_p presence_penalty frequency_penalty repeat_penalty seed
//   stop                     string or [string] (at most 16)
//   logprobs, top_logprobs   chat: logprobs bool + top_logprobs 0..20; completions: logprobs integer 0..20
//   stream, stream_options.include_usage
//   n                        1..128 choices: one sequence each (seeds seed, seed+1, ... when seed is given),
//                            usage counts the prompt once and every choice's tokens
//   echo, suffix, best_of    completions (parse_openai_completion): the prompt before each choice's text; fill
//                            in the middle; refused unless equal to n
//   cache_prompt             bool (llama-server's): false computes the whole prompt, not reusing a cached
//   prefix
//   speculative.n_max        0..64 (llama-server's): tokens guessed per step by prompt lookup for this
//                            request (the server's --draft when absent; 0: none)
//   response_format          {"type": "text" | "json_object" | "json_schema", "json_schema": {"schema"}}
//   grammar                  a GBNF grammar (llama-server's) the reply is a sentence of; "" is none
//   guided_json guided_regex guided_choice guided_grammar, structured_outputs {json, regex, choice, grammar}
//                            vLLM's: a schema (object or its text), a regular expression the whole reply
//                            matches, a list of the replies allowed, GBNF. One constraint per request.
//   tools, tool_choice       [{type: "function", function: {name, description, parameters}}]; "auto" (the
//                            default with tools), "none" (tools not shown to the model), "required" or
//                            {"type": "function", "function": {"name"}} (the reply is constrained to be a
//                            call)
//   parallel_tool_calls      bool (default true); false keeps the first call of a reply
//   messages[].tool_calls, messages[].tool_call_id   the calls an assistant made and a tool's result
// Unknown fields are ignored, as OpenAI clients expect; null counts as absent. A field of the wrong type
// or out of range is invalid_input naming it ("'temperature' must be a number, got a string").
// Defaults for fields not given are llama.cpp's (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05), so a
// request means what it means to llama-server; seed absent or negative = random.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/sampler.h"
#include "server/infill.h"
#include "server/scheduler.h"
#include "text/chat-template.h"
#include "text/json-schema.h"

namespace td::server {

enum class ApiKind { chat, completion };

constexpr int32_t kMaxChoices = 128;  // n, as OpenAI bounds it

enum class ToolChoice { auto_, none, required, named };

struct ApiRequest {
    ApiKind kind = ApiKind::chat;
    std::string model;                   // "" when absent
    std::vector<ChatMessage> messages;   // chat
    // Completions: the prompt, or several (OpenAI's batch: prompt p's choice j is choices[p * n + j]).
    struct Prompt {
        std::string text;             // when !is_tokens
        std::vector<int32_t> tokens;  // given as token ids
        bool is_tokens = false;
    };
    std::vector<Prompt> prompts;
    // llama-server's /infill, Ollama's suffix: the prompt is the FIM layout around prompts[0]
    // (server/infill.h).
    std::optional<InfillInput> infill;
    SamplerParams sampling;
    // DRY's sequence breakers as given (llama-server's dry_sequence_breakers); none: its defaults. The
    // server turns them into sampling.dry_breakers with the model's tokenizer when DRY is on.
    std::optional<std::vector<std::string>> dry_sequence_breakers;
    int32_t max_tokens = -1;  // -1: not given
    std::vector<std::string> stop;
    int32_t n_choices = 1;  // n
    bool stream = false;
    bool include_usage = false;
    int32_t n_logprobs = -1;  // -1: no logprobs
    bool cache_prompt = true;  // llama-server's cache_prompt: false computes the whole prompt again
    bool ignore_eos = false;   // llama-server's and vLLM's: end-of-generation tokens are never drawn
    bool echo = false;         // completions: each choice's text starts with its prompt
    // completions' echo with logprobs (or max_tokens 0): the prompt's tokens are scored and listed first,
    // with this many top ones (GenerationJob::n_prompt_logprobs); -1: not.
    int32_t n_prompt_logprobs = -1;
    int32_t n_draft = -1;      // speculative.n_max; -1: the server's
    std::shared_ptr<const JsonSchema> schema;  // response_format json_object / json_schema; null: text
    std::shared_ptr<const Grammar> grammar;    // grammar (GBNF, llama-server's); null: none
    std::string constraint_from;  // the field that set schema or grammar ("response_format", "guided_regex")
    nlohmann::json tools = nlohmann::json::array();  // chat: the tools offered (validated)
    ToolChoice tool_choice = ToolChoice::auto_;
    std::string tool_name;  // ToolChoice::named
    bool parallel_tool_calls = true;
    // Tools are shown to the model and its reply parsed for calls.
    bool uses_tools() const { return !tools.empty() && tool_choice != ToolChoice::none; }
};

// A JSON schema as the reply's constraint: r.schema when it is within JsonSchema's subset, else r.grammar
// (text/json-schema-grammar.h). schema_json keeps the client's key order (text_in_order).
Status constrain_to_schema(ApiRequest &r, std::string_view schema_json, int max_whitespace = 4);

// tool_choice "required" or a named function: the schema a reply must match, {"name": one of the tools,
// "arguments": that tool's parameters (any object when they are not a schema tandem takes, or when any of
// several tools may be called)}. Sets r.schema or r.grammar; an error when response_format is also given.
Status apply_tool_choice(ApiRequest &r);

// Parses and validates a request body. Errors are invalid_input with a message for the client:
// "the request body is not valid JSON: ...", "'messages' is required", "'n' must be 1..128, got 0".
Result<ApiRequest> parse_chat_request(std::string_view body);
// prompt_required false: a missing prompt is "" (llama-server's /infill).
Result<ApiRequest> parse_completion_request(std::string_view body, bool prompt_required = true);
// POST /v1/completions: parse_completion_request and OpenAI's fields for it alone: echo (not with logprobs:
// the prompt's log-probabilities are not computed), suffix (fill in the middle: the prompt, one text, is the
// text before the cursor, as Ollama's suffix), best_of (refused unless it equals n, as llama-server and
// vLLM refuse it).
Result<ApiRequest> parse_openai_completion(std::string_view body);

// What every response of one request shares.
struct ResponseMeta {
    ApiKind kind = ApiKind::chat;
    std::string id;  // "chatcmpl-<hex>" or "cmpl-<hex>"
    int64_t created = 0;
    std::string model;
};
// n random hex digits (response and call ids).
std::string random_hex(size_t n);

ResponseMeta make_response_meta(ApiKind kind, std::string model);

struct Usage {
    int32_t n_prompt = 0;
    int32_t n_generated = 0;
    int32_t n_cached =
        0;  // prompt tokens found in the prefix cache (usage.prompt_tokens_details.cached_tokens)
};

// One choice of a finished reply.
struct ChoiceResult {
    std::string text;
    FinishReason finish = FinishReason::stop;
    std::vector<TokenLogprob> logprobs;
    std::vector<ToolCall> tool_calls;
};

// Non-streaming response: chat.completion or text_completion, choices[i] with index i. logprobs (when
// n_logprobs >= 0) for every generated token.
// With tool calls (chat), message.tool_calls holds them, content is null when empty, and finish_reason is
// "tool_calls".
nlohmann::json completion_json(const ResponseMeta &meta, const std::vector<ChoiceResult> &choices,
                               const Usage &usage, int32_t n_logprobs);
// The streamed form of tool calls: one chunk for choice `index` with delta.tool_calls [{index, id, type,
// function: {name, arguments}}] per call.
nlohmann::json tool_calls_chunk_json(const ResponseMeta &meta, int32_t index,
                                     const std::vector<ToolCall> &calls);
// The calls of a finished reply with ids from new_id; without parallel_tool_calls only the first.
std::vector<ToolCall> finish_tool_calls(std::vector<ToolCall> calls, bool parallel,
                                        const std::function<std::string()> &new_id);

// Streaming chunk (chat.completion.chunk / text_completion) of choice `index`. `role_first`: the chat chunk
// that opens the reply ({"role":"assistant","content":""}). finish: nullptr for none.
nlohmann::json chunk_json(const ResponseMeta &meta, int32_t index, const std::string &text, bool role_first,
                          const char *finish, int32_t n_logprobs, const std::vector<TokenLogprob> &logprobs);
// The extra chunk of stream_options.include_usage: choices [] and usage.
nlohmann::json usage_chunk_json(const ResponseMeta &meta, const Usage &usage);

// "data: <json>\n\n"; sse_done() is "data: [DONE]\n\n".
std::string sse_event(const nlohmann::json &j);
std::string sse_done();

// {"error": {"message", "type", "code"}}; type from the HTTP status (400 invalid_request_error,
// 401 authentication_error, 404 not_found_error, 503 unavailable_error, else server_error); code = status.
nlohmann::json error_json(int http_status, std::string_view message);

// The HTTP status for a Status from the scheduler or a parser: invalid_input 400, not_found 404,
// overloaded 503, unimplemented 501, others 500.
int http_status_for(const Status &status);

// A token's raw bytes as OpenAI's logprobs give them ("bytes": [72, 105]).
nlohmann::json bytes_json(const std::string &piece);

// Serialises with invalid UTF-8 replaced by U+FFFD (token pieces may be partial characters).
std::string json_dump(const nlohmann::json &j);

}  // namespace td::server
