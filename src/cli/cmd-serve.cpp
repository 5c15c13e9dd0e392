// tandem serve: an OpenAI-compatible HTTP server with continuous batching (see src/server/), on this machine
// or, with --workers, through a pipeline of `tandem worker`s (the same cluster flags as `tandem run`).
//
// The socket is bound first and "tandem serve listening on http://HOST:PORT" goes to stderr; /health
// answers 503 {"status":"loading"} until the model is loaded, then 200. SIGINT/SIGTERM stop the server.
#include <fmt/format.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>

#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "server/http.h"
#include "server/served-model.h"

namespace td::cli {
namespace {

struct ServeOptions {
    std::string model;
    std::string host = "127.0.0.1";
    int port = 8080;
    int32_t n_parallel = 4;
    int32_t n_ctx = 0;
    int32_t n_ctx_per_seq = 0;
    int32_t n_threads = 0;
    int32_t n_batch = 512;
    int32_t max_queue = -1;
    int http_threads = 0;
    int max_per_client = 0;
    bool no_webui = false;
    bool spm_infill = false;
    bool no_slots = false;
    int32_t max_resumes = 0;
    std::string api_key;
    std::string api_key_file;
    std::string ssl_cert, ssl_key;
    std::string alias;
    KvTypeFlags kv_type;  // --kv-type, --cache-type-k, --cache-type-v
    std::string chat_template;
    std::string pooling;   // "" = the model's
    ClusterFlags cluster;  // --workers etc.: serve through a pipeline of workers
    int32_t n_micro_batches = 0;
    DraftParams draft;
    int timeout_s = 600;
};

int serve_main(const ServeOptions &opt) {
#if defined(__GLIBC__)
    // glibc gives each thread that allocates under contention an arena of its own, up to 8 per core, and
    // what an arena once held stays resident: the HTTP handler threads (dozens, each busy now and then)
    // made the server's RSS step up by ~0.8 MiB at random minutes of a soak. Two arenas serve a server whose
    // compute allocates nothing per step. A fixed mmap threshold keeps large buffers (request bodies, long
    // prompts) out of the heaps: glibc otherwise raises it after each large free, and the next large
    // buffers then stay resident in the heap as a high-water mark.
    mallopt(M_ARENA_MAX, 2);
    mallopt(M_MMAP_THRESHOLD, 128 << 10);
#endif
    const bool is_cluster = !opt.cluster.workers.empty();
    auto path = resolve_model(opt.model);
    if (!path.ok()) return fail(path.status());

    server::ServeParams sp;
    sp.model_path = *path;
    if (!is_cluster) sp.pack_dir = pack_dir(opt.cluster.no_repack);
    sp.n_parallel = opt.n_parallel;
    sp.n_ctx = opt.n_ctx;
    sp.n_ctx_per_seq = opt.n_ctx_per_seq;
    // A cluster head computes nothing but a draft model's guesses: without one, its pool has one thread and
    // -t goes to the workers.
    sp.n_threads = is_cluster && opt.draft.model.empty() ? 1 : opt.n_threads;
    sp.n_micro_batches = opt.n_micro_batches;
    sp.max_resumes = opt.max_resumes;
    sp.draft = opt.draft;
    if (opt.n_micro_batches < 0) return fail(invalid_input("--micro-batches must be >= 0"));
    sp.make_engine = [&opt](std::shared_ptr<const Model> model, const ContextParams &cp, ThreadPool &pool) {
        return make_engine(opt.cluster, std::move(model), cp, pool, opt.n_threads);
    };
    sp.n_batch = opt.n_batch;
    sp.max_queue = opt.max_queue;
    sp.chat_template = opt.chat_template;
    if (!opt.pooling.empty()) {
        auto pooling = parse_pooling(opt.pooling);
        if (!pooling.ok()) return fail(pooling.status().with_context("--pooling"));
        sp.pooling = *pooling;
    }
    if (Status s = parse_kv_type_flags(opt.kv_type, sp.type_k, sp.type_v); !s.ok()) return fail(s);
    const int32_t max_queue = opt.max_queue >= 0 ? opt.max_queue : 4 * opt.n_parallel;

    server::HttpParams hp;
    hp.host = opt.host;
    hp.port = opt.port;
    hp.api_key = opt.api_key;
    if (!opt.api_key_file.empty()) {
        if (!opt.api_key.empty()) return fail(invalid_input("give --api-key or --api-key-file, not both"));
        auto key = read_api_key_file(opt.api_key_file);
        if (!key.ok()) return fail(key.status());
        hp.api_key = *key;
    }
    hp.max_per_client = opt.max_per_client;
    hp.web_ui = !opt.no_webui;
    hp.slots = !opt.no_slots;
    hp.spm_infill = opt.spm_infill;
    hp.ssl_cert = opt.ssl_cert;
    hp.ssl_key = opt.ssl_key;
    hp.model_id = opt.alias.empty() ? std::filesystem::path(*path).stem().string() : opt.alias;
    hp.limits.write_timeout_ms = opt.timeout_s * 1000;
    // One handler thread per running or waiting request, plus some for /health and /metrics; slow and idle
    // connections wait in the event loop without one.
    hp.limits.n_threads = opt.http_threads > 0 ? opt.http_threads : opt.n_parallel + max_queue + 8;
    hp.limits.max_pending = std::max(64, 2 * (opt.n_parallel + max_queue));

    // SIGINT/SIGTERM go to one thread that stops the server; every other thread blocks them.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    server::HttpServer http(hp);
    auto port = http.bind();
    if (!port.ok()) return fail(port.status());
    std::fprintf(stderr, "tandem serve listening on %s://%s:%d\n", opt.ssl_cert.empty() ? "http" : "https",
                 opt.host.c_str(), *port);
    std::fflush(stderr);

    Status served;
    std::thread listener([&] { served = http.listen(); });
    std::thread signals([&] {
        int sig = 0;
        sigwait(&sigs, &sig);
        if (sig == SIGINT || sig == SIGTERM) http.stop();
    });

    auto model = server::ServedModel::load(sp);
    if (!model.ok()) {
        http.stop();
        listener.join();
        pthread_kill(signals.native_handle(), SIGTERM);
        signals.join();
        return fail(model.status());
    }
    http.set_backend((*model)->backend());
    const std::string where = is_cluster
                                  ? fmt::format("{} pipeline stages, {} micro-batches in flight",
                                                (*model)->n_stages(), (*model)->scheduler().n_micro_batches())
                                  : fmt::format("{} threads", (*model)->n_threads());
    std::fprintf(stderr,
                 "tandem serve: model '%s' ready: %d slots of %d positions, %s, chat template %s%s, "
                 "embeddings pooled by %s\n",
                 hp.model_id.c_str(), opt.n_parallel, (*model)->n_ctx_slot(), where.c_str(),
                 (*model)->chat_template().name().c_str(),
                 (*model)->chat_template().fallback() ? " (fallback)" : "",
                 pooling_name((*model)->pooling()));
    if (hp.web_ui)
        std::fprintf(stderr, "tandem serve: dashboard (chat and cluster) at %s://%s:%d/\n",
                     opt.ssl_cert.empty() ? "http" : "https", opt.host.c_str(), *port);
    std::fflush(stderr);

    listener.join();
    (*model)->scheduler().stop();
    print_cluster_stats(opt.cluster, (*model)->engine());
    pthread_kill(signals.native_handle(), SIGTERM);
    signals.join();
    if (!served.ok()) return fail(served);
    std::fprintf(stderr, "tandem serve: stopped\n");
    return 0;
}

}  // namespace

void register_serve(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<ServeOptions>();
    CLI::App *cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
    cmd->add_option("-m,--model", opt->model, "GGUF model (default: stories260K, downloaded once if needed)");
    cmd->add_option("--host", opt->host, "Address to listen on")->default_val("127.0.0.1");
    cmd->add_option("--port", opt->port, "Port (0: any free port, printed on stderr)")
        ->default_val(8080)
        ->check(CLI::Range(0, 65535));
    cmd->add_option("--parallel", opt->n_parallel, "Requests computed together (sequence slots)")
        ->default_val(4)
        ->check(CLI::Range(1, 256));
    cmd->add_option("-c,--ctx-size", opt->n_ctx,
                    "The KV pool: positions all requests hold together; one may use all of them, the newest "
                    "is preempted when it runs out (0: the model's context for each slot)")
        ->default_val(0);
    cmd->add_option("--ctx-per-seq", opt->n_ctx_per_seq,
                    "Positions one request may use (0: the model's training context, at most --ctx-size)")
        ->default_val(0);
    cmd->add_option("-t,--threads", opt->n_threads,
                    "Compute threads (0: all cores); with --workers, threads per worker (0: its own -t)")
        ->default_val(0);
    cmd->add_option("-b,--batch-size", opt->n_batch, "Rows per engine step (decode rows + prompt chunk)")
        ->default_val(512)
        ->check(CLI::Range(1, 1 << 16));
    cmd->add_option("--queue", opt->max_queue,
                    "Requests that may wait for a slot; more get 503 (-1: 4*parallel)")
        ->default_val(-1);
    cmd->add_option("--http-threads", opt->http_threads, "HTTP worker threads (0: parallel + queue + 8)")
        ->default_val(0);
    cmd->add_option("--max-resumes", opt->max_resumes,
                    "Times a stream continues after a lost node (replayed on the nodes the head reconnects "
                    "to) instead of ending with the error (0: never)")
        ->default_val(0)
        ->check(CLI::NonNegativeNumber);
    cmd->add_option(
           "--max-per-client", opt->max_per_client,
           "Sequences (one per choice of a request) one client address may have open at once; more get "
           "429 (0: no limit)")
        ->default_val(0)
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--no-webui", opt->no_webui,
                  "Do not serve the web dashboard (chat and cluster pages) at / (the API and /status stay)");
    cmd->add_flag("--no-slots", opt->no_slots, "Do not answer GET /slots (each slot's request and progress)");
    cmd->add_flag(
        "--spm-infill", opt->spm_infill,
        "Fill in the middle with the suffix before the prefix (/infill, Ollama's suffix), for models "
        "trained that way");
    cmd->add_option("--timeout", opt->timeout_s, "Seconds a write to a client may block")->default_val(600);
    cmd->add_option("--api-key", opt->api_key, "Require 'Authorization: Bearer KEY' (except /health)");
    cmd->add_option("--api-key-file", opt->api_key_file,
                    "Read the API key from this file (its first line), so it is not on the command line");
    cmd->add_option("--ssl-cert,--ssl-cert-file", opt->ssl_cert,
                    "Serve HTTPS with this PEM certificate chain (with --ssl-key)");
    cmd->add_option("--ssl-key,--ssl-key-file", opt->ssl_key, "The PEM private key of --ssl-cert");
    cmd->add_option("--alias", opt->alias, "Model id in the API (default: the file name without .gguf)");
    add_kv_type_flags(cmd, opt->kv_type);
    cmd->add_option(
        "--chat-template", opt->chat_template,
        "Chat template: a family name (chatml, llama3, ...) or a .jinja file (default: the model's own "
        "Jinja template)");
    cmd->add_option(
        "--pooling", opt->pooling,
        "How /v1/embeddings, /embedding and /api/embed pool a prompt: mean, cls, last or none (one "
        "vector per token, /embedding only) (default: the model's pooling_type, else last)");
    cmd->add_option("--micro-batches", opt->n_micro_batches,
                    "Steps kept in flight through a pipeline (0: one per worker)")
        ->default_val(0);
    add_draft_flags(cmd, opt->draft);
    add_cluster_flags(cmd, opt->cluster);
    add_recovery_flags(cmd, opt->cluster);
    runners.push_back([cmd, opt] {
        if (!cmd->parsed()) return -1;
        if (Status s = apply_discovery(opt->cluster.discover, opt->cluster.workers); !s.ok()) return fail(s);
        if (Status s = check_draft_flags(opt->draft); !s.ok()) return fail(s);
        return serve_main(*opt);
    });
}

}  // namespace td::cli
