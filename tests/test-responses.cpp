// OpenAI's Responses API (server/responses.h) over real loopback HTTP: a response is the chat completion of
// the same conversation (greedy, so the texts are equal), its input items become the chat's messages,
// previous_response_id continues a stored conversation, the stream's typed events carry the same text and
// end with the same response, function tools give function_call items, text.format constrains the reply,
// and what it cannot do is a 400 naming the field.
#include <gtest/gtest.h>

#include "server/responses.h"
#include "test-server-util.h"

namespace td::server {
namespace {

using namespace test_server;

json post_ok(httplib::Client &c, const std::string &path, const json &body) {
    auto r = post(c, path, body);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body, nullptr, false);
}

// The chat completion's reply text for `messages`, greedy.
std::string chat_reply(httplib::Client &c, const json &messages, int max_tokens, json *usage = nullptr,
                       std::string *finish = nullptr) {
    const json j = post_ok(c, "/v1/chat/completions",
                           {{"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}});
    if (usage) *usage = j["usage"];
    if (finish) *finish = j["choices"][0]["finish_reason"];
    return j["choices"][0]["message"]["content"].get<std::string>();
}

std::string output_text(const json &response) {
    std::string text;
    for (const json &item : response["output"])
        if (item["type"] == "message")
            for (const json &part : item["content"])
                if (part["type"] == "output_text") text += part["text"].get<std::string>();
    return text;
}

TEST(Responses, AResponseIsTheChatCompletionOfItsConversation) {
    ServerOptions o;
    o.n_ctx_slot = 1024;
    TestServer s(o);
    auto c = s.client();
    const json r = post_ok(c, "/v1/responses",
                           {{"input", "Once upon a time"}, {"temperature", 0}, {"max_output_tokens", 24}});
    json usage;
    std::string finish;
    const std::string want =
        chat_reply(c, {{{"role", "user"}, {"content", "Once upon a time"}}}, 24, &usage, &finish);
    EXPECT_EQ(r["object"], "response");
    EXPECT_EQ(r["id"].get<std::string>().rfind("resp_", 0), 0u) << r;
    EXPECT_EQ(r["model"], "stories");
    ASSERT_EQ(r["output"].size(), 1u) << r;
    EXPECT_EQ(r["output"][0]["type"], "message");
    EXPECT_EQ(r["output"][0]["role"], "assistant");
    EXPECT_EQ(r["output"][0]["status"], "completed");
    EXPECT_EQ(output_text(r), want);
    EXPECT_EQ(r["usage"]["input_tokens"], usage["prompt_tokens"]);
    EXPECT_EQ(r["usage"]["output_tokens"], usage["completion_tokens"]);
    EXPECT_EQ(r["usage"]["total_tokens"], usage["total_tokens"]);
    // Cut by max_output_tokens: incomplete, as OpenAI says it.
    EXPECT_EQ(r["status"], finish == "length" ? "incomplete" : "completed") << r;
    if (finish == "length") {
        EXPECT_EQ(r["incomplete_details"]["reason"], "max_output_tokens");
    }
    EXPECT_EQ(r["max_output_tokens"], 24);
    EXPECT_EQ(r["temperature"], 0);
    EXPECT_EQ(r["tools"], json::array());
    EXPECT_EQ(r["text"]["format"]["type"], "text");

    // Instructions, a developer message, parts, an earlier call and its output: the chat's messages.
    const json items = json::parse(R"([
      {"role": "developer", "content": "Tell a story."},
      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A cat"},
                                                        {"type": "input_text", "text": " and a dog."}]},
      {"type": "function_call", "call_id": "call_1", "name": "look", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "a big tree"},
      {"type": "reasoning", "id": "rs_1", "summary": []},
      {"role": "assistant", "content": [{"type": "output_text", "text": "Once"}]},
      {"role": "user", "content": "Go on."}])");
    const json messages = json::parse(R"([
      {"role": "system", "content": "Be kind."},
      {"role": "system", "content": "Tell a story."},
      {"role": "user", "content": "A cat and a dog."},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "look", "arguments": "{}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "a big tree"},
      {"role": "assistant", "content": "Once"},
      {"role": "user", "content": "Go on."}])");
    const json r2 = post_ok(
        c, "/v1/responses",
        {{"input", items}, {"instructions", "Be kind."}, {"temperature", 0}, {"max_output_tokens", 16}});
    EXPECT_EQ(output_text(r2), chat_reply(c, messages, 16));
    EXPECT_EQ(r2["instructions"], "Be kind.");
}

TEST(Responses, PreviousResponseIdContinuesTheStoredConversation) {
    TestServer s;
    auto c = s.client();
    const json first = post_ok(c, "/v1/responses",
                               {{"input", "Lily had a ball."},
                                {"instructions", "Be brief."},
                                {"temperature", 0},
                                {"max_output_tokens", 12}});
    const std::string id = first["id"];
    const json second = post_ok(c, "/v1/responses",
                                {{"input", "What next?"},
                                 {"previous_response_id", id},
                                 {"temperature", 0},
                                 {"max_output_tokens", 12}});
    EXPECT_EQ(second["previous_response_id"], id);
    // The earlier instructions are not carried over (OpenAI's rule); the earlier turns are.
    const json messages = {{{"role", "user"}, {"content", "Lily had a ball."}},
                           {{"role", "assistant"}, {"content", output_text(first)}},
                           {{"role", "user"}, {"content", "What next?"}}};
    EXPECT_EQ(output_text(second), chat_reply(c, messages, 12));

    // Retrieved as it was answered; deleted once.
    auto got = c.Get(("/v1/responses/" + id).c_str());
    ASSERT_TRUE(got);
    EXPECT_EQ(got->status, 200);
    EXPECT_EQ(json::parse(got->body), first);
    auto del = c.Delete(("/v1/responses/" + id).c_str());
    ASSERT_TRUE(del);
    EXPECT_EQ(del->status, 200) << del->body;
    EXPECT_EQ(json::parse(del->body)["deleted"], true);
    for (int i = 0; i < 2; ++i) {
        got = i == 0 ? c.Get(("/v1/responses/" + id).c_str()) : c.Delete(("/v1/responses/" + id).c_str());
        ASSERT_TRUE(got);
        EXPECT_EQ(got->status, 404) << got->body;
        EXPECT_NE(got->body.find("Response with id '" + id + "' not found."), std::string::npos) << got->body;
    }
    auto again = post(c, "/v1/responses", {{"input", "x"}, {"previous_response_id", id}});
    ASSERT_TRUE(again);
    EXPECT_EQ(again->status, 404);
    EXPECT_NE(again->body.find("Previous response with id '" + id + "' not found."), std::string::npos);
    // store: false keeps nothing.
    const json unstored =
        post_ok(c, "/v1/responses", {{"input", "Hi"}, {"store", false}, {"max_output_tokens", 2}});
    EXPECT_EQ(unstored["store"], false);
    got = c.Get(("/v1/responses/" + unstored["id"].get<std::string>()).c_str());
    ASSERT_TRUE(got);
    EXPECT_EQ(got->status, 404);
    auto wrong =
        c.Post(("/v1/responses/" + first["id"].get<std::string>()).c_str(), "{}", "application/json");
    ASSERT_TRUE(wrong);
    EXPECT_EQ(wrong->status, 405);
}

TEST(Responses, TheStreamsEventsCarryTheSameTextAndResponse) {
    TestServer s;
    auto c = s.client();
    const json body = {{"input", "Once upon a time"}, {"temperature", 0}, {"max_output_tokens", 20}};
    const json whole = post_ok(c, "/v1/responses", body);
    json streamed = body;
    streamed["stream"] = true;
    auto r = post(c, "/v1/responses", streamed);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
    const std::vector<NamedEvent> events = parse_named_sse(r->body);
    ASSERT_GE(events.size(), 9u) << r->body;
    std::vector<std::string> names;
    std::string text;
    for (size_t i = 0; i < events.size(); ++i) {
        EXPECT_EQ(events[i].data["sequence_number"], i);
        if (events[i].name == "response.output_text.delta") {
            text += events[i].data["delta"].get<std::string>();
            EXPECT_EQ(events[i].data["item_id"], events[2].data["item"]["id"]);
        } else {
            names.push_back(events[i].name);
        }
    }
    const std::string last = whole["status"] == "completed" ? "response.completed" : "response.incomplete";
    const std::vector<std::string> want = {"response.created",           "response.in_progress",
                                           "response.output_item.added", "response.content_part.added",
                                           "response.output_text.done",  "response.content_part.done",
                                           "response.output_item.done",  last};
    EXPECT_EQ(names, want);
    EXPECT_EQ(events[0].data["response"]["status"], "in_progress");
    EXPECT_EQ(text, output_text(whole));
    const json &final_response = events.back().data["response"];
    EXPECT_EQ(output_text(final_response), text);
    // The same counts (the stream's prompt was cached by the first request).
    EXPECT_EQ(final_response["usage"]["input_tokens"], whole["usage"]["input_tokens"]);
    EXPECT_EQ(final_response["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    EXPECT_GT(final_response["usage"]["input_tokens_details"]["cached_tokens"], 0);
    EXPECT_EQ(final_response["status"], whole["status"]);
    EXPECT_EQ(final_response["id"], events[0].data["response"]["id"]);
    // The streamed response is stored as its last event gave it.
    auto got = c.Get(("/v1/responses/" + final_response["id"].get<std::string>()).c_str());
    ASSERT_TRUE(got);
    ASSERT_EQ(got->status, 200);
    EXPECT_EQ(json::parse(got->body), final_response);
}

const json kWeather = json::parse(R"({"type": "function", "name": "get_weather", "description": "Weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                 "required": ["city"]}})");

TEST(Responses, FunctionToolsGiveFunctionCallItems) {
    ServerOptions o;
    o.n_ctx_slot = 1024;
    TestServer s(o);
    auto c = s.client();
    const json body = {{"input", "Weather in Paris?"},
                       {"tools", json::array({kWeather})},
                       {"tool_choice", "required"},
                       {"temperature", 0},
                       {"max_output_tokens", 80}};
    const json r = post_ok(c, "/v1/responses", body);
    ASSERT_EQ(r["output"].size(), 1u) << r;
    const json &call = r["output"][0];
    EXPECT_EQ(call["type"], "function_call");
    EXPECT_EQ(call["name"], "get_weather");
    EXPECT_EQ(call["status"], "completed");
    EXPECT_EQ(call["id"].get<std::string>().rfind("fc_", 0), 0u);
    EXPECT_EQ(call["call_id"].get<std::string>().rfind("call_", 0), 0u);
    EXPECT_TRUE(json::parse(call["arguments"].get<std::string>())["city"].is_string()) << call;
    EXPECT_EQ(r["tools"][0]["name"], "get_weather");
    EXPECT_EQ(r["tool_choice"], "required");

    // Streamed: the call's item and its arguments' events.
    json streamed = body;
    streamed["stream"] = true;
    auto sr = post(c, "/v1/responses", streamed);
    ASSERT_TRUE(sr);
    ASSERT_EQ(sr->status, 200);
    const std::vector<NamedEvent> events = parse_named_sse(sr->body);
    std::vector<std::string> names;
    for (const NamedEvent &e : events) names.push_back(e.name);
    const std::vector<std::string> want = {"response.created",
                                           "response.in_progress",
                                           "response.output_item.added",
                                           "response.function_call_arguments.delta",
                                           "response.function_call_arguments.done",
                                           "response.output_item.done",
                                           "response.completed"};
    EXPECT_EQ(names, want) << sr->body;
    ASSERT_EQ(events.size(), want.size());
    EXPECT_EQ(events[4].data["arguments"], call["arguments"]);
    EXPECT_EQ(events.back().data["response"]["output"][0]["arguments"], call["arguments"]);

    // The call's output sent back on the stored conversation.
    const json next = post_ok(
        c, "/v1/responses",
        {{"previous_response_id", r["id"]},
         {"input", {{{"type", "function_call_output"}, {"call_id", call["call_id"]}, {"output", "21C"}}}},
         {"tools", json::array({kWeather})},
         {"tool_choice", "none"},
         {"temperature", 0},
         {"max_output_tokens", 8}});
    EXPECT_EQ(next["output"][0]["type"], "message") << next;
}

TEST(Responses, TextFormatConstrainsTheReply) {
    TestServer s;
    auto c = s.client();
    const json schema = json::parse(R"({"type": "object", "properties": {"name": {"type": "string",
      "maxLength": 8}, "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false})");
    const json r =
        post_ok(c, "/v1/responses",
                {{"input", "A girl."},
                 {"text", {{"format", {{"type", "json_schema"}, {"name", "girl"}, {"schema", schema}}}}},
                 {"temperature", 0},
                 {"max_output_tokens", 60}});
    const json reply = json::parse(output_text(r), nullptr, false);
    ASSERT_TRUE(reply.is_object()) << r;
    EXPECT_TRUE(reply["name"].is_string() && reply["age"].is_number_integer()) << reply;
    EXPECT_EQ(r["text"]["format"]["name"], "girl");
}

TEST(Responses, WhatItCannotDoIsA400NamingTheField) {
    TestServer s;
    auto c = s.client();
    const std::vector<std::pair<json, std::string>> cases = {
        {json::object(), "'input' is required"},
        {{{"input", 3}}, "'input' must be a string or an array of items"},
        {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}, {"image_url", "x"}}}}}}}},
         "'input[0].content[0].type' 'input_image' is not supported"},
        {{{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}},
         "'input[0].call_id' is required"},
        {{{"input", {{{"type", "item_reference"}, {"id", "x"}}}}},
         "'input[0].type' 'item_reference' is not supported"},
        {{{"input", {{{"role", "robot"}, {"content", "x"}}}}}, "'input[0].role' must be user, assistant"},
        {{{"input", "x"}, {"tools", {{{"type", "web_search"}}}}},
         "'tools[0].type' 'web_search' is not supported"},
        {{{"input", "x"}, {"text", {{"format", {{"type", "yaml"}}}}}}, "'text.format.type' must be text"},
        {{{"input", "x"}, {"text", {{"format", {{"type", "json_schema"}}}}}},
         "'text.format.schema' is required"},
        {{{"input", "x"}, {"temperature", "hot"}}, "'temperature' must be a number"},
        {{{"input", "x"}, {"store", 1}}, "'store' must be a boolean"},
        {{{"input", json::array()}}, "'input' holds no message"},
    };
    for (const auto &[body, why] : cases) {
        auto r = post(c, "/v1/responses", body);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << body << " " << r->body;
        EXPECT_NE(r->body.find(why), std::string::npos) << body << " " << r->body;
    }
    auto r = post(c, "/v1/responses", {{"input", "x"}, {"model", "gpt-5"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
}

TEST(Responses, TheStoreKeepsTheNewestWithinItsBounds) {
    ResponseStore store(3, 1 << 20);
    const auto entry = [](int i) {
        return ResponseStore::Entry{json{{"n", i}}, nlohmann::ordered_json::array()};
    };
    for (int i = 0; i < 5; ++i) store.put("r" + std::to_string(i), entry(i));
    EXPECT_EQ(store.size(), 3u);
    EXPECT_FALSE(store.get("r1"));
    ASSERT_TRUE(store.get("r4"));
    EXPECT_EQ(store.get("r4")->response["n"], 4);
    EXPECT_TRUE(store.erase("r2"));
    EXPECT_FALSE(store.erase("r2"));
    store.put("r5", entry(5));
    EXPECT_TRUE(store.get("r3") && store.get("r5"));
    // By bytes: an entry of ~400 bytes in a 1000-byte store keeps two.
    ResponseStore small(100, 1000);
    const std::string big(380, 'x');
    for (int i = 0; i < 4; ++i)
        small.put("b" + std::to_string(i), {json{{"t", big}}, nlohmann::ordered_json::array()});
    EXPECT_EQ(small.size(), 2u);
    EXPECT_TRUE(small.get("b3") && small.get("b2"));
    small.put("huge", {json{{"t", std::string(2000, 'y')}}, nlohmann::ordered_json::array()});
    EXPECT_FALSE(small.get("huge"));
    EXPECT_EQ(small.size(), 2u);
}

}  // namespace
}  // namespace td::server
