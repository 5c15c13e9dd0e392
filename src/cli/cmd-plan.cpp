// tandem plan: will this cluster help, and how should it be laid out? Measures every worker and link (or
// reads a described cluster), predicts generation and prompt tokens/s of every layout with the cost model
// (cluster/cost-model.h), and recommends one with the flags that run it.
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "cluster/placement.h"
#include "cluster/planner.h"
#include "cluster/worker.h"

namespace td::cli {
namespace {

struct PlanCliOptions {
    std::string model;
    std::string workers;
    bool head_node = false;  // measure this machine as the head's own node too
    DiscoverFlags discover;  // --discover: find the workers to measure
    std::string offline;
    std::string shape;
    std::string type = "q4_k_m";
    std::string batches = "1,4,16";
    std::string svg;
    bool json = false;
    int32_t n_threads = 0;
    int32_t n_prompt = 512;
    int32_t n_gen = 128;
    int probe_ms = 20;
    bool no_contention = false;
    bool measure_each = false;
    std::string secret_file;
    std::string transport = "auto";
    KvTypeFlags kv_type;  // the KV cache's memory per position
};

// Shapes of well-known models, for planning without a file.
const std::map<std::string, std::string> &shape_presets() {
    static const std::map<std::string, std::string> p = {
        {"llama-1b", "dim=2048,layers=16,heads=32,kv-heads=8,ffn=8192,vocab=128256"},
        {"llama-8b", "dim=4096,layers=32,heads=32,kv-heads=8,ffn=14336,vocab=128256"},
        {"llama-70b", "dim=8192,layers=80,heads=64,kv-heads=8,ffn=28672,vocab=128256"},
        {"qwen2.5-32b", "arch=qwen2,dim=5120,layers=64,heads=40,kv-heads=8,ffn=27648,vocab=152064"},
    };
    return p;
}

Result<cluster::ModelShape> shape_from_spec(const std::string &spec_in, const std::string &type) {
    std::string spec = spec_in;
    if (auto it = shape_presets().find(spec); it != shape_presets().end()) spec = it->second;
    SynthParams p;
    TD_TRY(synth_parse_type(type, p).with_context("--type"));
    int32_t n_vocab = 32000;
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const size_t eq = item.find('=');
        if (eq == std::string::npos)
            return invalid_input(
                "--shape: '{}' is not key=value (or a preset: llama-1b, llama-8b, llama-70b, "
                "qwen2.5-32b)",
                item);
        const std::string k = item.substr(0, eq), v = item.substr(eq + 1);
        if (k == "arch") {
            p.arch = v;
            continue;
        }
        int32_t n = 0;
        auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (ec != std::errc() || end != v.data() + v.size() || n <= 0)
            return invalid_input("--shape: {} must be a positive whole number, got '{}'", k, v);
        if (k == "dim")
            p.n_embd = n;
        else if (k == "layers")
            p.n_layer = n;
        else if (k == "heads")
            p.n_head = n;
        else if (k == "kv-heads")
            p.n_head_kv = n;
        else if (k == "head-dim")
            p.head_dim = n;
        else if (k == "ffn")
            p.n_ff = n;
        else if (k == "vocab")
            n_vocab = n;
        else
            return invalid_input(
                "--shape: unknown key '{}' (arch, dim, layers, heads, kv-heads, head-dim, ffn, vocab)", k);
    }
    return cluster::model_shape_from_synth(p, n_vocab);
}

int plan_main(const PlanCliOptions &opt) {
    cluster::PlanOptions po;
    auto batches = parse_int_list("--batch", opt.batches, 1, 4096);
    if (!batches.ok()) return fail(batches.status());
    po.batches = std::move(batches).value();
    std::sort(po.batches.begin(), po.batches.end());
    po.n_threads = opt.n_threads;
    po.probe_ms = opt.probe_ms;
    po.contention = !opt.no_contention;
    po.pool_kinds = !opt.measure_each;
    if (std::string error; !net::transports_from_name(opt.transport, &po.transports, &error))
        return fail(invalid_input("{}", error));
    po.predict.n_prompt = opt.n_prompt;
    po.predict.n_gen = opt.n_gen;
    KvType type_k = KvType::f16, type_v = KvType::f16;
    if (Status s = parse_kv_type_flags(opt.kv_type, type_k, type_v); !s.ok()) return fail(s);
    po.predict.kv_bytes = kv_bytes_per_value(type_k, type_v);

    Result<cluster::ModelShape> shape =
        invalid_input("give a model (-m MODEL) or a shape (--shape ... --type ...)");
    if (!opt.model.empty()) {
        auto path = resolve_model(opt.model);
        if (!path.ok()) return fail(path.status());
        auto f = gguf::File::open(*path);
        if (!f.ok()) return fail(f.status());
        shape = cluster::model_shape_from_file(*f);
        if (!shape.ok()) return fail(shape.status().with_context(*path));
    } else if (!opt.shape.empty()) {
        shape = shape_from_spec(opt.shape, opt.type);
    }
    if (!shape.ok()) return fail(shape.status());

    Result<cluster::ClusterSpec> spec = invalid_input("give --workers to measure, or --offline cluster.json");
    if (!opt.offline.empty()) {
        std::ifstream in(opt.offline);
        if (!in) return fail(make_error(ErrorKind::io, "{}: cannot read", opt.offline));
        std::stringstream text;
        text << in.rdbuf();
        spec = cluster::cluster_from_json(text.str());
        if (!spec.ok()) return fail(spec.status().with_context(opt.offline));
    } else if (!opt.workers.empty() || opt.head_node) {
        std::vector<std::string> list;
        if (!opt.workers.empty()) {
            auto l = cluster::parse_worker_list(opt.workers);
            if (!l.ok()) return fail(l.status());
            list = std::move(l).value();
        }
        auto secret = load_cluster_secret(opt.secret_file);
        if (!secret.ok()) return fail(secret.status());
        std::unique_ptr<cluster::LocalWorker> head;  // measured as the first node, like the engine runs it
        if (opt.head_node) {
            auto h = start_head_node(opt.n_threads, *secret, po.transports);
            if (!h.ok()) return fail(h.status());
            head = std::move(h).value();
            list.insert(list.begin(), head->address());
            po.head_node = true;
        }
        spec = cluster::measure_cluster(list, *shape, po, *secret, [&](const std::string &s) {
            if (!opt.json) std::fprintf(stderr, "tandem plan: %s\n", s.c_str());
        });
    }
    if (!spec.ok()) return fail(spec.status());
    const cluster::Plan plan = cluster::make_plan(*shape, *spec, po);
    if (!opt.svg.empty()) {
        std::ofstream out(opt.svg);
        out << cluster::plan_svg(plan);
        if (!out) return fail(make_error(ErrorKind::io, "{}: cannot write", opt.svg));
    }
    const std::string text = opt.json ? cluster::plan_json(plan) : cluster::plan_text(plan);
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (opt.json) std::printf("\n");
    return 0;
}

}  // namespace

void register_plan(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<PlanCliOptions>();
    CLI::App *cmd = app.add_subcommand(
        "plan",
        "Predict every layout of a model over measured workers (or a described cluster) and recommend one");
    cmd->add_option("-m,--model", opt->model, "GGUF model (only its header is read)");
    cmd->add_option("--workers", opt->workers, "Workers to measure: HOST:PORT,...");
    cmd->add_flag("--head-node", opt->head_node,
                  "Measure this machine too, as the head's own node (the first of every layout it is in; "
                  "run it with --head-node)");
    add_discover_flags(cmd, opt->discover);
    cmd->add_option("--offline", opt->offline,
                    "A described cluster (JSON; examples in docs/clusters/) instead");
    cmd->add_option(
        "--shape", opt->shape,
        "A model by shape instead of a file: dim=,layers=,heads=,kv-heads=,ffn=,vocab= (or llama-1b, "
        "llama-8b, llama-70b, qwen2.5-32b)");
    cmd->add_option("--type", opt->type, "Weight type of --shape (as tandem synth: q4_0, q8_0, q4_k_m ...)")
        ->default_val("q4_k_m");
    cmd->add_option("--batch", opt->batches, "Batch sizes (sequences decoding at once)")
        ->default_val("1,4,16");
    cmd->add_option("--svg", opt->svg, "Also draw predicted tokens/s against batch size into this SVG file");
    cmd->add_flag("--json", opt->json, "Print JSON");
    cmd->add_option("-t,--threads", opt->n_threads, "Threads per worker (0: each worker's own)")
        ->default_val(0);
    cmd->add_option("-p,--n-prompt", opt->n_prompt, "Prompt tokens per sequence, as bench's pp")
        ->default_val(512);
    cmd->add_option("-n,--n-gen", opt->n_gen, "Generated tokens per sequence, as bench's tg")
        ->default_val(128);
    add_kv_type_flags(cmd, opt->kv_type);
    cmd->add_option("--probe-ms", opt->probe_ms, "Time per measured matmul point")
        ->default_val(20)
        ->check(CLI::Range(1, 2000));
    cmd->add_flag("--no-contention", opt->no_contention, "Do not measure nodes of one host together");
    cmd->add_flag(
        "--measure-each", opt->measure_each,
        "Keep each node's own figures where nodes of one host with the same threads would be pooled "
        "(hosts whose cores differ: performance and efficiency cores)");
    cmd->add_option(
           "--transport", opt->transport,
           "Transports the measured links may take, as the run's --transport: auto (shared memory between "
           "nodes of one host, UCX over RDMA), tcp, shm, ucx")
        ->default_val("auto");
    add_secret_flag(cmd, opt->secret_file);
    runners.push_back([cmd, opt] {
        if (!cmd->parsed()) return -1;
        if (Status s = apply_discovery(opt->discover, opt->workers); !s.ok()) return fail(s);
        return plan_main(*opt);
    });
}

}  // namespace td::cli
