// Embeddings: OpenAI's /v1/embeddings, llama-server's /embedding (and /embeddings), Ollama's /api/embed and
// /api/embeddings, over the same scheduler, limits and API key as generation. Every input is an embedding job
// (GenerationJob::embed with the served model's pooling); the vectors are normalized here as each API does.
#include <fmt/format.h>

#include <deque>
#include <memory>
#include <thread>

#include "server/embeddings.h"
#include "server/http-impl.h"
#include "server/ollama.h"

namespace td::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

Result<json> body_object(const std::string &body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return invalid_input("the request body is not a JSON object");
    return j;
}

// An optional integer field; `fallback` when absent.
Result<int64_t> int_field(const json &j, const char *name, int64_t fallback) {
    auto it = j.find(name);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number_integer()) return invalid_input("'{}' must be an integer", name);
    return it->get<int64_t>();
}

std::string string_field(const json &j, const char *name) {
    auto it = j.find(name);
    return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace

std::optional<std::vector<StreamEvent>> HttpServer::Impl::embed(const HttpRequest &req, HttpResponse &res,
                                                                std::vector<std::vector<int32_t>> prompts,
                                                                const ServerBackend &be, ErrorReply err) {
    std::vector<StreamEvent> out;
    // A long list of inputs (clients send hundreds at once) goes a slot's worth at a time, so it never needs
    // more queue places than a server has; the next wave waits in the queue while one runs, so the slots do
    // not idle between waves.
    const size_t wave = static_cast<size_t>(std::max(be.scheduler->stats().n_slots, 1));
    const size_t per_wave =
        params.max_per_client > 0 ? std::min(wave, static_cast<size_t>(params.max_per_client)) : wave;
    struct Wave {
        std::shared_ptr<ClientSlot> slot;  // the client's places, given back when the wave is collected
        std::unique_ptr<StreamSet> streams;
    };
    std::deque<Wave> waves;
    size_t next = 0;  // the first prompt not submitted yet
    const auto cancel_all = [&] {
        for (Wave &w : waves) w.streams->cancel();
    };
    enum class Sent { yes, later, failed };
    // Submits the next wave; `later` when it has to wait for the wave in flight (no room in the queue or in
    // the client's places); `failed` with `res` answered.
    const auto send = [&]() -> Sent {
        const size_t n = std::min(per_wave, prompts.size() - next);
        int open = 0;
        std::shared_ptr<ClientSlot> slot = client_slot(req.peer, static_cast<int>(n), open);
        if (!slot) {
            if (!waves.empty()) return Sent::later;
            res.set_header("Retry-After", "1");
            err(res, 429,
                fmt::format("client {} already has {} of its {} sequences open (the limit per client, "
                            "--max-per-client); retry when one has finished",
                            req.peer, open, params.max_per_client));
            return Sent::failed;
        }
        std::vector<GenerationJob> jobs(n);
        for (size_t i = 0; i < n; ++i) {
            jobs[i].prompt = prompts[next + i];
            jobs[i].embed = be.pooling;
        }
        Result<std::vector<std::shared_ptr<RequestStream>>> submitted = be.scheduler->submit_all(jobs);
        const auto overloaded = [&] {
            return !submitted.ok() && submitted.status().kind() == ErrorKind::overloaded;
        };
        if (overloaded() && !waves.empty()) return Sent::later;
        // Once the request is under way, a queue that others filled is waited out.
        const auto give_up = Clock::now() + std::chrono::seconds(30);
        while (next > 0 && overloaded() && Clock::now() < give_up && !stopping.load() &&
               !(req.client_gone && req.client_gone())) {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
            submitted = be.scheduler->submit_all(jobs);
        }
        if (!submitted.ok()) {
            const int code = http_status_for(submitted.status());
            if (code == 503) res.set_header("Retry-After", "1");
            err(res, code, submitted.status().message());
            return Sent::failed;
        }
        waves.push_back({std::move(slot), std::make_unique<StreamSet>(std::move(submitted).value())});
        next += n;
        return Sent::yes;
    };
    while (next < prompts.size() || !waves.empty()) {
        while (next < prompts.size() && waves.size() < 2) {
            const Sent sent = send();
            if (sent == Sent::failed) {
                cancel_all();
                return std::nullopt;
            }
            if (sent == Sent::later) break;
        }
        std::optional<std::vector<Answer>> answers = collect(req, res, *waves.front().streams, err);
        if (!answers) {
            cancel_all();
            return std::nullopt;
        }
        for (Answer &a : *answers) out.push_back(std::move(a.done));
        waves.pop_front();
    }
    return out;
}

void HttpServer::Impl::setup_embeddings() {
    // The backend and the request's JSON object; false with `res` answered (by `err`) when either is missing.
    const auto start = [this](const HttpRequest &req, HttpResponse &res, ErrorReply err, ServerBackend &be,
                              json &body) {
        if (!ready_backend(res, err, be)) return false;
        auto parsed = body_object(req.body);
        if (!parsed.ok()) {
            err(res, 400, parsed.status().message());
            return false;
        }
        body = std::move(parsed).value();
        return true;
    };
    // OpenAI: {"input", "model", "encoding_format": "float" | "base64", "dimensions"}; unit vectors.
    routes["/v1/embeddings"] = {
        "POST", [this, start](const HttpRequest &req, HttpResponse &res) {
            ServerBackend be;
            json body;
            if (!start(req, res, reply_error, be, body)) return;
            const std::string model = string_field(body, "model");
            if (!model.empty() && model != params.model_id)
                return reply_error(
                    res, 404,
                    fmt::format("model '{}' not found; this server serves '{}'", model, params.model_id));
            if (be.pooling == Pooling::none)
                return reply_error(res, 400,
                                   "the server pools no embeddings (--pooling none): one vector per token is "
                                   "not OpenAI's shape; use /embedding");
            if (!body.contains("input")) return reply_error(res, 400, "'input' is required");
            const std::string format = body.contains("encoding_format") && !body["encoding_format"].is_null()
                                           ? string_field(body, "encoding_format")
                                           : "float";
            if (format != "float" && format != "base64")
                return reply_error(res, 400, "'encoding_format' must be \"float\" or \"base64\"");
            const int32_t n_embd = be.card != nullptr ? be.card->n_embd : 0;
            auto dims = int_field(body, "dimensions", n_embd);
            if (!dims.ok()) return reply_error(res, 400, dims.status().message());
            if (*dims != n_embd)
                return reply_error(
                    res, 400,
                    fmt::format(
                        "'dimensions' {}: this model's embeddings have {} dimensions and cannot be shortened",
                        *dims, n_embd));
            auto prompts = embedding_inputs(body["input"], *be.tokenizer, "input");
            if (!prompts.ok()) return reply_error(res, 400, prompts.status().message());
            auto done = embed(req, res, std::move(prompts).value(), be, reply_error);
            if (!done) return;
            json data = json::array();
            int64_t n_tokens = 0;
            for (size_t i = 0; i < done->size(); ++i) {
                std::vector<float> &v = (*done)[i].embedding;
                normalize_embedding(v, 2);
                json e = {{"object", "embedding"}, {"index", i}};
                e["embedding"] = format == "base64" ? json(base64_floats(v)) : json(v);
                data.push_back(std::move(e));
                n_tokens += (*done)[i].n_prompt;
            }
            reply_json(res, 200,
                       {{"object", "list"},
                        {"data", std::move(data)},
                        {"model", model.empty() ? params.model_id : model},
                        {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}});
        }};

    // llama-server: {"content" (or "input"), "embd_normalize"} -> [{"index", "embedding": [[...]]}]; with
    // --pooling none each token's vector, not normalized.
    const auto llama = [this, start](const HttpRequest &req, HttpResponse &res) {
        ServerBackend be;
        json body;
        if (!start(req, res, reply_error, be, body)) return;
        const char *field = body.contains("input") ? "input" : "content";
        if (!body.contains(field)) return reply_error(res, 400, "\"input\" or \"content\" must be provided");
        auto norm = int_field(body, "embd_normalize", 2);
        if (!norm.ok()) return reply_error(res, 400, norm.status().message());
        auto prompts = embedding_inputs(body[field], *be.tokenizer, field);
        if (!prompts.ok()) return reply_error(res, 400, prompts.status().message());
        auto done = embed(req, res, std::move(prompts).value(), be, reply_error);
        if (!done) return;
        json out = json::array();
        for (size_t i = 0; i < done->size(); ++i) {
            std::vector<float> &v = (*done)[i].embedding;
            json vectors = json::array();
            if (be.pooling == Pooling::none) {
                const size_t n = static_cast<size_t>(std::max((*done)[i].n_prompt, 1));
                const size_t width = v.size() / n;
                for (size_t t = 0; t < n; ++t)
                    vectors.push_back(std::vector<float>(v.begin() + t * width, v.begin() + (t + 1) * width));
            } else {
                normalize_embedding(v, static_cast<int>(std::clamp<int64_t>(*norm, -1, 1 << 20)));
                vectors.push_back(std::move(v));
            }
            out.push_back({{"index", i}, {"embedding", std::move(vectors)}});
        }
        reply_json(res, 200, out);
    };
    routes["/embedding"] = {"POST", llama};
    routes["/embeddings"] = {"POST", llama};

    // Ollama: /api/embed {"model", "input", "truncate" (true), "dimensions"} -> {"embeddings": [[...]]}, unit
    // vectors; /api/embeddings {"model", "prompt"} -> {"embedding": [...]}, as the model gives it.
    const auto ollama = [this, start](const HttpRequest &req, HttpResponse &res, bool legacy) {
        const auto t0 = Clock::now();
        ServerBackend be;
        json body;
        if (!start(req, res, reply_ollama_error, be, body)) return;
        const std::string model = string_field(body, "model");
        if (!ollama_model_matches(model, params.model_id))
            return reply_ollama_error(res, 404, fmt::format("model '{}' not found", model));
        if (be.pooling == Pooling::none)
            return reply_ollama_error(res, 400, "the server pools no embeddings (--pooling none)");
        const char *field = legacy ? "prompt" : "input";
        const json input = body.contains(field) ? body[field] : json();
        // Nothing to embed (Ollama's "load the model"): an empty answer.
        if (input.is_null() || (input.is_string() && input.get<std::string>().empty()) ||
            (input.is_array() && input.empty())) {
            if (legacy) return reply_json(res, 200, {{"embedding", json::array()}});
            return reply_json(res, 200, {{"model", model}, {"embeddings", json::array()}});
        }
        if (legacy && !input.is_string()) return reply_ollama_error(res, 400, "'prompt' must be a string");
        if (!legacy && !input.is_string() &&
            !(input.is_array() &&
              std::all_of(input.begin(), input.end(), [](const json &x) { return x.is_string(); })))
            return reply_ollama_error(res, 400, "'input' must be a string or a list of strings");
        auto prompts = embedding_inputs(input, *be.tokenizer, field);
        if (!prompts.ok()) return reply_ollama_error(res, 400, prompts.status().message());
        const bool truncate =
            !body.contains("truncate") || !body["truncate"].is_boolean() || body["truncate"].get<bool>();
        const size_t n_ctx = static_cast<size_t>(be.scheduler->n_ctx());
        for (std::vector<int32_t> &p : *prompts) {
            if (p.size() <= n_ctx) continue;
            if (!truncate)
                return reply_ollama_error(
                    res, 400,
                    fmt::format("the input length ({} tokens) exceeds the context length ({})", p.size(),
                                n_ctx));
            p.resize(n_ctx);
        }
        const int32_t n_embd = be.card != nullptr ? be.card->n_embd : 0;
        auto dims = int_field(body, "dimensions", 0);
        if (!dims.ok()) return reply_ollama_error(res, 400, dims.status().message());
        if (*dims < 0 || *dims > n_embd)
            return reply_ollama_error(res, 400, fmt::format("'dimensions' must be in [1, {}]", n_embd));
        auto done = embed(req, res, std::move(prompts).value(), be, reply_ollama_error);
        if (!done) return;
        if (legacy) return reply_json(res, 200, {{"embedding", std::move(done->front().embedding)}});
        json vectors = json::array();
        int64_t n_tokens = 0;
        for (StreamEvent &ev : *done) {
            normalize_embedding(ev.embedding, 2);
            if (*dims > 0) {  // Ollama's shortening: the first `dimensions` values, made a unit vector again
                ev.embedding.resize(static_cast<size_t>(*dims));
                normalize_embedding(ev.embedding, 2);
            }
            vectors.push_back(std::move(ev.embedding));
            n_tokens += ev.n_prompt;
        }
        reply_json(res, 200,
                   {{"model", model},
                    {"embeddings", std::move(vectors)},
                    {"total_duration",
                     std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()},
                    {"load_duration", 0},
                    {"prompt_eval_count", n_tokens}});
    };
    routes["/api/embed"] = {"POST",
                            [ollama](const HttpRequest &req, HttpResponse &res) { ollama(req, res, false); }};
    routes["/api/embeddings"] = {
        "POST", [ollama](const HttpRequest &req, HttpResponse &res) { ollama(req, res, true); }};
}

}  // namespace td::server
