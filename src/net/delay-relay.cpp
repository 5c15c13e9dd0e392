#include "net/delay-relay.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "net/transport.h"

namespace td::net {
namespace {

using Clock = std::chrono::steady_clock;

int dial(const std::string &target) {
    std::string host;
    uint16_t port = 0;
    if (!parse_host_port(target, &host, &port).ok()) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (host == "localhost") host = "127.0.0.1";
    if (inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) return -1;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        close(fd);
        return -1;
    }
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

// One direction: bytes read from `in` go out on `out` delay later. An empty chunk is the end of the stream.
struct Pipe {
    struct Chunk {
        Clock::time_point due;
        std::vector<uint8_t> bytes;
    };
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Chunk> q;
    bool done = false;
};

}  // namespace

struct DelayRelay::Impl {
    int listen_fd = -1;
    uint16_t port = 0;
    std::string host;
    std::string target;
    std::atomic<int64_t> delay_us{0};
    std::atomic<bool> stopping{false};
    std::atomic<bool> garbling{false};
    std::thread acceptor;
    std::mutex mu;
    std::vector<int> fds;  // every relayed socket, shut down by stop()
    std::list<std::thread> threads;

    void pump(int in, int out, std::shared_ptr<Pipe> p, bool from_target) {
        std::thread writer([in, out, p] {
            for (;;) {
                Pipe::Chunk c;
                {
                    std::unique_lock lock(p->mu);
                    p->cv.wait(lock, [&] { return !p->q.empty() || p->done; });
                    if (p->q.empty()) break;
                    c = std::move(p->q.front());
                    p->q.pop_front();
                }
                if (c.bytes.empty()) break;  // end of stream
                std::this_thread::sleep_until(c.due);
                size_t off = 0;
                while (off < c.bytes.size()) {
                    const ssize_t n = send(out, c.bytes.data() + off, c.bytes.size() - off, MSG_NOSIGNAL);
                    if (n <= 0) {  // the far side is gone: stop reading this direction too
                        std::lock_guard lock(p->mu);
                        p->done = true;
                        p->q.clear();
                        (void)shutdown(in, SHUT_RD);
                        break;
                    }
                    off += static_cast<size_t>(n);
                }
            }
            (void)shutdown(out, SHUT_WR);
        });
        std::vector<uint8_t> buf(256 << 10);
        for (;;) {
            const ssize_t n = recv(in, buf.data(), buf.size(), 0);
            std::lock_guard lock(p->mu);
            if (p->done) break;
            if (n <= 0) {
                p->q.push_back({Clock::now(), {}});
                p->cv.notify_one();
                break;
            }
            p->q.push_back({Clock::now() + std::chrono::microseconds(delay_us.load()),
                            std::vector<uint8_t>(buf.begin(), buf.begin() + n)});
            if (from_target && garbling.load())
                for (uint8_t &b : p->q.back().bytes) b = static_cast<uint8_t>(~b);
            p->cv.notify_one();
        }
        writer.join();
        (void)shutdown(in, SHUT_RD);
    }

    void serve() {
        while (!stopping) {
            pollfd pfd{listen_fd, POLLIN, 0};
            if (poll(&pfd, 1, 200) <= 0) continue;
            const int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            const int one = 1;
            (void)setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            const int t = dial(target);
            if (t < 0) {
                close(c);
                continue;
            }
            std::lock_guard lock(mu);
            fds.push_back(c);
            fds.push_back(t);
            auto left =
                std::make_shared<std::atomic<int>>(2);  // the last direction to end closes both sockets
            auto finish = [this, c, t, left] {
                if (--*left > 0) return;
                std::lock_guard lock(mu);
                if (stopping) return;  // stop() closes them
                std::erase(fds, c);
                std::erase(fds, t);
                close(c);
                close(t);
            };
            threads.emplace_back([this, c, t, finish] {
                pump(c, t, std::make_shared<Pipe>(), false);
                finish();
            });
            threads.emplace_back([this, c, t, finish] {
                pump(t, c, std::make_shared<Pipe>(), true);
                finish();
            });
        }
    }
};

Result<std::unique_ptr<DelayRelay>> DelayRelay::start(const std::string &listen_host, uint16_t listen_port,
                                                      const std::string &target, int64_t delay_us) {
    std::unique_ptr<DelayRelay> r(new DelayRelay());
    r->impl_ = std::make_unique<Impl>();
    Impl &m = *r->impl_;
    m.target = target;
    m.delay_us = delay_us;
    m.host = listen_host == "localhost" ? "127.0.0.1" : listen_host;
    std::string th;
    uint16_t tp = 0;
    TD_TRY(parse_host_port(target, &th, &tp).with_context("relay target"));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(listen_port);
    if (inet_pton(AF_INET, m.host.c_str(), &a.sin_addr) != 1)
        return invalid_input("relay: '{}' is not an IPv4 address", listen_host);
    m.listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const int one = 1;
    (void)setsockopt(m.listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (m.listen_fd < 0 || bind(m.listen_fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0 ||
        listen(m.listen_fd, 64) != 0)
        return make_error(ErrorKind::io, "relay: cannot listen on {}:{}: {}", m.host, listen_port,
                          std::strerror(errno));
    socklen_t len = sizeof a;
    getsockname(m.listen_fd, reinterpret_cast<sockaddr *>(&a), &len);
    m.port = ntohs(a.sin_port);
    m.acceptor = std::thread([&m] { m.serve(); });
    return r;
}

DelayRelay::~DelayRelay() {
    stop();
}

void DelayRelay::stop() {
    if (!impl_ || impl_->stopping.exchange(true)) return;
    if (impl_->acceptor.joinable()) impl_->acceptor.join();
    close(impl_->listen_fd);
    std::list<std::thread> threads;
    {
        std::lock_guard lock(impl_->mu);
        for (int fd : impl_->fds) (void)shutdown(fd, SHUT_RDWR);
        threads.swap(impl_->threads);
    }
    for (auto &t : threads) t.join();
    for (int fd : impl_->fds) close(fd);
}

uint16_t DelayRelay::port() const {
    return impl_->port;
}

std::string DelayRelay::address() const {
    return impl_->host + ":" + std::to_string(impl_->port);
}

void DelayRelay::cut() {
    std::lock_guard lock(impl_->mu);
    for (int fd : impl_->fds) (void)shutdown(fd, SHUT_RDWR);
}

void DelayRelay::garble(bool on) {
    impl_->garbling = on;
}

void DelayRelay::set_delay_us(int64_t delay_us) {
    impl_->delay_us = delay_us;
}

}  // namespace td::net
