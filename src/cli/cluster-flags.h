// The cluster flags shared by the subcommands that run a model (run, bench, serve): with --workers the
// model runs as a pipeline of `tandem worker`s, otherwise on this machine.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread-pool.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/model.h"
#include "net/auth.h"

namespace td::cluster {
class LocalWorker;
}

namespace td::cli {

// --discover: find the workers on the LAN over mDNS instead of listing them (cluster/discovery.h).
struct DiscoverFlags {
    bool discover = false;
    std::string cluster = "default";  // --cluster: only workers announced with this name
    int min_workers = 0;              // wait until this many are usable (0: take what answers in the window)
    double timeout_s = 0.0;           // 0: a 2 s window, or up to 30 s waiting for --min-workers
};

void add_discover_flags(CLI::App *cmd, DiscoverFlags &flags);

// With --discover: browses for the workers of flags.cluster, says on stderr which it uses and which it does
// not (and why), and sets `workers` to the usable ones. Errors: --workers given too, no mDNS in this build,
// or fewer usable workers than wanted. Without --discover: nothing.
Status apply_discovery(const DiscoverFlags &flags, std::string &workers);

struct ClusterFlags {
    std::string workers;  // "h1:p1,h2:p2"; empty: run locally
    DiscoverFlags discover;  // --discover fills `workers` (apply_discovery)
    std::string layers;   // "0-7,8-15"
    std::string split;    // "1,1"
    int32_t tp = 1;       // nodes per tensor-parallel stage
    std::string layout;   // "2,2": nodes per stage
    std::string wire = "f16";
    std::string tp_reduce = "f32";  // all-reduce parts between TP ranks
    std::string transport = "auto";  // --transport: auto, tcp, shm
    int32_t head_layers = 0;  // layers the head runs itself before stage 1
    bool head_node = false;   // the head is also the first node of the layout (a worker in its process)
    int32_t chunk_rows = 0;   // rows per message of a long step (0: chosen from the stages and the step)
    bool stats = false;
    bool no_repack = false;  // keep q4_0 matrices in the GGUF's row layout (no packed copy)
    std::string secret_file;  // --secret-file; "": net::default_secret_path()
    // serve only (registered by add_recovery_flags): stand-by workers, and re-planning around a lost one.
    std::string spares;
    bool replan = false;
};

// --spare and --replan, for the subcommands that reconnect after a lost worker (serve).
void add_recovery_flags(CLI::App *cmd, ClusterFlags &flags);

void add_cluster_flags(CLI::App *cmd, ClusterFlags &flags);

// The head's own node for measuring it (plan, up): a worker in this process on a loopback port, with
// n_threads threads (0: all cores), stopped when the pointer goes.
Result<std::unique_ptr<cluster::LocalWorker>> start_head_node(int32_t n_threads,
                                                              const net::ClusterSecret &secret,
                                                              uint32_t transports);

// A ClusterEngine when flags.workers is set (n_threads: threads per worker, 0 = each worker's own; the head
// runs its --head-layers on a pool of its own with n_threads threads), else a LocalEngine on `pool`.
Result<std::unique_ptr<Engine>> make_engine(const ClusterFlags &flags, std::shared_ptr<const Model> model,
                                            const ContextParams &params, ThreadPool &pool, int32_t n_threads);

// Pipeline stages of an engine (1 for a local one): how many micro-batches keep every stage busy.
int engine_stages(const Engine &engine);

// "0-7,8-15" (head layers first as "head 0-1," when it runs any) and the wire, for reports; "" when local.
std::string engine_placement(const Engine &engine);

// Threads of the first worker (as it reported at the handshake); 0 for a local engine.
int32_t engine_worker_threads(const Engine &engine);

// With --stats and a cluster engine: the per-node/link table on stderr.
void print_cluster_stats(const ClusterFlags &flags, Engine &engine);

}  // namespace td::cli
