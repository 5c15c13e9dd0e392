// Anthropic's Messages API over HTTP (server/anthropic.h): POST /v1/messages on the chat path, whole or as
// Anthropic's SSE events, and POST /v1/messages/count_tokens.
#include <fmt/format.h>

#include <memory>

#include "server/anthropic.h"
#include "server/http-impl.h"

namespace td::server {

void reply_anthropic_error(HttpResponse &res, int status, std::string_view message) {
    reply_json(res, status, anthropic_error_json(status, message));
}

namespace {

using json = nlohmann::json;

// Anthropic's stream: "event: <type>" and its JSON per event; text streams as a text block, the calls (held
// back until the reply ends, as on the chat path) as tool_use blocks with their input in one delta.
class MessagesSse : public StreamFormat {
public:
    MessagesSse(std::string id, std::string model, std::shared_ptr<const MessagesRequest> req,
                std::function<std::string()> new_call_id)
        : id_(std::move(id)),
          model_(std::move(model)),
          req_(std::move(req)),
          new_call_id_(std::move(new_call_id)) {
        if (req_->api.uses_tools()) tools_.emplace();
    }
    std::string open() override {
        const json message = {{"id", id_},
                              {"type", "message"},
                              {"role", "assistant"},
                              {"model", model_},
                              {"content", json::array()},
                              {"stop_reason", nullptr},
                              {"stop_sequence", nullptr},
                              {"usage", messages_usage(StreamEvent{})}};
        std::string out = event("message_start", {{"message", message}});
        return out + event("ping", json::object());
    }
    std::string delta(size_t, const StreamEvent &ev) override {
        return text(tools_ ? tools_->push(ev.text) : ev.text);
    }
    std::string done(size_t, const StreamEvent &ev) override {
        std::string out;
        std::vector<ToolCall> calls;
        if (tools_) {
            ToolCallParse p = tools_->finish();
            out += text(p.content);
            calls = finish_tool_calls(std::move(p.calls), req_->api.parallel_tool_calls, new_call_id_);
        }
        if (text_open_) {
            out += event("content_block_stop", {{"index", index_}});
            ++index_;
            text_open_ = false;
        }
        for (const ToolCall &c : calls) {
            json block = tool_use_block(c);
            const std::string input = block["input"].dump();
            block["input"] = json::object();
            out += event("content_block_start", {{"index", index_}, {"content_block", block}});
            out += event(
                "content_block_delta",
                {{"index", index_}, {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}});
            out += event("content_block_stop", {{"index", index_}});
            ++index_;
        }
        std::string stop_sequence;
        const char *reason = messages_stop_reason(*req_, ev, !calls.empty(), stop_sequence);
        out += event("message_delta",
                     {{"delta",
                       {{"stop_reason", reason},
                        {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
                      {"usage", messages_usage(ev)}});
        return out + event("message_stop", json::object());
    }
    std::string error(const Status &status) override {
        return event("error", anthropic_error_json(500, status.message())["error"], /*wrap=*/true);
    }

private:
    std::string event(const char *type, json data, bool wrap = false) {
        if (wrap) data = {{"error", std::move(data)}};
        data["type"] = type;
        return fmt::format("event: {}\ndata: {}\n\n", type, json_dump(data));
    }
    std::string text(const std::string &t) {
        if (t.empty()) return "";
        std::string out;
        if (!text_open_) {
            text_open_ = true;
            out += event("content_block_start",
                         {{"index", index_}, {"content_block", {{"type", "text"}, {"text", ""}}}});
        }
        return out + event("content_block_delta",
                           {{"index", index_}, {"delta", {{"type", "text_delta"}, {"text", t}}}});
    }

    std::string id_;
    std::string model_;
    std::shared_ptr<const MessagesRequest> req_;
    std::function<std::string()> new_call_id_;
    std::optional<ToolCallStream> tools_;
    bool text_open_ = false;
    int index_ = 0;
};

// Anthropic's ids: "toolu_" and 24 letters and digits.
std::string tool_use_id() {
    return "toolu_" + random_hex(24);
}

}  // namespace

void HttpServer::Impl::handle_messages(const HttpRequest &req, HttpResponse &res) {
    ServerBackend be;
    if (!ready_backend(res, reply_anthropic_error, be)) return;
    auto parsed = parse_messages_request(req.body);
    if (!parsed.ok())
        return reply_anthropic_error(res, http_status_for(parsed.status()), parsed.status().message());
    auto mr = std::make_shared<MessagesRequest>(std::move(parsed).value());
    ApiRequest &r = mr->api;
    if (!r.model.empty() && r.model != params.model_id)
        return reply_anthropic_error(
            res, 404, fmt::format("model '{}' not found; this server serves '{}'", r.model, params.model_id));
    std::shared_ptr<ClientSlot> slot;
    std::shared_ptr<StreamSet> streams = start_generation(req, res, r, be, reply_anthropic_error, slot);
    if (!streams) return;
    const std::string id = "msg_" + random_hex(24);
    if (mr->stream) {
        return stream_response(res, std::move(streams),
                               std::make_unique<MessagesSse>(id, params.model_id, mr, tool_use_id),
                               "text/event-stream", std::move(slot));
    }
    auto answers = collect(req, res, *streams, reply_anthropic_error);
    if (!answers) return;
    Answer &a = answers->at(0);
    std::vector<ToolCall> calls;
    if (r.uses_tools()) {
        ToolCallParse p = parse_tool_calls(a.text);
        if (!p.calls.empty()) {
            calls = finish_tool_calls(std::move(p.calls), r.parallel_tool_calls, tool_use_id);
            a.text = std::move(p.content);
        }
    }
    std::string stop_sequence;
    const char *reason = messages_stop_reason(*mr, a.done, !calls.empty(), stop_sequence);
    reply_json(res, 200, message_json(id, params.model_id, a.text, calls, reason, stop_sequence, a.done));
}

void HttpServer::Impl::handle_count_tokens(const HttpRequest &req, HttpResponse &res) {
    ServerBackend be;
    if (!ready_backend(res, reply_anthropic_error, be)) return;
    auto parsed = parse_messages_request(req.body);
    if (!parsed.ok())
        return reply_anthropic_error(res, http_status_for(parsed.status()), parsed.status().message());
    auto prompt = chat_prompt(parsed->api, be);
    if (!prompt.ok()) return reply_anthropic_error(res, 400, prompt.status().message());
    reply_json(res, 200, {{"input_tokens", prompt->size()}});
}

void HttpServer::Impl::setup_anthropic() {
    routes["/v1/messages"] = {
        "POST", [this](const HttpRequest &req, HttpResponse &res) { handle_messages(req, res); }};
    routes["/v1/messages/count_tokens"] = {
        "POST", [this](const HttpRequest &req, HttpResponse &res) { handle_count_tokens(req, res); }};
}

}  // namespace td::server
