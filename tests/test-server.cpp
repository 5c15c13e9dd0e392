// tandem serve over real loopback HTTP: the server runs in this process on port 0 with the stories260K
// model; clients are cpp-httplib clients. Every ServerTest runs twice: on one machine (LocalEngine) and with
// the model split over 2 real `tandem worker` processes (ClusterEngine, --wire f32 so the text equals the
// local one, 2 micro-batches in flight). Stalls and step failures are injected by wrapping the real engine
// (ServeParams::wrap_engine), never by replacing it; worker failures by killing the worker.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <set>

#include "gguf/gguf.h"
#include "server/dry-breakers.h"
#include "test-server-util.h"
#include "text/vocab.h"

namespace td::server {
namespace {

using namespace test_server;

class ServerTest : public ::testing::TestWithParam<Backend> {
protected:
    void SetUp() override {
        if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    }
    ServerOptions opts() const {
        ServerOptions o;
        o.backend = GetParam();
        // These tests are about HTTP and scheduling, not failure detection (test-server-cluster.cpp's are):
        // under a loaded sanitizer run a worker once missed the 2 s heartbeat and failed a request here.
        o.dead_after_ms = 10000;
        return o;
    }
    bool cluster() const { return GetParam() != Backend::local; }
    bool pipeline() const { return GetParam() == Backend::cluster; }
};

INSTANTIATE_TEST_SUITE_P(Backends, ServerTest, ::testing::Values(Backend::local, Backend::cluster, Backend::tp),
                         [](const ::testing::TestParamInfo<Backend> &info) {
                             return info.param == Backend::local     ? "local"
                                    : info.param == Backend::cluster ? "two_workers"
                                                                     : "tp2";
                         });

TEST_P(ServerTest, HealthIsLoadingUntilTheModelIsAttached) {
    ServerOptions o = opts();
    o.attach = false;
    TestServer s(o);
    auto c = s.client();
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503);
    EXPECT_EQ(json::parse(r->body)["status"], "loading");
    auto g = post(c, "/v1/completions", {{"prompt", "Once"}});
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 503);
    s.attach();
    r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body)["status"], "ok");
}

TEST_P(ServerTest, ModelsListsTheAlias) {
    TestServer s(opts());
    auto c = s.client();
    auto r = c.Get("/v1/models");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "list");
    ASSERT_EQ(j["data"].size(), 1u);
    EXPECT_EQ(j["data"][0]["id"], "stories");
    EXPECT_EQ(j["data"][0]["object"], "model");
    // OpenAI's retrieve (client.models.retrieve): the served model by its id, percent-escapes decoded.
    for (const char *path : {"/v1/models/stories", "/v1/models/st%6Fries"}) {
        r = c.Get(path);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << path << ": " << r->body;
        j = json::parse(r->body);
        EXPECT_EQ(j["id"], "stories");
        EXPECT_EQ(j["object"], "model");
        EXPECT_EQ(j["owned_by"], "tandem");
    }
    r = c.Get("/v1/models/gpt-4%");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
    EXPECT_NE(r->body.find("model 'gpt-4%' not found; this server serves 'stories'"), std::string::npos)
        << r->body;
    r = c.Delete("/v1/models/stories");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);

    // llama-server's /props: the model, the slots, the template, the special tokens and the defaults a
    // request that sets nothing samples with.
    r = c.Get("/props");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    EXPECT_EQ(j["model_alias"], "stories");
    EXPECT_EQ(j["model_path"], test::shared_path(k_model));
    EXPECT_EQ(j["total_slots"], 4);
    EXPECT_EQ(j["bos_token"], "<s>");
    EXPECT_EQ(j["eos_token"], "</s>");
    EXPECT_EQ(j["build_info"].get<std::string>().rfind("tandem ", 0), 0u) << r->body;
    const json models = json::parse(c.Get("/v1/models")->body);
    EXPECT_EQ(j["default_generation_settings"]["n_ctx"], models["data"][0]["meta"]["n_ctx_slot"]);
    const json &defaults = j["default_generation_settings"]["params"];
    EXPECT_FLOAT_EQ(defaults["temperature"].get<float>(), 0.8f);
    EXPECT_EQ(defaults["top_k"], 40);
    EXPECT_FLOAT_EQ(defaults["min_p"].get<float>(), 0.05f);
    EXPECT_EQ(c.Post("/props", "{}", "application/json")->status, 405);
}

TEST_P(ServerTest, GreedyCompletionEqualsTandemRun) {
    const std::string prompt = "Once upon a time";
    auto run = test::run_tandem(
        {"run", "-m", test::shared_path(k_model), "-p", prompt, "-n", "40", "--temp", "0", "-t", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    ASSERT_FALSE(run.out.empty());
    const std::string expected = run.out.substr(0, run.out.size() - 1);  // run ends with a newline

    TestServer s(opts());
    auto c = s.client();
    auto r = post(c, "/v1/completions",
                  {{"model", "stories"}, {"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "text_completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
    EXPECT_EQ(j["model"], "stories");
    EXPECT_TRUE(j["created"].is_number_integer());
    EXPECT_EQ(j["choices"][0]["index"], 0);
    EXPECT_EQ(j["choices"][0]["text"], expected);
    EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
    EXPECT_EQ(j["usage"]["completion_tokens"], 40);
    EXPECT_GT(j["usage"]["prompt_tokens"].get<int>(), 1);
    EXPECT_EQ(j["usage"]["total_tokens"].get<int>(),
              j["usage"]["prompt_tokens"].get<int>() + j["usage"]["completion_tokens"].get<int>());

    // The same request streamed gives the same text, chunk by chunk, then [DONE]; usage on request.
    r = post(c, "/v1/completions",
             {{"prompt", prompt},
              {"max_tokens", 40},
              {"temperature", 0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
    bool done = false;
    auto events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    std::string finish;
    EXPECT_EQ(stream_text(events, &finish), expected);
    EXPECT_EQ(finish, "length");
    EXPECT_GT(events.size(), 5u);
    ASSERT_FALSE(events.empty());
    EXPECT_TRUE(events.back()["choices"].empty());
    EXPECT_EQ(events.back()["usage"]["completion_tokens"], 40);
}

TEST_P(ServerTest, ChatStreamingAndNotAgree) {
    TestServer s(opts());
    auto c = s.client();
    json body = {{"messages",
                  {{{"role", "system"}, {"content", "Be brief."}},
                   {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "Tell a story"}}}}}}},
                 {"max_completion_tokens", 24},
                 {"temperature", 0.9},
                 {"seed", 42},
                 {"some_unknown_field", {1, 2, 3}}};
    auto r = post(c, "/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "chat.completion");
    EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
    EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
    const std::string text = j["choices"][0]["message"]["content"];
    const std::string finish = j["choices"][0]["finish_reason"];
    EXPECT_TRUE(finish == "stop" || finish == "length") << finish;
    EXPECT_LE(j["usage"]["completion_tokens"].get<int>(), 24);

    body["stream"] = true;
    r = post(c, "/v1/chat/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    bool done = false;
    auto events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    ASSERT_GE(events.size(), 2u);
    EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
    EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
    std::string sfinish;
    EXPECT_EQ(stream_text(events, &sfinish), text);
    EXPECT_EQ(sfinish, finish);
    for (const json &e : events) EXPECT_EQ(e["id"], events[0]["id"]);
}

TEST_P(ServerTest, StopStringEndsTheReplyWithoutIt) {
    TestServer s(opts());
    auto c = s.client();
    json body = {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}};
    const std::string full = completion_text(c, body);
    ASSERT_GT(full.size(), 40u);
    // A stop string from the middle of the greedy text: the reply is everything before its first occurrence.
    const std::string stop = full.substr(25, 6);
    const std::string expected = full.substr(0, full.find(stop));
    body["stop"] = json::array({"never-there", stop});
    std::string finish;
    EXPECT_EQ(completion_text(c, body, &finish), expected);
    EXPECT_EQ(finish, "stop");
    body["stream"] = true;
    auto r = post(c, "/v1/completions", body);
    ASSERT_TRUE(r);
    bool done = false;
    std::string sfinish;
    EXPECT_EQ(stream_text(parse_sse(r->body, &done), &sfinish), expected);
    EXPECT_EQ(sfinish, "stop");
}

TEST_P(ServerTest, ConcurrentClientsGetTheirSoloText) {
    ServerOptions o = opts();
    o.n_parallel = 4;  // 8 clients over 4 slots: half wait in the queue, prompts are absorbed mid-stream
    TestServer s(o);
    const char *prompts[] = {"Once upon a time", "The cat",     "Lily and Tom went", "A big dog",
                             "One day",          "The sun was", "Tim had a ball",    "She said"};
    const auto body_for = [&](int i) {
        return json{{"prompt", prompts[i]}, {"max_tokens", 24 + 5 * i},
                    {"temperature", 1.0},   {"top_k", 0},
                    {"top_p", 1.0},         {"min_p", 0.0},
                    {"seed", 1000 + i},     {"stream", i % 2 == 0}};
    };
    const auto text_of = [&](httplib::Client &c, int i) -> std::string {
        json body = body_for(i);
        auto r = post(c, "/v1/completions", body);
        if (!r || r->status != 200) return "<failed>";
        if (body["stream"].get<bool>()) {
            bool done = false;
            return stream_text(parse_sse(r->body, &done));
        }
        return json::parse(r->body)["choices"][0]["text"].get<std::string>();
    };
    std::vector<std::string> alone(8), together(8);
    {
        auto c = s.client();
        for (int i = 0; i < 8; ++i) alone[i] = text_of(c, i);
    }
    std::vector<std::thread> threads;
    for (int i = 0; i < 8; ++i)
        threads.emplace_back([&, i] {
            auto c = s.client();
            together[i] = text_of(c, i);
        });
    for (auto &t : threads) t.join();
    for (int i = 0; i < 8; ++i) {
        EXPECT_NE(alone[i], "<failed>");
        EXPECT_EQ(together[i], alone[i]) << "client " << i;
    }
    // Different seeds and prompts really give different texts (the comparison above is not vacuous).
    EXPECT_NE(alone[0], alone[1]);
    auto c = s.client();
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    // Batching happened: fewer steps than tokens generated.
    EXPECT_LT(metric(m->body, "tandem_steps_total"), metric(m->body, "tandem_generated_tokens_total"));
    // Through 2 workers the batch flows as 2 micro-batches, one per stage.
    EXPECT_EQ(metric(m->body, "tandem_micro_batches"), pipeline() ? 2 : 1);
}

TEST_P(ServerTest, TokenizeDetokenizeRoundTrip) {
    TestServer s(opts());
    auto c = s.client();
    auto r = post(c, "/tokenize", {{"content", "Hello world, the cat sat."}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json tokens = json::parse(r->body)["tokens"];
    ASSERT_GT(tokens.size(), 3u);
    EXPECT_EQ(tokens, json(s.model().tokenizer().encode("Hello world, the cat sat.", false, true)));
    r = post(c, "/detokenize", {{"tokens", tokens}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["content"], "Hello world, the cat sat.");
    r = post(c, "/detokenize", {{"tokens", {1, 999999}}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    r = post(c, "/tokenize", {{"content", 5}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
}

TEST_P(ServerTest, MetricsCountRequestsAndTokens) {
    TestServer s(opts());
    auto c = s.client();
    ASSERT_EQ(completion_text(c, {{"prompt", "Once"}, {"max_tokens", 8}, {"temperature", 0}}).empty(), false);
    auto bad = post(c, "/v1/completions", {{"prompt", 3.5}});
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    auto r = c.Get("/metrics");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200);
    const std::string &m = r->body;
    EXPECT_NE(m.find("tandem_requests_total{path=\"/v1/completions\",status=\"200\"} 1\n"), std::string::npos)
        << m;
    EXPECT_NE(m.find("tandem_requests_total{path=\"/v1/completions\",status=\"400\"} 1\n"), std::string::npos)
        << m;
    EXPECT_EQ(metric(m, "tandem_generated_tokens_total"), 8);
    EXPECT_GT(metric(m, "tandem_prompt_tokens_total"), 0);
    EXPECT_EQ(metric(m, "tandem_queue_depth"), 0);
    EXPECT_EQ(metric(m, "tandem_slots_active"), 0);
    EXPECT_EQ(metric(m, "tandem_slots_total"), 4);
    EXPECT_NE(m.find("tandem_requests_finished_total{reason=\"length\"} 1\n"), std::string::npos) << m;
    EXPECT_NE(m.find("tandem_tokens_per_second "), std::string::npos);
    EXPECT_EQ(metric(m, "tandem_time_to_first_token_seconds_count"), 1);
    EXPECT_EQ(metric(m, "tandem_engine_healthy"), 1);
    if (!cluster()) {
        EXPECT_EQ(m.find("tandem_node_"), std::string::npos);
        return;
    }
    // Per-node and per-link counters of the workers (the engine thread probes them every 200 ms). The first
    // worker computed the prompt chunk and 7 decode steps (the 8th token is not fed back).
    const std::string a1 = s.workers().first().address(), a2 = s.workers().second().address();
    const std::string l1 = pipeline() ? "0-1" : "0-4", l2 = pipeline() ? "2-4" : "0-4";
    const std::string steps1 = "tandem_node_forward_steps_total{node=\"" + a1 + "\",layers=\"" + l1 + "\"}";
    std::string text;
    for (int i = 0; i < 100; ++i) {
        auto mr = c.Get("/metrics");
        ASSERT_TRUE(mr);
        text = mr->body;
        if (metric(text, steps1) == 8) break;
        std::this_thread::sleep_for(50ms);
    }
    EXPECT_EQ(metric(text, steps1), 8) << text;
    for (const std::string &needle :
         {"tandem_node_forward_steps_total{node=\"" + a2 + "\",layers=\"" + l2 + "\"} 8\n",
          "tandem_node_step_latency_seconds{node=\"" + a1 + "\",layers=\"" + l1 + "\"} "})
        EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
    // Which transport each link took: every node here is a process of this host.
    const std::string t = net::transport_name(test::test_link_transport());
    EXPECT_NE(text.find("tandem_node_links_info{node=\"" + a1 + "\",layers=\"" + l1 + "\",links=\"in " + t),
              std::string::npos)
        << text;
    EXPECT_NE(text.find("tandem_node_links_info{node=\"head\",layers=\"-\",links=\"in " + t + ", out " + t),
              std::string::npos)
        << text;
    if (pipeline()) {
        for (const std::string &needle :
             {"tandem_link_messages_total{from=\"head\",to=\"" + a1 + "\"} ",
              "tandem_link_send_latency_seconds{from=\"" + a1 + "\",to=\"" + a2 + "\"} ",
              "tandem_link_bytes_total{from=\"" + a2 + "\",to=\"head\"} "})
            EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
        EXPECT_EQ(text.find("tandem_node_tp_"), std::string::npos);
        return;
    }
    // --tp 2: the head feeds both ranks, rank 0 answers; each rank ran 2 all-reduces per layer per step.
    const std::string per_step = "tandem_node_tp_all_reduces_per_step{node=\"" + a2 + "\",layers=\"0-4\"}";
    for (const std::string &needle :
         {"tandem_link_messages_total{from=\"head\",to=\"" + a1 + "," + a2 + "\"} ",
          "tandem_link_bytes_total{from=\"" + a1 + "\",to=\"head\"} ", per_step + " ",
          "tandem_node_tp_all_reduces_total{node=\"" + a1 + "\",layers=\"0-4\"} 80\n",
          "tandem_node_tp_bytes_per_token{node=\"" + a1 + "\",layers=\"0-4\"} ",
          "tandem_node_tp_collective_latency_seconds{node=\"" + a2 + "\",layers=\"0-4\"} "})
        EXPECT_NE(text.find(needle), std::string::npos) << needle << "\n" << text;
    EXPECT_EQ(metric(text, per_step), 10) << text;  // stories260K: 5 layers
}

TEST_P(ServerTest, LogprobsCoverEveryToken) {
    TestServer s(opts());
    auto c = s.client();
    auto r = post(c, "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                   {"max_tokens", 6},
                   {"temperature", 0},
                   {"logprobs", true},
                   {"top_logprobs", 3}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    const json &content = j["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(),
              j["usage"]["completion_tokens"].get<size_t>() - (j["choices"][0]["finish_reason"] == "stop"));
    for (const json &t : content) {
        ASSERT_EQ(t["top_logprobs"].size(), 3u);
        EXPECT_LE(t["logprob"].get<double>(), 0.0);
        // Greedy picks the most likely token.
        EXPECT_EQ(t["token"], t["top_logprobs"][0]["token"]);
    }
}

TEST_P(ServerTest, DisconnectMidStreamFreesTheSlot) {
    ServerOptions o = opts();
    o.n_parallel = 1;
    o.n_ctx_slot = 512;
    o.step_delay = 20ms;  // the first request would take 400 * 20 ms = 8 s if it ran to the end
    TestServer s(o);
    {
        auto c = s.client();
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.headers = {{"Content-Type", "application/json"}};
        req.body =
            json{{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"stream", true}, {"seed", 1}}.dump();
        int chunks = 0;
        req.content_receiver = [&](const char *, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
        httplib::Response res;
        httplib::Error err = httplib::Error::Success;
        EXPECT_FALSE(c.send(req, res, err));  // we hung up
        EXPECT_EQ(chunks, 3);
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto c = s.client();
    std::string finish;
    EXPECT_FALSE(
        completion_text(c, {{"prompt", "The cat"}, {"max_tokens", 5}, {"temperature", 0}}, &finish).empty());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(seconds, 4.0) << "the second request waited for the abandoned one";
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_NE(m->body.find("tandem_requests_finished_total{reason=\"cancelled\"} 1\n"), std::string::npos)
        << m->body;
    EXPECT_LT(metric(m->body, "tandem_generated_tokens_total"), 200);
}

TEST_P(ServerTest, QueueOverflowGets503WithRetryAfter) {
    ServerOptions o = opts();
    o.n_parallel = 1;
    o.max_queue = 1;
    o.step_delay = 10ms;
    TestServer s(o);
    const json body = {{"prompt", "Once upon a time"}, {"max_tokens", 40}, {"temperature", 0}};
    std::vector<int> statuses(2, 0);
    std::vector<std::thread> threads;
    for (int i = 0; i < 2; ++i) {
        threads.emplace_back([&, i] {
            auto c = s.client();
            auto r = post(c, "/v1/completions", body);
            statuses[i] = r ? r->status : -1;
        });
        // Let the first one take the slot before the second arrives.
        auto c = s.client();
        for (int k = 0; k < 500; ++k) {
            auto m = c.Get("/metrics");
            if (m && metric(m->body, "tandem_slots_active") + metric(m->body, "tandem_queue_depth") == i + 1)
                break;
            std::this_thread::sleep_for(5ms);
        }
        if (i == 0) {
            // One slot busy, one queue place free: two choices (n) do not fit together, so neither is queued
            // and the next single request still gets the place.
            json two = body;
            two["n"] = 2;
            auto r = post(c, "/v1/completions", two);
            ASSERT_TRUE(r);
            EXPECT_EQ(r->status, 503) << r->body;
            auto m = c.Get("/metrics");
            ASSERT_TRUE(m);
            EXPECT_EQ(metric(m->body, "tandem_queue_depth"), 0);
        }
    }
    auto c = s.client();
    auto r = post(c, "/v1/completions", body);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 503) << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("busy"), std::string::npos);
    for (auto &t : threads) t.join();
    EXPECT_EQ(statuses[0], 200);
    EXPECT_EQ(statuses[1], 200);
}

TEST_P(ServerTest, ContextOverflowNamesBothNumbers) {
    TestServer s(opts());  // 256 positions per slot
    auto c = s.client();
    auto r = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 1000}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    json j = json::parse(r->body);
    const std::string msg = j["error"]["message"];
    EXPECT_NE(msg.find("max_tokens (1000)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("context size 256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("prompt ("), std::string::npos) << msg;
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_EQ(j["error"]["code"], 400);

    // Without max_tokens a reply runs until the context is full.
    std::string finish;
    auto body = json{{"prompt", {1, 2, 3}}, {"temperature", 0}, {"stop", "never"}};
    r = post(c, "/v1/completions", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    if (j["choices"][0]["finish_reason"] == "length") {
        EXPECT_EQ(j["usage"]["total_tokens"], 256);
    }
}

TEST_P(ServerTest, BadRequestsGetOpenAiErrors) {
    TestServer s(opts());
    auto c = s.client();
    const auto expect_status = [&](const std::string &path, const std::string &body, int status,
                                   const std::string &needle) {
        auto r = c.Post(path.c_str(), body, "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, status) << body << " -> " << r->body;
        json j = json::parse(r->body, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << r->body;
        ASSERT_TRUE(j.contains("error")) << r->body;
        EXPECT_NE(j["error"]["message"].get<std::string>().find(needle), std::string::npos) << r->body;
        EXPECT_TRUE(j["error"]["type"].is_string());
    };
    expect_status("/v1/completions", "{not json", 400, "not valid JSON");
    expect_status("/v1/chat/completions", "[1,2]", 400, "JSON object");
    expect_status("/v1/completions", R"({"prompt": "a", "temperature": "hot"})", 400,
                  "'temperature' must be a number");
    expect_status("/v1/completions", R"({"prompt": "a", "max_tokens": "5"})", 400,
                  "'max_tokens' must be an integer");
    expect_status("/v1/completions", R"({"prompt": "a", "max_tokens": 0})", 400, "max_tokens");
    expect_status("/v1/completions", R"({"prompt": "a", "n": 0})", 400, "'n' must be 1..128, got 0");
    expect_status("/v1/completions", R"({"prompt": "a", "n": 129})", 400, "'n' must be 1..128, got 129");
    expect_status("/v1/completions", R"({"prompt": ["a", 5]})", 400,
                  "'prompt' must be a string, token ids, or an array of either, got an integer");
    expect_status("/v1/completions", R"({"prompt": [[1, 2], []]})", 400, "got an empty array");
    expect_status("/v1/completions", R"({"prompt": [[1, "b"]]})", 400, "token ids must be integers");
    expect_status("/v1/completions", R"({"prompt": ["a", "b", "c"], "n": 43})", 400,
                  "'prompt' holds 3 prompts and 'n' is 43: at most 128 choices per request");
    expect_status("/v1/completions", R"({"prompt": "a", "stop": 7})", 400, "'stop'");
    expect_status("/v1/completions", R"({"prompt": "a", "top_p": 1.5})", 400, "top_p");
    expect_status("/v1/completions", R"({"prompt": "a", "stream": "yes"})", 400,
                  "'stream' must be a boolean");
    expect_status("/v1/completions", R"({"max_tokens": 3})", 400, "'prompt' is required");
    expect_status("/v1/chat/completions", R"({"messages": "hi"})", 400, "'messages' must be an array");
    expect_status("/v1/chat/completions", R"({"messages": [{"content": "hi"}]})", 400, "role");
    expect_status("/v1/chat/completions",
                  R"({"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4"})", 404,
                  "model 'gpt-4' not found");
    expect_status("/v1/completions", R"({"prompt": "a", "logit_bias": 3})", 400,
                  "'logit_bias' must be an object");
    expect_status("/v1/completions", R"({"prompt": "a", "logit_bias": {"comma": 1}})", 400,
                  "keys must be token ids");
    expect_status("/v1/completions", R"({"prompt": "a", "logit_bias": {"5": 101}})", 400, "[-100, 100]");
    expect_status("/v1/completions", R"({"prompt": "a", "logit_bias": [[5]]})", 400,
                  "[token id, bias] pairs");
    expect_status("/v1/chat/completions",
                  R"({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"512": -100}})", 400,
                  "token 512 is outside the vocabulary (512 tokens)");
    expect_status("/v1/nothing", "{}", 404, "no endpoint");
    // The server still answers afterwards.
    EXPECT_FALSE(completion_text(c, {{"prompt", "Once"}, {"max_tokens", 4}, {"model", "stories"}}).empty());
}

// `req` (several choices) answered whole and streamed: choice i's text is expected[i], each ends at
// max_tokens, and usage counts n_prompt and n_generated. Streamed, each chunk names its choice and one usage
// chunk and one [DONE] close the stream.
void expect_choices(httplib::Client &c, json req, const std::vector<std::string> &expected, int32_t n_prompt,
                    int32_t n_generated) {
    auto r = post(c, "/v1/completions", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    ASSERT_EQ(j["choices"].size(), expected.size()) << r->body;
    for (size_t i = 0; i < expected.size(); ++i) {
        EXPECT_EQ(j["choices"][i]["index"], i);
        EXPECT_EQ(j["choices"][i]["text"], expected[i]) << "choice " << i;
        EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
    }
    EXPECT_EQ(j["usage"]["prompt_tokens"], n_prompt);
    EXPECT_EQ(j["usage"]["completion_tokens"], n_generated);

    req["stream"] = true;
    req["stream_options"] = {{"include_usage", true}};
    r = post(c, "/v1/completions", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    bool done = false;
    const auto events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    for (size_t i = 0; i < expected.size(); ++i) {
        std::string finish;
        EXPECT_EQ(stream_text(events, &finish, static_cast<int>(i)), expected[i]) << "choice " << i;
        EXPECT_EQ(finish, "length");
    }
    ASSERT_FALSE(events.empty());
    EXPECT_TRUE(events.back()["choices"].empty());
    EXPECT_EQ(events.back()["usage"]["prompt_tokens"], n_prompt);
    EXPECT_EQ(events.back()["usage"]["completion_tokens"], n_generated);
}

// OpenAI's n: n choices, each its own sequence. With a seed, choice i is what a request seeded seed + i gets
// alone (vLLM's rule), streamed or not, on every engine; usage counts the prompt once and every choice's
// tokens.
TEST_P(ServerTest, NChoicesEachGetTheTextOfTheirOwnSeed) {
    ServerOptions o = opts();
    o.n_parallel = 2;  // 3 choices over 2 slots: one waits in the queue
    TestServer s(o);
    auto c = s.client();
    const json one = {{"prompt", "Once upon a time"},
                      {"max_tokens", 20},
                      {"temperature", 1.0},
                      {"top_k", 0},
                      {"top_p", 1.0},
                      {"min_p", 0.0}};
    std::vector<std::string> alone;
    int32_t n_prompt = 0, n_generated = 0;
    for (int i = 0; i < 3; ++i) {
        json req = one;
        req["seed"] = 70 + i;
        auto r = post(c, "/v1/completions", req);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        alone.push_back(j["choices"][0]["text"]);
        n_prompt = j["usage"]["prompt_tokens"];
        n_generated += j["usage"]["completion_tokens"].get<int32_t>();
    }
    EXPECT_NE(alone[0], alone[1]);  // the seeds really differ
    EXPECT_NE(alone[1], alone[2]);

    json req = one;
    req["seed"] = 70;
    req["n"] = 3;
    expect_choices(c, req, alone, n_prompt, n_generated);

    // A chat stream opens every choice with the assistant's role.
    json chat = {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}},
                 {"max_tokens", 8},
                 {"n", 2},
                 {"seed", 5},
                 {"stream", true}};
    auto r = post(c, "/v1/chat/completions", chat);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    bool done = false;
    auto events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    ASSERT_GE(events.size(), 2u);
    for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(events[i]["choices"][0]["index"], i);
        EXPECT_EQ(events[i]["choices"][0]["delta"]["role"], "assistant");
    }
    chat["stream"] = false;
    r = post(c, "/v1/chat/completions", chat);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    ASSERT_EQ(j["choices"].size(), 2u);
    for (int i = 0; i < 2; ++i) {
        std::string finish;
        EXPECT_EQ(j["choices"][i]["message"]["content"], stream_text(events, &finish, i)) << "choice " << i;
        EXPECT_EQ(j["choices"][i]["finish_reason"], finish);
    }

    // More choices than the slots and the queue could ever hold at once is the client's error, not a 503.
    ServerOptions tight = opts();
    tight.n_parallel = 2;
    tight.max_queue = 1;
    TestServer small(tight);
    auto sc = small.client();
    req = one;
    req["n"] = 4;
    r = post(sc, "/v1/completions", req);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("4 choices are more than this server can hold at once: 2 slots (--parallel) and 1 "
                           "queue places"),
              std::string::npos)
        << r->body;
    req["n"] = 3;
    EXPECT_EQ(post(sc, "/v1/completions", req)->status, 200);
}

// OpenAI's batch of prompts (text or token ids) with n choices each: prompt p's choice j is choices[p * n +
// j] and is what a request for that prompt seeded seed + j gets alone; usage counts each prompt once.
TEST_P(ServerTest, ABatchOfPromptsGivesEachPromptsChoicesInOrder) {
    TestServer s(opts());
    auto c = s.client();
    auto tok = post(c, "/tokenize", {{"content", "The cat"}, {"add_special", true}});
    ASSERT_TRUE(tok);
    ASSERT_EQ(tok->status, 200);
    const json prompts = json::array({"Once upon a time", json::parse(tok->body)["tokens"], "One day"});
    const json sampling = {
        {"max_tokens", 12}, {"temperature", 1.0}, {"top_k", 0}, {"top_p", 1.0}, {"min_p", 0.0}};
    std::vector<std::string> alone;
    int32_t n_prompt = 0, n_generated = 0;
    for (const json &p : prompts)
        for (int j = 0; j < 2; ++j) {
            json req = sampling;
            req["prompt"] = p;
            req["seed"] = 9 + j;
            auto r = post(c, "/v1/completions", req);
            ASSERT_TRUE(r);
            ASSERT_EQ(r->status, 200) << r->body;
            const json one = json::parse(r->body);
            alone.push_back(one["choices"][0]["text"]);
            if (j == 0) n_prompt += one["usage"]["prompt_tokens"].get<int32_t>();
            n_generated += one["usage"]["completion_tokens"].get<int32_t>();
        }
    EXPECT_NE(alone[0], alone[2]);  // the prompts really differ

    json req = sampling;
    req["prompt"] = prompts;
    req["n"] = 2;
    req["seed"] = 9;
    expect_choices(c, req, alone, n_prompt, n_generated);
}

// llama-server's own /completion, as scripts written against llama.cpp call it: the text `tandem run` gives,
// llama.cpp's field names, its stop_type for each way a reply ends, n_probs, and its stream (no [DONE]).
TEST_P(ServerTest, LlamaServersCompletionEndpointAnswersAsItDoes) {
    const std::string prompt = "Once upon a time";
    auto run = test::run_tandem(
        {"run", "-m", test::shared_path(k_model), "-p", prompt, "-n", "40", "--temp", "0", "-t", "1"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    const std::string expected = run.out.substr(0, run.out.size() - 1);

    TestServer s(opts());
    auto c = s.client();
    const json base = {{"prompt", prompt}, {"n_predict", 40}, {"temperature", 0}};
    auto r = post(c, "/completion", base);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["content"], expected);
    EXPECT_EQ(j["stop"], true);
    EXPECT_EQ(j["stop_type"], "limit");
    EXPECT_EQ(j["tokens_predicted"], 40);
    EXPECT_GT(j["tokens_evaluated"].get<int>(), 1);
    EXPECT_EQ(j["timings"]["predicted_n"], 40);
    EXPECT_GT(j["timings"]["predicted_per_second"].get<double>(), 0.0);
    EXPECT_EQ(j["generation_settings"]["n_predict"], 40);
    EXPECT_EQ(j["model"], "stories");
    EXPECT_FALSE(j.contains("completion_probabilities"));

    // Streamed: pieces with stop: false, then the whole reply's object with stop: true, and no [DONE].
    json req = base;
    req["stream"] = true;
    r = post(c, "/completions", req);  // llama-server's other name for it
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    bool done = false;
    const auto events = parse_sse(r->body, &done);
    EXPECT_FALSE(done);
    ASSERT_GE(events.size(), 2u);
    std::string streamed;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
        EXPECT_EQ(events[i]["stop"], false);
        streamed += events[i]["content"].get<std::string>();
    }
    EXPECT_EQ(streamed, expected);
    EXPECT_EQ(events.back()["stop"], true);
    EXPECT_EQ(events.back()["stop_type"], "limit");
    EXPECT_EQ(events.back()["tokens_predicted"], 40);

    // A stop word ends it with stop_type "word" and names the word; the end of text pushed up, with "eos".
    req = base;
    const std::string stop = expected.substr(25, 6);
    req["stop"] = {stop};
    j = json::parse(post(c, "/completion", req)->body);
    EXPECT_EQ(j["content"], expected.substr(0, expected.find(stop)));
    EXPECT_EQ(j["stop_type"], "word");
    EXPECT_EQ(j["stopping_word"], stop);
    req = base;
    req["logit_bias"] = json::array({json::array({2, 100})});
    j = json::parse(post(c, "/completion", req)->body);
    EXPECT_EQ(j["content"], "");
    EXPECT_EQ(j["stop_type"], "eos");
    EXPECT_EQ(j["stopping_word"], "");

    // n_probs: each token with its logprob and the top ones, ids included; greedy draws the first of them.
    req = base;
    req["n_predict"] = 4;
    req["n_probs"] = 3;
    j = json::parse(post(c, "/completion", req)->body);
    ASSERT_EQ(j["completion_probabilities"].size(), 4u) << j.dump();
    std::string pieces;
    for (const json &p : j["completion_probabilities"]) {
        pieces += p["token"].get<std::string>();
        ASSERT_EQ(p["top_logprobs"].size(), 3u);
        EXPECT_EQ(p["top_logprobs"][0]["id"], p["id"]);
        EXPECT_LE(p["logprob"].get<double>(), 0.0);
    }
    EXPECT_EQ(pieces, j["content"]);

    for (const auto &[body, needle] :
         {std::pair{R"({"prompt": "a", "n_predict": 0})", "'n_predict' must be -1"},
          std::pair{R"({"prompt": "a", "n_probs": 21})", "'n_probs' must be in [0, 20]"},
          std::pair{R"({"prompt": "a", "n": 2})", "'n' is for /v1/completions"}}) {
        r = c.Post("/completion", body, "application/json");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 400) << body;
        EXPECT_NE(r->body.find(needle), std::string::npos) << r->body;
    }

    // A list of prompts: a list of replies, in order, each naming its prompt's index; streamed, each event
    // names it, and each prompt ends with its own whole object.
    const std::string other = "The little dog";
    req = base;
    req["prompt"] = other;
    const std::string expected_other = json::parse(post(c, "/completion", req)->body)["content"];
    EXPECT_NE(expected_other, expected);
    req["prompt"] = {prompt, other};
    r = post(c, "/completion", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    ASSERT_TRUE(j.is_array()) << r->body;
    ASSERT_EQ(j.size(), 2u);
    EXPECT_EQ(j[0]["index"], 0);
    EXPECT_EQ(j[0]["content"], expected);
    EXPECT_EQ(j[1]["index"], 1);
    EXPECT_EQ(j[1]["content"], expected_other);
    EXPECT_EQ(j[1]["stop_type"], "limit");
    req["stream"] = true;
    r = post(c, "/completion", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    std::string texts[2];
    int n_final[2] = {0, 0};
    for (const json &ev : parse_sse(r->body, &done)) {
        const int i = ev["index"];
        ASSERT_TRUE(i == 0 || i == 1) << ev.dump();
        if (ev["stop"] == true) {
            n_final[i]++;
            EXPECT_EQ(ev["tokens_predicted"], 40);
        } else {
            texts[i] += ev["content"].get<std::string>();
        }
    }
    EXPECT_EQ(texts[0], expected);
    EXPECT_EQ(texts[1], expected_other);
    EXPECT_EQ(n_final[0], 1);
    EXPECT_EQ(n_final[1], 1);
    req["prompt"] = json::array({prompt});  // a list of one: its object, as llama-server answers
    req["stream"] = false;
    j = json::parse(post(c, "/completion", req)->body);
    ASSERT_TRUE(j.is_object()) << j.dump();
    EXPECT_EQ(j["content"], expected);
}

// logit_bias as OpenAI (an object) and llama.cpp (pairs, false bans) write it, and ignore_eos: the text
// `tandem run --logit-bias` gives on one machine, on every engine; seeded draws equal one machine's too (a
// tensor-parallel group then sends rank 0 every logit, since a bias reorders them).
TEST_P(ServerTest, LogitBiasAndIgnoreEosSteerAndBanTokensOnEveryEngine) {
    const std::string prompt = "Once upon a time";
    auto cli = [&](const std::vector<std::string> &bias, bool ignore_eos = false) {
        std::vector<std::string> args = {
            "run", "-m", test::shared_path(k_model), "-p", prompt, "-n", "24", "--temp", "0", "-t", "1"};
        for (const std::string &b : bias) args.insert(args.end(), {"--logit-bias", b});
        if (ignore_eos) args.push_back("--ignore-eos");
        auto r = test::run_tandem(args);
        EXPECT_EQ(r.exit_code, 0) << r.err;
        return r.out.empty() ? r.out : r.out.substr(0, r.out.size() - 1);
    };
    const std::string plain = cli({});
    ASSERT_EQ(plain.rfind(", there was", 0), 0u) << plain;  // token 432 is ","
    const std::string steered = cli({"432-100", "261+2.5"});
    const std::string banned = cli({"432-inf", "261+2.5"});
    EXPECT_NE(steered, plain);
    EXPECT_EQ(steered.find(','), std::string::npos) << steered;
    EXPECT_EQ(banned, steered);
    // The end of text (token 2) pushed up ends the reply at once; --ignore-eos bans it again (llama.cpp's).
    EXPECT_EQ(cli({"2+100"}), "");
    EXPECT_EQ(cli({"2+100"}, true), plain);

    TestServer s(opts());
    auto c = s.client();
    const json base = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0}};
    json req = base;
    req["logit_bias"] = {{"432", -100}, {"261", 2.5}};
    EXPECT_EQ(completion_text(c, req), steered);
    req["logit_bias"] = json::array({json::array({432, false}), json::array({261, 2.5})});
    EXPECT_EQ(completion_text(c, req), steered);
    EXPECT_EQ(completion_text(c, base), plain);  // the next request has none
    req = base;
    req["logit_bias"] = {{"2", 100}};
    std::string finish;
    EXPECT_EQ(completion_text(c, req, &finish), "");
    EXPECT_EQ(finish, "stop");
    req["ignore_eos"] = true;  // llama-server's and vLLM's: runs to max_tokens
    EXPECT_EQ(completion_text(c, req, &finish), plain);
    EXPECT_EQ(finish, "length");

    ServerOptions local;
    TestServer one_machine(local);
    auto ref = one_machine.client();
    for (uint64_t seed : {3u, 4u}) {
        json drawn = {{"prompt", prompt},
                      {"max_tokens", 24},
                      {"temperature", 0.9},
                      {"seed", seed},
                      {"logit_bias", {{"432", -100}, {"286", 3}}}};
        const std::string got = completion_text(c, drawn);
        EXPECT_EQ(got, completion_text(ref, drawn)) << "seed " << seed;
        EXPECT_EQ(got.find(','), std::string::npos) << got;
    }
}

TEST_P(ServerTest, ApiKeyIsRequiredExceptForHealth) {
    ServerOptions o = opts();
    o.api_key = "sekrit";
    TestServer s(o);
    auto c = s.client();
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    r = c.Get("/v1/models");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(json::parse(r->body)["error"]["type"], "authentication_error");
    for (const char *wrong : {"Bearer wrong", "Bearer sekri", "Bearer sekritt", "sekrit", "Bearer "}) {
        r = c.Get("/v1/models", {{"Authorization", wrong}});
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 401) << wrong;
    }
    r = post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}},
             {{"Authorization", "Bearer sekrit"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    // The dashboard's files hold no data and load without the key (the page then asks for it); its data does
    // not.
    for (const char *path : {"/", "/index.html", "/app.js", "/style.css"}) {
        r = c.Get(path);
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200) << path;
    }
    r = c.Get("/status");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    r = c.Get("/status", {{"Authorization", "Bearer sekrit"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
}

// GET /status: what the dashboard draws. The scheduler's counters, and the engine's nodes: this machine
// alone, the two pipeline stages with their layers and the three links of the ring, or two tensor-parallel
// ranks.
TEST_P(ServerTest, StatusDescribesTheServerAndItsNodes) {
    TestServer s(opts());
    auto c = s.client();
    ASSERT_FALSE(completion_text(c, {{"prompt", "Once"}, {"max_tokens", 8}, {"temperature", 0}}).empty());
    json st;
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    do {
        auto r = c.Get("/status");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200);
        EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
        st = json::parse(r->body);
        // A cluster's nodes come with the engine thread's next probe (about a second), with the step counted.
        if (!cluster() || (!st["engine"]["nodes"].empty() && st["engine"]["nodes"][0]["forward_steps"] > 0))
            break;
        std::this_thread::sleep_for(50ms);
    } while (std::chrono::steady_clock::now() < deadline);
    EXPECT_EQ(st["status"], "ok") << st.dump();
    EXPECT_EQ(st["server"]["generated_tokens"], 8) << st.dump();
    EXPECT_EQ(st["server"]["requests_finished"]["length"], 1) << st.dump();
    EXPECT_EQ(st["server"]["slots_total"], 4) << st.dump();
    EXPECT_EQ(st["server"]["queue_depth"], 0) << st.dump();
    const json &nodes = st["engine"]["nodes"];
    const json &links = st["engine"]["links"];
    if (!cluster()) {
        ASSERT_EQ(nodes.size(), 1u) << st.dump();
        EXPECT_EQ(nodes[0]["address"], "local");
        EXPECT_EQ(nodes[0]["layers"], json::array({0, 4}));
        EXPECT_GT(nodes[0]["mem_total"].get<uint64_t>(), 0u);
        EXPECT_TRUE(links.empty());
        EXPECT_EQ(st["layout"], "");
        return;
    }
    ASSERT_EQ(nodes.size(), 2u) << st.dump();
    EXPECT_EQ(nodes[0]["address"], s.workers().first().address());
    EXPECT_EQ(nodes[1]["address"], s.workers().second_address());
    for (const json &n : nodes) {
        EXPECT_GT(n["forward_steps"].get<uint64_t>(), 0u) << n.dump();
        EXPECT_GT(n["weight_bytes"].get<uint64_t>(), 0u) << n.dump();
        EXPECT_GT(n["threads"].get<uint32_t>(), 0u) << n.dump();
    }
    EXPECT_FALSE(st["layout"].get<std::string>().empty());
    if (pipeline()) {
        EXPECT_EQ(nodes[0]["layers"], json::array({0, 1}));
        EXPECT_EQ(nodes[1]["layers"], json::array({2, 4}));
        EXPECT_EQ(nodes[1]["stage"], 1);
        ASSERT_EQ(links.size(), 3u) << st.dump();
        EXPECT_EQ(links[0]["from"], "head");
        EXPECT_EQ(links[2]["to"], "head");
    } else {
        EXPECT_EQ(nodes[0]["tp_size"], 2);
        EXPECT_EQ(nodes[1]["rank"], 1);
        EXPECT_EQ(nodes[1]["layers"], json::array({0, 4}));
        EXPECT_GT(nodes[0]["tp_all_reduces"].get<uint64_t>(), 0u);
        ASSERT_GE(links.size(), 2u) << st.dump();
    }
    for (const json &l : links) EXPECT_GT(l["bytes"].get<uint64_t>(), 0u) << l.dump();
}

// The dashboard comes from the binary: HTML, script and style with their types, never cached stale, scripts
// only from this server.
TEST(ServerDashboard, PagesComeFromTheBinaryWithTheirTypes) {
    TestServer s(ServerOptions{});
    auto c = s.client();
    auto r = c.Get("/");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
    EXPECT_NE(r->body.find("<script src=\"app.js\""), std::string::npos);
    EXPECT_EQ(r->get_header_value("Content-Security-Policy").rfind("default-src 'self'", 0), 0u);
    EXPECT_EQ(r->get_header_value("X-Content-Type-Options"), "nosniff");
    auto index = c.Get("/index.html");
    ASSERT_TRUE(index);
    EXPECT_EQ(index->body, r->body);
    r = c.Get("/app.js");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/javascript; charset=utf-8");
    EXPECT_NE(r->body.find("/v1/chat/completions"), std::string::npos);
    r = c.Get("/style.css");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/css; charset=utf-8");
    r = c.Post("/", "x", "text/plain");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405);
    r = c.Get("/app.js.map");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 404);
}

// 256 connections that each sent half a request header and 256 that sent nothing hold no thread: an
// ordinary completion is answered at once, and the server counts them all as open.
TEST(ServerLimits, SlowAndIdleConnectionsDoNotStarveAnOrdinaryRequest) {
    TestServer s;
    std::vector<int> fds;
    for (int i = 0; i < 512; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(s.port()));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0) << i;
        if (i % 2 == 0) {
            const std::string half = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty";
            ASSERT_EQ(::send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
        }
        fds.push_back(fd);
    }
    auto c = s.client();
    const auto t0 = std::chrono::steady_clock::now();
    const std::string text = completion_text(c, {{"prompt", "Once upon a time"}, {"max_tokens", 8}});
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_FALSE(text.empty());
    EXPECT_LT(took, 2.0);
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    for (int fd : fds) ::close(fd);
}

// The context bound at its value and one past, for the prompt alone and for prompt plus max_tokens.
TEST(ServerLimits, PromptAndMaxTokensAtTheContextAndOnePast) {
    TestServer s;  // 256 positions per slot
    auto c = s.client();
    auto prompt = [](size_t n) { return std::vector<int>(n, 100); };
    auto status = [&](const json &body) {
        auto r = post(c, "/v1/completions", body);
        EXPECT_TRUE(r);
        return r ? r->status : 0;
    };
    EXPECT_EQ(status({{"prompt", prompt(10)}, {"max_tokens", 246}, {"stop", "never"}}), 200);
    EXPECT_EQ(status({{"prompt", prompt(10)}, {"max_tokens", 247}}), 400);
    EXPECT_EQ(status({{"prompt", prompt(255)}, {"max_tokens", 1}}), 200);
    auto r = post(c, "/v1/completions", {{"prompt", prompt(256)}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("leaves no room"), std::string::npos) << r->body;
}

// An HTTP/1.1 POST from source address `from` (a loopback address of its own), its status.
int post_from(const std::string &from, int port, const json &body) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, from.c_str(), &src.sin_addr);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr *>(&src), sizeof src), 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    const std::string b = body.dump();
    const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: "
                            "application/json\r\nContent-Length: " +
                            std::to_string(b.size()) + "\r\n\r\n" + b;
    EXPECT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return out.size() > 12 ? std::atoi(out.c_str() + 9) : 0;
}

// --max-per-client 2: a client's third open request gets 429 (OpenAI's rate_limit_error, Retry-After) while
// another address is served; once the two are done the client is served again.
TEST(ServerLimits, RequestsPerClientAtTheLimitAndOnePast) {
    ServerOptions o;
    o.max_per_client = 2;
    o.step_delay = std::chrono::milliseconds(20);
    TestServer s(o);
    std::vector<std::thread> held;
    std::atomic<int> held_ok{0};
    for (int i = 0; i < 2; ++i)
        held.emplace_back([&, i] {
            auto c = s.client();
            auto r = post(c, "/v1/completions",
                          {{"prompt", "Once"}, {"max_tokens", 40}, {"stream", i == 0}, {"stop", "never"}});
            if (r && r->status == 200) ++held_ok;
        });
    // Both admitted (the slots show them) before the third is tried.
    auto c = s.client();
    for (int i = 0; i < 100; ++i) {
        auto m = c.Get("/metrics");
        if (m && metric(m->body, "tandem_slots_active") == 2) break;
        std::this_thread::sleep_for(20ms);
    }
    auto r = post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 429) << r->body;
    EXPECT_EQ(r->get_header_value("Retry-After"), "1");
    const json j = json::parse(r->body);
    EXPECT_EQ(j["error"]["type"], "rate_limit_error");
    EXPECT_NE(j["error"]["message"].get<std::string>().find(
                  "client 127.0.0.1 already has 2 of its 2 sequences open (the limit per client, "
                  "--max-per-client) and this request needs 1"),
              std::string::npos)
        << r->body;
    // Another client address is not counted with it.
    EXPECT_EQ(post_from("127.0.0.2", s.port(), {{"prompt", "Once"}, {"max_tokens", 2}}), 200);
    for (auto &t : held) t.join();
    EXPECT_EQ(held_ok.load(), 2);
    EXPECT_FALSE(completion_text(c, {{"prompt", "Once"}, {"max_tokens", 2}}).empty());
    // Each choice takes a place: two choices fit the limit, three never can.
    EXPECT_EQ(post(c, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 2}, {"n", 2}})->status, 200);
    r = post(c, "/v1/completions", {{"prompt", {"Once", "Twice"}}, {"max_tokens", 2}, {"n", 2}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(
        r->body.find("this request needs 4 sequences (one per choice) and a client may have 2 open at once"),
        std::string::npos)
        << r->body;
}

// GET /slots, as llama-server answers it: each slot's request (sampling parameters, prompt tokens, tokens
// decoded and remaining) while it runs, idle slots as idle, ?fail_on_no_slot=1 a 503 once every slot is
// busy; --no-slots turns it off.
TEST(ServerSlots, SlotsShowEachRunningRequestAndItsProgress) {
    ServerOptions o;
    o.n_parallel = 2;
    o.step_delay = std::chrono::milliseconds(20);
    TestServer s(o);
    auto c = s.client();
    const auto slots = [&] {
        auto r = c.Get("/slots");
        EXPECT_TRUE(r && r->status == 200);
        return r ? json::parse(r->body) : json();
    };
    json j = slots();
    ASSERT_EQ(j.size(), 2u) << j.dump();
    for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(j[i]["id"], i);
        EXPECT_EQ(j[i]["is_processing"], false);
        EXPECT_EQ(j[i]["n_ctx"], 256);
    }
    const auto run = [&](int n_tokens) {
        return std::thread([&, n_tokens] {
            auto c2 = s.client();
            post(c2, "/v1/completions",
                 {{"prompt", "Once upon a time"},
                  {"max_tokens", n_tokens},
                  {"temperature", 0.5},
                  {"seed", 3},
                  {"stop", "never"}});
        });
    };
    std::thread first = run(60);
    json busy;
    for (int i = 0; i < 200 && busy.is_null(); ++i) {
        for (const json &slot : slots())
            if (slot["is_processing"] == true && slot["next_token"]["n_decoded"].get<int>() >= 3) busy = slot;
        if (busy.is_null()) std::this_thread::sleep_for(10ms);
    }
    ASSERT_FALSE(busy.is_null());
    EXPECT_EQ(busy["params"]["temperature"], 0.5);
    EXPECT_EQ(busy["params"]["seed"], 3);
    EXPECT_EQ(busy["params"]["n_predict"], 60);
    EXPECT_EQ(busy["next_token"]["has_next_token"], true);
    EXPECT_EQ(busy["next_token"]["n_remain"].get<int>() + busy["next_token"]["n_decoded"].get<int>(), 60);
    EXPECT_GT(busy["n_prompt_tokens"].get<int>(), 1);
    EXPECT_EQ(busy["n_prompt_tokens_processed"], busy["n_prompt_tokens"]);  // nothing was cached
    EXPECT_EQ(c.Get("/slots?fail_on_no_slot=1")->status, 200);              // one slot is free
    std::thread second = run(60);
    bool full = false;
    for (int i = 0; i < 200 && !full; ++i) {
        auto r = c.Get("/slots?fail_on_no_slot=1");
        ASSERT_TRUE(r);
        full = r->status == 503;
        if (full) {
            EXPECT_NE(r->body.find("no slot available"), std::string::npos) << r->body;
        } else {
            std::this_thread::sleep_for(10ms);
        }
    }
    EXPECT_TRUE(full);
    first.join();
    second.join();
    bool idle = false;
    for (int i = 0; i < 300 && !idle; ++i) {
        j = slots();
        idle = j.size() == 2 && j[0]["is_processing"] == false && j[1]["is_processing"] == false;
        if (!idle) std::this_thread::sleep_for(10ms);
    }
    EXPECT_TRUE(idle) << j.dump();
    EXPECT_EQ(j[0]["params"]["n_predict"], 60);  // the last request's, as llama-server keeps them

    ServerOptions off;
    off.slots = false;
    TestServer without(off);
    auto c3 = without.client();
    EXPECT_EQ(c3.Get("/slots")->status, 404);
}

// A non-streaming request whose client hangs up is cancelled: its slot is free for the next request at once.
TEST(ServerLimits, AClientThatHangsUpOnAPlainRequestFreesItsSlot) {
    ServerOptions o;
    o.n_parallel = 1;
    o.step_delay = std::chrono::milliseconds(20);
    TestServer s(o);
    {
        httplib::Client quitter("127.0.0.1", s.port());
        quitter.set_read_timeout(0, 300000);  // gives up after 0.3 s, mid-generation
        auto r = post(quitter, "/v1/completions", {{"prompt", "Once"}, {"max_tokens", 200}});
        EXPECT_FALSE(r);
    }
    auto c = s.client();
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_FALSE(completion_text(c, {{"prompt", "Once"}, {"max_tokens", 4}}).empty());
    // 200 tokens at 20 ms would hold the only slot for 4 s.
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

TEST_P(ServerTest, FailedStepEndsTheStreamWithAnErrorAndServingGoesOn) {
    std::atomic<int> fail_steps{0};
    ServerOptions o = opts();
    o.fail_steps = &fail_steps;
    TestServer s(o);
    auto c = s.client();
    fail_steps = 1;
    auto r =
        post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}, {"stream", true}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    bool done = false;
    auto events = parse_sse(r->body, &done);
    EXPECT_TRUE(done);
    ASSERT_FALSE(events.empty());
    ASSERT_TRUE(events.back().contains("error")) << r->body;
    EXPECT_NE(events.back()["error"]["message"].get<std::string>().find("worker 1"), std::string::npos);
    fail_steps = 1;
    r = post(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 8}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 500);
    EXPECT_NE(json::parse(r->body)["error"]["message"].get<std::string>().find("went away"),
              std::string::npos);
    std::string finish;
    EXPECT_FALSE(completion_text(c, {{"prompt", "Once upon a time"}, {"max_tokens", 8}}, &finish).empty());
    EXPECT_EQ(finish, "length");
}

// --max-resumes: a step fails mid-stream as if a node were lost (kind disconnected, injected around the real
// engine). The streams are started again with the tokens they sampled and replayed, and each goes on with
// exactly its undisturbed text: greedy with a frequency penalty, and seeded with a repeat penalty.
TEST_P(ServerTest, ResumedStreamsContinueWithTheUndisturbedText) {
    std::atomic<int> fail_steps{0};
    ServerOptions o = opts();
    o.fail_steps = &fail_steps;
    o.max_resumes = 2;
    o.step_delay = std::chrono::milliseconds(10);
    TestServer s(o);
    auto c = s.client();
    const std::vector<json> requests = {
        {{"prompt", "Once upon a time"}, {"max_tokens", 60}, {"temperature", 0}, {"frequency_penalty", 0.5}},
        {{"prompt", "The cat"},
         {"max_tokens", 60},
         {"temperature", 0.9},
         {"seed", 7},
         {"repeat_penalty", 1.3}}};
    expect_streams_continue(s, requests, [&] { fail_steps = 1; }, std::chrono::milliseconds(150));
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_GE(metric(m->body, "tandem_resumed_requests_total"), 1) << m->body;
}

// The KV pool (--ctx-size) is shared: an idle server gives one request 3,000 positions of a 4,096 pool, and
// 8 requests share it at once, each with the text it gets alone.
TEST_P(ServerTest, TheKvPoolServesOneLongRequestOrManyShortOnes) {
    ServerOptions o = opts();
    o.n_parallel = 8;
    o.kv_pool = 4096;
    o.n_ctx_slot = 4096;
    TestServer s(o);
    auto c = s.client();
    auto t = post(c, "/tokenize", {{"content", "Once upon a time there was a little girl named Lily. "}});
    ASSERT_TRUE(t);
    const std::vector<int32_t> sentence = json::parse(t->body)["tokens"];
    std::vector<int32_t> long_prompt;
    while (long_prompt.size() < 3000) long_prompt.push_back(sentence[long_prompt.size() % sentence.size()]);
    auto r = post(c, "/v1/completions", {{"prompt", long_prompt}, {"max_tokens", 8}, {"temperature", 0}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["usage"]["prompt_tokens"], 3000);

    std::vector<json> requests;
    std::vector<std::string> solo;
    for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> p(300 + 10 * i);
        for (size_t k = 0; k < p.size(); ++k) p[k] = sentence[(k + i) % sentence.size()];
        requests.push_back({{"prompt", p}, {"max_tokens", 100}, {"temperature", 0}});
        solo.push_back(completion_text(c, requests.back()));
    }
    const Streamed st = streams_through(s, requests, [] {});
    for (size_t i = 0; i < requests.size(); ++i) {
        bool done = false;
        EXPECT_EQ(stream_text(parse_sse(st.bodies[i], &done)), solo[i]) << i;
        EXPECT_TRUE(done);
    }
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_EQ(metric(m->body, "tandem_kv_pool_positions"), 4096);
    EXPECT_EQ(metric(m->body, "tandem_preemptions_total"), 0) << "8 x 400 positions fit the pool";
    // A prompt longer than the whole pool is refused at once.
    std::vector<int32_t> too_long(4096, sentence[0]);
    r = post(c, "/v1/completions", {{"prompt", too_long}, {"max_tokens", 1}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
}

// Four requests that need more than the pool together: the newest is preempted when it runs out and replayed
// when there is room, so every request ends, and with the text it gets alone (greedy and seeded). No hang.
TEST_P(ServerTest, AFullKvPoolPreemptsTheNewestAndNoTextChanges) {
    ServerOptions o = opts();
    o.n_parallel = 4;
    o.kv_pool = 400;
    o.n_ctx_slot = 400;
    o.step_delay = std::chrono::milliseconds(3);  // the four streams overlap for certain
    TestServer s(o);
    auto c = s.client();
    const std::vector<json> requests = {
        {{"prompt", "Once upon a time"}, {"max_tokens", 180}, {"temperature", 0}},
        {{"prompt", "The cat"}, {"max_tokens", 180}, {"temperature", 0}},
        {{"prompt", "Lily and Ben"}, {"max_tokens", 180}, {"temperature", 0.8}, {"seed", 5}},
        {{"prompt", "One day"}, {"max_tokens", 180}, {"temperature", 0}}};
    std::vector<std::string> solo, solo_finish(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) solo.push_back(completion_text(c, requests[i], &solo_finish[i]));
    const auto t0 = std::chrono::steady_clock::now();
    const Streamed st = streams_through(s, requests, [] {});
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
    for (size_t i = 0; i < requests.size(); ++i) {
        SCOPED_TRACE(requests[i].dump());
        bool done = false;
        std::string finish;
        EXPECT_EQ(stream_text(parse_sse(st.bodies[i], &done), &finish), solo[i]);
        EXPECT_EQ(finish, solo_finish[i]);
        EXPECT_TRUE(done);
    }
    auto m = c.Get("/metrics");
    ASSERT_TRUE(m);
    EXPECT_GE(metric(m->body, "tandem_preemptions_total"), 1) << m->body;
    EXPECT_LE(metric(m->body, "tandem_kv_pool_used"), 400)
        << m->body;  // the slots' prompt caches, within the pool
}

// The server's tokens for `text` (empty when /tokenize fails).
std::vector<int32_t> tokens_of(httplib::Client &c, const std::string &text) {
    auto t = post(c, "/tokenize", {{"content", text}});
    if (!t || t->status != 200) return {};
    return json::parse(t->body)["tokens"].get<std::vector<int32_t>>();
}

// `tokens` over and over, n in all (empty when tokens is).
std::vector<int32_t> repeated(const std::vector<int32_t> &tokens, size_t n) {
    std::vector<int32_t> out;
    while (!tokens.empty() && out.size() < n) out.push_back(tokens[out.size() % tokens.size()]);
    return out;
}

// The prefix cache: a request whose prompt starts with what a free slot computed last reuses it, computes
// only the rest (usage.prompt_tokens_details.cached_tokens, /metrics), and gets exactly the text it gets
// without.
TEST_P(ServerTest, APrefixCacheHitComputesOnlyTheNewTokensAndChangesNothing) {
    ServerOptions o = opts();
    o.n_ctx_slot = 2048;
    TestServer s(o);
    auto c = s.client();
    const std::vector<int32_t> sentence =
        tokens_of(c, "Once upon a time there was a little girl named Lily. She liked to play. ");
    ASSERT_FALSE(sentence.empty());
    const std::vector<int32_t> prefix = repeated(sentence, 1000);
    std::vector<int32_t> longer = prefix;
    for (int i = 0; i < 40; ++i) longer.push_back(sentence[(i * 7) % sentence.size()]);
    const auto complete = [&](const std::vector<int32_t> &prompt, bool cache, int *cached) {
        auto r = post(c, "/v1/completions",
                      {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"cache_prompt", cache}});
        EXPECT_TRUE(r);
        if (!r) return std::string();
        EXPECT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        *cached = j["usage"]["prompt_tokens_details"]["cached_tokens"];
        return j["choices"][0]["text"].get<std::string>();
    };
    int cached = -1;
    const std::string without = complete(longer, false, &cached);
    EXPECT_EQ(cached, 0);
    complete(prefix, true, &cached);
    auto m0 = c.Get("/metrics");
    ASSERT_TRUE(m0);
    const std::string with = complete(longer, true, &cached);
    EXPECT_GE(cached, 1000);
    EXPECT_EQ(with, without);
    auto m1 = c.Get("/metrics");
    ASSERT_TRUE(m1);
    // Only the new tokens were computed.
    EXPECT_EQ(metric(m1->body, "tandem_prompt_tokens_total") - metric(m0->body, "tandem_prompt_tokens_total"),
              static_cast<int64_t>(longer.size()) - cached);
    EXPECT_GE(metric(m1->body, "tandem_prompt_tokens_cached_total"), cached);
}

// The choices of one request share its prompt: the first computes it, the others wait for it, copy its
// positions into their own slots and compute only the last prompt token (whose row gives their first token).
// Each choice still gets exactly the text its seed gets alone, on every engine.
TEST_P(ServerTest, NChoicesComputeTheirSharedPromptOnce) {
    ServerOptions o = opts();
    o.n_ctx_slot = 1024;
    TestServer s(o);
    auto c = s.client();
    const std::vector<int32_t> prompt =
        repeated(tokens_of(c, "Once upon a time there was a little dog named Max. He liked to run. "), 700);
    ASSERT_EQ(prompt.size(), 700u);
    const json one = {{"prompt", prompt}, {"max_tokens", 10}, {"temperature", 1.0},   {"top_k", 0},
                      {"top_p", 1.0},     {"min_p", 0.0},     {"cache_prompt", false}};
    std::vector<std::string> alone;
    int32_t n_generated = 0;
    for (int i = 0; i < 4; ++i) {  // computed from scratch, and cached nowhere
        json req = one;
        req["seed"] = 30 + i;
        auto r = post(c, "/v1/completions", req);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        alone.push_back(j["choices"][0]["text"]);
        n_generated += j["usage"]["completion_tokens"].get<int32_t>();
    }
    EXPECT_NE(alone[0], alone[1]);
    auto m0 = c.Get("/metrics");
    ASSERT_TRUE(m0);
    json req = one;
    req["seed"] = 30;
    req["n"] = 4;
    req["cache_prompt"] = true;
    auto r = post(c, "/v1/completions", req);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    ASSERT_EQ(j["choices"].size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["text"], alone[i]) << "choice " << i;
    EXPECT_EQ(j["usage"]["completion_tokens"], n_generated);
    auto m1 = c.Get("/metrics");
    ASSERT_TRUE(m1);
    const int64_t n = static_cast<int64_t>(prompt.size());
    EXPECT_EQ(metric(m1->body, "tandem_prompt_tokens_total") - metric(m0->body, "tandem_prompt_tokens_total"),
              n + 3)
        << m1->body;
    EXPECT_EQ(metric(m1->body, "tandem_prompt_tokens_copied_total") -
                  metric(m0->body, "tandem_prompt_tokens_copied_total"),
              3 * (n - 1));
}

// A 10-turn chat computes each turn's new tokens only: every turn finds the conversation so far in the cache.
TEST_P(ServerTest, ATenTurnChatComputesOnlyEachTurnsNewTokens) {
    ServerOptions o = opts();
    o.n_ctx_slot = 2048;
    TestServer s(o);
    auto c = s.client();
    json messages = json::array({{{"role", "system"}, {"content", "You tell short stories to children."}}});
    int64_t previous_prompt = 0;
    for (int turn = 0; turn < 10; ++turn) {
        SCOPED_TRACE(turn);
        messages.push_back({{"role", "user"}, {"content", fmt::format("Tell me about day {}.", turn + 1)}});
        auto m0 = c.Get("/metrics");
        auto r =
            post(c, "/v1/chat/completions", {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}});
        auto m1 = c.Get("/metrics");
        ASSERT_TRUE(r && m0 && m1);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        const int64_t prompt = j["usage"]["prompt_tokens"];
        const int64_t cached = j["usage"]["prompt_tokens_details"]["cached_tokens"];
        if (turn > 0) {
            EXPECT_GE(cached, previous_prompt);  // the whole conversation before this turn
        }
        EXPECT_EQ(
            metric(m1->body, "tandem_prompt_tokens_total") - metric(m0->body, "tandem_prompt_tokens_total"),
            prompt - cached);
        previous_prompt = prompt;
        messages.push_back({{"role", "assistant"}, {"content", j["choices"][0]["message"]["content"]}});
    }
}

// Structured output: a JSON schema of required string, integer, enum and array fields. The schema the tests
// hold the replies to, written out (nlohmann checks; the server never sees this).
const json k_story_schema = json::parse(R"({"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 24},
    "year": {"type": "integer"},
    "mood": {"enum": ["happy", "sad", "scary"]},
    "characters": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 1, "maxItems": 3}},
  "required": ["title", "year", "mood", "characters"], "additionalProperties": false})");

void expect_story(const std::string &text) {
    const json j = json::parse(text, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << text;
    ASSERT_TRUE(j.is_object()) << text;
    EXPECT_EQ(j.size(), 4u) << text;
    ASSERT_TRUE(j.contains("title") && j["title"].is_string()) << text;
    const std::string title = j["title"];
    EXPECT_LE(std::count_if(title.begin(), title.end(), [](char ch) { return (ch & 0xc0) != 0x80; }), 24)
        << text;
    EXPECT_TRUE(j.contains("year") && j["year"].is_number_integer()) << text;
    ASSERT_TRUE(j.contains("mood")) << text;
    EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad" || j["mood"] == "scary") << text;
    ASSERT_TRUE(j.contains("characters") && j["characters"].is_array()) << text;
    EXPECT_GE(j["characters"].size(), 1u) << text;
    EXPECT_LE(j["characters"].size(), 3u) << text;
    for (const json &c : j["characters"]) EXPECT_TRUE(c.is_string()) << text;
}

json story_request(uint64_t seed) {
    return {{"messages", {{{"role", "user"}, {"content", "Write a story as JSON."}}}},
            {"max_tokens", 400},
            {"temperature", 0.9},
            {"seed", seed},
            {"response_format",
             {{"type", "json_schema"}, {"json_schema", {{"name", "story"}, {"schema", k_story_schema}}}}}};
}

// 100 of 100 seeded requests with the schema return JSON that parses and validates, ending with "stop".
TEST(StructuredOutput, AHundredSeededRequestsAllValidate) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    ServerOptions o;
    o.n_parallel = 4;
    o.n_ctx_slot = 512;
    TestServer s(o);
    std::vector<std::thread> threads;
    std::atomic<int> valid{0};
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            auto c = s.client();
            for (int i = t; i < 100; i += 4) {
                auto r = post(c, "/v1/chat/completions", story_request(static_cast<uint64_t>(i)));
                ASSERT_TRUE(r);
                ASSERT_EQ(r->status, 200) << r->body;
                const json j = json::parse(r->body);
                EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
                const std::string text = j["choices"][0]["message"]["content"];
                const int before = ::testing::Test::HasFailure() ? 1 : 0;
                expect_story(text);
                if (!before && !::testing::Test::HasFailure()) valid++;
            }
        });
    for (auto &t : threads) t.join();
    EXPECT_EQ(valid.load(), 100);
    // json_object: any JSON object. Its strings and keys have no bound, so a small model may not close it
    // within max_tokens: then what it wrote is the start of one (the matcher takes it); when it ends, it
    // parses.
    auto c = s.client();
    for (uint64_t seed : {3u, 4u, 5u}) {
        auto r = post(c, "/v1/completions",
                      {{"prompt", "Once upon a time"},
                       {"max_tokens", 300},
                       {"seed", seed},
                       {"response_format", {{"type", "json_object"}}}});
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        const std::string text = j["choices"][0]["text"];
        if (j["choices"][0]["finish_reason"] == "stop") {
            EXPECT_TRUE(json::parse(text, nullptr, false).is_object()) << text;
        } else {
            JsonMatcher m(JsonSchema::any_object());
            EXPECT_TRUE(m.feed(text)) << text;
        }
    }
    // What tandem does not take is a 400 naming it.
    json bad = story_request(1);
    bad["response_format"]["json_schema"]["schema"]["properties"]["characters"]["uniqueItems"] = true;
    auto r = post(c, "/v1/chat/completions", bad);
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400);
    EXPECT_NE(r->body.find("'uniqueItems' (the schema.characters) is not supported"), std::string::npos)
        << r->body;
}

// A schema beyond the matcher's subset, as OpenAI's SDK sends a Pydantic model: $defs and $ref, an Optional
// field (anyOf with null), a pattern, a date, an integer range; its properties in an order that is not
// alphabetical.
const char *k_hero_schema = R"({
  "$defs": {"Person": {"type": "object", "title": "Person", "properties": {
      "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
      "age": {"anyOf": [{"type": "integer", "minimum": 1, "maximum": 120}, {"type": "null"}], "default": null}},
    "required": ["name", "age"], "additionalProperties": false}},
  "title": "Tale", "type": "object",
  "properties": {"title": {"type": "string", "maxLength": 24}, "hero": {"$ref": "#/$defs/Person"},
                 "friends": {"type": "array", "items": {"$ref": "#/$defs/Person"}, "maxItems": 2},
                 "day": {"type": "string", "format": "date"}},
  "required": ["title", "hero", "friends", "day"], "additionalProperties": false})";

void expect_person(const nlohmann::ordered_json &p, const std::string &text) {
    ASSERT_TRUE(p.is_object() && p.size() == 2) << text;
    const std::string name = p.value("name", "");
    EXPECT_TRUE(name.size() >= 2 && name.size() <= 9 && name[0] >= 'A' && name[0] <= 'Z' &&
                std::all_of(name.begin() + 1, name.end(), [](char ch) { return ch >= 'a' && ch <= 'z'; }))
        << text;
    const auto &age = p["age"];
    EXPECT_TRUE(age.is_null() || (age.is_number_integer() && age.get<int>() >= 1 && age.get<int>() <= 120))
        << text;
}

void expect_hero(const std::string &text) {
    const auto doc = nlohmann::ordered_json::parse(text, nullptr, false);
    ASSERT_TRUE(doc.is_object()) << text;
    std::vector<std::string> keys;
    for (const auto &item : doc.items()) keys.push_back(item.key());
    ASSERT_EQ(keys, (std::vector<std::string>{"title", "hero", "friends", "day"})) << text;
    EXPECT_TRUE(doc["title"].is_string()) << text;
    expect_person(doc["hero"], text);
    ASSERT_TRUE(doc["friends"].is_array() && doc["friends"].size() <= 2) << text;
    for (const auto &f : doc["friends"]) expect_person(f, text);
    const std::string day = doc["day"].is_string() ? doc["day"].get<std::string>() : "";
    EXPECT_TRUE(day.size() == 10 && day[4] == '-' && day[7] == '-' &&
                std::isdigit(static_cast<unsigned char>(day[0])) && (day[5] == '0' || day[5] == '1'))
        << text;
}

// The body as text: json would sort the schema's keys, and the order is what is tested.
std::string hero_body(const char *fields, uint64_t seed) {
    return fmt::format(R"({{"max_tokens": 400, "temperature": 1.0, "seed": {}, {}}})", seed, fields);
}

// Such a schema becomes a grammar: every reply validates, with its properties in the schema's order, through
// OpenAI's response_format, vLLM's guided_json, llama-server's json_schema, Ollama's format and `tandem run
// -j`, which prints the server's text for the same seed.
TEST(StructuredOutput, SchemasBeyondTheSubsetKeepTheSchemasOrder) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    ServerOptions o;
    o.n_parallel = 4;
    o.n_ctx_slot = 512;
    TestServer s(o);
    auto c = s.client();
    const auto text_of = [&](const std::string &path, const std::string &body) -> std::string {
        auto r = c.Post(path.c_str(), body, "application/json");
        if (!r) return "no reply";
        EXPECT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body, nullptr, false);
        if (path == "/completion") return j.value("content", "");
        if (path == "/api/chat") return j["message"].value("content", "");
        if (path == "/v1/completions") return j["choices"][0].value("text", "");
        EXPECT_EQ(j["choices"][0]["finish_reason"], "stop") << r->body;
        return j["choices"][0]["message"].value("content", "");
    };
    std::set<std::string> distinct;
    for (uint64_t seed = 0; seed < 8; ++seed) {
        const std::string text =
            text_of("/v1/chat/completions",
                    hero_body(fmt::format(R"("messages": [{{"role": "user", "content": "A tale as JSON."}}],
                "response_format": {{"type": "json_schema", "json_schema": {{"name": "tale", "schema": {}}}}})",
                                          k_hero_schema)
                                  .c_str(),
                              seed));
        expect_hero(text);
        distinct.insert(text);
    }
    EXPECT_GE(distinct.size(), 4u);
    expect_hero(text_of(
        "/v1/completions",
        hero_body(fmt::format(R"("prompt": "Once upon a time", "guided_json": {})", k_hero_schema).c_str(),
                  1)));
    const std::string llama = text_of(
        "/completion",
        fmt::format(R"({{"prompt": "Once upon a time", "n_predict": 400, "seed": 2, "json_schema": {}}})",
                    k_hero_schema));
    expect_hero(llama);
    expect_hero(text_of("/api/chat", fmt::format(R"({{"messages": [{{"role": "user", "content": "JSON"}}],
        "stream": false, "format": {}, "options": {{"seed": 3}}}})",
                                                 k_hero_schema)));
    test::ProcessResult run =
        test::run_tandem({"run", "-m", test::shared_path(k_model), "-p", "Once upon a time", "-n", "400",
                          "-s", "2", "-j", k_hero_schema});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.out, llama + "\n");
}

// A sentence the grammar ends: one of two words, a comma, 3..30 letters or spaces, a full stop.
const char *k_answer_grammar = R"(root ::= ("yes" | "no") ", " [a-z ]{3,30} ".")";
// std::regex would check these, but its code trips GCC 12's -Wmaybe-uninitialized in the sanitizer build.
bool is_lower_or_space(char ch) {
    return (ch >= 'a' && ch <= 'z') || ch == ' ';
}
// ^(yes|no), [a-z ]{3,30}\.$
bool is_answer(const std::string &t) {
    const size_t from = t.starts_with("yes, ") ? 5 : t.starts_with("no, ") ? 4 : 0;
    if (from == 0 || t.size() < from + 4 || t.size() > from + 31 || t.back() != '.') return false;
    return std::all_of(t.begin() + static_cast<std::ptrdiff_t>(from), t.end() - 1, is_lower_or_space);
}
// ^[a-z]+( [a-z]+)*$, or with prefix a start of one (a space may end it).
bool is_words(const std::string &t, bool prefix) {
    if (t.empty() || t[0] == ' ' || !std::all_of(t.begin(), t.end(), is_lower_or_space) ||
        t.find("  ") != std::string::npos)
        return false;
    return prefix || t.back() != ' ';
}
// \d{3}-[a-z]{2,5}
bool is_code(const std::string &t) {
    if (t.size() < 6 || t.size() > 9 || t[3] != '-') return false;
    return std::all_of(t.begin(), t.begin() + 3, [](char ch) { return ch >= '0' && ch <= '9'; }) &&
           std::all_of(t.begin() + 4, t.end(), [](char ch) { return ch >= 'a' && ch <= 'z'; });
}

// The same seed gives the same document on one machine and through a pipeline (f32 wire: the same logits),
// streamed or not; and through Ollama's format; and the same sentence of a grammar. Over --tp 2 the partial
// sums are added in another order, so a seeded draw that falls near a boundary between two tokens may go the
// other way (docs/architecture.md): there each document is valid and the stream is the whole answer.
TEST_P(ServerTest, StructuredOutputIsTheSameOnEveryEngine) {
    const bool same_logits = GetParam() != Backend::tp;
    ServerOptions o = opts();
    o.n_ctx_slot = 512;
    TestServer s(o);
    ServerOptions local;
    local.n_ctx_slot = 512;
    TestServer one_machine(local);  // the reference documents
    auto c = s.client();
    auto ref = one_machine.client();
    for (uint64_t seed : {11u, 12u, 13u}) {
        SCOPED_TRACE(seed);
        auto r = post(c, "/v1/chat/completions", story_request(seed));
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const std::string text = json::parse(r->body)["choices"][0]["message"]["content"];
        expect_story(text);
        auto rr = post(ref, "/v1/chat/completions", story_request(seed));
        ASSERT_TRUE(rr);
        if (same_logits) {
            EXPECT_EQ(text, json::parse(rr->body)["choices"][0]["message"]["content"].get<std::string>());
        }
        const Streamed st = streams_through(
            s, {story_request(seed)}, [] {}, {}, "/v1/chat/completions");
        bool done = false;
        EXPECT_EQ(stream_text(parse_sse(st.bodies[0], &done)), text);
    }
    auto r = post(c, "/api/chat",
                  {{"messages", {{{"role", "user"}, {"content", "JSON please"}}}},
                   {"stream", false},
                   {"format", k_story_schema},
                   {"options", {{"seed", 5}}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    expect_story(json::parse(r->body)["message"]["content"]);
    const json answer = {
        {"prompt", "Once upon a time"}, {"n_predict", 60}, {"seed", 3}, {"grammar", k_answer_grammar}};
    auto g = post(c, "/completion", answer);
    auto gref = post(ref, "/completion", answer);
    ASSERT_TRUE(g && gref);
    ASSERT_EQ(g->status, 200) << g->body;
    const std::string sentence = json::parse(g->body)["content"];
    EXPECT_TRUE(is_answer(sentence)) << sentence;
    if (same_logits) {
        EXPECT_EQ(sentence, json::parse(gref->body)["content"].get<std::string>());
    }
}

// llama-server's "grammar" (GBNF): every seeded reply is a sentence of it, on /completion and the OpenAI
// endpoints, streamed or not; a sentence that may go on ends where the model draws its end of text; bad
// grammars and conflicting fields are 400s that say why.
TEST(GrammarOutput, RepliesAreSentencesOfTheGrammar) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    ServerOptions o;
    o.n_parallel = 4;
    o.n_ctx_slot = 256;
    TestServer s(o);
    auto c = s.client();
    // A yes-or-no answer at temperature 1, as /completion takes it.
    auto answer = [](uint64_t seed) -> json {
        return {{"prompt", "Once upon a time"},
                {"n_predict", 100},
                {"seed", seed},
                {"temperature", 1.0},
                {"grammar", k_answer_grammar}};
    };
    std::set<std::string> distinct;
    for (uint64_t seed = 0; seed < 12; ++seed) {
        auto r = post(c, "/completion", answer(seed));
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        const std::string text = j["content"];
        EXPECT_TRUE(is_answer(text)) << text;
        EXPECT_EQ(j["stop_type"], "eos") << r->body;  // the sentence closed: nothing may follow it
        distinct.insert(text);
    }
    EXPECT_GE(distinct.size(), 6u);  // the model chose, not the mask alone
    // Words and spaces that may stop anywhere: where the reply ends the model drew its end of text (or the
    // limit cut a sentence, then what came is the start of one).
    for (uint64_t seed = 0; seed < 8; ++seed) {
        auto r = post(c, "/v1/completions",
                      {{"prompt", "Once upon a time"},
                       {"max_tokens", 24},
                       {"seed", seed},
                       {"grammar", R"(root ::= [a-z]+ (" " [a-z]+)*)"}});
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        const std::string text = j["choices"][0]["text"];
        if (j["choices"][0]["finish_reason"] == "stop") {
            EXPECT_TRUE(is_words(text, false)) << text;
        } else {
            EXPECT_TRUE(is_words(text, true)) << text;
        }
    }
    // Chat, streamed and not: the same text, a sentence of the grammar.
    const json chat = {{"messages", {{{"role", "user"}, {"content", "Answer me."}}}},
                       {"max_tokens", 100},
                       {"seed", 7},
                       {"grammar", k_answer_grammar}};
    auto r = post(c, "/v1/chat/completions", chat);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string text = json::parse(r->body)["choices"][0]["message"]["content"];
    EXPECT_TRUE(is_answer(text)) << text;
    const Streamed st = streams_through(
        s, {chat}, [] {}, {}, "/v1/chat/completions");
    bool done = false;
    EXPECT_EQ(stream_text(parse_sse(st.bodies[0], &done)), text);
    // Errors.
    const std::pair<json, std::string> bad[] = {
        {{{"prompt", "x"}, {"grammar", "root ::= root \"a\""}}, "left recursion in rule 'root'"},
        {{{"prompt", "x"}, {"grammar", "root ::= name"}}, "rule 'name' is used but not defined"},
        {{{"prompt", "x"}, {"grammar", 5}}, "'grammar' must be a string"},
        {{{"prompt", "x"}, {"grammar", k_answer_grammar}, {"response_format", {{"type", "json_object"}}}},
         "give 'response_format' or 'grammar', not both"},
        {{{"prompt", "x"}, {"grammar", k_answer_grammar}, {"json_schema", json::object()}},
         "give 'grammar' or 'json_schema', not both"},
    };
    for (const auto &[body, message] : bad) {
        auto e = post(c, "/completion", body);
        ASSERT_TRUE(e);
        EXPECT_EQ(e->status, 400) << body.dump();
        EXPECT_NE(e->body.find(message), std::string::npos) << e->body;
    }
    // `tandem run --grammar` and `--json-schema` draw the server's text for the same seed.
    for (uint64_t seed : {0u, 5u}) {
        auto r = post(c, "/completion", answer(seed));
        ASSERT_TRUE(r);
        test::ProcessResult run =
            test::run_tandem({"run", "-m", test::shared_path(k_model), "-p", "Once upon a time", "-n", "100",
                              "-s", std::to_string(seed), "--temp", "1.0", "--grammar", k_answer_grammar});
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(run.out, json::parse(r->body)["content"].get<std::string>() + "\n");
        const std::string schema =
            R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
            "required": ["name"]})";
        r = post(c, "/completion",
                 {{"prompt", "Once upon a time"},
                  {"n_predict", 100},
                  {"seed", seed},
                  {"json_schema", json::parse(schema)}});
        ASSERT_TRUE(r);
        run = test::run_tandem({"run", "-m", test::shared_path(k_model), "-p", "Once upon a time", "-n",
                                "100", "-s", std::to_string(seed), "-j", schema});
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(run.out, json::parse(r->body)["content"].get<std::string>() + "\n");
        EXPECT_TRUE(json::parse(run.out, nullptr, false).is_object()) << run.out;
    }
    test::ProcessResult both = test::run_tandem(
        {"run", "-m", test::shared_path(k_model), "--grammar", k_answer_grammar, "-j", "{}"});
    EXPECT_NE(both.exit_code, 0);
    EXPECT_NE(both.err.find("give one of --grammar, --grammar-file and --json-schema"), std::string::npos)
        << both.err;
    test::ProcessResult broken =
        test::run_tandem({"run", "-m", test::shared_path(k_model), "--grammar", "root ::= ["});
    EXPECT_NE(broken.exit_code, 0);
    EXPECT_NE(broken.err.find("unterminated character class"), std::string::npos) << broken.err;
    // An empty grammar is none (as llama-server takes it).
    auto none = post(c, "/completion", {{"prompt", "Once upon a time"}, {"n_predict", 8}, {"grammar", ""}});
    ASSERT_TRUE(none);
    EXPECT_EQ(none->status, 200) << none->body;
}

// llama-server's further filters (typical_p, top_n_sigma, XTC, dynamic temperature) on both completion
// endpoints draw what `tandem run` draws with llama.cpp's flags for them, for the same seed; they change the
// text; bad values are refused naming the field; /completion echoes them in its generation_settings. On one
// machine, a pipeline and --tp 2 (the fields travel to the sampling node).
TEST_P(ServerTest, LlamaServersFiltersDrawWhatTandemRunDraws) {
    ServerOptions o = opts();
    o.n_ctx_slot = 256;
    TestServer s(o);
    auto c = s.client();
    const json filters = {{"typical_p", 0.8},      {"top_n_sigma", 1.5},    {"xtc_probability", 0.5},
                          {"xtc_threshold", 0.05}, {"dynatemp_range", 0.6}, {"dynatemp_exponent", 1.5}};
    for (uint64_t seed : {3u, 8u}) {
        json body = {{"prompt", "Once upon a time"}, {"n_predict", 48}, {"seed", seed}, {"temperature", 1.0}};
        auto plain = post(c, "/completion", body);
        ASSERT_TRUE(plain);
        ASSERT_EQ(plain->status, 200) << plain->body;
        body.update(filters);
        auto r = post(c, "/completion", body);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        test::ProcessResult run = test::run_tandem({"run",
                                                    "-m",
                                                    test::shared_path(k_model),
                                                    "-p",
                                                    "Once upon a time",
                                                    "-n",
                                                    "48",
                                                    "-s",
                                                    std::to_string(seed),
                                                    "--temp",
                                                    "1.0",
                                                    "--typical",
                                                    "0.8",
                                                    "--top-nsigma",
                                                    "1.5",
                                                    "--xtc-probability",
                                                    "0.5",
                                                    "--xtc-threshold",
                                                    "0.05",
                                                    "--dynatemp-range",
                                                    "0.6",
                                                    "--dynatemp-exp",
                                                    "1.5"});
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(run.out, j["content"].get<std::string>() + "\n");
        EXPECT_NE(j["content"], json::parse(plain->body)["content"]) << "seed " << seed;
        body["dynatemp_range"] = 0;  // the dynamic temperature alone moves the text too
        auto fixed = post(c, "/completion", body);
        ASSERT_TRUE(fixed);
        ASSERT_EQ(fixed->status, 200) << fixed->body;
        EXPECT_NE(j["content"], json::parse(fixed->body)["content"]) << "seed " << seed;
        const json &settings = j["generation_settings"];
        EXPECT_FLOAT_EQ(settings["typical_p"].get<float>(), 0.8f);
        EXPECT_FLOAT_EQ(settings["top_n_sigma"].get<float>(), 1.5f);
        EXPECT_FLOAT_EQ(settings["xtc_probability"].get<float>(), 0.5f);
        EXPECT_FLOAT_EQ(settings["xtc_threshold"].get<float>(), 0.05f);
        EXPECT_FLOAT_EQ(settings["dynatemp_range"].get<float>(), 0.6f);
        EXPECT_FLOAT_EQ(settings["dynatemp_exponent"].get<float>(), 1.5f);
        // The OpenAI endpoint takes the same fields (as llama-server's does).
        json oai = {{"prompt", "Once upon a time"}, {"max_tokens", 48}, {"seed", seed}, {"temperature", 1.0}};
        oai.update(filters);
        auto v1 = post(c, "/v1/completions", oai);
        ASSERT_TRUE(v1);
        ASSERT_EQ(v1->status, 200) << v1->body;
        EXPECT_EQ(json::parse(v1->body)["choices"][0]["text"], j["content"]);
    }
    for (const auto &[key, value] : std::vector<std::pair<std::string, json>>{{"typical_p", 1.5},
                                                                              {"xtc_probability", -1},
                                                                              {"xtc_threshold", "high"},
                                                                              {"top_n_sigma", "x"},
                                                                              {"dynatemp_range", -0.5},
                                                                              {"dynatemp_exponent", -1}}) {
        auto e = post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {key, value}});
        ASSERT_TRUE(e);
        EXPECT_EQ(e->status, 400) << key;
        EXPECT_NE(e->body.find(key), std::string::npos) << e->body;
    }
    test::ProcessResult bad = test::run_tandem({"run", "-m", test::shared_path(k_model), "--typical", "2"});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("typical_p must be in [0, 1]"), std::string::npos) << bad.err;
}

// Mirostat (llama-server's mirostat, mirostat_tau, mirostat_eta; Ollama's options of the same names) draws
// what `tandem run --mirostat` draws for the same seed, on every engine; it changes the text; it replaces the
// penalties, so Ollama's defaults (repeat_penalty 1.1, top_k 40, ...) leave its draws alone; bad values are
// refused naming the field; /completion echoes it.
TEST_P(ServerTest, MirostatDrawsWhatTandemRunDraws) {
    ServerOptions o = opts();
    o.n_ctx_slot = 256;
    TestServer s(o);
    auto c = s.client();
    for (int version : {1, 2}) {
        const uint64_t seed = 4;
        json body = {{"prompt", "Once upon a time"},
                     {"n_predict", 40},
                     {"seed", seed},
                     {"temperature", 1.0},
                     {"top_k", 0},
                     {"top_p", 1.0},
                     {"min_p", 0.0}};
        auto plain = post(c, "/completion", body);
        ASSERT_TRUE(plain);
        ASSERT_EQ(plain->status, 200) << plain->body;
        // A low tau: stories260K is sure of most tokens, so the truncation must bite to change the text.
        body.update({{"mirostat", version}, {"mirostat_tau", 1.5}, {"mirostat_eta", 0.2}});
        auto r = post(c, "/completion", body);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        test::ProcessResult run =
            test::run_tandem({"run", "-m", test::shared_path(k_model), "-p", "Once upon a time", "-n", "40",
                              "-s", std::to_string(seed), "--temp", "1.0", "--mirostat",
                              std::to_string(version), "--mirostat-ent", "1.5", "--mirostat-lr", "0.2"});
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(run.out, j["content"].get<std::string>() + "\n") << "mirostat " << version;
        EXPECT_NE(j["content"], json::parse(plain->body)["content"]) << "mirostat " << version;
        const json &settings = j["generation_settings"];
        EXPECT_EQ(settings["mirostat"], version);
        EXPECT_FLOAT_EQ(settings["mirostat_tau"].get<float>(), 1.5f);
        EXPECT_FLOAT_EQ(settings["mirostat_eta"].get<float>(), 0.2f);
        // Ollama's options, its default penalties and filters included: the same draws.
        auto ol = post(c, "/api/generate",
                       {{"prompt", "Once upon a time"},
                        {"raw", true},
                        {"stream", false},
                        {"options",
                         {{"seed", seed},
                          {"temperature", 1.0},
                          {"num_predict", 40},
                          {"mirostat", version},
                          {"mirostat_tau", 1.5},
                          {"mirostat_eta", 0.2}}}});
        ASSERT_TRUE(ol);
        ASSERT_EQ(ol->status, 200) << ol->body;
        EXPECT_EQ(json::parse(ol->body)["response"], j["content"]) << "mirostat " << version;
    }
    for (const auto &[key, value] : std::vector<std::pair<std::string, json>>{
             {"mirostat", 3}, {"mirostat", 1.5}, {"mirostat_tau", -1}, {"mirostat_eta", "fast"}}) {
        auto e = post(c, "/v1/completions", {{"prompt", "x"}, {"max_tokens", 2}, {key, value}});
        ASSERT_TRUE(e);
        EXPECT_EQ(e->status, 400) << key;
        EXPECT_NE(e->body.find(key), std::string::npos) << e->body;
    }
    test::ProcessResult bad = test::run_tandem({"run", "-m", test::shared_path(k_model), "--mirostat", "4"});
    EXPECT_NE(bad.exit_code, 0);
    EXPECT_NE(bad.err.find("mirostat must be 0"), std::string::npos) << bad.err;
}

// llama-server's sampler sees the prompt before it draws (its repeat penalties and DRY read it), and so does
// tandem's, on every engine and in `tandem run`. Plain greedy's first token here is a token of the prompt;
// with a repeat penalty over the whole history that pushes every token seen below every token not seen,
// greedy draws another one, then no token of the prompt and none twice.
TEST_P(ServerTest, ThePenaltiesSeeThePromptAsLlamaServersDo) {
    TestServer s(opts());
    auto c = s.client();
    const std::string prompt =
        "Once upon a time, there was a little girl. Once upon a time, there was a little";
    const auto drawn = [&](const json &body, std::string *content) {
        std::vector<int32_t> ids;
        auto r = post(c, "/completion", body);
        EXPECT_TRUE(r && r->status == 200) << (r ? r->body : "no reply");
        if (!r || r->status != 200) return ids;
        const json j = json::parse(r->body);
        for (const json &p : j["completion_probabilities"]) ids.push_back(p["id"].get<int32_t>());
        if (content != nullptr) *content = j["content"].get<std::string>();
        return ids;
    };
    json body = {{"prompt", prompt}, {"n_predict", 12}, {"temperature", 0}, {"n_probs", 1}};
    const std::vector<int32_t> plain = drawn(body, nullptr);
    const std::vector<int32_t> prompt_tokens = tokens_of(c, prompt);
    ASSERT_FALSE(plain.empty());
    ASSERT_NE(std::find(prompt_tokens.begin(), prompt_tokens.end(), plain[0]), prompt_tokens.end())
        << "plain greedy's first token should be one of the prompt's for this test to tell";
    body["repeat_penalty"] = 1e6;
    body["repeat_last_n"] = -1;
    body["presence_penalty"] = 2.0;
    std::string content;
    const std::vector<int32_t> penalized = drawn(body, &content);
    ASSERT_EQ(penalized.size(), 12u) << content;
    EXPECT_NE(penalized[0], plain[0]);
    for (size_t i = 0; i < penalized.size(); ++i) {
        EXPECT_EQ(std::find(prompt_tokens.begin(), prompt_tokens.end(), penalized[i]), prompt_tokens.end())
            << "token " << i << " (" << penalized[i] << ") is the prompt's";
        EXPECT_EQ(std::find(penalized.begin(), penalized.begin() + std::ptrdiff_t(i), penalized[i]),
                  penalized.begin() + std::ptrdiff_t(i))
            << "token " << i << " (" << penalized[i] << ") was drawn before";
    }
    test::ProcessResult run =
        test::run_tandem({"run", "-m", test::shared_path(k_model), "-p", prompt, "-n", "12", "--temp", "0",
                          "--repeat-penalty", "1e6", "--repeat-last-n", "-1", "--presence-penalty", "2"});
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_EQ(run.out, content + "\n");
}

// DRY's breakers as token sequences, over llama's 32,000-token vocabulary: every token whose text holds a
// breaker is one by itself; every token whose text ends with a start of it heads the rest, tokenized; the
// limits are refused with a message.
TEST(DryBreakers, TokensThatHoldOrStartEachBreaker) {
    const std::string path = "vocab/ggml-vocab-llama-spm.gguf";
    if (!test::shared_exists(path)) GTEST_SKIP() << "missing " << path;
    auto file = gguf::File::open(test::shared_path(path));
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto vocab = Vocab::from_gguf(*file);
    ASSERT_TRUE(vocab.ok()) << vocab.status().message();
    auto made = Tokenizer::create(std::make_shared<const Vocab>(std::move(*vocab)));
    ASSERT_TRUE(made.ok()) << made.status().message();
    const Tokenizer &tok = **made;
    const int32_t n = tok.vocab().n_tokens();

    auto defaults = dry_breakers_for(tok, dry_default_breakers());
    ASSERT_TRUE(defaults.ok()) << defaults.status().message();
    std::set<int32_t> alone;
    for (const DryBreaker &b : *defaults) {
        EXPECT_TRUE(b.tail.empty()) << "a one-byte breaker is whole or absent in a token";
        alone.insert(b.head);
    }
    std::set<int32_t> want;
    for (int32_t id = 0; id < n; ++id) {
        const std::string &text = tok.token_to_piece(id, true);
        for (const std::string &b : dry_default_breakers())
            if (text.find(b) != std::string::npos) want.insert(id);
    }
    EXPECT_EQ(alone, want);
    EXPECT_TRUE(alone.count(13)) << "<0x0A>, the new line";
    EXPECT_GT(alone.size(), 20u);

    // A longer breaker: the tokens that hold it, and those ending with a start of it, each with the rest.
    const std::string breaker = "Question:";
    auto seqs = dry_breakers_for(tok, std::vector<std::string>{breaker});
    ASSERT_TRUE(seqs.ok()) << seqs.status().message();
    size_t partial = 0;
    for (const DryBreaker &b : *seqs) {
        const std::string &text = tok.token_to_piece(b.head, true);
        if (b.tail.empty()) {
            EXPECT_NE(text.find(breaker), std::string::npos) << text;
            continue;
        }
        ++partial;
        bool starts = false;  // some end of the text is a proper start of the breaker, and the tail the rest
        for (size_t have = 1; have < breaker.size() && have <= text.size(); ++have)
            if (text.compare(text.size() - have, have, breaker, 0, have) == 0 &&
                b.tail == tok.encode(breaker.substr(have), false, false))
                starts = true;
        EXPECT_TRUE(starts) << "token " << b.head << " '" << text << "'";
    }
    EXPECT_GT(partial, 10u);  // "Q", "Qu", "Question", ... and every token ending with them

    EXPECT_NE(dry_breakers_for(tok, std::vector<std::string>{""}).status().message().find("empty"),
              std::string::npos);
    EXPECT_FALSE(dry_breakers_for(tok, std::vector<std::string>(65, "x")).ok());
    auto letters = dry_breakers_for(tok, std::vector<std::string>{"e", "a", "o", "i", "n", "t", "s", "r"});
    ASSERT_FALSE(letters.ok());
    EXPECT_NE(letters.status().message().find("token sequences"), std::string::npos)
        << letters.status().message();
}

// DRY through both endpoints and `tandem run`: the same text for the same request; it changes greedy text
// that repeats; its fields are checked. On one machine, a pipeline and --tp 2.
TEST_P(ServerTest, DryDrawsWhatTandemRunDraws) {
    ServerOptions o = opts();
    o.n_ctx_slot = 256;
    TestServer s(o);
    auto c = s.client();
    json body = {{"prompt", "Once upon a time"}, {"n_predict", 64}, {"temperature", 0}};
    auto plain = post(c, "/completion", body);
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200) << plain->body;
    const std::string model = test::shared_path(k_model);
    for (const bool default_breakers : {true, false}) {
        SCOPED_TRACE(default_breakers ? "default breakers" : "the breaker '.'");
        json dry = body;
        dry.update({{"dry_multiplier", 2.0}, {"dry_allowed_length", 1}, {"dry_base", 1.5}});
        std::vector<std::string> args = {"run",
                                         "-m",
                                         model,
                                         "-p",
                                         "Once upon a time",
                                         "-n",
                                         "64",
                                         "--temp",
                                         "0",
                                         "--dry-multiplier",
                                         "2",
                                         "--dry-allowed-length",
                                         "1",
                                         "--dry-base",
                                         "1.5"};
        if (!default_breakers) {
            dry["dry_sequence_breakers"] = {"."};
            args.insert(args.end(), {"--dry-sequence-breaker", "."});
        }
        auto r = post(c, "/completion", dry);
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        EXPECT_NE(j["content"], json::parse(plain->body)["content"]);
        EXPECT_FLOAT_EQ(j["generation_settings"]["dry_multiplier"].get<float>(), 2.0f);
        EXPECT_EQ(j["generation_settings"]["dry_allowed_length"], 1);
        test::ProcessResult run = test::run_tandem(args);
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(run.out, j["content"].get<std::string>() + "\n");
        json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 8}};
        chat.update({{"dry_multiplier", 2.0}, {"dry_sequence_breakers", {"\n", "."}}});
        auto v1 = post(c, "/v1/chat/completions", chat);
        ASSERT_TRUE(v1);
        EXPECT_EQ(v1->status, 200) << v1->body;
    }
    for (const auto &[key, value] :
         std::vector<std::pair<std::string, json>>{{"dry_multiplier", -1},
                                                   {"dry_base", 0.5},
                                                   {"dry_allowed_length", -2},
                                                   {"dry_penalty_last_n", -5},
                                                   {"dry_sequence_breakers", json::array()},
                                                   {"dry_sequence_breakers", 3}}) {
        json bad = {{"prompt", "x"}, {"max_tokens", 2}, {"dry_multiplier", 1.0}};
        bad[key] = value;
        auto e = post(c, "/v1/completions", bad);
        ASSERT_TRUE(e);
        EXPECT_EQ(e->status, 400) << key << " " << value.dump();
        EXPECT_NE(e->body.find(key), std::string::npos) << e->body;
    }
    auto empty =
        post(c, "/v1/completions",
             {{"prompt", "x"}, {"max_tokens", 2}, {"dry_multiplier", 1.0}, {"dry_sequence_breakers", {""}}});
    ASSERT_TRUE(empty);
    EXPECT_EQ(empty->status, 400);
    EXPECT_NE(empty->body.find("a breaker is empty"), std::string::npos) << empty->body;
}

// vLLM's guided decoding fields: guided_choice, guided_regex, guided_json, guided_grammar and
// structured_outputs; one constraint per request.
TEST(GrammarOutput, VllmGuidedDecodingFields) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    ServerOptions o;
    o.n_ctx_slot = 256;
    TestServer s(o);
    auto c = s.client();
    auto complete = [&](const json &extra, uint64_t seed) {
        json body = {
            {"prompt", "Once upon a time"}, {"max_tokens", 60}, {"seed", seed}, {"temperature", 1.0}};
        for (const auto &[k, v] : extra.items()) body[k] = v;
        auto r = post(c, "/v1/completions", body);
        EXPECT_TRUE(r);
        EXPECT_EQ(r ? r->status : 0, 200) << (r ? r->body : "");
        return r && r->status == 200 ? json::parse(r->body)["choices"][0] : json();
    };
    const std::set<std::string> colours = {"red", "green", "blue", "light blue"};
    for (uint64_t seed = 0; seed < 6; ++seed) {
        json ch = complete({{"guided_choice", {"red", "green", "blue", "light blue"}}}, seed);
        EXPECT_TRUE(colours.contains(ch["text"].get<std::string>())) << ch;
        EXPECT_EQ(ch["finish_reason"], "stop");
        ch = complete({{"structured_outputs", {{"choice", {"red", "green", "blue", "light blue"}}}}}, seed);
        EXPECT_TRUE(colours.contains(ch["text"].get<std::string>())) << ch;
        ch = complete({{"guided_regex", R"(\d{3}-[a-z]{2,5})"}}, seed);
        EXPECT_TRUE(is_code(ch["text"].get<std::string>())) << ch;
        ch = complete({{"structured_outputs", {{"regex", R"(\d{3}-[a-z]{2,5})"}}}}, seed);
        EXPECT_TRUE(is_code(ch["text"].get<std::string>())) << ch;
        ch = complete({{"guided_grammar", k_answer_grammar}}, seed);
        EXPECT_TRUE(is_answer(ch["text"].get<std::string>())) << ch;
    }
    // guided_json as an object or as its text; the chat endpoint takes the same fields.
    const json schema = {{"type", "object"},
                         {"properties", {{"n", {{"type", "integer"}}}}},
                         {"required", {"n"}},
                         {"additionalProperties", false}};
    for (const json &g : {schema, json(schema.dump())}) {
        const json ch = complete({{"guided_json", g}, {"max_tokens", 40}}, 3);
        const json doc = json::parse(ch["text"].get<std::string>(), nullptr, false);
        if (ch["finish_reason"] == "stop") {
            ASSERT_TRUE(doc.is_object()) << ch;
            EXPECT_TRUE(doc["n"].is_number_integer()) << ch;
        }
    }
    auto r = post(c, "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "A colour?"}}}},
                   {"max_tokens", 20},
                   {"guided_choice", {"red", "green"}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string reply = json::parse(r->body)["choices"][0]["message"]["content"];
    EXPECT_TRUE(reply == "red" || reply == "green") << reply;
    // Errors name the field.
    const std::pair<json, std::string> bad[] = {
        {{{"guided_regex", "(a"}}, "'guided_regex': regex: at offset 2: unbalanced '('"},
        {{{"guided_regex", "(?!a)b"}}, "lookarounds"},
        {{{"guided_choice", json::array()}}, "'guided_choice' must be a non-empty list of strings"},
        {{{"guided_choice", {"a", 1}}}, "'guided_choice' must be a non-empty list of strings"},
        {{{"guided_json", 5}}, "'guided_json' must be a JSON schema"},
        {{{"guided_json", {{"type", "array"}, {"uniqueItems", true}}}},
         "'guided_json': json_schema: 'uniqueItems'"},
        {{{"guided_grammar", "root ::= x"}}, "'guided_grammar': grammar: rule 'x' is used but not defined"},
        {{{"guided_choice", {"a"}}, {"response_format", {{"type", "json_object"}}}},
         "give 'response_format' or 'guided_choice', not both"},
        {{{"guided_regex", "a"}, {"guided_choice", {"a"}}},
         "give 'guided_regex' or 'guided_choice', not both"},
        {{{"structured_outputs", {{"json", schema}, {"regex", "a"}}}},
         "give 'structured_outputs.json' or 'structured_outputs.regex', not both"},
        {{{"structured_outputs", "a"}}, "'structured_outputs' must be an object"},
    };
    for (const auto &[fields, message] : bad) {
        json body = {{"prompt", "x"}, {"max_tokens", 2}};
        for (const auto &[k, v] : fields.items()) body[k] = v;
        auto e = post(c, "/v1/completions", body);
        ASSERT_TRUE(e);
        EXPECT_EQ(e->status, 400) << body.dump();
        EXPECT_NE(e->body.find(message), std::string::npos) << e->body;
    }
}

}  // namespace
}  // namespace td::server
