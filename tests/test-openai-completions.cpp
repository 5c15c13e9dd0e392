// OpenAI's legacy completions' own fields (parse_openai_completion): echo (whole and streamed, text and token
// prompts, with n and a batch of prompts), and the ones refused: echo with logprobs, best_of other than n.
// suffix is tested with a FIM model in test-infill.cpp.
#include <gtest/gtest.h>

#include "test-server-util.h"

namespace td::server {
namespace {

using namespace test_server;

json post_ok(httplib::Client &c, const json &body) {
    auto r = post(c, "/v1/completions", body);
    EXPECT_TRUE(r);
    if (!r) return {};
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body, nullptr, false);
}

TEST(OpenAiCompletions, EchoPutsEachPromptBeforeItsChoices) {
    TestServer s;
    auto c = s.client();
    const json tokens = {403, 407, 261};  // " Once upon a"
    auto d = post(c, "/detokenize", {{"tokens", tokens}});
    ASSERT_TRUE(d);
    const std::string token_text = json::parse(d->body)["content"];
    ASSERT_FALSE(token_text.empty());
    const json base = {{"prompt", {"Once upon a time", tokens}},
                       {"n", 2},
                       {"max_tokens", 8},
                       {"seed", 7},
                       {"temperature", 0.8}};
    const json plain = post_ok(c, base);
    json with_echo = base;
    with_echo["echo"] = true;
    const json echoed = post_ok(c, with_echo);
    ASSERT_EQ(plain["choices"].size(), 4u);
    ASSERT_EQ(echoed["choices"].size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
        const std::string prompt = i < 2 ? "Once upon a time" : token_text;
        EXPECT_EQ(echoed["choices"][i]["text"], prompt + plain["choices"][i]["text"].get<std::string>()) << i;
    }
    EXPECT_EQ(echoed["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]);

    // Streamed: each choice's first chunk is its prompt.
    json streamed = with_echo;
    streamed["stream"] = true;
    auto r = post(c, "/v1/completions", streamed);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    bool done = false;
    const std::vector<json> events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(stream_text(events, nullptr, i), echoed["choices"][i]["text"]) << i;
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0]["choices"][0]["text"], "Once upon a time");
}

TEST(OpenAiCompletions, WhatIsNotComputedIsRefused) {
    TestServer s;
    auto c = s.client();
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}}, "'echo' with 'logprobs'"},
        {{{"prompt", "x"}, {"best_of", 3}}, "'best_of' is not supported"},
        {{{"prompt", "x"}, {"echo", "yes"}}, "'echo' must be a boolean"},
        {{{"prompt", "x"}, {"suffix", 5}}, "'suffix' must be a string"},
        {{{"prompt", {"a", "b"}}, {"suffix", "c"}}, "'suffix' needs one prompt given as text"},
    };
    for (const auto &[body, why] : cases) {
        auto r = post(c, "/v1/completions", body);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << body;
        EXPECT_NE(r->body.find(why), std::string::npos) << body << " " << r->body;
    }
    // best_of equal to n, and an empty suffix, are what OpenAI does without them.
    const json same =
        post_ok(c, {{"prompt", "x"}, {"best_of", 2}, {"n", 2}, {"max_tokens", 2}, {"suffix", ""}});
    EXPECT_EQ(same["choices"].size(), 2u);
}

}  // namespace
}  // namespace td::server
