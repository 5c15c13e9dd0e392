// Discovery over mDNS between network namespaces: workers announce themselves in one namespace, a head in
// another (joined by a veth pair the test creates) finds them, uses those of its cluster and protocol, and
// lists the others with the reason. Each process runs Avahi's responder embedded (TANDEM_MDNS=embedded), so
// no daemon or D-Bus is needed. Needs root (ip netns); skipped otherwise, or where the build has no Avahi.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/discovery.h"
#include "net/mdns.h"
#include "test-child-process.h"
#include "test-util.h"

namespace td {
namespace {

using nlohmann::json;

std::string ip_binary() {
    for (const char *p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
        if (access(p, X_OK) == 0) return p;
    return "";
}

int sh(const std::string &command) {
    return std::system((command + " >/dev/null 2>&1").c_str());
}

// Two namespaces A and B joined by a veth pair (10.213.0.1 in A, 10.213.0.2 in B), removed at the end.
class TwoNamespaces {
public:
    TwoNamespaces() {
        const std::string id = std::to_string(getpid());
        a_ = "tdA" + id;
        b_ = "tdB" + id;
        const std::string va = "tdv" + id + "a", vb = "tdv" + id + "b";
        const std::string ip = ip_binary();
        ok_ = !ip.empty() && sh(ip + " netns add " + a_) == 0 && sh(ip + " netns add " + b_) == 0 &&
              sh(ip + " link add " + va + " type veth peer name " + vb) == 0 &&
              sh(ip + " link set " + va + " netns " + a_) == 0 &&
              sh(ip + " link set " + vb + " netns " + b_) == 0 &&
              sh(ip + " -n " + a_ + " addr add 10.213.0.1/24 dev " + va) == 0 &&
              sh(ip + " -n " + b_ + " addr add 10.213.0.2/24 dev " + vb) == 0 &&
              sh(ip + " -n " + a_ + " link set " + va + " up") == 0 &&
              sh(ip + " -n " + b_ + " link set " + vb + " up") == 0 &&
              sh(ip + " -n " + a_ + " link set lo up") == 0 &&  // workers of A reach each other through it
              sh(ip + " -n " + b_ + " link set lo up") == 0;
    }
    ~TwoNamespaces() {
        const std::string ip = ip_binary();
        sh(ip + " netns del " + a_);  // takes the veth pair with it
        sh(ip + " netns del " + b_);
    }
    bool ok() const { return ok_; }
    std::vector<std::string> in_a() const { return {ip_binary(), "netns", "exec", a_}; }
    std::vector<std::string> in_b() const { return {ip_binary(), "netns", "exec", b_}; }

private:
    std::string a_, b_;
    bool ok_ = false;
};

class Discovery : public ::testing::Test {
protected:
    void SetUp() override {
        if (!net::mdns_supported())
            GTEST_SKIP() << "this build has no Avahi (libavahi-client-dev, libavahi-core-dev)";
        if (geteuid() != 0 || ip_binary().empty())
            GTEST_SKIP() << "needs root and ip(8) for network namespaces";
        if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP() << "missing stories260K";
        setenv("TANDEM_MDNS", "embedded", 1);  // a host's daemon must not announce for a namespace
    }

    // A worker in namespace A on 10.213.0.1 with `args` added; its port from its "listening on" line.
    std::unique_ptr<test::ChildProcess> worker(const TwoNamespaces &ns, const std::vector<std::string> &args,
                                               const std::vector<std::string> &env = {}) {
        auto w = std::make_unique<test::ChildProcess>();
        w->set_prefix(ns.in_a());
        std::vector<std::string> all = {"worker",
                                        "--listen",
                                        "10.213.0.1:0",
                                        "-t",
                                        "1",
                                        "--cache-dir",
                                        cache_.file("w" + std::to_string(n_workers_++))};
        all.insert(all.end(), args.begin(), args.end());
        w->start(all, "announcing cluster", env);
        EXPECT_TRUE(w->running()) << w->log();
        return w;
    }

    test::TempDir cache_;
    int n_workers_ = 0;
};

std::string port_of(const test::ChildProcess &w) {
    const std::string log = w.log();
    const size_t at = log.find("listening on 10.213.0.1:");
    return at == std::string::npos ? "?" : log.substr(at + 24, log.find('\n', at) - at - 24);
}

TEST_F(Discovery, AHeadInAnotherNamespaceUsesItsClusterAndSaysWhyNotTheOthers) {
    TwoNamespaces ns;
    if (!ns.ok()) GTEST_SKIP() << "cannot create network namespaces here (ip netns add failed)";
    auto lab1 = worker(ns, {"--cluster", "lab"});
    auto lab2 = worker(ns, {"--cluster", "lab"});
    auto other = worker(ns, {"--cluster", "other"});
    auto old = worker(ns, {"--cluster", "lab"}, {"TANDEM_PROTOCOL_VERSION_OVERRIDE=6"});
    const std::string a1 = "10.213.0.1:" + port_of(*lab1), a2 = "10.213.0.1:" + port_of(*lab2);
    const std::string ao = "10.213.0.1:" + port_of(*other), av = "10.213.0.1:" + port_of(*old);

    // `tandem discover` in B lists all four with what a head of cluster "lab" makes of each.
    auto d = test::run_tandem_with_stdin_file({"discover", "--cluster", "lab", "--timeout", "3", "--json"},
                                              "/dev/null", ns.in_b());
    ASSERT_EQ(d.exit_code, 0) << d.err;
    const json found = json::parse(d.out);
    std::map<std::string, json> by_address;
    for (const json &f : found) by_address[f["address"].get<std::string>()] = f;
    ASSERT_EQ(by_address.size(), 4u) << d.out;
    EXPECT_TRUE(by_address[a1]["usable"].get<bool>()) << d.out;
    EXPECT_TRUE(by_address[a2]["usable"].get<bool>()) << d.out;
    EXPECT_FALSE(by_address[ao]["usable"].get<bool>()) << d.out;
    EXPECT_EQ(by_address[ao]["reason"], "belongs to cluster 'other', not 'lab' (--cluster)") << d.out;
    EXPECT_FALSE(by_address[av]["usable"].get<bool>()) << d.out;
    EXPECT_EQ(by_address[av]["reason"].get<std::string>().rfind(
                  "speaks protocol 6, this build speaks " + std::to_string(net::kProtocolVersion), 0),
              0u)
        << d.out;
    const json &txt = by_address[a1]["txt"];
    EXPECT_EQ(txt["cluster"], "lab");
    EXPECT_EQ(txt["proto"], std::to_string(net::kProtocolVersion));
    EXPECT_EQ(txt["cores"], "1");
    EXPECT_GT(std::stod(txt["gflops"].get<std::string>()), 0.0);
    EXPECT_GT(std::stoull(txt["mem"].get<std::string>()), 0u);

    // `tandem run --discover` in B runs on the two lab workers (a 2-stage pipeline) and gives one machine's
    // text; it says which workers it did not use and why.
    const std::vector<std::string> gen = {
        "-m", test::shared_path("models/stories260K.gguf"), "-p", "Once upon a time", "-n", "16", "--temp",
        "0"};
    std::vector<std::string> args = {"run"};
    args.insert(args.end(), gen.begin(), gen.end());
    auto local = test::run_tandem(args);
    ASSERT_EQ(local.exit_code, 0) << local.err;
    args.insert(args.end(), {"--discover", "--cluster", "lab", "--wire", "f32", "--stats"});
    auto r = test::run_tandem_with_stdin_file(args, "/dev/null", ns.in_b());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, local.out);
    EXPECT_NE(r.err.find("placement (2 workers in 2 stages"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(a1), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(a2), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not used: belongs to cluster 'other'"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("not used: speaks protocol 6"), std::string::npos) << r.err;

    // `tandem up --yes` in B finds the same two and serves on them (the launcher's nodes come from discovery
    // when no --workers is given).
    test::ChildProcess up;
    up.set_prefix(ns.in_b());
    up.start({"up", "-m", test::shared_path("models/stories260K.gguf"), "--cluster", "lab", "--min-workers",
              "2", "--port", "0", "--yes"},
             "server ready at http://127.0.0.1:", {}, std::chrono::seconds(90));
    ASSERT_TRUE(up.running()) << up.log();
    EXPECT_NE(up.log().find("tandem up: 2 usable nodes of 4 found"), std::string::npos) << up.log();
    EXPECT_NE(up.log().find(a1), std::string::npos) << up.log();
    EXPECT_EQ(up.signal_and_reap(SIGTERM), 0) << up.log();

    // --min-workers waits for the count and returns as soon as it is there; more than there are fails in
    // time, naming what it found.
    const auto t0 = std::chrono::steady_clock::now();
    auto two = test::run_tandem_with_stdin_file(
        {"discover", "--cluster", "lab", "--min-workers", "2", "--timeout", "20"}, "/dev/null", ns.in_b());
    EXPECT_EQ(two.exit_code, 0) << two.err;
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
    args = {"run"};
    args.insert(args.end(), gen.begin(), gen.end());
    args.insert(args.end(),
                {"--discover", "--cluster", "lab", "--min-workers", "3", "--discover-timeout", "2"});
    auto three = test::run_tandem_with_stdin_file(args, "/dev/null", ns.in_b());
    EXPECT_NE(three.exit_code, 0);
    EXPECT_NE(three.err.find(
                  "discovery found 2 usable workers of cluster 'lab' in 2.0 s, 3 wanted (--min-workers)"),
              std::string::npos)
        << three.err;
}

// A worker that joins after the head started looking is picked up while the head waits for --min-workers.
TEST_F(Discovery, AHeadWaitsForAWorkerThatStartsLater) {
    TwoNamespaces ns;
    if (!ns.ok()) GTEST_SKIP() << "cannot create network namespaces here (ip netns add failed)";
    test::ProcessResult result;
    std::thread head([&] {
        result = test::run_tandem_with_stdin_file(
            {"discover", "--cluster", "late", "--min-workers", "1", "--timeout", "30", "--json"}, "/dev/null",
            ns.in_b());
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    auto w = worker(ns, {"--cluster", "late"});
    head.join();
    ASSERT_EQ(result.exit_code, 0) << result.err;
    const json found = json::parse(result.out);
    ASSERT_EQ(found.size(), 1u) << result.out;
    EXPECT_EQ(found[0]["address"], "10.213.0.1:" + port_of(*w));
}

// What a head makes of an announcement, without a network: its protocol and cluster must match; the TXT
// record a worker builds carries both.
TEST(DiscoveryJudge, ProtocolAndClusterDecide) {
    net::HelloReply hello;
    hello.build_id = "0.1.0+abc";
    hello.n_threads = 8;
    hello.mem_available = 3ull << 30;
    hello.gflops = 123.4f;
    net::MdnsService s;
    s.address = "10.0.0.2";
    s.port = 9000;
    s.txt = cluster::announcement_txt(hello, "lab");
    EXPECT_EQ(s.endpoint(), "10.0.0.2:9000");
    EXPECT_EQ(s.get("cores"), "8");
    EXPECT_EQ(s.get("gflops"), "123.4");
    EXPECT_TRUE(cluster::judge_worker(s, "lab").usable);
    const cluster::FoundWorker other = cluster::judge_worker(s, "default");
    EXPECT_FALSE(other.usable);
    EXPECT_EQ(other.reason, "belongs to cluster 'lab', not 'default' (--cluster)");
    s.txt["proto"] = "6";
    const cluster::FoundWorker old = cluster::judge_worker(s, "lab");
    EXPECT_FALSE(old.usable);
    EXPECT_EQ(
        old.reason.rfind("speaks protocol 6, this build speaks " + std::to_string(net::kProtocolVersion), 0),
        0u)
        << old.reason;
    s.txt.erase("proto");
    EXPECT_FALSE(cluster::judge_worker(s, "lab").usable);
    // Two usable of three, one wanted more than there are: the message names what was found.
    std::vector<cluster::FoundWorker> found = {cluster::judge_worker(s, "lab")};
    s.txt = cluster::announcement_txt(hello, "lab");
    found.push_back(cluster::judge_worker(s, "lab"));
    found.push_back(cluster::judge_worker(s, "lab"));
    cluster::DiscoverOptions o;
    o.cluster_name = "lab";
    EXPECT_TRUE(cluster::enough_workers(found, o).ok());
    EXPECT_EQ(cluster::usable_worker_list(found), "10.0.0.2:9000,10.0.0.2:9000");
    o.min_workers = 3;
    const Status st = cluster::enough_workers(found, o);
    EXPECT_EQ(st.kind(), ErrorKind::not_found);
    EXPECT_NE(st.message().find("discovery found 2 usable workers of cluster 'lab'"), std::string::npos)
        << st.message();
    EXPECT_NE(st.message().find("not used: its announcement has no protocol version"), std::string::npos)
        << st.message();
}

// Listening on loopback, a worker is not announced (no one on the LAN could reach it); neither with
// --no-announce.
TEST(DiscoveryFlags, LoopbackAndNoAnnounceAreNotAnnounced) {
    test::TempDir cache;
    test::ChildProcess w;
    w.start({"worker", "--listen", "127.0.0.1:0", "-t", "1", "--cache-dir", cache.path(), "--cluster", "lab"},
            "listening on ");
    ASSERT_TRUE(w.running()) << w.log();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const std::string log = w.log();
    EXPECT_EQ(log.find("announcing"), std::string::npos) << log;
    if (net::mdns_supported()) {
        EXPECT_NE(log.find("not announced on the LAN (listening on loopback"), std::string::npos) << log;
    }
    auto both = test::run_tandem({"run", "-p", "x", "--workers", "127.0.0.1:1", "--discover"});
    EXPECT_NE(both.exit_code, 0);
    EXPECT_NE(both.err.find("give --workers or --discover, not both"), std::string::npos) << both.err;
    auto min = test::run_tandem({"run", "-p", "x", "--min-workers", "2"});
    EXPECT_NE(min.exit_code, 0);
    EXPECT_NE(min.err.find("--min-workers needs --discover"), std::string::npos) << min.err;
}

}  // namespace
}  // namespace td
