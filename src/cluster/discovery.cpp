#include "cluster/discovery.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>

#include "cluster/stage-cache.h"

namespace td::cluster {

namespace {

std::string host_name() {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    return host;
}

uint64_t to_u64(const std::string &s) {
    return std::strtoull(s.c_str(), nullptr, 10);
}

}  // namespace

std::map<std::string, std::string> announcement_txt(const net::HelloReply &hello,
                                                    const std::string &cluster_name) {
    return {{"proto", std::to_string(hello.protocol_version)},
            {"build", hello.build_id},
            {"cluster", cluster_name},
            {"node", host_name()},
            {"cores", std::to_string(hello.n_threads)},
            {"mem", std::to_string(hello.mem_available)},
            {"mem_total", std::to_string(hello.mem_total)},
            {"gflops", fmt::format("{:.1f}", hello.gflops)},
            {"cpu", hello.cpu.substr(0, 120)}};
}

std::string announcement_name(uint16_t port) {
    // DNS-SD instance names may hold any UTF-8 up to 63 bytes.
    return fmt::format("tandem worker {}:{}", host_name(), port).substr(0, 63);
}

FoundWorker judge_worker(const net::MdnsService &service, const std::string &cluster_name) {
    FoundWorker f;
    f.service = service;
    const std::string proto = service.get("proto");
    const std::string cluster = service.get("cluster");
    if (proto.empty()) {
        f.reason = "its announcement has no protocol version";
    } else if (proto != std::to_string(net::kProtocolVersion)) {
        f.reason = fmt::format(
            "speaks protocol {}, this build speaks {} (build {}; use the same release on every node)", proto,
            net::kProtocolVersion, service.get("build"));
    } else if (cluster != cluster_name) {
        f.reason = fmt::format("belongs to cluster '{}', not '{}' (--cluster)", cluster, cluster_name);
    } else {
        f.usable = true;
    }
    return f;
}

Result<std::vector<FoundWorker>> discover_workers(const DiscoverOptions &o) {
    const auto judge_all = [&](const std::vector<net::MdnsService> &services) {
        std::vector<FoundWorker> out;
        for (const net::MdnsService &s : services) out.push_back(judge_worker(s, o.cluster_name));
        return out;
    };
    const auto n_usable = [](const std::vector<FoundWorker> &found) {
        int n = 0;
        for (const FoundWorker &f : found) n += f.usable ? 1 : 0;
        return n;
    };
    const bool waiting = o.min_workers > 0;
    auto services =
        net::mdns_browse(waiting ? o.timeout : o.window, [&](const std::vector<net::MdnsService> &s) {
            return waiting && n_usable(judge_all(s)) >= o.min_workers;
        });
    if (!services.ok()) return services.status();
    return judge_all(*services);
}

Status enough_workers(const std::vector<FoundWorker> &found, const DiscoverOptions &o) {
    int usable = 0;
    for (const FoundWorker &f : found) usable += f.usable ? 1 : 0;
    const bool waiting = o.min_workers > 0;
    const int wanted = std::max(o.min_workers, 1);
    if (usable >= wanted) return {};
    const auto waited = waiting ? o.timeout : o.window;
    std::string msg =
        fmt::format("discovery found {} usable worker{} of cluster '{}' in {:.1f} s{}", usable,
                    usable == 1 ? "" : "s", o.cluster_name, std::chrono::duration<double>(waited).count(),
                    waiting ? fmt::format(", {} wanted (--min-workers)", o.min_workers) : "");
    if (!found.empty()) msg += "; found:\n" + describe_found(found);
    msg +=
        "\nstart `tandem worker --listen 0.0.0.0:9000` on each node (same --cluster), check that UDP 5353 "
        "(mDNS) passes between the hosts, or give --workers HOST:PORT,...";
    return make_error(ErrorKind::not_found, "{}", msg);
}

std::string usable_worker_list(const std::vector<FoundWorker> &found) {
    std::string out;
    for (const FoundWorker &f : found)
        if (f.usable) {
            if (!out.empty()) out += ',';
            out += f.service.endpoint();
        }
    return out;
}

std::string describe_found(const std::vector<FoundWorker> &found) {
    std::string out;
    for (const FoundWorker &f : found) {
        const net::MdnsService &s = f.service;
        out += fmt::format(
            "  {:<21} {:<16} cluster {:<10} protocol {:<3} {:>3} cores  {:>10} free  {:>7} GFLOP/s  {}\n",
            s.endpoint(), s.get("node"), s.get("cluster"), s.get("proto"), s.get("cores"),
            fmt_gib(to_u64(s.get("mem"))), s.get("gflops"),
            f.usable ? std::string("usable") : fmt::format("not used: {}", f.reason));
    }
    return out;
}

}  // namespace td::cluster
