// tandem up: a cluster in one command. The machine that runs it is the head: it finds the workers (--discover
// on the LAN, or --workers), shows them with their memory, cores, speed and a link latency measured live,
// measures them for the model as `tandem plan` does and ranks the layouts by predicted tokens/s, and on Enter
// (or at once with --yes) starts `tandem serve` with the chosen layout, showing its load progress and then
// its tokens/s, requests and nodes from /status. q stops the server and leaves.
//
// A terminal UI (ncurses) when stdout is a terminal; otherwise (scripts, --yes) the same steps as plain
// lines.
#include <curses.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cluster/discovery.h"
#include "cluster/placement.h"
#include "cluster/planner.h"
#include "cluster/probe.h"
#include "cluster/stage-cache.h"
#include "cluster/worker.h"
#include "gguf/gguf.h"

extern char **environ;

namespace td::cli {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// SIGINT, SIGTERM, SIGHUP: leave like q (the server is stopped, not orphaned).
std::atomic<bool> g_signalled{false};
void on_signal(int) {
    g_signalled = true;
}

struct UpOptions {
    std::string model;
    std::string workers;
    DiscoverFlags discover;
    bool yes = false;
    std::string pick = "recommended";  // --pick: the layout --yes starts (and the one selected at first)
    std::string host = "127.0.0.1";
    int port = 8080;
    int32_t parallel = 4;
    std::string secret_file;
    bool head_node = false;               // this machine is a node too (measured, and offered in the layouts)
    std::vector<std::string> serve_args;  // after --: passed to `tandem serve` as they are
};

// ---- the server: `tandem serve` as a child process -------------------------------------------------------

class ServeChild {
public:
    ~ServeChild() { stop(); }

    Status start(const std::vector<std::string> &args) {
        int fds[2];
        if (pipe2(fds, O_CLOEXEC) != 0) return make_error(ErrorKind::io, "cannot make a pipe");
        std::vector<std::string> all = {"/proc/self/exe"};
        all.insert(all.end(), args.begin(), args.end());
        std::vector<char *> argv;
        for (std::string &a : all) argv.push_back(a.data());
        argv.push_back(nullptr);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
        posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
        const int rc = posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        close(fds[1]);
        if (rc != 0) {
            close(fds[0]);
            pid_ = -1;
            return make_error(ErrorKind::io, "cannot start tandem serve: {}", std::strerror(rc));
        }
        reader_ = std::thread([this, fd = fds[0]] { read_loop(fd); });
        return {};
    }

    // SIGTERM (the server finishes its streams' events and closes), then SIGKILL after 5 s.
    void stop() {
        if (pid_ > 0) {
            ::kill(pid_, SIGTERM);
            for (int i = 0; i < 250 && !exited(); ++i)
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            if (!exited()) ::kill(pid_, SIGKILL);
            reap(true);
        }
        if (reader_.joinable()) reader_.join();
    }

    // Reaps the child if it has exited (blocking: waits for it).
    bool exited() { return reap(false); }

    struct State {
        int port = 0;          // from "listening on http://HOST:PORT"
        bool ready = false;    // "model '...' ready"
        std::string progress;  // the last "streaming layers ..." line
        double percent = 0.0;
        std::vector<std::string> lines;  // the last lines it wrote
        int exit_code = -1;
        bool gone = false;
    };
    State state() {
        std::lock_guard lock(mu_);
        return state_;
    }

private:
    bool reap(bool block) {
        std::lock_guard lock(mu_);
        if (pid_ <= 0) return true;
        int status = 0;
        if (waitpid(pid_, &status, block ? 0 : WNOHANG) != pid_) return false;
        state_.gone = true;
        state_.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        pid_ = -1;
        return true;
    }
    void read_loop(int fd) {
        std::string buf;
        char chunk[4096];
        for (;;) {
            const ssize_t n = read(fd, chunk, sizeof(chunk));
            if (n <= 0) break;
            buf.append(chunk, static_cast<size_t>(n));
            size_t at;
            while ((at = buf.find_first_of("\r\n")) != std::string::npos) {
                line(buf.substr(0, at));
                buf.erase(0, at + 1);
            }
        }
        if (!buf.empty()) line(buf);
        close(fd);
    }
    void line(const std::string &l) {
        if (l.empty()) return;
        std::lock_guard lock(mu_);
        if (const size_t at = l.find("listening on http"); at != std::string::npos)
            state_.port = std::atoi(l.substr(l.rfind(':') + 1).c_str());
        if (l.find("' ready: ") != std::string::npos) state_.ready = true;
        if (l.find("streaming layers") != std::string::npos) {
            state_.progress = l;
            if (const size_t pct = l.find('%'); pct != std::string::npos && pct >= 3)
                state_.percent = std::atof(l.substr(pct - 3, 3).c_str());
            return;
        }
        state_.lines.push_back(l);
        if (state_.lines.size() > 8) state_.lines.erase(state_.lines.begin());
    }

    pid_t pid_ = -1;
    std::thread reader_;
    std::mutex mu_;
    State state_;
};

// GET `path` from 127.0.0.1:port (HTTP/1.0, the whole answer): the body, or "" when it did not answer 200.
std::string http_get(int port, const std::string &path, const std::string &api_key) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return "";
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof(a)) == 0) {
        std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n";
        if (!api_key.empty()) req += "Authorization: Bearer " + api_key + "\r\n";
        req += "\r\n";
        if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
            char chunk[16384];
            for (ssize_t n; (n = recv(fd, chunk, sizeof(chunk), 0)) > 0;)
                out.append(chunk, static_cast<size_t>(n));
        }
    }
    close(fd);
    const size_t body = out.find("\r\n\r\n");
    if (out.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) return "";
    return out.substr(body + 4);
}

// ---- the nodes, the plan --------------------------------------------------------------------------------

struct Node {
    std::string address;
    bool head = false;  // the head's own node (--head-node): a worker in this process, listed as "head node"
    std::string name;
    std::string cluster;
    int cores = 0;
    uint64_t mem_free = 0;
    double gflops = 0.0;
    double rtt_s = 0.0;  // the last measured small round trip (0: not yet)
    bool usable = true;
    std::string reason;
};

struct Shared {
    std::mutex mu;
    std::vector<Node> nodes;
    std::string nodes_note;  // "looking on the LAN ..." or an error
    std::string plan_note;   // "measuring ..." or an error
    std::unique_ptr<cluster::Plan> plan;
    std::vector<std::string> plan_workers;  // the workers the plan measured
    std::atomic<bool> quit{false};
    std::atomic<bool> replan{true};    // measure (again) once the nodes are there
    std::atomic<bool> serving{false};  // the server runs: no more plans (their probes would disturb it)
    cluster::ModelShape shape;         // the model chosen now (the plan is for it)
    uint64_t model_gen = 0;            // bumped when the user picks another model
};

// The models `up` offers without -m: *.gguf in the current folder and in tandem's model cache.
std::vector<std::string> find_models() {
    std::vector<std::string> out;
    for (const std::string &dir : {std::string("."), tandem_cache_dir() + "/models"}) {
        std::error_code ec;
        for (const auto &e : std::filesystem::directory_iterator(dir, ec))
            if (e.is_regular_file(ec) && e.path().extension() == ".gguf") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
}

Result<cluster::ModelShape> load_shape(const std::string &path) {
    TD_ASSIGN_OR_RETURN(gguf::File file, gguf::File::open(path));
    auto shape = cluster::model_shape_from_file(file);
    if (!shape.ok()) return shape.status().with_context(path);
    return shape;
}

std::string fmt_rtt(double s) {
    if (s <= 0) return "-";
    return s < 1e-3 ? fmt::format("{:.0f} us", s * 1e6) : fmt::format("{:.2f} ms", s * 1e3);
}

std::vector<std::string> usable_addresses(const std::vector<Node> &nodes) {
    std::vector<std::string> out;
    for (const Node &n : nodes)
        if (n.usable) out.push_back(n.address);
    return out;
}

// Looks for the nodes (discovery, or the --workers list), measures each one's round trip, and measures the
// cluster for the plan when asked; until quit.
// head: the head's own node's address ("" without --head-node), first in every list.
void scout(const UpOptions &opt, const net::ClusterSecret &secret, const std::string &head, Shared &sh) {
    std::vector<std::string> fixed;
    if (!opt.workers.empty()) {
        auto list = cluster::parse_worker_list(opt.workers);
        if (list.ok()) fixed = *list;
    }
    while (!sh.quit) {
        std::vector<Node> nodes;
        if (!head.empty()) {
            Node n;
            n.address = head;
            n.head = true;
            nodes.push_back(n);
        }
        if (!fixed.empty()) {
            for (const std::string &a : fixed) {
                Node n;
                n.address = a;
                nodes.push_back(n);
            }
        } else {
            cluster::DiscoverOptions o;
            o.cluster_name = opt.discover.cluster;
            o.window = std::chrono::milliseconds(1500);
            auto found = cluster::discover_workers(o);
            if (!found.ok()) {
                std::lock_guard lock(sh.mu);
                sh.nodes_note = found.status().message();
            } else {
                for (const cluster::FoundWorker &f : *found) {
                    Node n;
                    n.address = f.service.endpoint();
                    n.name = f.service.get("node");
                    n.cluster = f.service.get("cluster");
                    n.usable = f.usable;
                    n.reason = f.reason;
                    nodes.push_back(n);
                }
            }
        }
        // What each usable node says of itself, and a round trip measured now.
        for (Node &n : nodes) {
            if (!n.usable || sh.quit) continue;
            auto c = cluster::ProbeClient::connect(n.address, secret, 2000);
            if (!c.ok()) {
                n.usable = false;
                n.reason = c.status().message();
                continue;
            }
            const net::HelloReply &h = (*c)->hello();
            if (n.name.empty() && h.node_name != n.address && !n.head) n.name = h.node_name;
            n.cores = static_cast<int>(h.n_threads);
            n.mem_free = h.mem_available;
            n.gflops = h.gflops;
            cluster::LinkOptions lo;
            lo.rtt_sizes = {64};
            lo.budget_ms = 30;
            auto s = (*c)->measure_link(lo);
            if (s.ok() && !s->empty()) n.rtt_s = s->front().p50;
        }
        const std::vector<std::string> usable = usable_addresses(nodes);
        {
            std::lock_guard lock(sh.mu);
            // A node that joined or left makes the plan stale.
            if (usable != sh.plan_workers && !usable.empty()) sh.replan = true;
            sh.nodes = std::move(nodes);
            if (fixed.empty() && sh.nodes_note.find("mdns") == std::string::npos)
                sh.nodes_note = fmt::format("on the LAN, cluster '{}' (mDNS)", opt.discover.cluster);
            else if (!fixed.empty())
                sh.nodes_note = "given with --workers";
        }
        const int wanted = std::max(opt.discover.min_workers, 1);
        if (sh.replan && !sh.serving && static_cast<int>(usable.size()) >= wanted) {
            sh.replan = false;
            cluster::ModelShape shape;
            uint64_t gen = 0;
            {
                std::lock_guard lock(sh.mu);
                shape = sh.shape;
                gen = sh.model_gen;
                sh.plan_note =
                    fmt::format("measuring {} workers and their links for the plan ...", usable.size());
            }
            cluster::PlanOptions po;
            po.head_node = !head.empty();
            po.batches = {std::max(opt.parallel, 1)};
            po.probe_ms = 10;
            po.rounds = 1;
            po.link_ms = 50;
            auto spec = cluster::measure_cluster(usable, shape, po, secret, [&](const std::string &p) {
                std::lock_guard lock(sh.mu);
                sh.plan_note = p;
            });
            std::lock_guard lock(sh.mu);
            if (gen != sh.model_gen) {
                sh.replan = true;  // another model was picked meanwhile
            } else if (!spec.ok()) {
                sh.plan_note = "cannot measure: " + spec.status().message();
            } else {
                sh.plan = std::make_unique<cluster::Plan>(cluster::make_plan(shape, *spec, po));
                sh.plan_workers = usable;
                sh.plan_note.clear();
            }
        }
        for (int i = 0; i < 20 && !sh.quit; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
}

// The plan's candidates for the server's batch, fastest first (only those that fit).
std::vector<cluster::PlanEntry> plan_entries(const cluster::Plan &plan, int *recommended) {
    std::vector<cluster::PlanEntry> out;
    *recommended = 0;
    if (plan.batches.empty()) return out;
    const cluster::PlanBatch &b = plan.batches.front();
    for (size_t i = 0; i < b.entries.size(); ++i) {
        if (!b.entries[i].prediction.fits) continue;
        if (static_cast<int>(i) == b.recommended) *recommended = static_cast<int>(out.size());
        out.push_back(b.entries[i]);
    }
    return out;
}

// The entry --pick names: the recommendation, or the fastest of a kind; -1 when no layout of that kind fits.
int picked_index(const std::vector<cluster::PlanEntry> &entries, int recommended, const std::string &pick) {
    if (pick == "recommended") return recommended;
    const std::string kind = pick == "one-node" ? "one node" : pick == "tp" ? "tensor parallel" : pick;
    for (size_t i = 0; i < entries.size(); ++i)
        if (entries[i].layout.kind() == kind) return static_cast<int>(i);
    return -1;
}

std::vector<std::string> split_words(const std::string &s) {
    std::vector<std::string> out;
    std::istringstream in(s);
    for (std::string w; in >> w;) out.push_back(w);
    return out;
}

// The API key the server will ask for, from the flags passed to it after `--` (--api-key K, --api-key=K,
// --api-key-file F, --api-key-file=F): up sends it when it reads /status. "" when none is given.
Result<std::string> serve_api_key(const std::vector<std::string> &args) {
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        const auto value = [&](const std::string &flag) -> std::optional<std::string> {
            if (a == flag && i + 1 < args.size()) return args[i + 1];
            if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
            return std::nullopt;
        };
        if (auto k = value("--api-key")) return *k;
        if (auto f = value("--api-key-file")) return read_api_key_file(*f);
    }
    return std::string();
}

std::vector<std::string> serve_args(const UpOptions &opt, const std::string &model,
                                    const std::string &layout_flags) {
    std::vector<std::string> a = {"serve",
                                  "-m",
                                  model,
                                  "--host",
                                  opt.host,
                                  "--port",
                                  std::to_string(opt.port),
                                  "--parallel",
                                  std::to_string(opt.parallel)};
    for (const std::string &w : split_words(layout_flags)) a.push_back(w);
    if (!opt.secret_file.empty()) a.insert(a.end(), {"--secret-file", opt.secret_file});
    a.insert(a.end(), opt.serve_args.begin(), opt.serve_args.end());
    return a;
}

// ---- the screen -----------------------------------------------------------------------------------------

class Screen {
public:
    Screen() {
        initscr();
        cbreak();
        noecho();
        keypad(stdscr, TRUE);
        curs_set(0);
        timeout(100);  // getch waits at most 100 ms: the screen redraws ten times a second
        if (has_colors()) {
            start_color();
            use_default_colors();
            init_pair(1, COLOR_GREEN, -1);
            init_pair(2, COLOR_RED, -1);
            init_pair(3, COLOR_CYAN, -1);
        }
    }
    ~Screen() { endwin(); }
    int row = 0;
    void line(const std::string &text, int color = 0, bool bold = false) {
        if (row >= LINES) return;
        if (color) attron(COLOR_PAIR(color));
        if (bold) attron(A_BOLD);
        mvaddnstr(row++, 0, text.c_str(), COLS - 1);
        if (bold) attroff(A_BOLD);
        if (color) attroff(COLOR_PAIR(color));
    }
    void bar(double fraction, const std::string &label) {
        const int width = std::clamp(COLS - 20, 10, 60);
        const int fill = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * width);
        line(fmt::format("  [{}{}] {:3.0f}%  {}", std::string(static_cast<size_t>(fill), '#'),
                         std::string(static_cast<size_t>(width - fill), '.'), fraction * 100, label),
             3);
    }
};

int up_main(const UpOptions &opt_in) {
    UpOptions opt = opt_in;
    if (!opt.workers.empty() && opt.discover.discover)
        return fail(invalid_input("give --workers or --discover, not both"));
    if (opt.workers.empty()) opt.discover.discover = true;  // up finds its workers unless told
    std::vector<std::string> models;
    if (!opt.model.empty()) {
        auto path = resolve_model(opt.model);
        if (!path.ok()) return fail(path.status());
        models.push_back(*path);
    } else {
        models = find_models();
        if (models.empty())
            return fail(invalid_input("no model: give -m MODEL (no .gguf in this folder or {}/models)",
                                      tandem_cache_dir()));
    }
    size_t model_index = 0;
    std::string model_note;
    auto shape = load_shape(models[0]);
    if (!shape.ok()) return fail(shape.status());
    auto secret = load_cluster_secret(opt.secret_file);
    if (!secret.ok()) return fail(secret.status());
    auto api_key = serve_api_key(opt.serve_args);
    if (!api_key.ok()) return fail(api_key.status());
    const bool tty = isatty(STDOUT_FILENO) && isatty(STDIN_FILENO);
    if (!tty && !opt.yes)
        return fail(
            invalid_input("tandem up needs a terminal to ask; give --yes to start the recommended layout"));

    // --head-node: this machine measured as a node (the server it starts makes its own).
    std::unique_ptr<cluster::LocalWorker> head;
    std::string head_address;
    if (opt.head_node) {
        auto h = start_head_node(0, *secret, net::auto_transports());
        if (!h.ok()) return fail(h.status());
        head = std::move(h).value();
        head_address = head->address();
    }

    Shared sh;
    sh.shape = *shape;
    std::thread scout_thread([&] { scout(opt, *secret, head_address, sh); });
    ServeChild server;
    bool started = false;
    std::string start_error;
    int selected = -1;
    const auto t0 = Clock::now();
    json status;
    auto t_status = Clock::now();
    std::string printed_progress;

    const auto start = [&](const cluster::PlanEntry &e, const cluster::ClusterSpec &spec) {
        const std::vector<std::string> args = serve_args(opt, models[model_index], e.layout.flags(spec));
        std::string cmd = "tandem";
        for (const std::string &a : args) cmd += " " + a;
        if (!tty) std::fprintf(stderr, "tandem up: starting %s\n", cmd.c_str());
        sh.serving = true;
        if (Status s = server.start(args); !s.ok()) start_error = s.message();
        started = true;
    };

    std::unique_ptr<Screen> screen;
    if (tty) screen = std::make_unique<Screen>();
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) std::signal(sig, on_signal);
    bool said_ready = false;
    bool plan_printed = false;
    int exit_code = 0;
    for (;;) {
        const int key = tty ? getch() : ERR;
        if (!tty) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        if (key == 'q' || key == 'Q' || g_signalled) break;
        if (!tty && server.exited() && started) break;

        std::vector<Node> nodes;
        std::string nodes_note, plan_note;
        std::vector<cluster::PlanEntry> entries;
        int recommended = 0;
        cluster::ClusterSpec spec;
        {
            std::lock_guard lock(sh.mu);
            nodes = sh.nodes;
            nodes_note = sh.nodes_note;
            plan_note = sh.plan_note;
            if (sh.plan) {
                entries = plan_entries(*sh.plan, &recommended);
                spec = sh.plan->cluster;
            }
        }
        const int picked = entries.empty() ? -1 : picked_index(entries, recommended, opt.pick);
        if (selected < 0 || selected >= static_cast<int>(entries.size()))
            selected = entries.empty() ? -1 : picked >= 0 ? picked : recommended;
        if (!entries.empty() && picked < 0 && opt.yes && !started) {
            // Nothing to start: say so (the plan's lines above say what fits) instead of starting another
            // layout.
            if (!tty) {
                std::fprintf(
                    stderr, "tandem up: no %s layout fits these nodes; --pick recommended starts %s\n",
                    opt.pick.c_str(), entries[static_cast<size_t>(recommended)].layout.label().c_str());
                exit_code = 1;
                break;
            }
            plan_note =
                fmt::format("no {} layout fits these nodes (--pick); choose one and press Enter", opt.pick);
        }
        if (!started && models.size() > 1 && (key == KEY_LEFT || key == KEY_RIGHT)) {
            const size_t next = (model_index + (key == KEY_RIGHT ? 1 : models.size() - 1)) % models.size();
            auto loaded = load_shape(models[next]);
            if (!loaded.ok()) {
                model_note = loaded.status().message();
            } else {
                model_index = next;
                model_note.clear();
                shape = std::move(loaded);
                std::lock_guard lock(sh.mu);
                sh.shape = *shape;
                sh.model_gen++;
                sh.plan.reset();
                sh.replan = true;
                continue;
            }
        }
        if (!started && !entries.empty()) {
            if (key == KEY_UP && selected > 0) --selected;
            if (key == KEY_DOWN && selected + 1 < static_cast<int>(entries.size())) ++selected;
            if (key == 'p') sh.replan = true;
            if (key == '\n' || key == KEY_ENTER || (opt.yes && picked >= 0))
                start(entries[static_cast<size_t>(key == '\n' || key == KEY_ENTER ? selected : picked)],
                      spec);
        }
        const ServeChild::State ss = server.state();
        if (started && ss.ready && ss.port > 0 && Clock::now() - t_status > std::chrono::milliseconds(900)) {
            t_status = Clock::now();
            const std::string body = http_get(ss.port, "/status", *api_key);
            json j = json::parse(body, nullptr, false);
            if (j.is_object()) status = std::move(j);
        }

        if (!tty) {
            // Plain lines: the plan once, the load progress, then the server's own lines.
            if (!plan_printed && !entries.empty()) {
                plan_printed = true;
                std::fprintf(stderr, "tandem up: %zu usable nodes of %zu found\n",
                             usable_addresses(nodes).size(), nodes.size());
                for (const Node &n : nodes)
                    std::fprintf(stderr, "  %-22s %s\n", n.head ? "head node" : n.address.c_str(),
                                 n.usable ? "usable" : ("not used: " + n.reason).c_str());
                std::fprintf(stderr, "tandem up: predicted for %d streams:\n", opt.parallel);
                for (size_t i = 0; i < entries.size(); ++i)
                    std::fprintf(stderr, "  %-28s %10.1f tok/s generation  %s%s\n",
                                 entries[i].layout.label().c_str(),
                                 entries[i].prediction.gen.tokens_per_s * opt.parallel,
                                 entries[i].layout.flags(spec).c_str(),
                                 static_cast<int>(i) == recommended ? "  (recommended)" : "");
            }
            if (ss.progress != printed_progress && ss.percent >= 100) {
                printed_progress = ss.progress;
                std::fprintf(stderr, "%s\n", ss.progress.c_str());
            }
            if (ss.ready && !said_ready) {
                said_ready = true;
                std::fprintf(stderr, "tandem up: server ready at http://%s:%d/ (dashboard and OpenAI API)\n",
                             opt.host.c_str(), ss.port);
            }
            if (ss.gone) break;
            continue;
        }

        erase();
        screen->row = 0;
        screen->line(
            fmt::format("tandem up  {}  model {}", started ? "[q] stop the server and quit" : "[q] quit",
                        std::filesystem::path(models[model_index]).filename().string()),
            0, true);
        screen->line(fmt::format(
            "  {} layers, {}{}{}", shape->hp.n_layer, human_bytes(static_cast<double>(shape->total_bytes())),
            models.size() > 1 && !started
                ? fmt::format("   [Left/Right] model {} of {}", model_index + 1, models.size())
                : "",
            model_note.empty() ? "" : "   " + model_note));
        screen->row++;
        screen->line(fmt::format("Nodes  ({})", nodes_note), 0, true);
        screen->line(fmt::format("  {:<22} {:<14} {:>5} {:>12} {:>9} {:>10}  {}", "address", "node", "cores",
                                 "free mem", "GFLOP/s", "link rtt", "status"));
        for (const Node &n : nodes)
            screen->line(fmt::format("  {:<22} {:<14} {:>5} {:>12} {:>9.1f} {:>10}  {}",
                                     n.head ? "head node" : n.address,
                                     n.name.empty() ? std::string("-") : n.name.substr(0, 14), n.cores,
                                     n.mem_free ? cluster::fmt_gib(n.mem_free) : "-", n.gflops,
                                     fmt_rtt(n.rtt_s), n.usable ? "usable" : "not used: " + n.reason),
                         n.usable ? 1 : 2);
        if (nodes.empty())
            screen->line(fmt::format("  (none yet, {:.0f} s)",
                                     std::chrono::duration<double>(Clock::now() - t0).count()));
        screen->row++;
        screen->line(fmt::format("Plan  (predicted tokens/s for {} streams at once)", opt.parallel), 0, true);
        if (!plan_note.empty()) screen->line("  " + plan_note);
        for (size_t i = 0; i < entries.size(); ++i) {
            const auto &e = entries[i];
            const bool sel = static_cast<int>(i) == selected;
            screen->line(fmt::format("{} {:<30} {:>10.1f} tok/s  {:<16} {}{}", sel ? " >" : "  ",
                                     e.layout.label(), e.prediction.gen.tokens_per_s * opt.parallel,
                                     e.layout.kind(), e.layout.flags(spec),
                                     static_cast<int>(i) == recommended ? "  (recommended)" : ""),
                         sel ? 3 : 0, sel);
        }
        if (!started && !entries.empty())
            screen->line("  [Up/Down] choose  [Enter] start the server with it  [p] measure again");
        if (started) {
            screen->row++;
            if (!start_error.empty()) {
                screen->line("Server: " + start_error, 2, true);
            } else if (ss.gone) {
                screen->line(fmt::format("Server: exited ({})", ss.exit_code), 2, true);
                for (const std::string &l : ss.lines) screen->line("  " + l, 2);
            } else if (!ss.ready) {
                screen->line("Server: loading", 0, true);
                screen->bar(ss.percent / 100.0, ss.progress.empty()
                                                    ? "starting"
                                                    : ss.progress.substr(ss.progress.find("streaming")));
            } else {
                screen->line(fmt::format("Server: running at http://{}:{}/  (dashboard and OpenAI API)",
                                         opt.host, ss.port),
                             1, true);
                const json &s = status.value("server", json::object());
                const json &fin = s.value("requests_finished", json::object());
                screen->line(fmt::format(
                    "  tokens/s {:.1f}   requests done {}  failed {}   queue {}   slots busy {}/{}   "
                    "tokens generated {}",
                    s.value("tokens_per_second", 0.0), fin.value("stop", 0) + fin.value("length", 0),
                    fin.value("error", 0), s.value("queue_depth", 0), s.value("slots_active", 0),
                    s.value("slots_total", 0), s.value("generated_tokens", 0)));
                screen->line("  layout " + status.value("layout", std::string("-")));
                for (const json &n : status.value("engine", json::object()).value("nodes", json::array()))
                    screen->line(fmt::format("  {:<22} layers {}-{}  steps {}  step {:.0f} us",
                                             n.value("address", ""), n["layers"][0].get<int>(),
                                             n["layers"][1].get<int>(), n.value("forward_steps", 0),
                                             n.value("step_latency_seconds", 0.0) * 1e6));
            }
        }
        refresh();
    }
    sh.quit = true;
    server.stop();
    scout_thread.join();
    screen.reset();
    const ServeChild::State ss = server.state();
    if (!tty && started && ss.exit_code != 0 && ss.exit_code != -1) {
        for (const std::string &l : ss.lines) std::fprintf(stderr, "%s\n", l.c_str());
        return 1;
    }
    return exit_code;
}

}  // namespace

void register_up(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<UpOptions>();
    CLI::App *cmd = app.add_subcommand("up",
                                       "A cluster in one command: find the workers, rank the layouts by "
                                       "predicted tokens/s, start the server");
    cmd->add_option("-m,--model", opt->model,
                    "Model file (.gguf); without it, choose among those in this folder and the model cache");
    cmd->add_option("--workers", opt->workers,
                    "Use these workers (HOST:PORT,...) instead of finding them on the LAN");
    add_discover_flags(cmd, opt->discover);
    cmd->add_flag("-y,--yes", opt->yes,
                  "Start the --pick layout (the recommended one) without asking (also without a terminal)");
    cmd->add_option("--pick", opt->pick,
                    "The layout --yes starts and the one selected at first: recommended, or the fastest "
                    "one-node, pipeline, tp or hybrid layout")
        ->default_val("recommended")
        ->check(CLI::IsMember({"recommended", "one-node", "pipeline", "tp", "hybrid"}));
    cmd->add_flag("--head-node", opt->head_node,
                  "This machine is a node too: measured with the others and offered as the first node of "
                  "the layouts (serve --head-node)");
    cmd->add_option("--host", opt->host, "Address the server listens on")->default_val("127.0.0.1");
    cmd->add_option("--port", opt->port, "Port the server listens on (0: any free one)")->default_val(8080);
    cmd->add_option("--parallel", opt->parallel, "Requests served at once (the plan predicts for this many)")
        ->default_val(4);
    add_secret_flag(cmd, opt->secret_file);
    cmd->add_option("serve-args", opt->serve_args,
                    "After --: more flags for tandem serve (--api-key-file F ...)");
    runners.push_back([cmd, opt] { return cmd->parsed() ? up_main(*opt) : -1; });
}

}  // namespace td::cli
