// tandem worker: serve pipeline stages to a head (`tandem run --workers ...`).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cluster/discovery.h"
#include "cluster/worker.h"
#include "net/auth.h"
#include "net/mdns.h"
#include "net/transport.h"

namespace td::cli {
namespace {

struct WorkerCliOptions {
    std::string listen = "127.0.0.1:0";
    int32_t n_threads = 0;
    std::string model;
    std::string cache_dir;
    bool no_repack = false;
    std::string cache_max = "0";
    std::string cache_min_free = "1G";
    std::string secret_file;
    std::string transport = "auto";
    std::string cluster = cluster::kDefaultClusterName;
    bool no_announce = false;
};

// Announces the worker on the LAN (mDNS) unless it listens on loopback only or --no-announce; a failure is a
// warning (the head can still name it with --workers).
std::unique_ptr<net::MdnsAnnouncer> announce(const WorkerCliOptions &opt, const cluster::Worker &worker,
                                             const std::string &host) {
    if (opt.no_announce) return nullptr;
    const bool loopback = host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
    if (loopback || !net::mdns_supported()) {
        if (opt.cluster != cluster::kDefaultClusterName)
            std::fprintf(
                stderr, "tandem worker: not announced on the LAN (%s)\n",
                loopback ? "listening on loopback; use --listen 0.0.0.0:PORT" : "this build has no mDNS");
        return nullptr;
    }
    const std::string address = worker.address();
    const uint16_t port = static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
    // A worker bound to one address is announced only on that address's interface (the others lead nowhere).
    const bool any = host.empty() || host == "0.0.0.0" || host == "::";
    auto a = net::MdnsAnnouncer::start(cluster::announcement_name(port), port,
                                       cluster::announcement_txt(worker.describe(), opt.cluster),
                                       any ? -1 : net::interface_of_address(host));
    if (!a.ok()) {
        std::fprintf(stderr, "tandem worker: warning: not announced on the LAN: %s\n",
                     a.status().message().c_str());
        return nullptr;
    }
    std::fprintf(stderr, "tandem worker: announcing cluster '%s' on the LAN (mDNS _tandem._tcp, %s)\n",
                 opt.cluster.c_str(), (*a)->stack().c_str());
    return std::move(a).value();
}

int worker_main(const WorkerCliOptions &opt) {
    cluster::WorkerOptions wo;
    if (Status s = net::parse_host_port(opt.listen, &wo.host, &wo.port); !s.ok())
        return fail(s.with_context("--listen"));
    wo.n_threads = opt.n_threads;
    wo.model_path = opt.model;
    if (opt.transport == "auto")
        wo.transports = net::built_transports();  // accepts what a head asks for; dials what the head allows
    else if (std::string error; !net::transports_from_name(opt.transport, &wo.transports, &error))
        return fail(invalid_input("{}", error));
    wo.cache_dir = opt.cache_dir.empty() ? tandem_cache_dir() + "/stages" : opt.cache_dir;
    // Packed weights beside the stage files when --cache-dir is given, else in the user cache.
    auto max_bytes = parse_size("--cache-max", opt.cache_max);
    if (!max_bytes.ok()) return fail(max_bytes.status());
    auto min_free = parse_size("--cache-min-free", opt.cache_min_free);
    if (!min_free.ok()) return fail(min_free.status());
    wo.cache.max_bytes = *max_bytes;
    wo.cache.min_free_bytes = *min_free;
    wo.pack_dir = opt.no_repack ? "" : opt.cache_dir.empty() ? pack_dir(false) : opt.cache_dir + "/packed";
    const std::string secret_path = opt.secret_file.empty() ? net::default_secret_path() : opt.secret_file;
    bool created = false;
    auto secret = net::ClusterSecret::load_or_create(secret_path, &created);
    if (!secret.ok()) return fail(secret.status());
    wo.secret = std::move(secret).value();
    if (created)
        std::fprintf(stderr,
                     "tandem worker: created the cluster secret %s; copy it (mode 600) to the head and every "
                     "other worker, at the same path or with --secret-file\n",
                     secret_path.c_str());
    else
        std::fprintf(stderr, "tandem worker: cluster secret %s\n", secret_path.c_str());
    auto worker = cluster::Worker::create(wo);
    if (!worker.ok()) return fail(worker.status());
    std::fprintf(stderr, "tandem worker listening on %s\n", (*worker)->address().c_str());
    std::fflush(stderr);
    auto announcer = announce(opt, **worker, wo.host);
    (*worker)->serve();
    return 0;
}

}  // namespace

void register_worker(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<WorkerCliOptions>();
    CLI::App *cmd =
        app.add_subcommand("worker", "Serve pipeline stages of a model to a head (tandem run --workers)");
    cmd->add_option("--listen", opt->listen, "HOST:PORT to listen on (port 0: any free port)")
        ->default_val("127.0.0.1:0");
    cmd->add_option("-t,--threads", opt->n_threads, "Threads (0: all cores)")->default_val(0);
    cmd->add_option(
           "--transport", opt->transport,
           "Links this worker may use: auto (whatever the head asks for and this build has: shared memory "
           "with nodes on this host, UCX, TCP), tcp, shm, ucx")
        ->default_val("auto");
    cmd->add_option("-m,--model", opt->model,
                    "Local copy of the model (used when its weights match the head's)");
    cmd->add_option("--cache-dir", opt->cache_dir,
                    "Where streamed stage files are kept (default: ~/.cache/tandem/stages)");
    cmd->add_option("--cache-max", opt->cache_max,
                    "Size the cache dir may hold (e.g. 200G); least recently used stages are evicted (0: no cap)")
        ->default_val("0");
    cmd->add_option("--cache-min-free", opt->cache_min_free,
                    "Disk a new stage file must leave free (e.g. 1G); older stages are evicted to keep it")
        ->default_val("1G");
    cmd->add_flag(
        "--no-repack", opt->no_repack,
        "Keep the weights in the GGUF's row layout instead of packing them for the fast kernels (packed "
        "copies are cached in the cache dir)");
    add_secret_flag(cmd, opt->secret_file);
    cmd->add_option(
           "--cluster", opt->cluster,
           "Cluster name in this worker's LAN announcement: heads with --discover use only their own")
        ->default_val(cluster::kDefaultClusterName);
    cmd->add_flag(
        "--no-announce", opt->no_announce,
        "Do not announce this worker on the LAN (mDNS); it is not announced when it listens on loopback");
    runners.push_back([cmd, opt] { return cmd->parsed() ? worker_main(*opt) : -1; });
}

}  // namespace td::cli
