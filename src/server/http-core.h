// HTTP/1.1 for `tandem serve`, written for a server that must keep answering while clients misbehave.
//
// One event-loop thread owns every connection that is not being answered: it accepts, reads request bytes as
// they come (non-blocking, epoll) and enforces the limits below, so a slow or idle client costs a few KiB and
// a timer, never a thread. A request whose header and body have arrived goes to one of `n_threads` handler
// threads, which answers it (a whole body, or a chunked stream of any length) and hands a kept-alive
// connection back to the loop.
//
// Limits (each answered with its status, then the connection closes): header section over max_header_bytes
// or max_headers lines (431), body over max_body_bytes (413), a chunked request body (411: send
// Content-Length), a header not complete within header_timeout_ms of the connection (or of the previous
// response) (408), a body not complete within body_timeout_ms (408), more than max_connections open (503),
// more than max_pending complete requests waiting for a handler thread (503). An idle kept-alive connection
// closes after idle_timeout_ms. Every write must progress within write_timeout_ms.
//
// HTTPS (set_tls): the TLS handshake runs in the loop too, inside the header's time, so a client that opens a
// TLS connection and stalls costs no more than one that sends half a header. Plain HTTP to an HTTPS port is
// closed without an answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace td::server {

class TlsContext;

struct HttpLimits {
    size_t max_header_bytes = 16u << 10;
    size_t max_headers = 100;
    size_t max_body_bytes = 8u << 20;
    int max_connections = 4096;
    int max_pending = 256;
    int header_timeout_ms = 10000;
    int body_timeout_ms = 30000;
    int idle_timeout_ms = 5000;
    int write_timeout_ms = 30000;
    int n_threads = 16;
};

struct HttpRequest {
    std::string method;  // "GET"
    std::string path;    // "/v1/models" (the target without its query)
    std::string query;   // after '?', undecoded
    std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased, in arrival order
    std::string body;
    std::string peer;  // the client's IP address ("127.0.0.1", "::1")
    // The value of header `name` (lower case), "" when absent.
    std::string header(std::string_view name) const;
    // True once the client has closed its side or reset the connection (a handler of a long request polls it).
    std::function<bool()> client_gone;
};

// A streaming body: write() sends one chunk and returns false once the client is gone (or too slow); the
// stream callback returns when done. writable() tells without writing.
class HttpStream {
public:
    virtual ~HttpStream() = default;
    virtual bool write(std::string_view bytes) = 0;
    virtual bool writable() = 0;
};

struct HttpResponse {
    int status = 200;
    std::vector<std::pair<std::string, std::string>> headers;  // besides Content-Type/-Length, Connection
    std::string content_type = "text/plain";
    std::string body;
    // When set, the body is sent chunked from this callback instead of `body`.
    std::function<void(HttpStream &)> stream;
    void set_header(std::string name, std::string value) { headers.emplace_back(std::move(name), std::move(value)); }
};

using HttpHandler = std::function<void(const HttpRequest &, HttpResponse &)>;
// The body of a refusal the core sends itself (a limit, a timeout): (content type, body) for a status and a
// message. Unset: plain text.
using HttpErrorBody = std::function<std::pair<std::string, std::string>(int status, const std::string &message)>;

// "Not Found" for 404, ...
const char *http_reason(int status);

// One request's head: request line and header lines (`head` ends with the blank line, at most
// limits.max_header_bytes). Returns 0, or the status to refuse it with (400 malformed, 411 chunked body, 413 body
// over limits.max_body_bytes, 431 too many header lines, 505 another HTTP version) and `why`.
struct HttpHead {
    HttpRequest request;  // method, path, query, headers (no body yet)
    bool http11 = true;   // HTTP/1.1 (else 1.0)
    size_t content_length = 0;
};
int http_parse_head(std::string_view head, const HttpLimits &limits, HttpHead &out, std::string &why);

class HttpCore {
public:
    HttpCore(HttpLimits limits, HttpHandler handler, HttpErrorBody error_body = {});
    ~HttpCore();  // stop()
    HttpCore(const HttpCore &) = delete;
    HttpCore &operator=(const HttpCore &) = delete;

    // Serves HTTPS with this certificate and key instead of plain HTTP. Before run().
    void set_tls(std::shared_ptr<TlsContext> tls);
    // Binds host:port (0: a free port) and returns the port. Error (io) names the address.
    Result<int> bind(const std::string &host, int port);
    // Runs the event loop on the calling thread until stop(). bind() first.
    Status run();
    // Stops accepting, closes idle connections, waits for the handlers to return. Any thread, any time,
    // more than once. A handler's stream sees write() fail once its connection is shut down.
    void stop();
    bool stopping() const;

    // Connections open now (idle, reading, or being answered), for tests and /metrics.
    int open_connections() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace td::server
