// tandem: one binary, one subcommand per job. Each subcommand lives in its own cmd-*.cpp and registers its
// options on a CLI11 subcommand; main only dispatches.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "cli/commands.h"
#include "core/build-id.h"
#include "core/log.h"

int main(int argc, char **argv) {
    CLI::App app{"tandem: run one large language model across several machines (GGUF, llama architecture)",
                 "tandem"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("tandem ") + TD_VERSION + " (" + td::build_git_id() + ")");
    bool verbose = false;
    app.add_flag("-v,--verbose", verbose, "Log more (also TANDEM_LOG=debug|info|warn|error)");

    std::vector<std::function<int()>> runners;
    td::cli::register_run(app, runners);
    td::cli::register_tokenize(app, runners);
    td::cli::register_embed(app, runners);
    td::cli::register_perplexity(app, runners);
    td::cli::register_info(app, runners);
    td::cli::register_synth(app, runners);
    td::cli::register_bench(app, runners);
    td::cli::register_serve(app, runners);
    td::cli::register_worker(app, runners);
    td::cli::register_netbench(app, runners);
    td::cli::register_plan(app, runners);
    td::cli::register_doctor(app, runners);
    td::cli::register_relay(app, runners);
    td::cli::register_discover(app, runners);
    td::cli::register_up(app, runners);

    // llama.cpp's short flags of two or three letters, which CLI11 does not take: -md is --model-draft, -ctk
    // and -ctv are --cache-type-k and --cache-type-v.
    static char model_draft[] = "--model-draft", cache_k[] = "--cache-type-k", cache_v[] = "--cache-type-v";
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "-md") == 0) argv[i] = model_draft;
        if (std::strcmp(argv[i], "-ctk") == 0) argv[i] = cache_k;
        if (std::strcmp(argv[i], "-ctv") == 0) argv[i] = cache_v;
    }
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError &e) {
        return app.exit(e);
    }
    if (verbose) td::log_set_level(td::LogLevel::info);
    for (auto &run : runners) {
        int rc = run();
        if (rc >= 0) return rc;
    }
    std::fprintf(stderr, "tandem: error: no subcommand ran\n");
    return 2;
}
