// Speculative decoding by prompt lookup and with a draft model: the guesses (model/draft.h,
// model/drafter.h), the engine's check of draft rows (Batch kOutDraft: sampled only while every guess before
// held), `tandem run --draft` / `--model-draft`, and the server's on one machine, a 2-worker pipeline and
// --tp 2: the text never changes, and guesses that hold save steps.
#include <gtest/gtest.h>

#include "model/draft.h"
#include "model/drafter.h"
#include "model/engine.h"
#include "model/generate.h"
#include "model/synth.h"
#include "test-server-util.h"

namespace td {
namespace {

using namespace server::test_server;

std::vector<int32_t> draft_of(const std::vector<int32_t> &history, int32_t n, int32_t ngram_min = 2,
                              int32_t ngram_max = 4) {
    DraftParams p;
    p.ngram_min = ngram_min;
    p.ngram_max = ngram_max;
    std::vector<int32_t> out = {99};  // replaced
    lookup_draft(history, n, p, out);
    return out;
}

TEST(LookupDraft, GuessesWhatFollowedTheLatestOccurrenceOfTheLongestRecurringSuffix) {
    // [1 2 3] recurs: what followed it is 9, 7, ...
    const std::vector<int32_t> h = {1, 2, 3, 9, 7, 2, 3, 4, 1, 2, 3};
    EXPECT_EQ(draft_of(h, 2), (std::vector<int32_t>{9, 7}));
    // Looking at 2 tokens only, [2 3]'s latest earlier occurrence is followed by 4, 1.
    EXPECT_EQ(draft_of(h, 2, 2, 2), (std::vector<int32_t>{4, 1}));
    // A guess stops where the history does.
    EXPECT_EQ(draft_of({5, 6, 7, 5, 6}, 8), (std::vector<int32_t>{7, 5, 6}));
    // A run overlaps itself.
    EXPECT_EQ(draft_of({4, 4, 4, 4}, 3), (std::vector<int32_t>{4}));
}

TEST(LookupDraft, GuessesNothingWhereNoSuffixRecurs) {
    EXPECT_TRUE(draft_of({1, 2, 3, 4, 5}, 4).empty());
    EXPECT_TRUE(draft_of({1, 2, 3, 1, 2, 3}, 0).empty());  // n 0
    EXPECT_TRUE(draft_of({7}, 4).empty());
    EXPECT_TRUE(draft_of({}, 4).empty());
    // Only the last token recurs: below ngram_min 2, above 1.
    EXPECT_TRUE(draft_of({3, 8, 5, 3}, 2).empty());
    EXPECT_EQ(draft_of({3, 8, 5, 3}, 2, 1, 4), (std::vector<int32_t>{8, 5}));
}

struct Engine1 {
    ThreadPool pool{1};
    std::unique_ptr<LocalEngine> engine;
    Engine1() {
        auto m = Model::load(test::shared_path(k_model));
        EXPECT_TRUE(m.ok());
        ContextParams cp;
        cp.n_ctx = 256;
        cp.n_seq = 2;
        auto e = LocalEngine::create(std::move(m).value(), cp, pool);
        EXPECT_TRUE(e.ok());
        engine = std::move(e).value();
    }
    std::vector<StepOutput> step(const Batch &b) {
        EXPECT_TRUE(engine->submit(b).ok());
        auto r = engine->wait();
        EXPECT_TRUE(r.ok()) << r.status().message();
        return r.ok() ? *r : std::vector<StepOutput>{};
    }
};

const std::vector<int32_t> k_prompt = {1, 403, 407, 338, 401, 396, 385, 403};

SamplerParams seeded() {
    SamplerParams sp;
    sp.temperature = 0.9f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.repeat_penalty = 1.2f;  // the history each draw sees matters
    sp.seed = 11;
    return sp;
}

// A sequence's tokens one step each, then again with guesses: right ones (the tokens themselves), wrong ones,
// and right ones followed by a wrong one. The tokens drawn are the same, a guess is sampled only while the
// ones before it held, and the positions of failed guesses are written again.
TEST(DraftRows, TheSamplerDrawsForTheTokensTheSequenceKeepsAsWithoutGuesses) {
    constexpr int kTokens = 40;
    std::vector<int32_t> want;
    {
        Engine1 e;
        ASSERT_TRUE(e.engine->seq_start(0, seeded()).ok());
        Batch b;
        for (size_t i = 0; i < k_prompt.size(); ++i)
            b.add(k_prompt[i], static_cast<int32_t>(i), 0, i + 1 == k_prompt.size());
        int32_t pos = static_cast<int32_t>(k_prompt.size());
        auto out = e.step(b);
        ASSERT_EQ(out.size(), 1u);
        want.push_back(out[0].token);
        while (static_cast<int>(want.size()) < kTokens) {
            b.clear();
            b.add(want.back(), pos++, 0, true);
            out = e.step(b);
            ASSERT_EQ(out.size(), 1u);
            want.push_back(out[0].token);
        }
    }
    Engine1 e;
    ASSERT_TRUE(e.engine->seq_start(0, seeded()).ok());
    Batch b;
    for (size_t i = 0; i < k_prompt.size(); ++i)
        b.add(k_prompt[i], static_cast<int32_t>(i), 0, i + 1 == k_prompt.size());
    auto out = e.step(b);
    ASSERT_EQ(out.size(), 1u);
    std::vector<int32_t> got = {out[0].token};
    int32_t pos = static_cast<int32_t>(k_prompt.size());
    int n_rejected = 0, n_accepted = 0;
    for (int step = 0; static_cast<int>(got.size()) < kTokens; ++step) {
        const size_t have = got.size();
        b.clear();
        b.add(got.back(), pos, 0, true);
        // Guesses: the true next tokens (step % 3 == 0), all wrong (1), two right then a wrong one (2).
        const int n_guess = std::min<int>(3, kTokens - static_cast<int>(have) - 1);
        for (int g = 0; g < n_guess; ++g) {
            int32_t guess = want[have + g];
            if (step % 3 == 1 || (step % 3 == 2 && g == 2)) guess = (guess + 1) % 512;
            b.add_out(guess, pos + 1 + g, 0, kOutDraft);
        }
        out = e.step(b);
        ASSERT_EQ(out.size(), static_cast<size_t>(b.size()));
        bool failed = false;
        for (size_t r = 0; r < out.size(); ++r) {
            EXPECT_EQ(out[r].seq, 0);
            if (out[r].token == StepOutput::kRejectedToken) {
                failed = true;
                ++n_rejected;
                continue;
            }
            EXPECT_FALSE(failed) << "a row after a failed guess was sampled (step " << step << ")";
            if (r > 0) ++n_accepted;
            got.push_back(out[r].token);
        }
        pos = static_cast<int32_t>(k_prompt.size()) + static_cast<int32_t>(got.size()) - 1;
    }
    EXPECT_EQ(got, want);
    EXPECT_GT(n_rejected, 5);
    EXPECT_GT(n_accepted, 10);
}

TEST(DraftRows, ADraftRowMustFollowARowOfItsSequenceThatWantsLogits) {
    Engine1 e;
    ASSERT_TRUE(e.engine->seq_start(0, SamplerParams{}).ok());
    ASSERT_TRUE(e.engine->seq_start(1, SamplerParams{}).ok());
    auto refused = [&](const Batch &b) {
        Status s = e.engine->submit(b);
        EXPECT_EQ(s.kind(), ErrorKind::invalid_input) << s.message();
        if (s.ok()) (void)e.engine->wait();
    };
    Batch b;
    b.add_out(5, 0, 0, kOutDraft);  // first row
    refused(b);
    b.clear();
    b.add(5, 0, 0, false);  // no logits before it
    b.add_out(6, 1, 0, kOutDraft);
    refused(b);
    b.clear();
    b.add(5, 0, 1, true);  // another sequence's
    b.add_out(6, 0, 0, kOutDraft);
    refused(b);
    b.clear();
    b.add_out(5, 0, 0, 4);  // no such kind
    refused(b);
    b.clear();
    b.add(5, 0, 0, true);
    b.add_out(6, 1, 0, kOutDraft);
    b.add_out(7, 2, 0, kOutDraft);
    EXPECT_EQ(e.step(b).size(), 3u);
}

std::string run_text(const std::vector<std::string> &extra, std::string *err = nullptr) {
    std::vector<std::string> args = {
        "run", "-m", test::shared_path(k_model), "-p", "Once upon a time", "-n", "150", "-t", "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    test::ProcessResult p = test::run_tandem(args);
    EXPECT_EQ(p.exit_code, 0) << p.err;
    if (err != nullptr) *err = p.err;
    return p.out;
}

// `tandem run --draft` prints the text it prints without, greedy and seeded, and says how many guesses held.
TEST(DraftRun, TheRunCommandsTextIsTheSameWithGuesses) {
    for (const std::vector<std::string> &sampling :
         {std::vector<std::string>{"--temp", "0"}, std::vector<std::string>{"--temp", "0.8", "-s", "5"}}) {
        const std::string plain = run_text(sampling);
        std::vector<std::string> with = sampling;
        with.insert(with.end(), {"--draft", "6"});
        std::string err;
        EXPECT_EQ(run_text(with, &err), plain);
        EXPECT_NE(err.find("guessed tokens accepted"), std::string::npos) << err;
    }
    test::ProcessResult p = test::run_tandem({"run", "-m", test::shared_path(k_model), "--draft", "65"});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("--draft must be"), std::string::npos) << p.err;
    p = test::run_tandem({"run", "-m", test::shared_path(k_model), "--draft-ngram", "3,2"});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("--draft-ngram"), std::string::npos) << p.err;
}

// A random-weight model with stories260K's vocabulary: a draft model whose guesses mostly fail.
std::string synth_draft(const test::TempDir &dir, const std::string &vocab_from, const std::string &name) {
    SynthParams p;
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 96;
    p.n_ctx = 256;
    p.seed = 7;
    p.vocab_from = vocab_from;
    const std::string path = dir.file(name);
    ThreadPool pool(1);
    const Status st = synth_model(p, path, pool);
    EXPECT_TRUE(st.ok()) << st.message();
    return path;
}

std::shared_ptr<const Model> load_model(const std::string &path) {
    auto m = Model::load(path);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<ModelDrafter> make_drafter(const std::string &draft_path, const Model &target,
                                           ThreadPool &pool, float p_min = 0.0f, int32_t n_seq = 2) {
    ContextParams cp;
    cp.n_ctx = 256;
    cp.n_seq = n_seq;
    auto d = ModelDrafter::create(load_model(draft_path), target, cp, p_min, pool);
    EXPECT_TRUE(d.ok()) << d.status().message();
    return d.ok() ? std::move(d).value() : nullptr;
}

struct Generated {
    std::vector<int32_t> tokens;
    GenerateStats stats;
};

Generated generate_with(Engine1 &e, const SamplerParams &sp, Drafter *drafter, int32_t n_max) {
    GenerateParams gp;
    gp.n_predict = 60;
    gp.draft.n_max = n_max;
    gp.drafter = drafter;
    Generated g;
    auto st = generate(
        *e.engine, sp, k_prompt, gp, [](int32_t) { return false; },
        [&](int32_t t, const float *) {
            g.tokens.push_back(t);
            return true;
        });
    EXPECT_TRUE(st.ok()) << st.status().message();
    if (st.ok()) g.stats = *st;
    return g;
}

// The target as its own draft model: every greedy guess is what the target draws, so every one holds and a
// step yields several tokens; the text is the text without guesses.
TEST(ModelDrafter, TheModelAsItsOwnDraftGuessesItsGreedyText) {
    Engine1 e;
    const Generated plain = generate_with(e, SamplerParams::plain_greedy(), nullptr, 0);
    ASSERT_EQ(plain.tokens.size(), 60u);
    auto drafter = make_drafter(test::shared_path(k_model), e.engine->context().model(), e.pool);
    ASSERT_NE(drafter, nullptr);
    const Generated g = generate_with(e, SamplerParams::plain_greedy(), drafter.get(), 8);
    EXPECT_EQ(g.tokens, plain.tokens);
    EXPECT_GT(g.stats.n_drafted, 30);
    EXPECT_EQ(g.stats.n_accepted, g.stats.n_drafted);
    EXPECT_LT(g.stats.n_steps, 15) << "60 tokens, guesses of up to 8 that all hold";
    // Seeded sampling: the guesses are greedy, the draws are not; some fail, the text does not change.
    const Generated seeded_plain = generate_with(e, seeded(), nullptr, 0);
    const Generated seeded_draft = generate_with(e, seeded(), drafter.get(), 8);
    EXPECT_EQ(seeded_draft.tokens, seeded_plain.tokens);
    EXPECT_GT(seeded_draft.stats.n_accepted, 0);
    EXPECT_LT(seeded_draft.stats.n_accepted, seeded_draft.stats.n_drafted);
}

// A draft model that is no good (random weights) changes nothing but the number of steps; at --draft-p-min
// 0.75 it is never sure enough to guess at all.
TEST(ModelDrafter, ABadDraftModelChangesNoTextAndAnUnsureOneGuessesNothing) {
    test::TempDir dir;
    const std::string draft = synth_draft(dir, test::shared_path(k_model), "bad-draft.gguf");
    Engine1 e;
    for (const SamplerParams &sp : {SamplerParams::plain_greedy(), seeded()}) {
        const Generated plain = generate_with(e, sp, nullptr, 0);
        auto drafter = make_drafter(draft, e.engine->context().model(), e.pool);
        ASSERT_NE(drafter, nullptr);
        const Generated g = generate_with(e, sp, drafter.get(), 4);
        EXPECT_EQ(g.tokens, plain.tokens);
        EXPECT_GT(g.stats.n_drafted, 10);
        EXPECT_LT(g.stats.n_accepted, g.stats.n_drafted / 2);
        auto unsure = make_drafter(draft, e.engine->context().model(), e.pool, 0.75f);
        const Generated u = generate_with(e, sp, unsure.get(), 4);
        EXPECT_EQ(u.tokens, plain.tokens);
        EXPECT_EQ(u.stats.n_drafted, 0);
    }
}

// A drafter keeps each slot's cache and cuts it back where a history leaves it (failed guesses, a new
// request in the slot): its guesses are always those of a fresh drafter given the same history.
TEST(ModelDrafter, GuessesDoNotDependOnWhatTheSlotHeldBefore) {
    ThreadPool pool(1);
    auto target = load_model(test::shared_path(k_model));
    ASSERT_NE(target, nullptr);
    auto kept = make_drafter(test::shared_path(k_model), *target, pool);
    ASSERT_NE(kept, nullptr);
    const std::vector<int32_t> a = {1, 403, 407, 338, 401, 396, 385, 403, 300, 301, 302, 303, 304};
    const std::vector<std::pair<int32_t, std::vector<int32_t>>> calls = {
        {0, {a.begin(), a.begin() + 8}},   // first
        {0, {a.begin(), a.begin() + 9}},   // one more token
        {0, {a.begin(), a.begin() + 9}},   // the same again
        {0, {a.begin(), a.begin() + 6}},   // shorter: failed guesses
        {1, {a.begin(), a.begin() + 12}},  // the other slot
        {0, {1, 403, 407, 5, 6}},          // a new request that shares two tokens
        {0, {7}},                          // one token
        {1, a},                            // longer again
        {0, {a.begin(), a.begin() + 10}},
    };
    std::vector<int32_t> got, want;
    for (size_t i = 0; i < calls.size(); ++i) {
        const auto &[seq, history] = calls[i];
        ASSERT_TRUE(kept->draft(seq, history, 5, got).ok());
        auto fresh = make_drafter(test::shared_path(k_model), *target, pool);
        ASSERT_TRUE(fresh->draft(seq, history, 5, want).ok());
        EXPECT_EQ(got, want) << "call " << i;
        EXPECT_EQ(got.size(), 5u) << "call " << i;
    }
    // n is cut to what the context holds: the last guess is not fed, so 256 - 250 + 1 guesses fit.
    std::vector<int32_t> longest(250, 300);
    ASSERT_TRUE(kept->draft(0, longest, 16, got).ok());
    EXPECT_EQ(got.size(), 7u);
    ASSERT_TRUE(kept->draft(0, std::vector<int32_t>(256, 300), 16, got).ok());
    EXPECT_EQ(got.size(), 1u);
    EXPECT_FALSE(kept->draft(2, a, 4, got).ok());  // no such slot
    EXPECT_TRUE(got.empty());
}

TEST(ModelDrafter, AModelWithAnotherVocabularyIsRefused) {
    test::TempDir dir;
    const std::string other =
        synth_draft(dir, test::shared_path("vocab/ggml-vocab-llama-spm.gguf"), "other.gguf");
    ThreadPool pool(1);
    auto target = load_model(test::shared_path(k_model));
    ContextParams cp;
    cp.n_ctx = 64;
    auto d = ModelDrafter::create(load_model(other), *target, cp, 0.0f, pool);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().kind(), ErrorKind::invalid_input);
    EXPECT_NE(d.status().message().find("not the same vocabulary"), std::string::npos)
        << d.status().message();
    test::ProcessResult p =
        test::run_tandem({"run", "-m", test::shared_path(k_model), "--model-draft", other});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("--model-draft"), std::string::npos) << p.err;
    EXPECT_NE(p.err.find("vocabulary"), std::string::npos) << p.err;
}

// `tandem run --model-draft` prints the text it prints without, and how many guesses held.
TEST(DraftRun, TheRunCommandsTextIsTheSameWithADraftModel) {
    test::TempDir dir;
    const std::string bad = synth_draft(dir, test::shared_path(k_model), "bad-draft.gguf");
    for (const std::vector<std::string> &sampling :
         {std::vector<std::string>{"--temp", "0"}, std::vector<std::string>{"--temp", "0.8", "-s", "5"}}) {
        const std::string plain = run_text(sampling);
        for (const std::string &draft : {test::shared_path(k_model), bad}) {
            std::vector<std::string> with = sampling;
            with.insert(with.end(), {"--model-draft", draft, "--draft-p-min", "0"});
            std::string err;
            EXPECT_EQ(run_text(with, &err), plain) << draft;
            EXPECT_NE(err.find("guessed tokens accepted"), std::string::npos) << err;
        }
    }
    test::ProcessResult p = test::run_tandem(
        {"run", "-m", test::shared_path(k_model), "--model-draft", bad, "--draft-p-min", "2"});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("--draft-p-min"), std::string::npos) << p.err;
    p = test::run_tandem({"run", "-m", test::shared_path(k_model), "--model-draft", dir.file("none.gguf")});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("--model-draft"), std::string::npos) << p.err;
}

class DraftServerTest : public ::testing::TestWithParam<Backend> {};

INSTANTIATE_TEST_SUITE_P(Backends, DraftServerTest,
                         ::testing::Values(Backend::local, Backend::cluster, Backend::tp),
                         [](const auto &info) { return backend_test_name(info.param); });

json status_server(httplib::Client &c) {
    auto r = c.Get("/status");
    EXPECT_TRUE(r && r->status == 200);
    return r ? json::parse(r->body)["server"] : json();
}

// One /completion's text (empty after a failure, which is reported); n_max < 0: the server's --draft.
std::string complete_text(httplib::Client &client, const json &sampling, int n_max, int n_predict) {
    json body = {{"prompt", "Once upon a time"}, {"n_predict", n_predict}, {"cache_prompt", false}};
    body.update(sampling);
    if (n_max >= 0) body["speculative.n_max"] = n_max;
    auto r = post(client, "/completion", body);
    EXPECT_TRUE(r);
    EXPECT_EQ(r ? r->status : 0, 200) << (r ? r->body : "");
    return r && r->status == 200 ? json::parse(r->body)["content"].get<std::string>() : std::string();
}

// Greedy, and seeded with a repeat penalty.
std::vector<json> draft_samplings() {
    return {{{"temperature", 0}}, {{"temperature", 0.8}, {"seed", 3}, {"repeat_penalty", 1.1}}};
}

// Three requests at once, each with its own guesses in the same steps, get the texts `plain` holds for their
// samplings (request k: samplings[k % 2]).
template <typename Complete>
void expect_three_at_once(TestServer &s, const std::vector<json> &samplings,
                          const std::vector<std::string> &plain, Complete complete) {
    std::vector<std::string> got(3);
    std::vector<std::thread> threads;
    for (int k = 0; k < 3; ++k)
        threads.emplace_back([&, k] {
            auto ck = s.client();
            got[k] = complete(ck, samplings[k % 2], -1);
        });
    for (auto &t : threads) t.join();
    for (int k = 0; k < 3; ++k) EXPECT_EQ(got[k], plain[k % 2]) << k;
}

// With --draft 6 the server's replies are the ones a request without guesses gets (speculative.n_max 0),
// greedy and seeded, alone and three at once; guesses held, and the steps were fewer than the tokens.
TEST_P(DraftServerTest, GuessesChangeNoTextAndHeldOnesSaveSteps) {
    ServerOptions o;
    o.backend = GetParam();
    o.draft.n_max = 6;
    TestServer s(o);
    auto c = s.client();
    auto complete = [](httplib::Client &client, const json &sampling, int n_max) {
        return complete_text(client, sampling, n_max, 160);
    };
    const std::vector<json> samplings = draft_samplings();
    std::vector<std::string> plain;
    for (const json &sp : samplings) plain.push_back(complete(c, sp, 0));
    const json before = status_server(c);
    for (size_t i = 0; i < samplings.size(); ++i) EXPECT_EQ(complete(c, samplings[i], -1), plain[i]) << i;
    const json after = status_server(c);
    const int64_t drafted = after["draft_tokens"].get<int64_t>() - before["draft_tokens"].get<int64_t>();
    const int64_t accepted =
        after["draft_tokens_accepted"].get<int64_t>() - before["draft_tokens_accepted"].get<int64_t>();
    const int64_t tokens =
        after["generated_tokens"].get<int64_t>() - before["generated_tokens"].get<int64_t>();
    const int64_t steps = after["steps"].get<int64_t>() - before["steps"].get<int64_t>();
    EXPECT_GT(accepted, 20) << drafted;
    EXPECT_LE(accepted, drafted);
    EXPECT_LT(steps + accepted / 2, tokens) << "steps " << steps << ", tokens " << tokens;
    expect_three_at_once(s, samplings, plain, complete);
    // The OpenAI endpoint takes the same field; out of range is a 400.
    auto r = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"speculative.n_max", 65}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    // /slots says so, as llama-server does for a slot that speculates.
    auto sl = c.Get("/slots");
    ASSERT_TRUE(sl);
    const json slots = json::parse(sl->body);
    ASSERT_FALSE(slots.empty());
    EXPECT_EQ(slots[0]["speculative"], true) << slots[0].dump();
    EXPECT_EQ(slots[0]["params"]["speculative.n_max"], 6) << slots[0].dump();
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_NE(m->body.find("tandem_draft_tokens_accepted_total"), std::string::npos);
}

// With --model-draft (the model itself, so greedy guesses hold) the replies are the ones without guesses,
// greedy and seeded, alone and three at once; a pipeline's and --tp 2's head runs the draft model itself.
TEST_P(DraftServerTest, ADraftModelChangesNoTextAndItsGuessesHold) {
    ServerOptions o;
    o.backend = GetParam();
    o.draft.n_max = 6;
    o.draft.model = test::shared_path(k_model);
    o.draft.p_min = 0.0f;
    TestServer s(o);
    auto c = s.client();
    auto complete = [](httplib::Client &client, const json &sampling, int n_max) {
        return complete_text(client, sampling, n_max, 120);
    };
    const std::vector<json> samplings = draft_samplings();
    std::vector<std::string> plain;
    for (const json &sp : samplings) plain.push_back(complete(c, sp, 0));
    const json before = status_server(c);
    EXPECT_EQ(complete(c, samplings[0], -1), plain[0]);
    const json greedy = status_server(c);
    const int64_t drafted = greedy["draft_tokens"].get<int64_t>() - before["draft_tokens"].get<int64_t>();
    const int64_t accepted =
        greedy["draft_tokens_accepted"].get<int64_t>() - before["draft_tokens_accepted"].get<int64_t>();
    const int64_t steps = greedy["steps"].get<int64_t>() - before["steps"].get<int64_t>();
    EXPECT_GT(drafted, 60);
    EXPECT_EQ(accepted, drafted) << "the model's own greedy guesses";
    EXPECT_LT(steps, 40) << "120 tokens";
    EXPECT_EQ(complete(c, samplings[1], -1), plain[1]);
    expect_three_at_once(s, samplings, plain, complete);
}

}  // namespace
}  // namespace td
