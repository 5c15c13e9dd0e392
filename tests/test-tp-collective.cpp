// PeerCollective over real connections (UNIX socketpairs between threads, and shared-memory rings, where
// parts are read in place): both algorithms give every rank the rank-order sum bit for bit, for 2, 3 and 4
// ranks and small and large vectors, in f32, f16 and bf16; a rank that goes away fails its peers' collective
// at once, naming it.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <random>
#include <thread>

#include "cluster/tp-collective.h"
#include "net/shm.h"
#include "tensor/fp16.h"

namespace td::cluster {
namespace {

// A linked pair of connections: a socketpair, or shared rings beside it (as the handshake sets them up).
std::pair<std::unique_ptr<net::Connection>, std::unique_ptr<net::Connection>> link_pair(bool shm) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    auto ca = net::connection_from_fd(fds[0]), cb = net::connection_from_fd(fds[1]);
    EXPECT_TRUE(ca.ok() && cb.ok());
    if (!shm) return {std::move(ca).value(), std::move(cb).value()};
    auto pending = net::shm_create();
    EXPECT_TRUE(pending.ok()) << pending.status().message();
    auto region = net::shm_attach(pending->offer);
    EXPECT_TRUE(region.ok()) << region.status().message();
    pending->region->close_fd();
    return {net::shm_connection(std::move(pending->region), std::move(ca).value(), true),
            net::shm_connection(std::move(region).value(), std::move(cb).value(), false)};
}

// n ranks, fully linked.
std::vector<std::unique_ptr<PeerCollective>> make_group(int n, net::ReduceType reduce, bool shm = false) {
    std::vector<std::string> names;
    for (int r = 0; r < n; ++r) names.push_back("rank" + std::to_string(r));
    std::vector<std::unique_ptr<PeerCollective>> g;
    for (int r = 0; r < n; ++r) g.push_back(std::make_unique<PeerCollective>(r, n, names, reduce, 5000));
    for (int a = 0; a < n; ++a)
        for (int b = a + 1; b < n; ++b) {
            auto [ca, cb] = link_pair(shm);
            EXPECT_TRUE(g[a]->attach(b, std::move(ca)).ok());
            EXPECT_TRUE(g[b]->attach(a, std::move(cb)).ok());
        }
    return g;
}

float round_to(net::ReduceType t, float v) {
    if (t == net::ReduceType::f16) return fp16_to_fp32(fp32_to_fp16(v));
    if (t == net::ReduceType::bf16) return bf16_to_fp32(fp32_to_bf16(v));
    return v;
}

class PeerCollectiveOver : public ::testing::TestWithParam<bool> {};  // shared rings or a socketpair

TEST_P(PeerCollectiveOver, EveryRankGetsTheRankOrderSumBitForBit) {
    const bool shm = GetParam();
    if (shm && !net::shm_supported()) GTEST_SKIP() << "no shared memory on this platform";
    for (net::ReduceType reduce : {net::ReduceType::f32, net::ReduceType::f16, net::ReduceType::bf16})
        for (int n : {2, 3, 4})
            for (size_t len : {size_t{7}, size_t{2048}, size_t{100003}}) {  // direct, direct, reduce-scatter
                SCOPED_TRACE(::testing::Message() << net::reduce_type_name(reduce) << " " << n << " ranks " << len);
                auto g = make_group(n, reduce, shm);
                std::mt19937 rng(static_cast<uint32_t>(n * 1000 + len));
                std::uniform_real_distribution<float> u(-1.0f, 1.0f);
                std::vector<std::vector<float>> data(n, std::vector<float>(len));
                for (auto &d : data)
                    for (float &v : d) v = u(rng);
                // The rank-order sum of the rounded parts. With reduce-scatter the reduced chunks are rounded
                // once more on the way back; the check below compares the ranks with each other for that case.
                std::vector<float> want(len);
                for (size_t i = 0; i < len; ++i) {
                    float s = round_to(reduce, data[0][i]);
                    for (int r = 1; r < n; ++r) s += round_to(reduce, data[r][i]);
                    want[i] = s;
                }
                const bool scatter = n > 2 && len * net::reduce_type_bytes(reduce) > PeerCollective::kDirectMaxBytes;
                for (int round = 0; round < 3; ++round) {  // sequence numbers advance together
                    auto d = data;
                    std::vector<Status> st(n);
                    std::vector<std::thread> ts;
                    for (int r = 0; r < n; ++r)
                        ts.emplace_back([&, r] { st[r] = g[r]->all_reduce_sum(d[r].data(), len); });
                    for (auto &t : ts) t.join();
                    for (const Status &s : st) ASSERT_TRUE(s.ok()) << s.message();
                    for (int r = 1; r < n; ++r)
                        ASSERT_EQ(0, std::memcmp(d[0].data(), d[r].data(), len * sizeof(float))) << "rank " << r;
                    if (!scatter || reduce == net::ReduceType::f32) {
                        for (size_t i = 0; i < len; ++i) ASSERT_EQ(d[0][i], want[i]) << i;
                    } else {
                        for (size_t i = 0; i < len; ++i) ASSERT_EQ(d[0][i], round_to(reduce, want[i])) << i;
                    }
                }
                EXPECT_EQ(g[0]->stats().all_reduces, 3u);
            }
}

TEST_P(PeerCollectiveOver, GatherBringsEveryRanksBytesToRankZero) {
    if (GetParam() && !net::shm_supported()) GTEST_SKIP() << "no shared memory on this platform";
    auto g = make_group(3, net::ReduceType::f32, GetParam());
    std::vector<std::vector<uint8_t>> mine = {{1}, {2, 2}, {}};
    std::vector<std::vector<std::vector<uint8_t>>> out(3);
    std::vector<std::thread> ts;
    for (int r = 0; r < 3; ++r) ts.emplace_back([&, r] { ASSERT_TRUE(g[r]->gather(mine[r], out[r]).ok()); });
    for (auto &t : ts) t.join();
    EXPECT_EQ(out[0], mine);
    EXPECT_TRUE(out[1].empty() && out[2].empty());
    // After frames of odd sizes, the next parts lie unaligned in a ring: they are summed all the same.
    std::vector<std::vector<float>> d(3, std::vector<float>(2048));
    for (int r = 0; r < 3; ++r)
        for (size_t i = 0; i < d[r].size(); ++i)
            d[r][i] = static_cast<float>(r + 1) * 0.25f + static_cast<float>(i);
    ts.clear();
    for (int r = 0; r < 3; ++r)
        ts.emplace_back([&, r] { ASSERT_TRUE(g[r]->all_reduce_sum(d[r].data(), 2048).ok()); });
    for (auto &t : ts) t.join();
    for (int r = 0; r < 3; ++r)
        for (size_t i = 0; i < 2048; ++i)
            ASSERT_EQ(d[r][i], 1.5f + 3.0f * static_cast<float>(i)) << r << " " << i;
}

INSTANTIATE_TEST_SUITE_P(Links, PeerCollectiveOver, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool> &i) { return i.param ? "shm" : "socket"; });

TEST(PeerCollective, ARankThatGoesAwayFailsItsPeersNamingIt) {
    auto g = make_group(3, net::ReduceType::f32);
    g[2]->close();  // rank 2 is gone: its links close
    std::vector<float> d(16, 1.0f);
    Status s = g[0]->all_reduce_sum(d.data(), d.size());
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.kind(), ErrorKind::disconnected);
    EXPECT_NE(s.message().find("rank2 (rank 2)"), std::string::npos) << s.message();
}

TEST(PeerCollective, AStalledRankTimesOut) {
    std::vector<std::string> names = {"a", "b"};
    PeerCollective a(0, 2, names, net::ReduceType::f32, 300), b(1, 2, names, net::ReduceType::f32, 300);
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    auto ca = net::connection_from_fd(fds[0]), cb = net::connection_from_fd(fds[1]);
    ASSERT_TRUE(ca.ok() && cb.ok());
    ASSERT_TRUE(a.attach(1, std::move(ca).value()).ok());
    ASSERT_TRUE(b.attach(0, std::move(cb).value()).ok());
    std::vector<float> d(16, 1.0f);
    Status s = a.all_reduce_sum(d.data(), d.size());  // b never takes part
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.kind(), ErrorKind::failed);
    EXPECT_NE(s.message().find("b (rank 1)"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace td::cluster
