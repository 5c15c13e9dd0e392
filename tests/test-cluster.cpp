// Cluster tests: real `tandem worker` processes on 127.0.0.1 (port 0), a ClusterEngine in this process.
// Faults are real: workers are killed with SIGKILL, handshakes disagree through a test hook.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cluster/cluster-engine.h"
#include "cluster/fingerprint.h"
#include "cluster/placement.h"
#include "model/engine.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tp-slice.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td::cluster {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kModel = "models/stories260K.gguf";

using test::WorkerProcess;

std::shared_ptr<const Model> load_model() {
    auto m = Model::load(test::shared_path(kModel));
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? std::shared_ptr<const Model>(*m) : nullptr;
}

struct GenRun {
    std::vector<int32_t> tokens;
    std::vector<std::vector<float>> logits;
};

// Greedy generation with logits; small prompt chunks so several steps are in flight at once.
Result<GenRun> greedy(Engine &engine, int32_t n_predict = 12, int32_t n_batch = 2) {
    SamplerParams sp;
    sp.temperature = 0.0f;
    GenerateParams gp;
    gp.n_predict = n_predict;
    gp.n_batch = n_batch;
    gp.want_logits = true;
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 116, 292, 72};
    GenRun run;
    auto st = generate(
        engine, sp, prompt, gp, [](int32_t) { return false; },
        [&](int32_t token, const float *logits) {
            run.tokens.push_back(token);
            run.logits.emplace_back(logits, logits + engine.n_vocab());
            return true;
        });
    if (!st.ok()) return st.status();
    return run;
}

ContextParams small_context() {
    ContextParams cp;
    cp.n_ctx = 128;
    return cp;
}

GenRun local_reference(std::shared_ptr<const Model> model) {
    ThreadPool pool(1);
    auto e = LocalEngine::create(model, small_context(), pool);
    EXPECT_TRUE(e.ok());
    auto r = greedy(**e);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : GenRun{};
}

ClusterOptions options_for(const std::vector<const WorkerProcess *> &workers, const std::string &layers = "",
                           net::WireType wire = net::WireType::f32) {
    ClusterOptions o;
    o.secret = test::test_secret();
    for (const WorkerProcess *w : workers) o.workers += (o.workers.empty() ? "" : ",") + w->address();
    o.layers = layers;
    o.wire = wire;
    o.transports = test::test_transports();
    o.context = small_context();
    o.print_placement = false;
    o.stage_dir = "";
    return o;
}

bool bit_identical(const GenRun &a, const GenRun &b) {
    if (a.tokens != b.tokens || a.logits.size() != b.logits.size()) return false;
    for (size_t i = 0; i < a.logits.size(); ++i)
        if (a.logits[i].size() != b.logits[i].size() ||
            std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0)
            return false;
    return true;
}

TEST(ClusterPlacement, ParsesAndSplits) {
    auto r = parse_layer_ranges("0-1,2-4", 2, 5);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)[0], LayerRange(0, 2));
    EXPECT_EQ((*r)[1], LayerRange(2, 5));
    EXPECT_FALSE(parse_layer_ranges("0-1,3-4", 2, 5).ok());  // gap
    EXPECT_FALSE(parse_layer_ranges("0-4", 2, 5).ok());      // wrong count
    EXPECT_FALSE(parse_layer_ranges("0-1,2-3", 2, 5).ok());  // does not cover the model
    EXPECT_FALSE(parse_layer_ranges("0-x,2-4", 2, 5).ok());
    auto s = split_layers({3.0, 1.0}, 16);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)[0], LayerRange(0, 12));
    EXPECT_EQ((*s)[1], LayerRange(12, 16));
    auto t = split_layers({1.0, 1.0, 1.0}, 5);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(t->back().second, 5);
    for (const auto &range : *t) EXPECT_GE(range.second - range.first, 1);
    EXPECT_FALSE(split_layers({1.0, 1.0, 1.0}, 2).ok());
    // Equal shares of the work when the last stage also runs an output head worth 1.45 layers (a 1B model's
    // 32000-token head): 9 + (7 + 1.45) layers, not 8 + 8.
    auto h = split_layers({1.0, 1.0}, 16, 0, 1.45);
    ASSERT_TRUE(h.ok());
    EXPECT_EQ((*h)[0], LayerRange(0, 9));
    EXPECT_EQ((*h)[1], LayerRange(9, 16));
    auto big = split_layers({1.0, 1.0}, 2, 0, 50.0);  // a huge head still leaves the last worker one layer
    ASSERT_TRUE(big.ok());
    EXPECT_EQ((*big)[1], LayerRange(1, 2));
    EXPECT_FALSE(parse_split("1,0", 2).ok());
    EXPECT_FALSE(parse_worker_list("127.0.0.1").ok());
}

TEST(ClusterStageFile, LoadsAndHashesLikeTheOriginal) {
    auto model = load_model();
    ASSERT_TRUE(model);
    const gguf::File &f = model->file();
    const int32_t n_layer = model->hparams().n_layer;
    test::TempDir dir;
    for (LayerRange r : {LayerRange(0, 2), LayerRange(2, 4), LayerRange(3, n_layer)}) {
        const std::string path = dir.file("stage.gguf");
        ASSERT_TRUE(write_stage_file(f, r.first, r.second, n_layer, path).ok());
        auto stage = Model::load(path, {r.first, r.second, ""});
        ASSERT_TRUE(stage.ok()) << stage.status().message();
        EXPECT_EQ((*stage)->hparams().n_vocab, model->hparams().n_vocab);
        EXPECT_EQ(stage_fingerprint((*stage)->file(), r.first, r.second, n_layer),
                  stage_fingerprint(f, r.first, r.second, n_layer));
        EXPECT_LT((*stage)->file().file_size(), f.file_size());
    }
    EXPECT_NE(stage_fingerprint(f, 0, 2, n_layer), stage_fingerprint(f, 2, 4, n_layer));
}

// Bytes of `path`'s mappings resident in this process (/proc/self/smaps: the Rss of each of its areas).
size_t mapped_rss(const std::string &path) {
    std::ifstream in("/proc/self/smaps");
    size_t kib = 0;
    bool ours = false;
    for (std::string line; std::getline(in, line);) {
        const size_t colon = line.find(':'), space = line.find(' ');
        if (space != std::string::npos &&
            (colon == std::string::npos || colon > space)) {  // an area's header
            ours =
                line.size() >= path.size() && line.compare(line.size() - path.size(), path.size(), path) == 0;
        } else if (ours && line.rfind("Rss:", 0) == 0) {
            kib += std::strtoull(line.c_str() + 4, nullptr, 10);
        }
    }
    return kib * 1024;
}

// A head or a rank hashes weights it may never compute with: the hashed pages are unmapped again (the page
// cache keeps them), so the hash leaves none of them resident in the process.
TEST(ClusterStageFile, HashingLeavesTheHashedPagesUnmapped) {
    auto model = load_model();
    ASSERT_TRUE(model);
    const gguf::File &f = model->file();
    const int32_t n_layer = model->hparams().n_layer;
    const std::string real = std::filesystem::canonical(f.path()).string();
    const auto touch_all = [&] {
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < f.mapping().size(); i += 4096) sum = sum + f.mapping().data()[i];
    };
    touch_all();
    const size_t all = mapped_rss(real);
    ASSERT_GT(all, 512u * 1024) << real;
    (void)stage_fingerprint(f, 0, n_layer, n_layer);
    EXPECT_LT(mapped_rss(real), all / 4);
    touch_all();
    auto slices = tp_split(model->hparams(), {1.0, 1.0}, tp_ff_unit(f, 0, n_layer));
    ASSERT_TRUE(slices.ok()) << slices.status().message();
    auto plan = tp_slice_plan(f, model->hparams(), 0, n_layer, (*slices)[0]);
    ASSERT_TRUE(plan.ok()) << plan.status().message();
    (void)slice_fingerprint(f, *plan);
    EXPECT_LT(mapped_rss(real), all / 4);
}

TEST(Cluster, MatchesLocalThroughTwoAndThreeWorkers) {
    auto model = load_model();
    ASSERT_TRUE(model);
    const GenRun want = local_reference(model);
    ASSERT_EQ(want.tokens.size(), 12u);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2")), w3(cache.file("w3"));
    ASSERT_TRUE(w1.running() && w2.running() && w3.running()) << w1.log();
    struct Case {
        std::vector<const WorkerProcess *> workers;
        std::string layers;
    };
    const std::vector<Case> cases = {{{&w1, &w2}, "0-1,2-4"},
                                     {{&w1, &w2}, "0-0,1-4"},
                                     {{&w1, &w2}, "0-3,4-4"},
                                     {{&w1, &w2, &w3}, "0-1,2-2,3-4"},
                                     {{&w3, &w1, &w2}, ""}};
    for (const Case &c : cases) {
        SCOPED_TRACE(c.layers);
        auto e = ClusterEngine::create(model, options_for(c.workers, c.layers));
        ASSERT_TRUE(e.ok()) << e.status().message();
        auto got = greedy(**e);
        ASSERT_TRUE(got.ok()) << got.status().message();
        EXPECT_EQ(got->tokens, want.tokens);
        EXPECT_TRUE(bit_identical(*got, want)) << "logits differ with --wire f32";
    }
    // The default f16 wire rounds the hidden state: tokens still agree on this model and prompt.
    auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-1,2-4", net::WireType::f16));
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto got = greedy(**e);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(got->tokens, want.tokens);
}

TEST(Cluster, StreamsWeightsOnceThenLoadsFromCacheOrLocalFile) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"), 0, test::shared_path(kModel));
    ASSERT_TRUE(w1.running() && w2.running());
    for (int round = 0; round < 2; ++round) {
        auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-2,3-4"));
        ASSERT_TRUE(e.ok()) << e.status().message();
        const auto &nodes = (*e)->nodes();
        ASSERT_EQ(nodes.size(), 2u);
        if (round == 0) {
            EXPECT_EQ(nodes[0].source.rfind("streamed", 0), 0u) << nodes[0].source;
        } else {
            EXPECT_EQ(nodes[0].source.rfind("cache ", 0), 0u) << nodes[0].source;
        }
        EXPECT_EQ(nodes[1].source, "local file " + test::shared_path(kModel));
        EXPECT_GT(nodes[0].ready.weight_bytes, 0u);
        EXPECT_GT(nodes[1].ready.kv_bytes, 0u);
        EXPECT_NE((*e)->placement_table().find(w1.address()), std::string::npos);
        auto got = greedy(**e, 3);
        ASSERT_TRUE(got.ok()) << got.status().message();
    }
}

TEST(Cluster, FingerprintMismatchNamesBothHashesAndTheFile) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir dir;
    SynthParams sp;
    sp.n_embd = 64;
    sp.n_layer = 5;
    sp.n_head = 8;
    sp.n_head_kv = 4;
    sp.n_ff = 128;
    sp.vocab_from = test::shared_path(kModel);
    const std::string other = dir.file("other.gguf");
    ThreadPool pool(1);
    ASSERT_TRUE(synth_model(sp, other, pool).ok());
    WorkerProcess w1(dir.file("c1")), w2(dir.file("c2"), 0, other);
    ASSERT_TRUE(w1.running() && w2.running());
    const auto t0 = Clock::now();
    auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-1,2-4"));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_FALSE(e.ok());
    const std::string msg = e.status().message();
    EXPECT_NE(msg.find("worker " + w2.address()), std::string::npos) << msg;
    EXPECT_NE(msg.find(other), std::string::npos) << msg;
    EXPECT_NE(msg.find(fingerprint_hex(stage_fingerprint(model->file(), 2, 5, 5))), std::string::npos) << msg;
    EXPECT_LT(seconds, 3.0);
}

TEST(Cluster, ProtocolVersionMismatchNamesBothVersions) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir dir;
    WorkerProcess w1(dir.file("c1"), 0, "", {"TANDEM_PROTOCOL_VERSION_OVERRIDE=2"});
    ASSERT_TRUE(w1.running());
    const auto t0 = Clock::now();
    auto e = ClusterEngine::create(model, options_for({&w1}));
    ASSERT_FALSE(e.ok());
    const std::string want =
        fmt::format("worker {} speaks protocol 2, this build speaks {}", w1.address(), net::kProtocolVersion);
    EXPECT_EQ(e.status().message().substr(0, want.size()), want) << e.status().message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
}

// A killed worker ends the request within 3 s with an error naming it, and requests while it is down fail
// at once (the recovery half is the disabled test below).
TEST(Cluster, KilledWorkerFailsFastNamingIt) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const uint16_t port2 = w2.port();
    auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-1,2-4"));
    ASSERT_TRUE(e.ok()) << e.status().message();
    ASSERT_TRUE(greedy(**e).ok());

    w2.kill();
    auto t0 = Clock::now();
    auto failed = greedy(**e);
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find("worker 127.0.0.1:" + std::to_string(port2)), std::string::npos)
        << failed.status().message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);

    t0 = Clock::now();
    auto down = greedy(**e);
    ASSERT_FALSE(down.ok());
    EXPECT_NE(down.status().message().find(std::to_string(port2)), std::string::npos)
        << down.status().message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
}

// Once flaky (about 1 run in 15 under CPU load): a request that failed while steps were still queued left
// them queued, so later requests kept returning the old error instead of reconnecting. Fixed in
// ClusterEngine::ensure_connected; the worker logs are printed on failure.
TEST(Cluster, KilledWorkerFailsFastAndTheHeadRecoversWhenItIsBack) {
    auto model = load_model();
    ASSERT_TRUE(model);
    const GenRun want = local_reference(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const uint16_t port2 = w2.port();
    auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-1,2-4"));
    ASSERT_TRUE(e.ok()) << e.status().message();
    ASSERT_TRUE(greedy(**e).ok());

    w2.kill();
    auto t0 = Clock::now();
    auto failed = greedy(**e);
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.status().message().find("worker 127.0.0.1:" + std::to_string(port2)), std::string::npos)
        << failed.status().message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);

    // While it is down, a request fails at once, naming it.
    t0 = Clock::now();
    auto down = greedy(**e);
    ASSERT_FALSE(down.ok());
    EXPECT_NE(down.status().message().find(std::to_string(port2)), std::string::npos)
        << down.status().message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);

    // Back on the same port with the same cache: the same engine works again, nothing streamed.
    w2.start(cache.file("w2"), port2, "", {});
    ASSERT_TRUE(w2.running()) << w2.log();
    // A step continuing a sequence begun before the failure cannot silently run on empty state: it fails,
    // naming the original failure, and the sequence works again once started anew.
    Batch next;
    next.add(5, 3, 0, true);
    Status cont = (*e)->submit(next);
    ASSERT_FALSE(cont.ok());
    EXPECT_NE(cont.message().find("sequence 0 lost its state"), std::string::npos) << cont.message();
    EXPECT_NE(cont.message().find(std::to_string(port2)), std::string::npos) << cont.message();
    auto again = greedy(**e);
    ASSERT_TRUE(again.ok()) << again.status().message() << "\nworker 1 log:\n"
                            << w1.log() << "\nworker 2 log:\n"
                            << w2.log();
    EXPECT_TRUE(bit_identical(*again, want));
    EXPECT_EQ((*e)->nodes()[1].source.rfind("cache ", 0), 0u) << (*e)->nodes()[1].source;
}

TEST(Cluster, OneMessagePerHopPerDecodeStep) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2")), w3(cache.file("w3"));
    ASSERT_TRUE(w1.running() && w2.running() && w3.running());
    auto e = ClusterEngine::create(model, options_for({&w1, &w2, &w3}, "0-1,2-3,4-4", net::WireType::f16));
    ASSERT_TRUE(e.ok()) << e.status().message();
    ClusterEngine &engine = **e;
    SamplerParams sp;
    sp.temperature = 0.0f;
    ASSERT_TRUE(engine.seq_start(0, sp).ok());
    Batch batch;
    for (int32_t i = 0; i < 6; ++i) batch.add(1 + i, i, 0, i == 5);
    ASSERT_TRUE(engine.submit(batch).ok());
    auto out = engine.wait();
    ASSERT_TRUE(out.ok()) << out.status().message();
    auto before = engine.stats();
    ASSERT_TRUE(before.ok()) << before.status().message();
    constexpr int kSteps = 10;
    int32_t token = out->front().token;
    for (int32_t step = 0; step < kSteps; ++step) {
        batch.clear();
        batch.add(token, 6 + step, 0, true);
        ASSERT_TRUE(engine.submit(batch).ok());
        auto o = engine.wait();
        ASSERT_TRUE(o.ok()) << o.status().message();
        ASSERT_EQ(o->size(), 1u);
        token = o->front().token;
    }
    auto after = engine.stats();
    ASSERT_TRUE(after.ok()) << after.status().message();
    ASSERT_EQ(after->nodes.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
        SCOPED_TRACE(i);
        EXPECT_EQ(after->nodes[i].forward_steps - before->nodes[i].forward_steps, uint64_t(kSteps));
        EXPECT_EQ(after->nodes[i].msgs_in - before->nodes[i].msgs_in, uint64_t(kSteps));
        EXPECT_EQ(after->nodes[i].msgs_out - before->nodes[i].msgs_out, uint64_t(kSteps));
        EXPECT_GT(after->nodes[i].compute_seconds, 0.0);
    }
    EXPECT_EQ(after->head_msgs_sent - before->head_msgs_sent, uint64_t(kSteps));
    EXPECT_EQ(after->head_msgs_recv - before->head_msgs_recv, uint64_t(kSteps));
    // Only sampled tokens come back: a result is far smaller than a row of logits.
    EXPECT_LT((after->head_bytes_recv - before->head_bytes_recv) / kSteps, 64u);
    EXPECT_NE(engine.format_stats(*after).find(w2.address()), std::string::npos);
    // Every link between these processes of one host takes shared memory, unless the test asks for TCP.
    const std::string t = net::transport_name(test::test_link_transport());
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(after->nodes[i].links, fmt::format("in {}, out {}", t, t)) << i;
    EXPECT_EQ(after->head_links, fmt::format("in {}, out {}", t, t));
}

// The mappings of shared rings process `pid` holds.
int shm_mappings(pid_t pid) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    int n = 0;
    for (std::string line; std::getline(maps, line);)
        if (line.find("memfd:tandem-shm") != std::string::npos) ++n;
    return n;
}

// Waits up to `seconds` for pred(); true when it held.
template <typename Pred>
bool eventually(Pred pred, double seconds) {
    const auto t0 = Clock::now();
    while (!pred()) {
        if (std::chrono::duration<double>(Clock::now() - t0).count() > seconds) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
}

TEST(Cluster, AWorkerWithoutShmNegotiatesTcpAndNoMappingOutlivesAKill) {
    if (test::test_link_transport() != net::Transport::shm)
        GTEST_SKIP() << "shared memory not allowed in this run";
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    WorkerProcess w3(cache.file("w3"), 0, "", {}, {"--transport", "tcp"});  // a peer without shm
    ASSERT_TRUE(w1.running() && w2.running() && w3.running());
    const int before = shm_mappings(getpid());
    auto e = ClusterEngine::create(model, options_for({&w1, &w2, &w3}, "0-1,2-3,4-4"));
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto ref = local_reference(model);
    auto got = greedy(**e);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_TRUE(bit_identical(ref, *got));
    auto st = (*e)->stats();
    ASSERT_TRUE(st.ok()) << st.status().message();
    EXPECT_EQ(st->nodes[0].links, "in shm, out shm");
    EXPECT_EQ(st->nodes[1].links, "in shm, out tcp");  // to w3, which allows only TCP
    EXPECT_EQ(st->nodes[2].links, "in tcp, out tcp");
    EXPECT_EQ(st->head_links, "in tcp, out shm");
    // The head maps the rings of its control links to w1 and w2 and of its data link to w1; w1 those of its
    // control link, its input and its output; w2 those of its control link and its input.
    EXPECT_EQ(shm_mappings(getpid()) - before, 3);
    EXPECT_EQ(shm_mappings(w1.pid()), 3);
    EXPECT_EQ(shm_mappings(w2.pid()), 2);
    EXPECT_EQ(shm_mappings(w3.pid()), 0);

    // w2 dies mid-stream: found as fast as over TCP, and the survivors drop the rings they shared with it.
    const pid_t pid1 = w1.pid();
    Clock::time_point killed;
    std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        killed = Clock::now();
        w2.kill();
    });
    Status failed;
    for (int i = 0; i < 200 && failed.ok(); ++i) failed = greedy(**e, 24, 2).status();
    const auto found = Clock::now();
    killer.join();
    ASSERT_FALSE(failed.ok());
    EXPECT_NE(failed.message().find(std::to_string(w2.port())), std::string::npos) << failed.message();
    EXPECT_LT(std::chrono::duration<double>(found - killed).count(), 3.0) << failed.message();
    // w1 loses its next hop; its head reconnects on the next request and drops the old stage: every ring w1
    // had with w2 is unmapped.
    e->reset();  // the head goes too (its control links close): w1 drops its stage and every ring
    EXPECT_TRUE(eventually([&] { return shm_mappings(pid1) == 0; }, 3.0)) << shm_mappings(pid1);
    EXPECT_EQ(shm_mappings(getpid()), before);
}

TEST(Cluster, MalformedFramesCloseTheConnectionNotTheWorker) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1"));
    ASSERT_TRUE(w1.running());
    const std::vector<std::vector<uint8_t>> garbage = {
        std::vector<uint8_t>(32, 0xab),  // bad magic
        {'T',  'D',  'M',  '1',  1,    0,    1,    0,    0, 0, 0, 0, 0, 0, 0, 0,
         0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0},  // oversized hello
        {'T', 'D', 'M', '1', 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 100, 0,
         0,   0,   0,   0,   0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3},  // truncated payload
        {'T', 'D', 'M', '1', 1, 0, 99, 0, 0, 0, 0, 0, 0, 0, 0, 0,
         0,   0,   0,   0,   0, 0, 0,  0, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    for (const auto &bytes : garbage) {
        const int fd = socket(AF_INET, SOCK_STREAM, 0);
        ASSERT_GE(fd, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(w1.port());
        inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
        ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)), 0);
        ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
        ::shutdown(fd, SHUT_WR);
        char buf[256];
        while (::recv(fd, buf, sizeof(buf), 0) > 0) {
        }
        ::close(fd);
    }
    auto e = ClusterEngine::create(model, options_for({&w1}));
    ASSERT_TRUE(e.ok()) << e.status().message();
    EXPECT_TRUE(greedy(**e, 2).ok());
    EXPECT_NE(w1.log().find("closed"), std::string::npos) << w1.log();
}

}  // namespace
}  // namespace td::cluster

namespace td::cluster {
namespace {

// A request that fails with steps still queued must not poison the next one: once the worker is back, the
// next seq_start reconnects (regression: the queued steps used to keep the old error forever).
TEST(Cluster, FailureWithQueuedStepsDoesNotPoisonTheNextRequest) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const uint16_t port2 = w2.port();
    auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-1,2-4"));
    ASSERT_TRUE(e.ok()) << e.status().message();
    ClusterEngine &engine = **e;
    SamplerParams sp;
    sp.temperature = 0.0f;
    ASSERT_TRUE(engine.seq_start(0, sp).ok());
    Batch batch;
    batch.add(1, 0, 0, false);
    ASSERT_TRUE(engine.submit(batch).ok());
    w2.kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the head notices the closed links
    batch.clear();
    batch.add(2, 1, 0, true);
    Status s = engine.submit(batch);  // one step still queued: this request fails
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(std::to_string(port2)), std::string::npos) << s.message();
    w2.start(cache.file("w2"), port2, "", {});
    ASSERT_TRUE(w2.running()) << w2.log();
    auto again = greedy(engine, 3);
    ASSERT_TRUE(again.ok()) << again.status().message();
}

// A request the head can refuse by itself is refused before it touches the workers: a logit bias outside the
// vocabulary says so even while a worker is down (no reconnect first, no error about the worker).
TEST(Cluster, ALogitBiasOutsideTheVocabularyIsRefusedBeforeTheWorkers) {
    auto model = load_model();
    ASSERT_TRUE(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    auto e = ClusterEngine::create(model, options_for({&w1, &w2}, "0-1,2-4"));
    ASSERT_TRUE(e.ok()) << e.status().message();
    w2.kill();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the head notices the closed links
    SamplerParams sp;
    sp.temperature = 0.0f;
    sp.logit_bias = {{model->hparams().n_vocab, -1.0f}};
    const Status s = (*e)->seq_start(0, sp);
    EXPECT_EQ(s.kind(), ErrorKind::invalid_input) << s.message();
    EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace td::cluster

namespace td::cluster {
namespace {

// --stats' advice for a tensor-parallel group whose ranks ran at different speeds: the shares that would have
// made them busy for the same time.
TEST(ClusterPlacement, TensorParallelSharesFromWhatEachRankComputedPerSecond) {
    // Even work, one rank busy 1.5x as long: it is the slower one; it should get 1 / 1.5 of the other's
    // share.
    auto s = tp_rebalance({100.0, 100.0}, {1.5, 1.0});
    ASSERT_EQ(s.size(), 2u);
    EXPECT_DOUBLE_EQ(s[0], 1.0);
    EXPECT_DOUBLE_EQ(s[1], 1.5);
    // Uneven work (280 : 213 MiB) on equal speeds, so busy in proportion: even shares would even them out.
    s = tp_rebalance({280.0, 213.0}, {2.80, 2.13});
    ASSERT_EQ(s.size(), 2u);
    EXPECT_NEAR(s[0], 1.0, 1e-12);
    EXPECT_NEAR(s[1], 1.0, 1e-12);
    // Work in proportion to speed: both busy alike, nothing to say.
    EXPECT_TRUE(tp_rebalance({280.0, 213.0}, {2.11, 2.11}).empty());
    // The second rank busy 0.8 of the first's time on 213 of 280: what each computed per second.
    s = tp_rebalance({280.0, 213.0}, {2.11, 2.11 * 0.8});
    ASSERT_EQ(s.size(), 2u);
    EXPECT_NEAR(s[1] / s[0], (213.0 / (2.11 * 0.8)) / (280.0 / 2.11), 1e-12);
    EXPECT_DOUBLE_EQ(*std::min_element(s.begin(), s.end()), 1.0);
    // Within 10% is noise; three ranks; too short a run to tell; figures that do not add up.
    EXPECT_TRUE(tp_rebalance({1.0, 1.0}, {1.09, 1.0}).empty());
    s = tp_rebalance({1.0, 1.0, 2.0}, {1.0, 2.0, 1.0});
    ASSERT_EQ(s.size(), 3u);
    EXPECT_DOUBLE_EQ(s[0], 2.0);
    EXPECT_DOUBLE_EQ(s[1], 1.0);
    EXPECT_DOUBLE_EQ(s[2], 4.0);
    EXPECT_TRUE(tp_rebalance({1.0, 1.0}, {0.02, 0.01}).empty());
    EXPECT_TRUE(tp_rebalance({1.0, 0.0}, {2.0, 1.0}).empty());
    EXPECT_TRUE(tp_rebalance({1.0, 1.0}, {2.0, -1.0}).empty());
    EXPECT_TRUE(tp_rebalance({1.0}, {2.0}).empty());
    EXPECT_TRUE(tp_rebalance({1.0, 1.0}, {2.0}).empty());
}

TEST(ClusterPlacement, HeadLayersAndAutomaticChunks) {
    auto r = parse_layer_ranges("2-3,4-4", 2, 5, 2);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ((*r)[0], LayerRange(2, 4));
    EXPECT_FALSE(parse_layer_ranges("0-3,4-4", 2, 5, 2).ok());  // the head runs 0-1
    auto s = split_layers({1.0, 1.0}, 16, 4);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ((*s)[0], LayerRange(4, 10));
    EXPECT_EQ((*s)[1], LayerRange(10, 16));
    EXPECT_FALSE(split_layers({1.0, 1.0}, 5, 4).ok());  // one layer left for two workers

    EXPECT_EQ(auto_chunk_rows(512, 1), 512);  // one stage: nothing to overlap
    EXPECT_EQ(auto_chunk_rows(1, 2), 32);     // a decode step stays one message
    EXPECT_EQ(auto_chunk_rows(16, 3), 32);
    EXPECT_EQ(auto_chunk_rows(512, 2), 32);  // 16 chunks through 2 stages
    EXPECT_EQ(auto_chunk_rows(512, 4), 32);
    const int32_t huge = 300000;  // more than one message holds: at most kMaxPartsPerStep messages
    EXPECT_LE(auto_chunk_rows(huge, 1), static_cast<int32_t>(net::kMaxBatchRows));
    EXPECT_LE((huge + auto_chunk_rows(huge, 2) - 1) / auto_chunk_rows(huge, 2), kMaxPartsPerStep);
}

// --head-layers N: the head runs layers 0..N-1 itself and the workers the rest; tokens and (wire f32)
// logits equal the local run for N = 0, 1, 2, and the placement shows the head's row.
TEST(Cluster, HeadLayersMatchLocal) {
    auto model = load_model();
    ASSERT_TRUE(model);
    const GenRun want = local_reference(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    struct Case {
        int32_t head_layers;
        std::string layers;
    };
    for (const Case &c : {Case{0, ""}, Case{1, ""}, Case{2, "2-3,4-4"}}) {
        SCOPED_TRACE(c.head_layers);
        ClusterOptions o = options_for({&w1, &w2}, c.layers);
        o.head_layers = c.head_layers;
        o.head_threads = 1;
        auto e = ClusterEngine::create(model, o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        EXPECT_EQ((*e)->nodes()[0].layers.first, c.head_layers);
        EXPECT_EQ((*e)->n_stages(), c.head_layers > 0 ? 3 : 2);
        const std::string table = (*e)->placement_table();
        if (c.head_layers == 0) {
            EXPECT_EQ(table.find("  head "), std::string::npos) << table;
        } else {
            EXPECT_NE(table.find(fmt::format("head                   0-{}", c.head_layers - 1)),
                      std::string::npos)
                << table;
        }
        auto got = greedy(**e);
        ASSERT_TRUE(got.ok()) << got.status().message();
        EXPECT_EQ(got->tokens, want.tokens);
        EXPECT_TRUE(bit_identical(*got, want)) << "logits differ with --wire f32";
        // Recovery resets the head's own cache too: a second request from position 0 works.
        auto again = greedy(**e, 3);
        ASSERT_TRUE(again.ok()) << again.status().message();
    }
    ClusterOptions bad = options_for({&w1, &w2});
    bad.head_layers = 4;  // 5 layers, two workers need one each
    auto e = ClusterEngine::create(model, bad);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("--head-layers 4"), std::string::npos) << e.status().message();
}

// A long prompt step is cut into chunks that travel as separate messages (stats count them) and the
// outputs are those of one message: same tokens, bit-identical logits with wire f32.
TEST(Cluster, LongPromptStepIsCutIntoChunks) {
    auto model = load_model();
    ASSERT_TRUE(model);
    const GenRun want = local_reference(model);
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    for (int32_t head_layers : {0, 1}) {
        SCOPED_TRACE(head_layers);
        ClusterOptions o = options_for({&w1, &w2}, "");
        o.chunk_rows = 3;
        o.head_layers = head_layers;
        o.head_threads = 1;
        auto e = ClusterEngine::create(model, o);
        ASSERT_TRUE(e.ok()) << e.status().message();
        auto got = greedy(**e, 12, /*n_batch=*/512);  // the 7-token prompt in one submit
        ASSERT_TRUE(got.ok()) << got.status().message();
        EXPECT_TRUE(bit_identical(*got, want));
        auto st = (*e)->stats();
        ASSERT_TRUE(st.ok()) << st.status().message();
        // 3 prompt chunks (3 + 3 + 1 rows) + 11 decode steps.
        for (const net::StatsReply &node : st->nodes) EXPECT_EQ(node.forward_steps, 3u + 11u);
    }
}

}  // namespace
}  // namespace td::cluster

namespace td::cluster {
namespace {

// The CLI: `tandem run --head-layers` prints the placement with the head's row and generates the local
// run's text; `tandem bench` with the cluster flags reports pipeline records with --parallel.
TEST(ClusterCli, RunWithHeadLayersAndBenchThroughWorkers) {
    test::TempDir cache;
    WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const std::string model = test::shared_path(kModel);
    const std::string workers = w1.address() + "," + w2.address();
    const std::vector<std::string> gen = {"run", "-m", model, "--temp", "0", "-n", "16", "-t", "1"};
    auto local = test::run_tandem(gen);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    std::vector<std::string> args = gen;
    args.insert(args.end(), {"--workers", workers, "--head-layers", "2", "--wire", "f32"});
    auto cl = test::run_tandem(args);
    ASSERT_EQ(cl.exit_code, 0) << cl.err;
    EXPECT_EQ(cl.out, local.out);
    EXPECT_NE(cl.err.find("head layers 2"), std::string::npos) << cl.err;
    EXPECT_NE(cl.err.find("  head                   0-1"), std::string::npos) << cl.err;

    auto bench = test::run_tandem({"bench", "-m", model, "--workers", workers, "-t", "1", "-p", "8", "-n",
                                   "4", "-r", "1", "--parallel", "1,3", "-o", "jsonl"});
    ASSERT_EQ(bench.exit_code, 0) << bench.err;
    std::vector<std::string> lines;
    for (size_t at = 0, eol; (eol = bench.out.find('\n', at)) != std::string::npos; at = eol + 1)
        lines.push_back(bench.out.substr(at, eol - at));
    ASSERT_EQ(lines.size(), 4u) << bench.out;  // (pp8, tg4) x (1, 3 sequences)
    EXPECT_NE(lines[0].find("\"n_parallel\": 1"), std::string::npos) << lines[0];
    EXPECT_NE(lines[3].find("\"n_parallel\": 3"), std::string::npos) << lines[3];
    for (const std::string &l : lines) EXPECT_NE(l.find("\"pipeline\": \"2-stage "), std::string::npos) << l;

    auto bad = test::run_tandem({"run", "-m", model, "--head-layers", "1", "-n", "1"});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("need --workers"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace td::cluster
