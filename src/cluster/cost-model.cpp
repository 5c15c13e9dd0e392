#include "cluster/cost-model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cluster/cluster-engine.h"
#include "cluster/probe.h"
#include "core/check.h"
#include "model/arch/arch.h"
#include "model/bench.h"
#include "model/context.h"
#include "net/codec.h"

namespace td::cluster {
namespace {

ShapeCut cut_of(std::string_view name) {
    if (name == "attn_q" || name == "attn_k" || name == "attn_v") return ShapeCut::rows_kv;
    if (name == "attn_output") return ShapeCut::cols_kv;
    if (name == "ffn_gate" || name == "ffn_up") return ShapeCut::rows_ff;
    if (name == "ffn_down") return ShapeCut::cols_ff;
    return ShapeCut::none;
}

std::string type_label(const ModelShape &m) {
    std::map<DType, uint64_t> by_type;
    for (const auto &l : m.layers)
        for (const ShapeMatrix &x : l) by_type[x.type] += x.bytes();
    DType best = DType::f32;
    uint64_t most = 0;
    for (auto [t, b] : by_type)
        if (b > most) {
            most = b;
            best = t;
        }
    std::string s = dtype_name(best);
    for (char &c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return s;
}

uint64_t n_params(const ModelShape &m) {
    uint64_t n = static_cast<uint64_t>(m.hp.n_embd) * static_cast<uint64_t>(m.hp.n_vocab);
    for (const auto &l : m.layers)
        for (const ShapeMatrix &x : l) n += static_cast<uint64_t>(x.n_in * x.n_out);
    if (m.output.name == "output") n += static_cast<uint64_t>(m.output.n_in * m.output.n_out);
    return n;
}

// ceil(a / b)
int32_t div_up(int32_t a, int32_t b) {
    return (a + b - 1) / b;
}

}  // namespace

uint64_t ModelShape::layer_bytes(int32_t il) const {
    uint64_t b = 0;
    for (const ShapeMatrix &x : layers[static_cast<size_t>(il)]) b += x.bytes();
    return b;
}

uint64_t ModelShape::total_bytes() const {
    uint64_t b = embd_bytes + other_bytes + (output.name == "output" ? output.bytes() : 0);
    for (int32_t il = 0; il < hp.n_layer; ++il) b += layer_bytes(il);
    return b;
}

Result<ModelShape> model_shape_from_file(const gguf::File &file) {
    TD_ASSIGN_OR_RETURN(std::string arch_name, file.get_string("general.architecture"));
    const Architecture *arch = find_architecture(arch_name);
    if (arch == nullptr) return invalid_input("architecture '{}' is not supported", arch_name);
    ModelShape m;
    TD_ASSIGN_OR_RETURN(m.hp, arch->load_hparams(file));
    m.layers.resize(static_cast<size_t>(m.hp.n_layer));
    for (const gguf::TensorInfo &t : file.tensors()) {
        int32_t il = -1;
        char part[64] = {0};
        if (std::sscanf(t.name.c_str(), "blk.%d.%63[^.].weight", &il, part) == 2 && t.n_dims == 2 &&
            il >= 0 && il < m.hp.n_layer) {
            m.layers[static_cast<size_t>(il)].push_back(
                ShapeMatrix{part, t.type, t.ne[0], t.ne[1], cut_of(part)});
        } else if (t.name == "token_embd.weight") {
            m.embd_bytes = t.n_bytes;
        } else if (t.name == "output.weight") {
            m.output = ShapeMatrix{"output", t.type, t.ne[0], t.ne[1], ShapeCut::rows_vocab};
        } else {
            m.other_bytes += t.n_bytes;
        }
    }
    if (m.output.name.empty()) {  // tied: the embedding table is the output head
        const gguf::TensorInfo *e = file.find_tensor("token_embd.weight");
        if (e == nullptr) return invalid_input("no output.weight and no token_embd.weight");
        m.output = ShapeMatrix{"output (tied)", e->type, e->ne[0], e->ne[1], ShapeCut::rows_vocab};
    }
    m.ff_unit = tp_ff_unit(file, 0, m.hp.n_layer);
    m.name = fmt::format("{} {} {}", m.hp.arch, bench_params_label(n_params(m)), type_label(m));
    return m;
}

Result<ModelShape> model_shape_from_synth(const SynthParams &p, int32_t n_vocab) {
    if (p.n_embd <= 0 || p.n_layer <= 0 || p.n_head <= 0 || p.n_head_kv <= 0 || p.n_ff <= 0 || n_vocab <= 0 ||
        p.n_head % p.n_head_kv != 0)
        return invalid_input("a model shape needs positive sizes and heads a multiple of KV heads");
    ModelShape m;
    HParams &hp = m.hp;
    hp.arch = p.arch;
    hp.n_embd = p.n_embd;
    hp.n_layer = p.n_layer;
    hp.n_head = p.n_head;
    hp.n_head_kv = p.n_head_kv;
    hp.head_dim = p.head_dim > 0 ? p.head_dim : p.n_embd / p.n_head;
    hp.n_ff = p.n_ff;
    hp.n_vocab = n_vocab;
    hp.n_ctx_train = p.n_ctx;
    auto add = [&](int32_t il, const char *part, int64_t n_in, int64_t n_out) {
        const std::string tensor = fmt::format("blk.{}.{}.weight", il, part);
        m.layers[static_cast<size_t>(il)].push_back(
            ShapeMatrix{part, synth_tensor_type(p, tensor, il, n_in), n_in, n_out, cut_of(part)});
    };
    m.layers.resize(static_cast<size_t>(p.n_layer));
    const int64_t q = int64_t{hp.n_head} * hp.head_dim, kv = int64_t{hp.n_head_kv} * hp.head_dim;
    for (int32_t il = 0; il < p.n_layer; ++il) {
        add(il, "attn_q", hp.n_embd, q);
        add(il, "attn_k", hp.n_embd, kv);
        add(il, "attn_v", hp.n_embd, kv);
        add(il, "attn_output", q, hp.n_embd);
        add(il, "ffn_gate", hp.n_embd, hp.n_ff);
        add(il, "ffn_up", hp.n_embd, hp.n_ff);
        add(il, "ffn_down", hp.n_ff, hp.n_embd);
    }
    const DType embd_type = synth_tensor_type(p, "token_embd.weight", -1, hp.n_embd);
    m.embd_bytes = dtype_row_bytes(embd_type, hp.n_embd) * static_cast<uint64_t>(n_vocab);
    if (p.tied_output)
        m.output = ShapeMatrix{"output (tied)", embd_type, hp.n_embd, n_vocab, ShapeCut::rows_vocab};
    else
        m.output = ShapeMatrix{"output", synth_tensor_type(p, "output.weight", -1, hp.n_embd), hp.n_embd,
                               n_vocab, ShapeCut::rows_vocab};
    m.other_bytes = static_cast<uint64_t>(hp.n_embd) * 4 * (2 * static_cast<uint64_t>(p.n_layer) + 1);
    // FFN cuts: 16 rows and whole ffn_down blocks.
    int32_t unit = 16;
    for (const auto &l : m.layers)
        for (const ShapeMatrix &x : l)
            if (x.cut == ShapeCut::cols_ff)
                unit = std::lcm(unit, static_cast<int32_t>(dtype_traits(x.type).block_size));
    m.ff_unit = unit;
    m.name = fmt::format("{} {} {}", hp.arch, bench_params_label(n_params(m)), type_label(m));
    return m;
}

ShapeMatrix slice_matrix(const ShapeMatrix &m, const HParams &hp, const TpSlice &s) {
    ShapeMatrix r = m;
    switch (m.cut) {
        case ShapeCut::none:
            break;
        case ShapeCut::rows_kv:
            r.n_out = m.n_out * s.n_kv() / hp.n_head_kv;
            break;
        case ShapeCut::cols_kv:
            r.n_in = m.n_in * s.n_kv() / hp.n_head_kv;
            break;
        case ShapeCut::rows_ff:
            r.n_out = s.n_ff();
            break;
        case ShapeCut::cols_ff:
            r.n_in = s.n_ff();
            break;
        case ShapeCut::rows_vocab:
            r.n_out = s.n_vocab();
            break;
    }
    return r;
}

// ---- nodes and links -------------------------------------------------------------------------------------

double LinkSpec::seconds(double bytes) const {
    if (messages.empty()) return latency_s + bytes / bytes_per_s;
    if (bytes <= messages.front().first) return messages.front().second;
    for (size_t i = 1; i < messages.size(); ++i) {
        const auto [b1, t1] = messages[i];
        if (bytes <= b1) {
            const auto [b0, t0] = messages[i - 1];
            return b1 > b0 ? t0 + (t1 - t0) * (bytes - b0) / (b1 - b0) : t1;
        }
    }
    return messages.back().second + (bytes - messages.back().first) / bytes_per_s;
}

void LinkSpec::set_messages(std::vector<std::pair<double, double>> measured) {
    std::sort(measured.begin(), measured.end());
    for (size_t i = 1; i < measured.size(); ++i)
        measured[i].second = std::max(measured[i].second, measured[i - 1].second);
    messages = std::move(measured);
}

LinkSpec link_from_samples(const std::vector<net::LinkSample> &samples) {
    LinkSpec l;
    l.latency_s = link_latency_seconds(samples);
    l.bytes_per_s = std::max(1.0, link_bytes_per_second(samples));
    std::vector<std::pair<double, double>> m;
    double largest_rtt = 0.0;
    for (const net::LinkSample &s : samples)
        if (s.mode == 0 && s.p50 > 0) {
            m.emplace_back(static_cast<double>(s.bytes), s.p50 / 2.0);
            largest_rtt = std::max(largest_rtt, static_cast<double>(s.bytes));
        }
    for (const net::LinkSample &s : samples)
        if (s.mode == 1 && s.gbps > 0 && static_cast<double>(s.bytes) > largest_rtt)
            m.emplace_back(static_cast<double>(s.bytes),
                           l.latency_s + static_cast<double>(s.bytes) / (s.gbps * 1e9));
    l.set_messages(std::move(m));
    return l;
}

double NodeSpec::matmul_seconds(const ShapeMatrix &m, int32_t rows) const {
    const uint32_t t = static_cast<uint32_t>(m.type);
    if (auto it = measured.find({t, m.n_in, m.n_out, rows}); it != measured.end()) return it->second;
    // A measured matrix of the same type and rows with one side equal: time in proportion to the other side
    // (the kernels stream rows; both sides scale the bytes read and the work done).
    const double *best = nullptr;
    double scale = 0, best_gap = 1e300;
    for (const auto &[k, v] : measured) {
        const auto [kt, kin, kout, krows] = k;
        if (kt != t || krows != rows) continue;
        double s = 0;
        if (kin == m.n_in)
            s = static_cast<double>(m.n_out) / static_cast<double>(kout);
        else if (kout == m.n_out)
            s = static_cast<double>(m.n_in) / static_cast<double>(kin);
        else
            continue;
        const double gap = std::abs(std::log(s));
        if (gap < best_gap) {
            best_gap = gap;
            best = &v;
            scale = s;
        }
    }
    if (best != nullptr) return *best * scale;
    // Measured at other row counts: interpolate linearly between the nearest two (or extend the last).
    std::vector<std::pair<int32_t, double>> pts;
    for (const auto &[k, v] : measured) {
        const auto [kt, kin, kout, krows] = k;
        if (kt == t && kin == m.n_in && kout == m.n_out) pts.emplace_back(krows, v);
    }
    if (pts.size() >= 2) {
        std::sort(pts.begin(), pts.end());
        size_t i = 1;
        while (i + 1 < pts.size() && pts[i].first < rows) ++i;
        const auto [r0, t0] = pts[i - 1];
        const auto [r1, t1] = pts[i];
        const double v = t0 + (t1 - t0) * (rows - r0) / static_cast<double>(r1 - r0);
        return std::max(v, std::min(t0, t1) * 0.5);
    }
    const double bytes = static_cast<double>(m.bytes());
    const double flops = 2.0 * static_cast<double>(m.n_in) * static_cast<double>(m.n_out) * rows;
    return std::max(bytes / (read_bytes_per_s * matvec_efficiency), flops / flops_per_s);
}

double ClusterSpec::sync_seconds(const std::vector<int> &group, int32_t rows) const {
    double worst = 0.0;
    for (size_t a = 0; a < group.size(); ++a)
        for (size_t b = a + 1; b < group.size(); ++b) {
            const auto it = sync.find({std::min(group[a], group[b]), std::max(group[a], group[b])});
            if (it == sync.end() || it->second.empty()) continue;
            const std::vector<SyncPoint> &v = it->second;
            double s = v.back().excess_s;
            if (rows <= v.front().rows) {
                s = v.front().excess_s;
            } else {
                for (size_t k = 1; k < v.size(); ++k)
                    if (rows <= v[k].rows) {
                        const double f =
                            static_cast<double>(rows - v[k - 1].rows) / (v[k].rows - v[k - 1].rows);
                        s = v[k - 1].excess_s + f * (v[k].excess_s - v[k - 1].excess_s);
                        break;
                    }
            }
            worst = std::max(worst, s);
        }
    return worst;
}

double ClusterSpec::together_of(int i, int j, bool stream) const {
    const auto &m = stream && !together_stream.empty() ? together_stream : together;
    auto it = m.find({std::min(i, j), std::max(i, j)});
    return it == m.end() ? 1.0 : std::max(1.0, it->second);
}

const LinkSpec &ClusterSpec::link(int from, int to) const {
    if (auto it = links.find({from, to}); it != links.end()) return it->second;
    if (auto it = links.find({to, from}); it != links.end()) return it->second;
    return from < 0 || to < 0 ? head_link : default_link;
}

// ---- layouts ---------------------------------------------------------------------------------------------

int Layout::n_nodes() const {
    int n = 0;
    for (const auto &g : groups) n += static_cast<int>(g.size());
    return n;
}

std::vector<int> Layout::nodes() const {
    std::vector<int> v;
    for (const auto &g : groups) v.insert(v.end(), g.begin(), g.end());
    return v;
}

std::string Layout::kind() const {
    bool any_tp = false;
    for (const auto &g : groups) any_tp |= g.size() > 1;
    if (groups.size() == 1) return any_tp ? "tensor parallel" : "one node";
    return any_tp ? "hybrid" : "pipeline";
}

std::string Layout::label() const {
    std::string sizes, ranges;
    for (size_t s = 0; s < groups.size(); ++s) {
        sizes += fmt::format("{}{}", s ? "," : "", groups[s].size());
        ranges += fmt::format("{}{}-{}", s ? ", " : "", layers[s].first, layers[s].second - 1);
    }
    const std::string k = kind();
    if (k == "one node") return "one node";
    if (k == "tensor parallel") return fmt::format("tp {}", groups[0].size());
    if (k == "pipeline") return fmt::format("pipeline {}", ranges);
    return fmt::format("layout {}: {}", sizes, ranges);
}

LayoutArgs Layout::args(const ClusterSpec &cluster) const {
    LayoutArgs a;
    for (size_t s = 0; s < groups.size(); ++s) {
        for (int i : groups[s]) {
            if (i == cluster.head_node) {
                a.head_node = true;
                continue;
            }
            if (!a.workers.empty()) a.workers += ',';
            a.workers += cluster.nodes[static_cast<size_t>(i)].name;
        }
        a.sizes += fmt::format("{}{}", s ? "," : "", groups[s].size());
        a.layers += fmt::format("{}{}-{}", s ? "," : "", layers[s].first, layers[s].second - 1);
        a.tensor_parallel |= groups[s].size() > 1;
    }
    // Uneven tensor-parallel shares: say them, so the run cuts the slices the plan measured.
    bool uneven = false;
    for (const auto &g : shares)
        for (double v : g) uneven |= std::abs(v - g.front()) > 1e-9;
    if (uneven)
        for (const auto &g : shares)
            for (double v : g) a.split += fmt::format("{}{:.2f}", a.split.empty() ? "" : ",", v / g.front());
    return a;
}

std::string Layout::flags(const ClusterSpec &cluster) const {
    const LayoutArgs a = args(cluster);
    if (a.workers.empty()) return "";  // the head's own node alone: one machine, no flags
    std::string f = "--workers " + a.workers;
    if (a.head_node) f += " --head-node";
    if (a.tensor_parallel) f += groups.size() == 1 ? fmt::format(" --tp {}", groups[0].size()) : " --layout " + a.sizes;
    if (groups.size() > 1) f += " --layers " + a.layers;
    if (!a.split.empty()) f += " --split " + a.split;
    return f;
}

namespace {

// A matmul is memory-bound when streaming its weights takes at least this share of its time.
constexpr double kMemoryBound = 0.8;

// Seconds of one layer's matmuls on `node` holding `slice`, at `rows` rows, split into memory and compute.
struct LayerTime {
    double seconds = 0.0, memory = 0.0;
};
LayerTime layer_time(const ModelShape &model, const NodeSpec &node, int32_t il, const TpSlice &slice,
                     int32_t rows, double ctx_avg, const PredictOptions &o) {
    LayerTime lt;
    const HParams &hp = model.hp;
    // Context::layer_forward runs a long step in micro-batches of kMaxUbatch rows.
    for (int32_t r0 = 0; r0 < rows; r0 += Context::kMaxUbatch) {
        const int32_t n = std::min(Context::kMaxUbatch, rows - r0);
        for (const ShapeMatrix &x : model.layers[static_cast<size_t>(il)]) {
            const ShapeMatrix s = slice_matrix(x, hp, slice);
            const double t = node.matmul_seconds(s, n);
            lt.seconds += t;
            // A matmul that takes about its weights' streaming time is memory-bound; a longer one
            // compute-bound.
            if (static_cast<double>(s.bytes()) / node.stream_bytes_per_s() >= kMemoryBound * t)
                lt.memory += t;
        }
    }
    const double threads = std::max(1, node.threads);
    const double par_rows = std::min<double>(rows, threads);  // row ops run one row per thread
    const int32_t n_q = slice.n_kv() * hp.n_gqa();
    // Norms, RoPE and the FFN activation of every row; six dispatches of the pool besides the matmuls'.
    const double row_ops = 2.0 * hp.n_embd * node.norm_per_elem_s +
                           (n_q + slice.n_kv()) * node.rope_per_head_s + slice.n_ff() * node.act_per_elem_s;
    lt.seconds += rows * row_ops / par_rows + 6.0 * node.dispatch_s;
    // Attention over the rank's KV heads: every row reads its sequence's K and V; jobs are a row and a KV
    // head.
    const double kv_read =
        static_cast<double>(slice.n_kv()) * hp.head_dim * o.kv_bytes * 2.0 * ctx_avg * rows;
    const double pos_work = static_cast<double>(rows) * n_q * ctx_avg;
    const double per_pos =
        node.attn_per_pos_s > 0 ? node.attn_per_pos_s : 4.0 * hp.head_dim / (node.flops_per_s / 4.0);
    const double jobs = std::min<double>(static_cast<double>(rows) * slice.n_kv(), threads);
    const double mem = kv_read / node.read_bytes_per_s;
    lt.seconds += std::max(mem, pos_work * per_pos / std::max(1.0, jobs));
    lt.memory += mem;
    return lt;
}

double all_reduce_seconds(const ClusterSpec &c, const std::vector<int> &group, double bytes, double *lat) {
    const size_t n = group.size();
    if (n < 2) return 0.0;
    const bool direct = n == 2 || bytes <= 64.0 * 1024;
    const double part = direct ? bytes : bytes / static_cast<double>(n);
    // Each rank sends its part to every peer, one after another from its thread; the slowest rank sets the
    // time, and the latest latency among the links.
    double latency = 0.0, sending = 0.0;
    for (int a : group) {
        double own = 0.0;
        for (int b : group)
            if (a != b) {
                latency = std::max(latency, c.link(a, b).latency_s);
                own += c.link(a, b).transfer_seconds(part);
            }
        sending = std::max(sending, own);
    }
    if (direct) {
        *lat += latency;
        return latency + sending;
    }
    // Reduce-scatter then all-gather (PeerCollective): each phase sends a chunk to every peer at once and
    // then receives theirs, so two latencies, not one per peer; the bytes, (n - 1) chunks of bytes / n per
    // phase, leave through one link. Charged 2 (n - 1) latencies, `--tp 3` at 16 sequences over 1 ms links
    // was predicted 1.68x low.
    *lat += 2.0 * latency;
    return 2.0 * (latency + sending);
}

struct StageCost {
    double seconds = 0.0;
    std::array<double, 4> terms{};
};

// A node's time for its part of a step of `rows` rows alone (its stage's layers, its slice of them, the
// output head on the last stage for `outputs` rows), and how much of that streams weights.
struct NodeTime {
    double seconds = 0.0, memory = 0.0;
};
NodeTime node_time(const ModelShape &model, const ClusterSpec &c, const Layout &l, size_t s, size_t r,
                   int32_t rows, int32_t outputs, double ctx_avg, const PredictOptions &o) {
    const NodeSpec &node = c.nodes[static_cast<size_t>(l.groups[s][r])];
    NodeTime nt;
    for (int32_t il = l.layers[s].first; il < l.layers[s].second; ++il) {
        const LayerTime lt = layer_time(model, node, il, l.slices[s][r], rows, ctx_avg, o);
        nt.seconds += lt.seconds;
        nt.memory += lt.memory;
    }
    if (s + 1 == l.groups.size() && outputs > 0) {
        const ShapeMatrix out = slice_matrix(model.output, model.hp, l.slices[s][r]);
        const double to = node.matmul_seconds(out, outputs);
        nt.seconds += to;
        if (static_cast<double>(out.bytes()) / node.stream_bytes_per_s() >= kMemoryBound * to)
            nt.memory += to;
    }
    return nt;
}

// Every node's own time alone for a step of `rows` rows, where it is in the layout (indexed by node).
std::vector<NodeTime> node_times(const ModelShape &model, const ClusterSpec &c, const Layout &l, int32_t rows,
                                 int32_t outputs, double ctx_avg, const PredictOptions &o) {
    std::vector<NodeTime> t(c.nodes.size());
    for (size_t s = 0; s < l.groups.size(); ++s)
        for (size_t r = 0; r < l.groups[s].size(); ++r)
            t[static_cast<size_t>(l.groups[s][r])] = node_time(model, c, l, s, r, rows, outputs, ctx_avg, o);
    return t;
}

// One stage's time for a step of `rows` rows (outputs: rows wanting logits) while the nodes in `busy` compute
// too (empty: the stage's own group); alone: node_times() for this step.
StageCost stage_cost(const ModelShape &model, const ClusterSpec &c, const Layout &l, size_t s, int32_t rows,
                     int32_t outputs, const std::vector<NodeTime> &alone, const std::vector<int> &busy,
                     const PredictOptions &o) {
    StageCost sc;
    const auto &g = l.groups[s];
    double worst = 0.0, worst_mem = 0.0;
    for (size_t r = 0; r < g.size(); ++r) {
        const NodeTime own = alone[static_cast<size_t>(g[r])];
        // Slower while the other busy nodes of its host compute too (a shared bus or shared cores): while two
        // run at once each goes `together` times slower, for as long as the shorter of them runs. Alone a and
        // b (a >= b), together f: b ends at f b, a at a + (f - 1) b (two ranks with equal work: f a; two
        // pipeline stages on one core, f = 2: a + b, the core's whole load).
        // The slowdown is the streaming one for the share of the node's time that streams weights, the
        // computing one for the rest: at 16 rows a step computes (the matmuls take 5x their weights'
        // streaming time), and the streaming slowdown on all of it (1.5-1.8x between two cores here)
        // predicted 16 sequences 20-40% low.
        double t = own.seconds;
        const double streams = own.seconds > 0 ? std::clamp(own.memory / own.seconds, 0.0, 1.0) : 0.0;
        for (int j : busy.empty() ? g : busy)
            if (j != g[r]) {
                const double f =
                    streams * c.together_of(g[r], j, true) + (1.0 - streams) * c.together_of(g[r], j, false);
                if (f > 1.0) t += (f - 1.0) * std::min(own.seconds, alone[static_cast<size_t>(j)].seconds);
            }
        const double mem = own.seconds > 0 ? own.memory * t / own.seconds : 0.0;
        if (t > worst) {
            worst = t;
            worst_mem = mem;
        }
    }
    sc.seconds = worst;
    sc.terms[static_cast<int>(Term::memory)] = worst_mem;
    sc.terms[static_cast<int>(Term::compute)] = worst - worst_mem;
    if (g.size() > 1) {
        const double bytes = static_cast<double>(rows) * model.hp.n_embd * net::reduce_type_bytes(o.reduce);
        double lat = 0;
        const int n_layers = l.layers[s].second - l.layers[s].first;
        const double one = all_reduce_seconds(c, g, bytes, &lat);
        const double wait = c.sync_seconds(g, rows);
        double total = 2.0 * n_layers * (one + wait);
        double total_lat = 2.0 * n_layers * (lat + wait);
        if (s + 1 == l.groups.size() && outputs > 0) {  // the sampling merge: candidates to rank 0
            double glat = 0;
            total += all_reduce_seconds(c, g, 16.0 * outputs, &glat);
            total_lat += glat;
        }
        sc.seconds += total;
        sc.terms[static_cast<int>(Term::link_latency)] += total_lat;
        sc.terms[static_cast<int>(Term::link_bandwidth)] += total - total_lat;
    }
    return sc;
}

// Sends a step's message from `from` (-1 the head) to every rank of group `to` (or the head: empty group).
StageCost hop_cost(const ClusterSpec &c, int from, const std::vector<int> &to, double bytes) {
    StageCost h;
    if (to.empty()) {
        const LinkSpec &lk = c.link(from, -1);
        h.seconds = lk.seconds(bytes);
        h.terms[static_cast<int>(Term::link_latency)] = lk.latency_s;
        h.terms[static_cast<int>(Term::link_bandwidth)] = lk.transfer_seconds(bytes);
        return h;
    }
    double sent = 0;  // one rank after another from the sender's thread
    for (int r : to) {
        const LinkSpec &lk = c.link(from, r);
        sent += lk.transfer_seconds(bytes);
        const double t = sent + lk.latency_s;
        if (t > h.seconds) {
            h.seconds = t;
            h.terms[static_cast<int>(Term::link_latency)] = lk.latency_s;
            h.terms[static_cast<int>(Term::link_bandwidth)] = sent;
        }
    }
    return h;
}

void add_terms(std::array<double, 4> &a, const std::array<double, 4> &b, double k = 1.0) {
    for (size_t i = 0; i < 4; ++i) a[i] += b[i] * k;
}

Term dominant(const std::array<double, 4> &t) {
    return static_cast<Term>(std::max_element(t.begin(), t.end()) - t.begin());
}

// One round of a step of `rows` rows through every stage and back: the hops and every stage's cost.
struct Ring {
    double seconds = 0.0;
    std::array<double, 4> terms{};
    std::vector<StageCost> stages, hops;  // hops[s]: into stage s; hops[S]: back to the head
};
// busy: the nodes computing at the same time as any stage (empty: only the stage's own group).
Ring ring_cost(const ModelShape &model, const ClusterSpec &c, const Layout &l, int32_t rows, int32_t outputs,
               double ctx_avg, const std::vector<int> &busy, const PredictOptions &o) {
    Ring ring;
    const size_t S = l.groups.size();
    const std::vector<NodeTime> alone = node_times(model, c, l, rows, outputs, ctx_avg, o);
    for (size_t s = 0; s <= S; ++s) {
        const int from = s == 0 ? -1 : l.groups[s - 1][0];
        const bool tokens = s == 0;
        const double bytes =
            s == S
                ? 8.0 + 12.0 * outputs
                : static_cast<double>(net::forward_payload_bytes(
                      static_cast<uint32_t>(rows), static_cast<uint32_t>(model.hp.n_embd), o.wire, tokens));
        ring.hops.push_back(hop_cost(c, s == S ? l.groups[S - 1][0] : from,
                                     s == S ? std::vector<int>{} : l.groups[s], bytes));
        ring.seconds += ring.hops.back().seconds;
        add_terms(ring.terms, ring.hops.back().terms);
        if (s < S) {
            ring.stages.push_back(stage_cost(model, c, l, s, rows, outputs, alone, busy, o));
            ring.seconds += ring.stages.back().seconds;
            add_terms(ring.terms, ring.stages.back().terms);
        }
    }
    return ring;
}

}  // namespace

const char *term_name(Term t) {
    switch (t) {
        case Term::compute:
            return "compute";
        case Term::memory:
            return "memory bandwidth";
        case Term::link_latency:
            return "link latency";
        case Term::link_bandwidth:
            return "link bandwidth";
    }
    return "unknown";
}

Prediction predict(const ModelShape &model, const ClusterSpec &c, const Layout &l, int32_t batch,
                   const PredictOptions &o) {
    Prediction p;
    const int32_t S = static_cast<int32_t>(l.groups.size());
    TD_ASSERT(S >= 1 && l.layers.size() == l.groups.size() && l.slices.size() == l.groups.size(),
              "a layout of {} stages", S);
    // Memory: each node's weights (its slice of its layers, the embedding on the first stage, the output head
    // on the last) and its KV heads' cache for every sequence.
    p.node_bytes.assign(c.nodes.size(), 0);
    for (int32_t s = 0; s < S; ++s)
        for (size_t r = 0; r < l.groups[s].size(); ++r) {
            const TpSlice &sl = l.slices[static_cast<size_t>(s)][r];
            double b = 0;
            for (int32_t il = l.layers[s].first; il < l.layers[s].second; ++il)
                for (const ShapeMatrix &x : model.layers[static_cast<size_t>(il)])
                    b += static_cast<double>(slice_matrix(x, model.hp, sl).bytes());
            b += static_cast<double>(l.layers[s].second - l.layers[s].first) * sl.n_kv() * model.hp.head_dim *
                 2.0 * o.kv_bytes * o.n_ctx * std::max(1, batch);
            if (s == 0) b += static_cast<double>(model.embd_bytes);
            if (s == S - 1) b += static_cast<double>(slice_matrix(model.output, model.hp, sl).bytes());
            const int node = l.groups[s][r];
            p.node_bytes[static_cast<size_t>(node)] += static_cast<uint64_t>(b);
        }
    for (const auto &g : l.groups)
        for (int a : g)
            for (int b : g)
                if (a < b && c.together_of(a, b) >= ClusterSpec::kSharedCore) p.shares_core = true;
    for (size_t i = 0; i < c.nodes.size(); ++i) {
        const NodeSpec &n = c.nodes[i];
        if (n.mem_bytes > 0 && p.node_bytes[i] > n.mem_bytes && p.fits) {
            p.fits = false;
            p.fit_message = fmt::format("{} needs {:.1f} GiB, has {:.1f} GiB", n.name,
                                        p.node_bytes[i] / 1073741824.0, n.mem_bytes / 1073741824.0);
        }
    }

    // Generation: n_micro micro-batches of m rows in flight.
    const int32_t n_micro = std::min(batch, S);
    const int32_t m = div_up(batch, n_micro);
    const double ctx_gen = o.n_gen / 2.0;
    // One micro-batch: one group computes at a time; several: the stages overlap, every node can be busy.
    const Ring ring = ring_cost(model, c, l, m, m, ctx_gen, n_micro > 1 ? l.nodes() : std::vector<int>{}, o);
    size_t slow = 0;
    for (size_t s = 0; s < ring.stages.size(); ++s)
        if (ring.stages[s].seconds > ring.stages[slow].seconds) slow = s;
    const double through = n_micro * ring.stages[slow].seconds;
    if (ring.seconds >= through) {
        p.gen.seconds = ring.seconds;
        p.gen.terms = ring.terms;
        p.gen.bound = "ring";
    } else {
        p.gen.seconds = through;
        add_terms(p.gen.terms, ring.stages[slow].terms, n_micro);
        p.gen.bound = fmt::format("stage {}", slow + 1);
    }
    p.gen.tokens_per_s = batch / p.gen.seconds;
    p.gen.dominant = dominant(p.gen.terms);

    // Prompt: batch x n_prompt rows in steps of n_batch, each cut into chunks that follow each other.
    const int32_t step_rows = std::min(o.n_batch, o.n_prompt);
    const int32_t chunk = std::min(step_rows, auto_chunk_rows(step_rows, S));
    const double n_chunks = static_cast<double>(batch) * o.n_prompt / chunk;
    const double ctx_prompt = o.n_prompt / 2.0;
    const Ring pr = ring_cost(model, c, l, chunk, 0, ctx_prompt, S > 1 ? l.nodes() : std::vector<int>{}, o);
    double bottleneck = 0;
    std::array<double, 4> bt{};
    for (const auto *v : {&pr.stages, &pr.hops})
        for (const StageCost &x : *v)
            if (x.seconds > bottleneck) {
                bottleneck = x.seconds;
                bt = x.terms;
            }
    // Steps' outputs: the last row of each step wants logits (one output-head row per step).
    const double steps = std::ceil(static_cast<double>(batch) * o.n_prompt / step_rows);
    double out_t = 0;
    for (size_t r = 0; r < l.groups.back().size(); ++r) {
        const NodeSpec &node = c.nodes[static_cast<size_t>(l.groups.back()[r])];
        out_t =
            std::max(out_t, node.matmul_seconds(slice_matrix(model.output, model.hp, l.slices.back()[r]), 1));
    }
    p.prompt.seconds = pr.seconds + (n_chunks - 1) * bottleneck + steps * out_t;
    p.prompt.terms = pr.terms;
    add_terms(p.prompt.terms, bt, n_chunks - 1);
    p.prompt.terms[static_cast<int>(Term::memory)] += steps * out_t;
    p.prompt.tokens_per_s = batch * o.n_prompt / p.prompt.seconds;
    p.prompt.dominant = dominant(p.prompt.terms);
    p.prompt.bound = S > 1 ? "pipelined chunks" : "steps";
    return p;
}

Result<Layout> make_layout(const ModelShape &model, const ClusterSpec &c,
                           const std::vector<std::vector<int>> &groups, int32_t rows) {
    Layout l;
    l.groups = groups;
    const TpSlice whole = tp_slice_whole(model.hp);
    // Node speed: 1 / its time for a whole layer at `rows` rows.
    auto speed = [&](int node) {
        double t = 0;
        for (const ShapeMatrix &x : model.layers[0])
            t += c.nodes[static_cast<size_t>(node)].matmul_seconds(x, rows);
        return t > 0 ? 1.0 / t : 1.0;
    };
    std::vector<double> stage_w;
    double out_layers = 0;
    for (const auto &g : groups) {
        std::vector<double> shares;
        for (int i : g) shares.push_back(speed(i));
        const auto [lo, hi] = std::minmax_element(shares.begin(), shares.end());
        if (*hi <= *lo * 1.15) shares.assign(shares.size(), 1.0);  // within 15%: even, as the engine splits
        l.shares.push_back(shares);
        if (g.size() > 1) {
            TD_ASSIGN_OR_RETURN(auto sl, tp_split(model.hp, shares, model.ff_unit));
            l.slices.push_back(sl);
        } else {
            l.slices.push_back({whole});
        }
        double w = 0;
        for (int i : g) w += speed(i);
        stage_w.push_back(w);
    }
    if (groups.size() > 1) {
        const double layer_b = static_cast<double>(model.layer_bytes(0));
        out_layers = layer_b > 0 ? static_cast<double>(model.output.bytes()) / layer_b : 0.0;
    }
    TD_ASSIGN_OR_RETURN(l.layers, split_layers(stage_w, model.hp.n_layer, 0, out_layers));
    return l;
}

std::vector<Layout> candidate_layouts(const ModelShape &model, const ClusterSpec &c, int32_t rows) {
    std::vector<Layout> out;
    const int n = static_cast<int>(c.nodes.size());
    std::vector<std::vector<int>> subsets;
    if (n <= 6) {
        for (int mask = 1; mask < (1 << n); ++mask) {
            std::vector<int> s;
            for (int i = 0; i < n; ++i)
                if (mask & (1 << i)) s.push_back(i);
            subsets.push_back(s);
        }
    } else {
        for (int k = 1; k <= n; ++k) {
            std::vector<int> s(static_cast<size_t>(k));
            std::iota(s.begin(), s.end(), 0);
            subsets.push_back(s);
        }
    }
    for (const auto &sub : subsets) {
        const int k = static_cast<int>(sub.size());
        // Every composition of k into stage sizes: bit i of `cuts` set = a stage ends after node i.
        for (int cuts = 0; cuts < (1 << (k - 1)); ++cuts) {
            std::vector<std::vector<int>> groups(1);
            for (int i = 0; i < k; ++i) {
                groups.back().push_back(sub[static_cast<size_t>(i)]);
                if (i + 1 < k && (cuts & (1 << i))) groups.emplace_back();
            }
            if (static_cast<int32_t>(groups.size()) > model.hp.n_layer) continue;
            auto l = make_layout(model, c, groups, rows);
            if (l.ok()) out.push_back(std::move(l).value());
        }
    }
    return out;
}

}  // namespace td::cluster
