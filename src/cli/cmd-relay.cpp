// tandem relay: forward TCP connections to a worker with added latency, to see what a slower link would do
// (tandem plan / bench through it) before buying or re-cabling. Runs until interrupted.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "net/delay-relay.h"
#include "net/transport.h"

namespace td::cli {
namespace {

struct RelayOptions {
    std::string listen = "127.0.0.1:0";
    std::string target;
    double delay_ms = 1.0;
};

int relay_main(const RelayOptions &opt) {
    std::string host;
    uint16_t port = 0;
    if (Status s = net::parse_host_port(opt.listen, &host, &port); !s.ok())
        return fail(s.with_context("--listen"));
    if (!(opt.delay_ms >= 0 && opt.delay_ms <= 10000))
        return fail(invalid_input("--delay-ms must be 0..10000"));
    auto relay = net::DelayRelay::start(host, port, opt.target, static_cast<int64_t>(opt.delay_ms * 1000.0));
    if (!relay.ok()) return fail(relay.status());
    std::fprintf(stderr, "tandem relay listening on %s, forwarding to %s with %.3f ms each way\n",
                 (*relay)->address().c_str(), opt.target.c_str(), opt.delay_ms);
    std::fflush(stderr);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    int sig = 0;
    sigwait(&set, &sig);
    (*relay)->stop();
    return 0;
}

}  // namespace

void register_relay(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<RelayOptions>();
    CLI::App *cmd =
        app.add_subcommand("relay", "Forward connections to a worker with added latency (a slower link)");
    cmd->add_option("target", opt->target, "HOST:PORT to forward to")->required();
    cmd->add_option("--listen", opt->listen, "HOST:PORT to listen on (port 0: any free port)")
        ->default_val("127.0.0.1:0");
    cmd->add_option("--delay-ms", opt->delay_ms, "Added one-way delay in milliseconds")->default_val(1.0);
    runners.push_back([cmd, opt] { return cmd->parsed() ? relay_main(*opt) : -1; });
}

}  // namespace td::cli
