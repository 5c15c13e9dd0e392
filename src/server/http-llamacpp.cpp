// llama-server's own completion endpoint (server/llamacpp.h) over the same scheduler, limits and API key as
// OpenAI's. Errors are OpenAI's {"error": {...}} objects, as llama-server answers them.
#include "server/http-impl.h"
#include "server/llamacpp.h"

namespace td::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

LlamaFinal final_of(const std::string &model, const StreamEvent &done, Clock::time_point t0,
                    Clock::time_point t_first) {
    const auto t_end = Clock::now();
    if (t_first == Clock::time_point{}) t_first = t_end;
    LlamaFinal f;
    f.model = model;
    f.finish = done.finish;
    f.stop_word = done.stop_word;
    f.n_prompt = done.n_prompt;
    f.n_generated = done.n_generated;
    f.n_cached = done.n_cached;
    f.prompt_ms = ms_between(t0, t_first);
    f.predicted_ms = ms_between(t_first, t_end);
    return f;
}

// Server-Sent Events of {index, content, stop: false}; each prompt's last one its whole reply with stop:
// true.
class LlamaSseFormat : public StreamFormat {
public:
    LlamaSseFormat(ApiRequest r, std::string model, Clock::time_point t0, size_t n_prompts)
        : r_(std::move(r)), model_(std::move(model)), t0_(t0), t_first_(n_prompts) {}
    std::string delta(size_t choice, const StreamEvent &ev) override {
        if (t_first_[choice] == Clock::time_point{} && !ev.text.empty()) t_first_[choice] = Clock::now();
        return sse_event(llama_chunk_json(choice, ev.text, r_.n_logprobs, ev.logprobs));
    }
    std::string done(size_t choice, const StreamEvent &ev) override {
        return sse_event(llama_final_json(r_, choice, final_of(model_, ev, t0_, t_first_[choice]), "", {}));
    }
    std::string error(const Status &status) override { return sse_event(error_json(500, status.message())); }

private:
    ApiRequest r_;
    std::string model_;
    Clock::time_point t0_;
    std::vector<Clock::time_point> t_first_;  // per prompt
};

}  // namespace

void HttpServer::Impl::setup_llamacpp() {
    // /completion and /infill: the same replies, the request read by `parse`.
    const auto completion = [this](Result<ApiRequest> (*parse)(std::string_view)) {
        return [this, parse](const HttpRequest &req, HttpResponse &res) {
            const auto t0 = Clock::now();
            ServerBackend be;
            if (!ready_backend(res, reply_error, be)) return;
            auto parsed = parse(req.body);
            if (!parsed.ok())
                return reply_error(res, http_status_for(parsed.status()), parsed.status().message());
            ApiRequest &r = *parsed;
            const ApiRequest settings = r;  // what the reply reports (start_generation takes the prompt)
            const size_t n_prompts = r.prompts.size();
            std::shared_ptr<ClientSlot> slot;
            std::shared_ptr<StreamSet> streams = start_generation(req, res, r, be, reply_error, slot);
            if (!streams) return;
            if (!r.stream) {
                std::optional<std::vector<Answer>> answers = collect(req, res, *streams, reply_error);
                if (!answers) return;
                json replies = json::array();
                for (size_t i = 0; i < answers->size(); ++i) {
                    const Answer &a = (*answers)[i];
                    replies.push_back(llama_final_json(
                        settings, i, final_of(params.model_id, a.done, t0, a.t_first), a.text, a.logprobs));
                }
                // One prompt: its object; a list of prompts: the list of their objects (llama-server's
                // shapes).
                return reply_json(res, 200, n_prompts == 1 ? std::move(replies[0]) : std::move(replies));
            }
            stream_response(res, std::move(streams),
                            std::make_unique<LlamaSseFormat>(settings, params.model_id, t0, n_prompts),
                            "text/event-stream", std::move(slot));
        };
    };
    routes["/completion"] = {"POST",
                             completion([](std::string_view body) { return parse_llama_completion(body); })};
    routes["/completions"] = routes["/completion"];
    routes["/infill"] = {"POST", completion(parse_llama_infill)};
    if (params.slots) {
        routes["/slots"] = {"GET", [this](const HttpRequest &req, HttpResponse &res) {
                                ServerBackend be;
                                if (!ready_backend(res, reply_error, be)) return;
                                const std::vector<SlotInfo> slots = be.scheduler->slots();
                                const bool any_free =
                                    std::any_of(slots.begin(), slots.end(),
                                                [](const SlotInfo &s) { return !s.processing; });
                                if (query_flag(req.query, "fail_on_no_slot") && !any_free)
                                    return reply_error(res, 503, "no slot available");
                                reply_json(res, 200, llama_slots_json(slots, be.scheduler->n_ctx()));
                            }};
    }
}

}  // namespace td::server
