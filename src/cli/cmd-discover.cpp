// tandem discover: list the workers announced on the LAN (mDNS, _tandem._tcp) and whether a head of this
// build and cluster name would use them.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cluster/discovery.h"

namespace td::cli {

namespace {

struct DiscoverCliOptions {
    std::string cluster = cluster::kDefaultClusterName;
    double timeout_s = 2.0;
    int min_workers = 0;
    bool json = false;
};

int discover_main(const DiscoverCliOptions &opt) {
    cluster::DiscoverOptions o;
    o.cluster_name = opt.cluster;
    o.min_workers = opt.min_workers;
    o.window = o.timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.timeout_s * 1000));
    auto found = cluster::discover_workers(o);
    if (!found.ok()) return fail(found.status());
    const Status enough = cluster::enough_workers(*found, o);
    if (opt.json) {
        nlohmann::json out = nlohmann::json::array();
        for (const cluster::FoundWorker &f : *found)
            out.push_back({{"address", f.service.endpoint()},
                           {"instance", f.service.instance},
                           {"host", f.service.host},
                           {"txt", f.service.txt},
                           {"usable", f.usable},
                           {"reason", f.reason}});
        std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
        return enough.ok() ? 0 : 1;
    }
    if (!enough.ok()) return fail(enough);
    std::printf("workers announced for cluster '%s':\n%s", opt.cluster.c_str(),
                cluster::describe_found(*found).c_str());
    return 0;
}

}  // namespace

void register_discover(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<DiscoverCliOptions>();
    CLI::App *cmd = app.add_subcommand(
        "discover", "List the workers announced on the LAN (mDNS) and whether this head would use them");
    cmd->add_option("--cluster", opt->cluster, "Cluster name a usable worker must announce")
        ->default_val(cluster::kDefaultClusterName);
    cmd->add_option("--timeout", opt->timeout_s, "Seconds to listen (with --min-workers: at most)")
        ->default_val(2.0);
    cmd->add_option("--min-workers", opt->min_workers, "Stop as soon as this many usable workers answered")
        ->default_val(0);
    cmd->add_flag("--json", opt->json, "Print JSON (every worker found, usable or not, with its TXT record)");
    runners.push_back([cmd, opt] { return cmd->parsed() ? discover_main(*opt) : -1; });
}

}  // namespace td::cli
