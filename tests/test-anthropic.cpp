// Anthropic's Messages API (server/anthropic.h) over real loopback HTTP: a message is the chat completion of
// the same conversation (greedy, so the texts are equal), its blocks become the chat's messages, the stream's
// events carry the same text and usage, tools give tool_use blocks with stop_reason tool_use, the stop
// reasons and usage are Anthropic's, count_tokens counts the prompt, the key is taken as x-api-key, and what
// it cannot do is Anthropic's error naming the field.
#include <gtest/gtest.h>

#include "server/anthropic.h"
#include "test-server-util.h"

namespace td::server {
namespace {

using namespace test_server;

json post_ok(httplib::Client &c, const std::string &path, const json &body, const httplib::Headers &h = {}) {
    auto r = post(c, path, body, h);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body, nullptr, false);
}

json chat(httplib::Client &c, const json &messages, int max_tokens, const json &extra = json::object()) {
    json body = {{"messages", messages}, {"temperature", 0}, {"max_tokens", max_tokens}};
    body.update(extra);
    return post_ok(c, "/v1/chat/completions", body);
}

std::string text_of(const json &message) {
    std::string text;
    for (const json &b : message["content"])
        if (b["type"] == "text") text += b["text"].get<std::string>();
    return text;
}

ServerOptions roomy() {
    ServerOptions o;
    o.n_ctx_slot = 1024;
    return o;
}

TEST(Anthropic, AMessageIsTheChatCompletionOfItsConversation) {
    TestServer s(roomy());
    auto c = s.client();
    const json m = post_ok(c, "/v1/messages",
                           {{"model", "stories"},
                            {"max_tokens", 24},
                            {"temperature", 0},
                            {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}});
    const json want = chat(c, {{{"role", "user"}, {"content", "Once upon a time"}}}, 24);
    EXPECT_EQ(m["type"], "message");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(m["model"], "stories");
    EXPECT_EQ(m["id"].get<std::string>().rfind("msg_", 0), 0u);
    EXPECT_EQ(text_of(m), want["choices"][0]["message"]["content"]);
    const std::string finish = want["choices"][0]["finish_reason"];
    EXPECT_EQ(m["stop_reason"], finish == "length" ? "max_tokens" : "end_turn") << m;
    EXPECT_TRUE(m["stop_sequence"].is_null());
    // Anthropic counts cached prompt tokens apart from the computed ones.
    EXPECT_EQ(m["usage"]["input_tokens"].get<int>() + m["usage"]["cache_read_input_tokens"].get<int>(),
              want["usage"]["prompt_tokens"]);
    EXPECT_EQ(m["usage"]["output_tokens"], want["usage"]["completion_tokens"]);

    // A system prompt as blocks, text blocks, an earlier tool use and its result: the chat's messages.
    const json messages = json::parse(R"([
      {"role": "user", "content": [{"type": "text", "text": "A cat"}, {"type": "text", "text": " and a dog."}]},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "x"},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"at": "tree"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a big tree"},
        {"type": "text", "text": "Go on."}]}])");
    const json chat_messages = json::parse(R"([
      {"role": "system", "content": "Tell a story."},
      {"role": "user", "content": "A cat and a dog."},
      {"role": "assistant", "content": "Let me look.", "tool_calls": [{"id": "toolu_1", "type": "function",
        "function": {"name": "look", "arguments": "{\"at\":\"tree\"}"}}]},
      {"role": "tool", "tool_call_id": "toolu_1", "content": "a big tree"},
      {"role": "user", "content": "Go on."}])");
    const json m2 = post_ok(c, "/v1/messages",
                            {{"max_tokens", 16},
                             {"temperature", 0},
                             {"system", {{{"type", "text"}, {"text", "Tell a story."}}}},
                             {"messages", messages}});
    EXPECT_EQ(text_of(m2), chat(c, chat_messages, 16)["choices"][0]["message"]["content"]);

    // count_tokens: the prompt the same request is given.
    const json counted =
        post_ok(c, "/v1/messages/count_tokens",
                {{"system", {{{"type", "text"}, {"text", "Tell a story."}}}}, {"messages", messages}});
    const json m3 = post_ok(c, "/v1/messages",
                            {{"max_tokens", 1},
                             {"system", {{{"type", "text"}, {"text", "Tell a story."}}}},
                             {"messages", messages}});
    EXPECT_EQ(counted["input_tokens"].get<int>(),
              m3["usage"]["input_tokens"].get<int>() + m3["usage"]["cache_read_input_tokens"].get<int>());
}

TEST(Anthropic, StopSequencesAreNamed) {
    TestServer s;
    auto c = s.client();
    const json ask = {{{"role", "user"}, {"content", "Once upon a time"}}};
    const std::string full =
        text_of(post_ok(c, "/v1/messages", {{"max_tokens", 40}, {"temperature", 0}, {"messages", ask}}));
    ASSERT_GE(full.size(), 20u) << full;
    // A stop sequence from the middle of that reply: the reply ends before its first occurrence.
    const std::string stop = full.substr(10, 5);
    const json m = post_ok(
        c, "/v1/messages",
        {{"max_tokens", 40}, {"temperature", 0}, {"stop_sequences", {"zzz", stop}}, {"messages", ask}});
    EXPECT_EQ(text_of(m), full.substr(0, full.find(stop))) << stop;
    EXPECT_EQ(m["stop_reason"], "stop_sequence") << m;
    EXPECT_EQ(m["stop_sequence"], stop) << m;
}

TEST(Anthropic, TheStreamCarriesTheSameTextStopReasonAndUsage) {
    TestServer s;
    auto c = s.client();
    const json body = {{"max_tokens", 20},
                       {"temperature", 0},
                       {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}}};
    const json whole = post_ok(c, "/v1/messages", body);
    json streamed = body;
    streamed["stream"] = true;
    auto r = post(c, "/v1/messages", streamed);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::vector<NamedEvent> events = parse_named_sse(r->body);
    std::vector<std::string> names;
    std::string text;
    for (const NamedEvent &e : events) {
        if (e.name == "content_block_delta") {
            EXPECT_EQ(e.data["index"], 0);
            EXPECT_EQ(e.data["delta"]["type"], "text_delta");
            text += e.data["delta"]["text"].get<std::string>();
        } else {
            names.push_back(e.name);
        }
    }
    const std::vector<std::string> want = {"message_start",      "ping",          "content_block_start",
                                           "content_block_stop", "message_delta", "message_stop"};
    EXPECT_EQ(names, want) << r->body;
    EXPECT_EQ(text, text_of(whole));
    ASSERT_GE(events.size(), 6u);
    EXPECT_EQ(events[0].data["message"]["id"].get<std::string>().rfind("msg_", 0), 0u);
    const json &delta = events[events.size() - 2].data;
    EXPECT_EQ(delta["delta"]["stop_reason"], whole["stop_reason"]);
    EXPECT_EQ(delta["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
}

const json kWeather = json::parse(R"({"name": "get_weather", "description": "Weather in a city",
  "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}})");

TEST(Anthropic, ToolsGiveToolUseBlocks) {
    TestServer s(roomy());
    auto c = s.client();
    const json body = {{"max_tokens", 80},
                       {"temperature", 0},
                       {"tools", json::array({kWeather})},
                       {"tool_choice", {{"type", "tool"}, {"name", "get_weather"}}},
                       {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}};
    const json m = post_ok(c, "/v1/messages", body);
    EXPECT_EQ(m["stop_reason"], "tool_use") << m;
    ASSERT_FALSE(m["content"].empty()) << m;
    const json &use = m["content"].back();
    EXPECT_EQ(use["type"], "tool_use");
    EXPECT_EQ(use["name"], "get_weather");
    EXPECT_EQ(use["id"].get<std::string>().rfind("toolu_", 0), 0u) << use;
    EXPECT_TRUE(use["input"]["city"].is_string()) << use;

    // The reply sent back as it came (a tool_use block alone) with the tool's result.
    const json back = post_ok(
        c, "/v1/messages",
        {{"max_tokens", 8},
         {"temperature", 0},
         {"tools", json::array({kWeather})},
         {"messages",
          {body["messages"][0],
           {{"role", "assistant"}, {"content", m["content"]}},
           {{"role", "user"},
            {"content", {{{"type", "tool_result"}, {"tool_use_id", use["id"]}, {"content", "21C"}}}}}}}});
    EXPECT_EQ(back["type"], "message") << back;

    json streamed = body;
    streamed["stream"] = true;
    auto r = post(c, "/v1/messages", streamed);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    const std::vector<NamedEvent> events = parse_named_sse(r->body);
    std::vector<std::string> names;
    for (const NamedEvent &e : events) names.push_back(e.name);
    const std::vector<std::string> want = {
        "message_start",      "ping",          "content_block_start", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"};
    ASSERT_EQ(names, want) << r->body;
    EXPECT_EQ(events[2].data["content_block"]["type"], "tool_use");
    EXPECT_EQ(events[2].data["content_block"]["input"], json::object());
    EXPECT_EQ(events[3].data["delta"]["type"], "input_json_delta");
    EXPECT_EQ(json::parse(events[3].data["delta"]["partial_json"].get<std::string>()), use["input"]);
    EXPECT_EQ(events[5].data["delta"]["stop_reason"], "tool_use");

    // any: some tool; none: text.
    json any = body;
    any["tool_choice"] = {{"type", "any"}};
    EXPECT_EQ(post_ok(c, "/v1/messages", any)["stop_reason"], "tool_use");
    json none = body;
    none["tool_choice"] = {{"type", "none"}};
    none["max_tokens"] = 8;
    const json plain = post_ok(c, "/v1/messages", none);
    EXPECT_NE(plain["stop_reason"], "tool_use");
    EXPECT_EQ(plain["content"][0]["type"], "text");
}

TEST(Anthropic, TheKeyIsTakenAsXApiKey) {
    ServerOptions o;
    o.api_key = "sekret";
    TestServer s(o);
    auto c = s.client();
    const json body = {{"max_tokens", 2}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    auto r = post(c, "/v1/messages", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = post(c, "/v1/messages", body, {{"x-api-key", "wrong"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = post(c, "/v1/messages", body, {{"x-api-key", "sekret"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    r = post(c, "/v1/chat/completions", body, {{"x-api-key", "sekret"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
}

TEST(Anthropic, WhatItCannotDoIsAnAnthropicErrorNamingTheField) {
    TestServer s;
    auto c = s.client();
    const json hi = {{{"role", "user"}, {"content", "Hi"}}};
    const std::vector<std::pair<json, std::string>> cases = {
        {json::object(), "'messages' is required"},
        {{{"messages", json::array()}}, "'messages' must be a non-empty array"},
        {{{"messages", {{{"role", "system"}, {"content", "x"}}}}},
         "'messages[0].role' must be user or assistant"},
        {{{"messages", {{{"role", "user"}, {"content", {{{"type", "image"}, {"source", "x"}}}}}}}},
         "'messages[0].content[0].type' 'image' is not supported"},
        {{{"messages", {{{"role", "user"}, {"content", {{{"type", "tool_use"}, {"id", "x"}}}}}}}},
         "'messages[0].content[0].type' 'tool_use' is not supported in a user message"},
        {{{"messages", hi}, {"tools", {{{"type", "web_search_20250305"}, {"name", "web_search"}}}}},
         "'tools[0].type' 'web_search_20250305' is not supported"},
        {{{"messages", hi}, {"tools", {{{"name", "f"}}}}}, "'tools[0].input_schema' is required"},
        {{{"messages", hi}, {"tool_choice", {{"type", "some"}}}},
         "'tool_choice.type' must be auto, any, tool"},
        {{{"messages", hi}, {"stop_sequences", "x"}}, "'stop_sequences' must be an array"},
        {{{"messages", hi}, {"temperature", "hot"}}, "'temperature' must be a number"},
        {{{"messages", hi}, {"system", 5}}, "'system' must be a string or an array of blocks"},
    };
    for (const auto &[body, why] : cases) {
        auto r = post(c, "/v1/messages", body);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << body << " " << r->body;
        const json e = json::parse(r->body, nullptr, false);
        EXPECT_EQ(e["type"], "error") << r->body;
        EXPECT_EQ(e["error"]["type"], "invalid_request_error") << r->body;
        EXPECT_NE(r->body.find(why), std::string::npos) << body << " " << r->body;
    }
    auto r = post(c, "/v1/messages", {{"model", "claude-opus-4"}, {"max_tokens", 2}, {"messages", hi}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "not_found_error");
}

}  // namespace
}  // namespace td::server
