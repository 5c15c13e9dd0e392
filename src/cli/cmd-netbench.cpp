// tandem netbench: round trips and throughput between this machine and a running worker, over each transport
// both ends can use (TCP; shared memory when the worker runs on this host), side by side, with the message
// sizes tandem really sends for a model (-m).
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cluster/cluster-engine.h"
#include "cluster/cost-model.h"
#include "cluster/probe.h"
#include "net/codec.h"

namespace td::cli {
namespace {

struct NetbenchOptions {
    std::string address;
    std::string model;
    bool json = false;
    int budget_ms = 200;
    std::string wire = "f16";
    std::string secret_file;
    std::string transport = "auto";
};

std::string size_label(uint64_t b) {
    if (b >= (1u << 20) && b % (1u << 20) == 0) return fmt::format("{} MiB", b >> 20);
    if (b >= 1024 && b % 1024 == 0) return fmt::format("{} KiB", b >> 10);
    return fmt::format("{} B", b);
}

std::string us(double s) {
    return fmt::format("{:.1f}", s * 1e6);
}

int netbench_main(const NetbenchOptions &opt) {
    cluster::LinkOptions lo = cluster::default_link_options();
    lo.budget_ms = opt.budget_ms;
    // What tandem sends for this model: one token's activation (a Forward of one row), a prompt chunk (the
    // rows a two-stage pipeline sends per message of a 512-token prompt), one all-reduce part (one row, f32).
    std::vector<std::pair<uint64_t, std::string>> model_sizes;
    if (!opt.model.empty()) {
        auto f = gguf::File::open(opt.model);
        if (!f.ok()) return fail(f.status());
        auto shape = cluster::model_shape_from_file(*f);
        if (!shape.ok()) return fail(shape.status().with_context(opt.model));
        net::WireType wire = net::WireType::f16;
        if (!net::wire_type_from_name(opt.wire, &wire))
            return fail(invalid_input("--wire: f32, f16 or q8_0"));
        const auto n_embd = static_cast<uint32_t>(shape->hp.n_embd);
        const int32_t chunk = cluster::auto_chunk_rows(512, 2);
        model_sizes = {
            {net::forward_payload_bytes(1, n_embd, wire),
             "one token's activation (Forward, 1 row, " + opt.wire + ")"},
            {net::forward_payload_bytes(static_cast<uint32_t>(chunk), n_embd, wire),
             fmt::format("a prompt chunk (Forward, {} rows, {})", chunk, opt.wire)},
            {uint64_t{n_embd} * 4, "one all-reduce part (1 row, f32)"},
        };
        for (const auto &[b, what] : model_sizes) lo.rtt_sizes.push_back(b);
        std::sort(lo.rtt_sizes.begin(), lo.rtt_sizes.end());
    }
    auto secret = load_cluster_secret(opt.secret_file);
    if (!secret.ok()) return fail(secret.status());
    uint32_t allowed = 0;
    if (std::string error; !net::transports_from_name(opt.transport, &allowed, &error))
        return fail(invalid_input("{}", error));
    if (opt.transport == "auto") allowed = net::built_transports();  // measure every one this build has
    // Each transport on its own probe connection: TCP, shared memory when the worker shares this host, UCX
    // when both builds have it.
    struct Run {
        net::Transport transport;
        std::unique_ptr<cluster::ProbeClient> client;
        std::vector<net::LinkSample> samples;
    };
    std::vector<Run> runs;
    std::vector<std::string> unavailable;
    for (net::Transport t : {net::Transport::tcp, net::Transport::shm, net::Transport::ucx}) {
        if (t != net::Transport::tcp && (allowed & net::transport_bit(t)) == 0) continue;
        if (t == net::Transport::tcp && opt.transport != "auto" && opt.transport != "tcp")
            continue;  // only it
        auto client = cluster::ProbeClient::connect(opt.address, *secret, 3000,
                                                    net::kTransportsTcp | net::transport_bit(t));
        if (!client.ok()) return fail(client.status());
        if ((*client)->transport() != t) {
            unavailable.push_back(fmt::format("{}: not available ({})", net::transport_name(t),
                                              t == net::Transport::shm
                                                  ? "the worker is on another host, or refused it"
                                                  : "the worker's build has no UCX, or refused it"));
            continue;
        }
        auto samples = (*client)->measure_link(lo);
        if (!samples.ok()) return fail(samples.status());
        runs.push_back({t, std::move(client).value(), std::move(samples).value()});
    }
    if (runs.empty()) return fail(make_error(ErrorKind::failed, "{}", unavailable.front()));
    auto what_of = [&](uint64_t b) -> std::string {
        for (const auto &[s, w] : model_sizes)
            if (s == b) return w;
        return "";
    };
    const net::HelloReply &h = runs.front().client->hello();
    const auto run_json = [&](const Run &r) {
        nlohmann::json j;
        j["transport"] = net::transport_name(r.transport);
        j["connect_seconds"] = r.client->connect_seconds();
        j["latency_us"] = cluster::link_latency_seconds(r.samples) * 1e6;
        j["gbps"] = cluster::link_bytes_per_second(r.samples) / 1e9;
        nlohmann::json rt = nlohmann::json::array(), st = nlohmann::json::array();
        for (const net::LinkSample &s : r.samples) {
            nlohmann::json x = {{"bytes", s.bytes},      {"count", s.count},      {"p50_us", s.p50 * 1e6},
                                {"p90_us", s.p90 * 1e6}, {"p99_us", s.p99 * 1e6}, {"max_us", s.max * 1e6},
                                {"gbps", s.gbps}};
            if (!what_of(s.bytes).empty()) x["what"] = what_of(s.bytes);
            (s.mode == 0 ? rt : st).push_back(x);
        }
        j["round_trips"] = rt;
        j["streams"] = st;
        return j;
    };
    if (opt.json) {
        // The first transport's figures at the top (TCP unless --transport says otherwise), every one in
        // "transports".
        nlohmann::json j = run_json(runs.front());
        j["address"] = opt.address;
        j["worker"] = {{"build", h.build_id}, {"cpu", h.cpu}, {"threads", h.n_threads}};
        j["transports"] = nlohmann::json::array();
        for (const Run &r : runs) j["transports"].push_back(run_json(r));
        j["unavailable"] = unavailable;
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("worker %s: %s, %u threads, build %s\n", opt.address.c_str(), h.cpu.c_str(), h.n_threads,
                h.build_id.c_str());
    for (const Run &r : runs) {
        const auto &samples = r.samples;
        std::printf("\n== over %s (connected in %.2f ms)\n", net::transport_name(r.transport),
                    r.client->connect_seconds() * 1e3);
        std::printf("round trips (echo; µs)\n%10s %9s %9s %9s %9s %7s  %s\n", "bytes", "p50", "p90", "p99",
                    "max", "count", "");
        for (const net::LinkSample &s : samples)
            if (s.mode == 0)
                std::printf("%10s %9s %9s %9s %9s %7u  %s\n", size_label(s.bytes).c_str(), us(s.p50).c_str(),
                            us(s.p90).c_str(), us(s.p99).c_str(), us(s.max).c_str(), s.count,
                            what_of(s.bytes).c_str());
        std::printf("streams (one way, back to back)\n%10s %9s %12s %7s\n", "bytes", "GB/s", "ms/message",
                    "count");
        for (const net::LinkSample &s : samples)
            if (s.mode == 1)
                std::printf("%10s %9.2f %12.2f %7u\n", size_label(s.bytes).c_str(), s.gbps, s.p50 * 1e3,
                            s.count);
        std::printf("one way: %.1f µs per small message, %.2f GB/s\n",
                    cluster::link_latency_seconds(samples) * 1e6,
                    cluster::link_bytes_per_second(samples) / 1e9);
    }
    for (const std::string &u : unavailable) std::printf("\n%s\n", u.c_str());
    if (runs.size() > 1) {
        std::printf("\nside by side (round trip p50, µs; streams GB/s)\n%10s", "bytes");
        for (const Run &r : runs) std::printf(" %9s", net::transport_name(r.transport));
        std::printf("\n");
        const auto &first = runs.front().samples;
        for (size_t i = 0; i < first.size(); ++i) {
            std::printf("%10s", size_label(first[i].bytes).c_str());
            for (const Run &r : runs) {
                const net::LinkSample &s = r.samples[std::min(i, r.samples.size() - 1)];
                if (s.mode == 0)
                    std::printf(" %9s", us(s.p50).c_str());
                else
                    std::printf(" %9.2f", s.gbps);
            }
            std::printf("  %s\n", first[i].mode == 0 ? "round trip" : "stream");
        }
    }
    return 0;
}

}  // namespace

void register_netbench(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<NetbenchOptions>();
    CLI::App *cmd =
        app.add_subcommand("netbench", "Measure the link to a running worker: latency and throughput");
    cmd->add_option("address", opt->address, "HOST:PORT of a tandem worker")->required();
    cmd->add_option("-m,--model", opt->model, "Also measure the message sizes tandem sends for this model");
    cmd->add_flag("--json", opt->json, "Print JSON");
    cmd->add_option("--budget-ms", opt->budget_ms, "Time per message size")
        ->default_val(200)
        ->check(CLI::Range(1, 2000));
    cmd->add_option("--wire", opt->wire, "Activation type for the model's sizes: f32, f16, q8_0")
        ->default_val("f16");
    cmd->add_option(
           "--transport", opt->transport,
           "Which transports to measure: auto (TCP; shared memory when the worker shares this host; UCX when "
           "both builds have it), tcp, shm or ucx")
        ->default_val("auto");
    add_secret_flag(cmd, opt->secret_file);
    runners.push_back([cmd, opt] { return cmd->parsed() ? netbench_main(*opt) : -1; });
}

}  // namespace td::cli
