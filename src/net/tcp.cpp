// TCP transport: framed connections, a listener, connect with a timeout.
//
// Every socket is non-blocking and every wait is a poll() with the time left until the call's deadline, so
// timeouts hold for the whole frame, not per syscall. close() from another thread never closes the fd (the
// number could be reused by an unrelated open() while a poll() still watches it); it shuts the socket down,
// which wakes any poll()/recv() on it, and the destructor closes the fd. A listener wakes accept() with an
// eventfd for the same reason.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>

#include "core/check.h"
#include "net/codec.h"
#include "net/spin.h"
#include "net/transport.h"

namespace td::net {

namespace {

constexpr int kSocketBufferBytes = kTcpSocketBufferBytes;
constexpr size_t kRecvGrowStart = 1u << 20;  // payload buffer growth starts here (see recv)
constexpr size_t kMaxIov = 64;               // header + parts per sendmsg call (the loop sends more)

// The time left of a call's timeout; timeout_ms < 0 waits forever.
class Deadline {
public:
    explicit Deadline(int timeout_ms)
        : forever_(timeout_ms < 0), end_ns_(now_ns() + int64_t{timeout_ms} * 1000000) {}
    // For poll(): -1 forever, else the milliseconds left rounded up (0 once passed).
    int poll_ms() const {
        if (forever_) return -1;
        const int64_t left = end_ns_ - now_ns();
        if (left <= 0) return 0;
        return static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, INT_MAX));
    }
    bool passed() const { return !forever_ && now_ns() >= end_ns_; }

private:
    bool forever_;
    int64_t end_ns_;
};

std::string errno_text(int err) {
    char buf[128];
    return strerror_r(err, buf, sizeof buf);  // GNU strerror_r returns the message
}

std::string sockaddr_string(const sockaddr *sa) {
    char host[INET6_ADDRSTRLEN] = {};
    if (sa->sa_family == AF_INET) {
        const auto *in = reinterpret_cast<const sockaddr_in *>(sa);
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
        return fmt::format("{}:{}", host, ntohs(in->sin_port));
    }
    if (sa->sa_family == AF_INET6) {
        const auto *in6 = reinterpret_cast<const sockaddr_in6 *>(sa);
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
        return fmt::format("[{}]:{}", host, ntohs(in6->sin6_port));
    }
    if (sa->sa_family == AF_UNIX) return "unix";
    return "unknown";
}

std::string peer_name(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "unknown";
    return sockaddr_string(reinterpret_cast<sockaddr *>(&ss));
}

std::string local_name(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "unknown";
    return sockaddr_string(reinterpret_cast<sockaddr *>(&ss));
}

// Buffer sizes go on before connect()/listen() so the window scale is negotiated for them. Best effort: the
// kernel caps them at net.core.{w,r}mem_max, and a UNIX socket has no TCP options.
void set_buffer_options(int fd) {
    const int bytes = kSocketBufferBytes;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
}

// Small frames (tokens, control) must not wait for Nagle; keepalive finds a silently dead peer in about a
// minute (30 s idle, then 3 probes 10 s apart) instead of the system default of two hours.
void set_stream_options(int fd) {
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    const int idle = 30, interval = 10, count = 3;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

bool set_nonblocking(int fd) {
    const int fl = fcntl(fd, F_GETFL, 0);
    return fl >= 0 && fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0;
}

// Resolved addresses, IPv4 first ("localhost" may list ::1 before 127.0.0.1 while a peer listens on IPv4).
Result<std::vector<sockaddr_storage>> resolve(const std::string &host, uint16_t port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    addrinfo *res = nullptr;
    const std::string service = std::to_string(port);
    const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
    if (rc != 0) {
        return make_error(ErrorKind::not_found, "cannot resolve host '{}': {}", host,
                          rc == EAI_SYSTEM ? errno_text(errno) : gai_strerror(rc));
    }
    std::vector<sockaddr_storage> out;
    for (int family : {AF_INET, AF_INET6}) {
        for (addrinfo *ai = res; ai; ai = ai->ai_next) {
            if (ai->ai_family != family || ai->ai_addrlen > sizeof(sockaddr_storage)) continue;
            sockaddr_storage ss{};
            std::memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
            out.push_back(ss);
        }
    }
    freeaddrinfo(res);
    if (out.empty()) return make_error(ErrorKind::not_found, "host '{}' has no IPv4 or IPv6 address", host);
    return out;
}

socklen_t sockaddr_len(const sockaddr_storage &ss) {
    return ss.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

// ---- connection ------------------------------------------------------------------------------------------

class TcpConnection final : public Connection {
public:
    explicit TcpConnection(int fd) : fd_(fd), peer_(peer_name(fd)), local_(local_name(fd)) {}
    ~TcpConnection() override { ::close(fd_); }

    Status send(MsgType type, uint64_t request_id, uint32_t flags,
                std::span<const std::span<const uint8_t>> parts, int timeout_ms) override;
    Status recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms) override;

    void close() override {
        if (!closed_.exchange(true)) (void)::shutdown(fd_, SHUT_RDWR);
    }
    bool is_open() const override { return !closed_ && !peer_gone_; }
    bool readable() const override {
        pollfd p{fd_, POLLIN, 0};
        return ::poll(&p, 1, 0) > 0;
    }
    std::string peer() const override { return peer_; }
    std::string local() const override { return local_; }

private:
    Status closed_status() const {
        return make_error(ErrorKind::disconnected, "connection to {} was closed", peer_);
    }
    Status eof_status() {
        peer_gone_ = true;
        if (closed_) return closed_status();
        return make_error(ErrorKind::disconnected, "peer {} closed the connection", peer_);
    }
    Status errno_status(const char *what, int err) {
        if (closed_) return closed_status();
        if (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ETIMEDOUT || err == EHOSTUNREACH) {
            peer_gone_ = true;
            return make_error(ErrorKind::disconnected, "{} {}: {}", what, peer_, errno_text(err));
        }
        return make_error(ErrorKind::failed, "{} {}: {}", what, peer_, errno_text(err));
    }
    // Waits until fd_ is readable/writable. ok, failed (deadline passed) or disconnected (closed meanwhile).
    Status wait(short events, const Deadline &deadline, bool *timed_out);
    // Reads into buf[*got..n); returns when full, on EOF/error, or at the deadline (*timed_out). Until
    // *spin_end_ns (0: not yet started) it retries instead of sleeping in poll (set_recv_spin_us).
    Status read_some(uint8_t *buf, size_t n, size_t *got, const Deadline &deadline, bool *timed_out,
                     int64_t *spin_end_ns);

    int fd_;
    std::string peer_, local_;
    std::atomic<bool> closed_{false};
    std::atomic<bool> peer_gone_{false};
    std::mutex send_mu_;
    std::mutex recv_mu_;
    Status recv_broken_;  // a malformed header: the stream position is lost, every later recv fails
};

Status TcpConnection::wait(short events, const Deadline &deadline, bool *timed_out) {
    for (;;) {
        if (closed_) return closed_status();
        pollfd p{fd_, events, 0};
        const int rc = ::poll(&p, 1, deadline.poll_ms());
        if (rc > 0) return {};  // ready, or POLLHUP/POLLERR: the next read/write reports which
        if (rc == 0) {
            *timed_out = true;
            return {};
        }
        if (errno != EINTR) return errno_status("poll on connection to", errno);
    }
}

Status TcpConnection::read_some(uint8_t *buf, size_t n, size_t *got, const Deadline &deadline,
                                bool *timed_out, int64_t *spin_end_ns) {
    SpinYield yield;
    while (*got < n) {
        const ssize_t r = ::recv(fd_, buf + *got, n - *got, 0);
        if (r > 0) {
            *got += static_cast<size_t>(r);
            continue;
        }
        if (r == 0) return eof_status();
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("recv from", errno);
        if (recv_spin_ns_ > 0) {
            const int64_t now = now_ns();
            if (*spin_end_ns == 0) *spin_end_ns = now + recv_spin_ns_;
            if (now < *spin_end_ns && !closed_ && !deadline.passed()) {
                yield(now);
                continue;
            }
        }
        TD_TRY(wait(POLLIN, deadline, timed_out));
        if (*timed_out) return {};
    }
    return {};
}

Status TcpConnection::recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms) {
    std::lock_guard lock(recv_mu_);
    if (!recv_broken_.ok()) return recv_broken_;
    if (closed_) return closed_status();
    const Deadline deadline(timeout_ms);
    bool timed_out = false;

    uint8_t raw[kHeaderBytes];
    size_t got = 0;
    int64_t spin_end_ns = 0;
    TD_TRY(read_some(raw, kHeaderBytes, &got, deadline, &timed_out, &spin_end_ns));
    if (timed_out) {
        if (got == 0)
            return make_error(ErrorKind::failed, "no frame from {} within {} ms", peer_, timeout_ms);
        close();  // part of a header was consumed: the stream can no longer be framed
        return make_error(ErrorKind::failed,
                          "recv from {} timed out after {} ms inside a frame header; closed", peer_,
                          timeout_ms);
    }
    Result<FrameHeader> h = checked_header(raw, peer_);
    if (!h.ok()) {
        recv_broken_ = h.status();
        return recv_broken_;
    }
    header = *h;
    const size_t n = header.payload_bytes;
    size_payload(payload, n, kRecvGrowStart);  // doubling from 1 MiB as the bytes arrive
    got = 0;
    while (got < n) {
        if (got == payload.size()) payload.resize(std::min(n, 2 * payload.size()));
        TD_TRY(read_some(payload.data(), payload.size(), &got, deadline, &timed_out, &spin_end_ns));
        if (timed_out) {
            close();
            return make_error(ErrorKind::failed,
                              "recv from {} timed out after {} ms with {} of {} payload bytes; closed", peer_,
                              timeout_ms, got, n);
        }
    }
    stats_.msgs_recv.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes_recv.fetch_add(kHeaderBytes + n, std::memory_order_relaxed);
    return {};
}

Status TcpConnection::send(MsgType type, uint64_t request_id, uint32_t flags,
                           std::span<const std::span<const uint8_t>> parts, int timeout_ms) {
    std::lock_guard lock(send_mu_);
    const int64_t t0 = now_ns();
    if (closed_) return closed_status();
    uint8_t raw[kHeaderBytes];
    TD_ASSIGN_OR_RETURN(const uint64_t total, encode_frame_header(type, request_id, flags, parts, raw));

    const Deadline deadline(timeout_ms);
    size_t next_part = 0;  // parts[next_part..] not yet in the iov window
    iovec iov[kMaxIov];
    size_t n_iov = 0, first = 0;
    iov[n_iov++] = {raw, kHeaderBytes};
    auto refill = [&] {  // compacts the window and appends parts until it is full
        if (first > 0) {
            std::memmove(iov, iov + first, (n_iov - first) * sizeof(iovec));
            n_iov -= first;
            first = 0;
        }
        while (n_iov < kMaxIov && next_part < parts.size()) {
            const auto &p = parts[next_part++];
            if (!p.empty()) iov[n_iov++] = {const_cast<uint8_t *>(p.data()), p.size()};
        }
    };
    refill();
    uint64_t sent = 0;
    const uint64_t frame_bytes = kHeaderBytes + total;
    while (sent < frame_bytes) {
        if (first == n_iov) refill();
        msghdr msg{};
        msg.msg_iov = iov + first;
        msg.msg_iovlen = n_iov - first;
        const ssize_t r = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);  // no SIGPIPE when the peer has gone
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return errno_status("send to", errno);
            bool timed_out = false;
            TD_TRY(wait(POLLOUT, deadline, &timed_out));
            if (timed_out) {
                if (sent > 0) close();  // a partial frame is on the wire: the stream is lost
                return make_error(
                    ErrorKind::failed, "send of {} to {} timed out after {} ms ({} of {} bytes sent){}",
                    msg_type_name(type), peer_, timeout_ms, sent, frame_bytes, sent > 0 ? "; closed" : "");
            }
            continue;
        }
        sent += static_cast<uint64_t>(r);
        size_t left = static_cast<size_t>(r);
        while (left > 0) {
            if (left >= iov[first].iov_len) {
                left -= iov[first].iov_len;
                ++first;
            } else {
                iov[first].iov_base = static_cast<uint8_t *>(iov[first].iov_base) + left;
                iov[first].iov_len -= left;
                left = 0;
            }
        }
    }
    stats_.msgs_sent.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes_sent.fetch_add(frame_bytes, std::memory_order_relaxed);
    stats_.send_ns.fetch_add(static_cast<uint64_t>(now_ns() - t0), std::memory_order_relaxed);
    return {};
}

// ---- listener --------------------------------------------------------------------------------------------

class TcpListener final : public Listener {
public:
    TcpListener(int fd, int wake_fd) : fd_(fd), wake_fd_(wake_fd), address_(local_name(fd)) {
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) == 0) {
            port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
        }
    }
    ~TcpListener() override {
        ::close(fd_);
        ::close(wake_fd_);
    }
    uint16_t port() const override { return port_; }
    std::string address() const override { return address_; }
    Result<std::unique_ptr<Connection>> accept(int timeout_ms) override;
    void close() override {
        if (closed_.exchange(true)) return;
        const uint64_t one = 1;
        (void)!::write(wake_fd_, &one, sizeof one);
        (void)::shutdown(fd_, SHUT_RDWR);  // refuse new connections from now on
    }

private:
    int fd_, wake_fd_;
    std::string address_;
    uint16_t port_ = 0;
    std::atomic<bool> closed_{false};
};

Result<std::unique_ptr<Connection>> TcpListener::accept(int timeout_ms) {
    const Deadline deadline(timeout_ms);
    for (;;) {
        if (closed_) return make_error(ErrorKind::disconnected, "listener on {} is closed", address_);
        pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
        const int rc = ::poll(p, 2, deadline.poll_ms());
        if (rc < 0 && errno != EINTR) {
            return make_error(ErrorKind::failed, "poll on listener {}: {}", address_, errno_text(errno));
        }
        if (closed_) continue;
        if (rc == 0)
            return make_error(ErrorKind::failed, "no connection on {} within {} ms", address_, timeout_ms);
        if (rc < 0) continue;
        const int cfd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            // The client gave up between poll and accept, or a signal: wait again.
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EINTR) continue;
            return make_error(ErrorKind::failed, "accept on {}: {}", address_, errno_text(errno));
        }
        set_stream_options(cfd);
        return std::unique_ptr<Connection>(std::make_unique<TcpConnection>(cfd));
    }
}

}  // namespace

// ---- entry points ----------------------------------------------------------------------------------------

Result<std::unique_ptr<Listener>> tcp_listen(const std::string &host, uint16_t port) {
    TD_ASSIGN_OR_RETURN(auto addrs, resolve(host, port, /*passive=*/true));
    std::string last_error;
    for (const sockaddr_storage &ss : addrs) {
        const std::string where = sockaddr_string(reinterpret_cast<const sockaddr *>(&ss));
        const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last_error = fmt::format("socket for {}: {}", where, errno_text(errno));
            continue;
        }
        const int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        set_buffer_options(fd);  // inherited by accepted sockets
        if (::bind(fd, reinterpret_cast<const sockaddr *>(&ss), sockaddr_len(ss)) != 0 ||
            ::listen(fd, 128) != 0) {
            last_error = fmt::format("listen on {}: {}", where, errno_text(errno));
            ::close(fd);
            continue;
        }
        const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (wake_fd < 0) {
            const std::string err = errno_text(errno);
            ::close(fd);
            return make_error(ErrorKind::io, "eventfd for listener on {}: {}", where, err);
        }
        return std::unique_ptr<Listener>(std::make_unique<TcpListener>(fd, wake_fd));
    }
    return make_error(ErrorKind::io, "cannot listen on {}:{}: {}", host, port, last_error);
}

Result<std::unique_ptr<Connection>> tcp_connect(const std::string &host, uint16_t port, int timeout_ms) {
    const Deadline deadline(timeout_ms);
    TD_ASSIGN_OR_RETURN(auto addrs, resolve(host, port, /*passive=*/false));
    Status last;
    for (const sockaddr_storage &ss : addrs) {
        const std::string where = sockaddr_string(reinterpret_cast<const sockaddr *>(&ss));
        const int fd = ::socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            last = make_error(ErrorKind::io, "connect to {}:{}: socket: {}", host, port, errno_text(errno));
            continue;
        }
        set_buffer_options(fd);
        set_stream_options(fd);
        int err = 0;
        if (::connect(fd, reinterpret_cast<const sockaddr *>(&ss), sockaddr_len(ss)) != 0) {
            err = errno;
            if (err == EINPROGRESS || err == EINTR) {
                pollfd p{fd, POLLOUT, 0};
                int rc;
                do {
                    rc = ::poll(&p, 1, deadline.poll_ms());
                } while (rc < 0 && errno == EINTR);
                if (rc == 0) {
                    ::close(fd);
                    return make_error(ErrorKind::failed, "connect to {}:{} ({}) timed out after {} ms", host,
                                      port, where, timeout_ms);
                }
                socklen_t len = sizeof err;
                if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
            }
        }
        if (err == 0) return std::unique_ptr<Connection>(std::make_unique<TcpConnection>(fd));
        ::close(fd);
        // Refused or unreachable: nobody listens (yet); a later reconnect may succeed.
        last = make_error(ErrorKind::disconnected, "connect to {}:{} ({}): {}", host, port, where,
                          errno_text(err));
        if (deadline.passed()) break;
    }
    return last;
}

Result<std::unique_ptr<Connection>> connection_from_fd(int fd) {
    if (fd < 0 || !set_nonblocking(fd)) {
        return make_error(ErrorKind::invalid_input, "connection_from_fd: fd {} is not an open socket", fd);
    }
    set_stream_options(fd);
    return std::unique_ptr<Connection>(std::make_unique<TcpConnection>(fd));
}

Status parse_host_port(const std::string &s, std::string *host, uint16_t *port) {
    std::string h, p;
    if (!s.empty() && s[0] == '[') {  // [v6]:port
        const size_t close = s.find(']');
        if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':') {
            return invalid_input("'{}': expected [ipv6]:port", s);
        }
        h = s.substr(1, close - 1);
        p = s.substr(close + 2);
    } else {
        const size_t colon = s.rfind(':');
        if (colon == std::string::npos) return invalid_input("'{}': expected host:port", s);
        h = s.substr(0, colon);
        p = s.substr(colon + 1);
        if (h.find(':') != std::string::npos)
            return invalid_input("'{}': write an IPv6 address as [addr]:port", s);
    }
    if (h.empty()) return invalid_input("'{}': missing host before the port", s);
    if (p.empty() || p.size() > 5 ||
        !std::all_of(p.begin(), p.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        return invalid_input("'{}': port '{}' is not a number 0..65535", s, p);
    }
    const unsigned long v = std::stoul(p);
    if (v > 65535) return invalid_input("'{}': port {} is not in 0..65535", s, v);
    *host = h;
    *port = static_cast<uint16_t>(v);
    return {};
}

}  // namespace td::net
