// Shared by the server tests: a `tandem serve` backend in this process on port 0 (local, or over 2 real
// `tandem worker` processes), fault injection around the real engine, and small HTTP/SSE helpers.
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/cluster-engine.h"
#include "net/delay-relay.h"
#include "server/http.h"
#include "server/served-model.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td::server::test_server {

using nlohmann::json;
using namespace std::chrono_literals;

inline const std::string k_model = "models/stories260K.gguf";

// Delegates to a real engine; can stall each step and fail the next steps on demand.
class InjectEngine : public Engine {
public:
    InjectEngine(std::unique_ptr<Engine> inner, std::chrono::milliseconds delay, std::atomic<int> *fail_steps)
        : inner_(std::move(inner)), delay_(delay), fail_steps_(fail_steps) {}
    int32_t n_ctx() const override { return inner_->n_ctx(); }
    int32_t n_seq() const override { return inner_->n_seq(); }
    int32_t n_vocab() const override { return inner_->n_vocab(); }
    int max_in_flight() const override { return inner_->max_in_flight(); }
    Status seq_start(int32_t seq, const SamplerParams &p, bool want_logits, const SamplerHistory &history,
                     int32_t keep, int32_t keep_from) override {
        return inner_->seq_start(seq, p, want_logits, history, keep, keep_from);
    }
    int32_t seq_cached(int32_t seq) const override { return inner_->seq_cached(seq); }
    Status seq_clear(int32_t seq) override { return inner_->seq_clear(seq); }
    Status submit(const Batch &batch) override {
        if (delay_.count() > 0) std::this_thread::sleep_for(delay_);
        if (fail_steps_ != nullptr && fail_steps_->load() > 0) {
            fail_steps_->fetch_sub(1);
            return make_error(ErrorKind::disconnected, "worker 1 (127.0.0.1:9999) went away");
        }
        return inner_->submit(batch);
    }
    Result<std::vector<StepOutput>> wait() override { return inner_->wait(); }

private:
    std::unique_ptr<Engine> inner_;
    std::chrono::milliseconds delay_;
    std::atomic<int> *fail_steps_;
};

// local: one machine; cluster: two workers as a 2-stage pipeline; tp: the same two workers as one
// tensor-parallel stage (--tp 2).
enum class Backend { local, cluster, tp };

// A parameterized test's name for its backend: Local, TwoWorkers, TensorParallel.
inline std::string backend_test_name(Backend b) {
    return b == Backend::local ? "Local" : b == Backend::cluster ? "TwoWorkers" : "TensorParallel";
}

struct ServerOptions {
    Backend backend = Backend::local;
    int32_t n_parallel = 4;
    int32_t n_ctx_slot = 256;  // positions one request may use (--ctx-per-seq)
    int32_t kv_pool = 0;       // --ctx-size; 0: n_ctx_slot for every slot
    int32_t max_queue = -1;
    std::string api_key;
    int max_per_client = 0;
    int32_t max_resumes = 0;
    std::chrono::milliseconds step_delay{0};
    std::atomic<int> *fail_steps = nullptr;
    bool attach = true;  // false: /health stays "loading" until attach()
    bool relay_second = false;  // cluster backends: the second worker behind a relay (TwoWorkers)
    std::string spares;         // cluster backends: ClusterOptions::spares
    bool replan = false;        // cluster backends: ClusterOptions::replan (placement by speed, not --layers)
    int dead_after_ms = 2000;   // cluster backends: ClusterOptions::dead_after_ms (missed heartbeats)
    std::string model_path;     // "" = stories260K from ../shared
    std::string chat_template;  // ServeParams::chat_template
    bool slots = true;          // HttpParams::slots (GET /slots)
    bool spm_infill = false;    // HttpParams::spm_infill (--spm-infill)
    Pooling pooling = Pooling::unset;  // ServeParams::pooling
    DraftParams draft;                 // ServeParams::draft (--draft)
};

// Two `tandem worker`s with their own weight caches; stories260K's 5 layers split 0-1 | 2-4. With
// relay_second, the head and the first worker reach the second through a relay the test controls (cut the
// link, garble what the worker sends).
class TwoWorkers {
public:
    explicit TwoWorkers(bool relay_second = false) : w1_(cache_.file("w1")), w2_(cache_.file("w2")) {
        EXPECT_TRUE(w1_.running()) << w1_.log();
        EXPECT_TRUE(w2_.running()) << w2_.log();
        if (relay_second) {
            auto r = net::DelayRelay::start("127.0.0.1", 0, w2_.address(), 0);
            EXPECT_TRUE(r.ok()) << r.status().message();
            if (r.ok()) relay_ = std::move(r).value();
        }
    }
    net::DelayRelay &relay() { return *relay_; }
    // How the head names the second worker: its address, or the relay's.
    std::string second_address() const { return relay_ ? relay_->address() : w2_.address(); }
    test::WorkerProcess &first() { return w1_; }
    test::WorkerProcess &second() { return w2_; }
    std::string cache(int i) const { return cache_.file(i == 0 ? "w1" : "w2"); }
    std::string addresses() const { return w1_.address() + "," + second_address(); }

    // The ClusterEngine the server runs on: what cli::make_engine builds for --workers A,B --layers 0-1,2-4
    // --wire f32 (the f32 wire keeps the logits bit-identical to one machine).
    // With tp: --tp 2 instead (each worker holds half of every layer).
    // spares / replan: ClusterOptions' (with replan the pipeline is placed by speed instead of --layers).
    ServeParams::EngineFactory factory(bool tp = false, const std::string &spares = "", bool replan = false,
                                       int dead_after_ms = 2000) const {
        const std::string workers = addresses();
        // Links through the relay stay on TCP: shared memory between these processes would pass the relay by,
        // and the faults it injects (garbled bytes, delays) with it.
        const bool relayed = relay_ != nullptr;
        return [workers, tp, spares, replan, relayed, dead_after_ms](
                   std::shared_ptr<const Model> model, const ContextParams &cp,
                   ThreadPool &) -> Result<std::unique_ptr<Engine>> {
            cluster::ClusterOptions co;
            co.secret = test::test_secret();
            co.workers = workers;
            co.spares = spares;
            co.replan = replan;
            co.dead_after_ms = dead_after_ms;
            if (tp)
                co.tp = 2;
            else if (!replan)
                co.layers = "0-1,2-4";
            co.wire = net::WireType::f32;
            co.transports = relayed ? net::kTransportsTcp : test::test_transports();
            co.context = cp;
            co.print_placement = false;
            TD_ASSIGN_OR_RETURN(auto e, cluster::ClusterEngine::create(std::move(model), co));
            return std::unique_ptr<Engine>(std::move(e));
        };
    }

private:
    test::TempDir cache_;
    test::WorkerProcess w1_, w2_;
    std::unique_ptr<net::DelayRelay> relay_;
};

class TestServer {
public:
    explicit TestServer(const ServerOptions &o = {}) {
        ServeParams sp;
        sp.model_path = o.model_path.empty() ? test::shared_path(k_model) : o.model_path;
        sp.chat_template = o.chat_template;
        sp.pooling = o.pooling;
        sp.draft = o.draft;
        sp.n_parallel = o.n_parallel;
        sp.n_ctx = o.kv_pool > 0 ? o.kv_pool : o.n_ctx_slot * o.n_parallel;
        sp.n_ctx_per_seq = o.n_ctx_slot;
        sp.n_threads = 1;
        sp.max_queue = o.max_queue;
        sp.probe_interval_ms = 200;
        sp.max_resumes = o.max_resumes;
        if (o.backend != Backend::local) {
            workers_ = std::make_unique<TwoWorkers>(o.relay_second);
            sp.make_engine = workers_->factory(o.backend == Backend::tp, o.spares, o.replan, o.dead_after_ms);
        }
        if (o.step_delay.count() > 0 || o.fail_steps != nullptr) {
            sp.wrap_engine = [o](std::unique_ptr<Engine> e) -> std::unique_ptr<Engine> {
                return std::make_unique<InjectEngine>(std::move(e), o.step_delay, o.fail_steps);
            };
        }
        auto m = ServedModel::load(sp);
        EXPECT_TRUE(m.ok()) << m.status().message();
        model_ = std::move(m).value();
        HttpParams hp;
        hp.port = 0;
        hp.model_id = "stories";
        hp.api_key = o.api_key;
        hp.max_per_client = o.max_per_client;
        hp.slots = o.slots;
        hp.spm_infill = o.spm_infill;
        hp.limits.n_threads = 24;
        http_ = std::make_unique<HttpServer>(hp);
        auto port = http_->bind();
        EXPECT_TRUE(port.ok()) << port.status().message();
        port_ = *port;
        thread_ = std::thread([this] { (void)http_->listen(); });
        if (o.attach) attach();
        // Wait until the listener runs, so stop() in the destructor finds it running.
        httplib::Client c = client();
        for (int i = 0; i < 200; ++i) {
            if (c.Get("/health")) break;
            std::this_thread::sleep_for(10ms);
        }
    }
    ~TestServer() {
        http_->stop();
        thread_.join();
        http_.reset();
        model_.reset();
    }
    void attach() { http_->set_backend(model_->backend()); }
    httplib::Client client() const {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(60, 0);
        return c;
    }
    ServedModel &model() { return *model_; }
    int port() const { return port_; }
    TwoWorkers &workers() { return *workers_; }

private:
    std::unique_ptr<TwoWorkers> workers_;  // destroyed after the server
    std::unique_ptr<ServedModel> model_;
    std::unique_ptr<HttpServer> http_;
    std::thread thread_;
    int port_ = 0;
};

inline httplib::Result post(httplib::Client &c, const std::string &path, const json &body,
                            const httplib::Headers &h = {}) {
    return c.Post(path.c_str(), h, body.dump(), "application/json");
}

// The JSON payloads of an SSE body; `done` tells whether it ended with [DONE].
inline std::vector<json> parse_sse(const std::string &body, bool *done) {
    std::vector<json> out;
    *done = false;
    size_t pos = 0;
    while (pos < body.size()) {
        size_t end = body.find("\n\n", pos);
        if (end == std::string::npos) break;
        std::string ev = body.substr(pos, end - pos);
        pos = end + 2;
        EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
        std::string data = ev.substr(6);
        if (data == "[DONE]") {
            *done = true;
            continue;
        }
        EXPECT_FALSE(*done) << "event after [DONE]";
        out.push_back(json::parse(data));
    }
    EXPECT_EQ(pos, body.size()) << "trailing bytes in the SSE body";
    return out;
}

// The events of an SSE body that names each one ("event: NAME", then "data: JSON" whose "type" is NAME), as
// the Responses and Messages APIs send them.
struct NamedEvent {
    std::string name;
    json data;
};
inline std::vector<NamedEvent> parse_named_sse(const std::string &body) {
    std::vector<NamedEvent> out;
    size_t pos = 0;
    while (pos < body.size()) {
        const size_t end = body.find("\n\n", pos);
        if (end == std::string::npos) break;
        const std::string ev = body.substr(pos, end - pos);
        pos = end + 2;
        const size_t nl = ev.find('\n');
        EXPECT_EQ(ev.rfind("event: ", 0), 0u) << ev;
        EXPECT_NE(nl, std::string::npos) << ev;
        if (nl == std::string::npos) break;
        EXPECT_EQ(ev.compare(nl + 1, 6, "data: "), 0) << ev;
        out.push_back({ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7), nullptr, false)});
        EXPECT_EQ(out.back().data["type"], out.back().name) << ev;
    }
    EXPECT_EQ(pos, body.size()) << "trailing bytes in the SSE body";
    return out;
}

// Text of a streamed response (chat deltas or completion texts) and its finish_reason.
// The text (and the finish reason) streamed for choice `index` (OpenAI's n: each chunk names its choice).
inline std::string stream_text(const std::vector<json> &events, std::string *finish = nullptr,
                               int index = 0) {
    std::string text;
    for (const json &e : events) {
        if (e.contains("error")) ADD_FAILURE() << e.dump();
        if (!e.contains("choices") || e["choices"].empty()) continue;
        EXPECT_EQ(e["choices"].size(), 1u) << e.dump();
        const json &ch = e["choices"][0];
        if (ch["index"] != index) continue;
        if (ch.contains("delta")) {
            if (ch["delta"].contains("content") && ch["delta"]["content"].is_string())
                text += ch["delta"]["content"].get<std::string>();
        } else {
            text += ch["text"].get<std::string>();
        }
        if (finish && !ch["finish_reason"].is_null()) *finish = ch["finish_reason"].get<std::string>();
    }
    return text;
}

inline std::string completion_text(httplib::Client &c, const json &body, std::string *finish = nullptr) {
    auto r = post(c, "/v1/completions", body);
    EXPECT_TRUE(r);
    if (!r) return "";
    EXPECT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    if (finish) *finish = j["choices"][0]["finish_reason"].get<std::string>();
    return j["choices"][0]["text"].get<std::string>();
}

// Streams every request body to `path` at once ("stream" is set); once each stream has sent its first bytes
// and `settle` has passed, calls `fault`. Returns the raw SSE bodies once all have ended, and the seconds
// from the fault to the last end.
struct Streamed {
    std::vector<std::string> bodies;
    double seconds_after_fault = 0.0;
};
inline Streamed streams_through(const TestServer &s, const std::vector<json> &requests,
                                const std::function<void()> &fault, std::chrono::milliseconds settle = 0ms,
                                const std::string &path = "/v1/completions") {
    std::atomic<int> n_flowing{0};
    Streamed out;
    out.bodies.resize(requests.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < requests.size(); ++i) {
        threads.emplace_back([&, i] {
            auto cc = s.client();
            httplib::Request req;
            req.method = "POST";
            req.path = path;
            req.headers = {{"Content-Type", "application/json"}};
            json body = requests[i];
            body["stream"] = true;
            req.body = body.dump();
            req.content_receiver = [&, i](const char *data, size_t n, uint64_t, uint64_t) {
                if (out.bodies[i].empty()) n_flowing++;
                out.bodies[i].append(data, n);
                return true;
            };
            httplib::Response res;
            httplib::Error err = httplib::Error::Success;
            cc.send(req, res, err);
        });
    }
    for (int k = 0; k < 1000 && n_flowing.load() < static_cast<int>(requests.size()); ++k)
        std::this_thread::sleep_for(10ms);
    EXPECT_EQ(n_flowing.load(), static_cast<int>(requests.size()));
    std::this_thread::sleep_for(settle);
    fault();
    const auto t0 = std::chrono::steady_clock::now();
    for (auto &t : threads) t.join();
    out.seconds_after_fault = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return out;
}

// Streams of `requests` when `fault` strikes (`settle` after they began: some tokens out, most to come): each
// continues with exactly the text and finish reason it has undisturbed (asked first, one at a time).
inline void expect_streams_continue(TestServer &s, const std::vector<json> &requests, const std::function<void()> &fault,
                                    std::chrono::milliseconds settle = 200ms) {
    auto c = s.client();
    std::vector<std::string> expected, expected_finish(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) expected.push_back(completion_text(c, requests[i], &expected_finish[i]));
    const Streamed st = streams_through(s, requests, fault, settle);
    for (size_t i = 0; i < requests.size(); ++i) {
        SCOPED_TRACE(requests[i].dump());
        bool done = false;
        const auto events = parse_sse(st.bodies[i], &done);
        EXPECT_TRUE(done);
        std::string finish;
        EXPECT_EQ(stream_text(events, &finish), expected[i]);
        EXPECT_EQ(finish, expected_finish[i]);
    }
}

inline int64_t metric(const std::string &text, const std::string &name) {
    size_t pos = text.find("\n" + name + " ");
    if (pos == std::string::npos) return -1;
    return std::stoll(text.substr(pos + name.size() + 2));
}

}  // namespace td::server::test_server
