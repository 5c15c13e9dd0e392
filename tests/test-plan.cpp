// The cost model, the planner and the host checks: predictions a reader can follow from the inputs, the
// layouts ranked the way the numbers say, described clusters parsed with errors that name the field, and
// doctor's checks against fake /proc and /sys trees (missing files included).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cluster/cost-model.h"
#include "cluster/host-check.h"
#include "cluster/planner.h"
#include "gguf/gguf.h"
#include "model/arch/arch.h"
#include "net/codec.h"
#include "test-util.h"

namespace td::cluster {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// A llama-shaped model of these dimensions, as `tandem synth` describes it (Q4_0 unless set after).
SynthParams llama_params(int32_t n_embd, int32_t n_layer, int32_t n_head, int32_t n_head_kv, int32_t n_ff) {
    SynthParams p;
    p.n_embd = n_embd;
    p.n_layer = n_layer;
    p.n_head = n_head;
    p.n_head_kv = n_head_kv;
    p.n_ff = n_ff;
    return p;
}

ModelShape shape_8b(DType type = DType::q4_0) {
    SynthParams p = llama_params(4096, 32, 32, 8, 14336);
    p.type = type;
    auto m = model_shape_from_synth(p, 128256);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return *m;
}

NodeSpec box(const std::string &name, double bw_gbs = 100, double gflops = 1000, double mem_gib = 64) {
    NodeSpec n;
    n.name = name;
    n.host = name;
    n.threads = 8;
    n.mem_bytes = static_cast<uint64_t>(mem_gib * 1073741824.0);
    n.read_bytes_per_s = bw_gbs * 1e9;
    n.flops_per_s = gflops * 1e9;
    n.matvec_efficiency = 0.8;
    return n;
}

ClusterSpec boxes(int n, double latency_us, double gbits, double mem_gib = 64) {
    ClusterSpec c;
    c.name = "test";
    for (int i = 0; i < n; ++i)
        c.nodes.push_back(box(std::string(1, static_cast<char>('a' + i)), 100, 1000, mem_gib));
    c.default_link = LinkSpec{latency_us * 1e-6, gbits * 1e9 / 8, {}};
    c.head_link = LinkSpec{5e-6, 20e9, {}};
    return c;
}

Layout layout_of(const ModelShape &m, const ClusterSpec &c, std::vector<std::vector<int>> groups) {
    auto l = make_layout(m, c, groups, 1);
    EXPECT_TRUE(l.ok()) << l.status().message();
    return *l;
}

TEST(CostModel, ShapeFromFileListsEveryLayerMatrix) {
    auto f = gguf::File::open(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto m = model_shape_from_file(*f);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_EQ(m->layers.size(), static_cast<size_t>(m->hp.n_layer));
    uint64_t file_bytes = 0;
    for (const gguf::TensorInfo &t : f->tensors()) file_bytes += t.n_bytes;
    EXPECT_EQ(m->total_bytes(), file_bytes);  // every tensor counted once (a tied head is the embedding)
    for (const auto &l : m->layers) {
        ASSERT_EQ(l.size(), 7u);
        int kv_rows = 0, ff_rows = 0, cols = 0;
        for (const ShapeMatrix &x : l) {
            kv_rows += x.cut == ShapeCut::rows_kv;
            ff_rows += x.cut == ShapeCut::rows_ff;
            cols += x.cut == ShapeCut::cols_kv || x.cut == ShapeCut::cols_ff;
        }
        EXPECT_EQ(kv_rows, 3);  // q, k, v
        EXPECT_EQ(ff_rows, 2);  // gate, up
        EXPECT_EQ(cols, 2);     // o, down
    }
    EXPECT_NE(m->name.find("llama"), std::string::npos);
}

TEST(CostModel, SliceShapesAreTheSliceFilesShapes) {
    auto f = gguf::File::open(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(f.ok());
    auto m = model_shape_from_file(*f);
    ASSERT_TRUE(m.ok());
    auto slices = tp_split(m->hp, {1.0, 1.0}, m->ff_unit);
    ASSERT_TRUE(slices.ok()) << slices.status().message();
    for (const TpSlice &sl : *slices) {
        auto plan = tp_slice_plan(*f, m->hp, 0, m->hp.n_layer, sl);
        ASSERT_TRUE(plan.ok()) << plan.status().message();
        int matched = 0;
        for (const TpSliceTensor &t : *plan) {
            int il = -1;
            char part[64] = {0};
            if (std::sscanf(t.name.c_str(), "blk.%d.%63[^.].weight", &il, part) != 2 || t.ne.size() != 2)
                continue;
            for (const ShapeMatrix &x : m->layers[static_cast<size_t>(il)])
                if (x.name == part) {
                    const ShapeMatrix s = slice_matrix(x, m->hp, sl);
                    EXPECT_EQ(s.n_in, t.ne[0]) << t.name;
                    EXPECT_EQ(s.n_out, t.ne[1]) << t.name;
                    EXPECT_EQ(s.bytes(), t.n_bytes) << t.name;
                    ++matched;
                }
        }
        EXPECT_EQ(matched, 7 * m->hp.n_layer);
    }
}

TEST(CostModel, MemoryBoundGenerationFollowsFromTheBandwidth) {
    const ModelShape m = shape_8b();
    const ClusterSpec c = boxes(1, 50, 10);
    const Prediction p = predict(m, c, layout_of(m, c, {{0}}), 1, PredictOptions{});
    // Batch 1 reads every weight once per token: tokens/s = read bandwidth x efficiency / bytes per token.
    double bytes = static_cast<double>(m.output.bytes());
    for (int32_t il = 0; il < m.hp.n_layer; ++il) bytes += static_cast<double>(m.layer_bytes(il));
    const double expect = 100e9 * 0.8 / bytes;
    EXPECT_NEAR(p.gen.tokens_per_s, expect, 0.05 * expect);
    EXPECT_EQ(p.gen.dominant, Term::memory);
    EXPECT_TRUE(p.fits);
    // Prompt processing is compute-bound: 2 flops per weight per token (7.5 G weights at 1 TFLOP/s).
    EXPECT_EQ(p.prompt.dominant, Term::compute);
    EXPECT_GT(p.prompt.tokens_per_s, 3 * p.gen.tokens_per_s);
    EXPECT_LT(p.prompt.tokens_per_s, 1000e9 / (2.0 * 7.0e9));
}

TEST(CostModel, TensorParallelHelpsOverFastLinksAndHurtsOverSlowOnes) {
    const ModelShape m = shape_8b();
    const ClusterSpec fast = boxes(2, 5, 100), slow = boxes(2, 1000, 10);
    const double one = predict(m, fast, layout_of(m, fast, {{0}}), 1, {}).gen.tokens_per_s;
    const Prediction tp_fast = predict(m, fast, layout_of(m, fast, {{0, 1}}), 1, {});
    const Prediction tp_slow = predict(m, slow, layout_of(m, slow, {{0, 1}}), 1, {});
    EXPECT_GT(tp_fast.gen.tokens_per_s, 1.6 * one);  // each node reads half the weights
    EXPECT_LT(tp_slow.gen.tokens_per_s, one);        // 64 all-reduces a token at 1 ms each
    EXPECT_EQ(tp_slow.gen.dominant, Term::link_latency);
    // Two all-reduces per layer, each one link latency (two ranks exchange directly), plus the sampling
    // merge.
    const double lat = tp_slow.gen.terms[static_cast<size_t>(Term::link_latency)];
    EXPECT_NEAR(lat, (2 * 32 + 1) * 1e-3 + 2 * 5e-6, 1e-4);
}

TEST(CostModel, WhatAPairWaitsForEachOtherIsChargedAtEveryCollective) {
    // A pair measured in lock step waiting 40 us beyond the link at 1 row and 200 us at 16: a token at 1 row
    // costs 2 x 32 collectives x 40 us more, as link latency, and 16 rows interpolate to 8.
    const ModelShape m = shape_8b();
    const ClusterSpec plain = boxes(3, 50, 100);
    ClusterSpec synced = plain;
    synced.sync[{0, 1}] = {SyncPoint{1, 40e-6, 0, 0, 0}, SyncPoint{16, 200e-6, 0, 0, 0}};
    synced.sync[{1, 2}] = {SyncPoint{1, 10e-6, 0, 0, 0}};
    EXPECT_DOUBLE_EQ(synced.sync_seconds({0, 1}, 1), 40e-6);
    EXPECT_DOUBLE_EQ(synced.sync_seconds({1, 0}, 16), 200e-6);
    EXPECT_NEAR(synced.sync_seconds({0, 1}, 6), 40e-6 + 160e-6 * 5 / 15, 1e-12);
    EXPECT_DOUBLE_EQ(synced.sync_seconds({0, 1}, 512), 200e-6);  // beyond the largest: the largest
    EXPECT_DOUBLE_EQ(synced.sync_seconds({1, 2}, 16), 10e-6);
    EXPECT_DOUBLE_EQ(synced.sync_seconds({0, 1, 2}, 1), 40e-6);  // the group's worst pair
    EXPECT_DOUBLE_EQ(synced.sync_seconds({0, 2}, 1), 0.0);       // never measured
    EXPECT_DOUBLE_EQ(synced.sync_seconds({0}, 1), 0.0);
    for (int32_t batch : {1, 16}) {
        const Layout l = layout_of(m, plain, {{0, 1}});
        const Prediction a = predict(m, plain, l, batch, {}), b = predict(m, synced, l, batch, {});
        const double added = 2 * 32 * synced.sync_seconds({0, 1}, batch);
        EXPECT_NEAR(b.gen.seconds - a.gen.seconds, added, 1e-9) << batch;
        EXPECT_NEAR(b.gen.terms[static_cast<size_t>(Term::link_latency)] -
                        a.gen.terms[static_cast<size_t>(Term::link_latency)],
                    added, 1e-9);
    }
    // One node and a pipeline have no collectives: nothing changes.
    for (const auto &groups : {std::vector<std::vector<int>>{{0}}, std::vector<std::vector<int>>{{0}, {1}}}) {
        const Layout l = layout_of(m, plain, groups);
        EXPECT_DOUBLE_EQ(predict(m, synced, l, 1, {}).gen.seconds, predict(m, plain, l, 1, {}).gen.seconds);
    }
    // A plan runs each pair in lock step at 1 row, the largest batch and a prompt chunk.
    EXPECT_EQ(sync_rows(PlanOptions{}), (std::vector<int32_t>{1, 16, 512}));
}

TEST(CostModel, ThreeRanksReduceLargePartsInTwoLatencies) {
    // 16 rows of f32 partials (256 KiB) over 3 ranks: reduce-scatter, then all-gather, each one latency.
    const ModelShape m = shape_8b();
    const ClusterSpec slow = boxes(3, 1000, 10);
    const Prediction tp3 = predict(m, slow, layout_of(m, slow, {{0, 1, 2}}), 16, {});
    const double lat = tp3.gen.terms[static_cast<size_t>(Term::link_latency)];
    // Two all-reduces per layer of two latencies each, the sampling merge (small: one), the head's hops.
    EXPECT_NEAR(lat, (2 * 32 * 2 + 1) * 1e-3 + 2 * 5e-6, 1e-4);
}

TEST(CostModel, AMessageCostsWhatMessagesOfItsSizeMeasured) {
    LinkSpec l{100e-6, 0.25e9, {{64, 100e-6}, {8192, 110e-6}, {131072, 150e-6}}};
    EXPECT_DOUBLE_EQ(l.seconds(10), 100e-6);  // below the smallest: the smallest
    EXPECT_DOUBLE_EQ(l.seconds(8192), 110e-6);
    EXPECT_NEAR(l.seconds(65536), 110e-6 + 40e-6 * (65536 - 8192) / (131072 - 8192), 1e-12);
    // Beyond the largest: the stream's rate.
    EXPECT_NEAR(l.seconds(1048576), 150e-6 + (1048576 - 131072) / 0.25e9, 1e-12);
    EXPECT_NEAR(l.transfer_seconds(131072), 50e-6, 1e-12);
    // A described link without messages: latency + bytes / bandwidth.
    const LinkSpec d{100e-6, 0.25e9, {}};
    EXPECT_NEAR(d.seconds(131072), 100e-6 + 131072 / 0.25e9, 1e-12);
}

TEST(CostModel, AMeasuredLinkKeepsEveryRoundTripAndStreamsBeyondThem) {
    auto sample = [](uint64_t bytes, uint32_t mode, double p50, double gbps) {
        net::LinkSample s;
        s.bytes = bytes;
        s.mode = mode;
        s.p50 = p50;
        s.gbps = gbps;
        return s;
    };
    const LinkSpec l =
        link_from_samples({sample(64, 0, 200e-6, 0), sample(4096, 0, 190e-6, 0), sample(65536, 0, 260e-6, 0),
                           sample(32768, 1, 0, 9.0), sample(1u << 20, 1, 0, 0.5)});
    EXPECT_DOUBLE_EQ(l.latency_s, 100e-6);   // half the smallest round trip
    EXPECT_DOUBLE_EQ(l.bytes_per_s, 0.5e9);  // the largest stream
    // The 32 KiB stream lies among the round trips and is left out; 4 KiB's faster median (noise) is raised
    // to 64 B's.
    ASSERT_EQ(l.messages.size(), 4u);
    EXPECT_EQ(l.messages[1].first, 4096);
    EXPECT_DOUBLE_EQ(l.messages[1].second, 100e-6);
    EXPECT_DOUBLE_EQ(l.messages[2].second, 130e-6);
    EXPECT_EQ(l.messages[3].first, 1u << 20);
    EXPECT_NEAR(l.messages[3].second, 100e-6 + (1u << 20) / 0.5e9, 1e-12);
}

TEST(CostModel, AllReducesArePricedAtTheirMessagesMeasuredTimes) {
    // Three ranks at 16 rows: 256 KiB partials go as reduce-scatter chunks of 85.3 KiB. Over a link whose
    // streams crawl (0.25 GB/s) but whose messages of that size cross in 40 us more than a small one, the
    // bandwidth term is what those messages measured, not the stream's rate.
    const ModelShape m = shape_8b();
    ClusterSpec streamed = boxes(3, 100, 2);  // 0.25 GB/s
    ClusterSpec measured = streamed;
    measured.default_link.messages = {{64, 100e-6}, {65536, 130e-6}, {131072, 150e-6}};
    const Layout l = layout_of(m, streamed, {{0, 1, 2}});
    const Prediction ps = predict(m, streamed, l, 16, {}), pm = predict(m, measured, l, 16, {});
    const double chunk = 16.0 * 4096 * 4 / 3;
    const double per = 2.0 * measured.default_link.transfer_seconds(chunk);  // to each of two peers
    EXPECT_NEAR(per, 2.0 * (30e-6 + 20e-6 * (chunk - 65536) / 65536), 1e-12);
    const double bw = pm.gen.terms[static_cast<size_t>(Term::link_bandwidth)];
    // Two all-reduces a layer of two phases each; the sampling merge and the head's hops are small.
    EXPECT_NEAR(bw, 2 * 32 * 2 * per, 0.05 * bw);
    EXPECT_DOUBLE_EQ(pm.gen.terms[static_cast<size_t>(Term::link_latency)],
                     ps.gen.terms[static_cast<size_t>(Term::link_latency)]);
    EXPECT_GT(pm.gen.tokens_per_s, 1.5 * ps.gen.tokens_per_s);
}

TEST(Planner, LinksAreMeasuredAtTheSizesTheLayoutsSend) {
    const SynthParams p = llama_params(2048, 16, 32, 8, 5632);
    auto m = model_shape_from_synth(p, 32000);
    ASSERT_TRUE(m.ok());
    PlanOptions o;
    o.batches = {1, 16};
    const std::vector<uint64_t> sizes = link_message_sizes(*m, o, 3);
    ASSERT_GE(sizes.size(), 4u);
    ASSERT_LE(sizes.size(), net::kMaxProbeSizes);
    EXPECT_EQ(sizes.front(), 64u);
    for (size_t i = 1; i < sizes.size(); ++i) EXPECT_GT(sizes[i], sizes[i - 1]);
    // The largest: a 512-row prompt chunk's all-reduce part, f32.
    EXPECT_EQ(sizes.back(), 512u * 2048 * 4);
    // Every message a layout sends lies within 2x of a measured size: a token's hop, 16 rows' all-reduce
    // (128 KiB) and its reduce-scatter chunk over 3 ranks.
    for (uint64_t want : {net::forward_payload_bytes(1, 2048, o.predict.wire, false), size_t{16 * 2048 * 4},
                          size_t{16 * 2048 * 4 / 3}, size_t{8192}}) {
        bool near = false;
        for (uint64_t b : sizes) near |= b <= 2 * want && want <= 2 * b;
        EXPECT_TRUE(near) << want;
    }
}

TEST(CostModel, PipelineKeepsEveryStageBusyWithManySequences) {
    const ModelShape m = shape_8b();
    const ClusterSpec c = boxes(2, 20, 25);
    const Layout one = layout_of(m, c, {{0}}), pipe = layout_of(m, c, {{0}, {1}});
    // The output head (2.4 layers' bytes) counts toward the last stage's work: it gets fewer layers.
    EXPECT_EQ(pipe.layers[0], (LayerRange{0, 17}));
    EXPECT_EQ(pipe.layers[1], (LayerRange{17, 32}));
    const double one_b1 = predict(m, c, one, 1, {}).gen.tokens_per_s;
    const double pipe_b1 = predict(m, c, pipe, 1, {}).gen.tokens_per_s;
    const double one_b16 = predict(m, c, one, 16, {}).gen.tokens_per_s;
    const double pipe_b16 = predict(m, c, pipe, 16, {}).gen.tokens_per_s;
    EXPECT_LE(pipe_b1, one_b1 * 1.01);   // one token still walks through every stage in turn
    EXPECT_GT(pipe_b16, 1.5 * one_b16);  // two micro-batches keep both stages busy
}

TEST(CostModel, MeasuredTimesAreUsedThenScaled) {
    NodeSpec n = box("a");
    const ShapeMatrix w{"ffn_up", DType::q4_0, 4096, 14336, ShapeCut::rows_ff};
    n.measured[{static_cast<uint32_t>(DType::q4_0), 4096, 14336, 1}] = 2e-3;
    n.measured[{static_cast<uint32_t>(DType::q4_0), 4096, 14336, 16}] = 6e-3;
    EXPECT_DOUBLE_EQ(n.matmul_seconds(w, 1), 2e-3);
    ShapeMatrix half = w;
    half.n_out = 7168;
    EXPECT_DOUBLE_EQ(n.matmul_seconds(half, 1), 1e-3);  // same type, rows and n_in: in proportion to n_out
    EXPECT_NEAR(n.matmul_seconds(w, 8), 2e-3 + 4e-3 * 7 / 15, 1e-9);          // between measured row counts
    ShapeMatrix other{"attn_q", DType::q8_0, 4096, 4096, ShapeCut::rows_kv};  // nothing measured: roofline
    EXPECT_NEAR(n.matmul_seconds(other, 1), static_cast<double>(other.bytes()) / (100e9 * 0.8), 1e-9);
}

TEST(CostModel, NodesOfOneHostSlowEachOtherDown) {
    const ModelShape m = shape_8b();
    ClusterSpec c = boxes(2, 20, 25);
    const double apart = predict(m, c, layout_of(m, c, {{0, 1}}), 1, {}).gen.tokens_per_s;
    for (NodeSpec &n : c.nodes) n.host = "one";
    c.together[{0, 1}] = 1.4;
    const Prediction p = predict(m, c, layout_of(m, c, {{0, 1}}), 1, {});
    EXPECT_LT(p.gen.tokens_per_s, apart / 1.3);
    EXPECT_FALSE(p.shares_core);
    c.together[{0, 1}] = 2.0;  // two ranks on one core: predicted, flagged, never recommended
    EXPECT_TRUE(predict(m, c, layout_of(m, c, {{0, 1}}), 1, {}).shares_core);
    PlanOptions o;
    o.batches = {1};
    const Plan plan = make_plan(m, c, o);
    EXPECT_NE(plan.batches[0].entries[static_cast<size_t>(plan.batches[0].recommended)].layout.kind(),
              "tensor parallel");
    EXPECT_NE(plan_text(plan).find("share cores"), std::string::npos);
    // One node of the host alone pays nothing.
    EXPECT_NEAR(predict(m, c, layout_of(m, c, {{0}}), 1, {}).gen.tokens_per_s,
                predict(m, boxes(1, 20, 25), layout_of(m, boxes(1, 20, 25), {{0}}), 1, {}).gen.tokens_per_s,
                1e-6);
}

// Two pipeline stages on one core (together 2x): with many sequences the core does both stages' work in turn,
// so the pipeline is as fast as one node, whatever the split. Counted as "each stage twice as slow" an uneven
// 20/12-layer split would look 14% slower than one node (twice the longer stage per step).
TEST(CostModel, StagesThatShareACoreTakeTheCoresWholeLoad) {
    const ModelShape m = shape_8b();
    ClusterSpec c = boxes(2, 1, 100);
    for (NodeSpec &n : c.nodes) n.host = "one";
    c.together[{0, 1}] = 2.0;
    c.together_stream[{0, 1}] = 2.0;
    Layout pipe = layout_of(m, c, {{0}, {1}});
    pipe.layers = {{0, 20}, {20, 32}};
    const double one = predict(m, c, layout_of(m, c, {{0}}), 16, {}).gen.tokens_per_s;
    const double both = predict(m, c, pipe, 16, {}).gen.tokens_per_s;
    EXPECT_GT(both, 0.95 * one);
    EXPECT_LT(both, 1.02 * one);
    // On a shared bus (1.3x) the same stages gain, but less than on separate hosts.
    c.together[{0, 1}] = c.together_stream[{0, 1}] = 1.3;
    const double bus = predict(m, c, pipe, 16, {}).gen.tokens_per_s;
    for (NodeSpec &n : c.nodes) n.host.clear();
    c.together.clear();
    c.together_stream.clear();
    const double apart = predict(m, c, pipe, 16, {}).gen.tokens_per_s;
    EXPECT_GT(bus, 1.1 * one);
    EXPECT_LT(bus, 0.95 * apart);
}

// Two ranks on one host's shared bus (each streams weights 1.8x slower beside the other, computes at full
// speed): a batch-1 step streams weights, so --tp 2 pays the bus there; a 16-row step computes (its matmuls
// take ~4x their weights' streaming time), so it barely does.
TEST(CostModel, TheBusSlowsTheStepsThatStreamNotTheOnesThatCompute) {
    const ModelShape m = shape_8b();
    ClusterSpec c = boxes(2, 5, 100);
    for (NodeSpec &n : c.nodes) n.host = "one";
    const Layout tp = layout_of(m, c, {{0, 1}});
    const double free1 = predict(m, c, tp, 1, {}).gen.tokens_per_s;
    const double free16 = predict(m, c, tp, 16, {}).gen.tokens_per_s;
    c.together[{0, 1}] = 1.0;
    c.together_stream[{0, 1}] = 1.8;
    const double bus1 = predict(m, c, tp, 1, {}).gen.tokens_per_s;
    const double bus16 = predict(m, c, tp, 16, {}).gen.tokens_per_s;
    EXPECT_LT(bus1, 0.7 * free1);
    EXPECT_GT(bus16, 0.9 * free16);
}

TEST(Planner, CandidatesCoverEveryKindAndTheirFlagsRunThem) {
    const ModelShape m = shape_8b();
    const ClusterSpec c = boxes(4, 20, 25);
    std::set<std::string> kinds, flags;
    for (const Layout &l : candidate_layouts(m, c, 1)) {
        kinds.insert(l.kind());
        flags.insert(l.flags(c));
    }
    EXPECT_EQ(kinds, (std::set<std::string>{"one node", "pipeline", "tensor parallel", "hybrid"}));
    EXPECT_TRUE(flags.count("--workers a,b --tp 2"));
    EXPECT_TRUE(flags.count("--workers a,b,c,d --tp 4"));
    EXPECT_TRUE(flags.count("--workers a,b,c,d --layout 2,2 --layers 0-16,17-31"));
    EXPECT_TRUE(flags.count("--workers c")) << "every node alone";
    // 8 KV heads: 5 or more ranks in one group are left out, never an error.
    const SynthParams p = llama_params(256, 4, 4, 2, 512);
    auto small = model_shape_from_synth(p, 1000);
    ASSERT_TRUE(small.ok());
    for (const Layout &l : candidate_layouts(*small, boxes(3, 20, 25), 1))
        for (const auto &g : l.groups) EXPECT_LE(g.size(), 2u);
}

TEST(Planner, WithinTwoPercentTheSimplerLayoutIsRecommendedThenTheFirstListedWorkers) {
    // Entries as make_plan sorts them: fastest first, those that fit first.
    auto entry = [](std::vector<std::vector<int>> groups, double tokens_per_s, bool shares_core = false) {
        PlanEntry e;
        e.layout.groups = std::move(groups);
        e.prediction.gen.tokens_per_s = tokens_per_s;
        e.prediction.shares_core = shares_core;
        return e;
    };
    const auto tp2 = std::vector<std::vector<int>>{{0, 1}}, pipe2 = std::vector<std::vector<int>>{{0}, {1}};
    const auto one = std::vector<std::vector<int>>{{0}}, tp3 = std::vector<std::vector<int>>{{0, 1, 2}};
    // The tie plan-check met (tokens/s predicted): the pipeline, whose two nodes never wait for each other.
    EXPECT_EQ(recommend({entry(tp2, 486.0), entry(pipe2, 485.5), entry(one, 300)}), 1);
    // 2% apart is still a tie, 3% is not.
    EXPECT_EQ(recommend({entry(tp2, 500), entry(pipe2, 490.0), entry(one, 300)}), 1);
    EXPECT_EQ(recommend({entry(tp2, 500), entry(pipe2, 485.0), entry(one, 300)}), 0);
    // Fewer nodes first: one node within 2% of both.
    EXPECT_EQ(recommend({entry(tp2, 100), entry(pipe2, 99.5), entry(one, 98.5)}), 2);
    // Of equal node counts, the narrower group: tp 3 against a 2+1 hybrid.
    EXPECT_EQ(recommend({entry(tp3, 100), entry({{0, 1}, {2}}, 99)}), 1);
    // Of equally simple layouts, the one over the first-listed workers: the same prediction over three
    // identical workers, in any order...
    EXPECT_EQ(recommend({entry({{1}}, 48.0), entry({{2}}, 48.0), entry({{0}}, 48.0)}), 2);
    // ...or within 2% (a pair's measured contention differs a little)...
    EXPECT_EQ(recommend({entry({{1}, {2}}, 529.0), entry({{0}, {1}}, 521.2), entry(tp2, 430.0)}), 1);
    EXPECT_EQ(recommend({entry({{2, 1}}, 55.2), entry({{0, 1}}, 54.2)}), 1);
    // ...but not past it, and over the same workers the faster one stays (a 1,2 hybrid against a 2,1).
    EXPECT_EQ(recommend({entry({{1}, {2}}, 529.0), entry({{0}, {1}}, 513.8)}), 0);
    EXPECT_EQ(recommend({entry({{0}, {1, 2}}, 57.0), entry({{0, 1}, {2}}, 56.5)}), 0);
    // Ranks on shared cores are never recommended; a layout that does not fit ends the list.
    EXPECT_EQ(recommend({entry(tp2, 900, true), entry(pipe2, 400)}), 1);
    PlanEntry big = entry(one, 50);
    big.prediction.fits = false;
    EXPECT_EQ(recommend({entry(tp2, 900, true), big}), -1);
    EXPECT_EQ(recommend({}), -1);
}

TEST(Planner, AModelTooBigForOneNodeSaysWhatItNeeds) {
    SynthParams p = llama_params(8192, 80, 64, 8, 28672);
    ASSERT_TRUE(synth_parse_type("q4_k_m", p).ok());
    auto m = model_shape_from_synth(p, 128256);
    ASSERT_TRUE(m.ok());
    PlanOptions o;
    o.batches = {1};
    const Plan plan = make_plan(*m, boxes(2, 40, 10, 30), o);
    const std::string text = plan_text(plan);
    EXPECT_NE(text.find("does not fit: needs"), std::string::npos) << text;
    EXPECT_NE(text.find("the largest node has 30.0 GiB"), std::string::npos) << text;
    ASSERT_GE(plan.batches[0].recommended, 0);
    EXPECT_EQ(plan.batches[0].entries[static_cast<size_t>(plan.batches[0].recommended)].layout.n_nodes(), 2);
}

TEST(Planner, TheRecommendationFollowsTheLinks) {
    const ModelShape m = shape_8b();
    PlanOptions o;
    o.batches = {1, 16};
    const Plan rdma = make_plan(m, boxes(2, 5, 100), o), slow = make_plan(m, boxes(2, 2000, 1), o);
    auto rec = [](const Plan &p, size_t b) {
        return p.batches[b].entries[static_cast<size_t>(p.batches[b].recommended)].layout;
    };
    EXPECT_EQ(rec(rdma, 0).kind(), "tensor parallel");
    EXPECT_NE(rec(slow, 0).kind(), "tensor parallel");
    EXPECT_EQ(rec(slow, 0).kind(), "one node");  // a 2 ms link costs more than half the weights' read
    const std::string text = plan_text(rdma);
    EXPECT_NE(text.find("recommended: tp 2 (tensor parallel): --workers a,b --tp 2"), std::string::npos)
        << text;
    EXPECT_NE(text.find("dominates"), std::string::npos);
}

TEST(Planner, JsonAndChart) {
    const ModelShape m = shape_8b();
    PlanOptions o;
    o.batches = {1, 4, 16};
    const Plan plan = make_plan(m, boxes(3, 20, 25), o);
    const auto j = nlohmann::json::parse(plan_json(plan));
    ASSERT_EQ(j["batches"].size(), 3u);
    for (const auto &b : j["batches"]) {
        EXPECT_TRUE(b.contains("recommended"));
        for (const auto &l : b["layouts"]) {
            EXPECT_GT(l["generation"]["tokens_per_s"].get<double>(), 0);
            EXPECT_TRUE(l["flags"].get<std::string>().rfind("--workers ", 0) == 0);
        }
    }
    const std::string svg = plan_svg(plan);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    size_t lines = 0;
    for (size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1))
        ++lines;
    EXPECT_EQ(lines, 4u);  // one machine, pipeline, tensor parallel, hybrid
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Planner, ClusterDescriptionErrorsNameTheField) {
    EXPECT_FALSE(cluster_from_json("not json").ok());
    EXPECT_FALSE(cluster_from_json("{\"nodes\": []}").ok());
    auto e =
        cluster_from_json(R"({"nodes": [{"name": "a", "memory_gib": 64, "mem_bw_gbs": -1, "gflops": 100}]})");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("nodes[0].mem_bw_gbs must be a positive number"), std::string::npos);
    e = cluster_from_json(R"({"nodes": [{"name": "a", "mem_bw_gbs": 10, "gflops": 100}]})");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("nodes[0].memory_gib is missing"), std::string::npos);
    e = cluster_from_json(R"({"nodes": [{"name": "a", "memory_gib": 8, "mem_bw_gbs": 10, "gflops": 100}],
                              "links": [{"from": "a", "to": "zz", "latency_us": 5, "bandwidth_gbps": 10}]})");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("links[0]: from and to must name nodes"), std::string::npos);
    auto ok = cluster_from_json(R"({"nodes": [{"name": "a", "memory_gib": 8, "mem_bw_gbs": 10, "gflops": 100},
                                              {"name": "b", "memory_gib": 8, "mem_bw_gbs": 10, "gflops": 100}],
                                   "link": {"latency_us": 40, "bandwidth_gbps": 8},
                                   "links": [{"from": "a", "to": "b", "latency_us": 5, "bandwidth_gbps": 80}]})");
    ASSERT_TRUE(ok.ok()) << ok.status().message();
    EXPECT_DOUBLE_EQ(ok->link(0, 1).latency_s, 5e-6);
    EXPECT_DOUBLE_EQ(ok->link(1, 0).bytes_per_s, 10e9);  // either way; gigabits per second
    // Measured messages, as `plan --json` prints a measured link's: they price the sizes among them.
    auto measured =
        cluster_from_json(R"({"nodes": [{"name": "a", "memory_gib": 8, "mem_bw_gbs": 10, "gflops": 100},
                                                    {"name": "b", "memory_gib": 8, "mem_bw_gbs": 10, "gflops": 100}],
        "link": {"latency_us": 200, "bandwidth_gbps": 2,
                 "messages": [{"bytes": 131072, "one_way_us": 260}, {"bytes": 64, "one_way_us": 200}]}})");
    ASSERT_TRUE(measured.ok()) << measured.status().message();
    EXPECT_NEAR(measured->link(0, 1).seconds(65568), 230e-6, 1e-9);
    e = cluster_from_json(R"({"nodes": [{"name": "a", "memory_gib": 8, "mem_bw_gbs": 10, "gflops": 100}],
        "link": {"latency_us": 200, "bandwidth_gbps": 2, "messages": [{"bytes": 64}]}})");
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("link.messages[0].one_way_us is missing"), std::string::npos)
        << e.status().message();
}

TEST(Planner, ShippedClusterDescriptionsPlan) {
    int n = 0;
    for (const auto &e : fs::directory_iterator(fs::path(TD_SOURCE_DIR) / "docs/clusters")) {
        if (e.path().extension() != ".json") continue;
        std::ifstream in(e.path());
        std::stringstream ss;
        ss << in.rdbuf();
        auto c = cluster_from_json(ss.str());
        ASSERT_TRUE(c.ok()) << e.path() << ": " << c.status().message();
        const auto j = nlohmann::json::parse(ss.str());
        EXPECT_FALSE(j["sources"].empty()) << e.path() << " says where its figures come from";
        const Plan plan = make_plan(shape_8b(), *c, PlanOptions{});
        EXPECT_NE(plan_text(plan).find("recommended:"), std::string::npos) << e.path();
        ++n;
    }
    EXPECT_GE(n, 5);
}

TEST(PlanCli, OfflineExampleWithAChart) {
    TempDir dir;
    const std::string svg = dir.file("plan.svg");
    auto r = test::run_tandem(
        {"plan", "--offline", std::string(TD_SOURCE_DIR) + "/docs/clusters/strix-halo-2x-10gbe.json",
         "--shape", "llama-70b", "--type", "q4_k_m", "--batch", "1,4,16", "--svg", svg});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("tok/s generation"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("recommended:"), std::string::npos);
    EXPECT_NE(test::read_file(svg).find("<polyline"), std::string::npos);
    r = test::run_tandem({"plan", "--offline",
                          std::string(TD_SOURCE_DIR) + "/docs/clusters/strix-halo-2x-10gbe.json", "--shape",
                          "dim=64,heads=3,kv-heads=2", "--json"});
    EXPECT_NE(r.exit_code, 0);  // 3 heads cannot share 2 KV heads
    EXPECT_NE(r.err.find("heads a multiple of KV heads"), std::string::npos) << r.err;
    r = test::run_tandem({"plan", "--offline",
                          std::string(TD_SOURCE_DIR) + "/docs/clusters/strix-halo-plus-old-pc.json", "-m",
                          test::shared_path("models/stories260K.gguf"), "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["batches"].size(), 3u);
}

// ---- doctor ----------------------------------------------------------------------------------------------

void put(const TempDir &root, const std::string &rel, const std::string &text) {
    const fs::path p = fs::path(root.path()) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

const HostCheck &find(const std::vector<HostCheck> &checks, const std::string &name) {
    for (const HostCheck &c : checks)
        if (c.name == name) return c;
    ADD_FAILURE() << "no check named " << name;
    static HostCheck none;
    return none;
}

TEST(HostCheck, AnEmptyTreeIsCannotTellNeverACrash) {
    TempDir root;
    HostCheckOptions o;
    o.root = root.path();
    const auto checks = run_host_checks(o);
    EXPECT_GE(checks.size(), 15u);
    for (const HostCheck &c : checks) {
        EXPECT_EQ(c.status, CheckStatus::unknown) << c.name << ": " << c.detail;
        EXPECT_FALSE(c.detail.empty()) << c.name;
    }
    o.root = root.path() + "/does-not-exist";
    EXPECT_EQ(run_host_checks(o).size(), checks.size());
}

TEST(HostCheck, AWellTunedHostIsOk) {
    TempDir root;
    put(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "performance\n");
    put(root, "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "performance\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state0/name", "POLL\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state0/latency", "0\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state1/name", "C1\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state1/latency", "2\n");
    put(root, "proc/sys/net/core/rmem_max", "67108864\n");
    put(root, "proc/sys/net/core/wmem_max", "67108864\n");
    put(root, "proc/sys/net/ipv4/tcp_rmem", "4096 131072 67108864\n");
    put(root, "proc/sys/net/ipv4/tcp_wmem", "4096 16384 67108864\n");
    put(root, "proc/sys/net/ipv4/tcp_slow_start_after_idle", "0\n");
    put(root, "proc/net/route", "Iface\tDestination\tGateway\neth0\t00000000\t0102A8C0\n");
    put(root, "sys/class/net/eth0/mtu", "9000\n");
    put(root, "sys/class/net/eth0/speed", "25000\n");
    put(root, "sys/devices/system/cpu/isolated", "\n");
    put(root, "proc/irq/default_smp_affinity", "ff\n");
    put(root, "sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
    put(root, "proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max locked memory         unlimited            unlimited            bytes\n");
    put(root, "proc/meminfo", "MemTotal: 131072000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n");
    put(root, "sys/devices/system/node/node0/meminfo", "");
    // A RoCE NIC ready for RDMA: port 1 active with a RoCE v2 GID on an interface of MTU 9000; port 2 unused.
    put(root, "sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/0", "IB/RoCE v1\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gids/1", "fe80:0000:0000:0000:0000:0000:0000:0001\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/1", "RoCE v2\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/1", "eth0\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/2/state", "1: DOWN\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/2/link_layer", "Ethernet\n");
    HostCheckOptions o;
    o.root = root.path();
    o.read_gbps = 190;
    o.cpu_model = "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S";
    put(root, "cluster.secret", "0123456789abcdef0123456789abcdef\n");
    ::chmod((root.path() + "/cluster.secret").c_str(), 0600);
    o.secret_path = root.path() + "/cluster.secret";
    const auto checks = run_host_checks(o);
    for (const HostCheck &c : checks) EXPECT_EQ(c.status, CheckStatus::ok) << c.name << ": " << c.detail;
    EXPECT_NE(find(checks, "RDMA").detail.find("mlx5_0 port 1: ACTIVE, RoCE v2 GID 1 on eth0 (MTU 9000)"),
              std::string::npos)
        << find(checks, "RDMA").detail;
    // A host without an RDMA device has nothing to check.
    fs::remove_all(fs::path(root.path()) / "sys/class/infiniband");
    EXPECT_EQ(find(run_host_checks(o), "RDMA").status, CheckStatus::ok);
}

TEST(HostCheck, EachProblemWarnsWithTheCommandThatFixesIt) {
    TempDir root;
    put(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "powersave\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state0/name", "POLL\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state0/latency", "0\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state1/name", "C6\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state1/latency", "133\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state1/disable", "0\n");
    put(root, "proc/sys/net/core/rmem_max", "212992\n");
    put(root, "proc/sys/net/core/wmem_max", "212992\n");
    put(root, "proc/sys/net/ipv4/tcp_rmem", "4096 131072 1048576\n");
    put(root, "proc/sys/net/ipv4/tcp_wmem", "4096 16384 1048576\n");
    put(root, "proc/sys/net/ipv4/tcp_slow_start_after_idle", "1\n");
    put(root, "sys/class/net/enp1s0/mtu", "1500\n");
    put(root, "sys/class/net/enp1s0/speed", "10000\n");
    put(root, "sys/devices/system/cpu/isolated", "2-7\n");
    put(root, "proc/irq/default_smp_affinity", "ff\n");
    put(root, "proc/1234/comm", "irqbalance\n");
    put(root, "sys/kernel/mm/transparent_hugepage/enabled", "always madvise [never]\n");
    put(root, "proc/self/limits",
        "Max locked memory         8388608              8388608              bytes\n");
    put(root, "proc/meminfo", "SwapTotal: 8388608 kB\nSwapFree: 4194304 kB\n");
    put(root, "proc/sys/vm/swappiness", "60\n");
    put(root, "sys/devices/system/node/node0/x", "");
    put(root, "sys/devices/system/node/node1/x", "");
    // RoCE on an interface of MTU 1500 (RDMA packets of 1024 bytes); a second NIC with no IP address (no v2
    // GID).
    put(root, "sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/link_layer", "Ethernet\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gids/3", "0000:0000:0000:0000:0000:ffff:c0a8:0102\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/types/3", "RoCE v2\n");
    put(root, "sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/3", "enp1s0\n");
    put(root, "sys/class/infiniband/mlx5_1/ports/1/state", "4: ACTIVE\n");
    put(root, "sys/class/infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n");
    put(root, "sys/class/infiniband/mlx5_1/ports/1/gids/1", "0000:0000:0000:0000:0000:0000:0000:0000\n");
    put(root, "sys/class/infiniband/mlx5_1/ports/1/gid_attrs/types/1", "RoCE v2\n");
    HostCheckOptions o;
    o.root = root.path();
    o.interface = "enp1s0";
    o.read_gbps = 60;
    o.cpu_model = "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S";
    put(root, "cluster.secret", "0123456789abcdef0123456789abcdef\n");
    ::chmod((root.path() + "/cluster.secret").c_str(), 0644);
    o.secret_path = root.path() + "/cluster.secret";
    const auto checks = run_host_checks(o);
    for (const HostCheck &c : checks) {
        EXPECT_EQ(c.status, CheckStatus::warn) << c.name << ": " << c.detail;
        EXPECT_FALSE(c.fix.empty()) << c.name;
    }
    EXPECT_EQ(find(checks, "cpu governor").fix, "sudo cpupower frequency-set -g performance");
    EXPECT_NE(find(checks, "deep C-states").detail.find("C6 (133 µs exit)"), std::string::npos);
    EXPECT_EQ(find(checks, "socket receive buffer limit").fix, "sudo sysctl -w net.core.rmem_max=16777216");
    EXPECT_EQ(find(checks, "tcp send buffers").fix,
              "sudo sysctl -w net.ipv4.tcp_wmem=\"4096 16384 16777216\"");
    EXPECT_NE(find(checks, "MTU").fix.find("mtu 9000"), std::string::npos);
    EXPECT_NE(find(checks, "memory bandwidth").detail.find("about 200 GB/s"), std::string::npos);
    EXPECT_EQ(find(checks, "cluster secret").fix, "chmod 600 " + o.secret_path);
    EXPECT_NE(find(checks, "RDMA").fix.find("sudo ip link set enp1s0 mtu 9000"), std::string::npos)
        << find(checks, "RDMA").fix;
    EXPECT_NE(find(checks, "RDMA").detail.find("mlx5_1 port 1: ACTIVE RoCE port without a RoCE v2 GID"),
              std::string::npos)
        << find(checks, "RDMA").detail;
    // Without an RDMA device, a small locked-memory limit harms nothing.
    fs::remove_all(fs::path(root.path()) / "sys/class/infiniband");
    EXPECT_EQ(find(run_host_checks(o), "locked-memory limit").status, CheckStatus::ok);
    o.secret_path = root.path() + "/missing.secret";
    EXPECT_NE(find(run_host_checks(o), "cluster secret").fix.find("start `tandem worker` once"), std::string::npos);
}

TEST(HostCheck, GarbageInTheFilesIsCannotTell) {
    TempDir root;
    put(root, "proc/sys/net/core/rmem_max", "lots\n");
    put(root, "proc/sys/net/ipv4/tcp_rmem", "4096 131072\n");
    put(root, "sys/class/net/eth9/mtu", "\n");
    put(root, "proc/self/limits",
        "Max locked memory         many                 many                 bytes\n");
    put(root, "sys/devices/system/cpu/cpu0/cpuidle/state0/name", "POLL\n");  // no latency file
    put(root, "sys/class/infiniband/mlx5_0/ports/1/state", "\n");            // no link layer
    HostCheckOptions o;
    o.root = root.path();
    o.interface = "eth9";
    for (const HostCheck &c : run_host_checks(o))
        EXPECT_EQ(c.status, CheckStatus::unknown) << c.name << ": " << c.detail;
}

TEST(DoctorCli, JsonParsesOnThisHost) {
    auto r = test::run_tandem({"doctor", "--json", "--no-bandwidth", "--workers", "127.0.0.1:9"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_GE(j["checks"].size(), 15u);
    const std::set<std::string> statuses = {"OK", "WARN", "cannot tell"};
    for (const auto &c : j["checks"]) EXPECT_TRUE(statuses.count(c["status"].get<std::string>())) << c.dump();
    for (const auto &c : j["checks"])
        if (c["check"] == "MTU") {
            EXPECT_NE(c["detail"].get<std::string>().find("lo: MTU"), std::string::npos) << c.dump();
        }
    TempDir empty;
    r = test::run_tandem({"doctor", "--json", "--no-bandwidth", "--root", empty.path()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out)["warnings"], 0);
}

}  // namespace
}  // namespace td::cluster
