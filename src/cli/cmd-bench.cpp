// tandem bench: prompt-processing and generation throughput, measured and reported the way llama.cpp's
// llama-bench does (same tests, same JSON/CSV fields), so the two are compared with one script.
//
// Every list option takes comma-separated values and the run covers their cross product, in llama-bench's
// order: model, kv type, threads, then tandem's --parallel, then the pp tests and the tg tests. With the
// cluster flags (--workers, --layers/--split, --head-layers, --wire) the same tests run through a pipeline
// of workers (-t: threads per worker) and the records say so in their `pipeline` field; everything else is
// reported exactly as for one machine. --parallel P runs P sequences together (see model/bench.h).
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/build-id.h"
#include "core/log.h"
#include "core/thread-pool.h"
#include "model/bench-report.h"
#include "model/bench.h"
#include "model/context.h"
#include "model/model.h"
#include "text/vocab.h"

namespace td::cli {
namespace {

struct BenchOptions {
    std::vector<std::string> models;
    std::string n_prompt = "512";
    std::string n_gen = "128";
    std::string n_depth = "0";
    std::string threads;  // empty: all hardware threads
    std::string kv_type = "f16";
    std::string cache_type_k, cache_type_v;  // -ctk, -ctv lists
    int32_t n_batch = 512;
    int32_t reps = 5;
    std::string output = "md";
    bool no_warmup = false;
    uint64_t seed = 1234;
    std::string parallel = "1";
    ClusterFlags cluster;
};

Result<std::vector<KvType>> parse_kv_types(const char *flag, const std::string &text) {
    std::vector<KvType> out;
    size_t start = 0;
    for (;;) {
        const size_t comma = text.find(',', start);
        auto t = kv_type_from_name(
            text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (!t.ok()) return invalid_input("{} (a comma-separated list): {}", flag, t.status().message());
        out.push_back(*t);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

// The K and V types to bench: with --cache-type-k or --cache-type-v, every K type with every V type (as
// llama-bench's -ctk and -ctv; the one not given is --kv-type's list); else each --kv-type for both.
Result<std::vector<std::pair<KvType, KvType>>> parse_kv_pairs(const BenchOptions &opt) {
    TD_ASSIGN_OR_RETURN(auto both, parse_kv_types("--kv-type", opt.kv_type));
    std::vector<std::pair<KvType, KvType>> out;
    if (opt.cache_type_k.empty() && opt.cache_type_v.empty()) {
        for (KvType t : both) out.emplace_back(t, t);
        return out;
    }
    auto ks = both, vs = both;
    if (!opt.cache_type_k.empty()) {
        TD_ASSIGN_OR_RETURN(ks, parse_kv_types("--cache-type-k", opt.cache_type_k));
    }
    if (!opt.cache_type_v.empty()) {
        TD_ASSIGN_OR_RETURN(vs, parse_kv_types("--cache-type-v", opt.cache_type_v));
    }
    for (KvType k : ks)
        for (KvType v : vs) out.emplace_back(k, v);
    return out;
}

struct Plan {
    std::vector<int32_t> n_prompt, n_gen, n_depth, threads, parallel;
    std::vector<std::pair<KvType, KvType>> kv_types;  // (K, V)
    // For each depth, the pp tests, then the tg tests (0 entries skipped, as in llama-bench).
    std::vector<BenchTest> tests;
};

Result<Plan> make_plan(const BenchOptions &opt) {
    Plan plan;
    TD_ASSIGN_OR_RETURN(plan.n_prompt, parse_int_list("-p/--n-prompt", opt.n_prompt, 0, 1 << 20));
    TD_ASSIGN_OR_RETURN(plan.n_gen, parse_int_list("-n/--n-gen", opt.n_gen, 0, 1 << 20));
    TD_ASSIGN_OR_RETURN(plan.n_depth, parse_int_list("-d/--n-depth", opt.n_depth, 0, 1 << 20));
    const int32_t n_hw = std::max(1, static_cast<int32_t>(std::thread::hardware_concurrency()));
    TD_ASSIGN_OR_RETURN(plan.parallel, parse_int_list("--parallel", opt.parallel, 1, 4096));
    if (opt.threads.empty()) {
        plan.threads = {opt.cluster.workers.empty() ? n_hw : 0};  // a cluster: each worker's own -t
    } else {
        TD_ASSIGN_OR_RETURN(plan.threads, parse_int_list("-t/--threads", opt.threads, 1, 4096));
    }
    TD_ASSIGN_OR_RETURN(plan.kv_types, parse_kv_pairs(opt));
    for (int32_t d : plan.n_depth) {
        for (int32_t p : plan.n_prompt)
            if (p > 0) plan.tests.push_back({.n_prompt = p, .n_depth = d});
        for (int32_t n : plan.n_gen)
            if (n > 0) plan.tests.push_back({.n_gen = n, .n_depth = d});
    }
    if (plan.tests.empty()) return invalid_input("nothing to run: every -p and -n value is 0");
    if (opt.output != "md" && opt.output != "json" && opt.output != "jsonl" && opt.output != "csv")
        return invalid_input("-o/--output takes md, json, jsonl or csv, got '{}'", opt.output);
    return plan;
}

// Runs every test of the plan on one model file, appending one record per test.
Status bench_model(const std::string &path, const BenchOptions &opt, const Plan &plan,
                   std::vector<BenchRecord> &records) {
    ModelLoadOptions mo;
    if (opt.cluster.workers.empty()) mo.pack_dir = pack_dir(opt.cluster.no_repack);
    TD_ASSIGN_OR_RETURN(auto model, Model::load(path, mo));
    TD_ASSIGN_OR_RETURN(Vocab vocab, Vocab::from_gguf(model->file()));
    const int32_t bos = vocab.add_bos() ? vocab.bos() : -1;
    const BenchModelInfo info = bench_model_info(model->file(), model->hparams().arch);

    BenchRecord base;
    base.build_commit = build_git_id();
    base.cpu_info = bench_cpu_info();
    base.model_filename = path;
    base.model_type = info.type;
    base.model_size = info.size_bytes;
    base.model_n_params = info.n_params;
    base.n_batch = opt.n_batch;
    base.n_ubatch = opt.n_batch;

    BenchRunParams rp;
    rp.n_batch = opt.n_batch;
    rp.reps = opt.reps;
    rp.warmup = !opt.no_warmup;
    rp.seed = opt.seed;

    int32_t max_tokens = 1;
    for (const BenchTest &test : plan.tests)
        max_tokens = std::max(max_tokens, test.n_depth + test.n_tokens());
    const bool cluster = !opt.cluster.workers.empty();
    for (const auto &[type_k, type_v] : plan.kv_types) {
        for (int32_t n_threads : plan.threads) {
            ThreadPool pool(cluster ? 1 : n_threads);
            for (int32_t n_par : plan.parallel) {
                // A cluster: one engine for all tests of this combination (connecting loads every stage).
                std::unique_ptr<Engine> engine;
                std::string pipeline;
                int32_t threads_used = pool.n_threads();
                if (cluster) {
                    ContextParams cp;
                    cp.n_ctx = max_tokens;
                    cp.n_seq = n_par;
                    cp.type_k = type_k;
                    cp.type_v = type_v;
                    TD_ASSIGN_OR_RETURN(engine, make_engine(opt.cluster, model, cp, pool, n_threads));
                    pipeline = fmt::format("{}-stage {} wire {}", engine_stages(*engine),
                                           engine_placement(*engine), opt.cluster.wire);
                    threads_used = n_threads > 0 ? n_threads : engine_worker_threads(*engine);
                }
                for (BenchTest test : plan.tests) {
                    test.n_parallel = n_par;
                    // Locally a context per test sized to it, as llama-bench makes one of n_depth + n_prompt
                    // + n_gen positions.
                    std::unique_ptr<Context> ctx;
                    BenchTarget target;
                    if (cluster) {
                        target = bench_target(*engine, bos, engine_stages(*engine));
                    } else {
                        ContextParams cp;
                        cp.n_ctx = test.n_depth + test.n_tokens();
                        cp.n_seq = n_par;
                        cp.type_k = type_k;
                        cp.type_v = type_v;
                        TD_ASSIGN_OR_RETURN(ctx, Context::create(model, cp, pool));
                        target = bench_target(*ctx, bos);
                    }
                    BenchRecord rec = base;
                    rec.n_threads = threads_used;
                    rec.type_k = kv_type_name(type_k);
                    rec.type_v = kv_type_name(type_v);
                    rec.n_prompt = test.n_prompt;
                    rec.n_gen = test.n_gen;
                    rec.n_depth = test.n_depth;
                    rec.n_parallel = n_par;
                    rec.pipeline = pipeline;
                    rec.test_time = bench_time_now();
                    TD_ASSIGN_OR_RETURN(rec.samples_ns, bench_run(target, test, rp));
                    rec.peak_rss_bytes = peak_rss_bytes();
                    std::fprintf(stderr, "tandem: bench %s %s x%d threads=%d kv=%s%s%s: %.2f ± %.2f t/s\n",
                                 path.c_str(), rec.test_name().c_str(), n_par, rec.n_threads,
                                 rec.type_k.c_str(), pipeline.empty() ? "" : " ", pipeline.c_str(),
                                 rec.avg_ts(), rec.stddev_ts());
                    records.push_back(std::move(rec));
                }
                if (engine) print_cluster_stats(opt.cluster, *engine);
            }
        }
    }
    return {};
}

int bench_main(const BenchOptions &opt) {
    auto plan = make_plan(opt);
    if (!plan.ok()) return fail(plan.status());
    std::vector<std::string> models = opt.models;
    if (models.empty()) {
        auto path = resolve_model("");
        if (!path.ok()) return fail(path.status());
        models.push_back(*path);
    }
    std::vector<BenchRecord> records;
    for (const std::string &path : models)
        if (Status s = bench_model(path, opt, *plan, records); !s.ok()) return fail(s);

    std::string out;
    if (opt.output == "json") {
        out = bench_format_json(records);
    } else if (opt.output == "jsonl") {
        out = bench_format_jsonl(records);
    } else if (opt.output == "csv") {
        out = bench_format_csv(records);
    } else {
        out = bench_format_markdown(records);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    return 0;
}

}  // namespace

void register_bench(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<BenchOptions>();
    CLI::App *cmd = app.add_subcommand(
        "bench", "Measure prompt (pp) and generation (tg) speed like llama-bench (table, JSON or CSV)");
    cmd->add_option("-m,--model", opt->models,
                    "GGUF model; repeat for several (default: stories260K, downloaded once if needed)");
    cmd->add_option("-p,--n-prompt", opt->n_prompt, "Prompt lengths, comma-separated (0: no pp test)")
        ->default_val("512");
    cmd->add_option("-n,--n-gen", opt->n_gen, "Generation lengths, comma-separated (0: no tg test)")
        ->default_val("128");
    cmd->add_option("-d,--n-depth", opt->n_depth,
                    "Context depths, comma-separated: positions filled (untimed) before each test")
        ->default_val("0");
    cmd->add_option("-t,--threads", opt->threads, "Thread counts, comma-separated (default: all cores)");
    cmd->add_option("-b,--batch-size", opt->n_batch, "Prompt tokens per forward pass")
        ->default_val(512)
        ->check(CLI::Range(1, 1 << 16));
    cmd->add_option("-r,--repetitions", opt->reps, "Timed repetitions per test")
        ->default_val(5)
        ->check(CLI::Range(1, 1000));
    cmd->add_option("-o,--output", opt->output, "Output format: md, json, jsonl or csv")->default_val("md");
    cmd->add_option(
           "--kv-type", opt->kv_type,
           "KV cache types of K and V, comma-separated: f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1")
        ->default_val("f16");
    cmd->add_option("--cache-type-k", opt->cache_type_k,
                    "K cache types, comma-separated (also -ctk): each is benched with each V type");
    cmd->add_option("--cache-type-v", opt->cache_type_v, "V cache types, comma-separated (also -ctv)");
    cmd->add_flag("--no-warmup", opt->no_warmup, "Skip the untimed warm-up run of each test");
    cmd->add_option("--seed", opt->seed, "Seed of the random prompt tokens")->default_val(1234);
    cmd->add_option("--parallel", opt->parallel,
                    "Sequences run together, comma-separated (t/s counts all their tokens)")
        ->default_val("1");
    add_cluster_flags(cmd, opt->cluster);
    runners.push_back([cmd, opt] {
        if (!cmd->parsed()) return -1;
        if (Status s = apply_discovery(opt->cluster.discover, opt->cluster.workers); !s.ok()) return fail(s);
        return bench_main(*opt);
    });
}

}  // namespace td::cli
