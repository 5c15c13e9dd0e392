#include "server/served-model.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "cluster/cluster-engine.h"
#include "cluster/node-info.h"
#include "core/log.h"
#include "server/openai.h"
#include "text/vocab.h"

namespace td::server {

namespace {
constexpr int32_t min_ctx_slot = 16;
}

Result<std::unique_ptr<ServedModel>> ServedModel::load(const ServeParams &params) {
    if (params.n_parallel < 1 || params.n_parallel > 256)
        return invalid_input("--parallel must be in [1, 256], got {}", params.n_parallel);
    if (params.n_ctx < 0) return invalid_input("--ctx-size must be >= 0, got {}", params.n_ctx);
    if (params.n_batch < 1) return invalid_input("--batch-size must be >= 1, got {}", params.n_batch);

    std::unique_ptr<ServedModel> sm(new ServedModel());
    TD_ASSIGN_OR_RETURN(sm->model_, Model::load(params.model_path, {0, -1, params.pack_dir}));
    TD_ASSIGN_OR_RETURN(Vocab vocab, Vocab::from_gguf(sm->model_->file()));
    TD_ASSIGN_OR_RETURN(sm->tokenizer_, Tokenizer::create(std::make_shared<const Vocab>(std::move(vocab))));
    TD_ASSIGN_OR_RETURN(sm->template_, ChatFormatter::for_model(sm->model_->file(), sm->tokenizer_->vocab(),
                                                                params.chat_template));
    sm->card_ = model_card(*sm->model_, sm->tokenizer_->vocab(), sm->template_);
    sm->n_layer_ = sm->model_->hparams().n_layer;
    sm->pooling_ = params.pooling != Pooling::unset                  ? params.pooling
                   : sm->model_->hparams().pooling != Pooling::unset ? sm->model_->hparams().pooling
                                                                     : Pooling::last;

    if (params.n_ctx_per_seq < 0) return invalid_input("--ctx-per-seq must be >= 0, got {}", params.n_ctx_per_seq);
    int32_t n_ctx_slot = sm->model_->hparams().n_ctx_train;
    if (params.n_ctx > 0) n_ctx_slot = std::min(n_ctx_slot, params.n_ctx);
    if (params.n_ctx_per_seq > 0) {
        if (params.n_ctx > 0 && params.n_ctx_per_seq > params.n_ctx)
            return invalid_input("--ctx-per-seq {} is more than the whole KV pool, --ctx-size {}",
                                 params.n_ctx_per_seq, params.n_ctx);
        n_ctx_slot = params.n_ctx_per_seq;
    }
    if (n_ctx_slot < min_ctx_slot)
        return invalid_input("{} positions per request are too few; at least {} are needed (--ctx-size, --ctx-per-seq)",
                             n_ctx_slot, min_ctx_slot);
    ContextParams cp;
    cp.n_ctx = n_ctx_slot;
    cp.n_seq = params.n_parallel;
    cp.type_k = params.type_k;
    cp.type_v = params.type_v;
    sm->pool_ = std::make_unique<ThreadPool>(params.n_threads);
    if (params.make_engine) {
        TD_ASSIGN_OR_RETURN(sm->engine_, params.make_engine(sm->model_, cp, *sm->pool_));
    } else {
        TD_ASSIGN_OR_RETURN(auto local, LocalEngine::create(sm->model_, cp, *sm->pool_));
        sm->engine_ = std::move(local);
    }
    auto *cluster = dynamic_cast<cluster::ClusterEngine *>(sm->engine_.get());
    if (params.wrap_engine) sm->engine_ = params.wrap_engine(std::move(sm->engine_));

    SchedulerParams sp;
    sp.n_batch = params.n_batch;
    sp.max_queue = params.max_queue >= 0 ? params.max_queue : 4 * params.n_parallel;
    sp.n_micro_batches = params.n_micro_batches > 0 ? params.n_micro_batches : 1;
    sp.probe_interval = std::chrono::milliseconds(std::max(params.probe_interval_ms, 10));
    sp.max_resumes = std::max(params.max_resumes, 0);
    sp.kv_pool = params.n_ctx;
    sp.draft = params.draft;
    if (!params.draft.model.empty() && params.draft.n_max > 0) {
        auto draft_model = Model::load(params.draft.model, {0, -1, params.pack_dir});
        if (!draft_model.ok()) return draft_model.status().with_context("--model-draft");
        auto drafter = ModelDrafter::create(std::move(draft_model).value(), *sm->model_, cp,
                                            params.draft.p_min, *sm->pool_);
        if (!drafter.ok()) return drafter.status().with_context("--model-draft");
        sm->drafter_ = std::move(drafter).value();
        sp.drafter = sm->drafter_.get();
    }
    if (cluster != nullptr) {
        sm->n_stages_ = cluster->n_stages();  // the workers, plus the head when it runs layers
        sm->placement_ = cluster->placement_table();
        // One micro-batch per stage keeps every stage busy: while the last stage computes group A, the
        // first computes group B.
        if (params.n_micro_batches <= 0) sp.n_micro_batches = sm->n_stages_;
        // The probe runs on the engine thread, the only one that may drive the ClusterEngine.
        sp.probe = [cluster, box = sm->status_](Engine &) -> Result<std::string> {
            TD_ASSIGN_OR_RETURN(cluster::ClusterStats st, cluster->stats());
            std::string status = cluster_status_json(*cluster, st);
            {
                std::lock_guard lock(box->mu);
                box->json = std::move(status);
            }
            return cluster_metrics(*cluster, st);
        };
        sp.describe = [cluster](Engine &) { return EngineInfo{cluster->layout(), cluster->recoveries()}; };
    }
    sm->scheduler_ = std::make_unique<Scheduler>(*sm->engine_, *sm->tokenizer_, sp);
    return sm;
}

ServedModel::~ServedModel() {
    if (scheduler_) scheduler_->stop();
}

ServerBackend ServedModel::backend() {
    ServerBackend be;
    be.scheduler = scheduler_.get();
    be.tokenizer = tokenizer_.get();
    be.chat = &template_;
    Scheduler *sched = scheduler_.get();
    be.engine_metrics = [sched] { return sched->engine_metrics(); };
    be.card = &card_;
    be.pooling = pooling_;
    if (n_stages_ > 0) {
        be.engine_status = [box = status_] {
            std::lock_guard lock(box->mu);
            return box->json;
        };
    } else {
        // One machine: this host is the only node and holds every layer.
        be.engine_status = [n_layer = n_layer_, threads = n_threads()] {
            const cluster::MemInfo mem = cluster::read_meminfo();
            char host[256] = {};
            gethostname(host, sizeof(host) - 1);
            nlohmann::json node = {{"address", "local"},
                                   {"name", host},
                                   {"stage", 0},
                                   {"rank", 0},
                                   {"tp_size", 1},
                                   {"layers", {0, n_layer - 1}},
                                   {"cpu", cluster::cpu_description()},
                                   {"threads", threads},
                                   {"mem_total", mem.total},
                                   {"mem_available", mem.available}};
            return json_dump({{"nodes", nlohmann::json::array({node})}, {"links", nlohmann::json::array()}});
        };
    }
    return be;
}

namespace {

// A Prometheus label value: backslash, quote and newline escaped.
std::string label(std::string_view v) {
    std::string out;
    for (char c : v) {
        if (c == '\\' || c == '"') out += '\\';
        if (c == '\n') {
            out += "\\n";
            continue;
        }
        out += c;
    }
    return out;
}

// The data ring's links, each with its sender's counters (summed over its destinations): head -> every rank
// of stage 1, each rank -> the next stage's ranks it feeds, the last stage's rank 0 -> head.
struct RingLink {
    std::string from, to;
    uint64_t msgs = 0, bytes = 0;
    double send_seconds = 0.0;
    double latency() const { return msgs > 0 ? send_seconds / static_cast<double>(msgs) : 0.0; }
};

std::vector<RingLink> cluster_links(const cluster::ClusterEngine &engine, const cluster::ClusterStats &st) {
    const auto &nodes = engine.nodes();
    const size_t n = std::min(nodes.size(), st.nodes.size());
    const auto joined = [](const std::vector<std::string> &v) {
        std::string s;
        for (const std::string &x : v) {
            if (!s.empty()) s += ',';
            s += x;
        }
        return s;
    };
    std::vector<RingLink> links;
    std::vector<std::string> first;
    for (size_t i = 0; i < n; ++i)
        if (nodes[i].stage == 0) first.push_back(nodes[i].address);
    if (n > 0)
        links.push_back({"head", joined(first), st.head_msgs_sent, st.head_bytes_sent, st.head_send_seconds});
    for (size_t i = 0; i < n; ++i)
        if (!nodes[i].next.empty())
            links.push_back({nodes[i].address, joined(nodes[i].next), st.nodes[i].msgs_out,
                             st.nodes[i].bytes_out, st.nodes[i].send_seconds});
    return links;
}

}  // namespace

std::string cluster_metrics(const cluster::ClusterEngine &engine, const cluster::ClusterStats &st) {
    const auto &nodes = engine.nodes();
    const size_t n = std::min(nodes.size(), st.nodes.size());
    std::string out;
    const auto family = [&](const char *name, const char *type, const char *help) {
        out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    };
    family("tandem_cluster_layout_info", "gauge",
           "The stages in use (workers and their layers), as a label.");
    out += fmt::format("tandem_cluster_layout_info{{layout=\"{}\"}} 1\n", label(engine.layout()));
    family("tandem_cluster_workers", "gauge", "Workers in use.");
    out += fmt::format("tandem_cluster_workers {}\n", nodes.size());
    family("tandem_cluster_spares", "gauge", "Stand-by workers (--spare, and lost workers once replaced).");
    out += fmt::format("tandem_cluster_spares {}\n", engine.spares().size());
    family("tandem_cluster_recoveries_total", "counter",
           "Lost workers replaced by a spare or re-planned around (see /health).");
    out += fmt::format("tandem_cluster_recoveries_total {}\n", engine.recoveries().size());
    const auto node_label = [&](size_t i) {
        return fmt::format("node=\"{}\",layers=\"{}-{}\"", label(nodes[i].address), nodes[i].layers.first,
                           nodes[i].layers.second - 1);
    };
    family("tandem_node_forward_steps_total", "counter",
           "Steps a worker computed since its stage was loaded.");
    for (size_t i = 0; i < n; ++i)
        out += fmt::format("tandem_node_forward_steps_total{{{}}} {}\n", node_label(i),
                           st.nodes[i].forward_steps);
    family("tandem_node_compute_seconds_total", "counter", "Time a worker spent computing its layers.");
    for (size_t i = 0; i < n; ++i)
        out += fmt::format("tandem_node_compute_seconds_total{{{}}} {}\n", node_label(i),
                           st.nodes[i].compute_seconds);
    family("tandem_node_step_latency_seconds", "gauge", "Mean compute time of one step on a worker.");
    for (size_t i = 0; i < n; ++i) {
        const auto &r = st.nodes[i];
        out +=
            fmt::format("tandem_node_step_latency_seconds{{{}}} {}\n", node_label(i),
                        r.forward_steps > 0 ? r.compute_seconds / static_cast<double>(r.forward_steps) : 0.0);
    }
    family("tandem_node_links_info", "gauge",
           "How a node's links travel (tcp or shm): its input, its outputs and its tensor-parallel peers.");
    for (size_t i = 0; i < n; ++i)
        out += fmt::format("tandem_node_links_info{{{},links=\"{}\"}} 1\n", node_label(i),
                           label(st.nodes[i].links));
    out += fmt::format("tandem_node_links_info{{node=\"head\",layers=\"-\",links=\"{}\"}} 1\n",
                       label(st.head_links));
    family("tandem_node_wait_seconds_total", "counter", "Time a worker sat idle waiting for input.");
    for (size_t i = 0; i < n; ++i)
        out +=
            fmt::format("tandem_node_wait_seconds_total{{{}}} {}\n", node_label(i), st.nodes[i].wait_seconds);

    // Tensor-parallel ranks: their collectives (two all-reduces per layer per step, one sampling merge).
    bool tp = false;
    for (size_t i = 0; i < n; ++i) tp = tp || nodes[i].tp_size > 1;
    if (tp) {
        const auto each_rank = [&](auto &&fn) {
            for (size_t i = 0; i < n; ++i)
                if (nodes[i].tp_size > 1) fn(i, st.nodes[i]);
        };
        family("tandem_node_tp_all_reduces_total", "counter", "All-reduces a tensor-parallel rank took part in.");
        each_rank([&](size_t i, const net::StatsReply &r) {
            out += fmt::format("tandem_node_tp_all_reduces_total{{{}}} {}\n", node_label(i), r.tp_all_reduces);
        });
        family("tandem_node_tp_all_reduces_per_step", "gauge", "All-reduces per step (2 per layer).");
        each_rank([&](size_t i, const net::StatsReply &r) {
            out += fmt::format("tandem_node_tp_all_reduces_per_step{{{}}} {}\n", node_label(i),
                               r.forward_steps > 0
                                   ? static_cast<double>(r.tp_all_reduces) / static_cast<double>(r.forward_steps)
                                   : 0.0);
        });
        family("tandem_node_tp_bytes_per_token", "gauge",
               "Bytes a rank sent to its peers per token returned by the cluster.");
        each_rank([&](size_t i, const net::StatsReply &r) {
            out += fmt::format("tandem_node_tp_bytes_per_token{{{}}} {}\n", node_label(i),
                               st.tokens > 0 ? static_cast<double>(r.tp_bytes_out) / static_cast<double>(st.tokens)
                                             : 0.0);
        });
        family("tandem_node_tp_collective_seconds_total", "counter",
               "Time a rank spent in collectives (sending its part, waiting for its peers').");
        each_rank([&](size_t i, const net::StatsReply &r) {
            out += fmt::format("tandem_node_tp_collective_seconds_total{{{}}} {}\n", node_label(i),
                               r.tp_wait_seconds);
        });
        family("tandem_node_tp_collective_latency_seconds", "gauge", "Mean time of one collective on a rank.");
        each_rank([&](size_t i, const net::StatsReply &r) {
            const uint64_t c = r.tp_all_reduces + r.tp_gathers;
            out += fmt::format("tandem_node_tp_collective_latency_seconds{{{}}} {}\n", node_label(i),
                               c > 0 ? r.tp_wait_seconds / static_cast<double>(c) : 0.0);
        });
    }

    const std::vector<RingLink> links = cluster_links(engine, st);
    const auto link_label = [&](const RingLink &l) {
        return fmt::format("from=\"{}\",to=\"{}\"", label(l.from), label(l.to));
    };
    family("tandem_link_messages_total", "counter", "Data messages sent over a pipeline link.");
    for (const RingLink &l : links)
        out += fmt::format("tandem_link_messages_total{{{}}} {}\n", link_label(l), l.msgs);
    family("tandem_link_bytes_total", "counter", "Bytes sent over a pipeline link.");
    for (const RingLink &l : links)
        out += fmt::format("tandem_link_bytes_total{{{}}} {}\n", link_label(l), l.bytes);
    family("tandem_link_send_seconds_total", "counter", "Time the sender was blocked writing to a link.");
    for (const RingLink &l : links)
        out += fmt::format("tandem_link_send_seconds_total{{{}}} {}\n", link_label(l), l.send_seconds);
    family("tandem_link_send_latency_seconds", "gauge", "Mean time one message blocked its sender.");
    for (const RingLink &l : links)
        out += fmt::format("tandem_link_send_latency_seconds{{{}}} {}\n", link_label(l), l.latency());
    return out;
}

std::string cluster_status_json(const cluster::ClusterEngine &engine, const cluster::ClusterStats &st) {
    using nlohmann::json;
    const auto &nodes = engine.nodes();
    const size_t n = std::min(nodes.size(), st.nodes.size());
    json out_nodes = json::array();
    for (size_t i = 0; i < n; ++i) {
        const cluster::NodeStatus &ns = nodes[i];
        const net::StatsReply &r = st.nodes[i];
        json node = {{"address", ns.address},
                     {"name", ns.hello.node_name},
                     {"stage", ns.stage},
                     {"rank", ns.rank},
                     {"tp_size", ns.tp_size},
                     {"layers", {ns.layers.first, ns.layers.second - 1}},
                     {"cpu", ns.hello.cpu},
                     {"threads", ns.hello.n_threads},
                     {"mem_total", ns.hello.mem_total},
                     {"mem_available", ns.hello.mem_available},
                     {"gflops", ns.hello.gflops},
                     {"weight_bytes", ns.ready.weight_bytes},
                     {"kv_bytes", ns.ready.kv_bytes},
                     {"source", ns.source},
                     {"links", r.links},
                     {"forward_steps", r.forward_steps},
                     {"compute_seconds", r.compute_seconds},
                     {"wait_seconds", r.wait_seconds},
                     {"step_latency_seconds",
                      r.forward_steps > 0 ? r.compute_seconds / static_cast<double>(r.forward_steps) : 0.0},
                     {"bytes_in", r.bytes_in},
                     {"bytes_out", r.bytes_out}};
        if (ns.tp_size > 1) {
            node["tp_all_reduces"] = r.tp_all_reduces;
            node["tp_bytes_out"] = r.tp_bytes_out;
            node["tp_wait_seconds"] = r.tp_wait_seconds;
        }
        out_nodes.push_back(std::move(node));
    }
    json links = json::array();
    for (const RingLink &l : cluster_links(engine, st))
        links.push_back({{"from", l.from},
                         {"to", l.to},
                         {"messages", l.msgs},
                         {"bytes", l.bytes},
                         {"send_seconds", l.send_seconds},
                         {"send_latency_seconds", l.latency()}});
    // json_dump: a node's name or CPU string that is not UTF-8 is replaced, not thrown on.
    return json_dump({{"nodes", std::move(out_nodes)},
                      {"links", std::move(links)},
                      {"head_links", st.head_links},
                      {"spares", engine.spares()}});
}

}  // namespace td::server
