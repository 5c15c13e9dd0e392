#include "cli/common.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/size.h"

extern char **environ;

namespace td::cli {
namespace fs = std::filesystem;

namespace {
constexpr const char *kDefaultModel = "stories260K.gguf";
constexpr const char *kDefaultModelUrl =
    "https://huggingface.co/ggml-org/tiny-llamas/resolve/main/stories260K.gguf";

// The source tree's parent, found from the binary (build/<preset>/tandem), for ../shared beside the checkout.
std::vector<fs::path> shared_candidates() {
    std::vector<fs::path> out;
    out.push_back(fs::current_path() / ".." / "shared" / "models" / kDefaultModel);
    std::error_code ec;
    fs::path exe = fs::read_symlink("/proc/self/exe", ec);
    if (!ec) {
        for (fs::path dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
             dir = dir.parent_path())
            out.push_back(dir.parent_path() / "shared" / "models" / kDefaultModel);
    }
    return out;
}

Status download(const std::string &url, const fs::path &dest) {
    std::error_code ec;
    fs::create_directories(dest.parent_path(), ec);
    if (ec)
        return make_error(ErrorKind::io, "cannot create {}: {}", dest.parent_path().string(), ec.message());
    const std::string tmp = dest.string() + ".part";
    std::fprintf(stderr, "tandem: downloading %s\n        to %s\n", url.c_str(), dest.c_str());
    std::vector<std::string> args = {"curl", "-L", "--fail", "--progress-bar", "-o", tmp, url};
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawnp(&pid, "curl", nullptr, nullptr, argv.data(), environ) != 0)
        return make_error(ErrorKind::failed,
                          "cannot run curl to download the default model; install curl or pass -m");
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fs::remove(tmp, ec);
        return make_error(ErrorKind::failed, "downloading {} failed; pass a model with -m", url);
    }
    fs::rename(tmp, dest, ec);
    if (ec)
        return make_error(ErrorKind::io, "cannot move the download to {}: {}", dest.string(), ec.message());
    return {};
}

}  // namespace

Result<std::string> resolve_model(const std::string &arg) {
    if (!arg.empty()) return arg;
    if (const char *env = std::getenv("TANDEM_MODEL"); env && *env) return std::string(env);
    std::error_code ec;
    for (const fs::path &p : shared_candidates())
        if (fs::is_regular_file(p, ec)) return fs::weakly_canonical(p, ec).string();
    const fs::path cached = fs::path(tandem_cache_dir()) / "models" / kDefaultModel;
    if (fs::is_regular_file(cached, ec)) return cached.string();
    TD_TRY(download(kDefaultModelUrl, cached));
    return cached.string();
}

int fail(const Status &status) {
    std::fprintf(stderr, "tandem: error: %s\n", status.message().c_str());
    return 1;
}

std::string human_bytes(double bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        ++u;
    }
    return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string tandem_cache_dir() {
    if (const char *dir = std::getenv("TANDEM_CACHE_DIR"); dir && *dir) return dir;
    if (const char *xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
        return (fs::path(xdg) / "tandem").string();
    if (const char *home = std::getenv("HOME"); home && *home)
        return (fs::path(home) / ".cache" / "tandem").string();
    return (fs::temp_directory_path() / "tandem").string();
}

std::string pack_dir(bool no_repack) {
    return no_repack ? std::string() : (fs::path(tandem_cache_dir()) / "packed").string();
}

Result<uint64_t> parse_size(const std::string &flag, const std::string &text) {
    auto r = parse_byte_size(text);
    if (!r.ok()) return r.status().with_context(flag);
    return r;
}

Result<std::vector<int32_t>> parse_int_list(const std::string &flag, const std::string &text, int32_t min,
                                            int32_t max) {
    std::vector<int32_t> out;
    size_t start = 0;
    for (;;) {
        const size_t comma = text.find(',', start);
        const std::string item =
            text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        int32_t v = 0;
        auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
        if (item.empty() || ec != std::errc() || end != item.data() + item.size() || v < min || v > max)
            return invalid_input("{} takes a comma-separated list of whole numbers from {} to {}, got '{}'",
                                 flag, min, max, text);
        out.push_back(v);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

void add_secret_flag(CLI::App *cmd, std::string &path) {
    cmd->add_option("--secret-file", path,
                    "The cluster secret every node holds a copy of (default: $TANDEM_SECRET_FILE, else "
                    "~/.config/tandem/cluster.secret; `tandem worker` creates it on first start)");
}

void add_draft_flags(CLI::App *cmd, DraftParams &draft) {
    cmd->add_option(
           "--draft,--draft-max", draft.n_max,
           "Speculative decoding: guess up to N tokens per step and check them in the same step; the "
           "output is the same, with fewer steps where guesses hold. The guesses come from the text so "
           "far (where it repeats earlier text), or from --model-draft (0: off; default 0, or 16 with "
           "--model-draft)")
        ->default_val(-1);
    cmd->add_option("--model-draft", draft.model,
                    "A small model with the same vocabulary that guesses the tokens, run greedily on this "
                    "machine (also -md, as llama.cpp's)");
    cmd->add_option("--draft-p-min", draft.p_min,
                    "A draft model's guesses stop at the first token it gives less than this probability")
        ->default_val(0.75f);
    cmd->add_option_function<std::vector<int32_t>>(
           "--draft-ngram",
           [&draft](const std::vector<int32_t> &v) {
               draft.ngram_min = v.at(0);
               draft.ngram_max = v.size() > 1 ? v[1] : v[0];
           },
           "MIN,MAX: the lengths of the last tokens looked up in the earlier text (default 2,4)")
        ->delimiter(',')
        ->expected(1, 2);
}

Status check_draft_flags(DraftParams &draft) {
    if (draft.n_max < 0) draft.n_max = draft.model.empty() ? 0 : 16;  // not given
    if (draft.n_max > kMaxDraft)
        return invalid_input("--draft must be 0..{}, got {}", kMaxDraft, draft.n_max);
    if (draft.ngram_min < 1 || draft.ngram_max < draft.ngram_min || draft.ngram_max > 16)
        return invalid_input("--draft-ngram must be MIN,MAX with 1 <= MIN <= MAX <= 16, got {},{}",
                             draft.ngram_min, draft.ngram_max);
    if (!(draft.p_min >= 0.0f && draft.p_min <= 1.0f))
        return invalid_input("--draft-p-min must be in [0, 1], got {}", draft.p_min);
    return {};
}

void add_kv_type_flags(CLI::App *cmd, KvTypeFlags &flags) {
    cmd->add_option(
           "--kv-type", flags.both,
           "KV cache type of K and V: f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 (q8_0 takes about "
           "half of f16's memory, q4_0 less than a third)")
        ->default_val("f16");
    cmd->add_option("--cache-type-k", flags.k, "KV cache type of K alone (also -ctk, as llama.cpp's)");
    cmd->add_option("--cache-type-v", flags.v, "KV cache type of V alone (also -ctv, as llama.cpp's)");
}

Status parse_kv_type_flags(const KvTypeFlags &flags, KvType &type_k, KvType &type_v) {
    const struct {
        const std::string &text;
        const char *flag;
        KvType &out;
    } halves[] = {
        {flags.k.empty() ? flags.both : flags.k, flags.k.empty() ? "--kv-type" : "--cache-type-k", type_k},
        {flags.v.empty() ? flags.both : flags.v, flags.v.empty() ? "--kv-type" : "--cache-type-v", type_v}};
    for (const auto &h : halves) {
        auto t = kv_type_from_name(h.text);
        if (!t.ok()) return invalid_input("{}: {}", h.flag, t.status().message());
        h.out = *t;
    }
    return {};
}

Result<net::ClusterSecret> load_cluster_secret(const std::string &path) {
    return net::ClusterSecret::load(path.empty() ? net::default_secret_path() : path);
}

Result<std::string> read_api_key_file(const std::string &path) {
    std::ifstream in(path);
    if (!in) return make_error(ErrorKind::io, "{}: cannot read the API key file", path);
    std::string line;
    std::getline(in, line);
    const size_t a = line.find_first_not_of(" \t\r");
    const size_t b = line.find_last_not_of(" \t\r");
    if (a == std::string::npos) return invalid_input("{}: the API key file's first line is empty", path);
    return line.substr(a, b - a + 1);
}

}  // namespace td::cli
