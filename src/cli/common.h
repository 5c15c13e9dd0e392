// Shared by the subcommand mains: default model resolution, error exit, number formatting.
// Only src/cli/ prints and exits.
#pragma once

#include <string>

#include "core/status.h"

namespace td::cli {

// The model to use: `arg` when given; otherwise the default model (stories260K) from $TANDEM_MODEL,
// ../shared/models/ (beside the working directory or the source tree), or the user cache
// ($XDG_CACHE_HOME or ~/.cache)/tandem/models/, downloading it there once (curl, with a progress bar)
// when it is nowhere to be found.
Result<std::string> resolve_model(const std::string &arg);

// Prints "tandem: error: <message>" to stderr and returns the exit code for it.
int fail(const Status &status);

std::string human_bytes(double bytes);

// tandem's cache root: $TANDEM_CACHE_DIR, else ($XDG_CACHE_HOME or ~/.cache)/tandem. Downloaded models,
// streamed stage files and packed weights live in subfolders.
std::string tandem_cache_dir();
// Where packed weights are cached (model/weight-pack.h): <cache root>/packed, or "" with --no-repack.
std::string pack_dir(bool no_repack);

}  // namespace td::cli
