// The inside of HttpServer, shared by the files that serve its endpoints: http.cpp (OpenAI's API, health,
// metrics, tokenize) and http-ollama.cpp (Ollama's API). Not part of the server's interface.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/http-core.h"
#include "server/http.h"
#include "server/openai.h"
#include "server/responses.h"

namespace td::server {

// How an API answers an error before its stream starts: OpenAI's {"error": {"message", ...}} or Ollama's
// {"error": "..."}, with the HTTP status.
using ErrorReply = void (*)(HttpResponse &res, int status, std::string_view message);

// How a stream's events become bytes (OpenAI's SSE, Ollama's NDJSON). Each returns what to write; "" for
// nothing. `choice` is the index of the choice (OpenAI's n) the event belongs to.
class StreamFormat {
public:
    virtual ~StreamFormat() = default;
    virtual std::string open() { return ""; }
    virtual std::string delta(size_t choice, const StreamEvent &event) = 0;  // text or logprobs
    virtual std::string done(size_t choice, const StreamEvent &event) = 0;   // the choice finished
    virtual std::string finish() { return ""; }                              // after every choice finished
    virtual std::string error(const Status &status) = 0;      // the request failed mid-stream
};

// A whole answer (a request that does not stream).
struct Answer {
    std::string text;
    std::vector<TokenLogprob> logprobs;
    StreamEvent done;                                 // kind done: the finish reason and the counts
    std::chrono::steady_clock::time_point t_first{};  // when the first text arrived (unset: none did)
};

struct HttpServer::Impl {
    HttpParams params;
    std::unique_ptr<HttpCore> core;
    std::atomic<bool> stopping{false};

    std::mutex mu;  // guards backend, has_backend, request_counts, per_client
    ServerBackend backend;
    bool has_backend = false;
    std::map<std::pair<std::string, int>, int64_t> request_counts;  // (path, status) -> count
    std::map<std::string, int> per_client;  // client address -> sequences open (max_per_client)

    using Handler = std::function<void(const HttpRequest &, HttpResponse &)>;
    std::map<std::string, std::pair<std::string, Handler>> routes;  // path -> (method, handler)
    std::map<std::string, bool> public_paths;  // paths served without the API key (/health, the dashboard)
    std::chrono::steady_clock::time_point t_start = std::chrono::steady_clock::now();
    ResponseStore stored_responses{kMaxStoredResponses,
                                   kMaxStoredResponseBytes};  // the Responses API's store

    explicit Impl(HttpParams p) : params(std::move(p)) {}

    // A generation request's places in its client's count (one per choice), given back when the last copy
    // goes (the answer sent or the stream ended).
    struct ClientSlot {
        Impl *impl = nullptr;  // null: no limit
        std::string peer;
        int n = 0;
        ~ClientSlot();
    };
    // `n` places for `peer`; null when they would take it past max_per_client (`open` is then what it holds).
    std::shared_ptr<ClientSlot> client_slot(const std::string &peer, int n, int &open);

    bool get_backend(ServerBackend &out);
    // get_backend, or (no model attached yet) `res` answered by `err` with 503 "the model is still loading"
    // and Retry-After.
    bool ready_backend(HttpResponse &res, ErrorReply err, ServerBackend &out);
    void count(const std::string &path, int status);

    // A chat request's prompt: the model's template over its messages (and tools), tokenized. Errors: the
    // template's (invalid_input).
    Result<std::vector<int32_t>> chat_prompt(const ApiRequest &r, const ServerBackend &be);
    // Takes the client's place, builds the job from `r` (a chat through the model's template, or a prompt)
    // and submits it, once per choice (r.n_choices; choice i seeded seed + i when the seed is fixed). On
    // failure answers `res` with `err` and returns null. `slot` keeps the client's place.
    std::shared_ptr<StreamSet> start_generation(const HttpRequest &req, HttpResponse &res, ApiRequest &r,
                                                const ServerBackend &be, ErrorReply err,
                                                std::shared_ptr<ClientSlot> &slot);
    // Waits for the whole answer of every choice; a client that goes away or a server shutting down cancels
    // the request. nullopt with `res` answered (by `err`) when it failed.
    std::optional<std::vector<Answer>> collect(const HttpRequest &req, HttpResponse &res, StreamSet &streams,
                                               ErrorReply err);
    // Answers `res` with a chunked stream of the choices' events in `format` (the request is cancelled if the
    // client goes away); `slot` is held until the stream ends.
    void stream_response(HttpResponse &res, std::shared_ptr<StreamSet> streams,
                         std::unique_ptr<StreamFormat> format, const char *content_type,
                         std::shared_ptr<ClientSlot> slot);

    void setup();
    void setup_ollama();    // http-ollama.cpp
    void setup_llamacpp();  // http-llamacpp.cpp: llama-server's /completion
    void setup_embeddings();  // http-embeddings.cpp: OpenAI's, llama-server's and Ollama's embeddings
    void setup_responses();   // http-responses.cpp: OpenAI's Responses API
    void setup_anthropic();   // http-anthropic.cpp: Anthropic's Messages API
    void handle_messages(const HttpRequest &req, HttpResponse &res);
    void handle_count_tokens(const HttpRequest &req, HttpResponse &res);
    void handle_responses(const HttpRequest &req, HttpResponse &res);
    // GET or DELETE /v1/responses/{id}.
    void handle_stored_response(const HttpRequest &req, const std::string &id, HttpResponse &res);
    // Runs one embedding job per prompt (the served model's pooling), a slot's worth at a time, holding the
    // client's places; their done events (each with its embedding) in order. nullopt with `res` answered (by
    // `err`) when it failed.
    std::optional<std::vector<StreamEvent>> embed(const HttpRequest &req, HttpResponse &res,
                                                  std::vector<std::vector<int32_t>> prompts,
                                                  const ServerBackend &be, ErrorReply err);
    void handle(const HttpRequest &req, HttpResponse &res);
    void handle_health(HttpResponse &res);
    void handle_models(HttpResponse &res);
    void handle_props(HttpResponse &res);  // llama-server's GET /props
    // GET /v1/models/{id} (OpenAI's retrieve): the model when id (percent-decoded) is the one served, else
    // 404.
    void handle_model(const std::string &id, HttpResponse &res);
    nlohmann::json model_json();
    void handle_metrics(HttpResponse &res);
    void handle_status(HttpResponse &res);
    void handle_tokenize(const HttpRequest &req, HttpResponse &res);
    void handle_detokenize(const HttpRequest &req, HttpResponse &res);
    void handle_apply_template(const HttpRequest &req, HttpResponse &res);
    void handle_generate(const HttpRequest &req, HttpResponse &res, ApiKind kind);
};

void reply_json(HttpResponse &res, int status, const nlohmann::json &body);
// The APIs' ErrorReply: OpenAI's {"error": {...}} (llama-server answers the same), Ollama's {"error": "..."}.
void reply_error(HttpResponse &res, int status, std::string_view message);
void reply_ollama_error(HttpResponse &res, int status, std::string_view message);
void reply_anthropic_error(HttpResponse &res, int status, std::string_view message);

}  // namespace td::server
