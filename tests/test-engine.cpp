// LocalEngine: the Engine contract that generation, the benchmark and the server rely on.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/kernels.h"
#include "model/engine.h"
#include "model/model.h"
#include "test-util.h"

namespace td {
namespace {

class EngineTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP() << "no stories260K.gguf";
        auto m = Model::load(test::shared_path("models/stories260K.gguf"));
        ASSERT_TRUE(m.ok()) << m.status().message();
        model = *m;
    }
    // An engine of n_seq slots of n_ctx positions on `pool`; null (a failed expectation) if it cannot start.
    std::unique_ptr<LocalEngine> engine(ThreadPool &pool, int32_t n_ctx, int32_t n_seq = 1) {
        ContextParams cp;
        cp.n_ctx = n_ctx;
        cp.n_seq = n_seq;
        auto e = LocalEngine::create(model, cp, pool);
        EXPECT_TRUE(e.ok()) << e.status().message();
        return e.ok() ? std::move(e).value() : nullptr;
    }
    static SamplerParams sampling(float temp, uint64_t seed) {
        SamplerParams p;
        p.temperature = temp;
        p.seed = seed;
        return p;
    }
    // Generates n tokens for one sequence alone.
    std::vector<int32_t> alone(const std::vector<int32_t> &prompt, const SamplerParams &sp, int n) {
        ThreadPool pool(1);
        auto e = engine(pool, 128);
        if (e == nullptr) return {};
        EXPECT_TRUE(e->seq_start(0, sp).ok());
        Batch b;
        for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
        std::vector<int32_t> out;
        int32_t pos = static_cast<int32_t>(prompt.size());
        for (int k = 0; k < n; ++k) {
            EXPECT_TRUE(e->submit(b).ok());
            auto r = e->wait();
            EXPECT_TRUE(r.ok());
            out.push_back(r->at(0).token);
            b.clear();
            b.add(out.back(), pos++, 0, true);
        }
        return out;
    }
    std::shared_ptr<Model> model;
};

// Sequences decoding together in one batch get exactly the tokens they get alone (sampling included).
TEST_F(EngineTest, BatchedSequencesSampleAsIfAlone) {
    const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407}, {1, 338, 401, 396}, {1, 385}};
    const std::vector<SamplerParams> params = {sampling(0.0f, 1), sampling(0.9f, 7), sampling(1.2f, 99)};
    const int n = 12;
    ThreadPool pool(2);
    auto e = engine(pool, 128, 3);
    ASSERT_NE(e, nullptr);
    Batch b;
    for (int32_t s = 0; s < 3; ++s) {
        ASSERT_TRUE(e->seq_start(s, params[s]).ok());
        for (size_t i = 0; i < prompts[s].size(); ++i)
            b.add(prompts[s][i], static_cast<int32_t>(i), s, i + 1 == prompts[s].size());
    }
    std::vector<std::vector<int32_t>> got(3);
    for (int k = 0; k < n; ++k) {
        ASSERT_TRUE(e->submit(b).ok());
        auto r = e->wait();
        ASSERT_TRUE(r.ok());
        ASSERT_EQ(r->size(), 3u);
        b.clear();
        for (const StepOutput &o : *r) {
            EXPECT_TRUE(o.logits.empty());  // not asked for
            got[o.seq].push_back(o.token);
            b.add(o.token, static_cast<int32_t>(prompts[o.seq].size() + got[o.seq].size() - 1), o.seq, true);
        }
    }
    for (int32_t s = 0; s < 3; ++s) EXPECT_EQ(got[s], alone(prompts[s], params[s], n)) << "sequence " << s;
}

// A score row rates the token that follows it: its output is that token and its log-probability (the
// log-softmax of the row's logits, as a whole-logits run gives them), with its sequence's n_probs most likely
// tokens, and the sequence's sampler neither draws nor sees it: what the sequence samples after a scored
// prompt is what it samples after the same prompt computed without outputs.
TEST_F(EngineTest, AScoreRowRatesTheNextTokenWithoutDrawing) {
    const std::vector<int32_t> prompt = {1, 403, 407, 338, 401, 396, 385, 403};
    const int32_t n = static_cast<int32_t>(prompt.size());
    const int32_t n_vocab = model->hparams().n_vocab;
    SamplerParams sp = sampling(0.9f, 5);
    sp.repeat_penalty = 1.3f;  // the sampler's history matters
    sp.n_probs = 4;
    ThreadPool pool(1);
    auto e = engine(pool, 64, 2);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->seq_start(0, sp, /*want_logits=*/true, {prompt}).ok());
    SamplerParams plain = sp;
    plain.n_probs = -1;
    ASSERT_TRUE(e->seq_start(1, plain, false, {prompt}).ok());
    Batch b;
    for (int32_t i = 0; i + 1 < n; ++i) b.add_score(prompt[i], i, 0, prompt[i + 1]);
    b.add(prompt[n - 1], n - 1, 0, true);
    for (int32_t i = 0; i < n; ++i) b.add(prompt[i], i, 1, i == n - 1);
    Status submitted = e->submit(b);
    ASSERT_TRUE(submitted.ok()) << submitted.message();
    auto r = e->wait();
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->size(), static_cast<size_t>(n + 1));
    Sampler helper(SamplerParams{}, n_vocab);
    for (int32_t i = 0; i < n; ++i) {
        const StepOutput &o = r->at(i);
        EXPECT_EQ(o.seq, 0);
        ASSERT_EQ(o.logits.size(), static_cast<size_t>(n_vocab));
        // The log-softmax, in double.
        double max = o.logits[0], sum = 0.0;
        for (float v : o.logits) max = std::max<double>(max, v);
        for (float v : o.logits) sum += std::exp(v - max);
        const int32_t rated = i + 1 < n ? prompt[i + 1] : o.token;
        if (i + 1 < n) {
            EXPECT_EQ(o.token, prompt[i + 1]) << i;
        }
        EXPECT_NEAR(o.logprob, o.logits[rated] - max - std::log(sum), 1e-5) << i;
        ASSERT_EQ(o.top.size(), 4u) << i;
        const std::vector<TokenProb> top = helper.top_logprobs(o.logits.data(), 4);
        for (size_t k = 0; k < 4; ++k) {
            EXPECT_EQ(o.top[k].id, top[k].id) << i;
            EXPECT_EQ(o.top[k].logprob, top[k].logprob) << i;
        }
    }
    // Both sequences draw the same from here on: the score rows left the sampler as it was.
    std::vector<int32_t> got[2] = {{r->at(n - 1).token}, {r->at(n).token}};
    for (int k = 0; k < 6; ++k) {
        b.clear();
        for (int32_t s = 0; s < 2; ++s) b.add(got[s].back(), n + k, s, true);
        ASSERT_TRUE(e->submit(b).ok());
        auto step = e->wait();
        ASSERT_TRUE(step.ok());
        for (int32_t s = 0; s < 2; ++s) got[s].push_back(step->at(s).token);
        EXPECT_TRUE(step->at(1).top.empty());  // n_probs -1: nothing reported
        EXPECT_EQ(step->at(0).top.size(), 4u);
    }
    EXPECT_EQ(got[0], got[1]);

    // What the engine refuses: a score row without a target, or with one outside the vocabulary, and a draft
    // row after a score row.
    for (int which = 0; which < 3; ++which) {
        ASSERT_TRUE(e->seq_clear(0).ok());
        b.clear();
        if (which == 0) b.add_out(prompt[0], 0, 0, kOutScore);
        if (which == 1) b.add_score(prompt[0], 0, 0, n_vocab);
        if (which == 2) {
            b.add_score(prompt[0], 0, 0, prompt[1]);
            b.add_out(prompt[1], 1, 0, kOutDraft);
        }
        Status bad = e->submit(b);
        ASSERT_FALSE(bad.ok()) << which;
        EXPECT_EQ(bad.kind(), ErrorKind::invalid_input) << which;
    }
}

// seq_start with keep_from: a slot starts from another slot's first positions, copied, and samples exactly
// what it samples after computing them itself; the source slot goes on unchanged.
// A row that wants an embedding gets the final-normed hidden state: the very vector the output head turns
// into that position's logits. Each row's embedding is what a prompt ending there gives alone, a sequence
// that was never started (no sampler) may ask for them, and rows of both kinds share a step.
TEST_F(EngineTest, AnEmbeddingRowIsTheNormedHiddenStateTheLogitsComeFrom) {
    const std::vector<int32_t> prompt = {1, 403, 407, 338, 401, 396, 385, 403};
    const int32_t n = static_cast<int32_t>(prompt.size());
    const int32_t n_embd = model->hparams().n_embd;
    ThreadPool pool(1);
    auto e = engine(pool, 64, 2);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->seq_start(0, sampling(0.0f, 1), /*want_logits=*/true).ok());
    Batch b;
    for (int32_t i = 0; i < n; ++i) b.add(prompt[i], i, 0, i == n - 1);
    for (int32_t i = 0; i < n; ++i) b.add_out(prompt[i], i, 1, kOutEmbedding);  // slot 1: never started
    ASSERT_TRUE(e->submit(b).ok());
    auto r = e->wait();
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->size(), static_cast<size_t>(n + 1));
    const StepOutput &sampled = r->at(0);
    EXPECT_EQ(sampled.seq, 0);
    EXPECT_GE(sampled.token, 0);
    EXPECT_TRUE(sampled.embedding.empty());
    ASSERT_EQ(sampled.logits.size(), static_cast<size_t>(model->hparams().n_vocab));
    for (int32_t i = 0; i < n; ++i) {
        const StepOutput &o = r->at(1 + i);
        EXPECT_EQ(o.seq, 1);
        EXPECT_EQ(o.token, StepOutput::kEmbeddingToken);
        ASSERT_EQ(o.embedding.size(), static_cast<size_t>(n_embd));
    }
    // The output head over the last row's embedding gives that position's logits, bit for bit.
    std::vector<float> logits(static_cast<size_t>(model->hparams().n_vocab));
    std::vector<uint8_t> scratch;
    kernels::matmul(model->output(), r->at(n).embedding.data(), logits.data(), 1, pool, scratch);
    EXPECT_EQ(logits, sampled.logits);
    // Not the raw residual stream: the final norm makes its mean square 1 before the norm's weights, so the
    // vectors differ from row to row but none is zero.
    EXPECT_NE(r->at(1).embedding, r->at(2).embedding);
    // Row k's embedding is what a prompt of k + 1 tokens gives alone.
    for (int32_t k : {0, 3, n - 1}) {
        ASSERT_TRUE(e->seq_clear(1).ok());
        b.clear();
        for (int32_t i = 0; i <= k; ++i) b.add_out(prompt[i], i, 1, i == k ? kOutEmbedding : kOutNone);
        ASSERT_TRUE(e->submit(b).ok());
        auto alone = e->wait();
        ASSERT_TRUE(alone.ok());
        ASSERT_EQ(alone->size(), 1u);
        EXPECT_EQ(alone->at(0).embedding, r->at(1 + k).embedding) << "row " << k;
    }
    // An output kind the engine does not know is refused.
    b.clear();
    b.add_out(prompt[0], 0, 1, 3);
    ASSERT_TRUE(e->seq_clear(1).ok());
    auto bad = e->submit(b);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.kind(), ErrorKind::invalid_input);
}

TEST_F(EngineTest, ASlotStartedFromAnotherSlotsPositionsSamplesAsIfItComputedThem) {
    const std::vector<int32_t> prompt = {1, 403, 407, 338, 401, 396, 385, 403};
    const int n = 10;
    ThreadPool pool(1);
    auto e = engine(pool, 128, 3);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->seq_start(0, sampling(0.0f, 1)).ok());
    Batch b;
    for (size_t i = 0; i < prompt.size(); ++i)
        b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
    ASSERT_TRUE(e->submit(b).ok());
    auto first = e->wait();
    ASSERT_TRUE(first.ok());
    const int32_t keep = static_cast<int32_t>(prompt.size()) - 1;
    // Slot 2 held something else before: the copy replaces it.
    ASSERT_TRUE(e->seq_start(2, sampling(0.9f, 5)).ok());
    b.clear();
    for (int32_t i = 0; i < 20; ++i) b.add(338, i, 2, false);
    ASSERT_TRUE(e->submit(b).ok() && e->wait().ok());
    ASSERT_TRUE(e->seq_start(2, sampling(0.9f, 5), false, {}, keep, 0).ok());
    EXPECT_EQ(e->seq_cached(2), keep);
    EXPECT_EQ(e->seq_cached(0), static_cast<int32_t>(prompt.size()));
    std::vector<int32_t> got0 = {first->at(0).token}, got2;
    b.clear();
    b.add(prompt.back(), keep, 2, true);
    b.add(got0.back(), static_cast<int32_t>(prompt.size()), 0, true);
    for (int k = 0; k < n; ++k) {
        ASSERT_TRUE(e->submit(b).ok());
        auto r = e->wait();
        ASSERT_TRUE(r.ok());
        b.clear();
        for (const StepOutput &o : *r) {
            auto &got = o.seq == 0 ? got0 : got2;
            got.push_back(o.token);
            b.add(o.token, static_cast<int32_t>(prompt.size() + got.size() - 1), o.seq, true);
        }
    }
    got0.resize(n);
    EXPECT_EQ(got0, alone(prompt, sampling(0.0f, 1), n));
    EXPECT_EQ(got2, alone(prompt, sampling(0.9f, 5), n));
    // Out of range, or more than the source holds: errors, and the slot is unchanged.
    EXPECT_FALSE(e->seq_start(1, sampling(0, 1), false, {}, 1, 3).ok());
    EXPECT_FALSE(e->seq_start(1, sampling(0, 1), false, {}, 1, -2).ok());
    const Status more = e->seq_start(1, sampling(0, 1), false, {}, e->seq_cached(0) + 1, 0);
    EXPECT_NE(more.message().find("sequence 0 holds"), std::string::npos) << more.message();
    EXPECT_EQ(e->seq_cached(1), 0);
}

TEST_F(EngineTest, ContractViolationsAreErrors) {
    ThreadPool pool(1);
    auto e = engine(pool, 32);
    ASSERT_NE(e, nullptr);
    EXPECT_FALSE(e->wait().ok());                        // nothing queued
    EXPECT_FALSE(e->seq_start(3, sampling(0, 1)).ok());  // slot out of range
    SamplerParams bad = sampling(0.5f, 1);
    bad.top_p = 2.0f;
    EXPECT_FALSE(e->seq_start(0, bad).ok());  // invalid sampling
    SamplerParams biased = sampling(0.5f, 1);
    biased.logit_bias = {{model->hparams().n_vocab, 1.0f}};
    EXPECT_FALSE(e->seq_start(0, biased).ok());  // a bias outside the vocabulary
    Batch b;
    b.add(1, 0, 0, true);
    EXPECT_FALSE(e->submit(b).ok());  // wants logits, never started
    ASSERT_TRUE(e->seq_start(0, sampling(0, 1), true).ok());
    ASSERT_TRUE(e->submit(b).ok());
    EXPECT_FALSE(e->submit(b).ok());  // one step at a time
    auto r = e->wait();
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ(r->at(0).logits.size(), 512u);                         // asked for
    EXPECT_LE(r->at(0).logprob, 0.0f);
}

}  // namespace
}  // namespace td
