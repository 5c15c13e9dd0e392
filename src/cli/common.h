// Shared by the subcommand mains: default model resolution, error exit, number formatting.
// Only src/cli/ prints and exits.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/draft.h"
#include "model/kv-cache.h"
#include "net/auth.h"

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

// "512,1024" -> {512, 1024}; every item a whole number in [min, max]; errors name `flag`.
Result<std::vector<int32_t>> parse_int_list(const std::string &flag, const std::string &text, int32_t min,
                                            int32_t max);

// "20G", "512M", "64K", "1T" (binary units), "1.5G", or plain bytes -> bytes; errors name `flag`.
Result<uint64_t> parse_size(const std::string &flag, const std::string &text);

// --secret-file on a subcommand that talks to workers (the file every node of a cluster holds a copy of).
void add_secret_flag(CLI::App *cmd, std::string &path);
// The cluster secret from `path`, or from net::default_secret_path() when it is empty.
Result<net::ClusterSecret> load_cluster_secret(const std::string &path);

// --draft N, --model-draft FILE, --draft-p-min P and --draft-ngram MIN,MAX (run and serve): speculative
// decoding by prompt lookup or with a draft model.
void add_draft_flags(CLI::App *cmd, DraftParams &draft);
// invalid_input naming the flag; sets n_max where --draft was not given (16 with a draft model, else 0).
Status check_draft_flags(DraftParams &draft);

// --kv-type T (K and V), --cache-type-k T and --cache-type-v T (llama.cpp's -ctk and -ctv; each sets its half
// over --kv-type): the KV cache's types, for run and serve.
struct KvTypeFlags {
    std::string both = "f16";
    std::string k, v;  // "" = --kv-type's
};
void add_kv_type_flags(CLI::App *cmd, KvTypeFlags &flags);
// The types the flags name; invalid_input naming the flag and the accepted types.
Status parse_kv_type_flags(const KvTypeFlags &flags, KvType &type_k, KvType &type_v);

// serve's --api-key-file: the first line of `path`, trimmed; an empty key is refused (it would switch the
// check off).
Result<std::string> read_api_key_file(const std::string &path);

}  // namespace td::cli
