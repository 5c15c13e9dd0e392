// Ollama's API (server/ollama.*, http-ollama.cpp): the parsers on their own, then the endpoints of a real
// server in this process (stories260K) against what its OpenAI endpoints answer for the same request.
// tests/node/ollama-client.mjs runs the official `ollama` library against `tandem serve` too.
#include "server/ollama.h"
#include "test-server-util.h"

namespace td::server {
namespace {

using namespace test_server;

// ---- parsing ------------------------------------------------------------------------------------------

TEST(OllamaParse, ChatTakesMessagesOptionsAndStreamsByDefault) {
    auto r = parse_ollama_chat(
        R"({"model": "stories:latest", "messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"}], "options": {"temperature": 0.2, "top_k": 7, "top_p": 0.5, "min_p": 0.1,
        "typical_p": 0.7, "seed": 9, "num_predict": 12, "stop": ["\n\n", "END"], "repeat_penalty": 1.3,
        "repeat_last_n": -1, "mirostat": 2, "mirostat_tau": 4.0, "mirostat_eta": 0.2,
        "num_ctx": 8192, "num_thread": 4}, "keep_alive": "5m"})");
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->kind, ApiKind::chat);
    EXPECT_EQ(r->model, "stories:latest");
    ASSERT_EQ(r->messages.size(), 2u);
    EXPECT_EQ(r->messages[1].content, "Hi");
    EXPECT_TRUE(r->stream);
    EXPECT_EQ(r->sampling.temperature, 0.2f);
    EXPECT_EQ(r->sampling.top_k, 7);
    EXPECT_EQ(r->sampling.top_p, 0.5f);
    EXPECT_EQ(r->sampling.min_p, 0.1f);
    EXPECT_EQ(r->sampling.typical_p, 0.7f);
    EXPECT_EQ(r->sampling.seed, 9u);
    EXPECT_EQ(r->sampling.repeat_penalty, 1.3f);
    EXPECT_EQ(r->sampling.repeat_last_n, -1);
    EXPECT_EQ(r->sampling.mirostat, 2);
    EXPECT_EQ(r->sampling.mirostat_tau, 4.0f);
    EXPECT_EQ(r->sampling.mirostat_eta, 0.2f);
    EXPECT_EQ(r->max_tokens, 12);
    EXPECT_EQ(r->stop, (std::vector<std::string>{"\n\n", "END"}));
}

TEST(OllamaParse, DefaultsAreOllamas) {
    auto r = parse_ollama_chat(
        R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": false})");
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->stream);
    EXPECT_EQ(r->sampling.temperature, 0.8f);
    EXPECT_EQ(r->sampling.top_k, 40);
    EXPECT_EQ(r->sampling.top_p, 0.9f);
    EXPECT_EQ(r->sampling.min_p, 0.0f);
    EXPECT_EQ(r->sampling.repeat_penalty, 1.1f);
    EXPECT_EQ(r->sampling.repeat_last_n, 64);
    EXPECT_EQ(r->sampling.seed, SamplerParams::seed_random);
    EXPECT_EQ(r->max_tokens, -1);
    auto all = parse_ollama_chat(
        R"({"messages": [{"role": "user", "content": "x"}], "options": {"num_predict": -2}})");
    ASSERT_TRUE(all.ok());
    EXPECT_EQ(all->max_tokens, -1);
}

TEST(OllamaParse, GenerateUsesTheTemplateUnlessRawOrThereIsNone) {
    const std::string body = R"({"model": "m", "prompt": "Why?", "system": "Be brief."})";
    auto t = parse_ollama_generate(body, /*use_template=*/true);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->kind, ApiKind::chat);
    ASSERT_EQ(t->messages.size(), 2u);
    EXPECT_EQ(t->messages[0].role, "system");
    EXPECT_EQ(t->messages[1].role, "user");
    EXPECT_EQ(t->messages[1].content, "Why?");
    auto plain = parse_ollama_generate(body, /*use_template=*/false);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(plain->kind, ApiKind::completion);
    ASSERT_EQ(plain->prompts.size(), 1u);
    EXPECT_EQ(plain->prompts[0].text, "Be brief.\n\nWhy?");
    auto raw = parse_ollama_generate(R"({"prompt": "Why?", "raw": true})", true);
    ASSERT_TRUE(raw.ok());
    EXPECT_EQ(raw->kind, ApiKind::completion);
    ASSERT_EQ(raw->prompts.size(), 1u);
    EXPECT_EQ(raw->prompts[0].text, "Why?");
    auto load = parse_ollama_generate(R"({"model": "m"})", true);  // Ollama's "load the model"
    ASSERT_TRUE(load.ok());
    EXPECT_EQ(load->kind, ApiKind::completion);
    EXPECT_TRUE(load->prompts.empty());
}

TEST(OllamaParse, WhatIsNotSupportedIsNamed) {
    const auto error = [](const std::string &body) {
        auto r = parse_ollama_chat(body);
        return r.ok() ? std::string() : r.status().message();
    };
    const std::string m = R"("messages": [{"role": "user", "content": "x"}])";
    EXPECT_EQ(error("{" + m + R"(, "format": "json"})"), "");
    EXPECT_EQ(error("{" + m + R"(, "format": {"type": "object"}})"), "");
    EXPECT_NE(error("{" + m + R"(, "format": "yaml"})").find("'format'"), std::string::npos);
    // a schema beyond the byte-level matcher's subset is a grammar; one beyond the grammar's is refused
    EXPECT_EQ(error("{" + m + R"(, "format": {"type": "object", "properties": {"a": {"pattern": "x"}}}})"),
              "");
    EXPECT_NE(
        error("{" + m + R"(, "format": {"type": "object", "properties": {"a": {"not": {}}}}})").find("'not'"),
        std::string::npos);
    EXPECT_EQ(error("{" + m + R"(, "format": ""})"), "");
    EXPECT_NE(error("{" + m + R"(, "tools": [{"type": "function"}]})").find("'tools[0].function'"),
              std::string::npos);
    EXPECT_EQ(error("{" + m + R"(, "tools": []})"), "");
    EXPECT_EQ(error("{" + m + R"(, "tools": [{"type": "function", "function": {"name": "f"}}]})"), "");
    // Tool calls (arguments an object, as Ollama sends them) and results.
    auto chat = parse_ollama_chat(R"({"messages": [{"role": "user", "content": "x"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
        {"role": "tool", "content": "2", "tool_name": "f"}]})");
    ASSERT_TRUE(chat.ok()) << chat.status().message();
    ASSERT_EQ(chat->messages[1].tool_calls.size(), 1u);
    EXPECT_EQ(chat->messages[1].tool_calls[0].name, "f");
    EXPECT_EQ(chat->messages[1].tool_calls[0].arguments, R"({"a":1})");
    EXPECT_EQ(chat->messages[2].name, "f");
    EXPECT_NE(error(R"({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})").find("images"),
              std::string::npos);
    EXPECT_NE(error("{" + m + R"(, "options": {"mirostat": 3}})").find("'options.mirostat' must be 0"),
              std::string::npos);
    EXPECT_NE(error("{" + m + R"(, "options": {"mirostat": 2, "mirostat_eta": -1}})").find("mirostat_eta"),
              std::string::npos);
    EXPECT_EQ(error("{" + m + R"(, "options": {"mirostat": 0, "typical_p": 1.0}})"), "");
    EXPECT_NE(error("{" + m + R"(, "options": {"tfs_z": 0.5}})").find("'options.tfs_z'"), std::string::npos);
    EXPECT_NE(error("{" + m + R"(, "options": {"typical_p": 1.5}})").find("typical_p"), std::string::npos);
    EXPECT_NE(
        error("{" + m + R"(, "options": {"temperature": "hot"}})").find("'temperature' must be a number"),
        std::string::npos);
    EXPECT_NE(error("{" + m + R"(, "options": {"num_predict": 0}})").find("num_predict"), std::string::npos);
    EXPECT_NE(error("{" + m + R"(, "options": {"top_p": 1.5}})").find("top_p"), std::string::npos);
    EXPECT_NE(error("{" + m + R"(, "options": 3})").find("'options' must be an object"), std::string::npos);
    EXPECT_NE(error(R"({"messages": [{"role": "user", "content": ["x"]}]})").find("content"),
              std::string::npos);
    EXPECT_NE(error(R"({"messages": []})").find("at least one"), std::string::npos);
    EXPECT_NE(error("not json").find("not valid JSON"), std::string::npos);
    // A suffix fills in the middle: the prompt is the prefix, no template (server/infill.h).
    auto g = parse_ollama_generate(R"({"prompt": "x", "suffix": "y", "system": "s"})", true);
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_EQ(g->kind, ApiKind::completion);
    ASSERT_TRUE(g->infill);
    EXPECT_EQ(g->infill->prefix, "x");
    EXPECT_EQ(g->infill->suffix, "y");
    auto bad = parse_ollama_generate(R"({"prompt": "x", "suffix": 3})", false);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("'suffix' must be a string"), std::string::npos);
}

TEST(OllamaParse, ModelNamesWithTags) {
    EXPECT_TRUE(ollama_model_matches("", "stories"));
    EXPECT_TRUE(ollama_model_matches("stories", "stories"));
    EXPECT_TRUE(ollama_model_matches("stories:latest", "stories"));
    EXPECT_TRUE(ollama_model_matches("stories:q8", "stories"));
    EXPECT_FALSE(ollama_model_matches("llama3:8b", "stories"));
    EXPECT_FALSE(ollama_model_matches("storiesx", "stories"));
    auto show = parse_ollama_show(R"({"name": "stories:latest"})");
    ASSERT_TRUE(show.ok());
    EXPECT_EQ(*show, "stories:latest");
}

TEST(OllamaParse, Rfc3339) {
    EXPECT_EQ(rfc3339(int64_t(1700000000) * 1000000000 + 123456789), "2023-11-14T22:13:20.123456789Z");
}

// ---- endpoints ----------------------------------------------------------------------------------------

class OllamaServer : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    }
};

// The lines of an NDJSON body, each parsed.
std::vector<json> ndjson(const std::string &body) {
    std::vector<json> out;
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t end = body.find('\n', pos);
        EXPECT_NE(end, std::string::npos) << "a line without its newline: " << body.substr(pos);
        if (end == std::string::npos) break;
        out.push_back(json::parse(body.substr(pos, end - pos)));
        pos = end + 1;
    }
    return out;
}

TEST_F(OllamaServer, GenerateIsTheCompletionStreamedOrNot) {
    TestServer s;
    auto c = s.client();
    const std::string openai =
        completion_text(c, {{"prompt", "Once upon a time"}, {"max_tokens", 20}, {"temperature", 0}});
    const json req = {{"model", "stories:latest"},
                      {"prompt", "Once upon a time"},
                      {"options", {{"temperature", 0}, {"num_predict", 20}}}};

    json whole_req = req;
    whole_req["stream"] = false;
    auto r = post(c, "/api/generate", whole_req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    const json whole = json::parse(r->body);
    EXPECT_EQ(whole["response"], openai);
    EXPECT_EQ(whole["model"], "stories:latest");
    EXPECT_EQ(whole["done"], true);
    EXPECT_EQ(whole["done_reason"], "length");
    EXPECT_EQ(whole["eval_count"], 20);
    EXPECT_EQ(whole["prompt_eval_count"], 5);  // BOS + "Once upon a time"
    EXPECT_GE(whole["total_duration"].get<int64_t>(),
              whole["prompt_eval_duration"].get<int64_t>() + whole["eval_duration"].get<int64_t>() - 1000);
    EXPECT_GT(whole["eval_duration"].get<int64_t>(), 0);

    r = post(c, "/api/generate", req);  // streams by default
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/x-ndjson");
    const auto lines = ndjson(r->body);
    ASSERT_GE(lines.size(), 2u);
    std::string text;
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
        EXPECT_EQ(lines[i]["done"], false);
        text += lines[i]["response"].get<std::string>();
        EXPECT_FALSE(lines[i]["created_at"].get<std::string>().empty());
    }
    EXPECT_EQ(text, openai);
    EXPECT_EQ(lines.back()["done"], true);
    EXPECT_EQ(lines.back()["response"], "");
    EXPECT_EQ(lines.back()["done_reason"], "length");
    EXPECT_EQ(lines.back()["eval_count"], 20);
}

TEST_F(OllamaServer, ChatIsTheChatCompletionStreamedOrNot) {
    TestServer s;
    auto c = s.client();
    const json messages = json::array({{{"role", "system"}, {"content", "You tell stories."}},
                                       {{"role", "user"}, {"content", "A story about a cat."}}});
    // Ollama's default repeat penalty (1.1 over the last 64 tokens, the prompt's included, as Ollama's runner
    // feeds it) given to the OpenAI endpoint as llama-server's fields: the same draws.
    auto o = post(c, "/v1/chat/completions",
                  {{"messages", messages},
                   {"max_tokens", 16},
                   {"temperature", 0},
                   {"repeat_penalty", 1.1},
                   {"repeat_last_n", 64}});
    ASSERT_TRUE(o);
    ASSERT_EQ(o->status, 200) << o->body;
    const std::string openai = json::parse(o->body)["choices"][0]["message"]["content"];
    const json req = {
        {"model", "stories"}, {"messages", messages}, {"options", {{"temperature", 0}, {"num_predict", 16}}}};
    json whole_req = req;
    whole_req["stream"] = false;
    auto r = post(c, "/api/chat", whole_req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json whole = json::parse(r->body);
    EXPECT_EQ(whole["message"]["role"], "assistant");
    EXPECT_EQ(whole["message"]["content"], openai);
    EXPECT_EQ(whole["done"], true);
    r = post(c, "/api/chat", req);
    ASSERT_TRUE(r);
    const auto lines = ndjson(r->body);
    ASSERT_FALSE(lines.empty());
    std::string text;
    for (const json &l : lines) text += l["message"]["content"].get<std::string>();
    EXPECT_EQ(text, openai);
    EXPECT_EQ(lines.back()["done"], true);
}

TEST_F(OllamaServer, ModelListCardVersionAndLoad) {
    TestServer s;
    auto c = s.client();
    auto r = c.Get("/api/tags");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    json j = json::parse(r->body);
    ASSERT_EQ(j["models"].size(), 1u);
    const json &m = j["models"][0];
    EXPECT_EQ(m["name"], "stories:latest");
    EXPECT_EQ(m["size"], 1185376);
    EXPECT_EQ(m["details"]["format"], "gguf");
    EXPECT_EQ(m["details"]["family"], "llama");
    EXPECT_EQ(m["details"]["quantization_level"], "F32");
    EXPECT_EQ(m["details"]["parameter_size"], "293K");
    EXPECT_EQ(m["digest"].get<std::string>().rfind("xxh3:", 0), 0u);

    r = c.Get("/api/ps");
    ASSERT_TRUE(r);
    EXPECT_EQ(json::parse(r->body)["models"][0]["name"], "stories:latest");

    r = post(c, "/api/show", {{"model", "stories"}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    EXPECT_EQ(j["model_info"]["general.architecture"], "llama");
    EXPECT_EQ(j["model_info"]["llama.block_count"], 5);
    EXPECT_EQ(j["model_info"]["llama.embedding_length"], 64);
    EXPECT_EQ(j["capabilities"], json::array({"completion"}));
    r = post(c, "/api/show", {{"model", "llama3:8b"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(json::parse(r->body)["error"], "model 'llama3:8b' not found");

    r = c.Get("/api/version");
    ASSERT_TRUE(r);
    EXPECT_TRUE(json::parse(r->body)["version"].is_string());

    r = post(c, "/api/generate", {{"model", "stories"}});  // "load the model"
    ASSERT_TRUE(r);
    j = json::parse(r->body);
    EXPECT_EQ(j["done"], true);
    EXPECT_EQ(j["done_reason"], "load");
}

TEST_F(OllamaServer, ErrorsAreOllamaShaped) {
    TestServer s;
    auto c = s.client();
    auto r =
        post(c, "/api/chat", {{"model", "llama3:8b"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(json::parse(r->body), json({{"error", "model 'llama3:8b' not found"}}));
    r = post(c, "/api/chat",
             {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", {{{"type", "function"}}}}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(json::parse(r->body)["error"].get<std::string>().find("'tools[0].function'"),
              std::string::npos);
    // A prompt longer than the slot's context: 400 naming both numbers, as on OpenAI's endpoints.
    std::string long_prompt;
    for (int i = 0; i < 200; ++i) long_prompt += "Once upon a time. ";
    r = post(c, "/api/generate", {{"prompt", long_prompt}, {"stream", false}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(json::parse(r->body)["error"].get<std::string>().find("context"), std::string::npos) << r->body;
    r = c.Get("/api/chat");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
}

// A step that fails mid-stream ends the NDJSON stream with one {"error"} line, as Ollama does.
TEST_F(OllamaServer, AFailureMidStreamIsAnErrorLine) {
    std::atomic<int> fail_steps{0};
    ServerOptions o;
    o.fail_steps = &fail_steps;
    o.step_delay = std::chrono::milliseconds(5);
    TestServer s(o);
    auto c = s.client();
    std::thread fault([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        fail_steps = 1;
    });
    auto r = post(c, "/api/generate", {{"prompt", "Once upon a time"}, {"options", {{"num_predict", 200}}}});
    fault.join();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    const auto lines = ndjson(r->body);
    ASSERT_FALSE(lines.empty());
    EXPECT_GT(lines.size(), 1u);  // some tokens came first
    ASSERT_TRUE(lines.back().contains("error")) << r->body;
    EXPECT_NE(lines.back()["error"].get<std::string>().find("went away"), std::string::npos);
}

TEST_F(OllamaServer, TheApiKeyGuardsItToo) {
    ServerOptions o;
    o.api_key = "secret-key";
    TestServer s(o);
    auto c = s.client();
    auto r = c.Get("/api/tags");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = c.Get("/api/tags", {{"Authorization", "Bearer secret-key"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
}

}  // namespace
}  // namespace td::server
