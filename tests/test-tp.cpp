// Tensor parallelism in the forward pass: slice files, the split, the two all-reduces per layer and the
// sampling merge, run as N ranks on threads of this process with a collective over shared memory (the
// network collective is tested in test-tp-cluster.cpp). Every case compares with one machine running the
// whole model: the same greedy ids, logits within 1e-4 of the row's scale, the same seeded text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/thread-pool.h"
#include "model/collective.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tp-sample.h"
#include "model/tp-slice.h"
#include "test-tp-util.h"
#include "test-util.h"

namespace td {
namespace {

using test::greedy;
using test::seeded;

// ---- a collective for ranks that are threads of one process ----------------------------------------------

struct ThreadGroup {
    explicit ThreadGroup(int n_ranks) : n(n_ranks), parts(n_ranks), gathered(n_ranks) {}
    void barrier() {
        std::unique_lock lock(mu);
        const uint64_t g = generation;
        if (++count == n) {
            count = 0;
            ++generation;
            cv.notify_all();
        } else {
            cv.wait(lock, [&] { return generation != g; });
        }
    }
    int n;
    std::mutex mu;
    std::condition_variable cv;
    int count = 0;
    uint64_t generation = 0;
    std::vector<const float *> parts;
    std::vector<std::span<const uint8_t>> gathered;
    std::atomic<uint64_t> n_all_reduce{0};
};

class ThreadCollective : public Collective {
public:
    ThreadCollective(ThreadGroup &g, int rank) : g_(g), rank_(rank) {}
    int rank() const override { return rank_; }
    int size() const override { return g_.n; }
    Status all_reduce_sum(float *data, size_t n) override {
        g_.parts[rank_] = data;
        g_.barrier();
        sum_.assign(g_.parts[0], g_.parts[0] + n);  // ((p0 + p1) + p2) + ..., as every collective sums
        for (int r = 1; r < g_.n; ++r)
            for (size_t i = 0; i < n; ++i) sum_[i] += g_.parts[r][i];
        g_.barrier();
        std::copy(sum_.begin(), sum_.end(), data);
        if (rank_ == 0) ++g_.n_all_reduce;
        return {};
    }
    Status gather(std::span<const uint8_t> mine, std::vector<std::vector<uint8_t>> &out) override {
        g_.gathered[rank_] = mine;
        g_.barrier();
        if (rank_ == 0) {
            out.resize(g_.n);
            for (int r = 0; r < g_.n; ++r) out[r].assign(g_.gathered[r].begin(), g_.gathered[r].end());
        }
        g_.barrier();
        return {};
    }

private:
    ThreadGroup &g_;
    int rank_;
    std::vector<float> sum_;
};

// ---- one machine and a TP layout, generating the same way ---------------------------------------------------

struct Generated {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;  // [step][n_vocab] when asked for
};

Batch prompt_batch(const std::vector<int32_t> &prompt) {
    Batch b;
    for (size_t i = 0; i < prompt.size(); ++i)
        b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
    return b;
}

Generated one_machine(const std::string &path, const std::vector<int32_t> &prompt, int n_gen,
                      const SamplerParams &sp, bool want_logits) {
    Generated g;
    auto model = Model::load(path);
    EXPECT_TRUE(model.ok()) << model.status().message();
    ThreadPool pool(1);
    auto engine = LocalEngine::create(*model, {256, 1, KvType::f32, KvType::f32}, pool);
    EXPECT_TRUE(engine.ok());
    EXPECT_TRUE((*engine)->seq_start(0, sp, want_logits).ok());
    Batch b = prompt_batch(prompt);
    for (int step = 0; step < n_gen; ++step) {
        EXPECT_TRUE((*engine)->submit(b).ok());
        auto out = (*engine)->wait();
        EXPECT_TRUE(out.ok() && out->size() == 1);
        g.tokens.push_back((*out)[0].token);
        if (want_logits) g.logits.push_back((*out)[0].logits);
        const int32_t pos = b.pos.back() + 1;
        b.clear();
        b.add(g.tokens.back(), pos, 0, true);
    }
    return g;
}

// A pipeline of stages, each a tensor-parallel group over a layer range with relative node shares.
struct StageSpec {
    int32_t first = 0, last = -1;  // layers; -1: through the end
    std::vector<double> shares;
};

struct Rank {
    std::shared_ptr<Model> model;
    std::unique_ptr<ThreadPool> pool;
    std::unique_ptr<ThreadCollective> coll;
    std::unique_ptr<Context> ctx;
    std::vector<std::unique_ptr<Sampler>> samplers;
    TpOutputMerger merger;
};

struct TpLayout {
    std::vector<std::unique_ptr<ThreadGroup>> groups;  // [stage]
    std::vector<std::vector<std::unique_ptr<Rank>>> ranks;  // [stage][rank]
};

TpLayout make_layout(const std::string &path, const std::vector<StageSpec> &stages, const test::TempDir &dir) {
    TpLayout L;
    auto file = gguf::File::open(path);
    EXPECT_TRUE(file.ok());
    auto whole = Model::load(path);
    EXPECT_TRUE(whole.ok());
    const HParams &hp = (*whole)->hparams();
    for (size_t s = 0; s < stages.size(); ++s) {
        const int32_t first = stages[s].first, last = stages[s].last < 0 ? hp.n_layer : stages[s].last;
        auto slices = tp_split(hp, stages[s].shares, tp_ff_unit(*file, first, last));
        EXPECT_TRUE(slices.ok()) << slices.status().message();
        const int n = static_cast<int>(slices->size());
        L.groups.push_back(std::make_unique<ThreadGroup>(n));
        L.ranks.emplace_back();
        for (int r = 0; r < n; ++r) {
            const std::string slice_path = dir.file(fmt::format("s{}r{}.gguf", s, r));
            const Status st = tp_write_slice_file(*file, hp, first, last, (*slices)[r], slice_path);
            EXPECT_TRUE(st.ok()) << st.message();
            auto rk = std::make_unique<Rank>();
            ModelLoadOptions lo;
            lo.layer_first = first;
            lo.layer_last = last;
            auto m = Model::load(slice_path, lo);
            EXPECT_TRUE(m.ok()) << m.status().message();
            rk->model = *m;
            TpSlice want = (*slices)[r];
            if (last != hp.n_layer) want.vocab_first = 0, want.vocab_last = hp.n_vocab;  // no output head here
            EXPECT_EQ(rk->model->slice(), want);
            rk->pool = std::make_unique<ThreadPool>(1);
            rk->coll = std::make_unique<ThreadCollective>(*L.groups.back(), r);
            auto ctx =
                Context::create(rk->model, {256, 1, KvType::f32, KvType::f32}, *rk->pool, rk->coll.get());
            EXPECT_TRUE(ctx.ok()) << ctx.status().message();
            rk->ctx = std::move(*ctx);
            L.ranks.back().push_back(std::move(rk));
        }
    }
    return L;
}

Generated tensor_parallel(const std::string &path, const std::vector<StageSpec> &stages,
                          const std::vector<int32_t> &prompt, int n_gen, const SamplerParams &sp, bool want_logits,
                          uint64_t *all_reduces_per_step = nullptr) {
    test::TempDir dir;
    TpLayout L = make_layout(path, stages, dir);
    const int32_t n_vocab = L.ranks[0][0]->model->hparams().n_vocab;
    for (auto &stage : L.ranks)
        for (auto &rk : stage) rk->samplers.push_back(std::make_unique<Sampler>(sp, n_vocab));
    Generated g;
    Batch b = prompt_batch(prompt);
    std::vector<float> hidden;  // [n, n_embd] between stages
    for (int step = 0; step < n_gen; ++step) {
        const uint64_t before = L.groups.back()->n_all_reduce.load();
        std::vector<StepOutput> out0;
        for (size_t s = 0; s < L.ranks.size(); ++s) {
            std::vector<std::thread> threads;
            std::vector<Status> status(L.ranks[s].size());
            std::vector<std::vector<StepOutput>> outs(L.ranks[s].size());
            const bool last_stage = s + 1 == L.ranks.size();
            for (size_t r = 0; r < L.ranks[s].size(); ++r)
                threads.emplace_back([&, r] {
                    Rank &rk = *L.ranks[s][r];
                    status[r] = rk.ctx->decode(b, s == 0 ? nullptr : hidden.data());
                    if (!status[r].ok() || !last_stage) return;
                    std::vector<Sampler *> ptrs = {rk.samplers[0].get()};
                    status[r] = rk.merger.sample(b, rk.ctx->logits(), rk.model->slice(), n_vocab, ptrs,
                                                 {want_logits}, *rk.coll, outs[r]);
                });
            for (auto &t : threads) t.join();
            for (const Status &st : status) EXPECT_TRUE(st.ok()) << st.message();
            for (size_t r = 1; r < outs.size(); ++r) EXPECT_TRUE(outs[r].empty());
            if (!last_stage) {
                // Every rank of the group holds the same hidden state, bit for bit.
                const HParams &hp = L.ranks[s][0]->model->hparams();
                const size_t n = static_cast<size_t>(b.size()) * hp.n_embd;
                const float *h0 = L.ranks[s][0]->ctx->hidden();
                for (size_t r = 1; r < L.ranks[s].size(); ++r)
                    EXPECT_EQ(0, std::memcmp(h0, L.ranks[s][r]->ctx->hidden(), n * sizeof(float)));
                hidden.assign(h0, h0 + n);
            } else {
                out0 = std::move(outs[0]);
            }
        }
        if (all_reduces_per_step != nullptr && step > 0)
            *all_reduces_per_step = L.groups.back()->n_all_reduce.load() - before;
        EXPECT_EQ(out0.size(), 1u);
        if (out0.empty()) break;
        g.tokens.push_back(out0[0].token);
        if (want_logits) g.logits.push_back(out0[0].logits);
        const int32_t pos = b.pos.back() + 1;
        b.clear();
        b.add(g.tokens.back(), pos, 0, true);
    }
    return g;
}

// The first step where the reference's top-2 logit margin is below `margin` (n_gen when none).
size_t first_close_step(const Generated &ref, float margin) {
    for (size_t s = 0; s < ref.logits.size(); ++s) {
        std::vector<float> row = ref.logits[s];
        std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
        if (row[0] - row[1] < margin) return s;
    }
    return ref.logits.size();
}

void expect_logits_close(const Generated &ref, const Generated &got, size_t steps) {
    ASSERT_GE(got.logits.size(), steps);
    for (size_t s = 0; s < steps; ++s) {
        float scale = 0.0f;
        for (float v : ref.logits[s]) scale = std::max(scale, std::fabs(v));
        float worst = 0.0f;
        for (size_t i = 0; i < ref.logits[s].size(); ++i)
            worst = std::max(worst, std::fabs(ref.logits[s][i] - got.logits[s][i]));
        EXPECT_LE(worst, 1e-4f * scale) << "step " << s;
    }
}

const std::vector<int32_t> kStoriesPrompt = {1, 403, 407, 261, 378};  // BOS "Once upon a time"

std::string stories() {
    return test::shared_path("models/stories260K.gguf");
}

#define REQUIRE_STORIES()                                                                 \
    if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP() << "no " << stories()

// ---- the split ----------------------------------------------------------------------------------------------

TEST(TpSplit, WholeUnitsInProportionEveryRankGetsSome) {
    HParams hp;
    hp.n_head = 32;
    hp.n_head_kv = 8;
    hp.head_dim = 64;
    hp.n_ff = 5632;
    hp.n_vocab = 32000;
    auto even = tp_split(hp, {1, 1}, 32);
    ASSERT_TRUE(even.ok());
    EXPECT_EQ((*even)[0], (TpSlice{0, 4, 0, 2816, 0, 16000}));
    EXPECT_EQ((*even)[1], (TpSlice{4, 8, 2816, 5632, 16000, 32000}));
    auto three = tp_split(hp, {1, 1, 1}, 256);  // 8 KV heads over 3 nodes: 3, 3, 2
    ASSERT_TRUE(three.ok());
    EXPECT_EQ((*three)[0].n_kv(), 3);
    EXPECT_EQ((*three)[1].n_kv(), 3);
    EXPECT_EQ((*three)[2].n_kv(), 2);
    for (const TpSlice &s : *three) EXPECT_EQ(s.ff_first % 256, 0);
    EXPECT_EQ((*three)[2].ff_last, 5632);
    auto fast_slow = tp_split(hp, {3, 1}, 32);  // a node three times as fast gets three quarters
    ASSERT_TRUE(fast_slow.ok());
    EXPECT_EQ((*fast_slow)[0].n_kv(), 6);
    EXPECT_EQ((*fast_slow)[0].n_ff(), 4224);
    auto lopsided = tp_split(hp, {100, 1}, 32);  // the slow node still gets a unit of each
    ASSERT_TRUE(lopsided.ok());
    EXPECT_EQ((*lopsided)[1].n_kv(), 1);
    auto too_many = tp_split(hp, std::vector<double>(9, 1.0), 32);
    ASSERT_FALSE(too_many.ok());
    EXPECT_NE(too_many.status().message().find("8 KV heads cannot be split over 9 nodes"), std::string::npos)
        << too_many.status().message();
    EXPECT_FALSE(tp_split(hp, {1, 0}, 32).ok());
}

TEST(TpSlice, SliceFileHoldsOnlyTheSliceAndNeedsACollective) {
    REQUIRE_STORIES();
    test::TempDir dir;
    auto file = gguf::File::open(stories());
    ASSERT_TRUE(file.ok());
    auto whole = Model::load(stories());
    ASSERT_TRUE(whole.ok());
    const HParams &hp = (*whole)->hparams();
    auto slices = tp_split(hp, {1, 1}, tp_ff_unit(*file, 0, hp.n_layer));
    ASSERT_TRUE(slices.ok());
    const std::string path = dir.file("r1.gguf");
    ASSERT_TRUE(tp_write_slice_file(*file, hp, 0, hp.n_layer, (*slices)[1], path).ok());
    auto m = Model::load(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_TRUE((*m)->is_slice());
    EXPECT_EQ((*m)->n_head_kv_local(), 2);
    EXPECT_EQ((*m)->layer(0).wq.ne[1], 4 * 8);  // 2 KV heads x 2 query heads x head_dim 8
    EXPECT_EQ((*m)->layer(0).wo.ne[0], 4 * 8);  // Wo cut by its input columns
    EXPECT_EQ((*m)->layer(0).w_down.ne[0], (*slices)[1].n_ff());
    EXPECT_EQ((*m)->output().ne[1], 256);
    // Half the matrices: the slice file is much smaller than the model (the embedding stays whole).
    EXPECT_LT(gguf::File::open(path)->file_size(), file->file_size() * 3 / 4);
    ThreadPool pool(1);
    auto ctx = Context::create(*m, {64, 1, KvType::f32, KvType::f32}, pool);
    ASSERT_FALSE(ctx.ok());
    EXPECT_NE(ctx.status().message().find("collective"), std::string::npos);
}

// What a rank streams per decoding step (the work --stats weighs its busy time by): its share of every matrix
// and the whole norms, never the embedding table, of which a step reads one row.
TEST(TpSlice, AStepStreamsEveryTensorOfTheSliceButTheEmbedding) {
    REQUIRE_STORIES();
    auto file = gguf::File::open(stories());
    ASSERT_TRUE(file.ok());
    auto whole = Model::load(stories());
    ASSERT_TRUE(whole.ok());
    const HParams &hp = (*whole)->hparams();
    auto slices = tp_split(hp, {3, 1}, tp_ff_unit(*file, 0, hp.n_layer));
    ASSERT_TRUE(slices.ok());
    const gguf::TensorInfo *embd = file->find_tensor("token_embd.weight");
    ASSERT_NE(embd, nullptr);
    uint64_t all = 0;
    for (const gguf::TensorInfo &t : file->tensors()) all += t.n_bytes;
    auto one = tp_slice_plan(*file, hp, 0, hp.n_layer, tp_slice_whole(hp));
    ASSERT_TRUE(one.ok());
    EXPECT_EQ(tp_streamed_bytes(*one), all - embd->n_bytes);
    uint64_t sum = 0, uncut = 0;
    for (const TpSlice &s : *slices) {
        auto plan = tp_slice_plan(*file, hp, 0, hp.n_layer, s);
        ASSERT_TRUE(plan.ok());
        uint64_t bytes = 0;
        for (const TpSliceTensor &t : *plan) bytes += t.n_bytes;
        EXPECT_EQ(tp_streamed_bytes(*plan), bytes - embd->n_bytes);  // each rank holds the whole embedding
        sum += tp_streamed_bytes(*plan);
        if (&s == &slices->front())
            for (const TpSliceTensor &t : *plan)
                if (t.cut == TpSliceTensor::Cut::whole && t.name != "token_embd.weight") uncut += t.n_bytes;
    }
    EXPECT_EQ(sum, tp_streamed_bytes(*one) + uncut);  // the cut matrices once, the norms in each rank
    // The rank with three quarters of the heads and rows streams about three times the other's bytes.
    auto big = tp_slice_plan(*file, hp, 0, hp.n_layer, (*slices)[0]);
    auto small = tp_slice_plan(*file, hp, 0, hp.n_layer, (*slices)[1]);
    const double ratio =
        static_cast<double>(tp_streamed_bytes(*big)) / static_cast<double>(tp_streamed_bytes(*small));
    EXPECT_GT(ratio, 2.0);
    EXPECT_LT(ratio, 3.5);
}

// ---- generation equals one machine --------------------------------------------------------------------------

TEST(TpForward, StoriesGreedyTwoThreeAndHybridEqualOneMachine) {
    REQUIRE_STORIES();
    const Generated ref = one_machine(stories(), kStoriesPrompt, 64, greedy(), true);
    const std::vector<std::vector<StageSpec>> layouts = {
        {{0, -1, {1, 1}}},                  // --tp 2
        {{0, -1, {1, 1, 1}}},               // --tp 3: 4 KV heads over 3 nodes
        {{0, -1, {3, 1}}},                  // a fast and a slow node
        {{0, 2, {1, 1}}, {2, -1, {1, 1}}},  // 2 stages x 2 nodes
    };
    for (const auto &layout : layouts) {
        SCOPED_TRACE(::testing::Message() << layout.size() << " stages, " << layout[0].shares.size() << " ranks");
        const Generated tp = tensor_parallel(stories(), layout, kStoriesPrompt, 64, greedy(), true);
        EXPECT_EQ(tp.tokens, ref.tokens);
        expect_logits_close(ref, tp, ref.logits.size());
        // Without logits the ranks send only their best (id, logit): the same ids.
        const Generated sparse = tensor_parallel(stories(), layout, kStoriesPrompt, 64, greedy(), false);
        EXPECT_EQ(sparse.tokens, ref.tokens);
    }
}

TEST(TpForward, StoriesSeededSamplingEqualsOneMachine) {
    REQUIRE_STORIES();
    SamplerParams no_top_k = seeded(7);
    no_top_k.top_k = 0;  // the ranks send whole slices
    SamplerParams penalties = seeded(9);
    penalties.repeat_penalty = 1.3f;
    penalties.frequency_penalty = 0.2f;
    // typical_p, XTC and the dynamic temperature act on the global top_k the ranks send; top_n_sigma reads
    // every logit (whole slices).
    SamplerParams typical_xtc = seeded(11);
    typical_xtc.typical_p = 0.8f;
    typical_xtc.xtc_probability = 0.5f;
    typical_xtc.xtc_threshold = 0.05f;
    typical_xtc.dynatemp_range = 0.5f;  // so does the dynamic temperature (the entropy of the top_k)
    typical_xtc.dynatemp_exponent = 0.7f;
    SamplerParams sigma = seeded(13);
    sigma.top_n_sigma = 1.0f;
    SamplerParams dry = seeded(17);  // DRY moves tokens before top-k: whole slices
    dry.dry_multiplier = 1.5f;
    dry.dry_allowed_length = 1;
    dry.dry_breakers = {{13, {}}};
    SamplerParams mirostat1 = seeded(19), mirostat2 = seeded(23);  // the whole distribution: whole slices
    mirostat1.mirostat = 1;
    mirostat2.mirostat = 2;
    mirostat2.mirostat_tau = 3.0f;
    for (const SamplerParams &sp :
         {seeded(1234), seeded(5), no_top_k, penalties, typical_xtc, sigma, dry, mirostat1, mirostat2}) {
        const Generated ref = one_machine(stories(), kStoriesPrompt, 48, sp, false);
        for (const std::vector<double> &shares : {std::vector<double>{1, 1}, std::vector<double>{1, 1, 1}}) {
            const Generated tp = tensor_parallel(stories(), {{0, -1, shares}}, kStoriesPrompt, 48, sp, false);
            EXPECT_EQ(tp.tokens, ref.tokens) << "seed " << sp.seed << " top_k " << sp.top_k << ", "
                                             << shares.size() << " ranks";
        }
    }
}

TEST(TpForward, TwoAllReducesPerLayerPerStep) {
    REQUIRE_STORIES();
    uint64_t per_step = 0;
    tensor_parallel(stories(), {{0, -1, {1, 1}}}, kStoriesPrompt, 4, greedy(), false, &per_step);
    EXPECT_EQ(per_step, 2u * 5u);  // 5 layers
}

struct ArchCase {
    std::string arch;
    DType type;
};

class TpArch : public ::testing::TestWithParam<ArchCase> {};

TEST_P(TpArch, SynthModelGreedyEqualsOneMachineUntilATie) {
    REQUIRE_STORIES();
    test::TempDir dir;
    const std::string path = dir.file(GetParam().arch + ".gguf");
    ASSERT_TRUE(test::synth_tp_model(GetParam().arch, GetParam().type, path).ok());
    const Generated ref = one_machine(path, kStoriesPrompt, 64, greedy(), true);
    const size_t agree = first_close_step(ref, 1e-3f);
    for (const std::vector<double> &shares : {std::vector<double>{1, 1}, std::vector<double>{1, 1, 1}}) {
        const Generated tp = tensor_parallel(path, {{0, -1, shares}}, kStoriesPrompt, 64, greedy(), true);
        ASSERT_EQ(tp.tokens.size(), ref.tokens.size());
        for (size_t s = 0; s < agree; ++s) EXPECT_EQ(tp.tokens[s], ref.tokens[s]) << "step " << s;
        expect_logits_close(ref, tp, agree);
        EXPECT_GE(agree, 8u) << "the synthesized model ties too early to say anything";
    }
}

INSTANTIATE_TEST_SUITE_P(Archs, TpArch,
                         ::testing::Values(ArchCase{"llama", DType::q8_0}, ArchCase{"qwen2", DType::f32},
                                           ArchCase{"qwen3", DType::f32}, ArchCase{"gemma2", DType::f32},
                                           ArchCase{"gemma", DType::q4_0}),
                         [](const auto &info) { return info.param.arch; });

}  // namespace
}  // namespace td
