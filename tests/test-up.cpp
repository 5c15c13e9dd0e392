// `tandem up`, the launcher: driven in tmux as a person would (send-keys, capture-pane) against two real
// workers, it shows the nodes and the plan, starts the server on Enter, shows it serving, and stops it on q.
// Without a terminal, --yes starts the recommended layout and a signal stops the server with it. The captured
// screens go to <build>/test-artifacts. The tmux test is skipped where tmux is not installed.
#include <gtest/gtest.h>
#include <httplib.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test-child-process.h"
#include "test-util.h"

namespace td {
namespace {

using nlohmann::json;
const std::string k_model = "models/stories260K.gguf";

std::string run_output(const std::string &command) {
    std::string out;
    if (FILE *p = popen(command.c_str(), "r")) {
        char buf[4096];
        for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
        pclose(p);
    }
    return out;
}

bool have_tmux() {
    return std::system("tmux -V >/dev/null 2>&1") == 0;
}

// A tmux server of its own (-L), one 160x45 window running `command`; killed at the end.
class Tmux {
public:
    explicit Tmux(const std::string &command) : socket_("td-up-" + std::to_string(getpid())) {
        std::system(("tmux -L " + socket_ + " kill-server >/dev/null 2>&1").c_str());
        ok_ =
            std::system(
                ("tmux -L " + socket_ + " new-session -d -x 160 -y 45 -s up " + quote(command)).c_str()) == 0;
    }
    ~Tmux() { std::system(("tmux -L " + socket_ + " kill-server >/dev/null 2>&1").c_str()); }
    bool ok() const { return ok_; }
    std::string screen() const { return run_output("tmux -L " + socket_ + " capture-pane -p -t up"); }
    void keys(const std::string &keys) const {
        std::system(("tmux -L " + socket_ + " send-keys -t up " + keys).c_str());
    }
    // Polls the screen until it contains `text`; the last screen either way.
    std::string wait_for(const std::string &text, std::chrono::seconds timeout) const {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        std::string s;
        while (std::chrono::steady_clock::now() < deadline) {
            s = screen();
            if (s.find(text) != std::string::npos) return s;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return s;
    }
    static std::string quote(const std::string &s) {
        std::string out = "'";
        for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
        return out + "'";
    }

private:
    std::string socket_;
    bool ok_ = false;
};

void save(const std::string &name, const std::string &text) {
    std::filesystem::create_directories(TD_ARTIFACT_DIR);
    std::ofstream(std::string(TD_ARTIFACT_DIR) + "/" + name) << text;
}

int port_after(const std::string &text, const std::string &prefix) {
    const size_t at = text.find(prefix);
    return at == std::string::npos ? 0 : std::atoi(text.c_str() + at + prefix.size());
}

// The words of the first screen line that starts with "  <address> " and contains `marker`.
std::vector<std::string> row_words(const std::string &screen, const std::string &address,
                                   const std::string &marker) {
    std::istringstream lines(screen);
    for (std::string line; std::getline(lines, line);) {
        if (line.rfind("  " + address + " ", 0) != 0 || line.find(marker) == std::string::npos) continue;
        std::istringstream in(line);
        std::vector<std::string> words;
        for (std::string w; in >> w;) words.push_back(w);
        return words;
    }
    return {};
}

bool refuses(int port) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(1, 0);
    return !c.Get("/health");
}

TEST(Up, InTmuxShowsTheNodesAndThePlanThenStartsAndStopsTheServer) {
    if (!have_tmux()) GTEST_SKIP() << "tmux is not installed";
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    test::TempDir cache;
    test::WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const std::string err = cache.file("up.err");
    // The server asks for an API key (a flag after --): up reads /status with it.
    const std::string key_file = cache.file("api.key");
    std::ofstream(key_file) << "up-test-key\n";
    Tmux t(test::tandem_bin() + " up -m " + test::shared_path(k_model) + " --workers " + w1.address() + "," +
           w2.address() + " --port 0 --parallel 2 -- --api-key-file " + key_file + " 2>" + err +
           "; echo EXIT=$? >>" + err + "; sleep 120");
    ASSERT_TRUE(t.ok());

    // The nodes with what they measured, and the plan with its recommendation.
    std::string s = t.wait_for("(recommended)", std::chrono::seconds(60));
    save("up-plan.txt", s);
    ASSERT_NE(s.find("(recommended)"), std::string::npos) << s << test::read_file(err);
    EXPECT_NE(s.find("Nodes  (given with --workers)"), std::string::npos) << s;
    for (const test::WorkerProcess *w : {&w1, &w2}) {
        // address, node, cores, free memory, GFLOP/s, the round trip just measured, status
        const std::vector<std::string> words = row_words(s, w->address(), "usable");
        ASSERT_EQ(words.size(), 9u) << w->address() << "\n" << s;
        EXPECT_EQ(words[2], "1") << s;  // -t 1
        EXPECT_EQ(words[4], "GiB") << s;
        EXPECT_GT(std::stod(words[5]), 0.0) << s;
        EXPECT_GT(std::stod(words[6]), 0.0) << s;
        EXPECT_TRUE(words[7] == "us" || words[7] == "ms") << s;
    }
    EXPECT_NE(s.find("pipeline"), std::string::npos) << s;
    EXPECT_NE(s.find("tp 2"), std::string::npos) << s;
    EXPECT_NE(s.find(" tok/s  pipeline "), std::string::npos) << s;

    // To the top of the list, then down to the two-stage pipeline; Enter: the server starts on it.
    const auto selected = [&] {
        const std::string screen = t.screen();
        const size_t at = screen.find("\n > ");
        return at == std::string::npos ? std::string()
                                       : screen.substr(at + 1, screen.find('\n', at + 1) - at - 1);
    };
    for (int i = 0; i < 6; ++i) t.keys("Up");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the screen redraws every 100 ms
    for (int i = 0; i < 6 && selected().find(" > pipeline") != 0; ++i) {
        t.keys("Down");
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    ASSERT_EQ(selected().find(" > pipeline"), 0u) << t.screen();
    t.keys("Enter");
    s = t.wait_for("Server: running at http://127.0.0.1:", std::chrono::seconds(60));
    const int port = port_after(s, "Server: running at http://127.0.0.1:");
    ASSERT_GT(port, 0) << s << test::read_file(err);
    EXPECT_NE(s.find("layout " + w1.address() + " [0-"), std::string::npos) << s;

    // Requests: the live view counts them.
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    c.set_bearer_token_auth("up-test-key");
    for (int i = 0; i < 2; ++i) {
        auto r = c.Post("/v1/completions", json({{"prompt", "Once upon a time"}, {"max_tokens", 32}}).dump(),
                        "application/json");
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
    }
    // The nodes' rows come from the workers' statistics, which the server asks for on its own schedule: a
    // row may come a refresh or two after the request counts.
    std::vector<std::string> last;  // addr layers A-4 steps N ...
    for (int i = 0; i < 150; ++i) {
        s = t.screen();
        last = row_words(s, w2.address(), "layers");
        if (s.find("requests done 2") != std::string::npos && last.size() >= 5 && last[4] != "0") break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    save("up-serving.txt", s);
    EXPECT_NE(s.find("requests done 2  failed 0"), std::string::npos) << s;
    EXPECT_NE(s.find("tokens generated 64"), std::string::npos) << s;
    ASSERT_GE(last.size(), 5u) << s;
    EXPECT_EQ(last[2].substr(last[2].size() - 2), "-4") << s;
    EXPECT_GT(std::stoi(last[4]), 0) << s;

    // q: the server goes with the launcher.
    t.keys("q");
    bool gone = false;
    for (int i = 0; i < 100 && !(gone = refuses(port)); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(gone) << "the server still answers after q";
    std::string log;
    for (int i = 0; i < 100 && (log = test::read_file(err)).find("EXIT=") == std::string::npos; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_NE(log.find("EXIT=0"), std::string::npos) << log;  // (a sanitizer's report would fail it too)
}

// Without a terminal: --yes starts the layout --pick names (here the pipeline) and says where; SIGTERM stops
// the server too.
TEST(Up, WithoutATerminalYesStartsTheRecommendedLayout) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    test::TempDir cache;
    test::WorkerProcess w1(cache.file("w1")), w2(cache.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    test::ChildProcess up;
    up.start({"up", "-m", test::shared_path(k_model), "--workers", w1.address() + "," + w2.address(),
              "--port", "0", "--yes", "--pick", "pipeline"},
             "server ready at http://127.0.0.1:", {}, std::chrono::seconds(90));
    ASSERT_TRUE(up.running()) << up.log();
    const int port = std::atoi(up.ready_text().c_str());
    ASSERT_GT(port, 0) << up.log();
    EXPECT_NE(up.log().find("(recommended)"), std::string::npos) << up.log();
    EXPECT_NE(up.log().find("tandem up: starting tandem serve -m "), std::string::npos) << up.log();
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(60, 0);
    auto r = c.Get("/health");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_NE(up.log().find(" --layers "), std::string::npos) << up.log();  // the pipeline's flags
    EXPECT_NE(json::parse(r->body).value("layout", "").find(" -> "), std::string::npos) << r->body;
    EXPECT_EQ(up.signal_and_reap(SIGTERM), 0) << up.log();
    EXPECT_TRUE(refuses(port)) << "the server outlived tandem up";

    // A kind of layout that does not fit (hybrid needs 3 nodes) is said, not swapped for another.
    auto hybrid =
        test::run_tandem({"up", "-m", test::shared_path(k_model), "--workers",
                          w1.address() + "," + w2.address(), "--port", "0", "--yes", "--pick", "hybrid"});
    EXPECT_EQ(hybrid.exit_code, 1) << hybrid.err;
    EXPECT_NE(hybrid.err.find("no hybrid layout fits these nodes"), std::string::npos) << hybrid.err;

    // --head-node: this machine is listed and measured as a node, and a tensor-parallel layout over it and a
    // worker starts `serve --head-node`.
    {
        test::ChildProcess hn;
        hn.start({"up", "-m", test::shared_path(k_model), "--workers", w1.address(), "--head-node", "--port",
                  "0", "--yes", "--pick", "tp", "--", "-t", "1"},
                 "server ready at http://127.0.0.1:", {}, std::chrono::seconds(90));
        ASSERT_TRUE(hn.running()) << hn.log();
        const std::string log = hn.log();
        EXPECT_NE(log.find("  head node "), std::string::npos) << log;
        EXPECT_NE(log.find("--head-node --tp 2"), std::string::npos) << log;
        httplib::Client c("127.0.0.1", std::stoi(hn.ready_text()));
        c.set_read_timeout(60, 0);
        std::string first, body;  // the first node of /status (its engine part fills in after a probe)
        for (int i = 0; i < 100 && first.empty(); ++i) {
            auto st = c.Get("/status");
            if (st && st->status == 200) {
                body = st->body;
                const json nodes =
                    json::parse(body).value("engine", json::object()).value("nodes", json::array());
                if (!nodes.empty()) first = nodes[0].value("address", "");
            }
            if (first.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        EXPECT_EQ(first, "head node") << body;
        EXPECT_EQ(hn.signal_and_reap(SIGTERM), 0) << hn.log();
    }

    // Without a terminal and without --yes it says what to do instead of waiting for keys.
    auto no = test::run_tandem({"up", "-m", test::shared_path(k_model), "--workers", w1.address()});
    EXPECT_NE(no.exit_code, 0);
    EXPECT_NE(no.err.find("give --yes"), std::string::npos) << no.err;
}

}  // namespace
}  // namespace td
