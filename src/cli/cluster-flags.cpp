#include "cli/cluster-flags.h"

#include <fmt/format.h>

#include <cstdio>

#include "cli/common.h"
#include "cluster/cluster-engine.h"
#include "cluster/discovery.h"
#include "cluster/placement.h"
#include "cluster/planner.h"
#include "cluster/worker.h"
#include "net/protocol.h"

namespace td::cli {
namespace {

// --layout auto: measure the workers and links as `tandem plan` does, then run the layout it recommends for
// the engine's sequence slots (the batch a server keeps in flight), saying which and why on stderr.
Status choose_layout(const Model &model, const ContextParams &params, int32_t n_threads,
                     cluster::ClusterOptions &co) {
    TD_ASSIGN_OR_RETURN(auto workers, cluster::parse_worker_list(co.workers));
    TD_ASSIGN_OR_RETURN(cluster::ModelShape shape, cluster::model_shape_from_file(model.file()));
    cluster::PlanOptions po;
    std::unique_ptr<cluster::LocalWorker> head;  // --head-node: this machine measured as the first node
    if (co.head_node) {
        TD_ASSIGN_OR_RETURN(head, start_head_node(n_threads, co.secret, co.transports));
        workers.insert(workers.begin(), head->address());
        po.head_node = true;
    }
    const int32_t batch = std::max<int32_t>(1, params.n_seq);
    po.batches = {batch};
    po.probe_ms = 10;
    po.n_threads = n_threads;
    po.transports = co.transports;
    po.predict.kv_bytes = kv_bytes_per_value(params.type_k, params.type_v);
    std::fprintf(stderr, "tandem: --layout auto: measuring %zu %s and their links\n", workers.size(),
                 co.head_node ? "nodes (this one too)" : "workers");
    TD_ASSIGN_OR_RETURN(cluster::ClusterSpec spec, cluster::measure_cluster(workers, shape, po, co.secret, {}));
    const cluster::Plan plan = cluster::make_plan(shape, spec, po);
    const cluster::PlanBatch &pb = plan.batches[0];
    if (pb.recommended < 0)
        return invalid_input("--layout auto: no layout of {} fits these workers", shape.name);
    const cluster::PlanEntry &e = pb.entries[static_cast<size_t>(pb.recommended)];
    const cluster::Layout &l = e.layout;
    const cluster::LayoutArgs args = l.args(spec);
    co.workers = args.workers;
    co.head_node = args.head_node;
    co.layout = args.sizes;
    co.tp = 1;
    if (l.groups.size() > 1) co.layers = args.layers;
    if (!args.split.empty()) co.split = args.split;
    std::string others;
    for (auto [what, idx] : {std::pair{"one machine", pb.best_single},
                             {"pipeline", pb.best_pipeline},
                             {"tensor parallel", pb.best_tp},
                             {"hybrid", pb.best_hybrid}})
        if (idx >= 0 && idx != pb.recommended)
            others += fmt::format("{}{} {:.1f}", others.empty() ? "" : ", ", what,
                                  pb.entries[static_cast<size_t>(idx)].prediction.gen.tokens_per_s);
    const std::string flags = l.flags(spec);
    std::fprintf(
        stderr,
        "tandem: --layout auto chose %s (%s), %s: %.1f tokens/s predicted at batch %d (%s); %s dominates\n",
        l.label().c_str(), l.kind().c_str(), flags.empty() ? "this machine alone" : flags.c_str(),
        e.prediction.gen.tokens_per_s, batch,
        others.empty() ? "nothing else fits" : others.c_str(), cluster::term_name(e.prediction.gen.dominant));
    return {};
}

}  // namespace

void add_discover_flags(CLI::App *cmd, DiscoverFlags &flags) {
    cmd->add_flag("--discover", flags.discover,
                  "Find the workers on the LAN (mDNS, _tandem._tcp) instead of listing them with --workers");
    cmd->add_option("--cluster", flags.cluster, "With --discover: use only the workers of this cluster name")
        ->default_val("default");
    cmd->add_option("--min-workers", flags.min_workers,
                    "With --discover: wait until this many usable workers answer (up to --discover-timeout)")
        ->default_val(0)
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--discover-timeout", flags.timeout_s,
                    "With --discover: seconds to look (default 2, or up to 30 waiting for --min-workers)")
        ->default_val(0.0)
        ->check(CLI::NonNegativeNumber);
}

Status apply_discovery(const DiscoverFlags &flags, std::string &workers) {
    if (!flags.discover) {
        if (flags.min_workers > 0) return invalid_input("--min-workers needs --discover");
        return {};
    }
    if (!workers.empty()) return invalid_input("give --workers or --discover, not both");
    cluster::DiscoverOptions o;
    o.cluster_name = flags.cluster;
    o.min_workers = flags.min_workers;
    if (flags.timeout_s > 0) {
        o.window = o.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.timeout_s * 1000));
    }
    std::fprintf(stderr, "tandem: looking for workers of cluster '%s' on the LAN (mDNS)%s\n",
                 o.cluster_name.c_str(),
                 o.min_workers > 0 ? fmt::format(", waiting for {}", o.min_workers).c_str() : "");
    TD_ASSIGN_OR_RETURN(std::vector<cluster::FoundWorker> found, cluster::discover_workers(o));
    TD_TRY(cluster::enough_workers(found, o));
    workers = cluster::usable_worker_list(found);
    std::fprintf(stderr, "tandem: discovered:\n%s", cluster::describe_found(found).c_str());
    std::fflush(stderr);
    return {};
}

void add_cluster_flags(CLI::App *cmd, ClusterFlags &flags) {
    cmd->add_option("--workers", flags.workers,
                    "Run as a pipeline on these workers: HOST:PORT,HOST:PORT,...");
    add_discover_flags(cmd, flags.discover);
    cmd->add_option("--layers", flags.layers,
                    "Layers per worker, e.g. 0-7,8-15 (default: by measured speed)");
    cmd->add_option(
        "--split", flags.split,
        "Relative shares per worker, e.g. 1,1 or 3,1 (layers; with --tp or --layout also heads and FFN "
        "rows; with --layers only those)");
    cmd->add_option("--tp", flags.tp,
                    "Tensor parallelism: every N workers form one stage that splits each layer's heads and "
                    "FFN rows (--tp 2 with 2 workers: both work on every token)")
        ->default_val(1)
        ->check(CLI::Range(1, 64));
    cmd->add_option(
           "--tp-reduce", flags.tp_reduce,
           "What tensor-parallel nodes send each other for their sums: f32 (exact order), f16 or bf16 "
           "(half the bytes; logits move by ~1e-3)")
        ->default_val("f32");
    cmd->add_option(
        "--layout", flags.layout,
        "Nodes per pipeline stage, in --workers order, e.g. 2,2 (two stages of two tensor-parallel "
        "nodes) or 2,1; auto: measure the workers and links and run what `tandem plan` recommends");
    cmd->add_option("--wire", flags.wire, "Activation encoding between stages: f32, f16 or q8_0")
        ->default_val("f16");
    cmd->add_option(
           "--transport", flags.transport,
           "How links between nodes travel: auto (shared memory between processes of one host, UCX "
           "where it sees an RDMA device, else TCP), tcp, shm (shared memory where both ends share a "
           "host, else TCP), or ucx (UCX: RDMA, else its own shared memory or TCP)")
        ->default_val("auto");
    cmd->add_option("--head-layers", flags.head_layers,
                    "Layers the head runs itself before the workers (0: embedding and sampling only)")
        ->default_val(0)
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--head-node", flags.head_node,
                  "The head is also a node: the first of the layout, before --workers (with --tp 2 and one "
                  "worker, both machines compute every layer; with --layout 2,2 the head is rank 0 of stage "
                  "1); it uses -t threads");
    cmd->add_option("--chunk", flags.chunk_rows,
                    "Rows per pipeline message of a long prompt (0: chosen from the number of stages)")
        ->default_val(0)
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--stats", flags.stats, "Print per-node and per-link counters at the end (cluster)");
    add_secret_flag(cmd, flags.secret_file);
    cmd->add_flag("--no-repack", flags.no_repack,
                  "Keep the weights in the GGUF's row layout instead of packing them for the fast kernels "
                  "(the packed copy is cached in "
                  "~/.cache/tandem/packed, or $TANDEM_CACHE_DIR/packed)");
}

void add_recovery_flags(CLI::App *cmd, ClusterFlags &flags) {
    cmd->add_option(
        "--spare", flags.spares,
        "Stand-by workers H:P,H:P: one takes a lost worker's place (its layers, its slice) when the "
        "head reconnects");
    cmd->add_flag(
        "--replan", flags.replan,
        "With no spare left, drop a lost worker and place the model over the workers left when they "
        "can hold it (not with --layers)");
}

Result<std::unique_ptr<Engine>> make_engine(const ClusterFlags &flags, std::shared_ptr<const Model> model,
                                            const ContextParams &params, ThreadPool &pool,
                                            int32_t n_threads) {
    if (flags.workers.empty()) {
        if (!flags.layers.empty() || !flags.split.empty() || flags.head_layers > 0 || flags.chunk_rows > 0 ||
            flags.tp > 1 || !flags.layout.empty() || !flags.spares.empty() || flags.replan || flags.head_node)
            return invalid_input(
                "--layers, --split, --tp, --layout, --head-layers, --head-node, --chunk, --spare and "
                "--replan "
                "need --workers");
        TD_ASSIGN_OR_RETURN(auto e, LocalEngine::create(std::move(model), params, pool));
        return std::unique_ptr<Engine>(std::move(e));
    }
    cluster::ClusterOptions co;
    TD_ASSIGN_OR_RETURN(co.secret, load_cluster_secret(flags.secret_file));
    if (std::string error; !net::transports_from_name(flags.transport, &co.transports, &error))
        return invalid_input("{}", error);
    co.workers = flags.workers;
    co.layers = flags.layers;
    co.split = flags.split;
    co.tp = flags.tp;
    co.head_node = flags.head_node;  // --layout auto may leave the head out of the layout it chooses
    if (flags.layout == "auto") {
        if (flags.tp > 1 || !flags.layers.empty() || !flags.split.empty() || flags.head_layers > 0)
            return invalid_input(
                "--layout auto chooses the stages, layers and shares itself; drop --tp, --layers, --split "
                "and --head-layers");
        TD_TRY(choose_layout(*model, params, n_threads, co));
        if (co.workers.empty()) {  // the head's own node alone is the fastest: one machine, no cluster
            TD_ASSIGN_OR_RETURN(auto e, LocalEngine::create(std::move(model), params, pool));
            return std::unique_ptr<Engine>(std::move(e));
        }
    }
    if (!net::reduce_type_from_name(flags.tp_reduce, &co.tp_reduce))
        return invalid_input("--tp-reduce must be f32, f16 or bf16, got '{}'", flags.tp_reduce);
    if (flags.layout != "auto") co.layout = flags.layout;
    if (!net::wire_type_from_name(flags.wire, &co.wire))
        return invalid_input("--wire must be f32, f16 or q8_0, got '{}'", flags.wire);
    co.context = params;
    co.n_threads = n_threads;
    co.head_layers = flags.head_layers;
    co.head_threads = n_threads;
    co.chunk_rows = flags.chunk_rows;
    co.pack_dir = pack_dir(flags.no_repack);
    co.spares = flags.spares;
    co.replan = flags.replan;
    if (co.replan && !co.layers.empty())
        return invalid_input(
            "--replan places the layers itself after a loss; drop --layers (or use --spare)");
    TD_ASSIGN_OR_RETURN(auto e, cluster::ClusterEngine::create(std::move(model), co));
    return std::unique_ptr<Engine>(std::move(e));
}

Result<std::unique_ptr<cluster::LocalWorker>> start_head_node(int32_t n_threads,
                                                              const net::ClusterSecret &secret,
                                                              uint32_t transports) {
    cluster::WorkerOptions wo;
    wo.host = "127.0.0.1";
    wo.n_threads = n_threads;
    wo.secret = secret;
    wo.transports = transports;
    return cluster::LocalWorker::start(wo);
}

int engine_stages(const Engine &engine) {
    const auto *c = dynamic_cast<const cluster::ClusterEngine *>(&engine);
    return c == nullptr ? 1 : c->n_stages();
}

std::string engine_placement(const Engine &engine) {
    const auto *c = dynamic_cast<const cluster::ClusterEngine *>(&engine);
    if (c == nullptr) return "";
    std::string out;
    if (c->head_layers() > 0) out = fmt::format("head 0-{},", c->head_layers() - 1);
    // One entry per stage: its layers, and "xN" for a tensor-parallel group of N nodes.
    bool first = true;
    for (const auto &n : c->nodes()) {
        if (n.rank != 0) continue;
        out += fmt::format("{}{}-{}{}", first ? "" : ",", n.layers.first, n.layers.second - 1,
                           n.tp_size > 1 ? fmt::format("x{}", n.tp_size) : "");
        first = false;
    }
    return out;
}

int32_t engine_worker_threads(const Engine &engine) {
    const auto *c = dynamic_cast<const cluster::ClusterEngine *>(&engine);
    if (c == nullptr || c->nodes().empty()) return 0;
    return static_cast<int32_t>(c->nodes().front().hello.n_threads);
}

void print_cluster_stats(const ClusterFlags &flags, Engine &engine) {
    auto *c = dynamic_cast<cluster::ClusterEngine *>(&engine);
    if (!flags.stats || c == nullptr) return;
    auto st = c->stats();
    if (!st.ok()) {
        std::fprintf(stderr, "tandem: stats unavailable: %s\n", st.status().message().c_str());
        return;
    }
    std::fputs(c->format_stats(*st).c_str(), stderr);
}

}  // namespace td::cli
