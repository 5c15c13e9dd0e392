#include "cluster/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "cluster/cluster-engine.h"
#include "core/check.h"
#include "core/log.h"
#include "net/codec.h"

namespace td::cluster {
namespace {

using json = nlohmann::json;
using Key = std::tuple<uint32_t, int64_t, int64_t, int32_t>;

std::string host_of(const std::string &address) {
    std::string host;
    uint16_t port = 0;
    return net::parse_host_port(address, &host, &port).ok() ? host : address;
}

double gib(double bytes) {
    return bytes / 1073741824.0;
}

std::string fmt_seconds(double s) {
    if (s < 1e-3) return fmt::format("{:.0f} µs", s * 1e6);
    if (s < 1.0) return fmt::format("{:.2f} ms", s * 1e3);
    return fmt::format("{:.2f} s", s);
}

std::string fmt_size(double b) {
    if (b < 1024) return fmt::format("{:.0f} B", b);
    if (b < 1048576) return fmt::format("{:.3g} KiB", b / 1024);
    return fmt::format("{:.3g} MiB", b / 1048576);
}

// Every (type, n_in, n_out) the candidates would give a node, whole layers and output head included.
std::vector<net::ProbeMatrix> needed_matrices(const ModelShape &model, const ClusterSpec &spec) {
    std::set<std::tuple<uint32_t, uint32_t, uint32_t>> seen;
    std::vector<net::ProbeMatrix> out;
    auto add = [&](const ShapeMatrix &m) {
        const auto k = std::make_tuple(static_cast<uint32_t>(m.type), static_cast<uint32_t>(m.n_in),
                                       static_cast<uint32_t>(m.n_out));
        if (seen.insert(k).second) out.push_back({std::get<0>(k), std::get<1>(k), std::get<2>(k)});
    };
    for (const Layout &l : candidate_layouts(model, spec, 1))
        for (size_t s = 0; s < l.groups.size(); ++s)
            for (size_t r = 0; r < l.groups[s].size(); ++r) {
                const TpSlice &sl = l.slices[s][r];
                for (int32_t il = l.layers[s].first; il < l.layers[s].second; ++il)
                    for (const ShapeMatrix &x : model.layers[static_cast<size_t>(il)])
                        add(slice_matrix(x, model.hp, sl));
                if (s + 1 == l.groups.size()) add(slice_matrix(model.output, model.hp, sl));
            }
    return out;
}

// The row ops a probe measured (norm, activation, rope, attention per position, dispatch), from one node's
// figures to another's.
void copy_row_ops(NodeSpec &to, const NodeSpec &from) {
    to.norm_per_elem_s = from.norm_per_elem_s;
    to.act_per_elem_s = from.act_per_elem_s;
    to.rope_per_head_s = from.rope_per_head_s;
    to.attn_per_pos_s = from.attn_per_pos_s;
    to.dispatch_s = from.dispatch_s;
}

Result<std::vector<double>> run_probe(ProbeClient &client, const std::vector<net::ProbeMatrix> &matrices,
                                      const std::vector<int32_t> &rows, const PlanOptions &o,
                                      double *read_bps, const ModelShape *ops_of = nullptr,
                                      NodeSpec *ops_into = nullptr) {
    std::vector<double> seconds;
    for (size_t at = 0; at < matrices.size(); at += net::kMaxProbeMatrices) {
        net::ProbeCompute req;
        req.n_threads = static_cast<uint32_t>(std::max(0, o.n_threads));
        req.working_set = std::min<uint64_t>(o.working_set, net::kMaxProbeWorkingSet);
        req.budget_ms =
            static_cast<uint32_t>(std::clamp(o.probe_ms, 1, static_cast<int>(net::kMaxProbeBudgetMs)));
        req.matrices.assign(matrices.begin() + static_cast<std::ptrdiff_t>(at),
                            matrices.begin() + static_cast<std::ptrdiff_t>(
                                                   std::min(matrices.size(), at + net::kMaxProbeMatrices)));
        for (int32_t r : rows) req.rows.push_back(static_cast<uint32_t>(r));
        constexpr uint32_t kProbePositions = 256;
        if (ops_of != nullptr && at == 0) {
            const HParams &hp = ops_of->hp;
            req.ops = {static_cast<uint32_t>(hp.n_embd),   static_cast<uint32_t>(hp.n_ff),
                       static_cast<uint32_t>(hp.n_head),   static_cast<uint32_t>(hp.n_head_kv),
                       static_cast<uint32_t>(hp.head_dim), kProbePositions};
        }
        TD_ASSIGN_OR_RETURN(net::ProbeComputeReply rep, client.compute(req));
        if (ops_into != nullptr && req.ops.n_embd > 0) {
            const net::ProbeOps &p = req.ops;
            ops_into->norm_per_elem_s = rep.norm_s / p.n_embd;
            ops_into->act_per_elem_s = rep.act_s / p.n_ff;
            ops_into->rope_per_head_s = rep.rope_s / (p.n_head + p.n_head_kv);
            ops_into->attn_per_pos_s = rep.attn_s / (static_cast<double>(p.n_head / p.n_head_kv) * p.n_pos);
            ops_into->dispatch_s = rep.dispatch_s;
        }
        if (read_bps != nullptr) *read_bps = std::max(*read_bps, rep.read_gbps * 1e9);
        seconds.insert(seconds.end(), rep.seconds.begin(), rep.seconds.end());
    }
    return seconds;
}

void store(NodeSpec &n, const std::vector<net::ProbeMatrix> &mats, const std::vector<int32_t> &rows,
           const std::vector<double> &seconds) {
    for (size_t i = 0; i < mats.size(); ++i)
        for (size_t j = 0; j < rows.size(); ++j)
            n.measured[Key{mats[i].dtype, mats[i].n_in, mats[i].n_out, rows[j]}] =
                seconds[i * rows.size() + j];
    // Roofline numbers for shapes and rows nobody measured: the best rate seen.
    double flops = 0, bps = 0;
    for (const auto &[k, t] : n.measured) {
        const auto [type, n_in, n_out, r] = k;
        if (t <= 0) continue;
        flops = std::max(flops, 2.0 * static_cast<double>(n_in) * static_cast<double>(n_out) * r / t);
        if (r == 1)
            bps = std::max(bps,
                           static_cast<double>(dtype_row_bytes(static_cast<DType>(type), n_in)) * n_out / t);
    }
    if (flops > 0) n.flops_per_s = flops;
    if (bps > 0 && n.read_bytes_per_s > 0) n.matvec_efficiency = std::min(1.0, bps / n.read_bytes_per_s);
}

Result<double> json_number(const json &j, const char *key, const std::string &where, bool required,
                           double def) {
    if (!j.contains(key)) {
        if (required) return invalid_input("{}.{} is missing", where, key);
        return def;
    }
    if (!j[key].is_number() || !(j[key].get<double>() > 0) || !std::isfinite(j[key].get<double>()))
        return invalid_input("{}.{} must be a positive number", where, key);
    return j[key].get<double>();
}

Result<LinkSpec> json_link(const json &j, const std::string &where) {
    if (!j.is_object())
        return invalid_input("{} must be an object with latency_us and bandwidth_gbps", where);
    LinkSpec l;
    TD_ASSIGN_OR_RETURN(double lat, json_number(j, "latency_us", where, true, 0));
    TD_ASSIGN_OR_RETURN(double bw, json_number(j, "bandwidth_gbps", where, true, 0));
    l.latency_s = lat * 1e-6;
    l.bytes_per_s = bw * 1e9 / 8.0;  // gigabits per second, as links are sold
    // Measured single messages (`plan --json`'s links carry them), optional.
    if (j.contains("messages")) {
        const json &m = j["messages"];
        if (!m.is_array() || m.size() > net::kMaxProbeSizes * 2)
            return invalid_input("{}.messages must be a list of at most {} {{bytes, one_way_us}}", where,
                                 net::kMaxProbeSizes * 2);
        std::vector<std::pair<double, double>> measured;
        for (size_t i = 0; i < m.size(); ++i) {
            const std::string w = fmt::format("{}.messages[{}]", where, i);
            if (!m[i].is_object()) return invalid_input("{} must be an object with bytes and one_way_us", w);
            TD_ASSIGN_OR_RETURN(double b, json_number(m[i], "bytes", w, true, 0));
            TD_ASSIGN_OR_RETURN(double t, json_number(m[i], "one_way_us", w, true, 0));
            measured.emplace_back(b, t * 1e-6);
        }
        l.set_messages(std::move(measured));
    }
    return l;
}

}  // namespace

std::vector<int32_t> plan_rows(const PlanOptions &o, int n_nodes) {
    std::set<int32_t> rows{1};
    for (int32_t b : o.batches)
        for (int32_t s = 1; s <= std::max(1, n_nodes); ++s)
            rows.insert((b + std::min(b, s) - 1) / std::min(b, s));
    const int32_t step = std::min(o.predict.n_batch, o.predict.n_prompt);
    for (int32_t s = 1; s <= std::max(1, n_nodes); ++s) rows.insert(std::min(step, auto_chunk_rows(step, s)));
    std::vector<int32_t> out(rows.begin(), rows.end());
    if (out.size() > net::kMaxProbeRows) out.resize(net::kMaxProbeRows);
    return out;
}

std::vector<int32_t> sync_rows(const PlanOptions &o) {
    const auto cap = static_cast<int32_t>(net::kMaxBatchRows);
    int32_t largest = 1;
    for (int32_t b : o.batches) largest = std::max(largest, b);
    const int32_t step = std::min(o.predict.n_batch, o.predict.n_prompt);
    const std::set<int32_t> rows{1, std::clamp(largest, 1, cap),
                                 std::clamp(auto_chunk_rows(step, 1), 1, cap)};
    return {rows.begin(), rows.end()};
}

std::vector<uint64_t> link_message_sizes(const ModelShape &model, const PlanOptions &o, int n_nodes) {
    const auto embd = static_cast<uint64_t>(model.hp.n_embd);
    const uint64_t reduce_row = embd * net::reduce_type_bytes(o.predict.reduce);
    std::vector<uint64_t> want{64};
    for (int32_t r : plan_rows(o, n_nodes)) {
        const auto rows = static_cast<uint64_t>(r);
        want.push_back(net::forward_payload_bytes(static_cast<uint32_t>(r), static_cast<uint32_t>(embd),
                                                  o.predict.wire, false));  // a hop of r rows
        want.push_back(rows * reduce_row);                                  // an all-reduce's part, direct
        for (int n = 3; n <= n_nodes; ++n)                                  // reduce-scatter's chunks
            if (rows * reduce_row > 64u << 10) want.push_back(rows * reduce_row / static_cast<uint64_t>(n));
    }
    std::sort(want.begin(), want.end());
    // A message's time is close to linear in its size between sizes 2x apart (interpolation carries it);
    // the largest is always measured.
    std::vector<uint64_t> sizes;
    for (uint64_t b : want) {
        b = std::min<uint64_t>(b, net::kMaxEchoPayload);
        if (sizes.empty() || b >= 2 * sizes.back())
            sizes.push_back(b);
        else if (b == want.back() || b == net::kMaxEchoPayload)
            sizes.back() = b;
    }
    if (sizes.size() > net::kMaxProbeSizes)
        sizes.erase(sizes.begin() + 1, sizes.end() - net::kMaxProbeSizes + 1);
    return sizes;
}

Result<ClusterSpec> measure_cluster(const std::vector<std::string> &workers, const ModelShape &model,
                                    const PlanOptions &o, const net::ClusterSecret &secret,
                                    const std::function<void(const std::string &)> &progress) {
    auto say = [&](const std::string &s) {
        if (progress) progress(s);
    };
    ClusterSpec spec;
    spec.name = "measured";
    if (o.head_node && workers.empty()) return invalid_input("no head node to measure");
    std::vector<std::unique_ptr<ProbeClient>> clients;
    for (const std::string &w : workers) {
        TD_ASSIGN_OR_RETURN(auto c, ProbeClient::connect(w, secret, 3000, o.transports));
        NodeSpec n;
        n.name = w;
        n.host = host_of(w);
        n.threads = o.n_threads > 0 ? o.n_threads : static_cast<int32_t>(c->hello().n_threads);
        n.mem_bytes = c->hello().mem_available;
        spec.nodes.push_back(n);
        clients.push_back(std::move(c));
    }
    // The head's own node listens on loopback; it is on the head's host, the address the workers see the
    // head at (this end of a probe connection to one of them).
    const size_t ref = o.head_node && workers.size() > 1 ? 1 : 0;  // a node the workers can reach us from
    if (o.head_node) {
        spec.head_node = 0;
        spec.nodes[0].name = "head node";
        spec.nodes[0].host = workers.size() > 1 ? host_of(clients[ref]->local_address()) : spec.nodes[0].host;
    }
    // Links: round trips of a small message and of every size a candidate layout sends (link_message_sizes),
    // and a stream for anything larger.
    LinkOptions lo;
    lo.budget_ms = o.link_ms;
    lo.transports = o.transports;
    lo.rtt_sizes = link_message_sizes(model, o, static_cast<int>(workers.size()));
    lo.stream_sizes = {std::max<uint64_t>(4u << 20, lo.rtt_sizes.back())};
    auto to_spec = [](const std::vector<net::LinkSample> &s) { return link_from_samples(s); };
    for (size_t i = 0; i < workers.size(); ++i) {
        say(fmt::format("measuring the link head -> {}", workers[i]));
        TD_ASSIGN_OR_RETURN(auto s, clients[i]->measure_link(lo));
        spec.links[{-1, static_cast<int>(i)}] = to_spec(s);
        for (size_t j = 0; j < workers.size(); ++j) {
            // Nobody dials the head's node but the head (it is rank 0 and dials its peers): its links to the
            // others stand for both directions.
            if (i == j || (o.head_node && j == 0)) continue;
            say(fmt::format("measuring the link {} -> {}", workers[i], workers[j]));
            TD_ASSIGN_OR_RETURN(auto t, clients[i]->link_to(workers[j], lo));
            spec.links[{static_cast<int>(i), static_cast<int>(j)}] = to_spec(t);
        }
    }
    // Worker -> head (the results' hop): each worker measures its link to a probe listener here, at the
    // address it would send results to (this end's address on its probe connection).
    {
        std::string host;
        uint16_t port = 0;
        TD_TRY(net::parse_host_port(clients[ref]->local_address(), &host, &port));
        TD_ASSIGN_OR_RETURN(auto listener, net::tcp_listen(host, 0));
        std::atomic<bool> done{false};
        std::thread acceptor([&] {
            std::vector<std::thread> conns;
            while (!done) {
                auto c = listener->accept(100);
                if (!c.ok()) continue;
                conns.emplace_back([conn = std::move(c).value(), &secret, &o]() mutable {
                    auto a = accept_probe(std::move(conn), "head", secret, o.transports);
                    if (a.ok())
                        serve_probe(*a, 1, secret);
                    else
                        log_warn("plan: probe connection refused: {}", a.status().message());
                });
            }
            for (auto &t : conns) t.join();
        });
        Status st;
        for (size_t i = 0; i < workers.size() && st.ok(); ++i) {
            say(fmt::format("measuring the link {} -> head", workers[i]));
            auto t = clients[i]->link_to(listener->address(), lo);
            if (t.ok())
                spec.links[{static_cast<int>(i), -1}] = to_spec(*t);
            else
                st = t.status();
        }
        done = true;
        acceptor.join();
        listener->close();
        TD_TRY(st);
    }
    if (o.head_node)
        for (size_t j = 1; j < workers.size(); ++j)
            spec.links[{static_cast<int>(j), 0}] = spec.links[{0, static_cast<int>(j)}];
    if (!spec.links.empty()) spec.head_link = spec.links.begin()->second;
    // Compute: every shape the candidates need, alone on each node.
    const std::vector<net::ProbeMatrix> mats = needed_matrices(model, spec);
    const std::vector<int32_t> rows = plan_rows(o, static_cast<int>(workers.size()));
    // Rounds one node after another, each point the median of its rounds (the mean of two): the figure for
    // the minutes the layout will run in, on a host whose other tenants come and go (the fastest round alone
    // predicted 10-20% high when the host then slowed down), without one round's hiccup: every layer runs
    // the same shapes, so one 20 ms point that the VM's host preempted moved a 16-layer prediction by 25-40%
    // (one node predicted 44-61 tokens/s in four plans a minute apart with the mean of two).
    std::vector<std::vector<std::vector<double>>> runs(workers.size());  // node, round, point
    std::vector<double> bps(workers.size(), 0.0);
    for (int round = 0; round < std::max(1, o.rounds); ++round)
        for (size_t i = 0; i < workers.size(); ++i) {
            say(fmt::format("measuring {}: {} matrices x {} row counts (round {})", workers[i], mats.size(),
                            rows.size(), round + 1));
            NodeSpec ops;
            TD_ASSIGN_OR_RETURN(auto sec, run_probe(*clients[i], mats, rows, o, &bps[i], &model, &ops));
            NodeSpec &n = spec.nodes[i];
            if (round == 0 || ops.attn_per_pos_s < n.attn_per_pos_s) copy_row_ops(n, ops);
            runs[i].push_back(std::move(sec));
        }
    // Nodes of one kind (one host, the same threads: cores of one machine) pool their rounds: each point the
    // median of all of them, the plain read and the row ops the kind's best. Measured each on its own,
    // seconds apart on a host that swings by 15-30%, two identical workers streamed weights at 14.3 and 22.1
    // GB/s in one plan, and the next plan split a tensor-parallel layer 1.00 : 1.16, then 1.37, then 1.51
    // between them, where the even split ran 1.10-1.16x as fast side by side on a quiet host.
    std::vector<size_t> kind(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) {
        kind[i] = i;
        if (!o.pool_kinds) continue;
        for (size_t j = 0; j < i; ++j)
            if (spec.nodes[j].host == spec.nodes[i].host && spec.nodes[j].threads == spec.nodes[i].threads) {
                kind[i] = kind[j];
                break;
            }
    }
    std::vector<std::vector<double>> best(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) {
        if (kind[i] != i) continue;
        best[i].assign(runs[i].front().size(), 0.0);
        for (size_t k = 0; k < best[i].size(); ++k) {
            std::vector<double> v;
            for (size_t j = 0; j < workers.size(); ++j)
                if (kind[j] == i)
                    for (const auto &r : runs[j]) v.push_back(r[k]);
            std::sort(v.begin(), v.end());
            best[i][k] = v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2.0;
        }
        for (size_t j = i + 1; j < workers.size(); ++j) {
            if (kind[j] != i) continue;
            bps[i] = std::max(bps[i], bps[j]);
            if (spec.nodes[j].attn_per_pos_s < spec.nodes[i].attn_per_pos_s)
                copy_row_ops(spec.nodes[i], spec.nodes[j]);
        }
    }
    for (size_t i = 0; i < workers.size(); ++i) {
        const size_t q = kind[i];
        NodeSpec &n = spec.nodes[i];
        if (q != i) copy_row_ops(n, spec.nodes[q]);
        n.read_bytes_per_s = bps[q] > 0 ? bps[q] : n.read_bytes_per_s;
        store(n, mats, rows, best[q]);
    }
    // Together: every pair of nodes of one host, alone and at once seconds apart, since this host's bandwidth
    // moves minute to minute (two cores' plain read went from 1.1x one core's to 1.9x and back): against the
    // alone figures of the node rounds above, a minute earlier, one pair's streaming slowdown read 1.00 in
    // one plan and 1.93 in the next. kTogetherRounds rounds of node i alone, node j alone, both at once, each
    // timing the layer's largest matrix for kWindowMs at the most rows (computing), then at one row (a decode
    // step's weight stream). The overlap of the two nodes' windows is taken from when their replies came and
    // the slowdown of the overlapped part solved for (a round that overlapped less than half is dropped);
    // with the probes' memory kept per connection (ProbeArena) they overlapped by 90-100%, where fresh pages
    // each request had them miss each other (a pair on one core read 0.86-1.85x; 20-40 ms points unaligned
    // under the sanitizers read 1.17x computing). Each figure is the median of its ratios (both nodes).
    if (o.contention) {
        constexpr int kTogetherRounds = 3;
        constexpr int kWindowMs = 300;
        using Clock = std::chrono::steady_clock;
        net::ProbeMatrix largest{};
        uint64_t largest_bytes = 0;
        for (const ShapeMatrix &x : model.layers[0])
            if (x.bytes() > largest_bytes) {
                largest_bytes = x.bytes();
                largest = {static_cast<uint32_t>(x.type), static_cast<uint32_t>(x.n_in),
                           static_cast<uint32_t>(x.n_out)};
            }
        PlanOptions window_o = o;
        window_o.probe_ms = kWindowMs;
        struct Timed {
            std::vector<double> seconds;
            Clock::time_point end;  // when the reply came
        };
        auto timed = [&](size_t q, const std::vector<net::ProbeMatrix> &mats,
                         const std::vector<int32_t> &prow, const PlanOptions &po) -> Result<Timed> {
            Timed t;
            TD_ASSIGN_OR_RETURN(t.seconds, run_probe(*clients[q], mats, prow, po, nullptr));
            t.end = Clock::now();
            return t;
        };
        // Alone then together, the points one window of window_s each; the ratios of point k go to out[k %
        // rows], corrected for the part of the windows that did not overlap (read from when the replies came:
        // the last point's calls are short, so its window ends as its reply goes).
        auto paired = [&](size_t i, size_t j, const std::vector<net::ProbeMatrix> &mats,
                          const std::vector<int32_t> &prow, const PlanOptions &po, double window_s,
                          std::vector<std::vector<double>> *out) -> Status {
            TD_ASSIGN_OR_RETURN(Timed ai, timed(i, mats, prow, po));
            TD_ASSIGN_OR_RETURN(Timed aj, timed(j, mats, prow, po));
            auto fi = std::async(std::launch::async, [&] { return timed(i, mats, prow, po); });
            auto fj = std::async(std::launch::async, [&] { return timed(j, mats, prow, po); });
            auto ti = fi.get();
            auto tj = fj.get();
            TD_TRY(ti.status());
            TD_TRY(tj.status());
            const double apart = std::abs(std::chrono::duration<double>(ti->end - tj->end).count());
            const double phi = std::max(0.0, window_s - apart) / window_s;  // the overlapped share
            if (phi < 0.5) return {};
            out->resize(prow.size());
            for (auto [alone, both] : {std::pair{&ai, &*ti}, std::pair{&aj, &*tj}})
                for (size_t k = 0; k < alone->seconds.size() && k < both->seconds.size(); ++k) {
                    if (alone->seconds[k] <= 0 || both->seconds[k] <= 0) continue;
                    // Calls in the window: phi of it at 1/f the speed alone, the rest at full speed, so the
                    // measured ratio r = 1 / (phi / f + 1 - phi).
                    // Two nodes doing the same work at once each get at least half of what they had alone
                    // (a shared core or bus serializes them at worst), so f <= 2: past it is the correction
                    // amplifying noise (a pair on one core read 2.3-3.96x, and `--tp 3` and the 3-stage
                    // pipeline over it at 16 sequences were predicted 1.3-1.7x low).
                    const double r = both->seconds[k] / alone->seconds[k];
                    const double d = 1.0 / r - 1.0 + phi;
                    (*out)[k % prow.size()].push_back(d > phi / 2.0 ? phi / d : 2.0);
                }
            return {};
        };
        auto median = [](std::vector<double> v) {
            std::sort(v.begin(), v.end());
            return v.empty() ? 1.0 : std::max(1.0, v[v.size() / 2]);
        };
        for (size_t i = 0; i < spec.nodes.size(); ++i)
            for (size_t j = i + 1; j < spec.nodes.size(); ++j) {
                if (spec.nodes[i].host != spec.nodes[j].host) continue;
                say(fmt::format("measuring {} and {} alone and together", workers[i], workers[j]));
                std::vector<std::vector<double>> ratios;  // computing (the most rows), streaming (one row)
                for (int round = 0; round < kTogetherRounds; ++round)
                    TD_TRY(paired(i, j, {largest}, {rows.back(), 1}, window_o, kWindowMs / 1000.0, &ratios));
                ratios.resize(2);
                const std::vector<double> &compute = ratios[0], &stream = ratios[1];
                spec.together[{static_cast<int>(i), static_cast<int>(j)}] = median(compute);
                spec.together_stream[{static_cast<int>(i), static_cast<int>(j)}] = median(stream);
            }
    }
    // Pairs in lock step (net::ProbeSync): rank 0's half of a layer (an even two-way split), the attention's
    // matrices, an all-reduce, the FFN's, another all-reduce, over and over through the engine's own
    // collective. What a segment took beyond the slower rank's own compute and the link's price of its
    // exchange is what the ranks of a group wait for each other's stalls at every collective (SyncPoint).
    if (o.sync_ms > 0 && workers.size() >= 2) {
        auto halves = tp_split(model.hp, {1.0, 1.0}, model.ff_unit);
        if (halves.ok()) {
            std::vector<net::ProbeMatrix> attn, ffn;
            for (const ShapeMatrix &x : model.layers[0]) {
                const ShapeMatrix m = slice_matrix(x, model.hp, (*halves)[0]);
                const net::ProbeMatrix pm{static_cast<uint32_t>(m.type), static_cast<uint32_t>(m.n_in),
                                          static_cast<uint32_t>(m.n_out)};
                (x.cut == ShapeCut::rows_kv || x.cut == ShapeCut::cols_kv ? attn : ffn).push_back(pm);
            }
            net::ProbeSync req;
            req.n_threads = static_cast<uint32_t>(std::max(0, o.n_threads));
            req.working_set = std::min<uint64_t>(o.working_set, net::kMaxProbeWorkingSet);
            req.budget_ms =
                static_cast<uint32_t>(std::clamp(o.sync_ms, 1, static_cast<int>(net::kMaxProbeBudgetMs)));
            req.n_embd = static_cast<uint32_t>(model.hp.n_embd);
            req.reduce = static_cast<uint32_t>(o.predict.reduce);
            req.split = static_cast<uint32_t>(attn.size());
            req.matrices = attn;
            req.matrices.insert(req.matrices.end(), ffn.begin(), ffn.end());
            req.transports = o.transports;
            for (size_t i = 0; i < workers.size(); ++i)
                for (size_t j = i + 1; j < workers.size(); ++j) {
                    const int a = static_cast<int>(i), b = static_cast<int>(j);
                    // Two nodes on shared cores take turns: in lock step each waits out the other's compute,
                    // which `together` prices already (and no layout puts them in one group): counted twice,
                    // `--tp 3` over cores 0, 1, 0 was predicted at 0.67-0.75 of what it ran.
                    if (spec.together_of(a, b) >= ClusterSpec::kSharedCore) continue;
                    say(fmt::format("measuring {} and {} in lock step", workers[i], workers[j]));
                    for (int32_t r : sync_rows(o)) {
                        req.rows = static_cast<uint32_t>(r);
                        req.peer = workers[j];
                        TD_ASSIGN_OR_RETURN(net::ProbeSyncReply rep, clients[i]->sync(req));
                        SyncPoint p;
                        p.rows = r;
                        p.segment_s = rep.wall_s / rep.segments;
                        for (const net::ProbeSyncRank &k : rep.ranks)
                            p.compute_s = std::max(p.compute_s, k.compute_s / rep.segments);
                        const double bytes = static_cast<double>(r) * model.hp.n_embd *
                                             static_cast<double>(net::reduce_type_bytes(o.predict.reduce));
                        p.link_s = std::max(spec.link(a, b).seconds(bytes), spec.link(b, a).seconds(bytes));
                        p.excess_s = std::max(0.0, p.segment_s - p.compute_s - p.link_s);
                        spec.sync[{a, b}].push_back(p);
                    }
                }
        }
    }
    return spec;
}

Result<ClusterSpec> cluster_from_json(const std::string &text) {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object())
        return invalid_input("the cluster description is not a JSON object");
    ClusterSpec c;
    c.name = j.value("name", std::string("described"));
    if (!j.contains("nodes") || !j["nodes"].is_array() || j["nodes"].empty())
        return invalid_input("nodes must be a non-empty array");
    for (size_t i = 0; i < j["nodes"].size(); ++i) {
        const json &n = j["nodes"][i];
        const std::string where = fmt::format("nodes[{}]", i);
        if (!n.is_object()) return invalid_input("{} must be an object", where);
        NodeSpec s;
        s.name = n.contains("name") && n["name"].is_string() ? n["name"].get<std::string>()
                                                             : fmt::format("node{}", i + 1);
        s.host = n.contains("host") && n["host"].is_string() ? n["host"].get<std::string>() : s.name;
        TD_ASSIGN_OR_RETURN(double mem, json_number(n, "memory_gib", where, true, 0));
        TD_ASSIGN_OR_RETURN(double bw, json_number(n, "mem_bw_gbs", where, true, 0));
        TD_ASSIGN_OR_RETURN(double gf, json_number(n, "gflops", where, true, 0));
        TD_ASSIGN_OR_RETURN(double eff, json_number(n, "matvec_efficiency", where, false, 0.7));
        TD_ASSIGN_OR_RETURN(double th, json_number(n, "threads", where, false, 1));
        if (eff > 1)
            return invalid_input("{}.matvec_efficiency is a share of the bandwidth, at most 1", where);
        s.mem_bytes = static_cast<uint64_t>(mem * 1073741824.0);
        s.read_bytes_per_s = bw * 1e9;
        s.flops_per_s = gf * 1e9;
        s.matvec_efficiency = eff;
        s.threads = static_cast<int32_t>(th);
        c.nodes.push_back(s);
    }
    if (j.contains("link")) {
        TD_ASSIGN_OR_RETURN(c.default_link, json_link(j["link"], "link"));
    }
    c.head_link = LinkSpec{5e-6, 20e9, {}};  // the head beside a node: loopback
    if (j.contains("head_link")) {
        TD_ASSIGN_OR_RETURN(c.head_link, json_link(j["head_link"], "head_link"));
    }
    if (j.contains("links")) {
        if (!j["links"].is_array()) return invalid_input("links must be an array");
        for (size_t i = 0; i < j["links"].size(); ++i) {
            const json &l = j["links"][i];
            const std::string where = fmt::format("links[{}]", i);
            TD_ASSIGN_OR_RETURN(LinkSpec ls, json_link(l, where));
            auto find = [&](const char *key) -> int {
                if (!l.contains(key) || !l[key].is_string()) return -2;
                for (size_t k = 0; k < c.nodes.size(); ++k)
                    if (c.nodes[k].name == l[key].get<std::string>()) return static_cast<int>(k);
                return -2;
            };
            const int a = find("from"), b = find("to");
            if (a < 0 || b < 0) return invalid_input("{}: from and to must name nodes", where);
            c.links[{a, b}] = ls;
        }
    }
    return c;
}

int recommend(const std::vector<PlanEntry> &entries) {
    // Within 2% a prediction cannot tell layouts apart, and a tensor-parallel group's ranks wait for each
    // other twice a layer, so a stall of any one stalls them all, which a prediction does not see: on the
    // loopback clusters of bench/plan-check.sh, `--tp 2` predicted at 486.0 tokens/s against the pipeline's
    // 485.5 measured 0.90 of it.
    auto widest = [](const Layout &l) {
        size_t w = 0;
        for (const auto &g : l.groups) w = std::max(w, g.size());
        return w;
    };
    // Of equally simple layouts, the one over the first-listed workers: layouts that differ only in which of
    // identical workers they use predict within 2% of each other, and plans a minute apart alternated between
    // them (one node over w1, then w2, then w0 of three cores of one kind).
    auto nodes_of = [](const Layout &l) {
        std::vector<int> v = l.nodes();
        std::sort(v.begin(), v.end());
        return v;
    };
    auto simpler = [&](const Layout &a, const Layout &b) {
        if (a.n_nodes() != b.n_nodes()) return a.n_nodes() < b.n_nodes();
        if (widest(a) != widest(b)) return widest(a) < widest(b);
        return nodes_of(a) < nodes_of(b);
    };
    int best = -1;
    double top = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
        const PlanEntry &e = entries[i];
        if (!e.prediction.fits) break;
        if (e.prediction.shares_core) continue;
        if (best < 0) {
            best = static_cast<int>(i);
            top = e.prediction.gen.tokens_per_s;
        } else if (e.prediction.gen.tokens_per_s >= 0.98 * top &&
                   simpler(e.layout, entries[static_cast<size_t>(best)].layout)) {
            best = static_cast<int>(i);
        }
    }
    return best;
}

Plan make_plan(const ModelShape &model, const ClusterSpec &cluster, const PlanOptions &options) {
    Plan plan;
    plan.model = model;
    plan.cluster = cluster;
    plan.options = options;
    for (const NodeSpec &n : cluster.nodes)
        plan.largest_node_bytes = std::max(plan.largest_node_bytes, n.mem_bytes);
    const std::vector<Layout> layouts = candidate_layouts(model, cluster, 1);
    for (int32_t b : options.batches) {
        PlanBatch pb;
        pb.batch = b;
        for (const Layout &l : layouts)
            pb.entries.push_back({l, predict(model, cluster, l, b, options.predict)});
        std::stable_sort(pb.entries.begin(), pb.entries.end(), [](const PlanEntry &x, const PlanEntry &y) {
            if (x.prediction.fits != y.prediction.fits) return x.prediction.fits;
            return x.prediction.gen.tokens_per_s > y.prediction.gen.tokens_per_s;
        });
        for (size_t i = 0; i < pb.entries.size(); ++i) {
            const PlanEntry &e = pb.entries[i];
            if (!e.prediction.fits) continue;
            const std::string k = e.layout.kind();
            int *slot = k == "one node"          ? &pb.best_single
                        : k == "pipeline"        ? &pb.best_pipeline
                        : k == "tensor parallel" ? &pb.best_tp
                                                 : &pb.best_hybrid;
            if (*slot < 0) *slot = static_cast<int>(i);
        }
        pb.recommended = recommend(pb.entries);
        plan.batches.push_back(std::move(pb));
    }
    return plan;
}

namespace {

std::string terms_line(const PhaseCost &p) {
    std::string s;
    for (int t = 0; t < 4; ++t) {
        if (p.terms[static_cast<size_t>(t)] <= 0) continue;
        s += fmt::format("{}{} {}", s.empty() ? "" : ", ", term_name(static_cast<Term>(t)),
                         fmt_seconds(p.terms[static_cast<size_t>(t)]));
    }
    return s;
}

json phase_json(const PhaseCost &p) {
    json j;
    j["tokens_per_s"] = p.tokens_per_s;
    j["seconds"] = p.seconds;
    j["bound"] = p.bound;
    j["dominant"] = term_name(p.dominant);
    json t;
    for (int i = 0; i < 4; ++i) t[term_name(static_cast<Term>(i))] = p.terms[static_cast<size_t>(i)];
    j["terms_seconds"] = t;
    return j;
}

}  // namespace

std::string plan_text(const Plan &plan) {
    const ClusterSpec &c = plan.cluster;
    std::string o = fmt::format("model: {}, {} layers, {:.2f} GiB of weights\n", plan.model.name,
                                plan.model.hp.n_layer, gib(static_cast<double>(plan.model.total_bytes())));
    o += fmt::format("cluster: {} ({} nodes)\n", c.name, c.nodes.size());
    for (const NodeSpec &n : c.nodes) {
        o += fmt::format(
            "  {:<22} {:>2} threads  {:>6.1f} GiB free  read {:>6.1f} GB/s  matmul peak {:>7.1f} GFLOP/s  "
            "matvec at {:.0f}% of read",
            n.name, n.threads, gib(static_cast<double>(n.mem_bytes)), n.read_bytes_per_s / 1e9,
            n.flops_per_s / 1e9, 100 * n.matvec_efficiency);
        o += "\n";
    }
    for (const auto &[k, f] : c.together)
        o += fmt::format(
            "  {} and {} together: each {:.2f}x slower computing, {:.2f}x streaming weights{}\n",
            c.nodes[static_cast<size_t>(k.first)].name, c.nodes[static_cast<size_t>(k.second)].name, f,
            c.together_of(k.first, k.second, true),
            f >= ClusterSpec::kSharedCore ? " (they share cores: no tensor parallelism between them)" : "");
    for (const auto &[k, v] : c.sync) {
        o += fmt::format("  {} and {} in lock step, per collective beyond the link:",
                         c.nodes[static_cast<size_t>(k.first)].name,
                         c.nodes[static_cast<size_t>(k.second)].name);
        for (size_t i = 0; i < v.size(); ++i)
            o += fmt::format("{} {} row{} {} (segment {}, compute {}, link {})", i > 0 ? "," : "", v[i].rows,
                             v[i].rows == 1 ? "" : "s", fmt_seconds(v[i].excess_s),
                             fmt_seconds(v[i].segment_s), fmt_seconds(v[i].compute_s),
                             fmt_seconds(v[i].link_s));
        o += "\n";
    }
    auto link_line = [&](const std::string &a, const std::string &b, const LinkSpec &l) {
        std::string line = fmt::format("  {:<22} -> {:<22} {:>8}  {:>6.2f} GB/s\n", a, b,
                                       fmt_seconds(l.latency_s), l.bytes_per_s / 1e9);
        if (l.messages.size() > 1) {
            line += "    one message, measured at the sizes the layouts send:";
            for (size_t i = 1; i < l.messages.size(); ++i)
                line += fmt::format("{} {} {}", i > 1 ? "," : "", fmt_size(l.messages[i].first),
                                    fmt_seconds(l.messages[i].second));
            line += "\n";
        }
        return line;
    };
    o += "links (one way: a small message; a stream):\n";
    if (c.links.empty()) {
        o += link_line("head", "any node", c.head_link);
        if (c.nodes.size() > 1) o += link_line("node", "node", c.default_link);
    }
    for (const auto &[k, l] : c.links)
        o += link_line(k.first < 0 ? "head" : c.nodes[static_cast<size_t>(k.first)].name,
                       k.second < 0 ? "head" : c.nodes[static_cast<size_t>(k.second)].name, l);
    const PredictOptions &po = plan.options.predict;
    o += fmt::format("predicted (generation: tg{} per sequence; prompt: pp{} per sequence):\n", po.n_gen,
                     po.n_prompt);
    for (const PlanBatch &pb : plan.batches) {
        o += fmt::format("batch {}\n", pb.batch);
        auto row = [&](const char *kind, int idx, const std::string &none) {
            if (idx < 0) {
                o += fmt::format("  {:<16} {}\n", kind, none);
                return;
            }
            const PlanEntry &e = pb.entries[static_cast<size_t>(idx)];
            o += fmt::format(
                "  {:<16} {:>9.1f} tok/s generation {:>9.1f} tok/s prompt   {}  ({}: {})\n", kind,
                e.prediction.gen.tokens_per_s, e.prediction.prompt.tokens_per_s, e.layout.label(),
                term_name(e.prediction.gen.dominant),
                fmt_seconds(e.prediction.gen.terms[static_cast<size_t>(e.prediction.gen.dominant)]));
        };
        std::string nofit = "no layout fits";
        for (const PlanEntry &e : pb.entries)
            if (e.layout.kind() == "one node" && !e.prediction.fits) {
                nofit = fmt::format("does not fit: needs {:.1f} GiB, the largest node has {:.1f} GiB",
                                    gib(static_cast<double>(
                                        e.prediction.node_bytes[static_cast<size_t>(e.layout.groups[0][0])])),
                                    gib(static_cast<double>(plan.largest_node_bytes)));
                break;
            }
        row("one machine", pb.best_single, nofit);
        row("pipeline", pb.best_pipeline, c.nodes.size() < 2 ? "needs 2 nodes" : "no pipeline fits");
        row("tensor parallel", pb.best_tp, c.nodes.size() < 2 ? "needs 2 nodes" : "no group fits");
        row("hybrid", pb.best_hybrid, c.nodes.size() < 3 ? "needs 3 nodes" : "no hybrid fits");
        if (pb.recommended >= 0) {
            const PlanEntry &e = pb.entries[static_cast<size_t>(pb.recommended)];
            const PhaseCost &g = e.prediction.gen;
            const std::string flags = e.layout.flags(c);
            o += fmt::format("  recommended: {} ({}): {}\n", e.layout.label(), e.layout.kind(),
                             flags.empty() ? "no cluster flags (the head alone)" : flags);
            o += fmt::format("    per step of {} tokens: {} ({}), {} dominates; {}\n", pb.batch,
                             fmt_seconds(g.seconds),
                             g.bound == "ring" ? "one round of the ring" : g.bound + " sets the pace",
                             term_name(g.dominant), terms_line(g));
        }
    }
    return o;
}

std::string plan_json(const Plan &plan) {
    json j;
    j["model"] = {
        {"name", plan.model.name}, {"n_layer", plan.model.hp.n_layer}, {"bytes", plan.model.total_bytes()}};
    json nodes = json::array();
    for (const NodeSpec &n : plan.cluster.nodes)
        nodes.push_back({{"name", n.name},
                         {"host", n.host},
                         {"threads", n.threads},
                         {"mem_bytes", n.mem_bytes},
                         {"read_gbps", n.read_bytes_per_s / 1e9},
                         {"gflops", n.flops_per_s / 1e9},
                         {"matvec_efficiency", n.matvec_efficiency}});
    j["nodes"] = nodes;
    json links = json::array();
    for (const auto &[k, l] : plan.cluster.links) {
        json messages = json::array();
        for (const auto &[b, t] : l.messages) messages.push_back({{"bytes", b}, {"one_way_us", t * 1e6}});
        links.push_back({{"from", k.first < 0 ? std::string("head")
                                              : plan.cluster.nodes[static_cast<size_t>(k.first)].name},
                         {"to", k.second < 0 ? std::string("head")
                                             : plan.cluster.nodes[static_cast<size_t>(k.second)].name},
                         {"latency_us", l.latency_s * 1e6},
                         {"gbps", l.bytes_per_s / 1e9},
                         {"messages", messages}});
    }
    j["links"] = links;
    json together = json::array();
    for (const auto &[k, f] : plan.cluster.together)
        together.push_back({{"a", plan.cluster.nodes[static_cast<size_t>(k.first)].name},
                            {"b", plan.cluster.nodes[static_cast<size_t>(k.second)].name},
                            {"slowdown", f},
                            {"stream_slowdown", plan.cluster.together_of(k.first, k.second, true)}});
    j["together"] = together;
    json sync = json::array();
    for (const auto &[k, v] : plan.cluster.sync)
        for (const SyncPoint &p : v)
            sync.push_back({{"a", plan.cluster.nodes[static_cast<size_t>(k.first)].name},
                            {"b", plan.cluster.nodes[static_cast<size_t>(k.second)].name},
                            {"rows", p.rows},
                            {"excess_us", p.excess_s * 1e6},
                            {"segment_us", p.segment_s * 1e6},
                            {"compute_us", p.compute_s * 1e6},
                            {"link_us", p.link_s * 1e6}});
    j["sync"] = sync;
    json batches = json::array();
    for (const PlanBatch &pb : plan.batches) {
        json b;
        b["batch"] = pb.batch;
        json layouts = json::array();
        for (const PlanEntry &e : pb.entries)
            layouts.push_back({{"label", e.layout.label()},
                               {"kind", e.layout.kind()},
                               {"nodes", e.layout.n_nodes()},
                               {"flags", e.layout.flags(plan.cluster)},
                               {"fits", e.prediction.fits},
                               {"fit_message", e.prediction.fit_message},
                               {"shares_core", e.prediction.shares_core},
                               {"generation", phase_json(e.prediction.gen)},
                               {"prompt", phase_json(e.prediction.prompt)}});
        b["layouts"] = layouts;
        if (pb.recommended >= 0) b["recommended"] = layouts[static_cast<size_t>(pb.recommended)];
        batches.push_back(b);
    }
    j["batches"] = batches;
    return j.dump(2);
}

std::string plan_svg(const Plan &plan) {
    constexpr double W = 720, H = 420, L = 70, R = 190, T = 40, B = 50;
    const char *names[4] = {"one machine", "pipeline", "tensor parallel", "hybrid"};
    const char *colors[4] = {"#555555", "#1f77b4", "#d62728", "#2ca02c"};
    double ymax = 1;
    for (const PlanBatch &pb : plan.batches)
        for (int idx : {pb.best_single, pb.best_pipeline, pb.best_tp, pb.best_hybrid})
            if (idx >= 0)
                ymax = std::max(ymax, pb.entries[static_cast<size_t>(idx)].prediction.gen.tokens_per_s);
    ymax *= 1.1;
    const double bmin = std::log2(std::max(1, plan.batches.empty() ? 1 : plan.batches.front().batch));
    const double bmax = std::log2(std::max(2, plan.batches.empty() ? 2 : plan.batches.back().batch));
    auto x = [&](int32_t b) {
        const double span = std::max(1e-9, bmax - bmin);
        return L + (W - L - R) * (std::log2(static_cast<double>(b)) - bmin) / span;
    };
    auto y = [&](double v) { return H - B - (H - T - B) * v / ymax; };
    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
        "font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{}\" y=\"22\" font-size=\"14\">{}: predicted generation tokens/s on {}</text>\n",
        W, H, L, plan.model.name, plan.cluster.name);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, H - B, W - R,
                     H - B);
    s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", L, T, L, H - B);
    for (int i = 0; i <= 5; ++i) {
        const double v = ymax * i / 5;
        s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0f}</text>\n", L - 6, y(v) + 4, v);
        s += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#eeeeee\"/>\n", L, y(v),
                         W - R, y(v));
    }
    for (const PlanBatch &pb : plan.batches)
        s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x(pb.batch),
                         H - B + 18, pb.batch);
    s += fmt::format(
        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">batch (sequences decoding at once)</text>\n",
        (L + W - R) / 2, H - 12);
    s += fmt::format(
        "<text x=\"16\" y=\"{}\" transform=\"rotate(-90 16 {})\" text-anchor=\"middle\">tokens/s</text>\n",
        (T + H - B) / 2, (T + H - B) / 2);
    for (int k = 0; k < 4; ++k) {
        std::string pts;
        for (const PlanBatch &pb : plan.batches) {
            const int idx = k == 0   ? pb.best_single
                            : k == 1 ? pb.best_pipeline
                            : k == 2 ? pb.best_tp
                                     : pb.best_hybrid;
            if (idx < 0) continue;
            const double v = pb.entries[static_cast<size_t>(idx)].prediction.gen.tokens_per_s;
            pts += fmt::format("{:.1f},{:.1f} ", x(pb.batch), y(v));
            s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>\n", x(pb.batch), y(v),
                             colors[k]);
        }
        if (pts.empty()) continue;
        s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts,
                         colors[k]);
        s += fmt::format(
            "<rect x=\"{}\" y=\"{}\" width=\"14\" height=\"4\" fill=\"{}\"/>"
            "<text x=\"{}\" y=\"{}\">{}</text>\n",
            W - R + 16, T + 20 * k + 6, colors[k], W - R + 36, T + 20 * k + 12, names[k]);
    }
    s += "</svg>\n";
    return s;
}

}  // namespace td::cluster
