// The bytes of one HTTP connection: a plain socket, or TLS over it (`tandem serve --ssl-cert --ssl-key`).
//
// Both are non-blocking. The event loop drives a TLS handshake and reads with handshake()/read() as epoll says
// the socket is ready (each returns again_read or again_write instead of blocking); the handler thread that
// answers a request writes with write_all(), which waits for the socket with poll. A connection is used by one
// thread at a time (the loop, or the handler it was handed to), so a channel needs no lock.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace td::server {

// A server certificate chain and its private key (PEM files), TLS 1.2 or later.
class TlsContext {
public:
    // Error (invalid_input) names the file and OpenSSL's reason: a missing file, a key that is not the
    // certificate's.
    static Result<std::shared_ptr<TlsContext>> load(const std::string &cert_file, const std::string &key_file);
    ~TlsContext();
    TlsContext(const TlsContext &) = delete;
    TlsContext &operator=(const TlsContext &) = delete;
    SSL_CTX *ctx() const { return ctx_; }

private:
    explicit TlsContext(SSL_CTX *ctx) : ctx_(ctx) {}
    SSL_CTX *ctx_;
};

class Channel {
public:
    enum class Io { ok, again_read, again_write, closed, failed };

    // Takes the socket (closed by close() or the destructor). With `tls`, a server-side session on it.
    Channel(int fd, const TlsContext *tls);
    ~Channel();
    Channel(const Channel &) = delete;
    Channel &operator=(const Channel &) = delete;

    int fd() const { return fd_; }
    bool tls() const { return ssl_ != nullptr; }
    // Until ok, no request bytes: the TLS handshake (plain: ok at once). failed: not TLS, or refused.
    Io handshake();
    bool handshake_done() const { return ready_; }
    // Up to n bytes into buf; ok with *got > 0, or again_*, closed (orderly end), failed.
    Io read(char *buf, size_t n, size_t *got);
    // Decrypted bytes buffered inside the TLS session (epoll cannot see them).
    bool pending() const;
    // All of `data`, waiting up to timeout_ms for each bit of progress. False: the peer is gone or stuck.
    bool write_all(std::string_view data, int timeout_ms);
    // Whatever the socket takes now, without waiting (a refusal to a client that may not read).
    void write_now(std::string_view data);
    // Ends the stream (TLS close_notify; then FIN) and closes the socket.
    void close();

private:
    int fd_;
    SSL *ssl_ = nullptr;
    bool ready_ = false;
};

}  // namespace td::server
