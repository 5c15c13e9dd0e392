// scripts/install-service and the systemd units in docs/systemd: installed below a temporary root (--root: a
// dry run that starts nothing), the worker's and the head's ExecStart lines are run as systemd would run them
// (the unit's command, its environment file's flags split on spaces, the installed paths); the head serves
// through the worker with the secret the installer made, and a worker restarted on its port rejoins by
// itself.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "test-child-process.h"
#include "test-util.h"

namespace td {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
constexpr const char *k_model = "models/stories260K.gguf";

// Runs scripts/install-service with `args`; its exit code, output in *out.
int install_service(const std::string &args, std::string *out) {
    test::TempDir dir;
    const std::string log = dir.file("log");
    const std::string cmd =
        "bash " + std::string(TD_SOURCE_DIR) + "/scripts/install-service " + args + " >" + log + " 2>&1";
    const int rc = std::system(cmd.c_str());
    *out = test::read_file(log);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

std::string line_starting(const std::string &text, const std::string &prefix) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);)
        if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    return "";
}

// The unit's command as systemd runs it: ExecStart's words, `$VAR` replaced by the environment file's words,
// and the installed absolute paths moved below `root`. The first word (the binary) is dropped: ChildProcess
// runs the build's tandem, which the test checks is what was installed.
std::vector<std::string> unit_command(const std::string &root, const std::string &role) {
    const std::string unit = test::read_file(root + "/etc/systemd/system/tandem-" + role + ".service");
    const std::string env = test::read_file(root + "/etc/tandem/" + role + ".env");
    const std::string var = role == "worker" ? "TANDEM_WORKER_ARGS" : "TANDEM_HEAD_ARGS";
    std::istringstream exec(line_starting(unit, "ExecStart="));
    std::vector<std::string> words;
    for (std::string w; exec >> w;) {
        if (w == "$" + var) {
            std::istringstream flags(line_starting(env, var + "="));
            for (std::string f; flags >> f;) words.push_back(f);
            continue;
        }
        for (const char *dir : {"/etc/tandem", "/var/cache/tandem", "/usr/local/bin"})
            if (w.rfind(dir, 0) == 0) w = root + w;
        words.push_back(w);
    }
    EXPECT_GE(words.size(), 2u) << unit;
    if (!words.empty()) {
        EXPECT_EQ(words.front(), root + "/usr/local/bin/tandem");
        words.erase(words.begin());
    }
    return words;
}

std::string completion_text(httplib::Client &c) {
    const json req = {{"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
    auto r = c.Post("/v1/completions", req.dump(), "application/json");
    if (!r || r->status != 200) return "";
    return json::parse(r->body)["choices"][0]["text"].get<std::string>();
}

TEST(InstallService, TheUnitsRunAndAWorkerThatRestartsRejoins) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    test::TempDir root;
    std::string out;
    ASSERT_EQ(install_service("worker --root " + root.path() + " --bin " + test::tandem_bin() +
                                  " --listen 127.0.0.1:0 -t 1 --user nobody",
                              &out),
              0)
        << out;
    // What it installed: the binary, a secret only its owner reads, the flags, the unit for the given user.
    EXPECT_EQ(fs::file_size(root.path() + "/usr/local/bin/tandem"), fs::file_size(test::tandem_bin()));
    struct stat st {};
    ASSERT_EQ(::stat((root.path() + "/etc/tandem/cluster.secret").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    const std::string secret = test::read_file(root.path() + "/etc/tandem/cluster.secret");
    EXPECT_EQ(secret.size(), 65u) << secret;  // 32 random bytes in hex, a newline
    EXPECT_EQ(line_starting(test::read_file(root.path() + "/etc/tandem/worker.env"), "TANDEM_WORKER_ARGS="),
              "--listen 127.0.0.1:0 -t 1");
    const std::string unit = test::read_file(root.path() + "/etc/systemd/system/tandem-worker.service");
    EXPECT_EQ(line_starting(unit, "User="), "nobody");
    EXPECT_EQ(line_starting(unit, "Restart="), "always");

    // The worker as systemd would start it.
    const std::vector<std::string> env = {"TANDEM_CACHE_DIR=" + root.path() + "/var/cache/tandem"};
    std::vector<std::string> worker_cmd = unit_command(root.path(), "worker");
    auto worker = std::make_unique<test::ChildProcess>();
    worker->start(worker_cmd, "listening on ", env);
    ASSERT_TRUE(worker->running()) << worker->log();
    const std::string address = worker->ready_text();

    // The head, installed second: it keeps the secret the worker's install made.
    const std::string model = test::shared_path(k_model);
    ASSERT_EQ(
        install_service("head --root " + root.path() + " --bin " + test::tandem_bin() + " -m " + model +
                            " --workers " + address + " --host 127.0.0.1 --port 0 -- --max-resumes 2 -c 256",
                        &out),
        0)
        << out;
    EXPECT_EQ(test::read_file(root.path() + "/etc/tandem/cluster.secret"), secret);
    test::ChildProcess head;
    head.start(unit_command(root.path(), "head"), "listening on http://127.0.0.1:", env);
    ASSERT_TRUE(head.running()) << head.log();
    httplib::Client c("127.0.0.1", std::stoi(head.ready_text()));
    c.set_read_timeout(60, 0);
    // It listens at once and answers 503 until the worker holds its layers.
    for (const auto deadline = Clock::now() + std::chrono::seconds(60); Clock::now() < deadline;) {
        auto h = c.Get("/health");
        if (h && h->status == 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const std::string first = completion_text(c);
    ASSERT_FALSE(first.empty()) << head.log();

    // A head holding another secret is refused by that worker.
    std::ofstream(root.file("other.secret")) << "another secret, long enough for tandem to take it\n";
    ::chmod(root.file("other.secret").c_str(), 0600);
    auto stranger = test::run_tandem({"run", "-m", model, "--workers", address, "--secret-file",
                                      root.file("other.secret"), "-p", "Hi", "-n", "2"});
    EXPECT_NE(stranger.exit_code, 0);
    EXPECT_NE(stranger.err.find("authentication failed"), std::string::npos) << stranger.err;

    // The worker dies and systemd starts it again on its port (Restart=always): the head takes it back.
    worker.reset();
    for (std::string &w : worker_cmd)
        if (w == "127.0.0.1:0") w = address;
    worker = std::make_unique<test::ChildProcess>();
    worker->start(worker_cmd, "listening on ", env);
    ASSERT_TRUE(worker->running()) << worker->log();
    std::string again;
    for (const auto deadline = Clock::now() + std::chrono::seconds(30);
         again.empty() && Clock::now() < deadline;) {
        again = completion_text(c);
        if (again.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    EXPECT_EQ(again, first) << head.log();
}

// systemd's own check of both units (where systemd-analyze is installed: not in every container), with the
// ExecStart binary pointed at the build's.
TEST(InstallService, SystemdAcceptsTheUnits) {
    if (std::system("command -v systemd-analyze >/dev/null 2>&1") != 0) GTEST_SKIP() << "no systemd-analyze";
    test::TempDir dir;
    for (const std::string role : {"worker", "head"}) {
        std::string unit =
            test::read_file(std::string(TD_SOURCE_DIR) + "/docs/systemd/tandem-" + role + ".service");
        const std::string installed = "/usr/local/bin/tandem";
        ASSERT_NE(unit.find(installed), std::string::npos);
        unit.replace(unit.find(installed), installed.size(), test::tandem_bin());
        const std::string path = dir.file("tandem-" + role + ".service"), log = dir.file(role + ".log");
        std::ofstream(path) << unit;
        const int rc = std::system(("systemd-analyze verify " + path + " >" + log + " 2>&1").c_str());
        EXPECT_EQ(rc, 0) << test::read_file(log);
        EXPECT_EQ(test::read_file(log), "") << role;
    }
}

TEST(InstallService, RefusesWhatWouldNotRun) {
    test::TempDir root;
    std::string out;
    EXPECT_NE(install_service("gateway --root " + root.path(), &out), 0);
    EXPECT_NE(out.find("the role is worker or head"), std::string::npos) << out;
    EXPECT_NE(install_service(
                  "head --root " + root.path() + " --bin " + test::tandem_bin() + " --workers a:1", &out),
              0);
    EXPECT_NE(out.find("give the model"), std::string::npos) << out;
    // A flag value systemd would split in two.
    EXPECT_NE(install_service("head --root " + root.path() + " --bin " + test::tandem_bin() +
                                  " -m '/models/my model.gguf' --workers a:1",
                              &out),
              0);
    EXPECT_NE(out.find("systemd would split it"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(root.path() + "/etc/systemd"));
}

}  // namespace
}  // namespace td
