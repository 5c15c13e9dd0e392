// Ollama's API beside OpenAI's, so Ollama clients (the `ollama` libraries, Open WebUI in Ollama mode) work
// unchanged: request bodies -> ApiRequest, results -> NDJSON lines and JSON bodies. Knows nothing about
// sockets or threads (server/http-ollama.cpp serves it).
//
//   POST /api/chat       {model, messages: [{role, content}], stream (default true), options, keep_alive}
//   POST /api/generate   {model, prompt, suffix, system, raw, stream (default true), options, keep_alive};
//                        with a suffix, the prompt and suffix are filled in the middle (server/infill.h; a
//                        model without FIM tokens: 400 "... does not support insert", as Ollama answers)
//   GET  /api/tags       the served model; GET /api/ps the same, as loaded
//   POST /api/show       {model} (or {name}): details, model_info, template, capabilities
//   GET  /api/version
//
// options: temperature top_k top_p min_p typical_p seed num_predict (-1 or -2: until the context is full)
// stop repeat_penalty repeat_last_n presence_penalty frequency_penalty mirostat mirostat_tau mirostat_eta
// (Mirostat replaces the filters and penalties, as in the llama.cpp runner Ollama uses). Options that set up
// the runner (num_ctx, num_batch, num_thread, num_gpu, use_mmap, ...) are accepted and ignored: the server
// was set up at start. Defaults are Ollama's: temperature 0.8, top_k 40, top_p 0.9, min_p 0,
// repeat_penalty 1.1, repeat_last_n 64. format: "json" (any JSON object) or a JSON schema
// (text/json-schema-grammar.h): constrained sampling. Answered 400 naming them: images (the models are text
// only) and the sampling option tandem does not have (tfs_z, which llama.cpp dropped). /api/show lists
// "insert" among the capabilities of a model that can fill in the middle.
//
// /api/generate renders the prompt (and system) through the model's chat template, as Ollama does with a
// model's template; a model without a template of its own, or raw: true, takes the prompt as it is.
// Model names: "" , the served id, or the id with a tag ("stories:latest"); anything else is 404.
// Errors are {"error": "message"} with the HTTP status; a failure mid-stream is one {"error": ...} line.
// Streams are NDJSON (application/x-ndjson): one object a line, done: false, then a last one with
// done: true, done_reason ("stop" or "length") and the counts and durations (nanoseconds) Ollama reports.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"
#include "server/model-card.h"
#include "server/openai.h"
#include "server/scheduler.h"

namespace td::server {

// /api/chat: kind chat, messages.
Result<ApiRequest> parse_ollama_chat(std::string_view body);
// /api/generate: kind chat with [system, user] when `use_template` and not raw, else kind completion. No
// prompt and no system: kind completion with an empty prompt (Ollama's "load the model" request, answered
// done with done_reason "load").
Result<ApiRequest> parse_ollama_generate(std::string_view body, bool use_template);
// /api/show: the model it names ({"model"} or the older {"name"}).
Result<std::string> parse_ollama_show(std::string_view body);

bool ollama_model_matches(std::string_view name, std::string_view id);

struct OllamaStats {
    int32_t n_prompt = 0, n_generated = 0;
    int64_t total_ns = 0;   // from the request to its end
    int64_t prompt_ns = 0;  // to the first token
    int64_t eval_ns = 0;    // the rest
};

// One piece of a stream (done: false).
nlohmann::json ollama_chunk(ApiKind kind, const std::string &model, const std::string &text);
// The last line of a stream (text "") or the whole answer (stream: false).
nlohmann::json ollama_final(ApiKind kind, const std::string &model, const std::string &text,
                            FinishReason finish, const OllamaStats &stats);
nlohmann::json ollama_error(std::string_view message);  // {"error": message}
// message.tool_calls: [{"function": {"index", "name", "arguments": an object}}].
nlohmann::json ollama_tool_calls(const std::vector<ToolCall> &calls);

nlohmann::json ollama_tags(const ModelCard &card, const std::string &id);
nlohmann::json ollama_ps(const ModelCard &card, const std::string &id);
nlohmann::json ollama_show(const ModelCard &card);
nlohmann::json ollama_version();

// RFC 3339 UTC with nanoseconds, as Ollama writes created_at: "2026-12-02T03:14:07.414671000Z".
std::string rfc3339(int64_t unix_ns);
int64_t now_unix_ns();

}  // namespace td::server
