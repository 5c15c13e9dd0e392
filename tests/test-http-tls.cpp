// HTTPS: HttpCore with a TLS context (a certificate made here for 127.0.0.1), the handshake held to the
// header's time in the event loop, plain HTTP to an HTTPS port, bad certificate files, and `tandem serve
// --ssl-cert --ssl-key` answering an OpenAI client over TLS. Real sockets over loopback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/http-core.h"
#include "server/http-tls.h"
#include "test-child-process.h"
#include "test-http-util.h"
#include "test-util.h"

namespace td::server {
namespace {

using test::dial;
using test::read_until;
using test::seconds_since;

using Clock = std::chrono::steady_clock;


// A self-signed P-256 certificate for 127.0.0.1 (subject and IP SAN), written as PEM to dir/name.crt and .key.
struct Cert {
    std::string cert, key;
};

Cert make_cert(const test::TempDir &dir, const std::string &name) {
    EVP_PKEY *pkey = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, pkey);
    X509_NAME *subject = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char *>("127.0.0.1"),
                               -1, -1, 0);
    X509_set_issuer_name(x, subject);
    X509V3_CTX v3;
    X509V3_set_ctx_nodb(&v3);
    X509V3_set_ctx(&v3, x, x, nullptr, nullptr, 0);
    X509_EXTENSION *san = X509V3_EXT_conf_nid(nullptr, &v3, NID_subject_alt_name, "IP:127.0.0.1");
    X509_add_ext(x, san, -1);
    X509_EXTENSION_free(san);
    X509_sign(x, pkey, EVP_sha256());
    Cert c{dir.file(name + ".crt"), dir.file(name + ".key")};
    FILE *f = std::fopen(c.cert.c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
    f = std::fopen(c.key.c_str(), "w");
    PEM_write_PrivateKey(f, pkey, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    X509_free(x);
    EVP_PKEY_free(pkey);
    return c;
}

HttpLimits small_limits() {
    HttpLimits l;
    l.max_connections = 512;
    l.header_timeout_ms = 400;
    l.idle_timeout_ms = 2000;
    l.write_timeout_ms = 2000;
    l.n_threads = 2;
    return l;
}

// An HTTPS core on its own thread: echoes method, path and body; /stream sends three chunks.
class TlsCore {
public:
    TlsCore(const Cert &cert, HttpLimits l = small_limits()) {
        auto tls = TlsContext::load(cert.cert, cert.key);
        EXPECT_TRUE(tls.ok()) << tls.status().message();
        core_ = std::make_unique<HttpCore>(l, [](const HttpRequest &req, HttpResponse &res) {
            if (req.path == "/stream") {
                res.stream = [](HttpStream &s) {
                    for (int i = 0; i < 3; ++i) s.write("part" + std::to_string(i) + ";");
                };
                return;
            }
            res.body = req.method + " " + req.path + " body=" + req.body;
        });
        if (tls.ok()) core_->set_tls(*tls);
        auto p = core_->bind("127.0.0.1", 0);
        EXPECT_TRUE(p.ok()) << p.status().message();
        port = p.ok() ? *p : 0;
        thread_ = std::thread([this] { (void)core_->run(); });
    }
    ~TlsCore() {
        core_->stop();
        thread_.join();
    }
    HttpCore &core() { return *core_; }
    int port = 0;

private:
    std::unique_ptr<HttpCore> core_;
    std::thread thread_;
};



std::unique_ptr<httplib::SSLClient> client(int port, const Cert &trusted) {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", port);
    c->set_ca_cert_path(trusted.cert.c_str());
    c->enable_server_certificate_verification(true);
    c->set_connection_timeout(2, 0);
    c->set_read_timeout(5, 0);
    return c;
}

TEST(HttpTls, AnswersVerifiedClientsWithKeepAliveBodiesAndStreams) {
    test::TempDir dir;
    const Cert cert = make_cert(dir, "server");
    TlsCore core(cert);
    auto c = client(core.port, cert);
    c->set_keep_alive(true);
    auto a = c->Post("/one", "hello", "text/plain");
    ASSERT_TRUE(a) << httplib::to_string(a.error());
    EXPECT_EQ(a->status, 200);
    EXPECT_EQ(a->body, "POST /one body=hello");
    const std::string big(200000, 'x');  // several TLS records each way
    auto b = c->Post("/two", big, "text/plain");
    ASSERT_TRUE(b) << httplib::to_string(b.error());
    EXPECT_EQ(b->body, "POST /two body=" + big);
    auto s = c->Get("/stream");
    ASSERT_TRUE(s) << httplib::to_string(s.error());
    EXPECT_EQ(s->body, "part0;part1;part2;");
    EXPECT_EQ(core.core().open_connections(), 1);  // all three on one kept-alive connection
}

TEST(HttpTls, AClientThatDoesNotTrustTheCertificateIsNotServed) {
    test::TempDir dir;
    const Cert cert = make_cert(dir, "server");
    const Cert other = make_cert(dir, "other");
    TlsCore core(cert);
    auto c = client(core.port, other);
    auto r = c->Get("/x");
    EXPECT_FALSE(r);
    EXPECT_EQ(r.error(), httplib::Error::SSLServerVerification) << httplib::to_string(r.error());
}

TEST(HttpTls, PlainHttpToTheHttpsPortIsClosedUnanswered) {
    test::TempDir dir;
    const Cert cert = make_cert(dir, "server");
    TlsCore core(cert);
    const int fd = dial(core.port);
    const std::string req = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    bool closed = false;
    const std::string out = read_until(fd, 2.0, "", &closed);
    EXPECT_TRUE(closed);
    EXPECT_EQ(out.find("HTTP/1.1"), std::string::npos) << out;  // nothing in clear text
    ::close(fd);
}

TEST(HttpTls, StalledHandshakesAreCutAtTheHeaderTimeAndDoNotDelayOthers) {
    test::TempDir dir;
    const Cert cert = make_cert(dir, "server");
    HttpLimits l = small_limits();
    l.header_timeout_ms = 1500;
    TlsCore core(cert, l);
    // 128 connections that never start the handshake, and 128 that send the first bytes of a ClientHello only.
    std::vector<int> stalled;
    const unsigned char hello_start[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03};
    for (int i = 0; i < 256; ++i) {
        const int fd = dial(core.port);
        if (i % 2 == 1) {
            ASSERT_EQ(::send(fd, hello_start, sizeof hello_start, MSG_NOSIGNAL), 11);
        }
        stalled.push_back(fd);
    }
    const auto t0 = Clock::now();
    auto c = client(core.port, cert);
    auto r = c->Post("/ordinary", "x", "text/plain");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->body, "POST /ordinary body=x");
    EXPECT_LT(seconds_since(t0), 1.0);
    // Every stalled one is closed once its header time (1.5 s from its connect) has passed.
    for (int fd : stalled) {
        bool closed = false;
        (void)read_until(fd, 3.0, "", &closed);
        EXPECT_TRUE(closed);
        ::close(fd);
    }
    EXPECT_LT(seconds_since(t0), 4.0);
}

TEST(HttpTls, BadCertificateFilesAreNamed) {
    test::TempDir dir;
    const Cert a = make_cert(dir, "a");
    const Cert b = make_cert(dir, "b");
    auto missing = TlsContext::load(dir.file("none.crt"), a.key);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("none.crt"), std::string::npos) << missing.status().message();
    auto not_a_key = TlsContext::load(a.cert, a.cert);
    ASSERT_FALSE(not_a_key.ok());
    EXPECT_NE(not_a_key.status().message().find("--ssl-key"), std::string::npos);
    auto mismatch = TlsContext::load(a.cert, b.key);
    ASSERT_FALSE(mismatch.ok());
    EXPECT_NE(mismatch.status().message().find("is not the key of the certificate"), std::string::npos)
        << mismatch.status().message();
}

constexpr const char *k_model = "models/stories260K.gguf";

TEST(HttpTls, ServeAnswersChatCompletionsOverHttps) {
    if (!test::shared_exists(k_model)) GTEST_SKIP() << "missing " << k_model;
    test::TempDir dir;
    const Cert cert = make_cert(dir, "server");
    // One of the pair alone is refused with both flags named.
    auto half = test::run_tandem({"serve", "-m", test::shared_path(k_model), "--port", "0", "--ssl-cert", cert.cert});
    EXPECT_NE(half.exit_code, 0);
    EXPECT_NE(half.err.find("--ssl-key"), std::string::npos) << half.err;

    test::ChildProcess serve;
    serve.start({"serve", "-m", test::shared_path(k_model), "--port", "0", "-t", "1", "--ssl-cert", cert.cert,
                 "--ssl-key", cert.key, "--api-key", "sekret"},
                "listening on https://127.0.0.1:");
    ASSERT_TRUE(serve.running()) << serve.log();
    auto c = client(std::stoi(serve.ready_text()), cert);
    c->set_read_timeout(60, 0);
    c->set_bearer_token_auth("sekret");
    for (int i = 0; i < 300; ++i) {
        auto h = c->Get("/health");
        if (h && h->status == 200) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const nlohmann::json req = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                {"max_tokens", 8},
                                {"temperature", 0}};
    auto r = c->Post("/v1/chat/completions", req.dump(), "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    ASSERT_EQ(r->status, 200) << r->body;
    const auto body = nlohmann::json::parse(r->body);
    EXPECT_EQ(body["usage"]["completion_tokens"], 8) << r->body;
    EXPECT_EQ(serve.signal_and_reap(SIGTERM), 0);
}

}  // namespace
}  // namespace td::server
