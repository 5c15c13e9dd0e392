// Tool calls: the reply parser for every family's syntax, the chat formatter (the model's Jinja template with
// tools and tool results; a family with the tools described), and `tandem serve` end to end: requests with
// tools, tool_choice, parallel_tool_calls, role "tool" messages, /apply-template, and the errors.
#include <algorithm>
#include <fstream>
#include <sstream>

#include "gguf/gguf.h"
#include "server/openai.h"
#include "test-server-util.h"
#include "text/chat-formatter.h"
#include "text/jinja.h"
#include "text/tool-calls.h"

namespace td::server::test_server {
namespace {

std::string read_text(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

TEST(ToolCallParse, EveryFamilysSyntax) {
    struct Case {
        const char *name;
        std::string text;
        std::string content;
        std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
    };
    const std::vector<Case> cases = {
        {"hermes",
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
         "",
         {{"get_weather", R"({"city":"Paris"})"}}},
        {"hermes, two calls after text",
         "Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": "
         "\"b\", "
         "\"arguments\": {\"x\": 1}}</tool_call>",
         "Let me check.",
         {{"a", "{}"}, {"b", R"({"x":1})"}}},
        {"llama3 json",
         "{\"name\": \"add\", \"parameters\": {\"a\": 2, \"b\": 3}}",
         "",
         {{"add", R"({"a":2,"b":3})"}}},
        {"llama3 python_tag",
         "<|python_tag|>{\"name\": \"add\", \"parameters\": {\"a\": 1}}",
         "",
         {{"add", R"({"a":1})"}}},
        {"mistral list",
         "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"q\": \"x\"}}, {\"name\": \"b\", \"arguments\": "
         "{}}]",
         "",
         {{"a", R"({"q":"x"})"}, {"b", "{}"}}},
        {"mistral args",
         "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
         "",
         {{"get_weather", R"({"city":"Oslo"})"}}},
        {"bare list", "[{\"name\": \"a\", \"arguments\": {}}]", "", {{"a", "{}"}}},
        {"openai shaped",
         "{\"tool_calls\": [{\"function\": {\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 1}\"}}]}",
         "",
         {{"a", R"({"k": 1})"}}},
        {"braces in strings",
         "<tool_call>{\"name\": \"say\", \"arguments\": {\"t\": \"}{ \\\" ]\"}}</tool_call>",
         "",
         {{"say", R"({"t":"}{ \" ]"})"}}},
        {"plain text", "Once upon a time there was a cat.", "Once upon a time there was a cat.", {}},
        {"json that is not a call", "{\"answer\": 42}", "{\"answer\": 42}", {}},
        {"broken call stays text",
         "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>",
         "<tool_call>{\"name\": \"a\", \"arguments\": {</tool_call>",
         {}},
    };
    for (const Case &c : cases) {
        const ToolCallParse p = parse_tool_calls(c.text);
        EXPECT_EQ(p.content, c.content) << c.name;
        ASSERT_EQ(p.calls.size(), c.calls.size()) << c.name;
        for (size_t i = 0; i < c.calls.size(); ++i) {
            EXPECT_EQ(p.calls[i].name, c.calls[i].first) << c.name;
            EXPECT_EQ(p.calls[i].arguments, c.calls[i].second) << c.name;
        }
    }
}

TEST(ToolCallParse, StreamingHoldsBackOnlyWhatMayBeACall) {
    EXPECT_EQ(tool_call_holdback("Hello there"), 11u);
    EXPECT_EQ(tool_call_holdback("Hello <tool"), 6u);        // may become "<tool_call>"
    EXPECT_EQ(tool_call_holdback("Hello <tools are"), 16u);  // cannot any more
    EXPECT_EQ(tool_call_holdback("Hi <tool_call>{\"na"), 3u);
    EXPECT_EQ(tool_call_holdback("  {\"name\""), 0u);  // a reply that opens with JSON
    EXPECT_EQ(tool_call_holdback("   "), 0u);          // whitespace may still be followed by "{"
    EXPECT_EQ(tool_call_holdback("x [TOOL_"), 2u);
}

TEST(ToolCallParse, StreamSplitsContentFromCalls) {
    ToolCallStream s;
    std::string shown;
    for (std::string_view piece :
         {"Let me ", "check. <tool", "_call>{\"name\": \"a\", ", "\"arguments\": {}}</tool_call>"})
        shown += s.push(piece);
    EXPECT_EQ(shown, "Let me check. ");
    ToolCallParse p = s.finish();
    EXPECT_EQ(p.content, "");
    ASSERT_EQ(p.calls.size(), 1u);
    EXPECT_EQ(p.calls[0].name, "a");
    ToolCallStream plain;
    EXPECT_EQ(plain.push("Hi <tool"), "Hi ");
    EXPECT_EQ(plain.push("s>"), "<tools>");
    EXPECT_EQ(plain.push(" {x} "), " {x} ");
    EXPECT_EQ(plain.finish().content, "");
}

// The formatter gives the model's Jinja template the chat as Hugging Face passes it: the scenario of
// tests/jinja rendered from ChatMessages equals the template rendered from the scenario's JSON (which
// test-jinja checks against python3-jinja2).
TEST(ChatFormatter, JinjaTemplateGetsToolsCallsAndResults) {
    const std::string path = test::shared_path("templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    if (!test::shared_exists("templates/Qwen-Qwen2.5-7B-Instruct.jinja"))
        GTEST_SKIP() << "no ../shared/templates";
    const std::string source = read_text(path);
    const json spec = json::parse(read_text(std::string(TD_SOURCE_DIR) + "/tests/jinja/scenarios.json"));
    const json &sc = spec["scenarios"]["tools_round_trip"];
    std::vector<ChatMessage> msgs;
    for (const json &m : sc["messages"]) {
        ChatMessage cm(m["role"], m["content"].is_null() ? "" : m["content"].get<std::string>());
        if (m.contains("tool_calls"))
            for (const json &c : m["tool_calls"])
                cm.tool_calls.push_back({c["id"], c["function"]["name"], c["function"]["arguments"].dump()});
        if (m.contains("tool_call_id")) cm.tool_call_id = m["tool_call_id"];
        if (m.contains("name")) cm.name = m["name"];
        msgs.push_back(std::move(cm));
    }
    auto f = ChatFormatter::from_jinja(source, "<s>", "</s>", false);
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto got = f->apply(msgs, spec["tools"], true);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto t = jinja::Template::parse(source);
    ASSERT_TRUE(t.ok());
    json vars = {{"messages", sc["messages"]},
                 {"tools", spec["tools"]},
                 {"add_generation_prompt", true},
                 {"bos_token", "<s>"},
                 {"eos_token", "</s>"}};
    auto want = t->render(vars);
    ASSERT_TRUE(want.ok()) << want.status().message();
    EXPECT_EQ(*got, *want);
    EXPECT_NE(got->find("<tool_call>"), std::string::npos);
    EXPECT_NE(got->find("<tool_response>"), std::string::npos);
    EXPECT_TRUE(f->is_jinja());
}

TEST(ChatFormatter, FamilyDescribesToolsInTheSystemMessage) {
    const ChatFormatter f = ChatFormatter::from_family(ChatTemplateKind::llama3);
    std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Weather?"}};
    ChatMessage call("assistant", "");
    call.tool_calls.push_back({"call_1", "get_weather", R"({"city":"Paris"})"});
    msgs.push_back(call);
    ChatMessage result("tool", "21C");
    result.tool_call_id = "call_1";
    msgs.push_back(result);
    const json tools =
        json::parse(R"([{"type":"function","function":{"name":"get_weather","parameters":{}}}])");
    auto text = f.apply(msgs, tools, true);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(
        text->rfind("<|start_header_id|>system<|end_header_id|>\n\nBe brief.\n\nTools you may call:", 0), 0u)
        << *text;
    EXPECT_NE(text->find(R"("name":"get_weather")"), std::string::npos);
    EXPECT_NE(text->find(
                  "<tool_call>\n{\"arguments\":{\"city\":\"Paris\"},\"name\":\"get_weather\"}\n</tool_call>"),
              std::string::npos)
        << *text;
    EXPECT_NE(
        text->find("<|start_header_id|>user<|end_header_id|>\n\n<tool_response>\n21C\n</tool_response>"),
        std::string::npos)
        << *text;
    // Without tools, exactly the family's text.
    const std::vector<ChatMessage> plain = {{"user", "Hi"}};
    EXPECT_EQ(*f.apply(plain, json(), true), chat_apply(ChatTemplateKind::llama3, plain, true));
}

// stories260K with a chat template written into its GGUF.
std::string with_template(const test::TempDir &dir, const std::string &template_file) {
    auto f = gguf::File::open(test::shared_path(k_model));
    EXPECT_TRUE(f.ok());
    gguf::Writer w;
    for (const auto &[key, value] : f->metadata()) w.set_value(key, value);
    w.set_string("tokenizer.chat_template", read_text(test::shared_path("templates/" + template_file)));
    for (const auto &t : f->tensors())
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
    const std::string path = dir.file("with-template.gguf");
    EXPECT_TRUE(w.write(path).ok());
    return path;
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {"type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])");

TEST(ServerTools, TheModelsJinjaTemplateRendersToolsAndResults) {
    if (!test::shared_exists("templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"))
        GTEST_SKIP() << "no ../shared/templates";
    test::TempDir dir;
    ServerOptions o;
    o.model_path = with_template(dir, "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja");
    o.n_parallel = 1;
    o.n_ctx_slot =
        2048;  // the template's tool prompt is longer than stories260K's 512 (positions work past it)
    TestServer s(o);
    EXPECT_TRUE(s.model().chat_template().is_jinja());
    httplib::Client c = s.client();
    const json messages = json::parse(R"([
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21C"}])");
    auto r = post(c, "/apply-template", {{"messages", messages}, {"tools", kTools}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string prompt = json::parse(r->body)["prompt"];
    // The template's own text: its tools block, the call and the result in its tags, the BOS it prints
    // removed (the tokenizer adds it).
    EXPECT_EQ(prompt.rfind("<|im_start|>system\nYou are a function calling AI model.", 0), 0u) << prompt;
    EXPECT_NE(prompt.find("<tools> {\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
              std::string::npos)
        << prompt;
    EXPECT_NE(prompt.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
              std::string::npos)
        << prompt;
    EXPECT_NE(prompt.find("<tool_response>\n21C\n</tool_response>"), std::string::npos) << prompt;
    EXPECT_TRUE(prompt.ends_with("<|im_start|>assistant\n")) << prompt;
    // The named call is generated (constrained) and parsed.
    r = post(c, "/v1/chat/completions",
             {{"messages", json::array({messages[0]})},
              {"tools", kTools},
              {"temperature", 0},
              {"max_tokens", 80},
              {"tool_choice", {{"type", "function"}, {"function", {{"name", "add"}}}}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls") << r->body;
    const json &call = j["choices"][0]["message"]["tool_calls"][0];
    EXPECT_EQ(call["function"]["name"], "add");
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args["a"].is_number_integer() && args["b"].is_number_integer()) << args;
}

TEST(ServerTools, TemplateErrorsAreTheTemplatesWordsAs400) {
    if (!test::shared_exists("templates/google-gemma-2-2b-it.jinja"))
        GTEST_SKIP() << "no ../shared/templates";
    test::TempDir dir;
    ServerOptions o;
    o.model_path = with_template(dir, "google-gemma-2-2b-it.jinja");
    TestServer s(o);
    httplib::Client c = s.client();
    auto r =
        post(c, "/v1/chat/completions",
             {{"messages", {{{"role", "system"}, {"content", "x"}}, {{"role", "user"}, {"content", "hi"}}}},
              {"max_tokens", 4}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_EQ(json::parse(r->body)["error"]["message"], "System role not supported") << r->body;
    // A chat the template accepts works.
    r = post(c, "/v1/chat/completions",
             {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
}

TEST(ServerTools, ToolChoiceRequiredNoneAndParallel) {
    ServerOptions o;
    o.n_ctx_slot = 1024;
    TestServer s(o);
    httplib::Client c = s.client();
    const json ask = {{{"role", "user"}, {"content", "Weather in Paris?"}}};
    // required with one tool: a call with that tool's parameters, streamed as delta.tool_calls.
    json body = {{"messages", ask},           {"tools", json::array({kTools[0]})},
                 {"tool_choice", "required"}, {"temperature", 0},
                 {"max_tokens", 80},          {"stream", true}};
    auto r = post(c, "/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    bool done = false;
    const std::vector<json> events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    std::string finish;
    EXPECT_EQ(stream_text(events, &finish), "");
    EXPECT_EQ(finish, "tool_calls");
    int n_calls = 0;
    for (const json &e : events) {
        const json &d = e["choices"][0]["delta"];
        if (!d.contains("tool_calls")) continue;
        ++n_calls;
        EXPECT_EQ(d["tool_calls"][0]["index"], 0);
        EXPECT_EQ(d["tool_calls"][0]["function"]["name"], "get_weather");
        EXPECT_TRUE(
            json::parse(d["tool_calls"][0]["function"]["arguments"].get<std::string>())["city"].is_string());
    }
    EXPECT_EQ(n_calls, 1);
    // Parameters beyond the matcher's subset (a pattern, an integer range) constrain the arguments too.
    const json forecast = json::parse(R"({"type": "function", "function": {"name": "forecast", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z][a-z]{2,10}$"},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}, "unit": {"anyOf": [{"enum": ["C", "F"]},
        {"type": "null"}]}}, "required": ["city", "days"], "additionalProperties": false}}})");
    for (int seed = 0; seed < 4; ++seed) {
        auto f = post(c, "/v1/chat/completions",
                      {{"messages", ask},
                       {"tools", json::array({forecast})},
                       {"tool_choice", "required"},
                       {"temperature", 1.0},
                       {"seed", seed},
                       {"max_tokens", 200}});
        ASSERT_TRUE(f);
        ASSERT_EQ(f->status, 200) << f->body;
        const json reply = json::parse(f->body);
        ASSERT_EQ(reply["choices"][0]["finish_reason"], "tool_calls") << f->body;
        const json &call = reply["choices"][0]["message"]["tool_calls"][0]["function"];
        EXPECT_EQ(call["name"], "forecast") << f->body;
        const json args = json::parse(call["arguments"].get<std::string>(), nullptr, false);
        ASSERT_TRUE(args.is_object()) << f->body;
        const std::string city = args.value("city", "");
        EXPECT_TRUE(city.size() >= 3 && city.size() <= 11 && city[0] >= 'A' && city[0] <= 'Z' &&
                    std::all_of(city.begin() + 1, city.end(), [](char ch) { return ch >= 'a' && ch <= 'z'; }))
            << args;
        EXPECT_TRUE(args["days"].is_number_integer() && args["days"] >= 1 && args["days"] <= 7) << args;
        if (args.contains("unit")) {
            EXPECT_TRUE(args["unit"] == "C" || args["unit"] == "F" || args["unit"].is_null()) << args;
        }
    }
    // none: the tools are not shown, the prompt is the plain chat's.
    auto with_none =
        post(c, "/apply-template", {{"messages", ask}, {"tools", kTools}, {"tool_choice", "none"}});
    auto plain = post(c, "/apply-template", {{"messages", ask}});
    ASSERT_TRUE(with_none && plain);
    EXPECT_EQ(with_none->body, plain->body);
    auto with_tools = post(c, "/apply-template", {{"messages", ask}, {"tools", kTools}});
    ASSERT_TRUE(with_tools);
    EXPECT_NE(with_tools->body.find("get_weather"), std::string::npos);
    // parallel_tool_calls false keeps the first call of a reply.
    ApiRequest req;
    req.parallel_tool_calls = false;
    const std::vector<ToolCall> two = {{"", "a", "{}"}, {"", "b", "{}"}};
    int n = 0;
    auto kept = finish_tool_calls(two, req.parallel_tool_calls, [&] { return "id" + std::to_string(n++); });
    ASSERT_EQ(kept.size(), 1u);
    EXPECT_EQ(kept[0].name, "a");
    EXPECT_EQ(kept[0].id, "id0");
    req.parallel_tool_calls = true;
    EXPECT_EQ(finish_tool_calls(two, req.parallel_tool_calls, [&] { return std::string("x"); }).size(), 2u);
}

TEST(ServerTools, BadToolRequestsAre400sNamingTheField) {
    TestServer s;
    httplib::Client c = s.client();
    const json ask = {{{"role", "user"}, {"content", "hi"}}};
    const std::vector<std::pair<json, std::string>> bad = {
        {{{"tools", "get_weather"}}, "'tools' must be an array"},
        {{{"tools", {{{"type", "function"}, {"function", {{"name", "has space"}}}}}}},
         "'tools[0].function.name'"},
        {{{"tools", {{{"type", "retrieval"}}}}}, "'tools[0].type'"},
        {{{"tools", {kTools[0], kTools[0]}}}, "twice"},
        {{{"tools", kTools}, {"tool_choice", "sometimes"}}, "'tool_choice'"},
        {{{"tools", kTools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
         "'nope'"},
        {{{"tool_choice", "required"}}, "'tools' is empty"},
        {{{"tools", kTools}, {"tool_choice", "required"}, {"response_format", {{"type", "json_object"}}}},
         "cannot be combined"},
        {{{"messages", {{{"role", "assistant"}, {"tool_calls", "x"}}}}}, "'messages[0].tool_calls'"},
        {{{"messages", {{{"role", "tool"}, {"content", "1"}, {"tool_call_id", 5}}}}},
         "'messages[0].tool_call_id'"},
    };
    for (const auto &[fields, needle] : bad) {
        json body = {{"messages", ask}, {"max_tokens", 2}};
        for (const auto &[k, v] : fields.items()) body[k] = v;
        auto r = post(c, "/v1/chat/completions", body);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << body.dump() << " -> " << r->body;
        EXPECT_NE(r->body.find(needle), std::string::npos) << body.dump() << " -> " << r->body;
    }
}

}  // namespace
}  // namespace td::server::test_server
