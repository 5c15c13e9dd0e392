// Shared-memory connections (net/shm.h): frames both ways, frames far larger than a ring, waking sleepers,
// finding a peer that has gone, refusing a mapping that is not the peer's, leaving no mapping behind; and the
// handshake choosing shm or falling back to TCP (cluster/handshake.h).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cluster/handshake.h"
#include "cluster/wire.h"
#include "net/auth.h"
#include "net/codec.h"
#include "net/shm.h"
#include "test-util.h"

namespace td::net {
namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct TcpPair {
    std::unique_ptr<Connection> a, b;
};
TcpPair socket_pair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    auto a = connection_from_fd(sv[0]);
    auto b = connection_from_fd(sv[1]);
    EXPECT_TRUE(a.ok() && b.ok());
    return {std::move(a).value(), std::move(b).value()};
}

// The mappings of shared rings this process holds.
int shm_mappings() {
    std::ifstream maps("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(maps, line);)
        if (line.find("memfd:tandem-shm") != std::string::npos) ++n;
    return n;
}

struct ShmPair {
    std::unique_ptr<Connection> server, client;
};
ShmPair shm_pair(size_t ring_bytes = kShmRingBytes) {
    TcpPair t = socket_pair();
    auto pending = shm_create(ring_bytes);
    EXPECT_TRUE(pending.ok()) << pending.status().message();
    auto region = shm_attach(pending->offer);
    EXPECT_TRUE(region.ok()) << region.status().message();
    pending->region->close_fd();
    ShmPair p;
    p.server = shm_connection(std::move(pending->region), std::move(t.a), true);
    p.client = shm_connection(std::move(region).value(), std::move(t.b), false);
    return p;
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

TEST(NetShm, FramesBothWaysInOrder) {
    ShmPair p = shm_pair();
    EXPECT_EQ(p.server->transport(), Transport::shm);
    EXPECT_EQ(p.client->transport(), Transport::shm);
    const Bytes hello = pattern(100, 1);
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 17, hello).ok());
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(p.server->recv(h, got, 2000).ok());
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::ping));
    EXPECT_EQ(h.request_id, 17u);
    EXPECT_EQ(got, hello);

    // Several parts, one empty, with flags; then an empty payload.
    const Bytes reply = pattern(1000, 2);
    std::span<const uint8_t> all(reply);
    std::span<const uint8_t> parts[4] = {all.first(3), {}, all.subspan(3, 500), all.subspan(503)};
    ASSERT_TRUE(p.server->send(MsgType::pong, 17, 0x2, parts).ok());
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 18, {}).ok());
    ASSERT_TRUE(p.client->recv(h, got, 2000).ok());
    EXPECT_EQ(h.flags, 0x2u);
    EXPECT_EQ(got, reply);
    ASSERT_TRUE(p.server->recv(h, got, 2000).ok());
    EXPECT_EQ(h.request_id, 18u);
    EXPECT_TRUE(got.empty());
    EXPECT_EQ(p.client->stats().msgs_sent, 2u);
    EXPECT_EQ(p.client->stats().bytes_sent, 2 * kHeaderBytes + hello.size());
    EXPECT_EQ(p.server->stats().msgs_recv, 2u);
    EXPECT_EQ(p.client->stats().bytes_recv, kHeaderBytes + reply.size());

    // A thousand frames of every size around the ring's wrap, while the other side reads them.
    std::thread reader([&] {
        FrameHeader rh;
        Bytes rb;
        for (uint32_t i = 0; i < 1000; ++i) {
            ASSERT_TRUE(p.server->recv(rh, rb, 5000).ok());
            ASSERT_EQ(rh.request_id, i);
            ASSERT_EQ(rb, pattern(i * 37 % 20000, i));
        }
    });
    for (uint32_t i = 0; i < 1000; ++i)
        ASSERT_TRUE(p.client->send_msg(MsgType::ping, i, pattern(i * 37 % 20000, i)).ok());
    reader.join();
}

TEST(NetShm, FramesMuchLargerThanTheRingStreamThrough) {
    ShmPair p = shm_pair(4096);
    const Bytes big = pattern(3u << 20, 7);
    std::thread sender([&] { ASSERT_TRUE(p.client->send_msg(MsgType::forward, 1, big, 5000).ok()); });
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(p.server->recv(h, got, 5000).ok());
    sender.join();
    EXPECT_EQ(got, big);
    // Both ways at once, each side sending a frame larger than the ring before it reads: no deadlock when
    // each direction has its own ring and a reader.
    std::thread other([&] { ASSERT_TRUE(p.server->send_msg(MsgType::forward, 2, big, 5000).ok()); });
    ASSERT_TRUE(p.client->recv(h, got, 5000).ok());
    other.join();
    EXPECT_EQ(h.request_id, 2u);
    EXPECT_EQ(got, big);
}

// recv_view: a small frame is read where it landed in the ring, and keeps its room there until released.
TEST(NetShm, ASmallFrameIsLentInPlaceAndHoldsItsRoomUntilReleased) {
    ShmPair p = shm_pair(4096);
    const Bytes lent = pattern(1000, 11);
    ASSERT_TRUE(p.client->send_msg(MsgType::tp_partial, 1, lent).ok());
    FrameHeader h;
    Bytes scratch;
    auto view = p.server->recv_view(h, scratch, 1000);
    ASSERT_TRUE(view.ok()) << view.status().message();
    EXPECT_EQ(h.request_id, 1u);
    EXPECT_TRUE(scratch.empty());  // not copied out
    ASSERT_EQ(view->size(), lent.size());
    EXPECT_TRUE(std::equal(view->begin(), view->end(), lent.begin()));
    EXPECT_FALSE(p.server->readable());  // the lent frame counts as read
    EXPECT_EQ(p.server->stats().msgs_recv, 1u);

    // The rest of the ring fills (32 + 3064 bytes with the lent 1000 make 4096); the next frame cannot
    // write a byte over the lent one and times out, leaving the link usable.
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 2, pattern(3064, 12), 200).ok());
    Status s = p.client->send_msg(MsgType::ping, 3, pattern(100, 13), 100);
    EXPECT_EQ(s.kind(), ErrorKind::failed) << s.message();
    EXPECT_TRUE(p.client->is_open());
    EXPECT_TRUE(std::equal(view->begin(), view->end(), lent.begin()));  // still what was sent
    EXPECT_TRUE(p.server->readable());

    // Released, its room goes back to the sender.
    p.server->release_view();
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 4, pattern(100, 14), 1000).ok());
    // A frame of over a quarter of the ring is copied out, as is one that wraps at the ring's end.
    auto big = p.server->recv_view(h, scratch, 1000);
    ASSERT_TRUE(big.ok());
    EXPECT_EQ(h.request_id, 2u);
    EXPECT_EQ(big->data(), scratch.data());
    EXPECT_EQ(Bytes(big->begin(), big->end()), pattern(3064, 12));
    Bytes got;
    ASSERT_TRUE(
        p.server->recv(h, got, 1000).ok());  // recv() gives back a lent frame first, as recv_view() does
    EXPECT_EQ(h.request_id, 4u);
    EXPECT_EQ(got, pattern(100, 14));
}

TEST(NetShm, FramesOfEverySizeReadInPlaceArriveWhole) {
    ShmPair p = shm_pair(16384);
    constexpr uint32_t kFrames = 2000;
    std::thread reader([&] {
        FrameHeader h;
        Bytes scratch;
        uint32_t lent = 0;
        for (uint32_t i = 0; i < kFrames; ++i) {
            auto view = p.server->recv_view(h, scratch, 5000);
            ASSERT_TRUE(view.ok()) << i << ": " << view.status().message();
            ASSERT_EQ(h.request_id, i);
            const Bytes want = pattern(i * 53 % 9000, i);
            ASSERT_EQ(Bytes(view->begin(), view->end()), want) << i;
            if (!view->empty() && view->data() != scratch.data()) ++lent;
            if (i % 3 != 0) p.server->release_view();  // else the next call gives it back
        }
        EXPECT_GT(lent, kFrames / 4);
    });
    for (uint32_t i = 0; i < kFrames; ++i)
        ASSERT_TRUE(p.client->send_msg(MsgType::ping, i, pattern(i * 53 % 9000, i), 5000).ok());
    reader.join();
}

TEST(NetTcp, RecvViewReceivesIntoTheScratchBuffer) {
    TcpPair t = socket_pair();
    ASSERT_TRUE(t.a->send_msg(MsgType::ping, 9, pattern(500, 9)).ok());
    FrameHeader h;
    Bytes scratch;
    auto view = t.b->recv_view(h, scratch, 1000);
    ASSERT_TRUE(view.ok());
    EXPECT_EQ(view->data(), scratch.data());
    EXPECT_EQ(scratch, pattern(500, 9));
    t.b->release_view();
}

TEST(NetShm, ASendIntoAFullRingTimesOutBeforeWritingAByte) {
    ShmPair p = shm_pair(4096);
    const Bytes small = pattern(1000, 3);
    // Frames that fit leave the ring full; the next one times out before any byte of it is written.
    Status s;
    int sent = 0;
    while ((s = p.client->send_msg(MsgType::ping, 1, small, 100)).ok()) ++sent;
    EXPECT_EQ(s.kind(), ErrorKind::failed) << s.message();
    EXPECT_GE(sent, 3);
    EXPECT_NE(s.message().find("timed out"), std::string::npos) << s.message();
    // The reader still gets every whole frame that went in.
    FrameHeader h;
    Bytes got;
    for (int i = 0; i < sent; ++i) {
        ASSERT_TRUE(p.server->recv(h, got, 1000).ok()) << i;
        EXPECT_EQ(got, small);
    }
}

TEST(NetShm, RecvTimeoutLeavesTheConnectionUsable) {
    ShmPair p = shm_pair();
    FrameHeader h;
    Bytes got;
    const auto t0 = Clock::now();
    Status s = p.server->recv(h, got, 150);
    EXPECT_EQ(s.kind(), ErrorKind::failed);
    EXPECT_GE(ms_since(t0), 140.0);
    EXPECT_LT(ms_since(t0), 1000.0);
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 5, pattern(10, 5)).ok());
    ASSERT_TRUE(p.server->recv(h, got, 1000).ok());
    EXPECT_EQ(h.request_id, 5u);
}

// A recv() on another thread: join() returns its status and how long it waited.
class BlockedRecv {
public:
    BlockedRecv(Connection &c, int timeout_ms)
        : thread_([this, &c, timeout_ms] {
              FrameHeader h;
              Bytes got;
              const auto t0 = Clock::now();
              status_ = c.recv(h, got, timeout_ms);
              waited_ms_ = ms_since(t0);
          }) {}
    Status join(double *waited_ms) {
        thread_.join();
        *waited_ms = waited_ms_;
        return status_;
    }

private:
    Status status_;
    double waited_ms_ = 0;
    std::thread thread_;
};

TEST(NetShm, CloseWakesBlockedReceiversOnBothSides) {
    for (bool local : {true, false}) {
        ShmPair q = shm_pair();
        BlockedRecv r(*q.client, 10000);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));  // asleep on its futex by now
        (local ? q.client : q.server)->close();
        double waited = 0;
        const Status s = r.join(&waited);
        EXPECT_EQ(s.kind(), ErrorKind::disconnected) << s.message();
        EXPECT_LT(waited, 1000.0);
        EXPECT_FALSE(q.client->is_open());
    }
}

TEST(NetShm, APeerWhoseProcessDiedIsFoundThroughItsSocket) {
    // The server end as a killed process leaves it: rings mapped, its closed flag never set, its socket
    // closed by the kernel.
    TcpPair t = socket_pair();
    auto pending = shm_create();
    ASSERT_TRUE(pending.ok());
    auto region = shm_attach(pending->offer);
    ASSERT_TRUE(region.ok());
    auto client = shm_connection(std::move(region).value(), std::move(t.b), false);
    BlockedRecv r(*client, -1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    t.a.reset();  // the "dead" process's socket
    double waited = 0;
    const Status s = r.join(&waited);
    EXPECT_EQ(s.kind(), ErrorKind::disconnected) << s.message();
    EXPECT_NE(s.message().find("has gone"), std::string::npos) << s.message();
    EXPECT_LT(waited, 500.0);  // found within a sleep slice or two, not at a heartbeat's timeout
    // A send to it fails too, at the latest once it would have to wait.
    Status w;
    for (int i = 0; i < 10000 && (w = client->send_msg(MsgType::ping, 1, pattern(100000, 1), 200)).ok();
         ++i) {
    }
    EXPECT_FALSE(w.ok());
}

TEST(NetShm, RingPositionsThatBreakTheRingFailTheConnectionNotTheProcess) {
    // A third mapping of the same rings plays a peer that writes nonsense into the ring's header.
    TcpPair t = socket_pair();
    auto pending = shm_create(1u << 16);
    ASSERT_TRUE(pending.ok());
    auto client_region = shm_attach(pending->offer);
    auto rogue = shm_attach(pending->offer);
    ASSERT_TRUE(client_region.ok() && rogue.ok());
    auto server = shm_connection(std::move(pending->region), std::move(t.a), true);
    auto client = shm_connection(std::move(client_region).value(), std::move(t.b), false);
    ASSERT_TRUE(client->send_msg(MsgType::ping, 1, pattern(100, 1)).ok());
    // The client -> server ring's head (bytes written) is the u64 at offset 320 of the header page (the
    // layout of shm.cpp: 64 bytes of fields, then two 256-byte ring controls); it reads the frame's size now.
    uint64_t head = 0;
    std::memcpy(&head, (*rogue)->base() + 320, 8);
    ASSERT_EQ(head, kHeaderBytes + 100) << "the header layout moved; fix the offset in this test";
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(server->recv(h, got, 1000).ok());
    const uint64_t bogus = head + (1u << 20);  // more bytes than the ring holds
    std::memcpy((*rogue)->base() + 320, &bogus, 8);
    Status s = server->recv(h, got, 1000);
    EXPECT_EQ(s.kind(), ErrorKind::invalid_input) << s.message();
    EXPECT_NE(s.message().find("break the ring"), std::string::npos) << s.message();
    EXPECT_FALSE(server->recv(h, got, 100).ok());  // and every later call
}

TEST(NetShm, AMappingThatIsNotThePeersIsRefused) {
    auto pending = shm_create(1u << 16);
    ASSERT_TRUE(pending.ok()) << pending.status().message();
    ShmOffer bad = pending->offer;
    bad.token[0] ^= 1;
    auto r = shm_attach(bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("token"), std::string::npos) << r.status().message();
    bad = pending->offer;
    bad.bytes += 4096;  // another size: not this layout, or not this file
    EXPECT_FALSE(shm_attach(bad).ok());
    bad = pending->offer;
    bad.fd = 0;  // stdin: not a mapping at all
    EXPECT_FALSE(shm_attach(bad).ok());
    bad = pending->offer;
    bad.pid = 0x7ffffff0;  // no such process
    EXPECT_FALSE(shm_attach(bad).ok());
    EXPECT_FALSE(shm_create(5000).ok());  // not a power of two
    EXPECT_TRUE(shm_attach(pending->offer).ok());
}

TEST(NetShm, NoMappingOutlivesTheConnections) {
    const int before = shm_mappings();
    {
        ShmPair p = shm_pair();
        EXPECT_EQ(shm_mappings(), before + 2);  // one per side (both sides are in this process here)
        ASSERT_TRUE(p.client->send_msg(MsgType::ping, 1, pattern(64, 1)).ok());
        p.server.reset();  // one side gone: its mapping is gone, the other's stays until it closes
        EXPECT_EQ(shm_mappings(), before + 1);
    }
    EXPECT_EQ(shm_mappings(), before);
    // Nothing was ever named: no file in /dev/shm either.
    for (const auto &e : std::filesystem::directory_iterator("/dev/shm"))
        EXPECT_EQ(e.path().filename().string().find("tandem"), std::string::npos) << e.path();
}

// ---- negotiation (cluster/handshake.h) -------------------------------------------------------------------

struct Negotiated {
    std::unique_ptr<Connection> client, server;
    HelloReply reply;
};
Negotiated negotiate(uint32_t client_allows, uint32_t server_allows,
                     const std::string &host_id = host_identity()) {
    TcpPair t = socket_pair();
    Negotiated n;
    const ClusterSecret secret = test::test_secret();
    std::thread server([&] {
        auto hello = cluster::handshake_accept(*t.b, secret, "test-server", 2000);
        ASSERT_TRUE(hello.ok()) << hello.status().message();
        HelloReply r;
        r.node_name = "test-server";
        auto c = cluster::answer_hello(std::move(t.b), *hello, r, server_allows, 2000);
        ASSERT_TRUE(c.ok()) << c.status().message();
        n.server = std::move(c).value();
    });
    Hello h;
    h.role = ConnRole::data;
    h.transports = client_allows;
    h.host_id = host_id;
    auto reply = cluster::handshake_connect(*t.a, h, secret, "test", 2000);
    EXPECT_TRUE(reply.ok()) << reply.status().message();
    if (reply.ok()) {
        n.reply = *reply;
        auto c = cluster::follow_transport(std::move(t.a), *reply, "test", 2000);
        EXPECT_TRUE(c.ok()) << c.status().message();
        if (c.ok()) n.client = std::move(c).value();
    }
    server.join();
    return n;
}

void expect_frames_flow(Negotiated &n) {
    ASSERT_TRUE(n.client && n.server);
    FrameHeader h;
    Bytes got;
    ASSERT_TRUE(n.client->send_msg(MsgType::ping, 3, pattern(5000, 3)).ok());
    ASSERT_TRUE(n.server->recv(h, got, 2000).ok());
    EXPECT_EQ(got, pattern(5000, 3));
    ASSERT_TRUE(n.server->send_msg(MsgType::pong, 4, pattern(70, 4)).ok());
    ASSERT_TRUE(n.client->recv(h, got, 2000).ok());
    EXPECT_EQ(got, pattern(70, 4));
}

TEST(NetShm, TheHandshakeChoosesShmOnOneHostAndTcpOtherwise) {
    const uint32_t shm = kTransportsTcp | transport_bit(Transport::shm);
    struct Case {
        uint32_t client, server;
        std::string host;
        Transport want;
    };
    const Case cases[] = {
        {kTransportsAll, kTransportsAll, host_identity(), Transport::shm},
        {shm, kTransportsAll, host_identity(), Transport::shm},
        {kTransportsTcp, kTransportsAll, host_identity(), Transport::tcp},  // the client says TCP
        {kTransportsAll, kTransportsTcp, host_identity(), Transport::tcp},  // the server says TCP
        {shm, kTransportsAll, "another-host", Transport::tcp},              // not this host
        {shm, kTransportsAll, "", Transport::tcp},                          // a client that did not say
    };
    for (const Case &c : cases) {
        Negotiated n = negotiate(c.client, c.server, c.host);
        ASSERT_TRUE(n.client && n.server);
        EXPECT_EQ(n.reply.transport, static_cast<uint32_t>(c.want));
        EXPECT_EQ(n.client->transport(), c.want);
        EXPECT_EQ(n.server->transport(), c.want);
        expect_frames_flow(n);
    }
}

TEST(NetShm, AClientThatCannotAttachStaysOnTcp) {
    const int before = shm_mappings();
    TcpPair t = socket_pair();
    const ClusterSecret secret = test::test_secret();
    std::unique_ptr<Connection> server_conn;
    std::thread server([&] {
        auto hello = cluster::handshake_accept(*t.b, secret, "test-server", 2000);
        ASSERT_TRUE(hello.ok());
        auto c = cluster::answer_hello(std::move(t.b), *hello, HelloReply{}, kTransportsAll, 2000);
        ASSERT_TRUE(c.ok()) << c.status().message();
        server_conn = std::move(c).value();
    });
    Hello h;
    h.role = ConnRole::data;
    h.transports = kTransportsAll;
    h.host_id = host_identity();
    auto reply = cluster::handshake_connect(*t.a, h, secret, "test", 2000);
    ASSERT_TRUE(reply.ok());
    EXPECT_EQ(reply->transport, static_cast<uint32_t>(Transport::shm));
    // As a client in another container would: the offer arrives, the memfd cannot be opened.
    Bytes payload;
    ASSERT_TRUE(cluster::recv_expect(*t.a, MsgType::transport_offer, payload, 2000, "test").ok());
    ASSERT_TRUE(decode_transport_offer(payload).ok());
    ASSERT_TRUE(
        cluster::send_control(*t.a, MsgType::transport_ready, TransportReady{0, "no such file", ""}).ok());
    server.join();
    ASSERT_TRUE(server_conn);
    EXPECT_EQ(server_conn->transport(), Transport::tcp);
    Negotiated n;
    n.client = std::move(t.a);
    n.server = std::move(server_conn);
    expect_frames_flow(n);
    EXPECT_EQ(shm_mappings(), before);  // the offered rings were dropped
}

}  // namespace
}  // namespace td::net
