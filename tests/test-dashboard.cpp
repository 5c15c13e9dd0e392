// The web dashboard `tandem serve` answers at /, opened in headless Chromium (tests/test-browser.h) against
// real processes: a head over two `tandem worker`s. It must show the cluster's nodes and links, draw a chart
// that moves while requests run, and stream a chat answer equal to the API's. Screenshots go to
// <build>/test-artifacts (the README's come from there). Skipped where Debian's chromium is not installed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "test-browser.h"
#include "test-child-process.h"
#include "test-server-util.h"

namespace td::server::test_server {
namespace {

const std::string k_artifacts = TD_ARTIFACT_DIR;

void wait_healthy(httplib::Client &c) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
        auto r = c.Get("/health");
        if (r && r->status == 200) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "the server never became healthy";
}

std::string str(const json &v) {
    return v.is_string() ? v.get<std::string>() : v.dump();
}

class Dashboard : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::Browser::installed())
            GTEST_SKIP() << "chromium is not installed (scripts/install-deps installs Debian's chromium)";
    }
};

TEST_F(Dashboard, ShowsTheClusterALiveChartAndAStreamedChat) {
    TwoWorkers w;
    test::ChildProcess serve;
    serve.start({"serve", "-m", test::shared_path(k_model), "--port", "0", "--parallel", "2", "-c", "512",
                 "--workers", w.addresses(), "--layers", "0-1,2-4", "--wire", "f32", "--alias", "stories"},
                "listening on http://127.0.0.1:");
    ASSERT_TRUE(serve.running()) << serve.log();
    const int port = std::stoi(serve.ready_text());
    const std::string base = "http://127.0.0.1:" + std::to_string(port);
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    wait_healthy(c);

    test::Browser b;
    ASSERT_TRUE(b.ready()) << b.log();
    b.navigate(base + "/#cluster");

    // The nodes: both workers, with their layers, and the three links of the ring.
    ASSERT_TRUE(
        b.wait_for("document.querySelectorAll('#nodes tbody tr').length === 2", std::chrono::seconds(20)))
        << str(b.eval("document.querySelector('#nodes').outerHTML"));
    const json rows = b.eval(
        "[...document.querySelectorAll('#nodes tbody tr')].map(tr => [...tr.cells].map(td => "
        "td.textContent))");
    ASSERT_TRUE(rows.is_array() && rows.size() == 2) << rows.dump();
    EXPECT_NE(rows[0][0].get<std::string>().find(w.first().address()), std::string::npos) << rows.dump();
    EXPECT_EQ(rows[0][2], "0-1") << rows.dump();
    EXPECT_NE(rows[1][0].get<std::string>().find(w.second().address()), std::string::npos) << rows.dump();
    EXPECT_EQ(rows[1][2], "2-4") << rows.dump();
    EXPECT_EQ(b.eval("document.querySelector('#layout').textContent"),
              json(w.first().address() + " [0-1] -> " + w.second().address() + " [2-4]"));
    EXPECT_EQ(b.eval("document.querySelector('#health').textContent"), "healthy");
    EXPECT_EQ(b.eval("document.querySelectorAll('#links tbody tr').length"), 3);

    // Idle, the tokens/s chart lies flat at 0; under load it rises and keeps moving.
    ASSERT_TRUE(b.wait_for("Number(document.querySelector('#chart-tps').dataset.points) >= 2",
                           std::chrono::seconds(10)));
    EXPECT_EQ(b.eval("document.querySelector('#chart-tps').dataset.last"), "0");
    std::atomic<bool> stop{false};
    std::atomic<int> answered{0};
    std::vector<std::thread> load;
    for (int t = 0; t < 2; ++t)
        load.emplace_back([&, t] {
            httplib::Client lc("127.0.0.1", port);
            lc.set_read_timeout(60, 0);
            for (int i = 0; !stop.load(); ++i) {
                auto r = post(lc, "/v1/completions",
                              {{"prompt", "Once upon a time " + std::to_string(t * 1000 + i)},
                               {"max_tokens", 200},
                               {"temperature", 0.8},
                               {"seed", i}});
                if (r && r->status == 200) answered++;
            }
        });
    const bool rose =
        b.wait_for("Number(document.querySelector('#chart-tps').dataset.last) > 0", std::chrono::seconds(20));
    EXPECT_TRUE(rose) << str(b.eval("document.querySelector('#chart-tps').outerHTML"));
    const json before = b.eval("document.querySelector('#chart-tps polyline').getAttribute('points')");
    EXPECT_TRUE(b.wait_for(
        "document.querySelector('#chart-tps polyline').getAttribute('points') !== " + before.dump() +
            " && Number(document.querySelector('#chart-tps').dataset.last) > 0",
        std::chrono::seconds(10)));
    // The nodes have computed steps and the links carried bytes by now.
    EXPECT_TRUE(
        b.wait_for("[...document.querySelectorAll('#nodes tbody tr')].every(tr => "
                   "Number(tr.cells[10].textContent) > 0)",
                   std::chrono::seconds(10)))
        << str(b.eval("document.querySelector('#nodes').outerHTML"));
    EXPECT_TRUE(
        b.wait_for("[...document.querySelectorAll('#links tbody tr')].every(tr => "
                   "Number(tr.cells[2].textContent) > 0)",
                   std::chrono::seconds(10)))
        << str(b.eval("document.querySelector('#links').outerHTML"));
    EXPECT_TRUE(b.screenshot(k_artifacts + "/dashboard-cluster.png"));
    stop = true;
    for (auto &t : load) t.join();
    EXPECT_GT(answered.load(), 0);

    // The chat page: greedy settings in the panel, a prompt typed and sent; the answer streams in (more than
    // one event) and equals what the API answers to the same request.
    b.eval("location.hash = '#chat'");
    ASSERT_TRUE(b.wait_for("!document.querySelector('#page-chat').hidden", std::chrono::seconds(5)));
    ASSERT_TRUE(
        b.wait_for("document.querySelector('#p-model').value === 'stories'", std::chrono::seconds(10)));
    const std::string prompt = "Tell me a story about a cat.";
    b.eval(
        "document.querySelector('#p-temperature').value = '0';"
        "document.querySelector('#p-max-tokens').value = '32';"
        "document.querySelector('#prompt').value = " +
        json(prompt).dump() + "; document.querySelector('#send').click(); true");
    ASSERT_TRUE(b.wait_for("document.querySelector('.msg.assistant')?.dataset.done === '1'",
                           std::chrono::seconds(60)))
        << str(b.eval("document.querySelector('#chat-log').outerHTML"));
    const json shown = b.eval("document.querySelector('.msg.assistant').textContent");
    const json chunks = b.eval("Number(document.querySelector('.msg.assistant').dataset.chunks)");
    EXPECT_EQ(b.eval("document.querySelectorAll('.msg.error').length"), 0)
        << str(b.eval("document.querySelector('#chat-log').outerHTML"));
    auto r = post(c, "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", prompt}}}},
                   {"temperature", 0},
                   {"top_p", 0.95},
                   {"max_tokens", 32}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::string expected = json::parse(r->body)["choices"][0]["message"]["content"].get<std::string>();
    EXPECT_FALSE(expected.empty());
    EXPECT_EQ(shown, json(expected));
    EXPECT_GT(chunks.get<int>(), 1) << "the answer did not arrive as a stream";
    EXPECT_NE(str(b.eval("document.querySelector('#chat-stats').textContent")).find("tokens/s"),
              std::string::npos);
    EXPECT_TRUE(b.screenshot(k_artifacts + "/dashboard-chat.png"));
}

// With --api-key the page itself loads (it holds no data), /status does not without the key; the page asks
// for it, and once given shows the node.
TEST_F(Dashboard, AsksForTheApiKey) {
    test::ChildProcess serve;
    serve.start({"serve", "-m", test::shared_path(k_model), "--port", "0", "--api-key", "sesame-0123"},
                "listening on http://127.0.0.1:");
    ASSERT_TRUE(serve.running()) << serve.log();
    const int port = std::stoi(serve.ready_text());
    httplib::Client c("127.0.0.1", port);
    wait_healthy(c);
    test::Browser b;
    ASSERT_TRUE(b.ready()) << b.log();
    b.navigate("http://127.0.0.1:" + std::to_string(port) + "/#cluster");
    ASSERT_TRUE(b.wait_for("!document.querySelector('#auth').hidden", std::chrono::seconds(10)));
    EXPECT_EQ(b.eval("document.querySelectorAll('#nodes tbody tr').length"), 0);
    b.eval(
        "document.querySelector('#auth-key').value = 'sesame-0123';"
        "document.querySelector('#auth-save').click(); true");
    EXPECT_TRUE(
        b.wait_for("document.querySelectorAll('#nodes tbody tr').length === 1", std::chrono::seconds(10)));
    EXPECT_TRUE(b.wait_for("document.querySelector('#auth').hidden", std::chrono::seconds(5)));
    EXPECT_EQ(b.eval("document.querySelector('#nodes tbody tr').cells[0].textContent.startsWith('local')"),
              true);
}

// `tandem serve` says where the dashboard is; --no-webui leaves only the API (and /status).
TEST(DashboardFlag, NoWebuiServesOnlyTheApi) {
    for (bool webui : {true, false}) {
        SCOPED_TRACE(webui);
        std::vector<std::string> args = {"serve", "-m", test::shared_path(k_model), "--port", "0"};
        if (!webui) args.push_back("--no-webui");
        test::ChildProcess serve;
        serve.start(args, "listening on http://127.0.0.1:");
        ASSERT_TRUE(serve.running()) << serve.log();
        const int port = std::stoi(serve.ready_text());
        httplib::Client c("127.0.0.1", port);
        wait_healthy(c);
        auto r = c.Get("/");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, webui ? 200 : 404);
        r = c.Get("/status");
        ASSERT_TRUE(r);
        EXPECT_EQ(r->status, 200);
        const std::string line =
            "dashboard (chat and cluster) at http://127.0.0.1:" + std::to_string(port) + "/";
        // The line follows "ready", which /health may beat by a moment.
        for (int i = 0; i < 100 && serve.log().find("ready:") == std::string::npos; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        EXPECT_EQ(serve.log().find(line) != std::string::npos, webui) << serve.log();
    }
}

}  // namespace
}  // namespace td::server::test_server
