// Everything `tandem serve` generates with, built from the command line: the model, its tokenizer and chat
// template, the Engine (one sequence slot per parallel request; a LocalEngine, or a ClusterEngine over
// `tandem worker`s) and the Scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "core/thread-pool.h"
#include "model/drafter.h"
#include "model/engine.h"
#include "model/kv-cache.h"
#include "model/model.h"
#include "server/http.h"
#include "server/model-card.h"
#include "server/scheduler.h"
#include "text/chat-formatter.h"
#include "text/tokenizer.h"

namespace td::server {

struct ServeParams {
    std::string model_path;
    std::string pack_dir;  // ModelLoadOptions::pack_dir ("" with --no-repack or through a cluster)
    int32_t n_parallel = 4;  // sequence slots
    // The KV pool: positions all slots hold together (SchedulerParams::kv_pool); 0: not bounded (each slot
    // may hold n_ctx_per_seq). As in llama-server's unified KV cache, one request may use the whole pool.
    int32_t n_ctx = 0;
    // Positions one request may use; 0: the model's training context, capped by the pool.
    int32_t n_ctx_per_seq = 0;
    int32_t n_threads = 0;   // compute threads; 0: all cores
    int32_t n_batch = 512;   // rows per engine step
    int32_t max_queue = -1;  // requests waiting for a slot; -1: 4 * n_parallel
    KvType type_k = KvType::f16, type_v = KvType::f16;  // the KV cache's (ContextParams)
    std::string chat_template;  // "" = the model's (chatml when it has none); a family name or a .jinja file
    // Builds the engine over the loaded model with the slots' ContextParams; null: a LocalEngine on the
    // server's pool. `tandem serve` passes cli::make_engine, so --workers gives a ClusterEngine (then
    // n_threads should be 1: the head computes nothing).
    using EngineFactory = std::function<Result<std::unique_ptr<Engine>>(std::shared_ptr<const Model>,
                                                                        const ContextParams &, ThreadPool &)>;
    EngineFactory make_engine;
    // Steps kept in flight (micro-batches); 0: one per pipeline stage of a ClusterEngine, 1 otherwise.
    int32_t n_micro_batches = 0;
    // How often the engine thread probes a cluster (per-node stats for /metrics, health while idle).
    int probe_interval_ms = 1000;
    // Times a request may be resumed after a lost node (SchedulerParams::max_resumes); 0: it ends with the error.
    int32_t max_resumes = 0;
    // How embedding requests pool a prompt (--pooling); unset: the model's pooling_type, and last (the last
    // token's hidden state, as decoder embedding models use) when the file has none.
    Pooling pooling = Pooling::unset;
    // Speculative decoding (--draft; SchedulerParams::draft): by prompt lookup, or with draft.model, a draft
    // model run on the server's pool (ModelDrafter, with a slot per parallel request).
    DraftParams draft;
    // Test hook: wraps the engine (stall or fault injection around a real engine). Null: none.
    std::function<std::unique_ptr<Engine>(std::unique_ptr<Engine>)> wrap_engine;
};

class ServedModel {
public:
    // Errors: the model file (not found, invalid), a bad template name, a per-slot context under 16
    // positions ("--ctx-size 64 over --parallel 8 leaves 8 positions per slot; ...").
    static Result<std::unique_ptr<ServedModel>> load(const ServeParams &params);
    ~ServedModel();  // stops the scheduler first

    ServerBackend backend();
    Pooling pooling() const { return pooling_; }
    Scheduler &scheduler() { return *scheduler_; }
    // Only once the scheduler is stopped: its engine thread is the one that drives the engine.
    Engine &engine() { return *engine_; }
    const Tokenizer &tokenizer() const { return *tokenizer_; }
    int32_t n_ctx_slot() const { return scheduler_->n_ctx(); }
    const ChatFormatter &chat_template() const { return template_; }
    int n_threads() const { return pool_->n_threads(); }
    // Pipeline stages of a ClusterEngine (its workers, plus the head with --head-layers); 0 on one machine.
    int32_t n_stages() const { return n_stages_; }
    // The placement table of a ClusterEngine ("" on one machine).
    const std::string &placement() const { return placement_; }

private:
    ServedModel() = default;

    std::unique_ptr<ThreadPool> pool_;
    std::shared_ptr<Model> model_;
    std::unique_ptr<Tokenizer> tokenizer_;
    ChatFormatter template_;
    ModelCard card_;
    Pooling pooling_ = Pooling::last;
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<ModelDrafter> drafter_;  // --model-draft; the scheduler drives it
    std::unique_ptr<Scheduler> scheduler_;
    int32_t n_stages_ = 0;
    std::string placement_;
    int32_t n_layer_ = 0;
    // The probe's last cluster_status_json (the engine thread writes it, HTTP threads read it).
    struct StatusBox {
        std::mutex mu;
        std::string json;
    };
    std::shared_ptr<StatusBox> status_ = std::make_shared<StatusBox>();
};

}  // namespace td::server

namespace td::cluster {
class ClusterEngine;
struct ClusterStats;
}  // namespace td::cluster

namespace td::server {

// Prometheus lines for a cluster's per-node and per-link counters (tandem_node_*, tandem_link_*); the links
// are head -> stage 1 -> ... -> last stage -> head.
std::string cluster_metrics(const cluster::ClusterEngine &engine, const cluster::ClusterStats &stats);
// The same counters as JSON for GET /status and the dashboard: {"nodes": [...], "links": [...],
// "head_links"}. A node: address, name, stage, rank, tp_size, layers [first, last], cpu, threads, mem_total,
// mem_available, gflops, weight_bytes, kv_bytes, source, links, forward_steps, compute_seconds, wait_seconds,
// step_latency_seconds, bytes_in, bytes_out (and tp_* with tensor parallelism). A link: from, to, messages,
// bytes, send_seconds, send_latency_seconds.
std::string cluster_status_json(const cluster::ClusterEngine &engine, const cluster::ClusterStats &stats);

}  // namespace td::server
