// `tandem plan`: measure (or read a description of) a cluster, predict every layout with the cost model,
// recommend one. The measurements are the ones the cost model takes (cluster/cost-model.h):
//
//   links    the head to every worker, and every worker to every other (the worker measures its own link:
//            ProbeClient::link_to): round trips of a small message and of every size a layout would send
//            (link_message_sizes), a stream for larger ones
//   nodes    a compute probe per worker of every matrix shape the candidate layouts would give it, at every
//            row count they would run (micro-batches of each batch size, prompt chunks), measured alone
//            (nodes of one kind, one host and the same threads, pooled: PlanOptions::pool_kinds); then every
//            pair of nodes of one host alone and at once, seconds apart, for the host's contention
//   pairs    every pair of nodes in lock step, as two ranks of a tensor-parallel group run (a layer's halves,
//            the engine's all-reduce between them): what they wait for each other beyond the link's price
//            (not pairs that share cores: `together` prices their taking turns)
//
// A described cluster (JSON, `plan --offline`) gives the same numbers by hand; docs/clusters/ has examples.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cluster/cost-model.h"
#include "cluster/probe.h"
#include "core/status.h"

namespace td::cluster {

struct PlanOptions {
    std::vector<int32_t> batches = {1, 4, 16};
    PredictOptions predict;
    int probe_ms = 20;       // per measured matmul point
    int rounds = 3;          // each node is measured this many times, one after another; the median counts
    int link_ms = 100;       // per measured message size
    uint64_t working_set = 0;  // bytes each compute probe cycles through; 0: the worker's default (4x its L3)
    int32_t n_threads = 0;   // threads per worker (0: each worker's own)
    bool contention = true;  // measure nodes that share a host together too
    // Nodes of one host with the same threads are one kind: every measured point is the median of all their
    // rounds (the plain read and the row ops the kind's best), so the planner gives them even splits and even
    // cuts where the host's passing swings told identical cores apart. Off for hosts whose cores differ
    // (performance and efficiency cores): each node keeps its own figures.
    bool pool_kinds = true;
    // Per row count, how long each pair of nodes runs in lock step (net::ProbeSync: a layer's half at 1 row,
    // at the largest batch and at a prompt chunk, an all-reduce between the halves); 0: no lock-step probe.
    int sync_ms = 300;
    // The transports the measured links may take: the engine's (ClusterOptions::transports), so links between
    // nodes of one host are measured over shared memory when the engine would use it.
    uint32_t transports = net::auto_transports();
    // The first of the measured workers is the head's own node (`--head-node`: a LocalWorker in this
    // process).
    bool head_node = false;
};

// Row counts a plan needs measured: micro-batches of every batch over 1..n_nodes stages, prompt chunks, 1.
std::vector<int32_t> plan_rows(const PlanOptions &options, int n_nodes);
// Row counts a pair is run in lock step at: 1, the largest batch, a prompt chunk (one stage's).
std::vector<int32_t> sync_rows(const PlanOptions &options);

// Message sizes a plan measures round trips of: a small message, and the hops and all-reduce parts (whole,
// and the reduce-scatter's chunks) of every row count plan_rows() lists, thinned to sizes about 2x apart, the
// largest kept.
std::vector<uint64_t> link_message_sizes(const ModelShape &model, const PlanOptions &options, int n_nodes);

// Measures `workers` for `model` (progress lines go to `progress`, may be empty), proving `secret` to each.
// Errors: a worker that cannot be reached, refuses the secret or speaks another protocol, a probe that fails.
Result<ClusterSpec> measure_cluster(const std::vector<std::string> &workers, const ModelShape &model,
                                    const PlanOptions &options, const net::ClusterSecret &secret,
                                    const std::function<void(const std::string &)> &progress);

// A described cluster:
//   {"name": "...", "sources": ["..."],
//    "nodes": [{"name": "a", "memory_gib": 120, "mem_bw_gbs": 215, "gflops": 1500, "matvec_efficiency": 0.7,
//               "threads": 16, "host": "a"}, ...],
//    "link": {"latency_us": 40, "bandwidth_gbps": 9.4},          // between any two nodes
//    "links": [{"from": "a", "to": "b", "latency_us": 5, "bandwidth_gbps": 90}],   // optional, either way
//    "head_link": {"latency_us": 10, "bandwidth_gbps": 20}}      // head <-> node; default: a loopback
// A link may also list measured messages, "messages": [{"bytes": 131072, "one_way_us": 292}, ...] (as `plan
// --json` prints a measured link's), which price messages near those sizes (LinkSpec::messages).
// Errors name the field ("nodes[1].mem_bw_gbs must be a positive number").
Result<ClusterSpec> cluster_from_json(const std::string &text);

struct PlanEntry {
    Layout layout;
    Prediction prediction;
};
struct PlanBatch {
    int32_t batch = 1;
    std::vector<PlanEntry> entries;  // every candidate, fastest generation first (those that fit)
    int best_single = -1, best_pipeline = -1, best_tp = -1, best_hybrid = -1;  // indices into entries
    int recommended = -1;
};
// The entry to recommend among `entries` (fastest generation first, those that fit first): the fastest that
// fits and puts no two ranks of a group on shared cores; within 2% of it, the simplest (fewer nodes, then
// smaller tensor-parallel groups, then the first-listed workers). -1 where none qualifies.
int recommend(const std::vector<PlanEntry> &entries);
struct Plan {
    ModelShape model;
    ClusterSpec cluster;
    PlanOptions options;
    std::vector<PlanBatch> batches;
    uint64_t largest_node_bytes = 0;  // the most memory any one node has (0: unknown)
};
Plan make_plan(const ModelShape &model, const ClusterSpec &cluster, const PlanOptions &options);

// The report a person reads: the inputs (nodes, links), then per batch one line per kind of layout, the
// recommendation with its flags and what dominates it, with the numbers.
std::string plan_text(const Plan &plan);
std::string plan_json(const Plan &plan);  // the same, as JSON
// Predicted generation tokens/s against batch size, one line per kind of layout.
std::string plan_svg(const Plan &plan);

}  // namespace td::cluster
