#include "cluster/probe.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "cluster/handshake.h"
#include "cluster/node-info.h"
#include "cluster/tp-collective.h"
#include "cluster/wire.h"
#include "core/check.h"
#include "core/log.h"
#include "core/mmap.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/pack.h"
#include "net/codec.h"
#include "tensor/tensor.h"

namespace td::cluster {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sorted copy's quantiles: q in [0, 1], nearest rank.
double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
    return v[i];
}

net::LinkSample summarize(uint64_t bytes, uint32_t mode, const std::vector<double> &t) {
    net::LinkSample s;
    s.bytes = bytes;
    s.mode = mode;
    s.count = static_cast<uint32_t>(t.size());
    s.p50 = quantile(t, 0.5);
    s.p90 = quantile(t, 0.9);
    s.p99 = quantile(t, 0.99);
    s.max = t.empty() ? 0.0 : *std::max_element(t.begin(), t.end());
    return s;
}

constexpr int kProbeTimeoutMs = 10000;  // one echo or ack; a probe of a 64 MiB message over 100 Mb/s fits
// A lock-step probe's longest wait for the other rank: its connection, its copies of the matrices (a second
// or two under the sanitizers), one segment.
constexpr int kSyncTimeoutMs = 30000;
// Rounds a lock-step probe runs at least, whatever its budget: at a prompt chunk's rows a round takes tens of
// milliseconds, and 4-5 rounds in a 300 ms budget read the pair's excess at 512 rows anywhere from 1.4 to 8.2
// ms.
constexpr uint32_t kMinSyncRounds = 8;

// Seconds per call of fn: one warm-up, then calls until budget_ms have passed (at least 3).
template <typename Fn>
double time_calls(int budget_ms, Fn &&fn) {
    fn();
    size_t calls = 0;
    const auto t0 = Clock::now();
    double s = 0.0;
    do {
        fn();
        ++calls;
        s = seconds_since(t0);
    } while (calls < 3 || s * 1000.0 < budget_ms);
    return s / static_cast<double>(calls);
}

// The non-matmul work of a layer, per call, as Context::layer_forward_rows calls it.
void time_row_ops(const net::ProbeOps &o, uint32_t budget_ms, ThreadPool &pool,
                  net::ProbeComputeReply &reply) {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto random = [&](size_t n) {
        std::vector<float> v(n);
        for (float &x : v) x = dist(rng);
        return v;
    };
    const int budget = static_cast<int>(std::max<uint32_t>(1, budget_ms));
    {
        std::vector<float> x = random(o.n_embd), w(o.n_embd, 1.0f), y(o.n_embd);
        reply.norm_s =
            time_calls(budget, [&] { kernels::rmsnorm(x.data(), w.data(), y.data(), o.n_embd, 1e-5f); });
    }
    {
        std::vector<float> g = random(o.n_ff), u = random(o.n_ff), out(o.n_ff);
        reply.act_s = time_calls(budget, [&] { kernels::swiglu(g.data(), u.data(), out.data(), o.n_ff); });
    }
    {
        const int32_t heads = static_cast<int32_t>(o.n_head + o.n_head_kv);
        std::vector<float> q = random(static_cast<size_t>(heads) * o.head_dim);
        kernels::RopeParams rp;
        rp.n_rot = static_cast<int32_t>(o.head_dim);
        int32_t pos = 0;
        reply.rope_s = time_calls(budget, [&] {
            kernels::rope(q.data(), heads, static_cast<int32_t>(o.head_dim), pos, rp);
            pos = (pos + 1) & 1023;  // positions stay small: the rotation keeps the values bounded
        });
    }
    {
        const int32_t n_gqa = static_cast<int32_t>(o.n_head / o.n_head_kv);
        const size_t kv_elems = static_cast<size_t>(o.n_pos) * o.head_dim;
        std::vector<uint16_t> k(kv_elems), v(kv_elems);
        const std::vector<float> kf = random(kv_elems), vf = random(kv_elems);
        kernels::store_row(kf.data(), k.data(), true, static_cast<int64_t>(kv_elems));
        kernels::store_row(vf.data(), v.data(), true, static_cast<int64_t>(kv_elems));
        std::vector<float> q = random(static_cast<size_t>(n_gqa) * o.head_dim), out(q.size());
        std::vector<float> scores(2 * static_cast<size_t>(n_gqa) * o.n_pos);
        const float scale = 1.0f / std::sqrt(static_cast<float>(o.head_dim));
        reply.attn_s = time_calls(budget, [&] {
            kernels::attention_group(q.data(), n_gqa, k.data(), v.data(), true, o.head_dim,
                                     static_cast<int32_t>(o.head_dim), static_cast<int32_t>(o.n_pos), scale,
                                     0.0f, scores.data(), out.data());
        });
    }
    reply.dispatch_s = time_calls(budget, [&] { pool.run([](int, int) {}); });
}

// A probed matrix's type and size, checked. `what` names the request in errors.
struct MatrixPlan {
    DType type = DType::f32;
    size_t row_bytes = 0;
    uint64_t bytes = 0;
    bool pack = false;  // stored packed, as the engine would
};
Result<MatrixPlan> plan_matrix(const net::ProbeMatrix &m, const char *what) {
    if (!dtype_is_known(m.dtype)) return invalid_input("{}: unknown type {}", what, m.dtype);
    MatrixPlan p;
    p.type = static_cast<DType>(m.dtype);
    const DTypeTraits &tr = dtype_traits(p.type);
    const kernels::TypeKernels *k = kernels::type_kernels(p.type);
    if (!tr.supported || k == nullptr || k->from_float == nullptr)
        return invalid_input("{}: no kernels for {}", what, tr.name);
    if (m.n_in % tr.block_size != 0)
        return invalid_input("{}: {} rows of {} elements are not whole {} blocks", what, m.n_out, m.n_in,
                             tr.name);
    p.row_bytes = dtype_row_bytes(p.type, m.n_in);
    p.bytes = static_cast<uint64_t>(p.row_bytes) * m.n_out;
    if (p.bytes > net::kMaxProbeMatrixBytes)
        return invalid_input("{}: a {} x {} {} matrix is {} bytes, limit {}", what, m.n_out, m.n_in, tr.name,
                             p.bytes, net::kMaxProbeMatrixBytes);
    p.pack = kernels::packable(p.type, m.n_in, m.n_out) && kernels::pack_pays(p.type);
    return p;
}

// One copy of the matrix at `dst` (p.bytes): a few distinct quantized rows repeated (the values do not matter
// for speed, only their validity), packed where p.pack says (through `arena`'s slot 2).
Status fill_matrix(const net::ProbeMatrix &m, const MatrixPlan &p, uint8_t *dst, ProbeArena &arena,
                   std::mt19937 &rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const kernels::TypeKernels *k = kernels::type_kernels(p.type);
    const uint32_t n_seed = std::min<uint32_t>(m.n_out, 16);
    std::vector<float> src(m.n_in);
    for (uint32_t r = 0; r < n_seed; ++r) {
        for (float &v : src) v = dist(rng);
        k->from_float(src.data(), dst + r * p.row_bytes, m.n_in);
    }
    for (uint32_t r = n_seed; r < m.n_out; ++r)
        std::memcpy(dst + r * p.row_bytes, dst + (r % n_seed) * p.row_bytes, p.row_bytes);
    if (p.pack) {
        TD_ASSIGN_OR_RETURN(uint8_t *const packed, arena.get(2, p.bytes));
        kernels::pack_rows(p.type, dst, m.n_in, m.n_out, packed);
        std::memcpy(dst, packed, p.bytes);
    }
    return {};
}

TensorView matrix_view(const net::ProbeMatrix &m, const MatrixPlan &p, uint8_t *data) {
    TensorView w;
    w.name = "probe";
    w.type = p.type;
    w.n_dims = 2;
    w.ne[0] = m.n_in;
    w.ne[1] = m.n_out;
    w.data = data;  // timing only: with packing, data holds the packed bytes too
    w.packed = p.pack ? w.data : nullptr;
    return w;
}
}  // namespace

LinkOptions default_link_options() {
    LinkOptions o;
    for (uint64_t b = 64; b <= (64u << 10); b *= 4) o.rtt_sizes.push_back(b);
    for (uint64_t b = 1u << 20; b <= (64u << 20); b *= 4) o.stream_sizes.push_back(b);
    return o;
}

Result<std::unique_ptr<ProbeClient>> ProbeClient::connect(const std::string &address,
                                                          const net::ClusterSecret &secret, int timeout_ms,
                                                          uint32_t transports) {
    std::unique_ptr<ProbeClient> c(new ProbeClient());
    c->address_ = address;
    const auto t0 = Clock::now();
    net::Hello hello;
    hello.role = net::ConnRole::probe;
    hello.build_id = build_id();
    hello.node_name = "probe";
    hello.transports = transports;
    TD_ASSIGN_OR_RETURN(Dialed d, dial_node(address, hello, secret, timeout_ms));
    c->conn_ = std::move(d.conn);
    c->hello_ = std::move(d.reply);
    c->connect_seconds_ = seconds_since(t0);
    return c;
}

Result<net::LinkSample> ProbeClient::round_trips(uint64_t bytes, int budget_ms) {
    if (bytes > net::kMaxEchoPayload)
        return invalid_input("netbench: {} bytes exceeds the echo limit", bytes);
    std::vector<uint8_t> out(bytes), in;
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 131u + 7u);
    std::vector<double> times;
    const auto t0 = Clock::now();
    for (int warm = 0; warm < 2; ++warm) {  // first messages pay for buffer growth on both ends
        const uint64_t id = next_id_++;
        TD_TRY(conn_->send_msg(net::MsgType::echo, id, out, kProbeTimeoutMs));
        net::FrameHeader h;
        TD_TRY(recv_frame(*conn_, h, in, kProbeTimeoutMs, address_));
    }
    while (times.size() < static_cast<size_t>(kMinRounds) ||
           (seconds_since(t0) * 1000.0 < budget_ms && times.size() < 100000)) {
        const uint64_t id = next_id_++;
        const auto t1 = Clock::now();
        TD_TRY(conn_->send_msg(net::MsgType::echo, id, out, kProbeTimeoutMs));
        net::FrameHeader h;
        TD_TRY(recv_frame(*conn_, h, in, kProbeTimeoutMs, address_));
        times.push_back(seconds_since(t1));
        if (h.type != static_cast<uint16_t>(net::MsgType::echo_reply) || h.request_id != id ||
            in.size() != bytes || (bytes > 0 && in[bytes - 1] != out[bytes - 1]))
            return invalid_input("worker {}: a wrong echo ({} of {} bytes, request {} for {})", address_,
                                 in.size(), bytes, h.request_id, id);
    }
    net::LinkSample s = summarize(bytes, 0, times);
    s.gbps = s.p50 > 0 ? 2.0 * static_cast<double>(bytes) / s.p50 / 1e9 : 0.0;
    return s;
}

Result<net::LinkSample> ProbeClient::stream(uint64_t bytes, int budget_ms) {
    if (bytes > net::kMaxEchoPayload)
        return invalid_input("netbench: {} bytes exceeds the echo limit", bytes);
    std::vector<uint8_t> out(bytes, 0x5a), in;
    constexpr size_t kWindow = 2;  // messages in flight: the link never idles waiting for an ack
    const size_t min_count = 4;
    std::vector<double> gaps;
    size_t sent = 0, acked = 0;
    auto recv_ack = [&]() -> Status {
        net::FrameHeader h;
        TD_TRY(recv_frame(*conn_, h, in, kProbeTimeoutMs, address_));
        uint64_t n = 0;
        if (h.type != static_cast<uint16_t>(net::MsgType::echo_reply) || in.size() != 8)
            return invalid_input("worker {}: a wrong stream acknowledgement", address_);
        std::memcpy(&n, in.data(), 8);
        if (n != bytes) return invalid_input("worker {}: acknowledged {} of {} bytes", address_, n, bytes);
        ++acked;
        return {};
    };
    const auto t0 = Clock::now();
    auto last = t0;
    while (sent < min_count || seconds_since(t0) * 1000.0 < budget_ms) {
        TD_TRY(conn_->send(net::MsgType::echo, next_id_++, net::kEchoSink,
                           std::span<const std::span<const uint8_t>>(
                               std::vector<std::span<const uint8_t>>{std::span<const uint8_t>(out)}),
                           kProbeTimeoutMs));
        ++sent;
        if (sent - acked >= kWindow) {
            TD_TRY(recv_ack());
            const auto now = Clock::now();
            gaps.push_back(std::chrono::duration<double>(now - last).count());
            last = now;
        }
    }
    while (acked < sent) {
        TD_TRY(recv_ack());
        const auto now = Clock::now();
        gaps.push_back(std::chrono::duration<double>(now - last).count());
        last = now;
    }
    const double total = seconds_since(t0);
    net::LinkSample s = summarize(bytes, 1, gaps);
    s.count = static_cast<uint32_t>(sent);
    s.gbps = total > 0 ? static_cast<double>(bytes) * static_cast<double>(sent) / total / 1e9 : 0.0;
    return s;
}

Result<std::vector<net::LinkSample>> ProbeClient::measure_link(const LinkOptions &options) {
    std::vector<net::LinkSample> out;
    for (uint64_t b : options.rtt_sizes) {
        TD_ASSIGN_OR_RETURN(net::LinkSample s, round_trips(b, options.budget_ms));
        out.push_back(s);
    }
    for (uint64_t b : options.stream_sizes) {
        TD_ASSIGN_OR_RETURN(net::LinkSample s, stream(b, options.budget_ms));
        out.push_back(s);
    }
    return out;
}

Result<net::ProbeComputeReply> ProbeClient::compute(const net::ProbeCompute &request) {
    const uint64_t id = next_id_++;
    TD_TRY(send_control(*conn_, net::MsgType::probe_compute, request, id));
    // Each point runs for about budget_ms (a big matrix at many rows for one call, which may take longer).
    const int64_t points = static_cast<int64_t>(request.matrices.size() * request.rows.size());
    const int timeout_ms = static_cast<int>(std::min<int64_t>(
        INT32_MAX / 2, 60000 + points * (static_cast<int64_t>(request.budget_ms) * 3 + 2000)));
    std::vector<uint8_t> payload;
    TD_TRY(recv_expect(*conn_, net::MsgType::probe_compute_reply, payload, timeout_ms,
                       fmt::format("worker {}", address_)));
    TD_ASSIGN_OR_RETURN(net::ProbeComputeReply r, net::decode_probe_compute_reply(payload));
    if (r.seconds.size() != static_cast<size_t>(points))
        return invalid_input("worker {}: {} compute timings for {} points", address_, r.seconds.size(),
                             points);
    return r;
}

Result<std::vector<net::LinkSample>> ProbeClient::link_to(const std::string &target,
                                                          const LinkOptions &options) {
    net::ProbeLink m;
    m.address = target;
    m.budget_ms = static_cast<uint32_t>(std::clamp(options.budget_ms, 1, int(net::kMaxProbeBudgetMs)));
    m.rtt_sizes = options.rtt_sizes;
    m.stream_sizes = options.stream_sizes;
    m.transports = options.transports;
    const uint64_t id = next_id_++;
    TD_TRY(send_control(*conn_, net::MsgType::probe_link, m, id));
    const int n = static_cast<int>(m.rtt_sizes.size() + m.stream_sizes.size());
    const int timeout_ms = 15000 + n * (static_cast<int>(m.budget_ms) * 2 + 3 * kProbeTimeoutMs);
    std::vector<uint8_t> payload;
    TD_TRY(recv_expect(*conn_, net::MsgType::probe_link_reply, payload, timeout_ms,
                       fmt::format("worker {} measuring its link to {}", address_, target)));
    TD_ASSIGN_OR_RETURN(net::ProbeLinkReply r, net::decode_probe_link_reply(payload));
    return r.samples;
}

Result<net::ProbeSyncReply> ProbeClient::sync(const net::ProbeSync &request) {
    if (request.peer.empty()) return invalid_input("a lock-step probe needs a peer for {}", address_);
    const uint64_t id = next_id_++;
    TD_TRY(send_control(*conn_, net::MsgType::probe_sync, request, id));
    // The peer's connection and both ranks' copies of the matrices, then the budget.
    const int timeout_ms = 2 * kSyncTimeoutMs + static_cast<int>(request.budget_ms) * 4;
    std::vector<uint8_t> payload;
    TD_TRY(recv_expect(*conn_, net::MsgType::probe_sync_reply, payload, timeout_ms,
                       fmt::format("worker {} in lock step with {}", address_, request.peer)));
    TD_ASSIGN_OR_RETURN(net::ProbeSyncReply r, net::decode_probe_sync_reply(payload));
    if (r.ranks.size() != 2 || r.segments == 0)
        return invalid_input("worker {}: a lock-step probe with {} ranks and {} segments", address_,
                             r.ranks.size(), r.segments);
    return r;
}

double link_latency_seconds(const std::vector<net::LinkSample> &samples) {
    const net::LinkSample *best = nullptr;
    for (const net::LinkSample &s : samples)
        if (s.mode == 0 && (best == nullptr || s.bytes < best->bytes)) best = &s;
    return best == nullptr ? 0.0 : best->p50 / 2.0;
}

double link_bytes_per_second(const std::vector<net::LinkSample> &samples) {
    const net::LinkSample *best = nullptr;
    for (const net::LinkSample &s : samples)
        if (s.mode == 1 && (best == nullptr || s.bytes > best->bytes)) best = &s;
    if (best != nullptr) return best->gbps * 1e9;
    for (const net::LinkSample &s : samples)  // no stream: the largest round trip (both ways)
        if (s.mode == 0 && (best == nullptr || s.bytes > best->bytes)) best = &s;
    return best == nullptr ? 0.0 : best->gbps * 1e9;
}

// ---- the worker's side -------------------------------------------------------------------------------

Result<uint8_t *> ProbeArena::get(size_t slot, size_t bytes) {
    TD_ASSERT(slot < kSlots);
    HugeBuffer &b = buffers_[slot];
    if (b.size() < bytes) {
        b = HugeBuffer();  // unmapped before the larger one is mapped
        TD_ASSIGN_OR_RETURN(b, HugeBuffer::allocate(bytes));
    }
    return b.data();
}

double measure_read_bytes_per_second(ThreadPool &pool, size_t bytes, int passes, ProbeArena *arena) {
    const int nth = pool.n_threads();
    const size_t per = (bytes / static_cast<size_t>(nth)) & ~size_t{63};
    if (per == 0) return 0.0;
    // In 2 MiB pages, as the engine maps its weights: streamed from 4 KiB pages the same bytes read ~15-35%
    // slower (TLB misses, prefetchers stopping at page boundaries), and predictions drawn from it fall short.
    ProbeArena own;
    Result<uint8_t *> mem = (arena != nullptr ? arena : &own)->get(0, per * static_cast<size_t>(nth));
    if (!mem.ok()) return 0.0;
    uint8_t *const data = *mem;
    std::memset(data, 1, per * static_cast<size_t>(nth));  // fault the pages in
    std::vector<uint64_t> sink(static_cast<size_t>(nth));
    double best = 0.0;
    for (int pass = 0; pass < std::max(1, passes); ++pass) {
        const auto t0 = Clock::now();
        pool.run([&](int ith, int) {
            const uint64_t *p = reinterpret_cast<const uint64_t *>(data + per * static_cast<size_t>(ith));
            uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains, so the adds are not what limits
            for (size_t i = 0; i + 4 <= per / 8; i += 4) {
                a += p[i];
                b += p[i + 1];
                c += p[i + 2];
                d += p[i + 3];
            }
            sink[static_cast<size_t>(ith)] += a + b + c + d;
        });
        const double s = seconds_since(t0);
        if (s > 0) best = std::max(best, static_cast<double>(per) * nth / s);
    }
    volatile uint64_t keep = sink[0];  // the sums must not be optimised away
    (void)keep;
    return best;
}

size_t default_probe_working_set() {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (l3 <= 0) {
        std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");  // "32768K"
        long v = 0;
        char unit = 0;
        if (in >> v >> unit) l3 = unit == 'M' ? v << 20 : v << 10;
    }
    const size_t ws = std::max<size_t>(size_t{64} << 20, 4 * static_cast<size_t>(std::max(0L, l3)));
    return std::min<size_t>(ws, net::kMaxProbeWorkingSet);
}

Result<net::ProbeComputeReply> run_compute_probe(const net::ProbeCompute &request, ThreadPool &pool,
                                                 ProbeArena *arena) {
    ProbeArena own;
    if (arena == nullptr) arena = &own;
    net::ProbeComputeReply reply;
    reply.n_threads = static_cast<uint32_t>(pool.n_threads());
    const size_t ws = request.working_set > 0 ? request.working_set : default_probe_working_set();
    reply.read_gbps = measure_read_bytes_per_second(pool, ws, 3, arena) / 1e9;
    uint32_t max_rows = 1;
    for (uint32_t r : request.rows) max_rows = std::max(max_rows, r);
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint8_t> scratch;
    for (const net::ProbeMatrix &m : request.matrices) {
        TD_ASSIGN_OR_RETURN(const MatrixPlan mp, plan_matrix(m, "probe_compute"));
        const uint64_t mat_bytes = mp.bytes;
        // Copies that together exceed the working set, so every call reads its weights from memory.
        const size_t copies =
            std::clamp<size_t>((ws + mat_bytes - 1) / std::max<uint64_t>(mat_bytes, 1), 1, 256);
        // In 2 MiB pages, as the engine's weights are (see measure_read_bytes_per_second).
        TD_ASSIGN_OR_RETURN(uint8_t *const buf, arena->get(1, copies * mat_bytes));
        TD_TRY(fill_matrix(m, mp, buf, *arena, rng));
        for (size_t c = 1; c < copies; ++c) std::memcpy(buf + c * mat_bytes, buf, mat_bytes);
        std::vector<TensorView> views(copies);
        for (size_t c = 0; c < copies; ++c) views[c] = matrix_view(m, mp, buf + c * mat_bytes);
        std::vector<float> x(static_cast<size_t>(max_rows) * m.n_in),
            y(static_cast<size_t>(max_rows) * m.n_out);
        for (float &v : x) v = dist(rng);
        for (uint32_t rows : request.rows) {
            kernels::matmul(views[0], x.data(), y.data(), rows, pool, scratch);  // warm-up (scratch, code)
            size_t calls = 0;
            const auto t0 = Clock::now();
            double s = 0.0;
            do {
                kernels::matmul(views[(calls + 1) % copies], x.data(), y.data(), rows, pool, scratch);
                ++calls;
                s = seconds_since(t0);
            } while (s * 1000.0 < request.budget_ms);
            reply.seconds.push_back(s / static_cast<double>(calls));
        }
    }
    if (request.ops.n_embd > 0) time_row_ops(request.ops, request.budget_ms, pool, reply);
    return reply;
}

namespace {

// One rank of a lock-step probe over `coll` (a pair, its link attached): net::ProbeSync's loop. Rank 0's
// reply carries both ranks' figures (rank 1's through the collective's gather), rank 1's its own.
Result<net::ProbeSyncReply> run_sync_rank(const net::ProbeSync &req, ThreadPool &pool, ProbeArena &arena,
                                          PeerCollective &coll) {
    const bool lead = coll.rank() == 0;
    const size_t ws = req.working_set > 0 ? req.working_set : default_probe_working_set();
    std::vector<MatrixPlan> plans;
    uint64_t layer = 0;
    uint32_t max_in = 1, max_out = 1;
    for (const net::ProbeMatrix &m : req.matrices) {
        TD_ASSIGN_OR_RETURN(MatrixPlan p, plan_matrix(m, "probe_sync"));
        layer += p.bytes;
        max_in = std::max(max_in, m.n_in);
        max_out = std::max(max_out, m.n_out);
        plans.push_back(p);
    }
    if (layer > net::kMaxProbeMatrixBytes)
        return invalid_input("probe_sync: matrices of {} bytes, limit {}", layer, net::kMaxProbeMatrixBytes);
    // Copies of the whole set that together exceed the working set: the weights come from memory, as a
    // forward pass's layers do.
    const size_t copies = std::clamp<size_t>((ws + layer - 1) / std::max<uint64_t>(layer, 1), 1, 256);
    TD_ASSIGN_OR_RETURN(uint8_t *const buf, arena.get(1, copies * layer));
    std::mt19937 rng(13);
    std::vector<std::vector<TensorView>> views(copies);
    uint64_t at = 0;
    for (size_t k = 0; k < plans.size(); ++k) {
        TD_TRY(fill_matrix(req.matrices[k], plans[k], buf + at, arena, rng));
        at += plans[k].bytes;
    }
    for (size_t c = 1; c < copies; ++c) std::memcpy(buf + c * layer, buf, layer);
    for (size_t c = 0; c < copies; ++c) {
        at = c * layer;
        for (size_t k = 0; k < plans.size(); ++k) {
            views[c].push_back(matrix_view(req.matrices[k], plans[k], buf + at));
            at += plans[k].bytes;
        }
    }
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(req.rows) * max_in), y(static_cast<size_t>(req.rows) * max_out);
    for (float &v : x) v = dist(rng);
    std::vector<uint8_t> scratch;
    // The all-reduce's values, and a flag rank 0 adds: 1 while it wants another round.
    const size_t n = static_cast<size_t>(req.rows) * req.n_embd;
    std::vector<float> sum(n + 1);
    auto reduce = [&](bool more) -> Status {
        std::fill(sum.begin(), sum.end(), 0.0f);
        sum[n] = lead && more ? 1.0f : 0.0f;
        return coll.all_reduce_sum(sum.data(), n + 1);
    };
    auto segment = [&](size_t c, int half) {
        const size_t from = half == 0 ? 0 : req.split, to = half == 0 ? req.split : views[c].size();
        for (size_t k = from; k < to; ++k)
            kernels::matmul(views[c][k], x.data(), y.data(), req.rows, pool, scratch);
    };
    // Untimed: one round (code, scratch, and the other rank getting ready: the first all-reduce waits for
    // it).
    segment(0, 0);
    segment(0, 1);
    TD_TRY(reduce(true));
    net::ProbeSyncReply out;
    net::ProbeSyncRank mine;
    const auto t0 = Clock::now();
    size_t c = 1 % copies;
    for (bool more = true; more; c = (c + 1) % copies) {
        for (int half = 0; half < 2; ++half) {
            const auto t1 = Clock::now();
            segment(c, half);
            const auto t2 = Clock::now();
            TD_TRY(
                reduce(seconds_since(t0) * 1000.0 < req.budget_ms || out.segments + 2 < 2 * kMinSyncRounds));
            mine.compute_s += std::chrono::duration<double>(t2 - t1).count();
            mine.wait_s += seconds_since(t2);
            ++out.segments;
        }
        more = sum[n] >= 0.5f;
    }
    out.wall_s = seconds_since(t0);
    out.ranks.push_back(mine);
    std::vector<uint8_t> bytes;
    net::encode(out, bytes);
    std::vector<std::vector<uint8_t>> all;
    TD_TRY(coll.gather(bytes, all));
    if (lead) {
        TD_ASSIGN_OR_RETURN(net::ProbeSyncReply theirs, net::decode_probe_sync_reply(all.at(1)));
        if (theirs.ranks.size() != 1 || theirs.segments != out.segments)
            return invalid_input("probe_sync: the other rank ran {} segments, this one {}", theirs.segments,
                                 out.segments);
        out.ranks.push_back(theirs.ranks[0]);
    }
    return out;
}

// Rank 0: dials the peer, asks it to be rank 1, runs the probe with it.
Result<net::ProbeSyncReply> lead_sync(const net::ProbeSync &req, ThreadPool &pool, ProbeArena &arena,
                                      const net::ClusterSecret &secret) {
    TD_ASSIGN_OR_RETURN(auto client, ProbeClient::connect(req.peer, secret, 3000, req.transports));
    std::unique_ptr<net::Connection> link = client->take_connection();
    net::ProbeSync follower = req;
    follower.peer.clear();
    TD_TRY(send_control(*link, net::MsgType::probe_sync, follower, 1));
    PeerCollective coll(0, 2, {"this worker", req.peer}, static_cast<net::ReduceType>(req.reduce),
                        kSyncTimeoutMs);
    TD_TRY(coll.attach(1, std::move(link)));
    return run_sync_rank(req, pool, arena, coll);
}

// Rank 1: lends `conn` (rank 0's link) to the probe's collective; it is back in `conn` after.
Status follow_sync(const net::ProbeSync &req, std::unique_ptr<net::Connection> &conn, ThreadPool &pool,
                   ProbeArena &arena) {
    PeerCollective coll(1, 2, {conn->peer(), "this worker"}, static_cast<net::ReduceType>(req.reduce),
                        kSyncTimeoutMs);
    TD_TRY(coll.attach(0, std::move(conn)));
    Status s = run_sync_rank(req, pool, arena, coll).status();
    conn = coll.detach(0);
    return s;
}

}  // namespace

Result<std::unique_ptr<net::Connection>> accept_probe(std::unique_ptr<net::Connection> conn,
                                                      const std::string &name,
                                                      const net::ClusterSecret &secret, uint32_t transports) {
    TD_ASSIGN_OR_RETURN(net::Hello hello, handshake_accept(*conn, secret, name));
    if (hello.role != net::ConnRole::probe) {
        send_error(*conn, invalid_input("{} takes only probe connections", name));
        return invalid_input("{}: role {} where a probe connection was expected", conn->peer(),
                             static_cast<uint32_t>(hello.role));
    }
    net::HelloReply r;
    r.build_id = build_id();
    r.node_name = name;
    r.n_threads = 1;
    return answer_hello(std::move(conn), hello, r, transports);
}

void serve_probe(std::unique_ptr<net::Connection> &conn_owner, int default_threads,
                 const net::ClusterSecret &secret) {
    const std::string peer = conn_owner->peer();
    net::FrameHeader h;
    std::vector<uint8_t> payload, reply;
    std::unique_ptr<ThreadPool> pool;
    ProbeArena arena;
    auto pool_of = [&](uint32_t n_threads) -> ThreadPool & {
        const int nth = n_threads > 0 ? static_cast<int>(n_threads) : default_threads;
        if (!pool || pool->n_threads() != nth) pool = std::make_unique<ThreadPool>(nth);
        return *pool;
    };
    while (conn_owner) {
        net::Connection &conn = *conn_owner;
        Status s = conn.recv(h, payload, -1);
        if (!s.ok()) {
            if (s.kind() != ErrorKind::disconnected)
                log_warn("probe connection from {}: {}", peer, s.message());
            break;
        }
        const auto type = static_cast<net::MsgType>(h.type);
        Status rs;
        if (type == net::MsgType::echo) {
            if (h.flags & net::kEchoSink) {
                const uint64_t n = payload.size();
                reply.resize(8);
                std::memcpy(reply.data(), &n, 8);
                rs = conn.send_msg(net::MsgType::echo_reply, h.request_id, reply, kProbeTimeoutMs);
            } else {
                rs = conn.send_msg(net::MsgType::echo_reply, h.request_id, payload, kProbeTimeoutMs);
            }
        } else if (type == net::MsgType::probe_compute) {
            auto req = net::decode_probe_compute(payload);
            if (req.ok()) {
                auto r = run_compute_probe(*req, pool_of(req->n_threads), &arena);
                rs = r.ok() ? send_control(conn, net::MsgType::probe_compute_reply, *r, h.request_id)
                            : r.status();
            } else {
                rs = req.status();
            }
        } else if (type == net::MsgType::probe_link) {
            // Only a peer that proved the secret gets here, and the node we dial must prove it too.
            auto req = net::decode_probe_link(payload);
            Result<std::vector<net::LinkSample>> r = req.status();
            if (req.ok()) {
                auto c = ProbeClient::connect(req->address, secret, 3000, req->transports);
                LinkOptions o;
                if (c.ok()) {
                    o.rtt_sizes = req->rtt_sizes;
                    o.stream_sizes = req->stream_sizes;
                    o.budget_ms = static_cast<int>(req->budget_ms);
                    r = (*c)->measure_link(o);
                } else {
                    r = c.status();
                }
            }
            if (r.ok()) {
                net::ProbeLinkReply m;
                m.samples = std::move(r).value();
                rs = send_control(conn, net::MsgType::probe_link_reply, m, h.request_id);
            } else {
                rs = r.status();
            }
        } else if (type == net::MsgType::probe_sync) {
            auto req = net::decode_probe_sync(payload);
            if (!req.ok()) {
                rs = req.status();
            } else if (req->peer.empty()) {
                rs = follow_sync(*req, conn_owner, pool_of(req->n_threads), arena);
                if (!conn_owner) break;
            } else {
                auto r = lead_sync(*req, pool_of(req->n_threads), arena, secret);
                rs = r.ok() ? send_control(conn, net::MsgType::probe_sync_reply, *r, h.request_id)
                            : r.status();
            }
        } else if (type == net::MsgType::error) {
            break;
        } else {
            rs = invalid_input("unexpected {} message on a probe connection", net::msg_type_name(type));
        }
        if (!rs.ok()) {
            log_warn("probe connection from {}: {}", peer, rs.message());
            send_error(*conn_owner, rs);
            // A request that failed (a node it dials unreachable) leaves the connection usable; a connection
            // that failed fails its next recv.
            if (type != net::MsgType::probe_compute && type != net::MsgType::probe_link &&
                type != net::MsgType::probe_sync)
                break;
        }
    }
    if (conn_owner) conn_owner->close();
}

}  // namespace td::cluster
