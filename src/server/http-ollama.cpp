// Ollama's API (server/ollama.h) over the same scheduler, limits and API key as OpenAI's.
#include <fmt/format.h>

#include <optional>

#include "server/http-impl.h"
#include "server/ollama.h"

namespace td::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

void reply_ollama_error(HttpResponse &res, int status, std::string_view message) {
    reply_json(res, status, ollama_error(message));
}

namespace {

// Ollama's tool calls carry no ids.
std::string no_id() {
    return "";
}

int64_t ns_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count();
}

// The stats of Ollama's last line: the prompt's time runs to the first token, the rest is evaluation.
OllamaStats stats_of(const StreamEvent &done, Clock::time_point t0, Clock::time_point t_first) {
    const auto t_end = Clock::now();
    if (t_first == Clock::time_point{}) t_first = t_end;
    OllamaStats s;
    s.n_prompt = done.n_prompt;
    s.n_generated = done.n_generated;
    s.total_ns = ns_between(t0, t_end);
    s.prompt_ns = ns_between(t0, t_first);
    s.eval_ns = ns_between(t_first, t_end);
    return s;
}

// NDJSON: one object a line; the last one done: true with the stats, or {"error"} when the request failed.
class NdjsonFormat : public StreamFormat {
public:
    NdjsonFormat(ApiKind kind, std::string model, Clock::time_point t0)
        : kind_(kind), model_(std::move(model)), t0_(t0) {}
    // Tool calls (chat with tools): text that is or may become a call is held back and sent, parsed, in a
    // message.tool_calls line before the last one (as Ollama does); the rest streams as content.
    void enable_tool_calls(bool parallel) {
        tools_.emplace();
        parallel_ = parallel;
    }
    std::string delta(size_t, const StreamEvent &ev) override {
        if (ev.text.empty()) return "";
        if (t_first_ == Clock::time_point{}) t_first_ = Clock::now();
        if (!tools_) return line(ollama_chunk(kind_, model_, ev.text));
        const std::string show = tools_->push(ev.text);
        return show.empty() ? "" : line(ollama_chunk(kind_, model_, show));
    }
    std::string done(size_t, const StreamEvent &ev) override {
        std::string out;
        if (tools_) {
            ToolCallParse p = tools_->finish();
            if (!p.calls.empty() || !p.content.empty()) {
                json j = ollama_chunk(kind_, model_, p.content);
                if (!p.calls.empty())
                    j["message"]["tool_calls"] =
                        ollama_tool_calls(finish_tool_calls(std::move(p.calls), parallel_, no_id));
                out += line(j);
            }
        }
        return out + line(ollama_final(kind_, model_, "", ev.finish, stats_of(ev, t0_, t_first_)));
    }
    std::string error(const Status &status) override { return line(ollama_error(status.message())); }

private:
    static std::string line(const json &j) { return json_dump(j) + "\n"; }
    ApiKind kind_;
    std::string model_;
    Clock::time_point t0_, t_first_{};
    std::optional<ToolCallStream> tools_;  // set when the request offers tools
    bool parallel_ = true;
};

}  // namespace

void HttpServer::Impl::setup_ollama() {
    const auto generate = [this](const HttpRequest &req, HttpResponse &res, bool chat) {
        const auto t0 = Clock::now();
        ServerBackend be;
        if (!get_backend(be) || be.card == nullptr) {
            res.set_header("Retry-After", "5");
            return reply_ollama_error(res, 503, "the model is still loading");
        }
        auto parsed =
            chat ? parse_ollama_chat(req.body) : parse_ollama_generate(req.body, be.card->has_template);
        if (!parsed.ok())
            return reply_ollama_error(res, http_status_for(parsed.status()), parsed.status().message());
        ApiRequest &r = *parsed;
        if (!ollama_model_matches(r.model, params.model_id))
            return reply_ollama_error(res, 404, fmt::format("model '{}' not found", r.model));
        const std::string model = r.model.empty() ? params.model_id : r.model;
        const ApiKind kind = chat ? ApiKind::chat : ApiKind::completion;   // the shape of the answer
        if (!chat && r.kind == ApiKind::completion && r.prompts.empty()) {  // "load the model": it is loaded
            json j = ollama_chunk(kind, model, "");
            j["done"] = true;
            j["done_reason"] = "load";
            return reply_json(res, 200, j);
        }
        if (r.infill && !be.card->fill_in_middle)  // Ollama's answer for a model without the capability
            return reply_ollama_error(res, 400, fmt::format("\"{}\" does not support insert", model));
        std::shared_ptr<ClientSlot> slot;
        std::shared_ptr<StreamSet> stream = start_generation(req, res, r, be, reply_ollama_error, slot);
        if (!stream) return;
        if (!r.stream) {
            std::optional<std::vector<Answer>> answers = collect(req, res, *stream, reply_ollama_error);
            if (!answers) return;
            Answer *a = &answers->front();  // Ollama's requests have one choice
            std::vector<ToolCall> calls;
            if (r.uses_tools()) {
                ToolCallParse p = parse_tool_calls(a->text);
                if (!p.calls.empty()) {
                    calls = finish_tool_calls(std::move(p.calls), r.parallel_tool_calls, no_id);
                    a->text = std::move(p.content);
                }
            }
            json j = ollama_final(kind, model, a->text, a->done.finish, stats_of(a->done, t0, a->t_first));
            if (!calls.empty()) j["message"]["tool_calls"] = ollama_tool_calls(calls);
            return reply_json(res, 200, j);
        }
        auto format = std::make_unique<NdjsonFormat>(kind, model, t0);
        if (r.uses_tools()) format->enable_tool_calls(r.parallel_tool_calls);
        stream_response(res, std::move(stream), std::move(format), "application/x-ndjson", std::move(slot));
    };
    routes["/api/chat"] = {
        "POST", [generate](const HttpRequest &req, HttpResponse &res) { generate(req, res, true); }};
    routes["/api/generate"] = {
        "POST", [generate](const HttpRequest &req, HttpResponse &res) { generate(req, res, false); }};

    // The model list and card: the one model this server was started with.
    const auto with_card = [this](HttpResponse &res, auto &&fn) {
        ServerBackend be;
        if (!get_backend(be) || be.card == nullptr) {
            res.set_header("Retry-After", "5");
            return reply_ollama_error(res, 503, "the model is still loading");
        }
        fn(*be.card);
    };
    routes["/api/tags"] = {"GET", [this, with_card](const HttpRequest &, HttpResponse &res) {
                               with_card(res, [&](const ModelCard &c) {
                                   reply_json(res, 200, ollama_tags(c, params.model_id));
                               });
                           }};
    routes["/api/ps"] = {
        "GET", [this, with_card](const HttpRequest &, HttpResponse &res) {
            with_card(res, [&](const ModelCard &c) { reply_json(res, 200, ollama_ps(c, params.model_id)); });
        }};
    routes["/api/show"] = {
        "POST", [this, with_card](const HttpRequest &req, HttpResponse &res) {
            auto name = parse_ollama_show(req.body);
            if (!name.ok()) return reply_ollama_error(res, 400, name.status().message());
            if (!ollama_model_matches(*name, params.model_id) || name->empty())
                return reply_ollama_error(res, 404, fmt::format("model '{}' not found", *name));
            with_card(res, [&](const ModelCard &c) { reply_json(res, 200, ollama_show(c)); });
        }};
    routes["/api/version"] = {
        "GET", [](const HttpRequest &, HttpResponse &res) { reply_json(res, 200, ollama_version()); }};
}

}  // namespace td::server
