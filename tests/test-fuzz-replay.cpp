// Every fuzz target (tests/fuzz/) run over its seed corpus and over every input that once made it crash
// (tests/fuzz/regressions/<target>/), in the ordinary suite: the sanitizer build checks each of them under
// ASan + UBSan on every run, and a regression can never come back unnoticed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "test-util.h"

extern "C" {
#define TD_FUZZ_DECLARE(name)                                 \
    int td_fuzz_init_##name(int *argc, char ***argv);        \
    int td_fuzz_one_##name(const uint8_t *data, size_t size);
TD_FUZZ_DECLARE(codec)
TD_FUZZ_DECLARE(gguf)
TD_FUZZ_DECLARE(handshake)
TD_FUZZ_DECLARE(http)
TD_FUZZ_DECLARE(chat_template)
TD_FUZZ_DECLARE(tokenizer)
TD_FUZZ_DECLARE(grammar)
}

namespace td {
namespace {

struct Target {
    const char *name;  // the folder under corpus/ and regressions/
    int (*init)(int *, char ***);
    int (*one)(const uint8_t *, size_t);
};

const Target kTargets[] = {
    {"codec", td_fuzz_init_codec, td_fuzz_one_codec},
    {"gguf", td_fuzz_init_gguf, td_fuzz_one_gguf},
    {"handshake", td_fuzz_init_handshake, td_fuzz_one_handshake},
    {"http", td_fuzz_init_http, td_fuzz_one_http},
    {"chat-template", td_fuzz_init_chat_template, td_fuzz_one_chat_template},
    {"tokenizer", td_fuzz_init_tokenizer, td_fuzz_one_tokenizer},
    {"grammar", td_fuzz_init_grammar, td_fuzz_one_grammar},
};

std::vector<std::string> files_in(const std::filesystem::path &dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(dir, ec))
        if (e.is_regular_file()) out.push_back(e.path().string());
    std::sort(out.begin(), out.end());
    return out;
}

class FuzzReplay : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzReplay, SeedsAndRegressionsRunClean) {
    const Target &t = GetParam();
    if (std::string(t.name) == "tokenizer" && !test::shared_exists("vocab")) GTEST_SKIP() << "no ../shared/vocab";
    int argc = 0;
    char **argv = nullptr;
    ASSERT_EQ(t.init(&argc, &argv), 0) << t.name;
    const std::filesystem::path root = std::filesystem::path(TD_SOURCE_DIR) / "tests" / "fuzz";
    const std::vector<std::string> seeds = files_in(root / "corpus" / t.name);
    EXPECT_GE(seeds.size(), 1u) << "no seeds in " << (root / "corpus" / t.name);
    std::vector<std::string> all = seeds;
    for (const std::string &f : files_in(root / "regressions" / t.name)) all.push_back(f);
    for (const std::string &f : all) {
        const std::string bytes = test::read_file(f);
        EXPECT_EQ(t.one(reinterpret_cast<const uint8_t *>(bytes.data()), bytes.size()), 0) << f;
    }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay, ::testing::ValuesIn(kTargets),
                         [](const auto &info) {
                             std::string n = info.param.name;
                             std::replace(n.begin(), n.end(), '-', '_');
                             return n;
                         });

}  // namespace
}  // namespace td
