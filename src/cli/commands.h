// Each subcommand adds itself to the app and pushes a runner that returns -1 when its subcommand was not
// chosen, else the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <vector>

namespace td::cli {

using Runners = std::vector<std::function<int()>>;

void register_run(CLI::App &app, Runners &runners);
void register_tokenize(CLI::App &app, Runners &runners);
void register_embed(CLI::App &app, Runners &runners);
void register_perplexity(CLI::App &app, Runners &runners);
void register_info(CLI::App &app, Runners &runners);
void register_synth(CLI::App &app, Runners &runners);
void register_bench(CLI::App &app, Runners &runners);
void register_serve(CLI::App &app, Runners &runners);
void register_worker(CLI::App &app, Runners &runners);
void register_netbench(CLI::App &app, Runners &runners);
void register_plan(CLI::App &app, Runners &runners);
void register_doctor(CLI::App &app, Runners &runners);
void register_relay(CLI::App &app, Runners &runners);
void register_discover(CLI::App &app, Runners &runners);
void register_up(CLI::App &app, Runners &runners);

}  // namespace td::cli
