// tandem doctor: read-only checks of this host (cluster/host-check.h), each with the command that fixes it.
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cluster/host-check.h"
#include "cluster/node-info.h"
#include "cluster/placement.h"
#include "cluster/probe.h"
#include "net/transport.h"

namespace td::cli {
namespace {

struct DoctorOptions {
    bool json = false;
    std::string root = "/";
    std::string workers;
    bool no_bandwidth = false;
    std::string secret_file;
};

int doctor_main(const DoctorOptions &opt) {
    cluster::HostCheckOptions ho;
    ho.root = opt.root;
    ho.cpu_model = cluster::cpu_model_name(opt.root);
    ho.secret_path = opt.secret_file.empty() ? net::default_secret_path() : opt.secret_file;
    if (!opt.workers.empty()) {
        auto list = cluster::parse_worker_list(opt.workers);
        if (!list.ok()) return fail(list.status());
        std::string host;
        uint16_t port = 0;
        if (net::parse_host_port(list->front(), &host, &port).ok())
            ho.interface = cluster::interface_towards(host);
    }
    if (!opt.no_bandwidth) {
        ThreadPool pool(0);
        ho.read_gbps =
            cluster::measure_read_bytes_per_second(pool, cluster::default_probe_working_set()) / 1e9;
    }
    const auto checks = cluster::run_host_checks(ho);
    int warns = 0;
    for (const auto &c : checks) warns += c.status == cluster::CheckStatus::warn;
    if (opt.json) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto &c : checks)
            j.push_back({{"check", c.name},
                         {"status", cluster::check_status_name(c.status)},
                         {"detail", c.detail},
                         {"fix", c.fix}});
        std::printf("%s\n", nlohmann::json{{"checks", j}, {"warnings", warns}}.dump(2).c_str());
        return 0;
    }
    for (const auto &c : checks) {
        std::printf("%-12s %-30s %s\n", cluster::check_status_name(c.status), c.name.c_str(),
                    c.detail.c_str());
        if (!c.fix.empty()) std::printf("%-12s %-30s fix: %s\n", "", "", c.fix.c_str());
    }
    std::printf("\n%d warning%s\n", warns, warns == 1 ? "" : "s");
    return 0;
}

}  // namespace

void register_doctor(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<DoctorOptions>();
    CLI::App *cmd =
        app.add_subcommand("doctor", "Check this host's settings that decide cluster speed (read-only)");
    cmd->add_flag("--json", opt->json, "Print JSON");
    cmd->add_option("--workers", opt->workers,
                    "Workers this host talks to (the MTU check follows the route to the first)");
    cmd->add_option("--root", opt->root, "Read proc/ and sys/ below this directory (for tests)")
        ->default_val("/");
    cmd->add_flag("--no-bandwidth", opt->no_bandwidth, "Skip the memory bandwidth measurement");
    add_secret_flag(cmd, opt->secret_file);
    runners.push_back([cmd, opt] { return cmd->parsed() ? doctor_main(*opt) : -1; });
}

}  // namespace td::cli
