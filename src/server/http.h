// The HTTP front of `tandem serve` (over server/http-core.h): OpenAI-compatible endpoints over a Scheduler.
//
//   POST /v1/chat/completions   chat (messages -> the model's chat template), stream or not
//   POST /v1/completions        text completion, stream or not
//   GET  /v1/models             the one served model
//   GET  /health                503 {"status":"loading"} until set_backend(), then 200 {"status":"ok"};
//                               503 {"status":"error","message"} while the engine is failing (worker down)
//   GET  /metrics               Prometheus text
//   POST /completion, /infill   llama-server's completion and fill-in-the-middle (server/llamacpp.h)
//   POST /tokenize              {"content", "add_special"?} -> {"tokens"}
//   POST /detokenize            {"tokens"} -> {"content"}
//   GET  /status                JSON for the dashboard: health, layout, recoveries, the scheduler's counters
//                               (tokens/s, queue, slots, KV, requests by outcome) and the engine's nodes and
//                               links
//   GET  /, /app.js, /style.css the web dashboard (server/web-assets.h): a chat page over
//   /v1/chat/completions
//                               and a cluster page over /status. Served without the API key, like /health
//                               (they hold no data; the page asks for the key when /status answers 401)
//   /api/chat, /api/generate, /api/tags, /api/ps, /api/show, /api/version: Ollama's API (server/ollama.h)
//
// Streaming responses are Server-Sent Events ("data: {...}\n\n", then "data: [DONE]\n\n"). A stream whose
// client goes away (a write fails) cancels its request, which frees its slot before the next step. A
// request that fails mid-stream gets one "data: {"error": ...}" event and [DONE]. Errors before a stream
// starts are OpenAI-style JSON with the HTTP status: 400 bad request, 401 bad API key, 404 unknown model or
// path, 503 loading or busy (busy carries Retry-After).
//
// Limits: HttpLimits (http-core.h): header size and count, body size, connections, time to send the header
// and the body. Slow and idle connections wait in the event loop and hold no thread; each request being
// answered holds one handler thread while it runs, so limits.n_threads should cover --parallel + --queue
// plus a few for /health and /metrics. A path takes one method (405 otherwise, with Allow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "server/http-core.h"
#include "server/model-card.h"
#include "server/scheduler.h"
#include "text/chat-formatter.h"
#include "text/tokenizer.h"

namespace td::server {

struct HttpParams {
    std::string host = "127.0.0.1";
    int port = 8080;                  // 0: an ephemeral port (bind() returns it)
    std::string api_key;              // non-empty: every path but /health needs "Authorization: Bearer <key>"
    std::string model_id = "tandem";  // the id /v1/models lists and requests may name
    HttpLimits limits;                // sizes, counts, timeouts, handler threads
    // Both set: HTTPS with this PEM certificate chain and private key (bind() loads and checks them).
    std::string ssl_cert, ssl_key;
    // Sequences (running or waiting; a request takes one per choice) one client address may have open at
    // once; more get 429.
    // 0: no limit.
    int max_per_client = 0;
    bool web_ui = true;  // serve the dashboard at / (server/web-assets.h); false: --no-webui
    bool slots = true;   // GET /slots (llama-server's per-slot state); false: --no-slots
    // Fill in the middle (/infill, Ollama's suffix; server/infill.h): the prompt's budget (llama-server's
    // default n_batch) and the suffix-first layout (--spm-infill).
    int32_t infill_batch = 2048;
    bool spm_infill = false;
};

// What requests are served with, once the model is loaded. Everything must outlive the HttpServer (or
// the next set_backend).
struct ServerBackend {
    Scheduler *scheduler = nullptr;
    const Tokenizer *tokenizer = nullptr;
    const ChatFormatter *chat = nullptr;  // the model's chat template (never null once attached)
    // Extra Prometheus lines from the engine (a cluster's per-node and per-link latency); may be empty.
    std::function<std::string()> engine_metrics;
    const ModelCard *card = nullptr;  // what Ollama's /api/tags and /api/show describe; null: not known
    // The engine's nodes and links as a JSON object (served_model.h's cluster_status_json; one node for one
    // machine), for GET /status. Null or "": not known.
    std::function<std::string()> engine_status;
    Pooling pooling =
        Pooling::last;  // how embedding requests pool the prompt (ServeParams::pooling, resolved)
};

class HttpServer {
public:
    explicit HttpServer(HttpParams params);
    ~HttpServer();  // stop()
    HttpServer(const HttpServer &) = delete;
    HttpServer &operator=(const HttpServer &) = delete;

    // Binds the listening socket; returns the port (the chosen one when params.port is 0).
    // Error (io): "cannot listen on 127.0.0.1:8080 (in use, or no permission)".
    Result<int> bind();
    // Serves on the calling thread until stop(). bind() first.
    Status listen();
    // Ends open streams (their requests are cancelled) and stops accepting; listen() then returns. Safe to
    // call before, during or after listen(), and more than once.
    void stop();

    // Attaches the model: /health turns 200 and the generation endpoints answer.
    void set_backend(ServerBackend backend);

    int port() const { return port_; }
    // Client connections open now (reading, idle or being answered).
    int open_connections() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    int port_ = 0;
};

}  // namespace td::server
