// tandem embed: the embeddings of texts (llama.cpp's llama-embedding), on this machine or, with --workers,
// through a cluster. The texts run as the server's embedding jobs (server/scheduler.h), so they are pooled
// and normalized exactly as /v1/embeddings and /embedding answer them.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "server/embeddings.h"
#include "server/served-model.h"

namespace td::cli {
namespace {

struct EmbedOptions {
    std::string model;
    std::vector<std::string> prompts;
    std::string file;
    std::string pooling;  // "" = the model's
    int normalize = 2;    // llama.cpp's embd_normalize
    int32_t n_threads = 0;
    int32_t n_parallel = 4;
    std::string format = "json";
    ClusterFlags cluster;
};

int embed_main(const EmbedOptions &opt) {
    std::vector<std::string> texts = opt.prompts;
    if (!opt.file.empty()) {
        std::ifstream in(opt.file);
        if (!in) return fail(make_error(ErrorKind::io, "cannot read {}", opt.file));
        for (std::string line; std::getline(in, line);)
            if (!line.empty()) texts.push_back(line);
    }
    if (texts.empty()) return fail(invalid_input("nothing to embed: give -p TEXT or --file FILE"));
    if (opt.format != "json" && opt.format != "text")
        return fail(invalid_input("--format must be json or text, got '{}'", opt.format));
    auto path = resolve_model(opt.model);
    if (!path.ok()) return fail(path.status());

    const bool is_cluster = !opt.cluster.workers.empty();
    server::ServeParams sp;
    sp.model_path = *path;
    if (!is_cluster) sp.pack_dir = pack_dir(opt.cluster.no_repack);
    sp.n_parallel = std::max(opt.n_parallel, 1);
    sp.n_threads = is_cluster ? 1 : opt.n_threads;
    sp.max_queue = static_cast<int32_t>(texts.size());
    sp.make_engine = [&opt](std::shared_ptr<const Model> model, const ContextParams &cp, ThreadPool &pool) {
        return make_engine(opt.cluster, std::move(model), cp, pool, opt.n_threads);
    };
    if (!opt.pooling.empty()) {
        auto pooling = parse_pooling(opt.pooling);
        if (!pooling.ok()) return fail(pooling.status().with_context("--pooling"));
        sp.pooling = *pooling;
    }
    auto model = server::ServedModel::load(sp);
    if (!model.ok()) return fail(model.status());
    const Pooling pooling = (*model)->pooling();

    std::vector<server::GenerationJob> jobs(texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
        jobs[i].prompt = (*model)->tokenizer().encode(texts[i], /*add_special=*/true, /*parse_special=*/true);
        jobs[i].embed = pooling;
    }
    auto streams = (*model)->scheduler().submit_all(std::move(jobs));
    if (!streams.ok()) return fail(streams.status());
    nlohmann::json data = nlohmann::json::array();
    for (size_t i = 0; i < streams->size(); ++i) {
        server::StreamEvent ev;
        while (!(*streams)[i]->next(ev, std::chrono::milliseconds(1000)) ||
               ev.kind == server::StreamEvent::Kind::delta) {
        }
        if (ev.kind == server::StreamEvent::Kind::error)
            return fail(ev.error.with_context(fmt::format("input {}", i)));
        // One vector per input, or with --pooling none one per token (llama.cpp normalizes only pooled ones).
        const size_t n = pooling == Pooling::none ? static_cast<size_t>(std::max(ev.n_prompt, 1)) : 1;
        const size_t width = ev.embedding.size() / n;
        for (size_t t = 0; t < n; ++t) {
            std::vector<float> v(ev.embedding.begin() + t * width, ev.embedding.begin() + (t + 1) * width);
            if (pooling != Pooling::none) server::normalize_embedding(v, opt.normalize);
            if (opt.format == "text") {
                std::string line = pooling == Pooling::none ? fmt::format("embedding {} token {}:", i, t)
                                                            : fmt::format("embedding {}:", i);
                for (float x : v) line += fmt::format(" {:.6f}", x);
                std::printf("%s\n", line.c_str());
            } else {
                data.push_back(
                    {{"object", "embedding"}, {"index", data.size()}, {"embedding", std::move(v)}});
            }
        }
    }
    if (opt.format == "json")
        std::printf("%s\n", nlohmann::json({{"object", "list"}, {"data", data}}).dump().c_str());
    (*model)->scheduler().stop();
    print_cluster_stats(opt.cluster, (*model)->engine());
    return 0;
}

}  // namespace

void register_embed(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<EmbedOptions>();
    CLI::App *cmd = app.add_subcommand(
        "embed", "Print the embeddings of texts (JSON as /v1/embeddings answers, or one line each)");
    cmd->add_option("-m,--model", opt->model, "GGUF model (default: the Quick start's model)");
    cmd->add_option("-p,--prompt", opt->prompts, "A text to embed (repeat for several)");
    cmd->add_option("--file", opt->file, "Embed each non-empty line of this file");
    cmd->add_option(
        "--pooling", opt->pooling,
        "mean, cls, last or none (one vector per token) (default: the model's pooling_type, else last)");
    cmd->add_option(
           "--normalize", opt->normalize,
           "llama.cpp's embd_normalize: -1 none, 0 int16 range, 1 taxicab, 2 euclidean, p > 2 p-norm")
        ->default_val(2);
    cmd->add_option("--format", opt->format, "json or text")->default_val("json");
    cmd->add_option("-t,--threads", opt->n_threads,
                    "Compute threads (0: all cores; per worker with --workers)")
        ->default_val(0);
    cmd->add_option("--parallel", opt->n_parallel, "Texts computed together")->default_val(4);
    add_cluster_flags(cmd, opt->cluster);
    runners.push_back([cmd, opt] {
        if (!cmd->parsed()) return -1;
        if (Status s = apply_discovery(opt->cluster.discover, opt->cluster.workers); !s.ok()) return fail(s);
        return embed_main(*opt);
    });
}

}  // namespace td::cli
