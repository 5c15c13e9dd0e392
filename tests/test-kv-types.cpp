// Quantized KV caches (--kv-type, --cache-type-k/-v, llama.cpp's -ctk/-ctv): what they cost in memory, how
// far they move the logits from an f16 cache, that a prompt's cut and a copied prefix change nothing, the
// commands' flags, and the types travelling to the workers of a pipeline and of --tp 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cluster/cluster-engine.h"
#include "core/thread-pool.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/synth.h"
#include "test-child-process.h"
#include "test-tp-util.h"
#include "test-util.h"

namespace td {
namespace {

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 290, 265, 300, 275, 267, 411, 312};

// A model whose heads fit the 32-value blocks: 4 query and 2 KV heads of 32, 5 layers (so 0-1,2-4 and --tp 2
// both split it), stories260K's vocabulary. Written once per test binary.
const std::string &synth_path() {
    static test::TempDir dir;
    static const std::string path = [] {
        SynthParams p;
        p.n_embd = 128;
        p.n_layer = 5;
        p.n_head = 4;
        p.n_head_kv = 2;
        p.n_ff = 256;
        p.n_ctx = 256;
        p.type = DType::q8_0;
        p.seed = 11;
        p.vocab_from = test::shared_path("models/stories260K.gguf");
        ThreadPool pool(2);
        const std::string out = dir.file("heads32.gguf");
        const Status st = synth_model(p, out, pool);
        EXPECT_TRUE(st.ok()) << st.message();
        return out;
    }();
    return path;
}

std::shared_ptr<const Model> load(const std::string &path) {
    auto m = Model::load(path);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::shared_ptr<const Model>(*m) : nullptr;
}

ContextParams context(KvType k, KvType v, int32_t n_seq = 1) {
    ContextParams cp;
    cp.n_ctx = 128;
    cp.n_seq = n_seq;
    cp.type_k = k;
    cp.type_v = v;
    return cp;
}

struct GenRun {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

GenRun generate_run(Engine &engine, int32_t n, int32_t n_batch = 5) {
    GenerateParams gp;
    gp.n_predict = n;
    gp.n_batch = n_batch;
    gp.want_logits = true;
    GenRun run;
    auto st = generate(
        engine, test::greedy(), kPrompt, gp, [](int32_t) { return false; },
        [&](int32_t token, const float *logits) {
            run.tokens.push_back(token);
            run.logits.emplace_back(logits, logits + engine.n_vocab());
            return true;
        });
    EXPECT_TRUE(st.ok()) << st.status().message();
    return run;
}

GenRun local_run(const std::shared_ptr<const Model> &model, KvType k, KvType v, int32_t n,
                 int32_t n_batch = 5) {
    ThreadPool pool(2);
    auto e = LocalEngine::create(model, context(k, v), pool);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? generate_run(**e, n, n_batch) : GenRun{};
}

// The largest |a - b| over a step's logits, relative to the largest |a|.
float relative_change(const std::vector<float> &a, const std::vector<float> &b) {
    float worst = 0.0f, size = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(a[i] - b[i]));
        size = std::max(size, std::fabs(a[i]));
    }
    return worst / size;
}

// Memory: a position's K and V rows take their types' bytes (q8_0 34 per 32 values, q4_0 18), and the
// context reserves that per layer, slot and position; K and V may differ.
TEST(KvTypes, EachTypeTakesItsBytesPerPosition) {
    auto model = load(synth_path());
    ASSERT_TRUE(model);
    const int32_t n_embd_kv = 64, n_layer = 5;
    EXPECT_EQ(KvCache::bytes_per_token(n_layer, n_embd_kv, KvType::f16, KvType::f16), 5u * (128 + 128));
    EXPECT_EQ(KvCache::bytes_per_token(n_layer, n_embd_kv, KvType::q8_0, KvType::q8_0), 5u * (68 + 68));
    EXPECT_EQ(KvCache::bytes_per_token(n_layer, n_embd_kv, KvType::q8_0, KvType::q4_0), 5u * (68 + 36));
    EXPECT_EQ(KvCache::bytes_per_token(n_layer, n_embd_kv, KvType::f32, KvType::q5_1), 5u * (256 + 48));
    EXPECT_DOUBLE_EQ(kv_bytes_per_value(KvType::q8_0, KvType::q8_0), 34.0 / 32.0);
    ThreadPool pool(1);
    for (auto [k, v] : {std::pair{KvType::f16, KvType::f16}, std::pair{KvType::q8_0, KvType::q4_0},
                        std::pair{KvType::bf16, KvType::q5_0}}) {
        auto ctx = Context::create(model, context(k, v, 3), pool);
        ASSERT_TRUE(ctx.ok()) << ctx.status().message();
        const size_t want = KvCache::bytes_per_token(n_layer, n_embd_kv, k, v) * 3 * 128;
        EXPECT_GE((*ctx)->kv().bytes(), want) << kv_type_name(k) << "/" << kv_type_name(v);
        EXPECT_LT((*ctx)->kv().bytes(), want + 2 * 65536) << kv_type_name(k) << "/" << kv_type_name(v);
        Batch b;
        for (int32_t i = 0; i < 10; ++i) b.add(kPrompt[static_cast<size_t>(i)], i, 1, false);
        ASSERT_TRUE((*ctx)->decode(b).ok());
        EXPECT_EQ((*ctx)->kv().bytes_in_use(), 10 * KvCache::bytes_per_token(n_layer, n_embd_kv, k, v));
    }
}

// Logits of every row of `tokens` fed in one step (the math per row does not depend on the batch).
std::vector<std::vector<float>> forced_logits(const std::shared_ptr<const Model> &model, KvType k, KvType v,
                                              const std::vector<int32_t> &tokens) {
    ThreadPool pool(2);
    auto ctx = Context::create(model, context(k, v), pool);
    EXPECT_TRUE(ctx.ok()) << ctx.status().message();
    if (!ctx.ok()) return {};
    Batch b;
    for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], static_cast<int32_t>(i), 0, true);
    EXPECT_TRUE((*ctx)->decode(b).ok());
    std::vector<std::vector<float>> out;
    const int32_t n_vocab = (*ctx)->n_vocab_local();
    for (size_t i = 0; i < tokens.size(); ++i)
        out.emplace_back((*ctx)->logits() + i * n_vocab, (*ctx)->logits() + (i + 1) * n_vocab);
    return out;
}

// The root mean square of a - b over that of a - mean(a): how far a row of logits moved, against their
// spread.
double rms_change(const std::vector<float> &a, const std::vector<float> &b) {
    double mean = 0.0, diff = 0.0, spread = 0.0;
    for (float x : a) mean += x;
    mean /= static_cast<double>(a.size());
    for (size_t i = 0; i < a.size(); ++i) {
        diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
        spread += (a[i] - mean) * (a[i] - mean);
    }
    return std::sqrt(diff / spread);
}

// Every position of a 60-token text (the prompt and an f32 cache's greedy continuation) fed to each cache
// type: the logits move from the f32 cache's by the type's rounding (f16, bf16 and q8_0 alike, then q5_1,
// q4_0 the most), and the best token stays the same at nearly every position (measured: printed for
// docs/benchmarks.md).
TEST(KvTypes, QuantizedCachesMoveTheLogitsByTheirRounding) {
    auto model = load(synth_path());
    ASSERT_TRUE(model);
    std::vector<int32_t> text = kPrompt;
    const GenRun cont = local_run(model, KvType::f32, KvType::f32, 48);
    text.insert(text.end(), cont.tokens.begin(), cont.tokens.end());
    const auto exact = forced_logits(model, KvType::f32, KvType::f32, text);
    ASSERT_EQ(exact.size(), text.size());
    struct Case {
        KvType k, v;
        double bound;  // of the median position's rms change
    };
    std::vector<double> medians;
    for (const Case &c : {Case{KvType::f16, KvType::f16, 0.03}, Case{KvType::bf16, KvType::bf16, 0.03},
                          Case{KvType::q8_0, KvType::f16, 0.03}, Case{KvType::q8_0, KvType::q8_0, 0.03},
                          Case{KvType::q5_1, KvType::q5_1, 0.08}, Case{KvType::q4_0, KvType::q4_0, 0.2}}) {
        const auto got = forced_logits(model, c.k, c.v, text);
        ASSERT_EQ(got.size(), exact.size());
        std::vector<double> change;
        size_t same_best = 0;
        for (size_t i = 0; i < got.size(); ++i) {
            change.push_back(rms_change(exact[i], got[i]));
            same_best += std::max_element(exact[i].begin(), exact[i].end()) - exact[i].begin() ==
                         std::max_element(got[i].begin(), got[i].end()) - got[i].begin();
        }
        std::sort(change.begin(), change.end());
        const double median = change[change.size() / 2];
        std::printf(
            "K %s V %s: logits' rms change against an f32 cache's, over their spread: median %.5f, "
            "worst %.5f; best token the same at %zu of %zu positions\n",
            kv_type_name(c.k), kv_type_name(c.v), median, change.back(), same_best, got.size());
        EXPECT_LE(median, c.bound) << kv_type_name(c.k) << "/" << kv_type_name(c.v);
        EXPECT_GT(median, 0.0) << kv_type_name(c.k) << "/" << kv_type_name(c.v);
        EXPECT_GE(same_best * 10, got.size() * 8) << kv_type_name(c.k) << "/" << kv_type_name(c.v);
        medians.push_back(median);
    }
    EXPECT_LT(medians[3], medians[4]);  // q8_0 < q5_1 < q4_0
    EXPECT_LT(medians[4], medians[5]);
}

// The math per row does not depend on the batch: the prompt in one step, in steps of 1 or 3 tokens, gives the
// same logits bit for bit; and a slot that copies another's prefix (the prefix cache) continues as a fresh
// one.
TEST(KvTypes, APromptsCutAndACopiedPrefixChangeNothing) {
    auto model = load(synth_path());
    ASSERT_TRUE(model);
    const GenRun whole = local_run(model, KvType::q8_0, KvType::q4_1, 16, 64);
    for (int32_t n_batch : {1, 3}) {
        const GenRun cut = local_run(model, KvType::q8_0, KvType::q4_1, 16, n_batch);
        EXPECT_EQ(cut.tokens, whole.tokens) << n_batch;
        EXPECT_EQ(cut.logits, whole.logits) << n_batch;
    }
    ThreadPool pool(1);
    auto ctx = Context::create(model, context(KvType::q8_0, KvType::f16, 2), pool);
    ASSERT_TRUE(ctx.ok());
    Batch b;
    for (int32_t i = 0; i < 12; ++i) b.add(kPrompt[static_cast<size_t>(i)], i, 0, i == 11);
    ASSERT_TRUE((*ctx)->decode(b).ok());
    const std::vector<float> fresh((*ctx)->logits(), (*ctx)->logits() + (*ctx)->n_vocab_local());
    (*ctx)->seq_copy(0, 1, 8);  // slot 1 takes the first 8 positions, then is fed the rest
    Batch rest;
    for (int32_t i = 8; i < 12; ++i) rest.add(kPrompt[static_cast<size_t>(i)], i, 1, i == 11);
    ASSERT_TRUE((*ctx)->decode(rest).ok());
    const std::vector<float> copied((*ctx)->logits(), (*ctx)->logits() + (*ctx)->n_vocab_local());
    EXPECT_EQ(copied, fresh);
}

// A block type needs heads that are whole blocks: stories260K's heads of 8 are refused, naming the head size;
// the library and the command say so.
TEST(KvTypes, HeadsThatAreNotWholeBlocksAreRefused) {
    auto model = load(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(model);
    ThreadPool pool(1);
    auto ctx = Context::create(model, context(KvType::f16, KvType::q8_0), pool);
    ASSERT_FALSE(ctx.ok());
    EXPECT_EQ(ctx.status().kind(), ErrorKind::invalid_input);
    EXPECT_NE(ctx.status().message().find("a q8_0 V cache needs a head size that is a multiple of 32"),
              std::string::npos)
        << ctx.status().message();
    EXPECT_TRUE(Context::create(model, context(KvType::bf16, KvType::f32), pool).ok());
    test::ProcessResult p = test::run_tandem(
        {"run", "-m", test::shared_path("models/stories260K.gguf"), "-n", "4", "-ctk", "q4_0"});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("q4_0 K cache needs a head size"), std::string::npos) << p.err;
}

std::string run_text(const std::vector<std::string> &extra) {
    std::vector<std::string> args = {"run",    "-m", synth_path(), "-p", "Once upon a time", "-n", "24",
                                     "--temp", "0",  "-t",         "1"};
    args.insert(args.end(), extra.begin(), extra.end());
    test::ProcessResult r = test::run_tandem(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
}

// `tandem run`: --kv-type sets both halves, -ctk / -ctv (and their long names) each one; names are
// llama.cpp's, in any case; an unknown one is refused naming the flag and the accepted types.
TEST(KvTypes, RunTakesLlamaCppsCacheTypeFlags) {
    const std::string q8 = run_text({"--kv-type", "q8_0"});
    EXPECT_FALSE(q8.empty());
    EXPECT_EQ(run_text({"-ctk", "q8_0", "-ctv", "Q8_0"}), q8);
    EXPECT_EQ(run_text({"--cache-type-k", "q8_0", "--cache-type-v", "q8_0"}), q8);
    EXPECT_EQ(run_text({"--kv-type", "q8_0", "-ctv", "q8_0"}), q8);
    const std::string mixed = run_text({"--kv-type", "q4_0", "-ctk", "q8_0"});  // K q8_0, V q4_0
    EXPECT_EQ(run_text({"-ctk", "q8_0", "-ctv", "q4_0"}), mixed);
    for (const auto &[flag, value] : {std::pair{"--kv-type", "q3_k"}, std::pair{"-ctv", "f8"}}) {
        test::ProcessResult p = test::run_tandem({"run", "-m", synth_path(), "-n", "2", flag, value});
        EXPECT_NE(p.exit_code, 0) << flag;
        EXPECT_NE(p.err.find(std::string(flag) == "-ctv" ? "--cache-type-v" : flag), std::string::npos)
            << p.err;
        EXPECT_NE(p.err.find("f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1"), std::string::npos) << p.err;
    }
}

// `tandem bench`: -ctk and -ctv lists give every K type with every V type, as llama-bench's; --kv-type alone
// each type for both.
TEST(KvTypes, BenchCrossesTheKAndVLists) {
    test::ProcessResult r = test::run_tandem({"bench", "-m", synth_path(), "-p", "8", "-n", "0", "-r", "1",
                                              "-t", "1", "-ctk", "q8_0,f16", "-ctv", "q4_0", "-o", "jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream in(r.out);
    std::vector<std::pair<std::string, std::string>> got;
    for (std::string line; std::getline(in, line);) {
        const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << line;
        got.emplace_back(j["type_k"], j["type_v"]);
        EXPECT_GT(j["avg_ts"].get<double>(), 0.0);
    }
    const std::vector<std::pair<std::string, std::string>> want = {{"q8_0", "q4_0"}, {"f16", "q4_0"}};
    EXPECT_EQ(got, want);
}

// The cache types travel to the workers: a pipeline (0-1 | 2-4, f32 wire) gives one machine's tokens and
// logits bit for bit; --tp 2 gives its tokens and logits within the partial sums' rounding; each rank holds
// its KV heads in those types, so the group's caches add up to one machine's (f16 would be twice as much).
TEST(KvTypes, AClustersWorkersKeepTheirCachesInTheTypesGiven) {
    auto model = load(synth_path());
    ASSERT_TRUE(model);
    const KvType k = KvType::q8_0, v = KvType::q5_0;
    const GenRun want = local_run(model, k, v, 24);
    for (const bool tp : {false, true}) {
        SCOPED_TRACE(tp ? "--tp 2" : "pipeline");
        test::TempDir cache;
        test::WorkerProcess w0(cache.file("w0")), w1(cache.file("w1"));
        ASSERT_TRUE(w0.running()) << w0.log();
        ASSERT_TRUE(w1.running()) << w1.log();
        cluster::ClusterOptions o;
        o.secret = test::test_secret();
        o.workers = w0.address() + "," + w1.address();
        if (tp) {
            o.tp = 2;
        } else {
            o.layers = "0-1,2-4";
        }
        o.wire = net::WireType::f32;
        o.transports = test::test_transports();
        o.context = context(k, v);
        o.print_placement = false;
        auto e = cluster::ClusterEngine::create(model, o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        const GenRun got = generate_run(**e, 24);
        ASSERT_EQ(got.tokens, want.tokens) << w0.log();
        if (!tp) {
            EXPECT_EQ(got.logits, want.logits);
        } else {
            for (size_t s = 0; s < want.logits.size(); ++s)
                EXPECT_LE(relative_change(want.logits[s], got.logits[s]), 1e-4f) << "step " << s;
            // Each rank reserves its K and V regions whole pages at a time.
            uint64_t kv = 0;
            for (const cluster::NodeStatus &n : (*e)->nodes()) kv += n.ready.kv_bytes;
            const uint64_t typed = KvCache::bytes_per_token(5, 64, k, v) * 128;
            EXPECT_GE(kv, typed);
            EXPECT_LE(kv, typed + 4 * 4096);
        }
    }
}

}  // namespace
}  // namespace td
