// tandem netbench: round trips and throughput between this machine and a running worker, over each transport
// both ends share (TCP today), with the message sizes tandem really sends for a model (-m).
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
    auto client = cluster::ProbeClient::connect(opt.address, *secret);
    if (!client.ok()) return fail(client.status());
    auto samples = (*client)->measure_link(lo);
    if (!samples.ok()) return fail(samples.status());
    auto what_of = [&](uint64_t b) -> std::string {
        for (const auto &[s, w] : model_sizes)
            if (s == b) return w;
        return "";
    };
    const net::HelloReply &h = (*client)->hello();
    if (opt.json) {
        nlohmann::json j;
        j["address"] = opt.address;
        j["transport"] = "tcp";
        j["worker"] = {{"build", h.build_id}, {"cpu", h.cpu}, {"threads", h.n_threads}};
        j["connect_seconds"] = (*client)->connect_seconds();
        j["latency_us"] = cluster::link_latency_seconds(*samples) * 1e6;
        j["gbps"] = cluster::link_bytes_per_second(*samples) / 1e9;
        nlohmann::json rt = nlohmann::json::array(), st = nlohmann::json::array();
        for (const net::LinkSample &s : *samples) {
            nlohmann::json x = {{"bytes", s.bytes},      {"count", s.count},      {"p50_us", s.p50 * 1e6},
                                {"p90_us", s.p90 * 1e6}, {"p99_us", s.p99 * 1e6}, {"max_us", s.max * 1e6},
                                {"gbps", s.gbps}};
            if (!what_of(s.bytes).empty()) x["what"] = what_of(s.bytes);
            (s.mode == 0 ? rt : st).push_back(x);
        }
        j["round_trips"] = rt;
        j["streams"] = st;
        std::printf("%s\n", j.dump(2).c_str());
        return 0;
    }
    std::printf("netbench %s over tcp (the only transport both ends have in this build)\n",
                opt.address.c_str());
    std::printf("worker: %s, %u threads, build %s; connected in %.2f ms\n", h.cpu.c_str(), h.n_threads,
                h.build_id.c_str(), (*client)->connect_seconds() * 1e3);
    std::printf("\nround trips (echo; µs)\n%10s %9s %9s %9s %9s %7s  %s\n", "bytes", "p50", "p90", "p99",
                "max", "count", "");
    for (const net::LinkSample &s : *samples)
        if (s.mode == 0)
            std::printf("%10s %9s %9s %9s %9s %7u  %s\n", size_label(s.bytes).c_str(), us(s.p50).c_str(),
                        us(s.p90).c_str(), us(s.p99).c_str(), us(s.max).c_str(), s.count,
                        what_of(s.bytes).c_str());
    std::printf("\nstreams (one way, back to back)\n%10s %9s %12s %7s\n", "bytes", "GB/s", "ms/message",
                "count");
    for (const net::LinkSample &s : *samples)
        if (s.mode == 1)
            std::printf("%10s %9.2f %12.2f %7u\n", size_label(s.bytes).c_str(), s.gbps, s.p50 * 1e3, s.count);
    std::printf("\none way: %.1f µs per small message, %.2f GB/s\n",
                cluster::link_latency_seconds(*samples) * 1e6,
                cluster::link_bytes_per_second(*samples) / 1e9);
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
    add_secret_flag(cmd, opt->secret_file);
    runners.push_back([cmd, opt] { return cmd->parsed() ? netbench_main(*opt) : -1; });
}

}  // namespace td::cli
