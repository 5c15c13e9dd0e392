// Tensor parallelism across real `tandem worker` processes on 127.0.0.1 (port 0): --tp 2, --tp 3 (4 KV heads
// over 3 nodes), a 2-stage x 2-node layout; the collective's two all-reduces per layer counted from the
// workers' stats; a rank killed or stalled in the middle of a stream.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "cluster/cluster-engine.h"
#include "model/engine.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/synth.h"
#include "test-child-process.h"
#include "test-tp-util.h"
#include "test-util.h"

namespace td::cluster {
namespace {

using test::greedy;
using test::seeded;

using Clock = std::chrono::steady_clock;
using test::WorkerProcess;

const std::string kModel = "models/stories260K.gguf";
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};  // BOS "Once upon a time"

#define REQUIRE_MODEL() \
    if (!test::shared_exists(kModel)) GTEST_SKIP() << "no " << test::shared_path(kModel)

std::shared_ptr<const Model> load_model() {
    auto m = Model::load(test::shared_path(kModel));
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::shared_ptr<const Model>(*m) : nullptr;
}

struct GenRun {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

// on_token(i) runs after the i-th generated token (e.g. to kill a node mid-stream).
Result<GenRun> generate_run(Engine &engine, const SamplerParams &sp, int32_t n, bool want_logits,
                         const std::function<void(int)> &on_token = {}) {
    GenerateParams gp;
    gp.n_predict = n;
    gp.n_batch = 3;  // the prompt in two steps
    gp.want_logits = want_logits;
    GenRun run;
    auto st = generate(
        engine, sp, kPrompt, gp, [](int32_t) { return false; },
        [&](int32_t token, const float *logits) {
            run.tokens.push_back(token);
            if (want_logits) run.logits.emplace_back(logits, logits + engine.n_vocab());
            if (on_token) on_token(static_cast<int>(run.tokens.size()));
            return true;
        });
    if (!st.ok()) return st.status();
    return run;
}

ContextParams context() {
    ContextParams cp;
    cp.n_ctx = 128;
    cp.type_k = cp.type_v = KvType::f32;
    return cp;
}

GenRun local(std::shared_ptr<const Model> model, const SamplerParams &sp, int32_t n, bool want_logits) {
    ThreadPool pool(1);
    auto e = LocalEngine::create(model, context(), pool);
    EXPECT_TRUE(e.ok());
    auto r = generate_run(**e, sp, n, want_logits);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : GenRun{};
}

ClusterOptions tp_options(const std::vector<WorkerProcess *> &workers, int32_t tp, const std::string &layout = "") {
    static test::TempDir stage_dir;  // the head's slice files, fresh for this test binary
    ClusterOptions o;
    o.secret = test::test_secret();
    o.stage_dir = stage_dir.path();
    for (const WorkerProcess *w : workers) o.workers += (o.workers.empty() ? "" : ",") + w->address();
    o.tp = tp;
    o.layout = layout;
    o.transports = test::test_transports();
    o.wire = net::WireType::f32;
    o.context = context();
    o.print_placement = false;
    return o;
}

void expect_close(const GenRun &want, const GenRun &got) {
    ASSERT_EQ(got.tokens, want.tokens);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    for (size_t s = 0; s < want.logits.size(); ++s) {
        float scale = 0.0f, worst = 0.0f;
        for (size_t i = 0; i < want.logits[s].size(); ++i) {
            scale = std::max(scale, std::fabs(want.logits[s][i]));
            worst = std::max(worst, std::fabs(want.logits[s][i] - got.logits[s][i]));
        }
        EXPECT_LE(worst, 1e-4f * scale) << "step " << s;
    }
}

struct Layout {
    size_t n_workers;
    int32_t tp;
    std::string layout;
    std::string split;  // per-worker shares ("": measured speed)
};

// n real `tandem worker` processes, their caches in `cache` (w0, w1, ...).
struct Workers {
    std::vector<std::unique_ptr<WorkerProcess>> procs;
    std::vector<WorkerProcess *> ptrs;
};
Workers start_workers(size_t n, const test::TempDir &cache) {
    Workers w;
    for (size_t i = 0; i < n; ++i) {
        std::string name = "w";  // (not "w" + to_string: g++ 12 -O3 warns falsely on it, -Wrestrict)
        name += std::to_string(i);
        w.procs.push_back(std::make_unique<WorkerProcess>(cache.file(name)));
        EXPECT_TRUE(w.procs.back()->running()) << w.procs.back()->log();
        w.ptrs.push_back(w.procs.back().get());
    }
    return w;
}

TEST(TpCluster, GreedyAndSeededEqualOneMachineOverTwoThreeAndTwoByTwo) {
    REQUIRE_MODEL();
    auto model = load_model();
    const GenRun want = local(model, greedy(), 64, true);
    const GenRun want_seeded = local(model, seeded(42), 64, false);
    for (const Layout &l : {Layout{2, 2, "", ""}, Layout{3, 3, "", ""}, Layout{4, 1, "2,2", ""},
                            Layout{2, 2, "", "3,1"}}) {
        SCOPED_TRACE(::testing::Message() << l.n_workers << " workers, tp " << l.tp << " layout " << l.layout
                                          << " split " << l.split);
        test::TempDir cache;
        Workers workers = start_workers(l.n_workers, cache);
        const std::vector<WorkerProcess *> &ws = workers.ptrs;
        ClusterOptions o = tp_options(ws, l.tp, l.layout);
        o.split = l.split;
        auto e = ClusterEngine::create(model, o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        if (l.split == "3,1") {  // a fast and a slow node: 3 of the 4 KV heads, three quarters of the FFN rows
            EXPECT_EQ((*e)->nodes()[0].slice.n_kv(), 3);
            EXPECT_EQ((*e)->nodes()[1].slice.n_kv(), 1);
            EXPECT_GT((*e)->nodes()[0].slice.n_ff(), 2 * (*e)->nodes()[1].slice.n_ff());
        }
        auto got = generate_run(**e, greedy(), 64, true);
        ASSERT_TRUE(got.ok()) << got.status().message() << "\n" << ws[0]->log();
        expect_close(want, *got);
        auto sparse = generate_run(**e, greedy(), 64, false);  // the ranks send only their best candidates
        ASSERT_TRUE(sparse.ok()) << sparse.status().message();
        EXPECT_EQ(sparse->tokens, want.tokens);
        auto s = generate_run(**e, seeded(42), 64, false);
        ASSERT_TRUE(s.ok()) << s.status().message();
        EXPECT_EQ(s->tokens, want_seeded.tokens);
        // Each rank holds only its KV heads: a one-stage group's KV caches add up to one machine's.
        if (l.layout.empty()) {
            uint64_t kv = 0;
            for (const NodeStatus &n : (*e)->nodes()) kv += n.ready.kv_bytes;
            ThreadPool pool(1);
            auto ctx = Context::create(model, context(), pool);
            ASSERT_TRUE(ctx.ok());
            EXPECT_EQ(kv, (*ctx)->kv().bytes());
        }
    }
}

TEST(TpCluster, TwoAllReducesPerLayerPerDecodingStep) {
    REQUIRE_MODEL();
    auto model = load_model();
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    auto e = ClusterEngine::create(model, tp_options({&w1, &w2}, 2));
    ASSERT_TRUE(e.ok()) << e.status().message();
    ASSERT_TRUE((*e)->seq_start(0, greedy()).ok());
    Batch b;
    for (size_t i = 0; i < kPrompt.size(); ++i)
        b.add(kPrompt[i], static_cast<int32_t>(i), 0, i + 1 == kPrompt.size());
    ASSERT_TRUE((*e)->submit(b).ok());
    ASSERT_TRUE((*e)->wait().ok());
    auto before = (*e)->stats();
    ASSERT_TRUE(before.ok()) << before.status().message();
    const int32_t n_steps = 20;
    for (int32_t i = 0; i < n_steps; ++i) {  // decoding steps of one token, continuing the sequence
        b.clear();
        b.add(100 + i, static_cast<int32_t>(kPrompt.size()) + i, 0, true);
        ASSERT_TRUE((*e)->submit(b).ok());
        ASSERT_TRUE((*e)->wait().ok());
    }
    auto after = (*e)->stats();
    ASSERT_TRUE(after.ok()) << after.status().message();
    const int32_t n_layer = model->hparams().n_layer;
    for (size_t i = 0; i < 2; ++i) {
        const net::StatsReply &a = after->nodes[i], &z = before->nodes[i];
        EXPECT_EQ(a.forward_steps - z.forward_steps, static_cast<uint64_t>(n_steps));
        EXPECT_EQ(a.tp_all_reduces - z.tp_all_reduces, static_cast<uint64_t>(2 * n_layer * n_steps));
        EXPECT_EQ(a.tp_gathers - z.tp_gathers, static_cast<uint64_t>(n_steps));  // one sampling merge each
        EXPECT_GT(a.tp_bytes_out, z.tp_bytes_out);
    }
    const std::string table = (*e)->format_stats(*after);
    EXPECT_NE(table.find("all-red"), std::string::npos) << table;
}

// A rank killed (SIGKILL) or stalled (SIGSTOP) in the middle of a stream: the stream ends with an error naming
// it within 3 s, and the next request after it is back succeeds on the same engine.
void fault_during_stream(bool kill) {
    auto model = load_model();
    const GenRun want = local(model, greedy(), 24, false);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const uint16_t port2 = w2.port();
    auto e = ClusterEngine::create(model, tp_options({&w1, &w2}, 2));
    ASSERT_TRUE(e.ok()) << e.status().message();
    Clock::time_point t_fault;
    auto failed = generate_run(**e, greedy(), 64, false, [&](int i) {
        if (i != 8) return;
        t_fault = Clock::now();
        if (kill)
            w2.kill();
        else
            w2.stall();
    });
    const double took = std::chrono::duration<double>(Clock::now() - t_fault).count();
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find("127.0.0.1:" + std::to_string(port2)), std::string::npos)
        << failed.status().message();
    EXPECT_LT(took, 3.0) << failed.status().message();
    if (kill) {
        w2.start(cache.file("w2"), port2, "", {});
        ASSERT_TRUE(w2.running()) << w2.log();
    } else {
        w2.resume();
    }
    Result<GenRun> again = Status(ErrorKind::failed, "not run");
    for (int attempt = 0; attempt < 3 && !again.ok(); ++attempt) {  // a resumed worker drops its old head first
        again = generate_run(**e, greedy(), 24, false);
        if (!again.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
    ASSERT_TRUE(again.ok()) << again.status().message() << "\nworker 2 log:\n" << w2.log();
    EXPECT_EQ(again->tokens, want.tokens);
}

TEST(TpCluster, KilledRankEndsTheStreamNamingItAndTheHeadRecovers) {
    REQUIRE_MODEL();
    fault_during_stream(true);
}

TEST(TpCluster, StalledRankEndsTheStreamNamingItAndTheHeadRecovers) {
    REQUIRE_MODEL();
    fault_during_stream(false);
}

TEST(TpCluster, RankWithItsOwnCopyCutsItsSliceAndCachesIt) {
    REQUIRE_MODEL();
    auto model = load_model();
    const GenRun want = local(model, greedy(), 16, false);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1"), 0, test::shared_path(kModel)), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    for (int round = 0; round < 2; ++round) {
        auto e = ClusterEngine::create(model, tp_options({&w1, &w2}, 2));
        ASSERT_TRUE(e.ok()) << e.status().message();
        auto got = generate_run(**e, greedy(), 16, false);
        ASSERT_TRUE(got.ok()) << got.status().message();
        EXPECT_EQ(got->tokens, want.tokens);
        const std::string &src1 = (*e)->nodes()[0].source, &src2 = (*e)->nodes()[1].source;
        if (round == 0) {
            EXPECT_EQ(src1.rfind("sliced from ", 0), 0u) << src1;
            EXPECT_EQ(src2.rfind("streamed from the head", 0), 0u) << src2;
        } else {  // the second time both come from the cache
            EXPECT_EQ(src1.rfind("cache ", 0), 0u) << src1;
            EXPECT_EQ(src2.rfind("cache ", 0), 0u) << src2;
        }
    }
}

// The synthesized qwen2, qwen3 and gemma2 models over --tp 2 workers: 64 greedy ids equal to one machine's up to
// the first step where its top-2 margin is below 1e-3 (random weights: the partial sums' new order can flip a
// near tie).
TEST(TpCluster, SynthArchitecturesGreedyEqualOneMachineUntilATie) {
    REQUIRE_MODEL();
    test::TempDir dir;
    for (const std::string arch : {"qwen2", "qwen3", "gemma2"}) {
        SCOPED_TRACE(arch);
        const std::string path = dir.file(arch + ".gguf");
        ASSERT_TRUE(test::synth_tp_model(arch, DType::f32, path).ok());
        auto m = Model::load(path);
        ASSERT_TRUE(m.ok());
        std::shared_ptr<const Model> model = *m;
        const GenRun want = local(model, greedy(), 64, true);
        size_t agree = 0;
        for (; agree < want.logits.size(); ++agree) {
            std::vector<float> row = want.logits[agree];
            std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
            if (row[0] - row[1] < 1e-3f) break;
        }
        EXPECT_GE(agree, 8u) << "the synthesized model ties too early to say anything";
        WorkerProcess w1(dir.file(arch + "-w1")), w2(dir.file(arch + "-w2"));
        ASSERT_TRUE(w1.running() && w2.running());
        auto e = ClusterEngine::create(model, tp_options({&w1, &w2}, 2));
        ASSERT_TRUE(e.ok()) << e.status().message();
        auto got = generate_run(**e, greedy(), 64, false);
        ASSERT_TRUE(got.ok()) << got.status().message();
        for (size_t st = 0; st < agree; ++st) EXPECT_EQ(got->tokens[st], want.tokens[st]) << "step " << st;
    }
}

// --tp-reduce f16 / bf16 halve the all-reduce bytes; the logits move by the parts' rounding. Measured here
// (printed for docs/benchmarks.md) and bounded: greedy ids agree with one machine until a step where its top-2
// margin is within the rounding's reach.
TEST(TpCluster, HalfPrecisionAllReducesMoveTheLogitsALittle) {
    REQUIRE_MODEL();
    auto model = load_model();
    const GenRun want = local(model, greedy(), 32, true);
    for (auto [reduce, bound] : {std::pair{net::ReduceType::f16, 1e-2f}, std::pair{net::ReduceType::bf16, 5e-2f}}) {
        test::TempDir cache;
        WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
        ASSERT_TRUE(w1.running() && w2.running());
        ClusterOptions o = tp_options({&w1, &w2}, 2);
        o.tp_reduce = reduce;
        auto e = ClusterEngine::create(model, o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        auto got = generate_run(**e, greedy(), 32, true);
        ASSERT_TRUE(got.ok()) << got.status().message();
        float worst_rel = 0.0f;
        size_t agree = 0;
        while (agree < want.tokens.size() && got->tokens[agree] == want.tokens[agree]) ++agree;
        for (size_t st = 0; st < std::min(agree + 1, want.tokens.size()); ++st) {
            float scale = 0.0f, worst = 0.0f;
            for (size_t i = 0; i < want.logits[st].size(); ++i) {
                scale = std::max(scale, std::fabs(want.logits[st][i]));
                worst = std::max(worst, std::fabs(want.logits[st][i] - got->logits[st][i]));
            }
            worst_rel = std::max(worst_rel, worst / scale);
            if (st == agree && agree < want.tokens.size()) {  // the first different id: a near tie
                std::vector<float> row = want.logits[st];
                std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
                EXPECT_LT(row[0] - row[1], 2 * bound * scale) << "step " << st;
            }
        }
        EXPECT_LE(worst_rel, bound) << net::reduce_type_name(reduce);
        std::printf("all-reduce %s: logits within %.2e of the row's largest |logit| for %zu steps; ids equal for "
                    "%zu of %zu steps\n",
                    net::reduce_type_name(reduce), worst_rel, std::min(agree + 1, want.tokens.size()), agree,
                    want.tokens.size());
    }
}

// --head-node: the head is rank 0 of the first group (a worker in the head's process), so two boxes are the
// head and one worker. The same ids, logits and seeded text as one machine over --tp 2, a 2x2 hybrid and a
// whole-layer head stage before a group; the head's node counts its two all-reduces per layer; a killed
// worker ends the stream naming it within 3 s and the head serves again once it is back.
TEST(TpCluster, HeadNodeIsRankZeroOfTheFirstGroup) {
    REQUIRE_MODEL();
    auto model = load_model();
    const GenRun want = local(model, greedy(), 64, true);
    const GenRun want_seeded = local(model, seeded(7), 64, false);
    for (const Layout &l : {Layout{1, 2, "", ""}, Layout{3, 1, "2,2", ""}, Layout{2, 1, "1,2", ""}}) {
        SCOPED_TRACE(::testing::Message()
                     << "head + " << l.n_workers << " workers, tp " << l.tp << " layout " << l.layout);
        test::TempDir cache;
        Workers workers = start_workers(l.n_workers, cache);
        const std::vector<WorkerProcess *> &ws = workers.ptrs;
        ClusterOptions o = tp_options(ws, l.tp, l.layout);
        o.head_node = true;
        o.head_threads = 1;
        auto e = ClusterEngine::create(model, o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        const std::vector<NodeStatus> &nodes = (*e)->nodes();
        ASSERT_EQ(nodes.size(), l.n_workers + 1);
        EXPECT_EQ(nodes[0].address, "head node");
        EXPECT_EQ(nodes[0].stage, 0);
        EXPECT_EQ(nodes[0].rank, 0);
        EXPECT_EQ(nodes[0].tp_size, l.layout == "1,2" ? 1 : 2);
        EXPECT_EQ((*e)->layout().rfind("head node", 0), 0u) << (*e)->layout();
        auto got = generate_run(**e, greedy(), 64, true);
        ASSERT_TRUE(got.ok()) << got.status().message() << "\n" << ws[0]->log();
        expect_close(want, *got);
        auto s = generate_run(**e, seeded(7), 64, false);
        ASSERT_TRUE(s.ok()) << s.status().message();
        EXPECT_EQ(s->tokens, want_seeded.tokens);
        if (l.tp == 2) {  // the head's node works on every step: 2 all-reduces per layer of each
            auto st = (*e)->stats();
            ASSERT_TRUE(st.ok()) << st.status().message();
            const net::StatsReply &head = st->nodes[0];
            EXPECT_GT(head.forward_steps, 0u);
            EXPECT_EQ(head.tp_all_reduces,
                      2u * static_cast<uint64_t>(model->hparams().n_layer) * head.forward_steps);
            EXPECT_EQ(head.tp_all_reduces, st->nodes[1].tp_all_reduces);
            EXPECT_NE((*e)->format_stats(*st).find("head node"), std::string::npos);

            const uint16_t port = ws[0]->port();
            Clock::time_point t_kill;
            auto failed = generate_run(**e, greedy(), 64, false, [&](int i) {
                if (i != 8) return;
                t_kill = Clock::now();
                ws[0]->kill();
            });
            const double took = std::chrono::duration<double>(Clock::now() - t_kill).count();
            ASSERT_FALSE(failed.ok());
            EXPECT_NE(failed.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
                << failed.status().message();
            EXPECT_LT(took, 3.0) << failed.status().message();
            ws[0]->start(cache.file("w0"), port, "", {});
            ASSERT_TRUE(ws[0]->running()) << ws[0]->log();
            auto again = generate_run(**e, greedy(), 64, true);
            ASSERT_TRUE(again.ok()) << again.status().message();
            expect_close(want, *again);
        }
    }
    ClusterOptions o = tp_options({}, 2);
    o.workers = "127.0.0.1:1,127.0.0.1:2";
    o.head_node = true;
    auto odd = ClusterEngine::create(model, o);
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(
        odd.status().message().find("needs a multiple of 2 workers (stages of 2 nodes), got 3 (--head-node"),
        std::string::npos)
        << odd.status().message();
    o.tp = 1;
    o.head_layers = 1;
    odd = ClusterEngine::create(model, o);
    ASSERT_FALSE(odd.ok());
    EXPECT_NE(odd.status().message().find("give one of them"), std::string::npos) << odd.status().message();
}

// The README's commands: `tandem run --workers A,B --tp 2` prints one machine's text, `tandem bench --tp 2`
// reports the layout, and the flags without --workers are refused.
TEST(TpCluster, RunAndBenchCommandsWithTp) {
    REQUIRE_MODEL();
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const std::string model = test::shared_path(kModel);
    const std::string workers = w1.address() + "," + w2.address();
    const std::vector<std::string> gen = {"run", "-m", model, "--temp", "0", "-n", "32", "-t", "1"};
    auto local = test::run_tandem(gen);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    std::vector<std::string> args = gen;
    args.insert(args.end(), {"--workers", workers, "--tp", "2", "--stats"});
    auto tp = test::run_tandem(args);
    ASSERT_EQ(tp.exit_code, 0) << tp.err;
    EXPECT_EQ(tp.out, local.out);
    // The placement table's slices (how many heads each rank gets follows the speeds the workers measured).
    EXPECT_NE(tp.err.find("0/2: kv 0-"), std::string::npos) << tp.err;
    EXPECT_NE(tp.err.find("1/2: kv "), std::string::npos) << tp.err;
    EXPECT_NE(tp.err.find("all-red"), std::string::npos) << tp.err;      // --stats: the collectives

    auto bench = test::run_tandem(
        {"bench", "-m", model, "--workers", workers, "--tp", "2", "-t", "1", "-p", "8", "-n", "4", "-r", "1", "-o", "jsonl"});
    ASSERT_EQ(bench.exit_code, 0) << bench.err;
    EXPECT_NE(bench.out.find("\"pipeline\": \"1-stage 0-4x2"), std::string::npos) << bench.out;

    // Two boxes: the head and one worker, both computing every layer.
    args = gen;
    args.insert(args.end(), {"--workers", w1.address(), "--tp", "2", "--head-node"});
    auto head_node = test::run_tandem(args);
    ASSERT_EQ(head_node.exit_code, 0) << head_node.err;
    EXPECT_EQ(head_node.out, local.out);
    EXPECT_NE(head_node.err.find("head node "), std::string::npos) << head_node.err;

    // A hybrid as `tandem plan` writes one: the head alone, then both workers tensor-parallel with uneven
    // shares (--layers places the layers, --split then only shares the heads and FFN rows).
    args = gen;
    args.insert(args.end(), {"--workers", workers, "--head-node", "--layout", "1,2", "--layers", "0-1,2-4",
                             "--split", "1,3,1", "--stats"});
    auto hybrid = test::run_tandem(args);
    ASSERT_EQ(hybrid.exit_code, 0) << hybrid.err;
    EXPECT_EQ(hybrid.out, local.out);
    EXPECT_NE(hybrid.err.find("0/2: kv 0-2"), std::string::npos) << hybrid.err;  // 3 of the 4 KV heads
    // Without a tensor-parallel stage the two contradict each other.
    args = gen;
    args.insert(args.end(), {"--workers", workers, "--layers", "0-1,2-4", "--split", "1,3"});
    auto both = test::run_tandem(args);
    EXPECT_EQ(both.exit_code, 1);
    EXPECT_NE(both.err.find("give either --layers or --split for a pipeline"), std::string::npos) << both.err;

    auto bad = test::run_tandem({"run", "-m", model, "--tp", "2", "-n", "1"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("need --workers"), std::string::npos) << bad.err;
}

// Two ranks on like cores given three and one quarters of the work (--split 3,1): rank 0 is busy about three
// times as long, and --stats names them with the shares their speeds call for, near even (work over busy
// time).
TEST(TpCluster, StatsNameRanksThatRanAtDifferentSpeedsWithTheSharesThatEvenThem) {
    REQUIRE_MODEL();
    test::TempDir dir;
    SynthParams p;  // 4 layers of 512 wide with 4096 FFN rows in f32: ~110 MiB, milliseconds a step
    p.n_embd = 512;
    p.n_layer = 4;
    p.n_head = 8;
    p.n_head_kv = 4;
    p.n_ff = 4096;
    p.n_ctx = 512;
    p.vocab_from = test::shared_path(kModel);
    const std::string path = dir.file("synth.gguf");
    {
        ThreadPool pool(2);
        ASSERT_TRUE(synth_model(p, path, pool).ok());
    }
    WorkerProcess w1(dir.file("w1")), w2(dir.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    auto bench =
        test::run_tandem({"bench", "-m", path, "--workers", w1.address() + "," + w2.address(), "--tp", "2",
                          "--split", "3,1", "-t", "1", "-p", "8", "-n", "128", "-r", "1", "--stats"});
    ASSERT_EQ(bench.exit_code, 0) << bench.err;
    const std::string key = "shares in proportion to their speeds: --split ";
    const size_t at = bench.err.find(key);
    ASSERT_NE(at, std::string::npos) << bench.err;
    double a = 0, b = 0;
    ASSERT_EQ(std::sscanf(bench.err.c_str() + at + key.size(), "%lf,%lf", &a, &b), 2) << bench.err;
    EXPECT_TRUE(a == 1.0 || b == 1.0) << bench.err;  // the slower rank's share is the unit
    // Like cores: near even, nowhere near the 3 : 1 it ran with (the cores of this host differ up to ~1.4x,
    // and another test running beside this one under ctest -j2 once made one core read 2.0x the other).
    EXPECT_GT(a / b, 0.4) << bench.err;
    EXPECT_LT(a / b, 2.5) << bench.err;
}

TEST(TpCluster, LayoutErrorsNameTheProblem) {
    REQUIRE_MODEL();
    auto model = load_model();
    ClusterOptions o;
    o.secret = test::test_secret();
    o.workers = "127.0.0.1:1,127.0.0.1:2,127.0.0.1:3";
    o.tp = 2;
    auto e = ClusterEngine::create(model, o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("--tp 2 needs a multiple of 2 workers"), std::string::npos)
        << e.status().message();
    o.tp = 1;
    o.layout = "2,2";
    e = ClusterEngine::create(model, o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("places 4 nodes, --workers lists 3"), std::string::npos)
        << e.status().message();
}

}  // namespace
}  // namespace td::cluster
