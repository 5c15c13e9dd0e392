// ClusterEngine: the Engine whose layers run as a pipeline of workers (`tandem worker`).
//
//   head --control--> every worker (handshake, load, heartbeats, stats)
//   head --Forward(tokens)--> stage 1 --Forward(hidden)--> ... --> last stage --Result(tokens)--> head
//
// The head tokenizes and queues steps; the first stage embeds the tokens, the last one samples with the
// sequence's sampler (set by seq_start, which travels down the ring in order with the steps) and returns
// token ids. Up to max_in_flight steps travel at once, so prompt chunks and independent sequences overlap
// across stages.
//
// Failure: a worker that disconnects or misses heartbeats for dead_after_ms fails every outstanding step
// and the next one with an error naming it ("worker 127.0.0.1:41000 disconnected"); the head never waits
// longer than that. The next seq_start/submit with nothing outstanding reconnects from scratch (handshake,
// load from the worker's cache), so the same engine works again once the worker is back.
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
#include <string>
#include <thread>
#include <vector>

#include "cluster/frame-queue.h"
#include "cluster/placement.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/model.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::cluster {

struct ClusterOptions {
    std::string workers;  // "h1:p1,h2:p2": the stages, in pipeline order
    std::string layers;   // "0-7,8-15": explicit ranges (one per worker); else
    std::string split;    // "1,1": relative shares; else in proportion to each worker's measured speed
    net::WireType wire = net::WireType::f16;
    ContextParams context;  // n_ctx (0: the model's), n_seq, kv type; every stage uses the same
    int32_t n_threads = 0;  // threads per worker; 0: the worker's own -t
    int max_in_flight = 8;
    std::string stage_dir;  // where the head writes stage files it streams; "": <temp>/tandem-stages
    int connect_timeout_ms = 3000;
    int heartbeat_ms = 500;
    int dead_after_ms = 2000;
    int step_timeout_ms = 120000;  // a step with no result for this long fails (stalled pipeline)
    bool print_placement = true;   // placement table on stderr after connecting
};

struct NodeStatus {
    std::string address;  // as given in --workers
    LayerRange layers;
    net::HelloReply hello;
    std::string source;  // LoadReply.source: "local file ...", "cache ...", "streamed from the head ..."
    net::StageReady ready;
};

struct ClusterStats {
    std::vector<net::StatsReply> nodes;                // [n_workers], since each stage was loaded
    uint64_t head_msgs_sent = 0, head_bytes_sent = 0;  // head -> stage 1 (data), since connecting
    uint64_t head_msgs_recv = 0, head_bytes_recv = 0;  // last stage -> head (data)
    double head_send_seconds = 0.0;
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
    Status seq_start(int32_t seq, const SamplerParams &params, bool want_logits = false) override;
    Status seq_clear(int32_t seq) override;
    Status submit(const Batch &batch) override;
    Result<std::vector<StepOutput>> wait() override;

    // Current nodes (after a reconnect, the new load sources).
    const std::vector<NodeStatus> &nodes() const { return nodes_; }
    // node | layers | weights | KV | source, one line per worker.
    std::string placement_table() const;
    // Asks every worker for its counters (control link) and adds the head's own link counters.
    Result<ClusterStats> stats();
    std::string format_stats(const ClusterStats &stats) const;

private:
    ClusterEngine() = default;
    Status connect();
    void disconnect();
    // Reconnects when the cluster failed (see ensure_connected in the .cpp for queued steps).
    Status ensure_connected(bool new_request);
    void fail(const Status &status);  // first failure wins; wakes every waiter
    Status broken() const;

    Status handshake(size_t i);
    Status load_stage(size_t i, const std::string &next_host, uint16_t next_port);
    Status stream_stage_file(size_t i, const net::LoadStage &ls);
    Status accept_result_link();
    Result<std::vector<LayerRange>> place() const;
    Status enqueue_data(net::MsgType type, uint64_t request_id, std::span<const uint8_t> payload);

    void control_loop(size_t i);
    void heartbeat_loop();
    void result_loop();

    std::shared_ptr<const Model> model_;
    ClusterOptions options_;
    std::vector<std::string> addresses_;
    int32_t n_ctx_ = 0;
    std::map<LayerRange, uint64_t> fingerprints_;  // cached: hashing a big model takes a while
    std::vector<LayerRange> placement_;            // chosen at the first connect, kept across reconnects

    // Connection state (rebuilt by connect()).
    bool connected_ = false;
    std::vector<NodeStatus> nodes_;
    std::vector<std::unique_ptr<net::Connection>> control_;  // [n_workers]
    std::unique_ptr<net::Listener> result_listener_;
    std::unique_ptr<net::Connection> data_out_, result_in_;
    std::unique_ptr<net::AsyncSender> sender_;
    std::unique_ptr<FrameQueue> results_;
    std::vector<std::thread> threads_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    Status broken_;
    bool stopping_ = false;
    std::vector<std::chrono::steady_clock::time_point> last_pong_;  // [n_workers]
    std::vector<net::StatsReply> stats_replies_;                    // [n_workers]
    std::vector<uint64_t> stats_seen_;                              // [n_workers] request id answered

    // Engine state (driver thread).
    std::deque<uint64_t> pending_;  // step ids in flight
    uint64_t next_step_ = 1;
    uint64_t next_stats_id_ = 1;
    std::vector<bool> started_, want_logits_;  // [n_seq]
    std::vector<uint8_t> buf_;                 // encoded outgoing payload
};

}  // namespace td::cluster
