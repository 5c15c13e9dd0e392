#include "server/http.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "core/build-id.h"
#include "core/log.h"
#include "net/auth.h"
#include "server/dry-breakers.h"
#include "server/http-impl.h"
#include "server/http-tls.h"
#include "server/llamacpp.h"
#include "server/openai.h"
#include "server/web-assets.h"
#include "text/detokenizer.h"

namespace td::server {

using nlohmann::json;

void reply_error(HttpResponse &res, int status, std::string_view message) {
    reply_json(res, status, error_json(status, message));
}

namespace {

constexpr auto stream_poll = std::chrono::milliseconds(200);  // how often a quiet stream checks its client

void reply_status(HttpResponse &res, const Status &status) {
    const int code = http_status_for(status);
    if (code == 503) res.set_header("Retry-After", "1");
    reply_error(res, code, status.message());
}

// Usage as OpenAI counts it for a batch of prompts with n choices each: every prompt once (its first
// choice's count), every choice's tokens.
void add_usage(Usage &usage, size_t choice, size_t n_per_prompt, const StreamEvent &done) {
    if (choice % n_per_prompt == 0) {
        usage.n_prompt += done.n_prompt;
        usage.n_cached += done.n_cached;
    }
    usage.n_generated += done.n_generated;
}

// OpenAI's streams: Server-Sent Events, each chunk naming its choice, a chat's choices each opening with the
// assistant's role, [DONE] at the end.
class SseFormat : public StreamFormat {
public:
    // n_choices in all, n_per_prompt of them for each prompt (OpenAI's n).
    SseFormat(ResponseMeta meta, size_t n_choices, size_t n_per_prompt, bool include_usage,
              int32_t n_logprobs)
        : meta_(std::move(meta)),
          choices_(n_choices),
          n_per_prompt_(n_per_prompt),
          include_usage_(include_usage),
          n_logprobs_(n_logprobs) {}
    std::string open() override {
        std::string out;
        for (size_t i = 0; i < choices_.size(); ++i) {
            if (meta_.kind == ApiKind::chat)
                out += sse_event(chunk_json(meta_, index(i), "", /*role_first=*/true, nullptr, -1, {}));
            else if (!choices_[i].echo.empty() && !echo_logprobs_)
                out += sse_event(
                    chunk_json(meta_, index(i), std::exchange(choices_[i].echo, {}), false, nullptr, -1, {}));
        }
        return out;
    }
    // Completions' echo: choice `choice` starts with this text (its prompt). With logprobs, the text goes
    // with the prompt's log-probabilities, in the chunk that brings them.
    void set_echo(size_t choice, std::string text, bool with_logprobs) {
        choices_[choice].echo = std::move(text);
        echo_logprobs_ = with_logprobs;
    }
    // Tool calls: text that is or may become a call is held back (ToolCallStream) and, when the reply ends,
    // sent as delta.tool_calls chunks; the rest streams as content.
    void enable_tool_calls(bool parallel, std::function<std::string()> new_id) {
        for (Choice &c : choices_) c.tools.emplace();
        parallel_ = parallel;
        new_id_ = std::move(new_id);
    }
    std::string delta(size_t choice, const StreamEvent &ev) override {
        if (!ev.prompt_logprobs.empty()) {  // an echoed prompt's tokens (its text with the first of them)
            std::string text = std::exchange(choices_[choice].echo, std::string());
            if (text.empty() && n_logprobs_ < 0) return "";
            return sse_event(
                chunk_json(meta_, index(choice), text, false, nullptr, n_logprobs_, ev.prompt_logprobs));
        }
        auto &tools = choices_[choice].tools;
        if (!tools)
            return sse_event(
                chunk_json(meta_, index(choice), ev.text, false, nullptr, n_logprobs_, ev.logprobs));
        const std::string show = tools->push(ev.text);
        if (show.empty() && (n_logprobs_ < 0 || ev.logprobs.empty())) return "";
        return sse_event(chunk_json(meta_, index(choice), show, false, nullptr, n_logprobs_, ev.logprobs));
    }
    std::string done(size_t choice, const StreamEvent &ev) override {
        const char *finish = ev.finish == FinishReason::length ? "length" : "stop";
        std::string tail;
        if (auto &tools = choices_[choice].tools) {
            ToolCallParse p = tools->finish();
            if (!p.content.empty())
                tail += sse_event(chunk_json(meta_, index(choice), p.content, false, nullptr, -1, {}));
            if (!p.calls.empty()) {
                tail += sse_event(tool_calls_chunk_json(
                    meta_, index(choice), finish_tool_calls(std::move(p.calls), parallel_, new_id_)));
                finish = "tool_calls";
            }
        }
        add_usage(usage_, choice, n_per_prompt_, ev);
        return tail + sse_event(chunk_json(meta_, index(choice), "", false, finish, -1, {}));
    }
    std::string finish() override {
        return (include_usage_ ? sse_event(usage_chunk_json(meta_, usage_)) : std::string()) + sse_done();
    }
    std::string error(const Status &status) override {
        return sse_event(error_json(500, status.message())) + sse_done();
    }

private:
    struct Choice {
        std::optional<ToolCallStream> tools;  // set when the request offers tools
        std::string echo;                     // completions' echo: the prompt, sent first
    };
    static int32_t index(size_t choice) { return static_cast<int32_t>(choice); }
    ResponseMeta meta_;
    std::vector<Choice> choices_;
    size_t n_per_prompt_ = 1;
    bool include_usage_ = false;
    int32_t n_logprobs_ = -1;
    bool echo_logprobs_ = false;
    Usage usage_;
    bool parallel_ = true;
    std::function<std::string()> new_id_;
};

// One streamed response: owns the request's streams and cancels them if the response ends early for any
// reason (write failure, timeout, shutdown): the destructor runs when the response is dropped.
struct StreamState {
    std::shared_ptr<StreamSet> streams;
    std::unique_ptr<StreamFormat> format;
    std::shared_ptr<void> slot;  // the client's place (ClientSlot), held until the stream ends
    bool started = false;
    bool finished = false;
    const std::atomic<bool> *stopping = nullptr;

    ~StreamState() {
        if (!finished) streams->cancel();
    }
};

bool sink_write(HttpStream &sink, const std::string &s) {
    return s.empty() || sink.write(s);
}

// Writes the whole stream; returns false (and cancels the request) when the client is gone.
bool pump_stream(StreamState &st, HttpStream &sink) {
    const auto give_up = [&] {
        st.streams->cancel();
        return false;
    };
    if (!st.started) {
        st.started = true;
        if (!sink_write(sink, st.format->open())) return give_up();
    }
    StreamEvent ev;
    size_t choice = 0;
    for (;;) {
        if (st.stopping->load()) return give_up();
        if (!st.streams->next(choice, ev, stream_poll)) {
            if (!sink.writable()) return give_up();
            continue;
        }
        if (ev.kind == StreamEvent::Kind::error) {
            st.finished = true;
            st.streams->cancel();  // the other choices, if any
            sink_write(sink, st.format->error(ev.error));
            return true;
        }
        if ((!ev.text.empty() || !ev.logprobs.empty() || !ev.prompt_logprobs.empty()) &&
            !sink_write(sink, st.format->delta(choice, ev)))
            return give_up();
        if (ev.kind == StreamEvent::Kind::done) {
            if (!sink_write(sink, st.format->done(choice, ev))) return give_up();
            if (st.streams->ended()) {
                st.finished = true;
                return sink_write(sink, st.format->finish());
            }
        }
    }
}

}  // namespace

void reply_json(HttpResponse &res, int status, const json &body) {
    res.status = status;
    res.content_type = "application/json";
    res.body = json_dump(body);
}

// ---- shared by the APIs -----------------------------------------------------------------------------

HttpServer::Impl::ClientSlot::~ClientSlot() {
    if (impl == nullptr) return;
    std::lock_guard lock(impl->mu);
    if ((impl->per_client[peer] -= n) <= 0) impl->per_client.erase(peer);
}

std::shared_ptr<HttpServer::Impl::ClientSlot> HttpServer::Impl::client_slot(const std::string &peer, int n,
                                                                            int &open) {
    if (params.max_per_client <= 0) return std::make_shared<ClientSlot>();
    std::lock_guard lock(mu);
    open = per_client.contains(peer) ? per_client[peer] : 0;
    if (open + n > params.max_per_client) return nullptr;
    per_client[peer] = open + n;
    auto slot = std::make_shared<ClientSlot>();
    slot->impl = this;
    slot->peer = peer;
    slot->n = n;
    return slot;
}

bool HttpServer::Impl::ready_backend(HttpResponse &res, ErrorReply err, ServerBackend &out) {
    if (get_backend(out)) return true;
    res.set_header("Retry-After", "5");
    err(res, 503, "the model is still loading");
    return false;
}

bool HttpServer::Impl::get_backend(ServerBackend &out) {
    std::lock_guard lock(mu);
    if (!has_backend) return false;
    out = backend;
    return true;
}

void HttpServer::Impl::count(const std::string &path, int status) {
    std::lock_guard lock(mu);
    request_counts[{path, status}]++;
}

Result<std::vector<int32_t>> HttpServer::Impl::chat_prompt(const ApiRequest &r, const ServerBackend &be) {
    // BOS once at the start, the template's text with its markers parsed as control tokens
    // (chat-template.h's BOS contract).
    TD_ASSIGN_OR_RETURN(std::string text,
                        be.chat->apply(r.messages, r.uses_tools() ? r.tools : nlohmann::json(),
                                       /*add_generation_prompt=*/true));
    const Tokenizer &tok = *be.tokenizer;
    std::vector<int32_t> prompt;
    if (tok.vocab().add_bos() && tok.vocab().bos() >= 0) prompt.push_back(tok.vocab().bos());
    std::vector<int32_t> ids = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
    return prompt;
}

std::shared_ptr<StreamSet> HttpServer::Impl::start_generation(const HttpRequest &req, HttpResponse &res,
                                                              ApiRequest &r, const ServerBackend &be,
                                                              ErrorReply err,
                                                              std::shared_ptr<ClientSlot> &slot) {
    // Every choice is a sequence: with --max-per-client it takes one of the client's places.
    const int n_seqs = std::max(r.n_choices, 1) *
                       (r.kind == ApiKind::chat ? 1 : std::max(static_cast<int>(r.prompts.size()), 1));
    if (params.max_per_client > 0 && n_seqs > params.max_per_client) {
        err(res, 400,
            fmt::format(
                "this request needs {} sequences (one per choice) and a client may have {} open at once "
                "(--max-per-client)",
                n_seqs, params.max_per_client));
        return nullptr;
    }
    int open = 0;
    slot = client_slot(req.peer, n_seqs, open);
    if (!slot) {
        res.set_header("Retry-After", "1");
        err(res, 429,
            fmt::format("client {} already has {} of its {} sequences open (the limit per client, "
                        "--max-per-client) and this request needs {}; retry when one has finished",
                        req.peer, open, params.max_per_client, n_seqs));
        return nullptr;
    }
    const Tokenizer &tok = *be.tokenizer;
    GenerationJob job;
    std::vector<std::vector<int32_t>> prompts;  // the batch of a completion request; chat: one
    if (r.kind == ApiKind::chat) {
        auto prompt = chat_prompt(r, be);
        if (!prompt.ok()) {
            err(res, 400, prompt.status().message());
            return nullptr;
        }
        job.stop = be.chat->stop_strings();
        prompts.push_back(std::move(prompt).value());
    } else if (r.infill) {
        // The prompt continues the prefix: its special tokens parsed, nothing added (llama-server's).
        if (Status s = infill_supported(tok.vocab()); !s.ok()) {
            err(res, http_status_for(s), s.message());
            return nullptr;
        }
        const ApiRequest::Prompt &p = r.prompts.at(0);
        const std::vector<int32_t> own =
            p.is_tokens ? p.tokens : tok.encode(p.text, /*add_special=*/false, /*parse_special=*/true);
        InfillLimits limits;
        limits.n_batch = params.infill_batch;
        limits.n_predict = r.max_tokens;
        limits.n_ctx = be.scheduler->n_ctx();
        limits.spm = params.spm_infill;
        prompts.push_back(infill_prompt(tok, *r.infill, own, limits));
    } else {
        for (ApiRequest::Prompt &p : r.prompts)
            prompts.push_back(p.is_tokens ? std::move(p.tokens)
                                          : tok.encode(p.text, /*add_special=*/true, /*parse_special=*/true));
    }
    if (prompts.empty()) {
        err(res, 400, "'prompt' is required");
        return nullptr;
    }
    job.sampling = r.sampling;
    if (job.sampling.dry_multiplier > 0.0f && job.sampling.dry_penalty_last_n != 0) {
        auto breakers = dry_breakers_for(
            tok, r.dry_sequence_breakers ? *r.dry_sequence_breakers : dry_default_breakers());
        if (!breakers.ok()) {
            err(res, 400, breakers.status().message());
            return nullptr;
        }
        job.sampling.dry_breakers = std::move(*breakers);
    }
    // As llama.cpp does it: a bias of -inf on every end-of-generation token (one the model has no output row
    // for, in a tokenizer longer than the model, can never be drawn anyway).
    if (r.ignore_eos)
        for (int32_t id : tok.vocab().eog_ids())
            if (id < be.scheduler->n_vocab())
                job.sampling.logit_bias.push_back({id, -std::numeric_limits<float>::infinity()});
    job.max_tokens = r.max_tokens;
    job.n_logprobs = r.n_logprobs;
    job.n_prompt_logprobs = r.n_prompt_logprobs;
    job.stop.insert(job.stop.end(), r.stop.begin(), r.stop.end());
    job.cache_prompt = r.cache_prompt;
    job.n_draft = r.n_draft;
    job.schema = r.schema;
    job.grammar = r.grammar;

    // n choices per prompt, each its own sequence: prompt p's choice j is job p * n + j. A fixed seed gives
    // choice j the seed + j (as vLLM does), so the choices differ and each is what a request for that prompt
    // with that seed alone would get.
    const size_t n = static_cast<size_t>(std::max(r.n_choices, 1));
    std::vector<GenerationJob> jobs;
    for (std::vector<int32_t> &prompt : prompts) {
        job.prompt = std::move(prompt);
        for (size_t j = 0; j < n; ++j) {
            jobs.push_back(job);
            if (job.sampling.seed != SamplerParams::seed_random) jobs.back().sampling.seed += j;
        }
    }
    auto submitted = be.scheduler->submit_all(std::move(jobs));
    if (!submitted.ok()) {
        const int code = http_status_for(submitted.status());
        if (code == 503) res.set_header("Retry-After", "1");
        err(res, code, submitted.status().message());
        return nullptr;
    }
    return std::make_shared<StreamSet>(std::move(submitted).value());
}

std::optional<std::vector<Answer>> HttpServer::Impl::collect(const HttpRequest &req, HttpResponse &res,
                                                             StreamSet &streams, ErrorReply err) {
    std::vector<Answer> answers(streams.size());
    StreamEvent ev;
    size_t i = 0;
    auto next_check = std::chrono::steady_clock::now();
    while (!streams.ended()) {
        if (stopping.load()) {
            streams.cancel();
            err(res, 503, "the server is shutting down");
            return std::nullopt;
        }
        const bool got = streams.next(i, ev, stream_poll);
        if (const auto now = std::chrono::steady_clock::now(); now >= next_check) {
            next_check = now + stream_poll / 4;
            if (req.client_gone && req.client_gone()) {
                streams.cancel();
                err(res, 499, "the client closed the connection");
                return std::nullopt;
            }
        }
        if (!got) continue;
        Answer &a = answers[i];
        if (!ev.text.empty() && a.text.empty()) a.t_first = std::chrono::steady_clock::now();
        a.text += ev.text;
        // A scored prompt's tokens come first (completions' echo), then the generated ones.
        for (TokenLogprob &lp : ev.prompt_logprobs) a.logprobs.push_back(std::move(lp));
        for (TokenLogprob &lp : ev.logprobs) a.logprobs.push_back(std::move(lp));
        if (ev.kind == StreamEvent::Kind::error) {
            streams.cancel();  // the other choices, if any
            err(res, 500, ev.error.message());
            return std::nullopt;
        }
        if (ev.kind == StreamEvent::Kind::done) a.done = std::move(ev);
    }
    return answers;
}

void HttpServer::Impl::stream_response(HttpResponse &res, std::shared_ptr<StreamSet> streams,
                                       std::unique_ptr<StreamFormat> format, const char *content_type,
                                       std::shared_ptr<ClientSlot> slot) {
    auto st = std::make_shared<StreamState>();
    st->streams = std::move(streams);
    st->format = std::move(format);
    st->slot = std::move(slot);
    st->stopping = &stopping;
    res.status = 200;
    res.set_header("Cache-Control", "no-cache");
    res.content_type = content_type;
    res.stream = [st](HttpStream &sink) { pump_stream(*st, sink); };
}

// ---- OpenAI's generation endpoints -------------------------------------------------------------------

void HttpServer::Impl::handle_generate(const HttpRequest &req, HttpResponse &res, ApiKind kind) {
    ServerBackend be;
    if (!ready_backend(res, reply_error, be)) return;
    auto parsed = kind == ApiKind::chat ? parse_chat_request(req.body) : parse_openai_completion(req.body);
    if (!parsed.ok()) return reply_status(res, parsed.status());
    ApiRequest &r = *parsed;
    if (!r.model.empty() && r.model != params.model_id)
        return reply_error(
            res, 404, fmt::format("model '{}' not found; this server serves '{}'", r.model, params.model_id));

    // echo: each prompt as it was given (token ids as their text), before start_generation takes them.
    std::vector<std::string> echo;
    if (r.echo) {
        for (const ApiRequest::Prompt &p : r.prompts)
            echo.push_back(r.infill      ? r.infill->prefix
                           : p.is_tokens ? detokenize(*be.tokenizer, p.tokens, Detokenizer::Start::text,
                                                      /*render_special=*/true)
                                         : p.text);
    }
    std::shared_ptr<ClientSlot> slot;
    std::shared_ptr<StreamSet> streams = start_generation(req, res, r, be, reply_error, slot);
    if (!streams) return;
    ResponseMeta meta = make_response_meta(kind, params.model_id);
    const auto echo_of = [&](size_t choice) {
        return echo.empty() ? std::string() : echo[choice / static_cast<size_t>(std::max(r.n_choices, 1))];
    };
    if (!r.stream) {
        // A client that goes away before the answer is ready cancels its request, which frees its slot.
        std::optional<std::vector<Answer>> answers = collect(req, res, *streams, reply_error);
        if (!answers) return;
        std::vector<ChoiceResult> choices;
        Usage usage;
        for (size_t i = 0; i < answers->size(); ++i) {
            Answer &a = (*answers)[i];
            add_usage(usage, i, static_cast<size_t>(r.n_choices), a.done);
            ChoiceResult &c = choices.emplace_back();
            c.finish = a.done.finish;
            c.logprobs = std::move(a.logprobs);
            if (r.uses_tools()) {
                ToolCallParse p = parse_tool_calls(a.text);
                if (!p.calls.empty()) {
                    c.tool_calls = finish_tool_calls(std::move(p.calls), r.parallel_tool_calls,
                                                     [&] { return be.chat->new_tool_call_id(); });
                    a.text = std::move(p.content);
                }
            }
            c.text = echo_of(i) + a.text;
        }
        return reply_json(res, 200, completion_json(meta, choices, usage, r.n_logprobs));
    }
    auto format = std::make_unique<SseFormat>(
        std::move(meta), streams->size(), static_cast<size_t>(r.n_choices), r.include_usage, r.n_logprobs);
    if (!echo.empty())
        for (size_t i = 0; i < streams->size(); ++i) format->set_echo(i, echo_of(i), r.n_logprobs >= 0);
    if (r.uses_tools()) {
        const ChatFormatter *chat = be.chat;
        format->enable_tool_calls(r.parallel_tool_calls, [chat] { return chat->new_tool_call_id(); });
    }
    stream_response(res, std::move(streams), std::move(format), "text/event-stream", std::move(slot));
}

// ---- the other endpoints ----------------------------------------------------------------------------

void HttpServer::Impl::handle_health(HttpResponse &res) {
    ServerBackend be;
    if (!get_backend(be)) return reply_json(res, 503, {{"status", "loading"}});
    // A failed engine (a worker down) answers 503 with the cause until it works again.
    json body = {{"status", "ok"}};
    const EngineInfo info = be.scheduler->engine_info();
    if (!info.layout.empty()) body["layout"] = info.layout;
    if (!info.recoveries.empty()) body["recoveries"] = info.recoveries;
    if (Status h = be.scheduler->health(); !h.ok()) {
        res.set_header("Retry-After", "1");
        body["status"] = "error";
        body["message"] = h.message();
        return reply_json(res, 503, body);
    }
    reply_json(res, 200, body);
}

json HttpServer::Impl::model_json() {
    ServerBackend be;
    json model = {{"id", params.model_id}, {"object", "model"}, {"created", 0}, {"owned_by", "tandem"}};
    if (get_backend(be)) {
        model["meta"] = {{"n_ctx_slot", be.scheduler->n_ctx()},
                         {"n_slots", be.scheduler->stats().n_slots},
                         {"n_vocab", be.tokenizer->vocab().n_tokens()},
                         {"chat_template", be.chat->name()}};
    }
    return model;
}

// llama-server's /props: what a client reads to learn the server's model, slots, template and defaults.
void HttpServer::Impl::handle_props(HttpResponse &res) {
    ServerBackend be;
    if (!ready_backend(res, reply_error, be)) return;
    const Vocab &vocab = be.tokenizer->vocab();
    const auto token = [&](int32_t id) { return id >= 0 && vocab.is_valid(id) ? vocab.token_text(id) : ""; };
    const SamplerParams sp;  // what a request that sets nothing samples with
    json props = {{"model_alias", params.model_id},
                  {"model_path", be.card != nullptr ? be.card->path : ""},
                  {"total_slots", be.scheduler->stats().n_slots},
                  {"chat_template", be.card != nullptr ? be.card->chat_template : ""},
                  {"bos_token", token(vocab.bos())},
                  {"eos_token", token(vocab.eos())},
                  {"build_info", fmt::format("tandem {} ({})", TD_VERSION, build_git_id())},
                  {"modalities", {{"vision", false}, {"audio", false}}},
                  {"default_generation_settings",
                   {{"n_ctx", be.scheduler->n_ctx()}, {"params", llama_sampling_json(sp, -1)}}}};
    reply_json(res, 200, props);
}

void HttpServer::Impl::handle_models(HttpResponse &res) {
    reply_json(res, 200, {{"object", "list"}, {"data", json::array({model_json()})}});
}

void HttpServer::Impl::handle_model(const std::string &raw, HttpResponse &res) {
    const auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        c = static_cast<char>(c | 0x20);
        return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    };
    std::string id;  // percent-decoded ("llama3%3A8b" is "llama3:8b"); a malformed escape stays as it is
    for (size_t i = 0; i < raw.size(); ++i) {
        const int hi = raw[i] == '%' && i + 2 < raw.size() ? hex(raw[i + 1]) : -1;
        const int lo = hi >= 0 ? hex(raw[i + 2]) : -1;
        if (lo >= 0) {
            id += static_cast<char>(hi * 16 + lo);
            i += 2;
        } else {
            id += raw[i];
        }
    }
    if (id != params.model_id)
        return reply_error(res, 404,
                           fmt::format("model '{}' not found; this server serves '{}'", id, params.model_id));
    reply_json(res, 200, model_json());
}

void HttpServer::Impl::handle_metrics(HttpResponse &res) {
    std::string out;
    out += "# HELP tandem_requests_total HTTP requests answered, by path and status.\n";
    out += "# TYPE tandem_requests_total counter\n";
    {
        std::lock_guard lock(mu);
        for (const auto &[key, n] : request_counts)
            out += fmt::format("tandem_requests_total{{path=\"{}\",status=\"{}\"}} {}\n", key.first,
                               key.second, n);
    }
    ServerBackend be;
    if (get_backend(be)) {
        const SchedulerStats s = be.scheduler->stats();
        const auto metric = [&](const char *name, const char *type, const char *help, auto value) {
            out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
        };
        metric("tandem_prompt_tokens_total", "counter", "Prompt tokens computed.", s.n_prompt_tokens);
        metric("tandem_generated_tokens_total", "counter", "Tokens generated.", s.n_generated_tokens);
        metric("tandem_tokens_per_second", "gauge", "Generated tokens per second over the last 5 s.",
               s.tokens_per_second);
        metric("tandem_queue_depth", "gauge", "Requests waiting for a slot.", s.n_queued);
        metric("tandem_prompt_tokens_cached_total", "counter",
               "Prompt tokens found in the prefix cache (not computed).", s.n_prompt_cached);
        metric("tandem_prompt_tokens_copied_total", "counter",
               "Of the cached prompt tokens, those copied from a running request's slot.", s.n_prompt_copied);
        metric("tandem_prefix_cache_hit_ratio", "gauge",
               "Share of all prompt tokens found in the prefix cache.",
               s.n_prompt_cached + s.n_prompt_tokens > 0
                   ? static_cast<double>(s.n_prompt_cached) /
                         static_cast<double>(s.n_prompt_cached + s.n_prompt_tokens)
                   : 0.0);
        metric("tandem_kv_pool_positions", "gauge", "Positions in the KV pool (--ctx-size; 0: not bounded).",
               s.kv_pool);
        metric("tandem_kv_pool_used", "gauge", "Positions the requests hold in the KV pool.", s.kv_used);
        metric("tandem_preemptions_total", "counter",
               "Requests preempted (and replayed later) because the KV pool ran out.", s.n_preempted);
        metric("tandem_draft_tokens_total", "counter", "Tokens guessed by prompt lookup (--draft).",
               s.n_drafted);
        metric("tandem_draft_tokens_accepted_total", "counter", "Of the guessed tokens, those sampled.",
               s.n_draft_accepted);
        metric("tandem_resumed_requests_total", "counter",
               "Requests replayed on the cluster after a node was lost (--max-resumes).", s.n_resumed);
        metric("tandem_slots_active", "gauge", "Slots holding a request.", s.n_active);
        metric("tandem_slots_total", "gauge", "Sequence slots (--parallel).", s.n_slots);
        metric("tandem_steps_total", "counter", "Batched engine steps.", s.n_steps);
        metric("tandem_step_seconds_total", "counter", "Time from each step's submit to its tokens.",
               s.step_seconds);
        metric("tandem_micro_batches", "gauge", "Steps kept in flight (pipeline stages).",
               be.scheduler->n_micro_batches());
        metric("tandem_busy_seconds_total", "counter", "Time the engine thread had work.", s.busy_seconds);
        metric("tandem_scheduler_overhead_seconds_total", "counter",
               "Busy time outside the engine (building steps, detokenizing, dispatching).",
               s.overhead_seconds);
        metric("tandem_engine_healthy", "gauge", "1 while the engine works, 0 after a failure (see /health).",
               be.scheduler->health().ok() ? 1 : 0);
        out += "# HELP tandem_requests_finished_total Generation requests ended, by reason.\n";
        out += "# TYPE tandem_requests_finished_total counter\n";
        for (FinishReason f :
             {FinishReason::stop, FinishReason::length, FinishReason::cancelled, FinishReason::error})
            out += fmt::format("tandem_requests_finished_total{{reason=\"{}\"}} {}\n", finish_reason_name(f),
                               s.n_finished[static_cast<int>(f)]);
        out += "# HELP tandem_time_to_first_token_seconds From request to first token.\n";
        out += "# TYPE tandem_time_to_first_token_seconds summary\n";
        out += fmt::format("tandem_time_to_first_token_seconds_sum {}\n", s.ttft_seconds_sum);
        out += fmt::format("tandem_time_to_first_token_seconds_count {}\n", s.ttft_count);
        if (be.engine_metrics) out += be.engine_metrics();
    }
    res.status = 200;
    res.content_type = "text/plain; version=0.0.4";
    res.body = std::move(out);
}

void HttpServer::Impl::handle_status(HttpResponse &res) {
    json body = {{"model", params.model_id},
                 {"uptime_seconds",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count()}};
    int64_t http_errors = 0;
    {
        std::lock_guard lock(mu);
        for (const auto &[key, n] : request_counts)
            if (key.second >= 500 && key.first != "/health") http_errors += n;  // not "still loading"
    }
    ServerBackend be;
    if (!get_backend(be)) {
        body["status"] = "loading";
        return reply_json(res, 200, body);
    }
    const Status h = be.scheduler->health();
    body["status"] = h.ok() ? "ok" : "error";
    if (!h.ok()) body["message"] = h.message();
    const EngineInfo info = be.scheduler->engine_info();
    body["layout"] = info.layout;
    body["recoveries"] = info.recoveries;
    const SchedulerStats s = be.scheduler->stats();
    json finished = json::object();
    for (FinishReason f :
         {FinishReason::stop, FinishReason::length, FinishReason::cancelled, FinishReason::error})
        finished[finish_reason_name(f)] = s.n_finished[static_cast<int>(f)];
    body["server"] = {{"tokens_per_second", s.tokens_per_second},
                      {"queue_depth", s.n_queued},
                      {"slots_active", s.n_active},
                      {"slots_total", s.n_slots},
                      {"kv_pool", s.kv_pool},
                      {"kv_used", s.kv_used},
                      {"prompt_tokens", s.n_prompt_tokens},
                      {"prompt_tokens_cached", s.n_prompt_cached},
                      {"prompt_tokens_copied", s.n_prompt_copied},
                      {"generated_tokens", s.n_generated_tokens},
                      {"steps", s.n_steps},
                      {"requests_finished", finished},
                      {"requests_resumed", s.n_resumed},
                      {"preemptions", s.n_preempted},
                      {"draft_tokens", s.n_drafted},
                      {"draft_tokens_accepted", s.n_draft_accepted},
                      {"http_errors", http_errors},
                      {"ttft_seconds_mean",
                       s.ttft_count > 0 ? s.ttft_seconds_sum / static_cast<double>(s.ttft_count) : 0.0},
                      {"micro_batches", be.scheduler->n_micro_batches()}};
    const std::string engine = be.engine_status ? be.engine_status() : std::string();
    json e = engine.empty() ? json::object() : json::parse(engine, nullptr, false);
    if (e.is_discarded() || !e.is_object()) e = json::object();
    if (!e.contains("nodes")) e["nodes"] = json::array();
    if (!e.contains("links")) e["links"] = json::array();
    body["engine"] = std::move(e);
    res.set_header("Cache-Control", "no-cache");
    reply_json(res, 200, body);
}

void HttpServer::Impl::handle_tokenize(const HttpRequest &req, HttpResponse &res) {
    ServerBackend be;
    if (!get_backend(be)) return reply_error(res, 503, "the model is still loading");
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return reply_error(res, 400, "the request body must be a JSON object");
    auto content = j.find("content");
    if (content == j.end() || !content->is_string())
        return reply_error(res, 400, "'content' must be a string");
    bool add_special = false;
    if (auto it = j.find("add_special"); it != j.end() && !it->is_null()) {
        if (!it->is_boolean()) return reply_error(res, 400, "'add_special' must be a boolean");
        add_special = it->get<bool>();
    }
    std::vector<int32_t> ids =
        be.tokenizer->encode(content->get<std::string>(), add_special, /*parse_special=*/true);
    reply_json(res, 200, {{"tokens", ids}});
}

// llama-server's /apply-template: the prompt text a chat request would be given to the model as.
void HttpServer::Impl::handle_apply_template(const HttpRequest &req, HttpResponse &res) {
    ServerBackend be;
    if (!get_backend(be)) return reply_error(res, 503, "the model is still loading");
    auto parsed = parse_chat_request(req.body);
    if (!parsed.ok()) return reply_status(res, parsed.status());
    const ApiRequest &r = *parsed;
    auto text = be.chat->apply(r.messages, r.uses_tools() ? r.tools : json(), /*add_generation_prompt=*/true);
    if (!text.ok()) return reply_error(res, 400, text.status().message());
    reply_json(res, 200, {{"prompt", *text}});
}

void HttpServer::Impl::handle_detokenize(const HttpRequest &req, HttpResponse &res) {
    ServerBackend be;
    if (!get_backend(be)) return reply_error(res, 503, "the model is still loading");
    json j = json::parse(req.body, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return reply_error(res, 400, "the request body must be a JSON object");
    auto tokens = j.find("tokens");
    if (tokens == j.end() || !tokens->is_array())
        return reply_error(res, 400, "'tokens' must be an array of token ids");
    std::vector<int32_t> ids;
    for (const json &t : *tokens) {
        if (!t.is_number_integer() && !t.is_number_unsigned())
            return reply_error(res, 400, "'tokens' must hold integers");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= be.tokenizer->vocab().n_tokens())
            return reply_error(res, 400,
                               fmt::format("token id {} is out of range (the vocabulary has {} tokens)", id,
                                           be.tokenizer->vocab().n_tokens()));
        ids.push_back(static_cast<int32_t>(id));
    }
    reply_json(res, 200, {{"content", detokenize(*be.tokenizer, ids)}});
}

void HttpServer::Impl::handle(const HttpRequest &req, HttpResponse &res) {
    auto route = routes.find(req.path);
    const auto under = [&](std::string_view prefix) {
        return route == routes.end() && req.path.size() > prefix.size() &&
               req.path.compare(0, prefix.size(), prefix) == 0;
    };
    const std::string_view models_prefix = "/v1/models/", responses_prefix = "/v1/responses/";
    const bool one_model = under(models_prefix);
    const bool one_response = under(responses_prefix);
    // Only known paths become metric labels (a client must not grow the label set at will).
    const std::string label = one_model               ? "/v1/models/{id}"
                              : one_response          ? "/v1/responses/{id}"
                              : route == routes.end() ? "other"
                                                      : req.path;
    if (!params.api_key.empty() && !public_paths.contains(req.path)) {
        // Compared in constant time, so the response time says nothing about how much of a guess was right.
        // Anthropic's clients send the key as x-api-key.
        const auto same = [](const std::string &a, const std::string &b) {
            return net::equal_constant_time(std::span(reinterpret_cast<const uint8_t *>(a.data()), a.size()),
                                            std::span(reinterpret_cast<const uint8_t *>(b.data()), b.size()));
        };
        const bool bearer = same(req.header("authorization"), "Bearer " + params.api_key);
        const bool x_api_key = same(req.header("x-api-key"), params.api_key);
        if (!bearer && !x_api_key) {
            reply_error(
                res, 401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')");
            return count(label, 401);
        }
    }
    if (one_model) {
        if (req.method == "GET") {
            handle_model(req.path.substr(models_prefix.size()), res);
        } else {
            reply_error(res, 405, fmt::format("/v1/models/{{id}} takes GET, not {}", req.method));
            res.set_header("Allow", "GET");
        }
    } else if (one_response) {
        handle_stored_response(req, req.path.substr(responses_prefix.size()), res);
    } else if (route == routes.end()) {
        reply_error(res, 404, fmt::format("no endpoint {} {}", req.method, req.path));
    } else if (route->second.first != req.method) {
        reply_error(res, 405, fmt::format("{} takes {}, not {}", req.path, route->second.first, req.method));
        res.set_header("Allow", route->second.first);
    } else {
        route->second.second(req, res);
    }
    count(label, res.status);
}

void HttpServer::Impl::setup() {
    routes["/health"] = {"GET", [this](const HttpRequest &, HttpResponse &res) { handle_health(res); }};
    routes["/v1/models"] = {"GET", [this](const HttpRequest &, HttpResponse &res) { handle_models(res); }};
    routes["/metrics"] = {"GET", [this](const HttpRequest &, HttpResponse &res) { handle_metrics(res); }};
    routes["/props"] = {"GET", [this](const HttpRequest &, HttpResponse &res) { handle_props(res); }};
    routes["/tokenize"] = {"POST", [this](const HttpRequest &req, HttpResponse &res) { handle_tokenize(req, res); }};
    routes["/apply-template"] = {
        "POST", [this](const HttpRequest &req, HttpResponse &res) { handle_apply_template(req, res); }};
    routes["/detokenize"] = {"POST",
                             [this](const HttpRequest &req, HttpResponse &res) { handle_detokenize(req, res); }};
    routes["/v1/chat/completions"] = {
        "POST", [this](const HttpRequest &req, HttpResponse &res) { handle_generate(req, res, ApiKind::chat); }};
    routes["/v1/completions"] = {"POST", [this](const HttpRequest &req, HttpResponse &res) {
                                     handle_generate(req, res, ApiKind::completion);
                                 }};
    routes["/status"] = {"GET", [this](const HttpRequest &, HttpResponse &res) { handle_status(res); }};
    setup_ollama();
    setup_llamacpp();
    setup_embeddings();
    setup_responses();
    setup_anthropic();
    // The dashboard's files, from the binary. They carry no data, so like /health they need no API key.
    public_paths["/health"] = true;
    for (const WebAsset &a : params.web_ui ? web_assets() : std::vector<WebAsset>()) {
        const auto serve = [a](const HttpRequest &, HttpResponse &res) {
            res.status = 200;
            res.content_type = std::string(a.content_type);
            res.body = std::string(a.body);
            res.set_header("Cache-Control", "no-cache");
            res.set_header("X-Content-Type-Options", "nosniff");
            // Scripts and styles only from this server (no inline script, no CDN); API calls to this server.
            res.set_header("Content-Security-Policy",
                           "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
        };
        routes[std::string(a.path)] = {"GET", serve};
        public_paths[std::string(a.path)] = true;
        if (a.path == "/index.html") {
            routes["/"] = {"GET", serve};
            public_paths["/"] = true;
        }
    }
    core = std::make_unique<HttpCore>(
        params.limits, [this](const HttpRequest &req, HttpResponse &res) { handle(req, res); },
        [](int status, const std::string &message) {
            return std::make_pair(std::string("application/json"), json_dump(error_json(status, message)));
        });
}

// ---- HttpServer ---------------------------------------------------------------------------------------

HttpServer::HttpServer(HttpParams params) : impl_(std::make_unique<Impl>(std::move(params))) {
    std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up must fail a write, not kill the process
    impl_->setup();
}

HttpServer::~HttpServer() {
    stop();
}

Result<int> HttpServer::bind() {
    const HttpParams &p = impl_->params;
    if (p.ssl_cert.empty() != p.ssl_key.empty())
        return invalid_input("HTTPS needs both --ssl-cert and --ssl-key (got only {})",
                             p.ssl_cert.empty() ? "--ssl-key" : "--ssl-cert");
    if (!p.ssl_cert.empty()) {
        TD_ASSIGN_OR_RETURN(auto tls, TlsContext::load(p.ssl_cert, p.ssl_key));
        impl_->core->set_tls(std::move(tls));
    }
    TD_ASSIGN_OR_RETURN(port_, impl_->core->bind(p.host, p.port));
    return port_;
}

Status HttpServer::listen() {
    return impl_->core->run();
}

void HttpServer::stop() {
    impl_->stopping.store(true);
    impl_->core->stop();
}

int HttpServer::open_connections() const {
    return impl_->core->open_connections();
}

void HttpServer::set_backend(ServerBackend backend) {
    std::lock_guard lock(impl_->mu);
    impl_->backend = std::move(backend);
    impl_->has_backend = true;
}

}  // namespace td::server
