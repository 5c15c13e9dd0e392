// A tandem child process for tests that need real nodes (`tandem worker`, `tandem serve`): spawned with
// posix_spawn, its stderr in a temp file, ready once a marker line appears there. The destructor kills
// (SIGKILL) and reaps it.
#pragma once

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "test-util.h"

namespace td::test {

class ChildProcess {
public:
    ChildProcess() = default;
    ~ChildProcess() { kill(); }
    ChildProcess(const ChildProcess &) = delete;
    ChildProcess &operator=(const ChildProcess &) = delete;

    // Runs the tandem binary with `args` (and `extra_env` added to this environment), then waits up to
    // `timeout` for a stderr line containing `marker`; ready() tells whether it came, ready_text() is the
    // rest of that line after the marker. The process is left running either way (until kill()).
    void start(const std::vector<std::string> &args, const std::string &marker,
               const std::vector<std::string> &extra_env = {},
               std::chrono::seconds timeout = std::chrono::seconds(20)) {
        kill();
        ready_text_.clear();
        ready_ = false;
        err_path_ = log_dir_.file("stderr");
        std::vector<std::string> all = prefix_;
        all.push_back(tandem_bin());
        all.insert(all.end(), args.begin(), args.end());
        std::vector<char *> argv;
        for (auto &a : all) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::vector<std::string> env_strings;
        for (char **e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
        env_strings.insert(env_strings.end(), extra_env.begin(), extra_env.end());
        std::vector<char *> envp;
        for (auto &e : env_strings) envp.push_back(e.data());
        envp.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), envp.data());
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) {
            pid_ = -1;
            return;
        }
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            const std::string err = read_file(err_path_);
            const size_t at = err.find(marker);
            const size_t eol = at == std::string::npos ? std::string::npos : err.find('\n', at);
            if (eol != std::string::npos) {
                ready_text_ = err.substr(at + marker.size(), eol - at - marker.size());
                ready_ = true;
                return;
            }
            int status = 0;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
    }

    // Runs the binary through another program from the next start() on: {"/usr/sbin/ip", "netns", "exec",
    // NS}.
    void set_prefix(std::vector<std::string> prefix) { prefix_ = std::move(prefix); }

    void kill() { signal_and_reap(SIGKILL); }
    // Sends `sig` (SIGSTOP, SIGCONT) without waiting.
    void signal(int sig) {
        if (pid_ > 0) ::kill(pid_, sig);
    }
    // Sends `sig`, waits for the exit and returns the exit status (-1 when it did not exit normally).
    int signal_and_reap(int sig) {
        if (pid_ <= 0) return -1;
        ::kill(pid_, sig);
        int status = 0;
        waitpid(pid_, &status, 0);
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }
    bool running() const { return pid_ > 0 && ready_; }
    pid_t pid() const { return pid_; }
    const std::string &ready_text() const { return ready_text_; }
    std::string log() const { return read_file(err_path_); }

private:
    TempDir log_dir_;
    std::vector<std::string> prefix_;
    std::string err_path_;
    pid_t pid_ = -1;
    bool ready_ = false;
    std::string ready_text_;
};

// `tandem worker --listen 127.0.0.1:PORT --cache-dir DIR -t 1 [--model MODEL]` (port 0: any free one), with
// `extra_env` added to the environment.
class WorkerProcess {
public:
    explicit WorkerProcess(const std::string &cache_dir, uint16_t port = 0, const std::string &model = "",
                           const std::vector<std::string> &extra_env = {},
                           const std::vector<std::string> &extra_args = {}) {
        start(cache_dir, port, model, extra_env, extra_args);
    }
    void start(const std::string &cache_dir, uint16_t port, const std::string &model = "",
               const std::vector<std::string> &extra_env = {},
               const std::vector<std::string> &extra_args = {}) {
        std::vector<std::string> args = {
            "worker", "--listen", "127.0.0.1:" + std::to_string(port), "--cache-dir", cache_dir, "-t", "1"};
        if (!model.empty()) args.insert(args.end(), {"--model", model});
        args.insert(args.end(), extra_args.begin(), extra_args.end());
        // The workers allow what the test's heads do (--td-transport), unless the test says otherwise.
        if (!test_transport_name().empty() &&
            std::find(extra_args.begin(), extra_args.end(), "--transport") == extra_args.end())
            args.insert(args.end(), {"--transport", test_transport_name()});
        proc_.start(args, "listening on ", extra_env);
        address_ = proc_.ready_text();
        port_ =
            address_.empty() ? 0 : static_cast<uint16_t>(std::stoi(address_.substr(address_.rfind(':') + 1)));
    }
    void kill() { proc_.kill(); }
    void stall() { proc_.signal(SIGSTOP); }
    void resume() { proc_.signal(SIGCONT); }
    bool running() const { return proc_.running() && port_ != 0; }
    const std::string &address() const { return address_; }  // "127.0.0.1:PORT"
    uint16_t port() const { return port_; }
    std::string log() const { return proc_.log(); }
    pid_t pid() const { return proc_.pid(); }

private:
    ChildProcess proc_;
    std::string address_;
    uint16_t port_ = 0;
};

}  // namespace td::test
