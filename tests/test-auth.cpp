// Authentication: the cluster secret file, the handshake's proofs (socketpairs between threads), and real
// workers refusing heads, strangers and replayed handshakes.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "cluster/cluster-engine.h"
#include "cluster/handshake.h"
#include "cluster/probe.h"
#include "cluster/wire.h"
#include "model/model.h"
#include "net/auth.h"
#include "net/codec.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td::cluster {
namespace {

using test::ChildProcess;
using test::TempDir;
using test::test_secret;
using Clock = std::chrono::steady_clock;

const std::string kModel = "models/stories260K.gguf";

net::ClusterSecret secret_of(const std::string &s) {
    return net::ClusterSecret::from_bytes(s);
}

struct Pipe {
    std::unique_ptr<net::Connection> a, b;
};
Pipe socket_pair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    auto a = net::connection_from_fd(sv[0]);
    auto b = net::connection_from_fd(sv[1]);
    EXPECT_TRUE(a.ok() && b.ok());
    return {std::move(a).value(), std::move(b).value()};
}

net::Hello hello_as(net::ConnRole role) {
    net::Hello h;
    h.role = role;
    h.build_id = "test";
    h.node_name = "test-client";
    return h;
}

struct Outcome {
    Result<net::HelloReply> client = invalid_input("not run");
    Result<net::Hello> server = invalid_input("not run");
};
// One handshake between two threads: the server answers with a HelloReply when its side holds.
Outcome handshake(const net::ClusterSecret &client_secret, const net::ClusterSecret &server_secret,
                  net::ConnRole role = net::ConnRole::control) {
    Pipe p = socket_pair();
    Outcome o;
    std::thread server([&] {
        o.server = handshake_accept(*p.b, server_secret, "test-server", 2000);
        if (o.server.ok()) {
            net::HelloReply r;
            r.node_name = "test-server";
            (void)send_control(*p.b, net::MsgType::hello_reply, r);
        } else {
            p.b->close();
        }
    });
    o.client = handshake_connect(*p.a, hello_as(role), client_secret, "worker w", 2000);
    server.join();
    return o;
}

// ---- the secret file -------------------------------------------------------------------------------------

TEST(ClusterSecret, CreatedOnceWithOwnerOnlyModeAndRandomHex) {
    TempDir dir;
    const std::string path = dir.file("conf/tandem/cluster.secret");
    bool created = false;
    auto s = net::ClusterSecret::load_or_create(path, &created);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_TRUE(created);
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    const std::string text = test::read_file(path);
    ASSERT_EQ(text.size(), 65u) << text;  // 32 random bytes in hex, a newline
    EXPECT_EQ(text.find_first_not_of("0123456789abcdef"), 64u);
    // Loading again reads the same key (a proof under one verifies under the other), and creates nothing.
    auto again = net::ClusterSecret::load_or_create(path, &created);
    ASSERT_TRUE(again.ok());
    EXPECT_FALSE(created);
    const net::AuthNonce n = net::make_nonce();
    const uint8_t t[3] = {1, 2, 3};
    EXPECT_TRUE(again->verify(net::AuthSide::client, t, n, s->prove(net::AuthSide::client, t, n)));
    // Another file's key does not verify; nor does the other side's proof, nor another nonce.
    bool c2 = false;
    auto other = net::ClusterSecret::load_or_create(dir.file("other.secret"), &c2);
    ASSERT_TRUE(other.ok());
    EXPECT_FALSE(other->verify(net::AuthSide::client, t, n, s->prove(net::AuthSide::client, t, n)));
    EXPECT_FALSE(s->verify(net::AuthSide::server, t, n, s->prove(net::AuthSide::client, t, n)));
    EXPECT_FALSE(s->verify(net::AuthSide::client, t, net::make_nonce(), s->prove(net::AuthSide::client, t, n)));
}

TEST(ClusterSecret, ManyProcessesCreatingAtOnceAgreeOnOneKey) {
    TempDir dir;
    const std::string path = dir.file("cluster.secret");
    std::vector<std::future<std::pair<bool, std::string>>> runs;
    for (int i = 0; i < 8; ++i)
        runs.push_back(std::async(std::launch::async, [&] {
            bool created = false;
            auto s = net::ClusterSecret::load_or_create(path, &created);
            const uint8_t t[1] = {7};
            const net::AuthNonce n{};
            const net::AuthMac m = s.ok() ? s->prove(net::AuthSide::server, t, n) : net::AuthMac{};
            return std::make_pair(created, std::string(m.begin(), m.end()));
        }));
    int created = 0;
    std::set<std::string> keys;
    for (auto &r : runs) {
        auto [c, k] = r.get();
        created += c;
        keys.insert(k);
    }
    EXPECT_EQ(created, 1);
    EXPECT_EQ(keys.size(), 1u);
    // No temporary file is left beside it.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(ClusterSecret, RefusesOpenModesShortKeysAndNamesAMissingFile) {
    TempDir dir;
    const std::string path = dir.file("s");
    std::ofstream(path) << "0123456789abcdef0123\n";
    ::chmod(path.c_str(), 0644);
    auto s = net::ClusterSecret::load(path);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("chmod 600 " + path), std::string::npos) << s.status().message();
    ::chmod(path.c_str(), 0600);
    EXPECT_TRUE(net::ClusterSecret::load(path).ok());
    std::ofstream(path) << "  short \n";
    s = net::ClusterSecret::load(path);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("at least 16"), std::string::npos) << s.status().message();
    s = net::ClusterSecret::load(dir.file("missing"));
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().kind(), ErrorKind::not_found);
    EXPECT_NE(s.status().message().find(dir.file("missing")), std::string::npos);
    EXPECT_NE(s.status().message().find("--secret-file"), std::string::npos);
}

// ---- the handshake --------------------------------------------------------------------------------------

TEST(Handshake, SameSecretPassesRoleAndReply) {
    const auto o = handshake(secret_of("the same secret, 32 characters!"), secret_of("the same secret, 32 characters!"),
                             net::ConnRole::peer);
    ASSERT_TRUE(o.client.ok()) << o.client.status().message();
    ASSERT_TRUE(o.server.ok()) << o.server.status().message();
    EXPECT_EQ(o.server->role, net::ConnRole::peer);
    EXPECT_EQ(o.client->node_name, "test-server");
}

TEST(Handshake, DifferentSecretsAreRefusedOnBothSides) {
    const auto o = handshake(secret_of("the client's secret, long enough"), secret_of("the server's secret, long enough"));
    ASSERT_FALSE(o.client.ok());
    ASSERT_FALSE(o.server.ok());
    EXPECT_EQ(o.client.status().kind(), ErrorKind::invalid_input);
    EXPECT_NE(o.client.status().message().find("worker w: authentication failed: it holds a different cluster secret"),
              std::string::npos)
        << o.client.status().message();
    // The client found out first (the server's proof did not verify) and told the server why.
    EXPECT_NE(o.server.status().message().find("authentication failed"), std::string::npos)
        << o.server.status().message();
}

TEST(Handshake, NoSecretIsRefused) {
    auto o = handshake(net::ClusterSecret(), secret_of("the server's secret, long enough"));
    ASSERT_FALSE(o.client.ok());
    EXPECT_NE(o.client.status().message().find("no cluster secret"), std::string::npos);
    o = handshake(secret_of("the client's secret, long enough"), net::ClusterSecret());
    ASSERT_FALSE(o.client.ok());
    ASSERT_FALSE(o.server.ok());
    EXPECT_NE(o.server.status().message().find("no cluster secret"), std::string::npos);
}

// A client that knows the protocol but not the secret sends a Hello and a made-up (or reflected) proof.
TEST(Handshake, ForgedAndReflectedProofsAreRefusedAndTheReplyNeverComes) {
    const net::ClusterSecret secret = secret_of("the server's secret, long enough");
    for (bool reflect : {false, true}) {
        Pipe p = socket_pair();
        Result<net::Hello> server = invalid_input("not run");
        std::thread t([&] { server = handshake_accept(*p.b, secret, "test-server", 2000); });
        std::vector<uint8_t> hello;
        net::encode(hello_as(net::ConnRole::control), hello);
        ASSERT_TRUE(p.a->send_msg(net::MsgType::hello, 0, hello).ok());
        std::vector<uint8_t> payload;
        ASSERT_TRUE(recv_expect(*p.a, net::MsgType::auth_challenge, payload, 2000, "").ok());
        auto ch = net::decode_auth_challenge(payload);
        ASSERT_TRUE(ch.ok());
        net::AuthProof forged;
        if (reflect) forged.proof = ch->proof;  // the server's own proof, sent back
        else forged.proof.fill(0x5a);
        ASSERT_TRUE(send_control(*p.a, net::MsgType::auth_proof, forged).ok());
        t.join();
        ASSERT_FALSE(server.ok());
        EXPECT_NE(server.status().message().find("proof does not match"), std::string::npos)
            << server.status().message();
        net::FrameHeader h;
        Status s = recv_frame(*p.a, h, payload, 2000, "");  // an error, never a HelloReply
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.message();
    }
}

TEST(Handshake, AnOlderPeerLearnsOnlyOurVersion) {
    Pipe p = socket_pair();
    Result<net::Hello> server = invalid_input("not run");
    std::thread t([&] { server = handshake_accept(*p.b, test_secret(), "test-server", 2000); });
    net::Hello old = hello_as(net::ConnRole::control);
    old.protocol_version = 3;
    std::vector<uint8_t> hello;
    net::encode(old, hello);
    hello.resize(hello.size() - net::kAuthNonceBytes);  // version 3 had no nonce
    ASSERT_TRUE(p.a->send_msg(net::MsgType::hello, 0, hello).ok());
    std::vector<uint8_t> payload;
    ASSERT_TRUE(recv_expect(*p.a, net::MsgType::hello_reply, payload, 2000, "").ok());
    auto r = net::decode_hello_reply(payload);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->protocol_version, net::kProtocolVersion);
    EXPECT_EQ(r->mem_total, 0u);  // nothing about the node
    EXPECT_TRUE(r->cpu.empty());
    t.join();
    ASSERT_FALSE(server.ok());
    EXPECT_NE(server.status().message().find("speaks protocol 3"), std::string::npos);
}

TEST(Handshake, AStrangersLargeFrameIsRefusedUnread) {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    auto server_conn = net::connection_from_fd(sv[1]);
    ASSERT_TRUE(server_conn.ok());
    Result<net::Hello> server = invalid_input("not run");
    std::thread t([&] { server = handshake_accept(**server_conn, test_secret(), "test-server", 2000); });
    // A Hello header announcing 512 KiB, and no bytes after it: refused at once, before reading or allocating.
    net::FrameHeader h;
    h.type = static_cast<uint16_t>(net::MsgType::hello);
    h.payload_bytes = 512u << 10;
    uint8_t raw[net::kHeaderBytes];
    net::encode_header(h, raw);
    const auto t0 = Clock::now();
    ASSERT_EQ(::write(sv[0], raw, sizeof raw), static_cast<ssize_t>(sizeof raw));
    t.join();
    ASSERT_FALSE(server.ok());
    EXPECT_NE(server.status().message().find("exceeds"), std::string::npos) << server.status().message();
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
    ::close(sv[0]);
}

// ---- real workers ----------------------------------------------------------------------------------------

// `tandem worker` with its own --secret-file.
struct Worker {
    ChildProcess proc;
    std::string address;
    Worker(const std::string &cache_dir, const std::string &secret_file) {
        proc.start({"worker", "--listen", "127.0.0.1:0", "--cache-dir", cache_dir, "-t", "1", "--secret-file",
                    secret_file},
                   "listening on ");
        address = proc.ready_text();
    }
};

size_t files_under(const std::string &dir) {
    size_t n = 0;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        n += it->is_regular_file();
    return n;
}

TEST(AuthWorker, CreatesItsSecretOnFirstStartAndSaysWhere) {
    TempDir dir;
    const std::string path = dir.file("cfg/cluster.secret");
    Worker w(dir.file("cache"), path);
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    EXPECT_NE(w.proc.log().find("created the cluster secret " + path), std::string::npos) << w.proc.log();
    struct stat st {};
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // The next start uses it.
    Worker again(dir.file("cache2"), path);
    ASSERT_TRUE(again.proc.running()) << again.proc.log();
    EXPECT_NE(again.proc.log().find("cluster secret " + path), std::string::npos);
    EXPECT_EQ(again.proc.log().find("created"), std::string::npos);
}

TEST(AuthWorker, AHeadWithAnotherSecretIsRefusedAndNothingIsWritten) {
    auto model = Model::load(test::shared_path(kModel));
    ASSERT_TRUE(model.ok()) << model.status().message();
    TempDir dir;
    Worker w(dir.file("cache"), dir.file("worker.secret"));
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    ClusterOptions o;
    o.workers = w.address;
    o.stage_dir = dir.file("head-stages");
    o.print_placement = false;
    o.secret = test_secret();  // not the worker's
    const auto t0 = Clock::now();
    auto e = ClusterEngine::create(*model, o);
    ASSERT_FALSE(e.ok());
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 3.0);
    EXPECT_NE(e.status().message().find("worker " + w.address + ": authentication failed"), std::string::npos)
        << e.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_NE(w.proc.log().find("refused: authentication failed"), std::string::npos) << w.proc.log();
    EXPECT_EQ(files_under(dir.file("cache")), 0u);
    // No secret at all: refused before connecting.
    o.secret = net::ClusterSecret();
    e = ClusterEngine::create(*model, o);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("no cluster secret"), std::string::npos) << e.status().message();
}

// A stranger who speaks the protocol but holds no secret sends a control Hello, a made-up proof and then,
// without waiting, a LoadStage and a WeightsChunk: none of it is read as a stage.
TEST(AuthWorker, AStrangerOnTheDataPortIsRefusedAndLoggedAndWritesNoStageFile) {
    TempDir dir;
    Worker w(dir.file("cache"), dir.file("worker.secret"));
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    const uint16_t port = static_cast<uint16_t>(std::stoi(w.address.substr(w.address.rfind(':') + 1)));
    for (net::ConnRole role : {net::ConnRole::control, net::ConnRole::data, net::ConnRole::peer}) {
        auto c = net::tcp_connect("127.0.0.1", port, 2000);
        ASSERT_TRUE(c.ok());
        std::vector<uint8_t> hello;
        net::encode(hello_as(role), hello);
        ASSERT_TRUE((*c)->send_msg(net::MsgType::hello, 0, hello).ok());
        net::AuthProof forged;
        forged.proof.fill(0x42);
        ASSERT_TRUE(send_control(**c, net::MsgType::auth_proof, forged).ok());
        net::LoadStage ls;
        ls.layer_last = 1;
        ls.n_layer = 1;
        ls.stage_file_bytes = 1000;
        (void)send_control(**c, net::MsgType::load_stage, ls);
        // What comes back: the challenge (a nonce and a proof), then an error; never a HelloReply.
        net::FrameHeader h;
        std::vector<uint8_t> payload;
        std::vector<uint16_t> types;
        while (recv_frame(**c, h, payload, 3000, "").ok()) types.push_back(h.type);
        ASSERT_EQ(types.size(), 1u);
        EXPECT_EQ(types[0], static_cast<uint16_t>(net::MsgType::auth_challenge));
    }
    // Plain garbage on the port.
    auto c = net::tcp_connect("127.0.0.1", port, 2000);
    ASSERT_TRUE(c.ok());
    const std::vector<uint8_t> junk(64, 0x17);
    (void)(*c)->send_msg(net::MsgType::forward, 0, junk);
    net::FrameHeader h;
    std::vector<uint8_t> payload;
    EXPECT_FALSE((*c)->recv(h, payload, 3000).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const std::string log = w.proc.log();
    size_t refused = 0;
    for (size_t at = log.find("refused"); at != std::string::npos; at = log.find("refused", at + 1)) ++refused;
    EXPECT_GE(refused, 4u) << log;
    EXPECT_NE(log.find("proof does not match"), std::string::npos) << log;
    EXPECT_EQ(files_under(dir.file("cache")), 0u);
}

// A handshake recorded on the wire and replayed: the worker's fresh nonce makes the old proof worthless.
TEST(AuthWorker, AReplayedHandshakeIsRefused) {
    TempDir dir;
    const std::string secret_path = dir.file("worker.secret");
    Worker w(dir.file("cache"), secret_path);
    ASSERT_TRUE(w.proc.running()) << w.proc.log();
    auto secret = net::ClusterSecret::load(secret_path);
    ASSERT_TRUE(secret.ok());
    const uint16_t port = static_cast<uint16_t>(std::stoi(w.address.substr(w.address.rfind(':') + 1)));
    std::vector<uint8_t> hello;
    net::Hello hm = hello_as(net::ConnRole::probe);
    hm.nonce = net::make_nonce();
    net::encode(hm, hello);
    net::AuthProof recorded;
    {  // the genuine handshake
        auto c = net::tcp_connect("127.0.0.1", port, 2000);
        ASSERT_TRUE(c.ok());
        ASSERT_TRUE((*c)->send_msg(net::MsgType::hello, 0, hello).ok());
        std::vector<uint8_t> payload;
        ASSERT_TRUE(recv_expect(**c, net::MsgType::auth_challenge, payload, 2000, "").ok());
        auto ch = net::decode_auth_challenge(payload);
        ASSERT_TRUE(ch.ok());
        ASSERT_TRUE(secret->verify(net::AuthSide::server, hello, ch->nonce, ch->proof));
        recorded.proof = secret->prove(net::AuthSide::client, hello, ch->nonce);
        ASSERT_TRUE(send_control(**c, net::MsgType::auth_proof, recorded).ok());
        ASSERT_TRUE(recv_expect(**c, net::MsgType::hello_reply, payload, 2000, "").ok());
    }
    {  // the same bytes again
        auto c = net::tcp_connect("127.0.0.1", port, 2000);
        ASSERT_TRUE(c.ok());
        ASSERT_TRUE((*c)->send_msg(net::MsgType::hello, 0, hello).ok());
        std::vector<uint8_t> payload;
        ASSERT_TRUE(recv_expect(**c, net::MsgType::auth_challenge, payload, 2000, "").ok());
        ASSERT_TRUE(send_control(**c, net::MsgType::auth_proof, recorded).ok());
        Status s = recv_expect(**c, net::MsgType::hello_reply, payload, 2000, "");
        ASSERT_FALSE(s.ok());
        EXPECT_NE(s.message().find("authentication failed"), std::string::npos) << s.message();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_NE(w.proc.log().find("a different secret, or a replayed handshake"), std::string::npos) << w.proc.log();
}

// probe_link makes a worker dial another address: it must prove the secret there too, so a probe cannot
// reach (or measure) a node outside the cluster.
TEST(AuthWorker, ProbeLinksReachOnlyNodesWithTheSameSecret) {
    TempDir dir;
    Worker a(dir.file("a"), TD_TEST_SECRET);
    Worker outsider(dir.file("b"), dir.file("outsider.secret"));
    ASSERT_TRUE(a.proc.running() && outsider.proc.running());
    auto c = ProbeClient::connect(a.address, test_secret());
    ASSERT_TRUE(c.ok()) << c.status().message();
    LinkOptions lo;
    lo.rtt_sizes = {64};
    lo.budget_ms = 10;
    auto r = (*c)->link_to(outsider.address, lo);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("different cluster secret"), std::string::npos) << r.status().message();
    auto other = ProbeClient::connect(outsider.address, test_secret());
    ASSERT_FALSE(other.ok());
}

TEST(AuthCli, AHeadWithoutTheSecretFileSaysWhereToPutIt) {
    TempDir dir;
    auto r = test::run_tandem({"run", "-m", test::shared_path(kModel), "-p", "Hi", "-n", "2", "--workers",
                               "127.0.0.1:1", "--secret-file", dir.file("nowhere/cluster.secret")});
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("no cluster secret at " + dir.file("nowhere/cluster.secret")), std::string::npos) << r.err;
}

}  // namespace
}  // namespace td::cluster
