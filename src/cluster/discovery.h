// Finding workers on the LAN: what a worker announces over mDNS (net/mdns.h) and how a head judges what it
// finds. A worker's TXT record: proto (protocol version), build, cluster (its --cluster name), node (host
// name), cores (threads), mem (bytes available) and mem_total, gflops (measured), cpu.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/mdns.h"
#include "net/protocol.h"

namespace td::cluster {

inline constexpr const char *kDefaultClusterName = "default";

// The TXT record of a worker that answers Hello with `hello` and belongs to cluster `cluster_name`.
std::map<std::string, std::string> announcement_txt(const net::HelloReply &hello,
                                                    const std::string &cluster_name);
// "tandem worker vm:9000": unique per host and port, so two workers of one host do not collide.
std::string announcement_name(uint16_t port);

struct FoundWorker {
    net::MdnsService service;
    bool usable = false;
    std::string reason;  // why not ("speaks protocol 6, this head speaks 7"), "" when usable
};

// Usable when the worker speaks this build's protocol version and belongs to `cluster_name`.
FoundWorker judge_worker(const net::MdnsService &service, const std::string &cluster_name);

struct DiscoverOptions {
    std::string cluster_name = kDefaultClusterName;
    // 0: browse for `window` and take every usable worker; N: stop as soon as N are usable, fail after
    // `timeout`.
    int min_workers = 0;
    std::chrono::milliseconds window{2000};
    std::chrono::milliseconds timeout{30000};
};

// Browses, judges and returns every worker found (usable or not), sorted by address. Error: mDNS cannot run here.
Result<std::vector<FoundWorker>> discover_workers(const DiscoverOptions &options);
// Error (not_found) when `found` has fewer usable workers than options.min_workers (at least one): the message
// lists what was found and why each was refused, and what to check.
Status enough_workers(const std::vector<FoundWorker> &found, const DiscoverOptions &options);

// "10.0.0.2:9000,10.0.0.3:9000": the usable ones, for --workers.
std::string usable_worker_list(const std::vector<FoundWorker> &found);
// One line per worker: "10.0.0.2:9000  vm  cluster lab  protocol 8  8 cores  100.0 GiB free  520 GFLOP/s
// used" (or "not used: <reason>").
std::string describe_found(const std::vector<FoundWorker> &found);

}  // namespace td::cluster
