// OpenAI's Responses API over HTTP (server/responses.h): POST /v1/responses on the chat path, its typed SSE
// events when streamed, and GET / DELETE /v1/responses/{id} for the stored ones.
#include <fmt/format.h>

#include <chrono>
#include <memory>

#include "server/http-impl.h"
#include "server/responses.h"

namespace td::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

int64_t now_seconds() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// What a finished reply leaves: its items, and the conversation to store.
struct Reply {
    json items = json::array();
    std::string text;
    std::vector<ToolCall> calls;
};

// The Responses API's stream: "event: <type>" and its JSON (with the type and a sequence number) per event.
class ResponsesSse : public StreamFormat {
public:
    using Done = std::function<void(const json &response, const Reply &reply)>;
    ResponsesSse(std::string id, int64_t created, std::string model, std::shared_ptr<const ResponsesInput> in,
                 bool tools, bool parallel, std::function<std::string()> new_call_id, Done on_done)
        : id_(std::move(id)),
          created_(created),
          model_(std::move(model)),
          in_(std::move(in)),
          parallel_(parallel),
          new_call_id_(std::move(new_call_id)),
          on_done_(std::move(on_done)) {
        if (tools) tools_.emplace();
    }
    std::string open() override {
        const json r = response_json(id_, created_, model_, *in_, "in_progress", json::array(), nullptr);
        std::string out = event("response.created", {{"response", r}});
        return out + event("response.in_progress", {{"response", r}});
    }
    std::string delta(size_t, const StreamEvent &ev) override {
        return text(tools_ ? tools_->push(ev.text) : ev.text);
    }
    std::string done(size_t, const StreamEvent &ev) override {
        std::string out;
        if (tools_) {
            ToolCallParse p = tools_->finish();
            out += text(p.content);
            reply_.calls = finish_tool_calls(std::move(p.calls), parallel_, new_call_id_);
        }
        if (!msg_open_ && reply_.calls.empty()) out += open_message();
        if (msg_open_) {
            const json part = {
                {"type", "output_text"}, {"text", reply_.text}, {"annotations", json::array()}};
            out += event(
                "response.output_text.done",
                {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"text", reply_.text}});
            out += event("response.content_part.done",
                         {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
            const json item = message_item(msg_id_, reply_.text, "completed");
            out += event("response.output_item.done", {{"output_index", 0}, {"item", item}});
            reply_.items.push_back(item);
        }
        for (const ToolCall &c : reply_.calls) {
            const size_t index = reply_.items.size();
            const std::string item_id = "fc_" + random_hex(24);
            json item = function_call_item(item_id, c, "in_progress");
            item["arguments"] = "";
            out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
            out += event("response.function_call_arguments.delta",
                         {{"item_id", item_id}, {"output_index", index}, {"delta", c.arguments}});
            out += event("response.function_call_arguments.done",
                         {{"item_id", item_id}, {"output_index", index}, {"arguments", c.arguments}});
            item = function_call_item(item_id, c, "completed");
            out += event("response.output_item.done", {{"output_index", index}, {"item", item}});
            reply_.items.push_back(std::move(item));
        }
        Usage usage;
        usage.n_prompt = ev.n_prompt;
        usage.n_cached = ev.n_cached;
        usage.n_generated = ev.n_generated;
        const bool cut = ev.finish == FinishReason::length;
        const json r = response_json(id_, created_, model_, *in_, cut ? "incomplete" : "completed",
                                     reply_.items, &usage);
        if (on_done_) on_done_(r, reply_);
        return out + event(cut ? "response.incomplete" : "response.completed", {{"response", r}});
    }
    std::string error(const Status &status) override {
        json r = response_json(id_, created_, model_, *in_, "failed", reply_.items, nullptr);
        r["error"] = {{"code", "server_error"}, {"message", status.message()}};
        std::string out =
            event("error", {{"code", "server_error"}, {"message", status.message()}, {"param", nullptr}});
        return out + event("response.failed", {{"response", r}});
    }

private:
    std::string event(const char *type, json data) {
        data["type"] = type;
        data["sequence_number"] = seq_++;
        return fmt::format("event: {}\ndata: {}\n\n", type, json_dump(data));
    }
    std::string open_message() {
        msg_open_ = true;
        msg_id_ = "msg_" + random_hex(24);
        std::string out = event("response.output_item.added", {{"output_index", 0},
                                                               {"item",
                                                                {{"type", "message"},
                                                                 {"id", msg_id_},
                                                                 {"status", "in_progress"},
                                                                 {"role", "assistant"},
                                                                 {"content", json::array()}}}});
        return out +
               event("response.content_part.added",
                     {{"item_id", msg_id_},
                      {"output_index", 0},
                      {"content_index", 0},
                      {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
    }
    std::string text(const std::string &t) {
        if (t.empty()) return "";
        std::string out = msg_open_ ? "" : open_message();
        reply_.text += t;
        return out + event("response.output_text.delta",
                           {{"item_id", msg_id_}, {"output_index", 0}, {"content_index", 0}, {"delta", t}});
    }

    std::string id_;
    int64_t created_;
    std::string model_;
    std::shared_ptr<const ResponsesInput> in_;
    bool parallel_;
    std::function<std::string()> new_call_id_;
    Done on_done_;
    std::optional<ToolCallStream> tools_;
    bool msg_open_ = false;
    std::string msg_id_;
    int64_t seq_ = 0;
    Reply reply_;
};

}  // namespace

void HttpServer::Impl::handle_responses(const HttpRequest &req, HttpResponse &res) {
    ServerBackend be;
    if (!ready_backend(res, reply_error, be)) return;
    auto parsed = parse_responses_input(req.body);
    if (!parsed.ok()) return reply_error(res, http_status_for(parsed.status()), parsed.status().message());
    auto in = std::make_shared<const ResponsesInput>(std::move(parsed).value());
    ojson history = ojson::array();
    if (!in->previous_response_id.empty()) {
        auto prev = stored_responses.get(in->previous_response_id);
        if (!prev)
            return reply_error(
                res, 404, fmt::format("Previous response with id '{}' not found.", in->previous_response_id));
        history = prev->conversation;
    }
    auto r = responses_chat_request(*in, history);
    if (!r.ok()) return reply_error(res, http_status_for(r.status()), r.status().message());
    if (!r->model.empty() && r->model != params.model_id)
        return reply_error(
            res, 404,
            fmt::format("model '{}' not found; this server serves '{}'", r->model, params.model_id));

    std::shared_ptr<ClientSlot> slot;
    std::shared_ptr<StreamSet> streams = start_generation(req, res, *r, be, reply_error, slot);
    if (!streams) return;
    const std::string id = "resp_" + random_hex(32);
    const int64_t created = now_seconds();
    ResponseStore *store = in->store ? &stored_responses : nullptr;
    ojson conversation = history;
    for (const ojson &m : in->input) conversation.push_back(m);
    const auto keep = [store, id, conversation](const json &response, const Reply &reply) {
        if (store == nullptr) return;
        ResponseStore::Entry e{response, conversation};
        for (ojson &m : reply_messages(reply.text, reply.calls)) e.conversation.push_back(std::move(m));
        store->put(id, std::move(e));
    };
    const ChatFormatter *chat = be.chat;
    const auto new_call_id = [chat] { return chat->new_tool_call_id(); };
    if (!in->stream) {
        std::optional<std::vector<Answer>> answers = collect(req, res, *streams, reply_error);
        if (!answers) return;
        Answer &a = answers->at(0);
        Reply reply;
        reply.text = std::move(a.text);
        if (r->uses_tools()) {
            ToolCallParse p = parse_tool_calls(reply.text);
            if (!p.calls.empty()) {
                reply.calls = finish_tool_calls(std::move(p.calls), r->parallel_tool_calls, new_call_id);
                reply.text = std::move(p.content);
            }
        }
        if (!reply.text.empty() || reply.calls.empty())
            reply.items.push_back(message_item("msg_" + random_hex(24), reply.text, "completed"));
        for (const ToolCall &c : reply.calls)
            reply.items.push_back(function_call_item("fc_" + random_hex(24), c, "completed"));
        Usage usage;
        usage.n_prompt = a.done.n_prompt;
        usage.n_cached = a.done.n_cached;
        usage.n_generated = a.done.n_generated;
        const char *status = a.done.finish == FinishReason::length ? "incomplete" : "completed";
        const json response = response_json(id, created, params.model_id, *in, status, reply.items, &usage);
        keep(response, reply);
        return reply_json(res, 200, response);
    }
    auto format = std::make_unique<ResponsesSse>(id, created, params.model_id, in, r->uses_tools(),
                                                 r->parallel_tool_calls, new_call_id, keep);
    stream_response(res, std::move(streams), std::move(format), "text/event-stream", std::move(slot));
}

void HttpServer::Impl::handle_stored_response(const HttpRequest &req, const std::string &id,
                                              HttpResponse &res) {
    if (req.method == "GET") {
        auto e = stored_responses.get(id);
        if (!e) return reply_error(res, 404, fmt::format("Response with id '{}' not found.", id));
        return reply_json(res, 200, e->response);
    }
    if (req.method == "DELETE") {
        if (!stored_responses.erase(id))
            return reply_error(res, 404, fmt::format("Response with id '{}' not found.", id));
        return reply_json(res, 200, {{"id", id}, {"object", "response.deleted"}, {"deleted", true}});
    }
    reply_error(res, 405, fmt::format("/v1/responses/{{id}} takes GET or DELETE, not {}", req.method));
    res.set_header("Allow", "GET, DELETE");
}

void HttpServer::Impl::setup_responses() {
    routes["/v1/responses"] = {
        "POST", [this](const HttpRequest &req, HttpResponse &res) { handle_responses(req, res); }};
}

}  // namespace td::server
