// Measurements against real worker processes: echo round trips and streams, compute probes, a worker
// measuring its own link, the delay relay, netbench, and a delayed link moving plan's prediction and
// recommendation the way the measured run moves.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "cluster/cost-model.h"
#include "cluster/planner.h"
#include "cluster/probe.h"
#include "gguf/gguf.h"
#include "net/delay-relay.h"
#include "net/ucx.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td::cluster {
namespace {

using test::TempDir;
using test::test_secret;
using test::WorkerProcess;

const std::string kModel = "models/stories260K.gguf";

LinkOptions small_link(int budget_ms = 20) {
    LinkOptions o;
    o.rtt_sizes = {64, 4096};
    o.stream_sizes = {1u << 20};
    o.budget_ms = budget_ms;
    return o;
}

TEST(Probe, RoundTripsAndStreams) {
    TempDir dir;
    WorkerProcess w(dir.file("cache"));
    ASSERT_TRUE(w.running()) << w.log();
    auto c = ProbeClient::connect(w.address(), test_secret());
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ((*c)->hello().n_threads, 1u);
    auto s = (*c)->measure_link(small_link());
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_EQ(s->size(), 3u);
    for (const net::LinkSample &x : *s) {
        EXPECT_GE(x.count, x.mode == 0 ? static_cast<uint32_t>(kMinRounds) : 4u);
        EXPECT_GT(x.p50, 0);
        EXPECT_LE(x.p50, x.p90);
        EXPECT_LE(x.p90, x.p99);
        EXPECT_LE(x.p99, x.max);
        EXPECT_GT(x.gbps, 0);
    }
    EXPECT_EQ((*s)[2].mode, 1u);
    EXPECT_GT(link_latency_seconds(*s), 0);
    EXPECT_LT(link_latency_seconds(*s), 0.05);
    EXPECT_GT(link_bytes_per_second(*s), 1e6);
}

TEST(Probe, ComputeProbeTimesEveryPointAndRefusesBadShapes) {
    TempDir dir;
    WorkerProcess w(dir.file("cache"));
    auto c = ProbeClient::connect(w.address(), test_secret());
    ASSERT_TRUE(c.ok()) << c.status().message();
    net::ProbeCompute req;
    req.budget_ms = 2;
    req.working_set = 4u << 20;
    req.matrices = {{static_cast<uint32_t>(DType::q4_0), 256, 256},
                    {static_cast<uint32_t>(DType::q8_0), 512, 128},
                    {static_cast<uint32_t>(DType::q4_k), 256, 64}};
    req.rows = {1, 8};
    req.ops = {64, 172, 8, 4, 8, 64};
    auto r = (*c)->compute(req);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->seconds.size(), 6u);
    for (double t : r->seconds) EXPECT_GT(t, 0);
    EXPECT_EQ(r->n_threads, 1u);
    EXPECT_GT(r->read_gbps, 0);
    for (double t : {r->norm_s, r->act_s, r->rope_s, r->attn_s}) EXPECT_GT(t, 0);
    // A type without kernels and a row length that is not whole blocks are refused; the connection stays.
    req.matrices = {{99, 256, 256}};
    auto bad = (*c)->compute(req);
    ASSERT_FALSE(bad.ok());
    req.matrices = {{static_cast<uint32_t>(DType::q4_0), 100, 16}};
    bad = (*c)->compute(req);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("not whole q4_0 blocks"), std::string::npos)
        << bad.status().message();
    EXPECT_TRUE((*c)->measure_link(small_link(5)).ok());
}

// A probe connection's compute probes read the same memory every request (fresh pages cost the kernel's
// zeroing each time, 0.6-5 s a request in this VM); a larger request gets a larger buffer.
TEST(ProbeArena, KeepsItsMemoryAcrossRequestsAndGrows) {
    ProbeArena arena;
    auto a = arena.get(1, 4u << 20);
    ASSERT_TRUE(a.ok());
    auto b = arena.get(1, 1u << 20);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*a, *b);
    auto other = arena.get(0, 1u << 20);
    ASSERT_TRUE(other.ok());
    EXPECT_NE(*other, *a);
    auto big = arena.get(1, 8u << 20);
    ASSERT_TRUE(big.ok());
    (*big)[(8u << 20) - 1] = 7;  // all of it is there
    auto again = arena.get(1, 4u << 20);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *big);
}

// Pins every thread of process `pid` (and so the threads they start) to `cpu`.
void pin_process(pid_t pid, int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    for (const auto &e : std::filesystem::directory_iterator(fmt::format("/proc/{}/task", pid)))
        ASSERT_EQ(sched_setaffinity(std::stoi(e.path().filename().string()), sizeof(set), &set), 0);
}

// Two workers pinned to one core: plan measures them alone and together and sees each run about half as fast
// together, streaming weights and computing (a tensor-parallel pair of them is flagged and not recommended).
// Alone and together are timed seconds apart with the two probes' windows overlapping; a pair on one core
// alone measured 1.8-2.2x here, under a loaded suite (a third process on the core) 1.5x.
TEST(PlanContention, TwoWorkersOnOneCoreAreMeasuredSharingIt) {
    if (!test::shared_exists(kModel)) GTEST_SKIP() << "missing " << kModel;
    cpu_set_t mine;
    ASSERT_EQ(sched_getaffinity(0, sizeof(mine), &mine), 0);
    int cpu = 0;
    while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &mine)) ++cpu;
    TempDir dir;
    WorkerProcess a(dir.file("a")), b(dir.file("b"));
    ASSERT_TRUE(a.running() && b.running());
    pin_process(a.pid(), cpu);
    pin_process(b.pid(), cpu);
    auto f = gguf::File::open(test::shared_path(kModel));
    ASSERT_TRUE(f.ok());
    auto shape = model_shape_from_file(*f);
    ASSERT_TRUE(shape.ok());
    PlanOptions o;
    o.batches = {1};
    o.probe_ms = 2;
    o.rounds = 1;
    o.link_ms = 10;
    o.n_threads = 1;
    o.working_set = 8u << 20;  // light on a loaded suite: on one core the two take turns, cached or not
    o.transports = net::kTransportsTcp;
    auto spec = measure_cluster({a.address(), b.address()}, *shape, o, test_secret(), {});
    ASSERT_TRUE(spec.ok()) << spec.status().message();
    EXPECT_GT(spec->together_of(0, 1), 1.3);
    EXPECT_GT(spec->together_of(0, 1, /*stream=*/true), 1.3);
    EXPECT_LT(spec->together_of(0, 1, true), 3.0);
    // One host, the same threads: one kind, measured as one (PlanOptions::pool_kinds), so the plan cannot
    // tell the two apart by a passing swing of the host.
    ASSERT_EQ(spec->nodes.size(), 2u);
    EXPECT_FALSE(spec->nodes[0].measured.empty());
    EXPECT_EQ(spec->nodes[0].measured, spec->nodes[1].measured);
    EXPECT_EQ(spec->nodes[0].read_bytes_per_s, spec->nodes[1].read_bytes_per_s);
    EXPECT_EQ(spec->nodes[0].attn_per_pos_s, spec->nodes[1].attn_per_pos_s);
    EXPECT_EQ(spec->nodes[0].matvec_efficiency, spec->nodes[1].matvec_efficiency);
    const Plan p = make_plan(*shape, *spec, o);
    const PlanBatch &pb = p.batches[0];
    ASSERT_GE(pb.best_tp, 0);
    ASSERT_GE(pb.recommended, 0);
    for (const auto &stage : pb.entries[static_cast<size_t>(pb.best_tp)].layout.shares)
        for (double share : stage) EXPECT_EQ(share, stage.front());
    if (spec->together_of(0, 1) >= ClusterSpec::kSharedCore) {
        EXPECT_TRUE(pb.entries[static_cast<size_t>(pb.best_tp)].prediction.shares_core);
        EXPECT_NE(pb.entries[static_cast<size_t>(pb.recommended)].layout.kind(), "tensor parallel");
    }
}

TEST(Probe, AWorkerMeasuresItsLinkToAnother) {
    TempDir dir;
    WorkerProcess a(dir.file("a")), b(dir.file("b"));
    auto c = ProbeClient::connect(a.address(), test_secret());
    ASSERT_TRUE(c.ok());
    auto s = (*c)->link_to(b.address(), small_link());
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->size(), 3u);
    auto dead = (*c)->link_to("127.0.0.1:1", small_link());
    ASSERT_FALSE(dead.ok());
    EXPECT_NE(dead.status().message().find("127.0.0.1:1"), std::string::npos) << dead.status().message();
}

// A lock-step probe of a layer's worth of small matrices: two segments, an all-reduce of n_embd values after
// each.
net::ProbeSync small_sync(const std::string &peer, uint32_t budget_ms = 100, uint32_t rows = 1) {
    net::ProbeSync r;
    r.n_threads = 1;
    r.budget_ms = budget_ms;
    r.working_set = 8u << 20;
    r.rows = rows;
    r.n_embd = 256;
    r.split = 2;
    const auto q4 = static_cast<uint32_t>(DType::q4_0);
    r.matrices = {{q4, 256, 256}, {q4, 256, 256}, {q4, 256, 512}, {q4, 512, 256}};
    r.peer = peer;
    r.transports = net::kTransportsTcp;
    return r;
}

TEST(Probe, TwoWorkersRunInLockStepAndSayWhatEachWaited) {
    TempDir dir;
    WorkerProcess a(dir.file("a")), b(dir.file("b"));
    auto c = ProbeClient::connect(a.address(), test_secret());
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto r = (*c)->sync(small_sync(b.address()));
    ASSERT_TRUE(r.ok()) << r.status().message();
    ASSERT_EQ(r->ranks.size(), 2u);
    EXPECT_GE(r->segments, 2u);
    EXPECT_EQ(r->segments % 2, 0u);  // whole rounds: both segments of a layer
    EXPECT_GE(r->wall_s, 0.1);       // rank 0 ran for the budget
    EXPECT_LT(r->wall_s, 10.0);
    for (const net::ProbeSyncRank &k : r->ranks) {
        EXPECT_GT(k.compute_s, 0);
        // Every timed moment of a rank is its matrices or its all-reduces, through the same wall.
        EXPECT_LE(k.compute_s + k.wait_s, r->wall_s * 1.1 + 0.01);
        EXPECT_GE(k.compute_s + k.wait_s, r->wall_s * 0.7);
    }
    // Both workers go on serving: the same probe connection at another row count, and b a new one.
    auto again = (*c)->sync(small_sync(b.address(), 50, 16));
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(again->ranks.size(), 2u);
    auto cb = ProbeClient::connect(b.address(), test_secret());
    ASSERT_TRUE(cb.ok()) << cb.status().message();
    EXPECT_TRUE((*cb)->measure_link(small_link()).ok());
    // A peer nobody listens at is an error naming it; the connection stays usable.
    auto dead = (*c)->sync(small_sync("127.0.0.1:1"));
    ASSERT_FALSE(dead.ok());
    EXPECT_NE(dead.status().message().find("127.0.0.1:1"), std::string::npos) << dead.status().message();
    auto after = (*c)->sync(small_sync(b.address(), 20));
    EXPECT_TRUE(after.ok()) << after.status().message();
}

TEST(Probe, InLockStepARankWaitsOutTheOthersStallAndItsLinksDelay) {
    TempDir dir;
    WorkerProcess a(dir.file("a")), b(dir.file("b"));
    auto c = ProbeClient::connect(a.address(), test_secret());
    ASSERT_TRUE(c.ok()) << c.status().message();
    // b stops for 400 ms in the middle (well after the probe's untimed start, even under the sanitizers): a's
    // all-reduces wait for it.
    std::thread stall([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
        b.stall();
        std::this_thread::sleep_for(std::chrono::milliseconds(400));
        b.resume();
    });
    auto r = (*c)->sync(small_sync(b.address(), net::kMaxProbeBudgetMs));
    stall.join();
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_GE(r->ranks[0].wait_s, 0.3) << "compute " << r->ranks[0].compute_s;
    EXPECT_GE(r->wall_s, 2.0);
    // Through a relay that holds every message 2 ms, each all-reduce waits for the other rank's part that
    // long.
    auto relay = net::DelayRelay::start("127.0.0.1", 0, b.address(), 2000);
    ASSERT_TRUE(relay.ok()) << relay.status().message();
    auto d = (*c)->sync(small_sync((*relay)->address(), 200));
    ASSERT_TRUE(d.ok()) << d.status().message();
    for (const net::ProbeSyncRank &k : d->ranks)
        EXPECT_GE(k.wait_s / d->segments, 1.5e-3) << "compute " << k.compute_s << " s";
}

TEST(Probe, AnotherProtocolVersionIsRefusedWithBoth) {
    TempDir dir;
    WorkerProcess w(dir.file("cache"), 0, "", {"TANDEM_PROTOCOL_VERSION_OVERRIDE=2"});
    auto c = ProbeClient::connect(w.address(), test_secret());
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find(
                  fmt::format("speaks protocol 2, this build speaks {}", net::kProtocolVersion)),
              std::string::npos)
        << c.status().message();
}

TEST(DelayRelay, AddsItsDelayToEveryRoundTrip) {
    TempDir dir;
    WorkerProcess w(dir.file("cache"));
    auto relay = net::DelayRelay::start("127.0.0.1", 0, w.address(), 3000);
    ASSERT_TRUE(relay.ok()) << relay.status().message();
    auto direct = ProbeClient::connect(w.address(), test_secret());
    auto via = ProbeClient::connect((*relay)->address(), test_secret());
    ASSERT_TRUE(direct.ok() && via.ok());
    const LinkOptions o = small_link(60);
    auto sd = (*direct)->measure_link(o), sv = (*via)->measure_link(o);
    ASSERT_TRUE(sd.ok() && sv.ok()) << sv.status().message();
    const double d = link_latency_seconds(*sd), v = link_latency_seconds(*sv);
    EXPECT_GE(v - d, 2.5e-3) << "direct " << d << " via " << v;  // one way: 3 ms more
    EXPECT_LT(v - d, 10e-3);
    EXPECT_GT(link_bytes_per_second(*sv), 1e7);  // only latency is added
    (*relay)->set_delay_us(0);
    auto s0 = (*via)->measure_link(small_link(20));
    ASSERT_TRUE(s0.ok());
    EXPECT_LT(link_latency_seconds(*s0), v / 2);
}

// Whether this build runs under AddressSanitizer (GCC defines the macro; clang answers __has_feature).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

TEST(DelayRelay, AMessageIsPricedAtWhatMessagesNearItsSizeTook) {
    // Through a relay (which moves every piece it reads on its own schedule) a message's time grows with its
    // size at a rate of its own, not at the stream's: the measured link prices a size it did not measure from
    // the sizes around it, within 20% of that size's own round trip (6-10% low here; priced at the stream's
    // rate, 1.1-2.1x high).
    TempDir dir;
    WorkerProcess w(dir.file("cache"));
    auto relay = net::DelayRelay::start("127.0.0.1", 0, w.address(), 50);
    ASSERT_TRUE(relay.ok()) << relay.status().message();
    auto via = ProbeClient::connect((*relay)->address(), test_secret(), 3000, net::kTransportsTcp);
    ASSERT_TRUE(via.ok()) << via.status().message();
    LinkOptions o;
    o.rtt_sizes = {64, 16u << 10, 256u << 10};
    o.stream_sizes = {4u << 20};
    o.budget_ms = 100;
    auto s = (*via)->measure_link(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    const LinkSpec l = link_from_samples(*s);
    ASSERT_EQ(l.messages.size(), 4u);
    LinkOptions mid;
    mid.rtt_sizes = {64u << 10};
    mid.budget_ms = 100;
    auto m = (*via)->measure_link(mid);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const double measured = (*m)[0].p50 / 2.0, priced = l.seconds(64u << 10);
    EXPECT_GE(priced, l.seconds(16u << 10));
    EXPECT_LE(priced, l.seconds(256u << 10));
    // Under AddressSanitizer the relay's own instrumented copies and allocations, not the link, set how a
    // message's time grows with its size: on an Intel host two sanitizer runs in a row priced 64 KiB at 2.1x
    // its round trip (the release build there: within 20%). The pricing is a claim about real builds.
    if (kAddressSanitizer) return;
    EXPECT_NEAR(priced / measured, 1.0, 0.2)
        << "64 KiB: priced " << priced * 1e6 << " us, its round trip's half " << measured * 1e6
        << " us; at the stream's rate " << (l.latency_s + 65536 / l.bytes_per_s) * 1e6 << " us";
}

TEST(NetbenchCli, ReportsTheRelaysDelay) {
    TempDir dir;
    WorkerProcess w(dir.file("cache"));
    auto relay = net::DelayRelay::start("127.0.0.1", 0, w.address(), 5000);
    ASSERT_TRUE(relay.ok());
    auto direct = test::run_tandem(
        {"netbench", w.address(), "--json", "--budget-ms", "20", "-m", test::shared_path(kModel)});
    ASSERT_EQ(direct.exit_code, 0) << direct.err;
    // Through the relay over TCP: shared memory would pass the relay by.
    auto via = test::run_tandem(
        {"netbench", (*relay)->address(), "--json", "--budget-ms", "20", "--transport", "tcp"});
    ASSERT_EQ(via.exit_code, 0) << via.err;
    const auto jd = nlohmann::json::parse(direct.out), jv = nlohmann::json::parse(via.out);
    EXPECT_EQ(jd["transport"], "tcp");
    // The worker shares this host: shared memory is measured beside TCP, and UCX where the build has it, the
    // same sizes (how much faster each is is bench/transport-rtt's business, not a test's).
    ASSERT_EQ(jd["transports"].size(), net::ucx_supported() ? 3u : 2u) << direct.out;
    EXPECT_EQ(jd["transports"][1]["transport"], "shm");
    if (net::ucx_supported()) {
        EXPECT_EQ(jd["transports"][2]["transport"], "ucx");
    }
    for (size_t i = 1; i < jd["transports"].size(); ++i)
        EXPECT_EQ(jd["transports"][i]["round_trips"].size(), jd["transports"][0]["round_trips"].size());
    EXPECT_EQ(jv["transports"].size(), 1u);
    EXPECT_GE(jv["latency_us"].get<double>() - jd["latency_us"].get<double>(), 4000);
    bool activation = false;
    for (const auto &x : jd["round_trips"]) {
        activation |= x.value("what", "").find("one token's activation") != std::string::npos;
        EXPECT_LE(x["p50_us"].get<double>(), x["p99_us"].get<double>());
    }
    EXPECT_TRUE(activation) << direct.out;
    EXPECT_EQ(jd["streams"].size(), 4u);  // 1, 4, 16, 64 MiB
    auto text = test::run_tandem({"netbench", w.address(), "--budget-ms", "5"});
    EXPECT_EQ(text.exit_code, 0);
    EXPECT_NE(text.out.find("one way:"), std::string::npos) << text.out;
    EXPECT_NE(text.out.find("side by side"), std::string::npos) << text.out;
    auto none = test::run_tandem({"netbench", "127.0.0.1:1"});
    EXPECT_NE(none.exit_code, 0);
    EXPECT_NE(none.err.find("cannot reach worker 127.0.0.1:1"), std::string::npos) << none.err;
}

// tokens/s that `tandem bench` measures for a tg test through `workers` (one layout's flags).
double bench_tg(const std::vector<std::string> &flags) {
    std::vector<std::string> args = {
        "bench", "-m",          test::shared_path(kModel),
        "-t",    "1",           "-p",
        "0",     "-n",          "32",
        "-r",    "2",           "-o",
        "jsonl", "--transport", "tcp"};  // through the relay, as the plan measured (shm would pass it by)
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = test::run_tandem(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (r.exit_code != 0) return 0;
    return nlohmann::json::parse(r.out.substr(0, r.out.find('\n')))["avg_ts"].get<double>();
}

TEST(PlanDelay, ADelayedLinkMovesThePredictionAndTheRecommendationLikeTheMeasurement) {
    TempDir dir;
    WorkerProcess a(dir.file("a")), b(dir.file("b"));
    auto relay = net::DelayRelay::start("127.0.0.1", 0, b.address(), 0);
    ASSERT_TRUE(relay.ok());
    const std::string via = (*relay)->address();
    auto f = gguf::File::open(test::shared_path(kModel));
    ASSERT_TRUE(f.ok());
    auto shape = model_shape_from_file(*f);
    ASSERT_TRUE(shape.ok());
    PlanOptions o;
    o.batches = {1};
    o.probe_ms = 2;
    // Enough round trips through an 8 ms relay for a median that one late wake-up of a loaded host (the
    // sanitizer suite runs beside this) does not move: 30 ms gave 3-4, and predicted +6.6-7.2 ms where the
    // bench measured +4.1-4.4.
    o.link_ms = 150;
    o.n_threads = 1;
    o.predict.n_gen = 32;
    o.transports = net::kTransportsTcp;  // through the relay, as the bench runs (shm would pass it by)
    // Predicted tokens/s of b alone (through the relay) and of a alone, and the recommended flags.
    // And the pair in lock step: one row's segment, the link's price of its exchange, what is left.
    struct Sync {
        double segment_s = 0, link_s = 0, excess_s = 0;
    };
    Sync sync0, sync1;
    auto plan_now = [&](double *pa, double *pb, std::string *rec, Sync *sync) {
        auto spec = measure_cluster({a.address(), via}, *shape, o, test_secret(), {});
        ASSERT_TRUE(spec.ok()) << spec.status().message();
        // Unless the loaded host ran the two on one core (then `together` prices them, and no lock step).
        const auto it = spec->sync.find({0, 1});
        if (spec->together_of(0, 1) < ClusterSpec::kSharedCore) {
            EXPECT_NE(it, spec->sync.end());
        }
        if (it != spec->sync.end()) {
            EXPECT_EQ(it->second.size(), sync_rows(o).size());
            for (const SyncPoint &p : it->second) {
                EXPECT_GT(p.segment_s, 0);
                EXPECT_GT(p.link_s, 0);
                EXPECT_GE(p.excess_s, 0);
            }
            *sync = {it->second[0].segment_s, it->second[0].link_s, it->second[0].excess_s};
        }
        const Plan p = make_plan(*shape, *spec, o);
        for (const PlanEntry &e : p.batches[0].entries) {
            const std::string fl = e.layout.flags(*spec);
            if (fl == "--workers " + a.address()) *pa = e.prediction.gen.tokens_per_s;
            if (fl == "--workers " + via) *pb = e.prediction.gen.tokens_per_s;
        }
        *rec = p.batches[0].entries[static_cast<size_t>(p.batches[0].recommended)].layout.flags(*spec);
    };
    double pa0 = 0, pb0 = 0, pa1 = 0, pb1 = 0;
    std::string rec0, rec1;
    plan_now(&pa0, &pb0, &rec0, &sync0);
    const double ma0 = bench_tg({"--workers", a.address()}), mb0 = bench_tg({"--workers", via});
    (*relay)->set_delay_us(4000);
    plan_now(&pa1, &pb1, &rec1, &sync1);
    const double ma1 = bench_tg({"--workers", a.address()}), mb1 = bench_tg({"--workers", via});
    ASSERT_GT(pa0 * pb0 * pa1 * pb1, 0);
    ASSERT_GT(ma0 * mb0 * ma1 * mb1, 0);
    // b's link now costs 4 ms each way a token (head -> b through the relay; b -> head is direct): both the
    // prediction and the measurement of b alone fall to a fraction, a alone stays where it was.
    const double pred_drop = pb1 / pb0, meas_drop = mb1 / mb0;
    EXPECT_LT(pred_drop, 0.5) << pb0 << " -> " << pb1;
    EXPECT_LT(meas_drop, 0.5) << mb0 << " -> " << mb1;
    // The time a token gains is the link's: predicted and measured agree on it (the engine's own per-step
    // cost, ~0.1-0.2 ms of thread hand-offs that a 260K-parameter model makes visible, is the same on both
    // sides).
    const double pred_added = 1.0 / pb1 - 1.0 / pb0, meas_added = 1.0 / mb1 - 1.0 / mb0;
    EXPECT_GT(pred_added, 3e-3);
    EXPECT_LT(pred_added, 7e-3);
    EXPECT_LT(std::max(pred_added, meas_added) / std::min(pred_added, meas_added), 1.6)
        << "predicted +" << pred_added * 1e3 << " ms a token, measured +" << meas_added * 1e3 << " ms";
    EXPECT_LT(1.0 / pa1 - 1.0 / pa0, 1e-3) << "a alone: " << pa0 << " -> " << pa1 << " tokens/s";
    // In lock step the pair's exchange now waits for the delay, once per all-reduce (each rank's part crosses
    // one way while the other's crosses back), and the model prices it as the link, not again as the pair's
    // synchronisation.
    if (sync0.segment_s > 0 && sync1.segment_s > 0) {
        EXPECT_GT(sync1.segment_s - sync0.segment_s, 3e-3) << sync0.segment_s << " -> " << sync1.segment_s;
        EXPECT_GT(sync1.link_s, 3e-3);
        EXPECT_LT(sync1.excess_s, 0.5 * sync1.link_s)
            << "segment " << sync1.segment_s << " link " << sync1.link_s;
    }
    // With the delay, the recommendation leaves the delayed worker out, as the measurement says it should.
    EXPECT_EQ(rec1.find(via), std::string::npos) << rec1;
    EXPECT_GT(ma1, mb1);
    // Predicted against measured for b through the delay: the link dominates, and the model says so in
    // numbers within 50% (a 260K-parameter model on a loopback cluster).
    EXPECT_NEAR(pb1 / mb1, 1.0, 0.5) << "predicted " << pb1 << " measured " << mb1;
}

TEST(LayoutAuto, BenchRunsWhatThePlanRecommendsAndSaysWhy) {
    TempDir dir;
    WorkerProcess a(dir.file("a")), b(dir.file("b"));
    auto r = test::run_tandem({"bench", "-m", test::shared_path(kModel), "--workers",
                               a.address() + "," + b.address(), "--layout", "auto", "-t", "1", "-p", "0",
                               "-n", "8", "-r", "1", "-o", "jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("--layout auto chose"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("tokens/s predicted at batch 1"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("dominates"), std::string::npos) << r.err;
    EXPECT_GT(nlohmann::json::parse(r.out.substr(0, r.out.find('\n')))["avg_ts"].get<double>(), 0);
    r = test::run_tandem({"bench", "-m", test::shared_path(kModel), "--workers",
                          a.address() + "," + b.address(), "--layout", "auto", "--tp", "2", "-p", "0", "-n",
                          "8"});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("--layout auto chooses"), std::string::npos) << r.err;
    // With --head-node this machine is measured as the first node too, and what is chosen runs.
    r = test::run_tandem({"bench", "-m", test::shared_path(kModel), "--workers", a.address(), "--head-node",
                          "--layout", "auto", "-t", "1", "-p", "0", "-n", "8", "-r", "1", "-o", "jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("measuring 2 nodes (this one too)"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--layout auto chose"), std::string::npos) << r.err;
    EXPECT_GT(nlohmann::json::parse(r.out.substr(0, r.out.find('\n')))["avg_ts"].get<double>(), 0);
}

// plan --head-node: this machine is measured as the first node ("head node"), its links to the workers stand
// for both directions, and the flags of each layout that uses it (with --head-node) run one machine's text.
TEST(PlanCli, TheHeadNodeIsMeasuredAndItsLayoutsFlagsRunThem) {
    TempDir dir;
    WorkerProcess a(dir.file("a"));
    ASSERT_TRUE(a.running());
    const std::string model = test::shared_path(kModel);
    auto r = test::run_tandem({"plan", "-m", model, "--workers", a.address(), "--head-node", "-t", "1",
                               "--batch", "1", "--probe-ms", "5", "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const nlohmann::json j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j["nodes"].size(), 2u) << r.out;
    EXPECT_EQ(j["nodes"][0]["name"], "head node");
    EXPECT_EQ(j["nodes"][1]["name"], a.address());
    std::set<std::pair<std::string, std::string>> links;
    for (const auto &l : j["links"]) {
        links.emplace(l["from"].get<std::string>(), l["to"].get<std::string>());
        // Every link measured at the sizes the layouts send: a small message up to a prompt chunk's
        // all-reduce.
        EXPECT_GE(l["messages"].size(), 3u) << l.dump();
    }
    for (const auto &want : {std::pair<std::string, std::string>{"head", "head node"},
                             {"head node", "head"},
                             {"head node", a.address()},
                             {a.address(), "head node"},
                             {"head", a.address()},
                             {a.address(), "head"}})
        EXPECT_TRUE(links.count(want)) << want.first << " -> " << want.second;
    std::map<std::string, std::string> flags;  // kind -> flags of the first layout of that kind
    for (const auto &l : j["batches"][0]["layouts"])
        flags.emplace(l["kind"].get<std::string>(), l["flags"].get<std::string>());
    ASSERT_TRUE(flags.count("tensor parallel")) << r.out;
    EXPECT_EQ(flags["tensor parallel"].rfind("--workers " + a.address() + " --head-node --tp 2", 0), 0u)
        << flags["tensor parallel"];
    ASSERT_TRUE(flags.count("pipeline")) << r.out;
    EXPECT_NE(flags["pipeline"].find(" --head-node"), std::string::npos) << flags["pipeline"];

    const std::vector<std::string> gen = {"run", "-m", model, "-n", "16", "--temp", "0", "-t", "1"};
    auto local = test::run_tandem(gen);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    for (const char *kind : {"tensor parallel", "pipeline"}) {
        SCOPED_TRACE(kind);
        std::vector<std::string> args = gen;
        std::istringstream words(flags[kind]);
        for (std::string w; words >> w;) args.push_back(w);
        auto run = test::run_tandem(args);
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(run.out, local.out);
    }
}

}  // namespace
}  // namespace td::cluster
