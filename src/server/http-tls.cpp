#include "server/http-tls.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <csignal>

namespace td::server {
namespace {

std::string openssl_reason() {
    const unsigned long e = ERR_get_error();
    ERR_clear_error();
    if (e == 0) return "no reason given";
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    return buf;
}

bool wait_for(int fd, short events, int timeout_ms) {
    pollfd p{fd, events, 0};
    int r;
    do r = ::poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    return r > 0 && !(p.revents & (POLLERR | POLLNVAL)) && (p.revents & events);
}

}  // namespace

Result<std::shared_ptr<TlsContext>> TlsContext::load(const std::string &cert_file, const std::string &key_file) {
    // OpenSSL writes to the socket with write(2): a client that hangs up must fail the write, not kill the
    // process.
    std::signal(SIGPIPE, SIG_IGN);
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == nullptr) return make_error(ErrorKind::failed, "TLS: cannot create a context ({})", openssl_reason());
    std::shared_ptr<TlsContext> out(new TlsContext(ctx));
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    // No session tickets: a ticket is a write the server would owe after the handshake, and resumption saves
    // little for API clients that keep their connections alive.
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1)
        return invalid_input("--ssl-cert {}: not a readable PEM certificate ({})", cert_file, openssl_reason());
    FILE *f = std::fopen(key_file.c_str(), "r");
    if (f == nullptr) return invalid_input("--ssl-key {}: cannot open it ({})", key_file, std::strerror(errno));
    EVP_PKEY *key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    if (key == nullptr)
        return invalid_input("--ssl-key {}: not a readable PEM private key ({})", key_file, openssl_reason());
    const bool used = SSL_CTX_use_PrivateKey(ctx, key) == 1;
    EVP_PKEY_free(key);
    if (!used || SSL_CTX_check_private_key(ctx) != 1)
        return invalid_input("--ssl-key {} is not the key of the certificate in {} ({})", key_file, cert_file,
                             openssl_reason());
    return out;
}

TlsContext::~TlsContext() {
    SSL_CTX_free(ctx_);
}

Channel::Channel(int fd, const TlsContext *tls) : fd_(fd) {
    if (tls == nullptr) {
        ready_ = true;
        return;
    }
    ssl_ = SSL_new(tls->ctx());
    if (ssl_ != nullptr && SSL_set_fd(ssl_, fd) == 1) {
        SSL_set_accept_state(ssl_);
    } else {  // out of memory: handshake() fails and the connection closes
        SSL_free(ssl_);
        ssl_ = nullptr;
        ERR_clear_error();
    }
}

Channel::~Channel() {
    close();
}

namespace {

Channel::Io ssl_state(SSL *ssl, int r) {
    switch (SSL_get_error(ssl, r)) {
        case SSL_ERROR_WANT_READ: return Channel::Io::again_read;
        case SSL_ERROR_WANT_WRITE: return Channel::Io::again_write;
        case SSL_ERROR_ZERO_RETURN: return Channel::Io::closed;
        default: ERR_clear_error(); return Channel::Io::failed;
    }
}

}  // namespace

Channel::Io Channel::handshake() {
    if (ready_) return Io::ok;
    if (ssl_ == nullptr) return Io::failed;
    const int r = SSL_do_handshake(ssl_);
    if (r == 1) {
        ready_ = true;
        return Io::ok;
    }
    return ssl_state(ssl_, r);
}

Channel::Io Channel::read(char *buf, size_t n, size_t *got) {
    *got = 0;
    if (fd_ < 0) return Io::failed;
    if (ssl_ == nullptr) {
        for (;;) {
            const ssize_t r = ::recv(fd_, buf, n, 0);
            if (r > 0) {
                *got = static_cast<size_t>(r);
                return Io::ok;
            }
            if (r == 0) return Io::closed;
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return Io::again_read;
            return Io::failed;
        }
    }
    size_t done = 0;
    const int r = SSL_read_ex(ssl_, buf, n, &done);
    if (r == 1) {
        *got = done;
        return Io::ok;
    }
    return ssl_state(ssl_, r);
}

bool Channel::pending() const {
    return ssl_ != nullptr && SSL_pending(ssl_) > 0;
}

bool Channel::write_all(std::string_view data, int timeout_ms) {
    if (fd_ < 0 || !ready_) return false;
    while (!data.empty()) {
        if (ssl_ == nullptr) {
            const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
            if (n > 0) {
                data.remove_prefix(static_cast<size_t>(n));
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
                if (!wait_for(fd_, POLLOUT, timeout_ms)) return false;
                continue;
            }
            return false;
        }
        size_t n = 0;
        const int r = SSL_write_ex(ssl_, data.data(), data.size(), &n);
        if (r == 1) {
            data.remove_prefix(n);
            continue;
        }
        switch (ssl_state(ssl_, r)) {
            case Io::again_write:
                if (!wait_for(fd_, POLLOUT, timeout_ms)) return false;
                break;
            case Io::again_read:
                if (!wait_for(fd_, POLLIN, timeout_ms)) return false;
                break;
            default: return false;
        }
    }
    return true;
}

void Channel::write_now(std::string_view data) {
    if (fd_ < 0 || !ready_) return;
    if (ssl_ == nullptr) {
        (void)!::send(fd_, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        return;
    }
    size_t n = 0;
    if (SSL_write_ex(ssl_, data.data(), data.size(), &n) != 1) ERR_clear_error();
}

void Channel::close() {
    if (fd_ < 0) return;
    if (ssl_ != nullptr) {
        // close_notify, best effort: the socket is non-blocking and the peer's reply is not awaited.
        if (ready_ && SSL_shutdown(ssl_) < 0) ERR_clear_error();
        SSL_free(ssl_);
        ssl_ = nullptr;
    }
    ::shutdown(fd_, SHUT_WR);
    ::close(fd_);
    fd_ = -1;
}

}  // namespace td::server
