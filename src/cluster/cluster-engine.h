// ClusterEngine: the Engine whose layers run as a pipeline of workers (`tandem worker`).
//
//   head --control--> every worker (handshake, load, heartbeats, stats)
//   head --Forward(tokens)--> stage 1 --Forward(hidden)--> ... --> last stage --Result(tokens)--> head
//
// The head tokenizes and queues steps; the first stage embeds the tokens, the last one samples with the
// sequence's sampler (set by seq_start, which travels down the ring in order with the steps) and returns
// token ids. With head_layers N > 0 the head itself runs layers [0, N) (in submit(), on its own thread
// pool) and sends hidden rows to stage 1, which then starts at layer N.
//
// Overlap: up to max_in_flight steps travel at once, so independent sequences (micro-batches: a driver
// keeps n_stages() groups of sequences in flight) overlap across stages. A step with many rows (a long
// prompt) is cut into chunks (auto_chunk_rows) that travel as separate Forward messages back to back, so
// stage 2 works on chunk k while stage 1 works on chunk k+1; wait() returns the step's outputs in row order
// as if it had been one message. Results do not depend on the chunking (batch-invariant math).
//
// Failure: a worker that disconnects or misses heartbeats for dead_after_ms fails every outstanding step
// and the next one with an error naming it ("worker 127.0.0.1:41000 disconnected"); the head never waits
// longer than that. The next seq_start/submit with nothing outstanding reconnects from scratch (handshake,
// load from the worker's cache), so the same engine works again once the worker is back.
//
// Losing a node for good: a reconnect that cannot reach a worker (refused, or no handshake within
// connect_timeout_ms) puts a spare (`spares`) in its place, with its layers and slice; with no spare left
// and `replan`, it drops the worker and places the model over the workers left, when they can hold it. A
// worker that was replaced or dropped becomes a spare itself, so it stands in for the next loss once it is
// back. recoveries() lists what happened; the first connect never substitutes (a wrong --workers entry is
// reported, not silently replaced).
//
// Tensor parallelism (`tp` / `layout`): a stage may be a group of workers that each hold a slice of every
// layer of its range (model/tp-slice.h) and all-reduce their partial sums over peer links twice per layer.
// The head (or the previous group) sends every step to every rank of a group; rank 0 of the last group
// samples (merging the ranks' candidates) and returns the tokens. One stage of N nodes is `--tp N`; stages of
// groups are a layout, e.g. "2,2" (two stages of two nodes: workers 1-2 run the first half of the layers,
// 3-4 the second).
//
// Thread safety: one thread drives the Engine methods; stats() may be called from that thread too.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cluster/frame-queue.h"
#include "cluster/placement.h"
#include "core/thread-pool.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/model.h"
#include "model/tp-slice.h"
#include "net/auth.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::cluster {

class LocalWorker;

struct ClusterOptions {
    std::string workers;  // "h1:p1,h2:p2": the stages, in pipeline order
    std::string layers;   // "0-7,8-15": explicit ranges (one per worker); else
    std::string split;    // "1,1": relative shares per worker; else in proportion to each worker's measured speed
    int32_t tp = 1;       // > 1: the workers form stages of tp nodes each (tensor-parallel groups)
    std::string layout;   // "2,2": nodes per stage, in worker order (instead of tp); "" = tp (or 1 each)
    net::WireType wire = net::WireType::f16;
    net::ReduceType tp_reduce = net::ReduceType::f32;  // what a TP group's all-reduce parts travel as
    ContextParams context;  // n_ctx (0: the model's), n_seq, kv type; every stage uses the same
    int32_t n_threads = 0;  // threads per worker; 0: the worker's own -t
    int max_in_flight = 8;
    int32_t head_layers = 0;   // layers [0, head_layers) run on the head; the workers run the rest
    // The head is also a node: the first of the layout (rank 0 of the first tensor-parallel group, or the
    // first pipeline stage), served by a Worker in the head's own process on a loopback port, so it takes a
    // share of every layer like any rank (`--tp 2` over the head and one worker uses both boxes). Its weights
    // are cut from the head's model file into stage_dir; its thread pool has head_threads threads.
    bool head_node = false;
    int32_t head_threads = 0;  // the head's thread pool with head_layers > 0 (0: all cores)
    int32_t chunk_rows = 0;    // rows per Forward message of a long step; 0: auto_chunk_rows
    std::string stage_dir;     // where the head writes stage files it streams; "": <temp>/tandem-stages
    std::string pack_dir;      // packed weights of the head's layers (ModelLoadOptions::pack_dir); "": none
    int connect_timeout_ms = 3000;
    int heartbeat_ms = 500;
    int dead_after_ms = 2000;
    int step_timeout_ms = 120000;  // a step with no result for this long fails (stalled pipeline)
    bool print_placement = true;   // placement table on stderr after connecting
    std::string spares;  // "h:p,h:p": stand-by workers that take a lost worker's place at a reconnect
    // A lost worker with no spare to take its place is dropped and the model placed over the workers left
    // (by speed and memory; not with explicit `layers`), when they can hold it.
    bool replan = false;
    net::ClusterSecret secret;     // proved to every worker, and asked of every connection to the head
    // Transports every link of the cluster may use (--transport: net::transports_from_name); each link takes
    // the best both of its ends allow (shm between processes of one host), else TCP.
    uint32_t transports = net::auto_transports();
};

struct NodeStatus {
    std::string address;  // as given in --workers
    LayerRange layers;
    int32_t stage = 0;    // pipeline stage (0 = first)
    int32_t rank = 0;     // rank in the stage's tensor-parallel group
    int32_t tp_size = 1;  // ranks in that group
    TpSlice slice;        // what the rank holds (tp_size > 1)
    std::vector<std::string> next;  // where it sends its output: next stage ranks, "head", or nothing
    net::HelloReply hello;
    std::string source;  // LoadReply.source: "local file ...", "cache ...", "streamed from the head ..."
    net::StageReady ready;
};

// Rows per Forward message when a step of n_rows rows goes through a pipeline of n_stages stages (the head
// counts as a stage when it runs layers): one message when n_stages is 1 or the step is short; else about
// kChunksPerStage chunks per stage (8: the pipeline fill and drain cost 1/17 of a 2-stage prompt), never
// fewer than kMinChunkRows rows (small matmuls lose efficiency) nor more than net::kMaxBatchRows.
inline constexpr int32_t kChunksPerStage = 8;
inline constexpr int32_t kMinChunkRows = 32;
inline constexpr int32_t kMaxPartsPerStep = 64;  // a step is never cut into more messages than this
int32_t auto_chunk_rows(int32_t n_rows, int32_t n_stages);

struct ClusterStats {
    std::vector<net::StatsReply> nodes;                // [n_workers], since each stage was loaded
    uint64_t tokens = 0;                               // outputs (sampled tokens) returned, since connecting
    uint64_t head_msgs_sent = 0, head_bytes_sent = 0;  // head -> stage 1 (data), since connecting
    uint64_t head_msgs_recv = 0, head_bytes_recv = 0;  // last stage -> head (data)
    double head_send_seconds = 0.0;
    std::string head_links;  // "in shm, out shm": the transports of the head's data links (StatsReply::links)
};

class ClusterEngine : public Engine {
public:
    // Connects, places the layers, loads every stage (streaming weights a worker lacks) and links the ring.
    // Errors: unreachable worker, handshake mismatch ("worker 10.0.0.2:9000 speaks protocol 3, head speaks
    // 1"), fingerprint mismatch (the worker's message names both hashes and its file), bad placement.
    static Result<std::unique_ptr<ClusterEngine>> create(std::shared_ptr<const Model> model,
                                                         const ClusterOptions &options);
    ~ClusterEngine() override;

    int32_t n_ctx() const override { return n_ctx_; }
    int32_t n_seq() const override { return options_.context.n_seq; }
    int32_t n_vocab() const override { return model_->hparams().n_vocab; }
    int max_in_flight() const override { return options_.max_in_flight; }
    // Pipeline stages: the workers, plus the head when it runs layers. A driver keeps this many
    // micro-batches (groups of sequences) in flight to keep every stage busy.
    int n_stages() const { return static_cast<int>(groups_.size()) + (options_.head_layers > 0 ? 1 : 0); }
    // Nodes per stage (tensor-parallel group sizes), workers only.
    std::vector<size_t> stage_sizes() const;
    Status seq_start(int32_t seq, const SamplerParams &params, bool want_logits = false,
                     const SamplerHistory &history = {}, int32_t keep = 0, int32_t keep_from = -1) override;
    int32_t seq_cached(int32_t seq) const override;
    Status seq_clear(int32_t seq) override;
    Status submit(const Batch &batch) override;
    Result<std::vector<StepOutput>> wait() override;

    int32_t head_layers() const { return options_.head_layers; }
    bool head_node() const { return head_worker_ != nullptr; }
    net::WireType wire() const { return options_.wire; }
    // Current nodes (after a reconnect, the new load sources).
    const std::vector<NodeStatus> &nodes() const { return nodes_; }
    // node | layers | weights | KV | source, one line per worker (and one for the head with head_layers).
    std::string placement_table() const;
    // Asks every worker for its counters (control link) and adds the head's own link counters.
    Result<ClusterStats> stats();
    std::string format_stats(const ClusterStats &stats) const;
    // The stages in use, e.g. "127.0.0.1:9000 [0-1] -> 127.0.0.1:9001 + 127.0.0.1:9002 [2-4]".
    std::string layout() const;
    // What replaced or dropped a lost worker, oldest first ("worker A lost (...): spare B took its place").
    const std::vector<std::string> &recoveries() const { return recoveries_; }
    const std::vector<std::string> &spares() const { return spares_; }

private:
    ClusterEngine() = default;
    // Connects the current layout; at a reconnect, a worker that cannot be reached is replaced by a spare or
    // dropped (recover) and the connect tried again. On failure the layout is what it was before.
    Status connect();
    Status connect_once();
    // Replaces or drops worker i (unreachable: `cause`), skipping spares in `tried`; false when neither is
    // possible. Appends what it did to `events`.
    bool recover(size_t i, const Status &cause, const std::vector<std::string> &tried,
                 std::vector<std::string> &events);
    void disconnect();
    // Reconnects when the cluster failed (see ensure_connected in the .cpp for queued steps).
    Status ensure_connected(bool new_request);
    void fail(const Status &status);  // first failure wins; wakes every waiter
    Status broken() const;

    Status handshake(size_t i);
    Status load_stage(size_t i, const std::vector<std::string> &next, uint64_t group);
    // The worker that returns results (rank 0 of the last stage).
    const std::string &result_address() const { return addresses_[groups_.back()[0]]; }
    uint64_t fingerprint_of(size_t i, uint64_t *stage_fp);
    Status stream_stage_file(size_t i, const net::LoadStage &ls);
    Status accept_result_link();
    // Each worker's relative speed: --split, else its measured GFLOP/s.
    Result<std::vector<double>> node_shares() const;
    Result<std::vector<LayerRange>> place() const;
    Status enqueue_data(net::MsgType type, uint64_t request_id, std::span<const uint8_t> payload);
    // Sends rows [begin, end) of `batch` as one Forward message with step id `id` (running the head's
    // layers first when it has any).
    Status send_part(const Batch &batch, int32_t begin, int32_t end, uint64_t id);
    // Decodes one Result frame of step `id` into `out` (appending). Error frames become their Status.
    Status take_result(Frame *f, uint64_t id, std::vector<StepOutput> &out);

    void control_loop(size_t i);
    void heartbeat_loop();
    void result_loop();

    std::shared_ptr<const Model> model_;
    ClusterOptions options_;
    std::vector<std::string> addresses_;
    std::vector<std::vector<size_t>> groups_;  // [stage] worker indices, in rank order
    int32_t n_ctx_ = 0;
    std::map<std::string, uint64_t> fingerprints_;  // cached: hashing a big model takes a while
    std::set<std::string> stage_files_;  // the stage files this engine streamed (kept in stage_dir)
    // Chosen at the first connect, kept across reconnects: [stage] layers, [worker] slices.
    std::vector<LayerRange> placement_;
    std::vector<TpSlice> slices_;
    std::vector<double> split_;        // [n_workers] --split shares; empty: measured speeds
    std::vector<std::string> spares_;  // stand-by workers, first used first
    std::vector<std::string> recoveries_;
    bool ever_connected_ = false;
    int64_t unreachable_ = -1;  // set by connect_once: the worker whose handshake failed (not refused)

    // Connection state (rebuilt by connect()).
    bool connected_ = false;
    std::vector<NodeStatus> nodes_;
    std::vector<std::unique_ptr<net::Connection>> control_;  // [n_workers]
    std::unique_ptr<net::Listener> result_listener_;
    std::vector<std::unique_ptr<net::Connection>> data_outs_;  // [ranks of the first stage]
    std::vector<std::unique_ptr<net::AsyncSender>> senders_;   // [ranks of the first stage]
    std::unique_ptr<net::Connection> result_in_;
    std::unique_ptr<FrameQueue> results_;
    std::vector<std::thread> threads_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    Status broken_;
    bool stopping_ = false;
    std::vector<std::chrono::steady_clock::time_point> last_pong_;  // [n_workers]
    std::vector<net::StatsReply> stats_replies_;                    // [n_workers]
    std::vector<uint64_t> stats_seen_;                              // [n_workers] request id answered

    // With head_node: the head's own node (worker 0), served until the engine goes.
    std::unique_ptr<LocalWorker> head_worker_;
    // "head node" for the head's own node, else the worker's address as given.
    std::string node_label(size_t i) const;

    // The head's own layers [0, head_layers): a model view of that range, its context and thread pool.
    std::shared_ptr<const Model> head_model_;
    std::unique_ptr<ThreadPool> head_pool_;
    std::unique_ptr<Context> head_ctx_;

    // Engine state (driver thread).
    struct Pending {
        uint64_t first_id = 0;  // the step's messages carry ids first_id .. first_id + n_parts - 1
        uint32_t n_parts = 0;
    };
    std::deque<Pending> pending_;  // steps in flight
    Batch part_;                   // rows of one part (reused)
    uint64_t next_step_ = 1;
    uint64_t tokens_done_ = 0;
    uint64_t next_stats_id_ = 1;
    std::vector<bool> started_, want_logits_;  // [n_seq]
    std::vector<int32_t> cached_;              // [n_seq] positions the stages hold (0 after a reconnect)
    // [n_seq] sequences started before the cluster was reconnected: their KV state is gone, so any step
    // of theirs fails with lost_reason_ until seq_start (or seq_clear) begins them again.
    std::vector<bool> lost_;
    Status lost_reason_;
    Status lost_error(int32_t seq) const;  // "sequence 3 lost its state when the cluster failed (...)"
    std::vector<uint8_t> buf_;  // encoded outgoing payload
};

}  // namespace td::cluster
