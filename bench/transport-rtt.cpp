// Round-trip latency of one message, over each transport between two processes of this host: a child process
// echoes every frame back, this process times ping-pongs. Connections open as the cluster's do (TCP, the
// authenticated handshake, then the transport the Hello asks for), so the numbers are the engine's own links.
//
// Rounds rotate the transports (tcp, shm, ucx; then shm, ucx, tcp; ...) so all see the same host minute to
// minute; each round's figure is the median of its round trips, the result the median over the rounds and the
// median of the per-round ratios to tcp. ucx is UCX with the transports it picks itself (on one host: its
// shared memory). Receive modes: sleeping at once (the links' default: in poll for TCP, on a futex for
// shm, on UCX's event fd; then every round trip pays two wake-ups of a sleeping core) and spinning 200 us
// before sleeping (what the all-reduce does: what the transport itself costs). Both sides receive as the
// all-reduce does (Connection::recv_view: over shm a small frame is read where it landed in the ring, no copy
// out), and this side reads every cache line of each reply, so no transport is timed without its data
// arriving. A third mode spins but copies every frame out at both ends (Connection::recv), as every receive
// did before recv_view.
//
//   transport-rtt [ROUNDS] [TRIPS_PER_ROUND]
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "cluster/handshake.h"
#include "cluster/node-info.h"
#include "cluster/wire.h"
#include "net/auth.h"
#include "net/shm.h"
#include "net/transport.h"
#include "net/ucx.h"

using namespace td;
using Clock = std::chrono::steady_clock;

namespace {

const net::ClusterSecret &secret() {
    static const net::ClusterSecret s =
        net::ClusterSecret::from_bytes("transport-rtt bench: a throwaway secret");
    return s;
}

constexpr uint32_t kCopyOut = 1u << 20;  // Hello.rank's flag: receive with recv(), not recv_view()

// One frame's payload: copied out into scratch (recv) or read in place where the link can (recv_view).
Result<std::span<const uint8_t>> receive(net::Connection &c, net::FrameHeader &h,
                                         std::vector<uint8_t> &scratch, int timeout_ms, bool copy_out) {
    if (!copy_out) return c.recv_view(h, scratch, timeout_ms);
    TD_TRY(c.recv(h, scratch, timeout_ms));
    return std::span<const uint8_t>(scratch);
}

// The echo side: every connection on its own thread, each frame sent back as it came.
[[noreturn]] void serve(net::Listener &listener) {
    std::vector<std::thread> threads;
    for (;;) {
        auto c = listener.accept(-1);
        if (!c.ok()) _exit(0);
        threads.emplace_back([conn = std::move(c).value()]() mutable {
            auto hello = cluster::handshake_accept(*conn, secret(), "echo");
            if (!hello.ok()) return;
            auto up =
                cluster::answer_hello(std::move(conn), *hello, net::HelloReply{}, net::built_transports());
            if (!up.ok()) return;
            std::unique_ptr<net::Connection> link = std::move(up).value();
            // The client's receive mode, passed in Hello.rank: the spin, and kCopyOut.
            const bool copy_out = (hello->rank & kCopyOut) != 0;
            link->set_recv_spin_us(static_cast<int>(hello->rank & ~kCopyOut));
            net::FrameHeader h;
            std::vector<uint8_t> scratch;
            for (;;) {
                auto got = receive(*link, h, scratch, -1, copy_out);
                if (!got.ok() || !link->send_msg(net::MsgType::echo_reply, h.request_id, *got).ok()) break;
                link->release_view();
            }
        });
        threads.back().detach();
    }
}

struct Link {
    std::unique_ptr<net::Connection> conn;
    bool copy_out = false;
};

Link dial(uint16_t port, net::Transport want, int spin_us, bool copy_out) {
    net::Hello hello;
    hello.role = net::ConnRole::probe;
    hello.build_id = cluster::build_id();
    hello.node_name = "transport-rtt";
    hello.transports = net::kTransportsTcp | net::transport_bit(want);
    hello.rank = static_cast<uint32_t>(spin_us) | (copy_out ? kCopyOut : 0);
    auto d = cluster::dial_node("127.0.0.1:" + std::to_string(port), hello, secret(), 3000);
    if (!d.ok()) {
        std::fprintf(stderr, "transport-rtt: %s\n", d.status().message().c_str());
        std::exit(1);
    }
    if (d->conn->transport() != want) {
        std::fprintf(stderr, "transport-rtt: asked for %s, got %s\n", net::transport_name(want),
                     net::transport_name(d->conn->transport()));
        std::exit(1);
    }
    d->conn->set_recv_spin_us(spin_us);
    return {std::move(d->conn), copy_out};
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

// The median round trip in microseconds of `trips` ping-pongs of `bytes` (after a few unmeasured).
double round_trips(net::Connection &c, size_t bytes, int trips, bool copy_out) {
    std::vector<uint8_t> out(bytes, 0x5a), scratch;
    net::FrameHeader h;
    std::vector<double> us;
    unsigned seen = 0;
    for (int i = -20; i < trips; ++i) {
        const auto t0 = Clock::now();
        if (!c.send_msg(net::MsgType::echo, static_cast<uint64_t>(i + 100), out).ok()) std::exit(1);
        auto got = receive(c, h, scratch, 5000, copy_out);
        if (!got.ok() || got->size() != bytes) {
            std::fprintf(stderr, "transport-rtt: the echo failed\n");
            std::exit(1);
        }
        for (size_t k = 0; k < bytes; k += 64)
            seen += (*got)[k];  // every line of the reply reaches this core
        c.release_view();
        if (i >= 0) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (seen != 0x5au * static_cast<unsigned>((bytes + 63) / 64) * static_cast<unsigned>(trips + 20)) {
        std::fprintf(stderr, "transport-rtt: the echo's bytes differ from what was sent\n");
        std::exit(1);
    }
    return median(us);
}

}  // namespace

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 15;
    const int trips = argc > 2 ? std::max(10, std::atoi(argv[2])) : 400;
    auto listener = net::tcp_listen("127.0.0.1", 0);
    if (!listener.ok()) {
        std::fprintf(stderr, "transport-rtt: %s\n", listener.status().message().c_str());
        return 1;
    }
    const uint16_t port = (*listener)->port();
    // Two nodes on two cores, as a cluster on one host runs: the echo on the last core, this process on the
    // first (where the scheduler would otherwise put both on one core now and then, and a sleeping side's
    // wake-up costs a reschedule instead of waking another core: 5 against 60-80 us on this VM).
    const int n_cpus = static_cast<int>(std::thread::hardware_concurrency());
    const auto pin = [](int cpu) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        (void)sched_setaffinity(0, sizeof set, &set);
    };
    const pid_t child = fork();  // before any thread exists in this process
    if (child == 0) {
        if (n_cpus > 1) pin(n_cpus - 1);
        serve(**listener);
    }
    if (n_cpus > 1) pin(0);
    listener->reset();  // our copy of the socket; shutting it down would close the child's too

    const size_t sizes[] = {64, 8192};
    const struct {
        const char *name;
        int spin_us;
        bool copy_out;
    } modes[] = {{"sleep at once", 0, false}, {"spin 200 us", 200, false}, {"spin, copy out", 200, true}};
    std::vector<net::Transport> transports = {net::Transport::tcp};
    if (net::shm_supported()) transports.push_back(net::Transport::shm);
    if (net::ucx_supported()) transports.push_back(net::Transport::ucx);
    std::printf("transport-rtt: %d rounds x %d round trips, median per round, median over rounds (ucx: %s)\n",
                rounds, trips,
                net::ucx_supported() ? "UCX's best transport between processes of one host" : "not built");
    std::printf("%-16s %8s", "receive", "bytes");
    for (net::Transport t : transports) std::printf(" %9s us", net::transport_name(t));
    for (size_t i = 1; i < transports.size(); ++i)
        std::printf(" %10s/tcp", net::transport_name(transports[i]));
    std::printf("\n");
    for (const auto &m : modes) {
        std::vector<Link> links;
        for (net::Transport t : transports) links.push_back(dial(port, t, m.spin_us, m.copy_out));
        const size_t n = links.size();
        for (size_t bytes : sizes) {
            std::vector<std::vector<double>> us(n), ratio(n);
            for (int r = 0; r < rounds; ++r) {
                // Each round starts with another transport, so none always goes first.
                std::vector<double> x(n);
                for (size_t k = 0; k < n; ++k) {
                    const size_t i = (k + static_cast<size_t>(r)) % n;
                    x[i] = round_trips(*links[i].conn, bytes, trips, m.copy_out);
                }
                for (size_t i = 0; i < n; ++i) {
                    us[i].push_back(x[i]);
                    ratio[i].push_back(x[i] / x[0]);
                }
            }
            std::printf("%-16s %8zu", m.name, bytes);
            for (size_t i = 0; i < n; ++i) std::printf(" %12.2f", median(us[i]));
            for (size_t i = 1; i < n; ++i) std::printf(" %14.3f", median(ratio[i]));
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    ::kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    return 0;
}
