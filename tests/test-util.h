// Helpers shared by the tests: where the test data lives, temp files, running the tandem binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "net/auth.h"
#include "net/protocol.h"

namespace td::test {

// The cluster secret of the build tree's tests (TD_TEST_SECRET, also in every test's TANDEM_SECRET_FILE, so
// the tandem processes a test starts hold the same).
inline const net::ClusterSecret &test_secret() {
    static const net::ClusterSecret secret = [] {
        auto s = net::ClusterSecret::load(TD_TEST_SECRET);
        return s.ok() ? *s : net::ClusterSecret::from_bytes("tandem-test-secret-not-found");
    }();
    return secret;
}

// The transports the cluster tests' heads allow: the test binary's argument --td-transport=NAME (auto, tcp,
// shm), with which ctest runs the cluster suites once more over TCP (tests/CMakeLists.txt); else
// $TD_TEST_TRANSPORT; else auto (shm: every node is on this host).
// The --transport name the cluster tests run with ("" when none was given: auto).
inline const std::string &test_transport_name() {
    static const std::string name = [] {
        std::string n;
        if (const char *env = std::getenv("TD_TEST_TRANSPORT")) n = env;
        std::ifstream cmdline("/proc/self/cmdline");
        const std::string flag = "--td-transport=";
        for (std::string arg; std::getline(cmdline, arg, '\0');)
            if (arg.rfind(flag, 0) == 0) n = arg.substr(flag.size());
        return n;
    }();
    return name;
}
inline uint32_t test_transports() {
    static const uint32_t bits = [] {
        uint32_t b = net::auto_transports();
        std::string error;
        if (!test_transport_name().empty() && !net::transports_from_name(test_transport_name(), &b, &error))
            std::abort();
        return b;
    }();
    return bits;
}
// The transport a link between two nodes of this host takes in these tests.
inline net::Transport test_link_transport() {
    const uint32_t bits = test_transports();
    if ((bits & net::transport_bit(net::Transport::shm)) != 0) return net::Transport::shm;
    if ((bits & net::transport_bit(net::Transport::ucx)) != 0) return net::Transport::ucx;
    return net::Transport::tcp;
}

// ../shared (or $TANDEM_SHARED_DIR): models/, reference/, vocab/.
inline std::string shared_dir() {
    if (const char *env = std::getenv("TANDEM_SHARED_DIR")) return env;
    return TD_SHARED_DIR;
}
inline std::string shared_path(const std::string &rel) {
    return shared_dir() + "/" + rel;
}
inline bool shared_exists(const std::string &rel) {
    return std::filesystem::exists(shared_path(rel));
}

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
        char *p = mkdtemp(tmpl.data());
        path_ = p ? p : tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::string &path() const { return path_; }
    std::string file(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

inline std::string tandem_bin() {
    return TD_TANDEM_BIN;
}

}  // namespace td::test

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

extern char **environ;

namespace td::test {

struct ProcessResult {
    int exit_code = -1;  // valid when !signaled
    bool signaled = false;
    int signal = 0;
    std::string out;  // stdout
    std::string err;  // stderr
};

inline std::string read_file(const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// Runs the tandem binary with args, capturing stdout and stderr (through temp files); stdin reads
// `stdin_path`. A `prefix` runs it through another program (`/usr/sbin/ip netns exec NS`; its first element a
// path).
inline ProcessResult run_tandem_with_stdin_file(const std::vector<std::string> &args,
                                                const std::string &stdin_path,
                                                const std::vector<std::string> &prefix = {}) {
    TempDir dir;
    const std::string out_path = dir.file("out"), err_path = dir.file("err");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, stdin_path.c_str(), O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> all = prefix;
    all.push_back(tandem_bin());
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char *> argv;
    for (auto &a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ProcessResult r;
    pid_t pid = 0;
    if (posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) {
        posix_spawn_file_actions_destroy(&fa);
        r.err = "spawn failed";
        return r;
    }
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        r.signaled = true;
        r.signal = WTERMSIG(status);
    } else {
        r.exit_code = WEXITSTATUS(status);
    }
    r.out = read_file(out_path);
    r.err = read_file(err_path);
    return r;
}

// Runs the tandem binary with args, no stdin.
inline ProcessResult run_tandem(const std::vector<std::string> &args) {
    return run_tandem_with_stdin_file(args, "/dev/null");
}

// Runs the tandem binary with args and `input` on its stdin (then end of input).
inline ProcessResult run_tandem_stdin(const std::vector<std::string> &args, const std::string &input) {
    TempDir dir;
    const std::string in_path = dir.file("in");
    std::ofstream(in_path, std::ios::binary) << input;
    return run_tandem_with_stdin_file(args, in_path);
}

}  // namespace td::test
