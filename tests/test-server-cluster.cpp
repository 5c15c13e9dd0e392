// tandem serve through a cluster, beyond the shared suite (test-server.cpp runs that over 2 workers too):
// a worker killed mid-stream, and the `tandem serve --workers` command itself. Real `tandem worker`
// processes on 127.0.0.1 (port 0); faults are injected by killing one.
#include "test-server-util.h"

namespace td::server {
namespace {

using namespace test_server;
using Clock = std::chrono::steady_clock;

class ServerCluster : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    }
};

// Polls /health until it answers `status` (or `timeout` passes); returns the last body.
std::string wait_health(httplib::Client &c, int status, std::chrono::seconds timeout) {
    const auto deadline = Clock::now() + timeout;
    std::string body;
    while (Clock::now() < deadline) {
        auto r = c.Get("/health");
        if (r) {
            body = r->body;
            if (r->status == status) return body;
        }
        std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "/health never answered " << status << "; last: " << body;
    return body;
}

// Two streams flowing through both stages (one micro-batch each) when `fault` strikes: both end within 3 s
// with an SSE error naming `named` (the failed node's address or port), and [DONE].
void expect_fault_ends_both_streams(TestServer &s, const std::function<void()> &fault, const std::string &named) {
    const std::vector<json> requests = {{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"seed", 0}},
                                        {{"prompt", "The cat"}, {"max_tokens", 400}, {"seed", 1}}};
    const Streamed st = streams_through(s, requests, fault);
    EXPECT_LT(st.seconds_after_fault, 3.0);
    for (size_t i = 0; i < st.bodies.size(); ++i) {
        SCOPED_TRACE(i);
        bool done = false;
        auto events = parse_sse(st.bodies[i], &done);
        EXPECT_TRUE(done);
        ASSERT_FALSE(events.empty());
        ASSERT_TRUE(events.back().contains("error")) << st.bodies[i];
        EXPECT_NE(events.back()["error"]["message"].get<std::string>().find(named), std::string::npos)
            << events.back().dump();
    }
}

ServerOptions two_stage_options(bool relay_second = false) {
    ServerOptions o;
    o.backend = Backend::cluster;
    o.n_parallel = 2;
    o.n_ctx_slot = 512;
    o.step_delay = 20ms;  // a 400-token stream would take 8 s
    o.relay_second = relay_second;
    return o;
}

const json k_greedy = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};

TEST_F(ServerCluster, KilledWorkerEndsStreamsNamingItAndServingResumes) {
    TestServer s(two_stage_options());
    auto c = s.client();
    const std::string solo = completion_text(c, k_greedy);
    ASSERT_FALSE(solo.empty());
    test::WorkerProcess &w2 = s.workers().second();
    const std::string a2 = w2.address();
    const uint16_t port2 = w2.port();
    expect_fault_ends_both_streams(s, [&] { w2.kill(); }, a2);

    // The server keeps answering: /health names the node; a request fails at once, naming it too.
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 503);
    json hj = json::parse(h->body);
    EXPECT_EQ(hj["status"], "error");
    EXPECT_NE(hj["message"].get<std::string>().find(std::to_string(port2)), std::string::npos) << h->body;
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_engine_healthy"), 0);
    const auto t1 = Clock::now();
    auto r = post(c, "/v1/completions", k_greedy);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500) << r->body;
    EXPECT_NE(r->body.find(std::to_string(port2)), std::string::npos) << r->body;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t1).count(), 3.0);

    // Back on the same port with the same cache: the server reconnects by itself and serves the same text.
    w2.start(s.workers().cache(1), port2);
    ASSERT_TRUE(w2.running()) << w2.log();
    wait_health(c, 200, std::chrono::seconds(20));
    EXPECT_EQ(completion_text(c, k_greedy), solo);
}

// The link to the second worker is cut mid-stream (both its control and data connections): the streams end
// naming it, and the server reconnects through the same link by itself.
TEST_F(ServerCluster, ACutLinkEndsStreamsAndTheServerReconnects) {
    TestServer s(two_stage_options(/*relay_second=*/true));
    auto c = s.client();
    const std::string solo = completion_text(c, k_greedy);
    ASSERT_FALSE(solo.empty());
    const std::string via = s.workers().second_address();
    expect_fault_ends_both_streams(s, [&] { s.workers().relay().cut(); }, via);
    EXPECT_TRUE(s.workers().second().running());  // the worker itself is fine
    wait_health(c, 200, std::chrono::seconds(20));
    EXPECT_EQ(completion_text(c, k_greedy), solo);
}

// The second worker's bytes turn to garbage mid-stream: the head refuses the malformed frames (no crash, no
// corrupt text to the client), ends the streams naming it, and serves again once the link is clean.
TEST_F(ServerCluster, AWorkerAnsweringGarbageEndsStreamsAndServingResumes) {
    TestServer s(two_stage_options(/*relay_second=*/true));
    auto c = s.client();
    const std::string solo = completion_text(c, k_greedy);
    ASSERT_FALSE(solo.empty());
    const std::string via = s.workers().second_address();
    expect_fault_ends_both_streams(s, [&] { s.workers().relay().garble(true); }, via);
    s.workers().relay().garble(false);
    s.workers().relay().cut();  // connections made while garbling are broken anyway
    wait_health(c, 200, std::chrono::seconds(20));
    EXPECT_EQ(completion_text(c, k_greedy), solo);
    EXPECT_TRUE(s.workers().first().running());
    EXPECT_TRUE(s.workers().second().running());
}

// Streams that must continue across a fault exactly as undisturbed: greedy, and seeded with a repeat penalty,
// DRY, typical-p and XTC (the resumed sampler skips the draws it made, XTC's too, and holds the tokens the
// penalty and DRY see). 80 tokens at 20 ms a step: the fault lands mid-stream.
// Where the new layout computes the old one's logits bit for bit (the same layout, a spare in a lost node's
// place), that holds for any seed. A re-planned layout does not: --tp sums its partials in another order than
// one machine (logits within 1e-4), and an f16 wire rounds at other layer boundaries, so a seeded draw that
// lands that close to a boundary between tokens can go either way. Measured with this request's filters over
// 80 tokens: 3 of 20 seeds differ between --tp 2 and one machine (0 of 20 between one machine and a pipeline
// with --wire f32). Seed 11 is not one of them; the re-plan tests hold it as a fixed input.
const std::vector<json> k_resumed = {
    {{"prompt", "Once upon a time"}, {"max_tokens", 80}, {"temperature", 0}, {"stop", "never stops"}},
    {{"prompt", "The cat"},
     {"max_tokens", 80},
     {"temperature", 0.9},
     {"seed", 11},
     {"repeat_penalty", 1.2},
     {"dry_multiplier", 0.8},
     {"dry_allowed_length", 1},
     {"typical_p", 0.95},
     {"xtc_probability", 0.5},
     {"xtc_threshold", 0.05}}};

// --max-resumes: the link to the second worker is cut mid-stream; the head reconnects through it and replays
// each stream's prompt and tokens, so the client sees a pause and then exactly the undisturbed text.
TEST_F(ServerCluster, StreamsCutOffByALostLinkContinueWithTheUndisturbedText) {
    ServerOptions o = two_stage_options(/*relay_second=*/true);
    o.max_resumes = 1;
    TestServer s(o);
    auto c = s.client();
    const auto t0 = Clock::now();
    expect_streams_continue(s, k_resumed, [&] { s.workers().relay().cut(); });
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 12.0);
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_resumed_requests_total"), 2) << m->body;
    auto h = c.Get("/health");
    ASSERT_TRUE(h);
    EXPECT_EQ(h->status, 200) << h->body;
}

// The same for Mirostat streams, whose sampler carries a threshold from draw to draw: the last stage returns
// it with each token and the head restores it with the replay, so they too go on as if undisturbed.
TEST_F(ServerCluster, MirostatStreamsContinueWithTheirThreshold) {
    ServerOptions o = two_stage_options(/*relay_second=*/true);
    o.max_resumes = 1;
    TestServer s(o);
    const std::vector<json> mirostat = {{{"prompt", "Once upon a time"},
                                         {"max_tokens", 80},
                                         {"temperature", 1.0},
                                         {"seed", 5},
                                         {"mirostat", 2},
                                         {"mirostat_tau", 1.0},
                                         {"mirostat_eta", 0.3}},
                                        {{"prompt", "The cat"},
                                         {"max_tokens", 80},
                                         {"temperature", 1.0},
                                         {"seed", 6},
                                         {"mirostat", 1},
                                         {"mirostat_tau", 1.5},
                                         {"mirostat_eta", 0.3}}};
    expect_streams_continue(s, mirostat, [&] { s.workers().relay().cut(); });
    auto c = s.client();
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_resumed_requests_total"), 2) << m->body;
}

// --max-resumes with nowhere to go (the worker is dead, no other node holds its layers): the streams still end
// within 3 s naming it, as without resuming.
TEST_F(ServerCluster, StreamsThatCannotResumeEndWithTheLostNode) {
    ServerOptions o = two_stage_options();
    o.max_resumes = 1;
    TestServer s(o);
    test::WorkerProcess &w2 = s.workers().second();
    const std::string a2 = w2.address();
    expect_fault_ends_both_streams(s, [&] { w2.kill(); }, a2);
    auto c = s.client();
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_resumed_requests_total"), 0);
}

// /health's layout and recoveries, once they name `node` (the engine thread refreshes them after a resume).
json health_naming(httplib::Client &c, const std::string &node) {
    json h;
    for (int k = 0; k < 100; ++k) {
        auto r = c.Get("/health");
        if (r && r->status == 200) {
            h = json::parse(r->body);
            if (h.value("layout", "").find(node) != std::string::npos) return h;
        }
        std::this_thread::sleep_for(50ms);
    }
    ADD_FAILURE() << "/health never named " << node << ": " << h.dump();
    return h;
}

// A worker of a 2-stage pipeline is killed mid-stream with a spare standing by: the spare takes its layers,
// and the streams continue with exactly the undisturbed text. /health and /metrics say what happened.
TEST_F(ServerCluster, ASpareTakesALostWorkersPlaceAndStreamsContinue) {
    test::TempDir spare_cache;
    test::WorkerProcess spare(spare_cache.file("spare"));
    ASSERT_TRUE(spare.running()) << spare.log();
    ServerOptions o = two_stage_options();
    o.max_resumes = 1;
    o.spares = spare.address();
    TestServer s(o);
    test::WorkerProcess &w2 = s.workers().second();
    const std::string lost = w2.address();
    expect_streams_continue(s, k_resumed, [&] { w2.kill(); });
    auto c = s.client();
    const json h = health_naming(c, spare.address());
    EXPECT_EQ(h["layout"], s.workers().first().address() + " [0-1] -> " + spare.address() + " [2-4]")
        << h.dump();
    ASSERT_EQ(h["recoveries"].size(), 1u) << h.dump();
    const std::string what = h["recoveries"][0];
    EXPECT_NE(what.find(lost), std::string::npos) << what;
    EXPECT_NE(what.find("spare " + spare.address() + " took its place"), std::string::npos) << what;
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_resumed_requests_total"), 2) << m->body;
    EXPECT_EQ(metric(m->body, "tandem_cluster_recoveries_total"), 1) << m->body;
    EXPECT_EQ(metric(m->body, "tandem_cluster_spares"), 1) << m->body;  // the lost worker stands by now
}

// A rank of a --tp 2 group is killed mid-stream with no spare: the head re-plans onto the worker left (the
// whole model on one node) and the streams continue with the text they had (stories260K's --tp 2 tokens are
// one machine's). Once the lost worker is back it is a spare.
TEST_F(ServerCluster, ATensorParallelGroupThatLosesANodeIsRePlannedAndStreamsContinue) {
    ServerOptions o = two_stage_options();
    o.backend = Backend::tp;
    o.max_resumes = 1;
    o.replan = true;
    TestServer s(o);
    test::WorkerProcess &w2 = s.workers().second();
    const std::string lost = w2.address();
    expect_streams_continue(s, k_resumed, [&] { w2.kill(); });
    auto c = s.client();
    const json h = health_naming(c, s.workers().first().address() + " [0-4]");
    EXPECT_EQ(h["layout"], s.workers().first().address() + " [0-4]") << h.dump();
    ASSERT_EQ(h["recoveries"].size(), 1u) << h.dump();
    const std::string what = h["recoveries"][0];
    EXPECT_NE(what.find(lost), std::string::npos) << what;
    EXPECT_NE(what.find("re-planned onto 1 worker"), std::string::npos) << what;
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_cluster_workers"), 1) << m->body;
    // Serving goes on on the worker left.
    EXPECT_EQ(completion_text(c, k_greedy), completion_text(c, k_greedy));
}

// A rank of a --tp 2 group stalls (SIGSTOP) mid-stream with a spare standing by: the head gives up on it
// (no heartbeat, then no handshake within the connect timeout), the spare takes its slice, and the streams
// continue with exactly the undisturbed text.
TEST_F(ServerCluster, AStalledTensorParallelRankIsReplacedByASpareAndStreamsContinue) {
    test::TempDir spare_cache;
    test::WorkerProcess spare(spare_cache.file("spare"));
    ASSERT_TRUE(spare.running()) << spare.log();
    ServerOptions o = two_stage_options();
    o.backend = Backend::tp;
    o.max_resumes = 1;
    o.spares = spare.address();
    TestServer s(o);
    test::WorkerProcess &w2 = s.workers().second();
    expect_streams_continue(s, k_resumed, [&] { w2.stall(); });
    auto c = s.client();
    const json h = health_naming(c, spare.address());
    EXPECT_EQ(h["layout"], s.workers().first().address() + " + " + spare.address() + " [0-4]") << h.dump();
    w2.resume();
}

// The head (`tandem serve`) is killed while its workers live; a new head on the same workers serves the same
// text at once, without restarting them.
TEST_F(ServerCluster, AHeadRestartedWhileWorkersLiveServesAgain) {
    const std::string model = test::shared_path(k_model);
    TwoWorkers w;
    const std::vector<std::string> args = {"serve", "-m", model, "--port", "0", "--parallel", "2", "-c", "512",
                                           "--workers", w.addresses(), "--layers", "0-1,2-4", "--wire", "f32"};
    std::string first;
    for (int round = 0; round < 2; ++round) {
        SCOPED_TRACE(round);
        test::ChildProcess serve;
        serve.start(args, "listening on http://127.0.0.1:");
        ASSERT_TRUE(serve.running()) << serve.log();
        httplib::Client cc("127.0.0.1", std::stoi(serve.ready_text()));
        cc.set_read_timeout(60, 0);
        const auto t0 = Clock::now();
        wait_health(cc, 200, std::chrono::seconds(30));
        const std::string text = completion_text(cc, k_greedy);
        if (round == 0) first = text;
        else EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
        EXPECT_EQ(text, first);
        EXPECT_FALSE(text.empty());
        serve.kill();  // SIGKILL: no goodbye to the workers
    }
    EXPECT_TRUE(w.first().running());
    EXPECT_TRUE(w.second().running());
}

// `tandem serve --workers A,B`: the same cluster flags as `tandem run` build the ClusterEngine.
TEST_F(ServerCluster, ServeCommandRunsOnWorkers) {
    const std::string model = test::shared_path(k_model);
    const std::string prompt = "Once upon a time";
    auto run = test::run_tandem({"run", "-m", model, "-p", prompt, "-n", "16", "--temp", "0", "-t", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const std::string expected = run.out.substr(0, run.out.size() - 1);  // run ends with a newline

    TwoWorkers w;
    test::ChildProcess serve;
    serve.start({"serve", "-m", model, "--port", "0", "--parallel", "2", "-c", "512", "--workers",
                 w.addresses(), "--layers", "0-1,2-4", "--wire", "f32", "--stats", "--alias", "stories"},
                "listening on http://127.0.0.1:");
    ASSERT_TRUE(serve.running()) << serve.log();
    httplib::Client c("127.0.0.1", std::stoi(serve.ready_text()));
    c.set_read_timeout(60, 0);
    wait_health(c, 200, std::chrono::seconds(30));
    EXPECT_EQ(completion_text(c, {{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}}), expected);
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_micro_batches"), 2);
    EXPECT_NE(serve.log().find("2 pipeline stages, 2 micro-batches in flight"), std::string::npos)
        << serve.log();
    EXPECT_EQ(serve.signal_and_reap(SIGTERM), 0);
    const std::string log = serve.log();
    EXPECT_NE(log.find("cluster stats"), std::string::npos) << log;
    EXPECT_NE(log.find(w.first().address()), std::string::npos) << log;
}

// Two boxes, `tandem serve --tp 2 --workers W --head-node --replan`: the head computes half of every layer,
// concurrent requests get one machine's text, /status names the head's node; when W dies the head re-plans
// onto its own node and keeps serving alone, and the lost worker stands by as a spare once it is back.
TEST_F(ServerCluster, ServeCommandWithTheHeadAsARankKeepsServingAloneAfterItsWorkerDies) {
    const std::string model = test::shared_path(k_model);
    const std::string prompt = "Once upon a time";
    auto run = test::run_tandem({"run", "-m", model, "-p", prompt, "-n", "24", "--temp", "0", "-t", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const std::string expected = run.out.substr(0, run.out.size() - 1);  // run ends with a newline

    test::TempDir cache;
    test::WorkerProcess w(cache.file("w"));
    ASSERT_TRUE(w.running()) << w.log();
    const uint16_t port = w.port();
    test::ChildProcess serve;
    serve.start({"serve",  "-m",  model,       "--port",    "0",        "--parallel", "3",
                 "-c",     "768", "--workers", w.address(), "--tp",     "2",          "--head-node",
                 "--wire", "f32", "-t",        "1",         "--replan", "--alias",    "stories"},
                "listening on http://127.0.0.1:");
    ASSERT_TRUE(serve.running()) << serve.log();
    httplib::Client c("127.0.0.1", std::stoi(serve.ready_text()));
    c.set_read_timeout(60, 0);
    wait_health(c, 200, std::chrono::seconds(30));
    const json req = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
    std::vector<std::string> texts(3);
    {
        std::vector<std::thread> ts;
        for (size_t i = 0; i < texts.size(); ++i)
            ts.emplace_back([&, i] {
                httplib::Client ci("127.0.0.1", std::stoi(serve.ready_text()));
                ci.set_read_timeout(60, 0);
                texts[i] = completion_text(ci, req);
            });
        for (auto &t : ts) t.join();
    }
    for (const std::string &t : texts) EXPECT_EQ(t, expected);
    auto st = c.Get("/status");
    ASSERT_TRUE(st);
    ASSERT_EQ(st->status, 200) << st->body;
    const json status = json::parse(st->body);
    EXPECT_EQ(status["layout"], "head node + " + w.address() + " [0-4]") << status.dump();
    ASSERT_EQ(status["engine"]["nodes"].size(), 2u) << status.dump();
    EXPECT_EQ(status["engine"]["nodes"][0]["address"], "head node") << status.dump();

    w.kill();
    std::string after;
    for (int attempt = 0; attempt < 3 && after.empty();
         ++attempt) {  // the request that finds it gone may fail
        auto r = post(c, "/v1/completions", req);
        if (r && r->status == 200) after = json::parse(r->body)["choices"][0]["text"].get<std::string>();
    }
    EXPECT_EQ(after, expected);
    const json h = health_naming(c, "head node [0-4]");
    EXPECT_EQ(h["layout"], "head node [0-4]") << h.dump();
    ASSERT_EQ(h["recoveries"].size(), 1u) << h.dump();
    EXPECT_NE(h["recoveries"][0].get<std::string>().find("127.0.0.1:" + std::to_string(port)),
              std::string::npos)
        << h.dump();
    EXPECT_EQ(serve.signal_and_reap(SIGTERM), 0) << serve.log();
}

TEST_F(ServerCluster, ServeCommandNamesAnUnreachableWorker) {
    // A port nobody listens on: bind one, note it, close it.
    test::TempDir cache;
    uint16_t dead_port = 0;
    {
        test::WorkerProcess tmp(cache.file("tmp"));
        ASSERT_TRUE(tmp.running());
        dead_port = tmp.port();
    }
    auto r = test::run_tandem({"serve", "-m", test::shared_path(k_model), "--port", "0", "--workers",
                               "127.0.0.1:" + std::to_string(dead_port)});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("127.0.0.1:" + std::to_string(dead_port)), std::string::npos) << r.err;
}

// --spare and --replan reach the engine, and what cannot work is refused before any worker is contacted.
TEST_F(ServerCluster, ServeCommandChecksTheRecoveryFlags) {
    const std::string model = test::shared_path(k_model);
    const auto serve_error = [&](std::vector<std::string> extra) {
        std::vector<std::string> args = {"serve", "-m", model, "--port", "0"};
        args.insert(args.end(), extra.begin(), extra.end());
        auto r = test::run_tandem(args);
        EXPECT_NE(r.exit_code, 0) << r.out;
        return r.err;
    };
    EXPECT_NE(serve_error({"--spare", "127.0.0.1:1"}).find("need --workers"), std::string::npos);
    EXPECT_NE(serve_error({"--replan"}).find("need --workers"), std::string::npos);
    EXPECT_NE(serve_error({"--workers", "127.0.0.1:1", "--layers", "0-4", "--replan"}).find("drop --layers"),
              std::string::npos);
    const std::string dup = serve_error({"--workers", "127.0.0.1:1,127.0.0.1:2", "--spare", "127.0.0.1:2"});
    EXPECT_NE(dup.find("spare 127.0.0.1:2 is also in --workers"), std::string::npos) << dup;
}

TEST_F(ServerCluster, ApiKeyFromAFile) {
    test::TempDir dir;
    const std::string key_file = dir.file("api.key");
    std::ofstream(key_file) << "  from-a-file-0123 \nsecond line ignored\n";
    test::ChildProcess serve;
    serve.start({"serve", "-m", test::shared_path(k_model), "--port", "0", "--api-key-file", key_file},
                "listening on http://127.0.0.1:");
    ASSERT_TRUE(serve.running()) << serve.log();
    httplib::Client c("127.0.0.1", std::stoi(serve.ready_text()));
    wait_health(c, 200, std::chrono::seconds(30));
    auto r = c.Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = c.Get("/v1/models", {{"Authorization", "Bearer from-a-file-0123"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    // An empty file would switch the check off: refused.
    std::ofstream(dir.file("empty.key")) << "\n";
    auto bad = test::run_tandem({"serve", "-m", test::shared_path(k_model), "--port", "0", "--api-key-file",
                                 dir.file("empty.key")});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("empty"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace td::server
