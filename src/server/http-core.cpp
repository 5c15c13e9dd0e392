#include "server/http-core.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

#include "core/log.h"
#include "server/http-tls.h"

namespace td::server {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kTickMs = 50;  // how often deadlines are checked

std::string lower(std::string_view s) {
    std::string out(s);
    for (char &c : out)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    return out;
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

bool is_token_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

// The client closed its side or the connection broke (pipelined bytes alone do not count).
bool peer_gone(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    const int r = ::poll(&p, 1, 0);
    return r > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

std::string peer_address(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (::getpeername(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return "?";
    char host[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in *>(&ss)->sin_addr, host, sizeof host);
    else if (ss.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_addr, host, sizeof host);
    return host;
}

class ChunkedStream : public HttpStream {
public:
    ChunkedStream(Channel &ch, int timeout_ms) : ch_(ch), timeout_ms_(timeout_ms) {}
    bool write(std::string_view bytes) override {
        if (failed_) return false;
        if (bytes.empty()) return true;
        char head[24];
        const int n = std::snprintf(head, sizeof head, "%zx\r\n", bytes.size());
        frame_.assign(head, static_cast<size_t>(n));
        frame_.append(bytes);
        frame_ += "\r\n";
        failed_ = !ch_.write_all(frame_, timeout_ms_);
        return !failed_;
    }
    bool writable() override { return !failed_ && !peer_gone(ch_.fd()); }
    bool failed() const { return failed_; }

private:
    Channel &ch_;
    int timeout_ms_;
    bool failed_ = false;
    std::string frame_;
};

struct Conn {
    int fd = -1;
    std::string peer;             // the client's address
    std::unique_ptr<Channel> ch;  // owns fd
    std::string in;               // bytes read and not yet consumed
    // tls: the TLS handshake, within the header's time.
    enum class Phase { tls, idle, header, body } phase = Phase::header;
    Clock::time_point deadline;
    size_t scanned = 0;  // header bytes already searched for the blank line
    HttpRequest req;
    bool http11 = true;
    size_t content_length = 0;
};

}  // namespace

const char *http_reason(int status) {
    switch (status) {
        case 100: return "Continue";
        case 200: return "OK";
        case 400: return "Bad Request";
        case 401: return "Unauthorized";
        case 404: return "Not Found";
        case 405: return "Method Not Allowed";
        case 408: return "Request Timeout";
        case 411: return "Length Required";
        case 413: return "Content Too Large";
        case 429: return "Too Many Requests";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 501: return "Not Implemented";
        case 503: return "Service Unavailable";
        case 505: return "HTTP Version Not Supported";
    }
    return "Status";
}

std::string HttpRequest::header(std::string_view name) const {
    for (const auto &[k, v] : headers)
        if (k == name) return v;
    return "";
}

int http_parse_head(std::string_view text, const HttpLimits &lim, HttpHead &out, std::string &why) {
    const size_t end = text.size();
    const size_t eol = text.find("\r\n");
    std::string_view line = text.substr(0, eol);
    const size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
    if (sp1 == std::string_view::npos || sp2 == sp1) {
        why = "malformed request line";
        return 400;
    }
    out = HttpHead{};
    HttpRequest &r = out.request;
    r.method = std::string(line.substr(0, sp1));
    for (char ch : r.method)
        if (!is_token_char(ch)) {
            why = "malformed method";
            return 400;
        }
    const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const std::string_view version = line.substr(sp2 + 1);
    if (version == "HTTP/1.1") out.http11 = true;
    else if (version == "HTTP/1.0") out.http11 = false;
    else {
        why = fmt::format("unsupported version '{}'", version.substr(0, 16));
        return version.rfind("HTTP/", 0) == 0 ? 505 : 400;
    }
    if (target.empty() || target.front() != '/') {
        why = "the target must be a path";
        return 400;
    }
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    size_t at = eol + 2;
    while (at < end) {
        const size_t e = text.find("\r\n", at);
        std::string_view h = text.substr(at, (e == std::string_view::npos ? end : e) - at);
        at = e == std::string_view::npos ? end : e + 2;
        if (h.empty()) break;
        if (r.headers.size() >= lim.max_headers) {
            why = fmt::format("more than {} header lines", lim.max_headers);
            return 431;
        }
        const size_t colon = h.find(':');
        if (colon == 0 || colon == std::string_view::npos || h.front() == ' ' || h.front() == '\t') {
            why = "malformed header line";
            return 400;
        }
        for (char ch : h.substr(0, colon))
            if (!is_token_char(ch)) {
                why = "malformed header name";
                return 400;
            }
        r.headers.emplace_back(lower(h.substr(0, colon)), std::string(trim(h.substr(colon + 1))));
    }
    if (!r.header("transfer-encoding").empty()) {
        why = "send the body with Content-Length (chunked request bodies are not accepted)";
        return 411;
    }
    out.content_length = 0;
    const std::string cl = r.header("content-length");
    if (!cl.empty()) {
        if (cl.size() > 12 || cl.find_first_not_of("0123456789") != std::string::npos) {
            why = "malformed Content-Length";
            return 400;
        }
        out.content_length = std::stoull(cl);
        if (out.content_length > lim.max_body_bytes) {
            why = fmt::format("the request body is too large ({} bytes, limit {})", out.content_length,
                              lim.max_body_bytes);
            return 413;
        }
    }
    return 0;
}

struct HttpCore::Impl {
    HttpLimits lim;
    HttpHandler handler;
    HttpErrorBody error_body;
    std::shared_ptr<TlsContext> tls;  // null: plain HTTP
    int listen_fd = -1, ep = -1, wake = -1;
    std::atomic<bool> stopping{false};
    std::atomic<bool> running{false};
    std::atomic<int> n_open{0};

    std::unordered_map<int, std::unique_ptr<Conn>> conns;  // the loop's

    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::unique_ptr<Conn>> jobs;      // complete requests for the handlers
    std::deque<std::unique_ptr<Conn>> returned;  // kept-alive connections back to the loop
    std::set<int> answering;                     // fds the handlers hold (shut down by stop)
    std::vector<std::thread> workers;
    std::mutex run_mu;
    std::condition_variable run_cv;

    ~Impl() {
        if (listen_fd >= 0) ::close(listen_fd);
        if (ep >= 0) ::close(ep);
        if (wake >= 0) ::close(wake);
    }

    void poke() {
        const uint64_t one = 1;
        if (wake >= 0) (void)!::write(wake, &one, sizeof one);
    }

    void close_conn(std::unique_ptr<Conn> c) {
        c->ch->close();
        --n_open;
    }

    // A refusal from the loop: best effort (the socket is non-blocking; a client that does not read loses it).
    void refuse(std::unique_ptr<Conn> c, int status, const std::string &message) {
        auto [type, body] = error_body ? error_body(status, message)
                                       : std::make_pair(std::string("text/plain"), message + "\n");
        const std::string out = fmt::format(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}", status,
            http_reason(status), type, body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
        c->ch->write_now(out);
        close_conn(std::move(c));
    }

    void watch(Conn &c, int op = EPOLL_CTL_ADD, bool out = false) {
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP | (out ? EPOLLOUT : 0u);
        ev.data.fd = c.fd;
        ::epoll_ctl(ep, op, c.fd, &ev);
    }

    void accept_all() {
        for (;;) {
            const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EINTR) continue;
                if (errno == EMFILE || errno == ENFILE) log_warn("http: out of file descriptors");
                return;  // EAGAIN, or a transient error
            }
            auto c = std::make_unique<Conn>();
            c->fd = fd;
            c->peer = peer_address(fd);
            c->ch = std::make_unique<Channel>(fd, tls.get());
            ++n_open;
            if (n_open.load() > lim.max_connections) {
                refuse(std::move(c), 503, fmt::format("too many connections (limit {})", lim.max_connections));
                continue;
            }
            const int one = 1;
            ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            start_header(*c);  // the header clock starts now (a TLS handshake is part of it)
            if (tls) c->phase = Conn::Phase::tls;
            watch(*c);
            conns.emplace(fd, std::move(c));
        }
    }

    void start_header(Conn &c) {
        c.phase = Conn::Phase::header;
        c.deadline = Clock::now() + std::chrono::milliseconds(lim.header_timeout_ms);
    }

    // Moves a connection forward with the bytes it has; may hand it to a handler or close it.
    void advance(std::unique_ptr<Conn> &c) {
        if (c->phase == Conn::Phase::idle) {
            if (c->in.empty()) return;
            start_header(*c);
        }
        if (c->phase == Conn::Phase::header) {
            const size_t from = c->scanned > 3 ? c->scanned - 3 : 0;
            const size_t blank = c->in.find("\r\n\r\n", from);
            if (blank == std::string::npos) {
                c->scanned = c->in.size();
                if (c->in.size() > lim.max_header_bytes)
                    return refuse(take(c), 431, fmt::format("the request header is over {} bytes", lim.max_header_bytes));
                return;
            }
            const size_t end = blank + 4;
            if (end > lim.max_header_bytes)
                return refuse(take(c), 431, fmt::format("the request header is over {} bytes", lim.max_header_bytes));
            std::string why;
            HttpHead head;
            if (const int status = http_parse_head(std::string_view(c->in.data(), end), lim, head, why); status != 0)
                return refuse(take(c), status, why);
            c->req = std::move(head.request);
            c->http11 = head.http11;
            c->content_length = head.content_length;
            c->in.erase(0, end);
            c->scanned = 0;
            c->phase = Conn::Phase::body;
            c->deadline = Clock::now() + std::chrono::milliseconds(lim.body_timeout_ms);
            if (c->content_length > c->in.size() && lower(c->req.header("expect")) == "100-continue") {
                c->ch->write_now("HTTP/1.1 100 Continue\r\n\r\n");
            }
        }
        if (c->phase == Conn::Phase::body && c->in.size() >= c->content_length) {
            c->req.body = c->in.substr(0, c->content_length);
            c->in.erase(0, c->content_length);
            dispatch(take(c));
        }
    }

    // Takes a connection out of the loop's hands.
    std::unique_ptr<Conn> take(std::unique_ptr<Conn> &c) {
        ::epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, nullptr);
        auto out = std::move(c);
        conns.erase(out->fd);
        return out;
    }

    void dispatch(std::unique_ptr<Conn> c) {
        std::unique_lock lock(mu);
        if (jobs.size() >= static_cast<size_t>(lim.max_pending)) {
            lock.unlock();
            return refuse(std::move(c), 503, "the server is busy; retry");
        }
        jobs.push_back(std::move(c));
        cv.notify_one();
    }

    void on_readable(int fd) {
        auto it = conns.find(fd);
        if (it == conns.end()) return;
        std::unique_ptr<Conn> &c = it->second;
        if (c->phase == Conn::Phase::tls) {
            switch (c->ch->handshake()) {
                case Channel::Io::ok:
                    c->phase = Conn::Phase::header;  // keeps the deadline the connection started with
                    watch(*c, EPOLL_CTL_MOD);
                    break;
                case Channel::Io::again_read: return watch(*c, EPOLL_CTL_MOD);
                case Channel::Io::again_write: return watch(*c, EPOLL_CTL_MOD, true);
                default: {
                    // Not TLS (plain HTTP to an HTTPS port), or a handshake the server refuses.
                    auto dead = take(c);
                    return close_conn(std::move(dead));
                }
            }
        }
        char buf[16384];
        for (;;) {
            // Read no more than the phase can use: a header's limit, or the rest of the body (then a little).
            const size_t cap = c->phase == Conn::Phase::body ? c->content_length + lim.max_header_bytes
                                                             : lim.max_header_bytes + 1;
            if (c->in.size() >= cap) break;
            size_t n = 0;
            const Channel::Io r = c->ch->read(buf, std::min(sizeof buf, cap - c->in.size()), &n);
            if (r == Channel::Io::ok) {
                c->in.append(buf, n);
                continue;
            }
            if (r == Channel::Io::again_read || r == Channel::Io::again_write) break;
            // Closed or reset: whatever it had not finished is dropped.
            auto dead = take(c);
            return close_conn(std::move(dead));
        }
        advance(c);
    }

    void sweep() {
        const auto now = Clock::now();
        std::vector<int> late;
        for (auto &[fd, c] : conns)
            if (now >= c->deadline) late.push_back(fd);
        for (int fd : late) {
            auto it = conns.find(fd);
            auto c = take(it->second);
            if ((c->phase == Conn::Phase::idle && c->in.empty()) || c->phase == Conn::Phase::tls)
                close_conn(std::move(c));
            else
                refuse(std::move(c), 408,
                       c->phase == Conn::Phase::body
                           ? fmt::format("the request body did not arrive within {} ms", lim.body_timeout_ms)
                           : fmt::format("the request header did not arrive within {} ms", lim.header_timeout_ms));
        }
    }

    void take_returned() {
        uint64_t n = 0;
        (void)!::read(wake, &n, sizeof n);
        std::deque<std::unique_ptr<Conn>> back;
        {
            std::lock_guard lock(mu);
            back.swap(returned);
        }
        for (auto &c : back) {
            c->phase = Conn::Phase::idle;
            c->deadline = Clock::now() + std::chrono::milliseconds(lim.idle_timeout_ms);
            watch(*c);
            const int fd = c->fd;
            conns[fd] = std::move(c);
            // A pipelined request may already be here, in our buffer or (TLS) decrypted inside the session
            // where epoll cannot see it: read what there is, then move on.
            on_readable(fd);
        }
    }

    void serve_one(std::unique_ptr<Conn> c) {
        const int fd = c->fd;
        {
            std::lock_guard lock(mu);
            answering.insert(fd);
        }
        c->req.client_gone = [fd] { return peer_gone(fd); };
        c->req.peer = c->peer;
        HttpResponse res;
        try {
            handler(c->req, res);
        } catch (...) {
            res = HttpResponse{};
            res.status = 500;
            res.body = "internal error\n";
        }
        const std::string connection = lower(c->req.header("connection"));
        bool keep = c->http11 ? connection != "close" : connection == "keep-alive";
        keep = keep && !stopping.load();
        std::string head = fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\n", res.status, http_reason(res.status),
                                       res.content_type);
        for (const auto &[k, v] : res.headers) head += k + ": " + v + "\r\n";
        head += keep ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
        bool ok = true;
        if (res.stream) {
            head += "Transfer-Encoding: chunked\r\n\r\n";
            ok = c->ch->write_all(head, lim.write_timeout_ms);
            if (ok) {
                ChunkedStream s(*c->ch, lim.write_timeout_ms);
                res.stream(s);
                ok = !s.failed() && c->ch->write_all("0\r\n\r\n", lim.write_timeout_ms);
            }
        } else {
            head += fmt::format("Content-Length: {}\r\n\r\n", res.body.size());
            ok = c->ch->write_all(head, lim.write_timeout_ms) && c->ch->write_all(res.body, lim.write_timeout_ms);
        }
        {
            std::lock_guard lock(mu);
            answering.erase(fd);
            if (ok && keep && !stopping.load()) {
                c->req = HttpRequest{};
                returned.push_back(std::move(c));
            }
        }
        if (c) {
            close_conn(std::move(c));
        } else {
            poke();
        }
    }

    void worker_loop() {
        for (;;) {
            std::unique_ptr<Conn> c;
            {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return stopping.load() || !jobs.empty(); });
                if (jobs.empty()) return;  // stopping
                c = std::move(jobs.front());
                jobs.pop_front();
            }
            if (stopping.load()) {
                close_conn(std::move(c));
                continue;
            }
            serve_one(std::move(c));
        }
    }
};

HttpCore::HttpCore(HttpLimits limits, HttpHandler handler, HttpErrorBody error_body)
    : impl_(std::make_unique<Impl>()) {
    impl_->lim = limits;
    impl_->handler = std::move(handler);
    impl_->error_body = std::move(error_body);
}

void HttpCore::set_tls(std::shared_ptr<TlsContext> tls) {
    impl_->tls = std::move(tls);
}

HttpCore::~HttpCore() {
    stop();
    std::unique_lock lock(impl_->run_mu);
    impl_->run_cv.wait(lock, [&] { return !impl_->running.load(); });
}

Result<int> HttpCore::bind(const std::string &host, int port) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    addrinfo *res = nullptr;
    const std::string service = std::to_string(port);
    if (::getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr)
        return make_error(ErrorKind::io, "cannot listen on {}:{}: unknown address", host, port);
    int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    const bool ok = fd >= 0 && ::bind(fd, res->ai_addr, res->ai_addrlen) == 0 && ::listen(fd, 1024) == 0;
    ::freeaddrinfo(res);
    if (!ok) {
        const std::string err = std::strerror(errno);
        if (fd >= 0) ::close(fd);
        return make_error(ErrorKind::io, "cannot listen on {}:{} ({})", host, port, err);
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len);
    const int bound = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port)
                                               : ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
    impl_->listen_fd = fd;
    return bound;
}

Status HttpCore::run() {
    Impl &m = *impl_;
    if (m.listen_fd < 0) return make_error(ErrorKind::failed, "HttpCore::run before bind");
    {
        std::lock_guard lock(m.run_mu);
        if (m.stopping.load()) return {};
        m.running = true;
    }
    m.ep = ::epoll_create1(EPOLL_CLOEXEC);
    m.wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = m.listen_fd;
    ::epoll_ctl(m.ep, EPOLL_CTL_ADD, m.listen_fd, &ev);
    ev.data.fd = m.wake;
    ::epoll_ctl(m.ep, EPOLL_CTL_ADD, m.wake, &ev);
    for (int i = 0; i < std::max(1, m.lim.n_threads); ++i) m.workers.emplace_back([&m] { m.worker_loop(); });

    std::vector<epoll_event> events(256);
    while (!m.stopping.load()) {
        const int n = ::epoll_wait(m.ep, events.data(), static_cast<int>(events.size()), kTickMs);
        for (int i = 0; i < n && !m.stopping.load(); ++i) {
            const int fd = events[static_cast<size_t>(i)].data.fd;
            if (fd == m.listen_fd) m.accept_all();
            else if (fd == m.wake) m.take_returned();
            else m.on_readable(fd);
        }
        m.sweep();
    }

    // Stopping: no new connections; idle ones close; handlers finish what they answer (their streams see
    // their sockets shut down).
    ::close(m.listen_fd);
    m.listen_fd = -1;
    for (auto &[fd, c] : m.conns) {
        c->ch->close();
        --m.n_open;
    }
    m.conns.clear();
    {
        std::lock_guard lock(m.mu);
        for (int fd : m.answering) ::shutdown(fd, SHUT_RDWR);
        m.cv.notify_all();
    }
    for (auto &t : m.workers) t.join();
    m.workers.clear();
    for (auto &c : m.returned) m.close_conn(std::move(c));
    m.returned.clear();
    for (auto &c : m.jobs) m.close_conn(std::move(c));
    m.jobs.clear();
    {
        std::lock_guard lock(m.run_mu);
        m.running = false;
    }
    m.run_cv.notify_all();
    return {};
}

void HttpCore::stop() {
    Impl &m = *impl_;
    {
        std::lock_guard lock(m.run_mu);
        m.stopping = true;
    }
    m.poke();
    std::lock_guard lock(m.mu);
    for (int fd : m.answering) ::shutdown(fd, SHUT_RDWR);
    m.cv.notify_all();
}

bool HttpCore::stopping() const {
    return impl_->stopping.load();
}

int HttpCore::open_connections() const {
    return impl_->n_open.load();
}

}  // namespace td::server
