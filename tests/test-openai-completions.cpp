// OpenAI's legacy completions' own fields (parse_openai_completion): echo (whole and streamed, text and token
// prompts, with n and a batch of prompts), echo with logprobs (the prompt's tokens scored, on one machine, a
// pipeline and --tp 2) and max_tokens 0, and the ones refused: best_of other than n, suffix with a scored
// prompt.
// suffix is tested with a FIM model in test-infill.cpp.
#include <gtest/gtest.h>

#include <cmath>

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

class EchoLogprobs : public ::testing::TestWithParam<Backend> {};

// The choice's logprobs with its scored prompt: (token, logprob or NaN, top alternatives).
struct Scored {
    std::vector<std::string> tokens;
    std::vector<double> logprobs;
    std::vector<json> tops;
};
Scored scored(const json &logprobs) {
    Scored sc;
    EXPECT_EQ(logprobs["tokens"].size(), logprobs["token_logprobs"].size());
    EXPECT_EQ(logprobs["tokens"].size(), logprobs["top_logprobs"].size());
    for (size_t i = 0; i < logprobs["tokens"].size(); ++i) {
        sc.tokens.push_back(logprobs["tokens"][i]);
        const json &lp = logprobs["token_logprobs"][i];
        sc.logprobs.push_back(lp.is_null() ? std::nan("") : lp.get<double>());
        sc.tops.push_back(logprobs["top_logprobs"][i]);
    }
    return sc;
}

// echo with logprobs lists the prompt's tokens first, the first with null, each other with its
// log-probability given the tokens before it: a score row's. A generated token's log-probability comes from a
// sampled row; the same tokens sent back as a prompt get the same values from score rows. max_tokens 0 scores
// the prompt alone. The stream brings the same values, the echoed text with them.
TEST_P(EchoLogprobs, ThePromptsTokensAreScoredAsGenerationRatesThem) {
    ServerOptions o;
    o.backend = GetParam();
    TestServer s(o);
    auto c = s.client();
    auto t =
        post(c, "/tokenize", {{"content", "Once upon a time, there was a little"}, {"add_special", true}});
    ASSERT_TRUE(t);
    const json prompt = json::parse(t->body)["tokens"];
    ASSERT_GE(prompt.size(), 5u);
    const size_t n_prompt = prompt.size();
    const int n_gen = 6;
    const json generated = post_ok(
        c, {{"prompt", prompt}, {"max_tokens", n_gen}, {"temperature", 0}, {"logprobs", 3}, {"echo", true}});
    ASSERT_EQ(generated["usage"]["completion_tokens"], n_gen);
    ASSERT_EQ(generated["usage"]["prompt_tokens"], n_prompt);
    const Scored g = scored(generated["choices"][0]["logprobs"]);
    ASSERT_EQ(g.tokens.size(), n_prompt + n_gen);
    EXPECT_TRUE(std::isnan(g.logprobs[0]));
    EXPECT_TRUE(g.tops[0].is_null());
    for (size_t i = 1; i < g.tokens.size(); ++i) {
        EXPECT_LE(g.logprobs[i], 0.0) << i;
        ASSERT_EQ(g.tops[i].size(), 3u) << i;
        double best = -1e30;
        for (const auto &[piece, lp] : g.tops[i].items()) best = std::max(best, lp.get<double>());
        EXPECT_GE(best, g.logprobs[i] - 1e-6) << i;
        // Greedy: each generated token is the most likely one.
        if (i >= n_prompt) {
            EXPECT_NEAR(best, g.logprobs[i], 1e-6) << i;
        }
    }

    // The prompt and what it generated (its ids from llama-server's /completion, the same greedy reply),
    // sent back as tokens and scored alone.
    auto lc = post(c, "/completion",
                   {{"prompt", prompt}, {"n_predict", n_gen}, {"temperature", 0}, {"n_probs", 1}});
    ASSERT_TRUE(lc);
    ASSERT_EQ(lc->status, 200) << lc->body;
    json whole = prompt;
    const json reply = json::parse(lc->body);
    for (const json &p : reply["completion_probabilities"]) whole.push_back(p["id"]);
    ASSERT_EQ(whole.size(), n_prompt + n_gen) << lc->body;
    const auto generated_total = [&] {
        auto m = c.Get("/metrics");
        return m ? metric(m->body, "tandem_generated_tokens_total") : -1;
    };
    const int64_t before = generated_total();
    const json only = post_ok(c, {{"prompt", whole}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 3}});
    EXPECT_EQ(only["usage"]["completion_tokens"], 0);
    EXPECT_EQ(generated_total(), before);  // nothing was generated
    EXPECT_EQ(only["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(only["choices"][0]["text"], generated["choices"][0]["text"]);
    const Scored o2 = scored(only["choices"][0]["logprobs"]);
    ASSERT_EQ(o2.tokens, g.tokens);
    for (size_t i = 1; i < g.tokens.size(); ++i) {
        EXPECT_NEAR(o2.logprobs[i], g.logprobs[i], 1e-4) << i;
        EXPECT_EQ(o2.tops[i].size(), 3u) << i;
    }

    // Streamed: the echoed text comes with the prompt's logprobs, then the generated tokens' own.
    auto r = post(c, "/v1/completions",
                  {{"prompt", prompt},
                   {"max_tokens", n_gen},
                   {"temperature", 0},
                   {"logprobs", 3},
                   {"echo", true},
                   {"stream", true}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    bool done = false;
    const std::vector<json> events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    EXPECT_EQ(stream_text(events, nullptr, 0), generated["choices"][0]["text"]);
    std::vector<double> streamed;
    for (const json &ev : events) {
        if (!ev.contains("choices") || ev["choices"].empty()) continue;
        const json &lp = ev["choices"][0]["logprobs"];
        if (lp.is_null()) continue;
        for (const json &v : lp["token_logprobs"])
            streamed.push_back(v.is_null() ? std::nan("") : v.get<double>());
    }
    ASSERT_EQ(streamed.size(), g.logprobs.size());
    EXPECT_TRUE(std::isnan(streamed[0]));
    for (size_t i = 1; i < streamed.size(); ++i) EXPECT_NEAR(streamed[i], g.logprobs[i], 1e-4) << i;
}

INSTANTIATE_TEST_SUITE_P(Backends, EchoLogprobs,
                         ::testing::Values(Backend::local, Backend::cluster, Backend::tp),
                         [](const auto &info) { return backend_test_name(info.param); });

TEST(OpenAiCompletions, WhatIsNotComputedIsRefused) {
    TestServer s;
    auto c = s.client();
    const std::vector<std::pair<json, std::string>> cases = {
        {{{"prompt", "x"}, {"echo", true}, {"logprobs", 1}, {"suffix", "y"}}, "'suffix' cannot be used"},
        {{{"prompt", "x"}, {"max_tokens", 0}}, "'max_tokens' must be at least 1"},
        {{{"prompt", "x"}, {"echo", true}, {"logprobs", 21}}, "'logprobs' must be in [0, 20]"},
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
