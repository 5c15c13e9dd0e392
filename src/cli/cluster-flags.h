// The cluster flags shared by the subcommands that run a model (run; later bench and serve): with
// --workers the model runs as a pipeline of `tandem worker`s, otherwise on this machine.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread-pool.h"
#include "model/context.h"
#include "model/engine.h"
#include "model/model.h"

namespace td::cli {

struct ClusterFlags {
    std::string workers;  // "h1:p1,h2:p2"; empty: run locally
    std::string layers;   // "0-7,8-15"
    std::string split;    // "1,1"
    std::string wire = "f16";
    bool stats = false;
};

void add_cluster_flags(CLI::App *cmd, ClusterFlags &flags);

// A ClusterEngine when flags.workers is set (n_threads: threads per worker, 0 = each worker's own), else a
// LocalEngine on `pool`.
Result<std::unique_ptr<Engine>> make_engine(const ClusterFlags &flags, std::shared_ptr<const Model> model,
                                            const ContextParams &params, ThreadPool &pool, int32_t n_threads);

// With --stats and a cluster engine: the per-node/link table on stderr.
void print_cluster_stats(const ClusterFlags &flags, Engine &engine);

}  // namespace td::cli
