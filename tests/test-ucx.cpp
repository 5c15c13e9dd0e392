// UCX connections (net/ucx.h) over the transports UCX finds on this host (its shared memory and TCP): frames
// both ways straight from and into the callers' buffers, frames large enough for UCX's rendezvous protocol,
// one thread sending while another receives, timeouts, a peer whose process died, a message that cannot be a
// frame; and the handshake choosing UCX or falling back to TCP (cluster/handshake.h). Skipped in a build
// without UCX.
#include <gtest/gtest.h>
#include <time.h>

#include <chrono>
#include <thread>

#include "cluster/handshake.h"
#include "net/auth.h"
#include "net/codec.h"
#include "net/shm.h"
#include "net/ucx.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td::net {
namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;
constexpr uint32_t kUcx = kTransportsTcp | transport_bit(Transport::ucx);

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

Bytes pattern(size_t n, uint32_t seed) {
    Bytes b(n);
    uint32_t x = seed * 2654435761u + 1;
    for (auto &v : b) {
        x = x * 1664525u + 1013904223u;
        v = static_cast<uint8_t>(x >> 24);
    }
    return b;
}

struct Negotiated {
    std::unique_ptr<Connection> client, server;
    HelloReply reply;
};

// A TCP connection over loopback that authenticates and negotiates as the engine's links do.
Negotiated negotiate(uint32_t client_allows, uint32_t server_allows) {
    auto listener = tcp_listen("127.0.0.1", 0);
    EXPECT_TRUE(listener.ok());
    Negotiated n;
    const ClusterSecret secret = test::test_secret();
    std::thread server([&] {
        auto conn = (*listener)->accept(3000);
        ASSERT_TRUE(conn.ok()) << conn.status().message();
        auto hello = cluster::handshake_accept(**conn, secret, "test-server", 3000);
        ASSERT_TRUE(hello.ok()) << hello.status().message();
        auto c = cluster::answer_hello(std::move(conn).value(), *hello, HelloReply{}, server_allows, 3000);
        ASSERT_TRUE(c.ok()) << c.status().message();
        n.server = std::move(c).value();
    });
    auto conn = tcp_connect("127.0.0.1", (*listener)->port(), 3000);
    EXPECT_TRUE(conn.ok());
    Hello h;
    h.role = ConnRole::data;
    h.transports = client_allows;
    h.host_id = host_identity();
    auto reply = cluster::handshake_connect(**conn, h, secret, "test", 3000);
    EXPECT_TRUE(reply.ok()) << reply.status().message();
    if (reply.ok()) {
        n.reply = *reply;
        auto c = cluster::follow_transport(std::move(conn).value(), *reply, "test", 3000);
        EXPECT_TRUE(c.ok()) << c.status().message();
        if (c.ok()) n.client = std::move(c).value();
    }
    server.join();
    return n;
}

Negotiated ucx_pair() {
    Negotiated n = negotiate(kUcx, kUcx);
    EXPECT_TRUE(n.client && n.server);
    if (n.client) {
        EXPECT_EQ(n.client->transport(), Transport::ucx);
    }
    if (n.server) {
        EXPECT_EQ(n.server->transport(), Transport::ucx);
    }
    return n;
}

class NetUcx : public ::testing::Test {
protected:
    void SetUp() override {
        if (!ucx_supported()) GTEST_SKIP() << "this build has no UCX";
    }
};

TEST_F(NetUcx, FramesBothWaysInOrder) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    const Bytes hello = pattern(100, 1);
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 17, hello).ok());
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(p.server->recv(h, got, 3000).ok());
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::ping));
    EXPECT_EQ(h.request_id, 17u);
    EXPECT_EQ(got, hello);

    // Several parts, one empty, with flags; then an empty payload.
    const Bytes reply = pattern(1000, 2);
    std::span<const uint8_t> all(reply);
    std::span<const uint8_t> parts[4] = {all.first(3), {}, all.subspan(3, 500), all.subspan(503)};
    ASSERT_TRUE(p.server->send(MsgType::pong, 17, 0x2, parts).ok());
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 18, {}).ok());
    ASSERT_TRUE(p.client->recv(h, got, 3000).ok());
    EXPECT_EQ(h.flags, 0x2u);
    EXPECT_EQ(got, reply);
    ASSERT_TRUE(p.server->recv(h, got, 3000).ok());
    EXPECT_EQ(h.request_id, 18u);
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(p.client->stats().msgs_sent, 2u);
    EXPECT_EQ(p.client->stats().bytes_sent, 2 * kHeaderBytes + hello.size());
    EXPECT_EQ(p.client->stats().bytes_recv, kHeaderBytes + reply.size());

    // A thousand frames of many sizes, eager and rendezvous, while the other side reads them.
    std::thread reader([&] {
        FrameHeader rh;
        Bytes rb;
        for (uint32_t i = 0; i < 1000; ++i) {
            ASSERT_TRUE(p.server->recv(rh, rb, 5000).ok()) << i;
            ASSERT_EQ(rh.request_id, i);
            ASSERT_EQ(rb, pattern(i * 337 % 200000, i));
        }
    });
    for (uint32_t i = 0; i < 1000; ++i)
        ASSERT_TRUE(p.client->send_msg(MsgType::ping, i, pattern(i * 337 % 200000, i), 5000).ok());
    reader.join();
}

TEST_F(NetUcx, LargeFramesBothWaysAtOnce) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    const Bytes big = pattern(6u << 20, 7);
    // Each side sends a large frame before it reads: no deadlock while both wait for their rendezvous.
    std::thread other([&] { ASSERT_TRUE(p.server->send_msg(MsgType::forward, 2, big, 10000).ok()); });
    std::thread mine([&] { ASSERT_TRUE(p.client->send_msg(MsgType::forward, 1, big, 10000).ok()); });
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(p.client->recv(h, got, 10000).ok());
    EXPECT_EQ(h.request_id, 2u);
    EXPECT_EQ(got, big);
    ASSERT_TRUE(p.server->recv(h, got, 10000).ok());
    EXPECT_EQ(h.request_id, 1u);
    EXPECT_EQ(got, big);
    other.join();
    mine.join();
}

TEST_F(NetUcx, ASleepingReceiverWakesForTheNextFrame) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    // A receiver that slept on the event fd (no spin) is woken by the frame, not by its slice running out.
    for (int i = 0; i < 20; ++i) {
        std::thread sender([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            ASSERT_TRUE(p.client->send_msg(MsgType::ping, static_cast<uint64_t>(i), pattern(64, i)).ok());
        });
        FrameHeader h;
        Bytes got;
        const auto t0 = Clock::now();
        ASSERT_TRUE(p.server->recv(h, got, 5000).ok());
        EXPECT_LT(ms_since(t0), 1000.0);
        EXPECT_EQ(got, pattern(64, i));
        sender.join();
    }
}

TEST_F(NetUcx, RecvTimeoutLeavesTheConnectionUsable) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    FrameHeader h;
    Bytes got;
    const auto t0 = Clock::now();
    Status s = p.server->recv(h, got, 150);
    EXPECT_EQ(s.kind(), ErrorKind::failed) << s.message();
    EXPECT_GE(ms_since(t0), 140.0);
    EXPECT_LT(ms_since(t0), 1500.0);
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 5, pattern(10, 5)).ok());
    ASSERT_TRUE(p.server->recv(h, got, 3000).ok());
    EXPECT_EQ(h.request_id, 5u);
}

TEST_F(NetUcx, AnIdleReceiverSleepsInsteadOfSpinning) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    // A frame first, so every lazy connection set-up inside UCX is done.
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 1, pattern(64, 1)).ok());
    ASSERT_TRUE(p.server->recv(h, got, 3000).ok());
    auto thread_cpu_ms = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
    };
    const double cpu0 = thread_cpu_ms();
    const auto t0 = Clock::now();
    EXPECT_EQ(p.server->recv(h, got, 400).kind(), ErrorKind::failed);
    const double wall = ms_since(t0), cpu = thread_cpu_ms() - cpu0;
    EXPECT_LT(cpu, 0.25 * wall) << "a receive waiting " << wall << " ms used " << cpu << " ms of CPU";
}

TEST_F(NetUcx, CloseWakesBlockedReceiversOnBothSides) {
    for (bool local : {true, false}) {
        Negotiated q = ucx_pair();
        ASSERT_TRUE(q.client && q.server);
        Status s;
        double waited = 0;
        std::thread r([&] {
            FrameHeader h;
            Bytes got;
            const auto t0 = Clock::now();
            s = q.client->recv(h, got, 10000);
            waited = ms_since(t0);
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // asleep on the event fd by now
        (local ? q.client : q.server)->close();
        r.join();
        EXPECT_EQ(s.kind(), ErrorKind::disconnected) << s.message();
        EXPECT_LT(waited, 1500.0);
    }
}

TEST_F(NetUcx, FramesSentJustBeforeThePeerClosesStillArrive) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    for (uint32_t i = 0; i < 5; ++i)
        ASSERT_TRUE(p.client->send_msg(MsgType::ping, i, pattern(3000 + i * 40000, i)).ok());
    p.client.reset();
    FrameHeader h;
    Bytes got;
    for (uint32_t i = 0; i < 5; ++i) {
        ASSERT_TRUE(p.server->recv(h, got, 3000).ok()) << i;
        EXPECT_EQ(got, pattern(3000 + i * 40000, i));
    }
    const Status s = p.server->recv(h, got, 3000);
    EXPECT_EQ(s.kind(), ErrorKind::disconnected) << s.message();
}

TEST_F(NetUcx, AKilledPeerProcessIsFoundWithinSeconds) {
    // A real worker process on UCX (a forked copy of this process could not use the UCX state it inherits).
    test::TempDir cache;
    test::WorkerProcess worker(cache.path(), 0, "", {}, {"--transport", "ucx"});
    ASSERT_TRUE(worker.running()) << worker.log();
    Hello hello;
    hello.role = ConnRole::probe;
    hello.node_name = "probe";
    hello.transports = kUcx;
    auto d = cluster::dial_node(worker.address(), hello, test::test_secret(), 3000);
    ASSERT_TRUE(d.ok()) << d.status().message();
    Connection &c = *d->conn;
    ASSERT_EQ(c.transport(), Transport::ucx);
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(c.send_msg(MsgType::echo, 1, pattern(64, 1)).ok());
    ASSERT_TRUE(c.recv(h, got, 5000).ok());
    EXPECT_EQ(got, pattern(64, 1));
    Status s;
    double waited = 0;
    std::thread r([&] {
        const auto t0 = Clock::now();
        s = c.recv(h, got, 20000);
        waited = ms_since(t0);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto killed = Clock::now();
    worker.kill();
    r.join();
    EXPECT_EQ(s.kind(), ErrorKind::disconnected) << s.message();
    EXPECT_LT(ms_since(killed), 3000.0);
    EXPECT_GT(waited, 150.0);
    // A send to it fails too, at the latest once it would have to wait.
    Status w;
    for (int i = 0; i < 1000 && (w = c.send_msg(MsgType::echo, 2, pattern(100000, 1), 500)).ok(); ++i) {
    }
    EXPECT_FALSE(w.ok());
}

TEST_F(NetUcx, AFrameOverTheLimitFailsTheConnectionNotTheProcess) {
    Negotiated p = ucx_pair();
    ASSERT_TRUE(p.client && p.server);
    p.server->set_recv_limit(1000);
    ASSERT_TRUE(p.client->send_msg(MsgType::forward, 1, pattern(5000, 1)).ok());
    FrameHeader h;
    Bytes got;
    const Status s = p.server->recv(h, got, 3000);
    EXPECT_EQ(s.kind(), ErrorKind::invalid_input) << s.message();
    EXPECT_TRUE(got.capacity() < 5000u);  // refused before the payload was allocated
    EXPECT_FALSE(p.server->recv(h, got, 100).ok());
}

TEST_F(NetUcx, TheHandshakeChoosesUcxWhenBothAllowItAndTcpOtherwise) {
    struct Case {
        uint32_t client, server;
        Transport want;
    };
    const Case cases[] = {
        {kUcx, kUcx, Transport::ucx},
        {kUcx, built_transports(), Transport::ucx},  // a worker on auto takes what the head asks for
        {kTransportsTcp, kUcx, Transport::tcp},      // the client says TCP
        {kUcx, kTransportsTcp, Transport::tcp},      // the server says TCP (a build without UCX)
    };
    for (const Case &c : cases) {
        Negotiated n = negotiate(c.client, c.server);
        ASSERT_TRUE(n.client && n.server);
        EXPECT_EQ(n.reply.transport, static_cast<uint32_t>(c.want));
        EXPECT_EQ(n.client->transport(), c.want);
        EXPECT_EQ(n.server->transport(), c.want);
        FrameHeader h;
        Bytes got;
        ASSERT_TRUE(n.client->send_msg(MsgType::ping, 3, pattern(5000, 3)).ok());
        ASSERT_TRUE(n.server->recv(h, got, 3000).ok());
        EXPECT_EQ(got, pattern(5000, 3));
        ASSERT_TRUE(n.server->send_msg(MsgType::pong, 4, pattern(70, 4)).ok());
        ASSERT_TRUE(n.client->recv(h, got, 3000).ok());
        EXPECT_EQ(got, pattern(70, 4));
    }
    // "auto" takes UCX only where it sees an RDMA device; shared memory wins between processes of one host.
    EXPECT_EQ((auto_transports() & transport_bit(Transport::ucx)) != 0, ucx_has_rdma());
    Negotiated n = negotiate(kTransportsAll, kTransportsAll);
    ASSERT_TRUE(n.client);
    EXPECT_EQ(n.client->transport(), shm_supported() ? Transport::shm : Transport::ucx);
}

}  // namespace
}  // namespace td::net
