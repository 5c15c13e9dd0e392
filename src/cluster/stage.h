// A worker's running pipeline stage: layers [first, last) of a model, its KV cache, and the three threads
// that overlap receiving, computing and sending:
//
//   previous hop --Forward/SeqStart/SeqClear--> [recv thread] -> FrameQueue -> [compute thread]
//        -> AsyncSender --Forward (hidden rows) or Result (last stage: sampled tokens)--> next hop
//
// Messages are applied strictly in arrival order, so SeqStart/SeqClear take effect between the steps
// around them on every stage. An error computing a step travels downstream as an Error frame with the
// step's id, which the head reports for that step.
//
// A tensor-parallel rank (load.tp_size > 1) runs its slice of the layers with a PeerCollective over links to
// the other ranks of its group (dialed here to the higher ranks, handed over by the worker from the lower
// ones: attach_peer). Every rank receives the same messages; it sends its output to each of load.next (the
// next group's ranks it feeds), and in the last group only rank 0 samples (TpOutputMerger) and answers.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cluster/frame-queue.h"
#include "cluster/tp-collective.h"
#include "core/status.h"
#include "core/thread-pool.h"
#include "model/batch.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/tp-sample.h"
#include "net/auth.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::cluster {

class Stage {
public:
    // Creates the context for the range in `load` and connects to the next hop (data role) and the higher
    // ranks of its group (peer role), proving `secret` to each. Errors: bad parameters, out of memory, next
    // hop unreachable or refusing us (naming it).
    static Result<std::unique_ptr<Stage>> create(std::shared_ptr<const Model> model,
                                                 const net::LoadStage &load, ThreadPool &pool,
                                                 const std::string &node_name, const net::ClusterSecret &secret);
    ~Stage();

    // Takes the previous hop's data connection (its Hello already answered) and starts the threads.
    // Error (conn left with the caller): an input is already attached.
    Status attach_input(std::unique_ptr<net::Connection> &conn);
    // A tensor-parallel peer's link (its Hello said this stage's group and its rank). Errors: not a TP stage,
    // bad rank, already linked.
    Status attach_peer(uint32_t rank, std::unique_ptr<net::Connection> conn);
    uint64_t group() const { return load_.tp_size > 1 ? load_.group : 0; }
    // Closes the links and joins the threads. Idempotent.
    void stop();

    net::StatsReply stats() const;
    uint64_t kv_bytes() const { return ctx_->kv().bytes(); }

private:
    Stage() = default;
    void recv_loop();
    void compute_loop();
    Status handle(Frame &f);
    Status handle_forward(Frame &f);
    Status handle_seq_start(Frame &f);
    Status send_down(net::MsgType type, uint64_t request_id, std::span<const uint8_t> payload);

    std::shared_ptr<const Model> model_;
    std::unique_ptr<Context> ctx_;
    net::LoadStage load_;
    std::string node_name_;
    bool is_first_ = false, is_last_ = false;
    net::WireType wire_ = net::WireType::f16;

    std::unique_ptr<PeerCollective> collective_;  // tp_size > 1 (ctx_ calls it while computing)
    TpOutputMerger merger_;
    std::unique_ptr<net::Connection> in_;
    std::vector<std::unique_ptr<net::Connection>> outs_;      // [next hops]
    std::vector<std::unique_ptr<net::AsyncSender>> senders_;  // [next hops]
    FrameQueue queue_{4};
    std::thread recv_thread_, compute_thread_;
    std::atomic<bool> stopping_{false};
    bool stopped_ = false;

    // Compute-thread state, reused across steps (no allocation per message in steady state).
    Batch batch_;
    std::vector<float> hidden_in_;                    // [n_rows, n_embd]
    std::vector<uint8_t> out_buf_;                    // encoded outgoing payload
    std::vector<std::unique_ptr<Sampler>> samplers_;  // [n_seq], last stage only
    std::vector<Sampler *> sampler_ptrs_;             // [n_seq]
    std::vector<bool> want_logits_;                   // [n_seq]
    std::vector<StepOutput> outputs_;
    std::vector<net::ResultRow> rows_;
    std::vector<uint32_t> top_counts_;       // [rows with logits] alternatives each (kResultTop)
    std::vector<net::ResultTop> top_pairs_;  // the alternatives, in row order

    // Counters (StatsReply).
    std::atomic<uint64_t> msgs_in_{0}, msgs_out_{0}, bytes_in_{0}, bytes_out_{0}, forward_steps_{0};
    std::atomic<uint64_t> compute_ns_{0}, wait_ns_{0}, send_ns_{0};
};

}  // namespace td::cluster
