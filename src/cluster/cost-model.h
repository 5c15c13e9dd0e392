// The cost model: what a layout of a model over measured (or described) nodes and links should run at. One
// place that `plan` and placement share, so a prediction and the layout that runs come from the same numbers.
//
// Inputs
//   ModelShape   every matrix of every layer (type, n_in, n_out, how tensor parallelism cuts it) and the
//   output
//                head, from a GGUF's tensor table or from a described shape (synth's per-tensor types).
//   NodeSpec     per node: threads, free memory, plain-read bandwidth, matmul time per (type, shape, rows)
//                (measured by a compute probe) or a roofline (read bandwidth x efficiency, peak FLOP/s) where
//                nothing was measured, and how much slower it runs while k nodes of its host compute at once.
//   LinkSpec     per link: one-way latency of a small message, bytes/s of a stream, and what single messages
//                of the sizes a layout sends took (measured round trips).
//   Layout       stages of tensor-parallel groups, their layer ranges and slices (what ClusterEngine runs).
//
// What a step costs, for a micro-batch of m rows (the messages and bytes the code really sends):
//   stage s   t_s = max over ranks (sum of its matmuls at m rows + row ops + attention over its KV heads)
//                   x slowdown among the nodes busy at the same time (ClusterSpec::together)
//                   + 2 x layers x (all-reduce(tp, m x n_embd x 4 bytes) + sync(group, m))  (tp > 1)
//                   + output head at m rows + the sampling gather                   (last stage)
//   hop       latency + transfer(bytes) (Forward of m rows at the wire type, to every rank of the next
//             group one after another; tokens from the head, 12-byte results back)
//   all-reduce  2 ranks or <= 64 KiB: latency + (n - 1) x transfer(bytes) (direct exchange); else
//             2 x (latency + (n - 1) x transfer(bytes / n)) (reduce-scatter + all-gather)
//   where transfer(b) = LinkSpec::transfer_seconds(b): the measured time of a message of that size less the
//   latency, or b / bandwidth for a described link
//   sync      what the group's ranks wait at a collective for each other's stalls (ClusterSpec::sync,
//             measured in lock step; 0 for a described cluster), charged as link latency
// Generation at batch B over S stages: n_micro = min(B, S) micro-batches of m = ceil(B / n_micro) rows;
// the ring time R = hops + sum t_s; period = max(R, n_micro x max t_s); tokens/s = B / period.
// Prompt processing: rows go in chunks of auto_chunk_rows(n_batch, S); the first chunk fills the pipeline,
// each further one costs the slowest stage (or hop).
// The dominant term is the largest of compute, memory bandwidth, link latency and link bandwidth along
// whichever of the two bounds set the period.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cluster/placement.h"
#include "core/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"
#include "model/synth.h"
#include "model/tp-slice.h"
#include "net/protocol.h"
#include "tensor/dtype.h"

namespace td::cluster {

// How tensor parallelism cuts a matrix (model/tp-slice.h): by KV-head rows (q, k, v), KV-head columns (o),
// FFN rows (gate, up), FFN columns (down), vocabulary rows (output head); none: every rank holds it whole.
enum class ShapeCut : uint8_t { none, rows_kv, cols_kv, rows_ff, cols_ff, rows_vocab };

struct ShapeMatrix {
    std::string name;  // "attn_q", "output"
    DType type = DType::f32;
    int64_t n_in = 0, n_out = 0;
    ShapeCut cut = ShapeCut::none;
    uint64_t bytes() const { return dtype_row_bytes(type, n_in) * static_cast<uint64_t>(n_out); }
};

struct ModelShape {
    std::string name;  // "llama 1.1B Q4_0"
    HParams hp;
    int32_t ff_unit = 16;                          // tp_ff_unit
    std::vector<std::vector<ShapeMatrix>> layers;  // [n_layer] the layer's matrices
    ShapeMatrix output;                            // the output head (the embedding when tied)
    uint64_t embd_bytes = 0;                       // token embedding table (on the first stage)
    uint64_t other_bytes = 0;                      // norms, biases: on every stage, small
    uint64_t layer_bytes(int32_t il) const;
    uint64_t total_bytes() const;
};
// From a GGUF's tensor table (the architecture's hyperparameters; no weights are read).
Result<ModelShape> model_shape_from_file(const gguf::File &file);
// From a described shape and type (synth's per-tensor types); n_vocab is given since there is no vocabulary.
Result<ModelShape> model_shape_from_synth(const SynthParams &params, int32_t n_vocab);
// `m` as the rank holding `slice` holds it.
ShapeMatrix slice_matrix(const ShapeMatrix &m, const HParams &hp, const TpSlice &slice);

struct LinkSpec {
    double latency_s = 50e-6;    // one way, a small message
    double bytes_per_s = 1.0e9;  // a stream of large messages
    // Measured one-way seconds of one message by its size, (bytes, seconds) ascending in both; empty: every
    // message costs latency_s + bytes / bytes_per_s. A link's cost per byte depends on the message's size (a
    // relay or a NIC that handles large transfers in pieces): through a 0.1 ms relay here, 64-128 KiB
    // messages crossed at ~2.6 GB/s and 4 MiB streams at 0.25, and pricing the all-reduces of `--tp 3` at the
    // stream's rate predicted them 1.3x slow.
    std::vector<std::pair<double, double>> messages;
    // One message of `bytes`, sent alone: interpolated between the measured sizes, beyond the largest at
    // bytes_per_s.
    double seconds(double bytes) const;
    // The part of seconds(bytes) beyond latency_s (what the bytes cost).
    double transfer_seconds(double bytes) const { return seconds(bytes) - latency_s; }
    // Sets `messages` from measured (bytes, seconds) in any order: sorted by size, each time raised to the
    // one before it (a larger message never costs less; noise between close sizes).
    void set_messages(std::vector<std::pair<double, double>> measured);
};

// A measured link (ProbeClient::measure_link / link_to): the latency of its smallest round trip, the rate of
// its largest stream, and every round trip's half as the time of one message of that size; streams add the
// sizes beyond the largest round trip (latency + bytes at the stream's rate).
LinkSpec link_from_samples(const std::vector<net::LinkSample> &samples);

struct NodeSpec {
    std::string name;  // as in --workers, or the described node's name
    std::string host;  // nodes of one host share its cores and memory bus (contention)
    int32_t threads = 1;
    uint64_t mem_bytes = 0;          // available for weights and KV; 0 unknown (always fits)
    double read_bytes_per_s = 20e9;  // plain read on its threads
    double flops_per_s = 100e9;      // roofline: matrix-matrix peak
    double matvec_efficiency = 0.8;  // roofline: share of the read bandwidth a matrix-vector product reaches
    // Measured seconds per matmul alone: (type, n_in, n_out, rows).
    std::map<std::tuple<uint32_t, int64_t, int64_t, int32_t>, double> measured;
    // The row ops of a layer (measured; 0: estimated from flops_per_s): seconds per element of an RMSNorm,
    // per element of the FFN activation, per head of RoPE, per query head and position of attention, and one
    // dispatch of the thread pool.
    double norm_per_elem_s = 0.0, act_per_elem_s = 0.0, rope_per_head_s = 0.0, attn_per_pos_s = 0.0;
    double dispatch_s = 0.0;

    // Seconds for y = x W^T with x of `rows` rows: measured, else scaled from a measured matrix of the same
    // type, rows and n_in (or n_out), else the roofline.
    double matmul_seconds(const ShapeMatrix &m, int32_t rows) const;
    // What a matrix-vector product streams weights at: the part of a matmul's time below bytes / this is
    // memory, the rest compute.
    double stream_bytes_per_s() const { return read_bytes_per_s * matvec_efficiency; }
};

// A pair's synchronisation, measured in lock step (net::ProbeSync) at one row count: per collective, what the
// pair's segments took beyond the slower rank's own compute and the link's price of the exchange. Two ranks
// do not reach each all-reduce together: a stall of either (the host's other tenants, its scheduler) is
// waited out by both, and neither a compute probe (one node alone) nor a link probe (an idle pair) sees it.
// 1B `--tp 2` here: 22-69 us per collective waited where the link's round trip priced 19.
struct SyncPoint {
    int32_t rows = 1;
    double excess_s = 0.0;   // per collective, >= 0: what the model adds
    double segment_s = 0.0;  // one segment (a rank's matrices, then the all-reduce), the pair in lock step
    double compute_s = 0.0;  // the slower rank's matrices per segment
    double link_s = 0.0;     // the link's price of the exchange
};

struct ClusterSpec {
    std::string name;
    std::vector<NodeSpec> nodes;
    LinkSpec default_link;                          // between nodes when no measured/described pair
    LinkSpec head_link;                             // head <-> a node when no pair
    std::map<std::pair<int, int>, LinkSpec> links;  // (from, to); -1 is the head
    // (i, j), i < j: how much slower each of nodes i and j computes while the other computes too (measured
    // for nodes of one host: a shared memory bus, or shared cores); 1 where absent. A node's slowdown among a
    // set of busy nodes is 1 + the sum of (together - 1) over the others. Two numbers per pair: for matmuls
    // of many rows (compute) and for one row (a weight stream: a shared memory bus shows here even where the
    // cores are not shared). A step takes the streaming one for the share of a node's time that streams
    // weights, the computing one for the rest.
    std::map<std::pair<int, int>, double> together;         // compute-bound (the largest measured rows)
    std::map<std::pair<int, int>, double> together_stream;  // memory-bound (one row)
    // (i, j), i < j: the pair's synchronisation by row count, ascending (measured; absent: none).
    std::map<std::pair<int, int>, std::vector<SyncPoint>> sync;
    // The node that is the head's own (`--head-node`: a worker in the head's process), or -1. It can only be
    // the first node of a layout, which candidate layouts keep (their nodes go in index order): make it 0.
    int head_node = -1;
    const LinkSpec &link(int from, int to) const;
    double together_of(int i, int j, bool stream = false) const;
    // Seconds a collective of `group` waits beyond the link's price at `rows` rows: the largest over its
    // measured pairs, interpolated in rows between the measured counts (the nearest one beyond them); 0
    // where no pair of it was measured.
    double sync_seconds(const std::vector<int> &group, int32_t rows) const;
    // Slower than this together, two nodes share cores (not only a memory bus): tensor parallelism between
    // them takes turns on one core and waits for the scheduler at every all-reduce, which the model does not
    // price; the planner does not recommend it.
    static constexpr double kSharedCore = 1.5;
};

// The values of the flags that run a layout (what --layout auto sets and `plan` prints).
struct LayoutArgs {
    std::string workers;     // --workers, in stage and rank order (without the head's own node)
    bool head_node = false;  // the layout's first node is the head's own (--head-node)
    std::string sizes;    // --layout: nodes per stage, "2,1"
    std::string layers;   // --layers: "0-9,10-15"
    std::string split;    // --split: relative shares per node, "" when every group splits evenly
    bool tensor_parallel = false;  // some stage has more than one node
};

struct Layout {
    std::vector<std::vector<int>> groups;      // [stage] node indices, in rank order
    std::vector<LayerRange> layers;            // [stage]
    std::vector<std::vector<TpSlice>> slices;  // [stage][rank]
    std::vector<std::vector<double>> shares;   // [stage][rank] relative speed the slices were cut by
    std::string kind() const;                  // "one node", "pipeline", "tensor parallel", "hybrid"
    std::string label() const;                 // "tp 2", "pipeline 0-7 | 8-15", "2x2: 0-7 | 8-15"
    // The flags that run it: "--workers a,b --tp 2" / "--layout 2,1 --layers 0-9,10-15" ...
    std::string flags(const ClusterSpec &cluster) const;
    LayoutArgs args(const ClusterSpec &cluster) const;
    int n_nodes() const;
    std::vector<int> nodes() const;  // every node of every stage, in stage and rank order
};

struct PredictOptions {
    int32_t n_prompt = 512;  // prompt tokens per sequence (llama-bench's pp512)
    int32_t n_gen = 128;  // generated tokens per sequence (tg128): attention reads about n_gen / 2 positions
    int32_t n_batch = 512;  // prompt rows per step
    net::WireType wire = net::WireType::f16;
    net::ReduceType reduce = net::ReduceType::f32;
    double kv_bytes = 2.0;  // per value of the KV cache, K's and V's mean (kv_bytes_per_value; f16: 2)
    int32_t n_ctx = 4096;  // KV cache positions per sequence, for memory
};

enum class Term { compute = 0, memory = 1, link_latency = 2, link_bandwidth = 3 };
const char *term_name(Term t);

struct PhaseCost {
    double tokens_per_s = 0.0;
    double seconds = 0.0;           // one period (generation) or the whole prompt
    std::array<double, 4> terms{};  // seconds of each Term along what set the time
    Term dominant = Term::compute;
    std::string bound;  // "ring" (latency of one step's round) or "stage 2" (throughput)
};

struct Prediction {
    PhaseCost gen, prompt;
    bool fits = true;
    bool shares_core = false;          // two ranks of one group share cores (ClusterSpec::kSharedCore)
    std::string fit_message;           // "node b needs 3.1 GiB, has 2.0 GiB"
    std::vector<uint64_t> node_bytes;  // [cluster nodes] weights + KV each node of the layout holds
};

Prediction predict(const ModelShape &model, const ClusterSpec &cluster, const Layout &layout, int32_t batch,
                   const PredictOptions &options);

// Layers over the stages in proportion to each stage's speed (1 / its time per layer at `rows`), the last
// stage's output head counted as layers, via split_layers; TP slices by tp_split in proportion to node speed
// (equal when the speeds are within 15%, as ClusterEngine splits).
Result<Layout> make_layout(const ModelShape &model, const ClusterSpec &cluster,
                           const std::vector<std::vector<int>> &groups, int32_t rows);

// Every layout worth ranking: each node alone, pipelines, tensor-parallel groups and hybrids (every ordered
// composition into stages) over every ordered subset of the nodes (prefixes only beyond 6 nodes); layouts
// that cannot be split (more ranks than KV heads) are left out.
std::vector<Layout> candidate_layouts(const ModelShape &model, const ClusterSpec &cluster, int32_t rows);

}  // namespace td::cluster
