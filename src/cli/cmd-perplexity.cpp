// tandem perplexity: a model's perplexity over a text, as llama.cpp's llama-perplexity measures it (chunks of
// -c tokens, the second half of each scored), on this machine or through a cluster (model/perplexity.h).
// What people run to see what a quantization, a KV cache type or a layout costs in quality.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/thread-pool.h"
#include "model/engine.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace td::cli {
namespace {

struct PerplexityOptions {
    std::string model;
    std::string file;
    std::string text;
    int32_t n_ctx = 512;
    int32_t n_batch = 2048;
    int32_t n_chunks = -1;
    int32_t n_parallel = 0;  // 0: n_batch / n_ctx, as llama-perplexity
    int32_t n_threads = 0;
    bool json = false;
    KvTypeFlags kv_type;
    ClusterFlags cluster;
};

int perplexity_main(const PerplexityOptions &opt) {
    if (opt.file.empty() == opt.text.empty())
        return fail(invalid_input("give the text with -f FILE or -p TEXT"));
    std::string text = opt.text;
    if (!opt.file.empty()) {
        std::ifstream in(opt.file, std::ios::binary);
        if (!in) return fail(make_error(ErrorKind::not_found, "{}: cannot read the file", opt.file));
        std::stringstream ss;
        ss << in.rdbuf();
        text = ss.str();
    }
    auto path = resolve_model(opt.model);
    if (!path.ok()) return fail(path.status());
    ModelLoadOptions mo;
    if (opt.cluster.workers.empty()) mo.pack_dir = pack_dir(opt.cluster.no_repack);
    auto model = Model::load(*path, mo);
    if (!model.ok()) return fail(model.status());
    auto vocab_r = Vocab::from_gguf((*model)->file());
    if (!vocab_r.ok()) return fail(vocab_r.status());
    auto vocab = std::make_shared<const Vocab>(std::move(vocab_r).value());
    auto tokenizer = Tokenizer::create(vocab);
    if (!tokenizer.ok()) return fail(tokenizer.status());
    // As llama-perplexity: BOS where the vocabulary adds one, special-token text taken as text.
    const std::vector<int32_t> tokens = (*tokenizer)->encode(text, vocab->add_bos(), /*parse_special=*/false);

    PerplexityParams pp;
    pp.n_ctx = opt.n_ctx;
    pp.n_batch = opt.n_batch;
    pp.n_chunks = opt.n_chunks;
    pp.bos = vocab->add_bos() ? vocab->bos() : -1;
    ContextParams cp;
    cp.n_ctx = opt.n_ctx;
    cp.n_seq = opt.n_parallel > 0 ? opt.n_parallel : std::max(1, opt.n_batch / std::max(opt.n_ctx, 1));
    if (Status s = parse_kv_type_flags(opt.kv_type, cp.type_k, cp.type_v); !s.ok()) return fail(s);
    ThreadPool pool(opt.cluster.workers.empty() ? opt.n_threads : 1);
    auto engine = make_engine(opt.cluster, *model, cp, pool, opt.n_threads);
    if (!engine.ok()) return fail(engine.status());

    const int64_t n_whole = opt.n_ctx > 0 ? static_cast<int64_t>(tokens.size()) / opt.n_ctx : 0;
    const int64_t n_chunks = opt.n_chunks > 0 ? std::min<int64_t>(n_whole, opt.n_chunks) : n_whole;
    const std::string placement = engine_placement(**engine);
    if (n_chunks > 0)
        std::fprintf(
            stderr,
            "tandem: perplexity over %lld chunks of %d tokens (the text is %zu tokens), %d scored per chunk, "
            "%d chunks side by side%s%s\n",
            static_cast<long long>(n_chunks), opt.n_ctx, tokens.size(), opt.n_ctx - 1 - opt.n_ctx / 2,
            std::min<int32_t>((*engine)->n_seq(), static_cast<int32_t>(std::max<int64_t>(n_chunks, 1))),
            placement.empty() ? "" : ", layers ", placement.c_str());

    std::vector<double> running;
    const auto t0 = std::chrono::steady_clock::now();
    auto result = perplexity(**engine, tokens, pp, [&](int32_t chunk, const PerplexityResult &so_far) {
        running.push_back(so_far.ppl());
        if (!opt.json) {
            std::printf("[%d]%.4f,", chunk + 1, so_far.ppl());
            std::fflush(stdout);
        }
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!opt.json && !running.empty()) std::printf("\n");
    if (!result.ok()) return fail(result.status());
    const int64_t n_computed = static_cast<int64_t>(result->n_chunks) * (opt.n_ctx - 1);
    const double tps = seconds > 0 ? static_cast<double>(n_computed) / seconds : 0.0;
    if (opt.json) {
        nlohmann::json j = {{"ppl", result->ppl()},
                            {"ppl_error", result->ppl_error()},
                            {"mean_nll", result->nll_sum / static_cast<double>(result->n_scored)},
                            {"chunks", result->n_chunks},
                            {"n_ctx", opt.n_ctx},
                            {"tokens", tokens.size()},
                            {"scored", result->n_scored},
                            {"chunk_ppl", running},
                            {"seconds", seconds},
                            {"tokens_per_second", tps}};
        std::printf("%s\n", j.dump().c_str());
    } else {
        std::printf("Final estimate: PPL = %.4f +/- %.5f\n", result->ppl(), result->ppl_error());
    }
    std::fprintf(stderr, "tandem: %lld tokens computed in %.2f s, %.2f tokens/s\n",
                 static_cast<long long>(n_computed), seconds, tps);
    print_cluster_stats(opt.cluster, **engine);
    return 0;
}

}  // namespace

void register_perplexity(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<PerplexityOptions>();
    CLI::App *cmd = app.add_subcommand(
        "perplexity",
        "A model's perplexity over a text, as llama-perplexity measures it (chunks of -c tokens)");
    cmd->add_option("-m,--model", opt->model, "GGUF model (default: the Quick start's model)");
    cmd->add_option("-f,--file", opt->file, "The text to score");
    cmd->add_option("-p,--prompt", opt->text, "The text to score, given inline");
    cmd->add_option("-c,--ctx-size", opt->n_ctx, "Tokens per chunk; the second half of each is scored")
        ->default_val(512)
        ->check(CLI::Range(4, 1 << 20));
    cmd->add_option("-b,--batch-size", opt->n_batch, "Rows per forward pass")
        ->default_val(2048)
        ->check(CLI::Range(1, 1 << 16));
    cmd->add_option("--chunks", opt->n_chunks, "Score at most this many chunks (-1: all)")->default_val(-1);
    cmd->add_option("--parallel", opt->n_parallel,
                    "Chunks computed side by side (0: batch size / chunk size)")
        ->default_val(0)
        ->check(CLI::Range(0, 256));
    cmd->add_option("-t,--threads", opt->n_threads, "Threads (0: all cores; per worker with --workers)")
        ->default_val(0);
    cmd->add_flag("--json", opt->json, "Print one JSON object (ppl, ppl_error, chunk_ppl, ...) instead");
    add_kv_type_flags(cmd, opt->kv_type);
    add_cluster_flags(cmd, opt->cluster);
    runners.push_back([cmd, opt] {
        if (!cmd->parsed()) return -1;
        if (Status s = apply_discovery(opt->cluster.discover, opt->cluster.workers); !s.ok()) return fail(s);
        return perplexity_main(*opt);
    });
}

}  // namespace td::cli
