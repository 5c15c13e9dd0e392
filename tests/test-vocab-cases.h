// Shared by the tokenizer tests: loading a vocabulary-only GGUF from ../shared, and llama.cpp's tokenizer
// test vectors (.inp cases separated by "\n__ggml_vocab_test__\n", one .out line of ids each; no BOS/EOS,
// special tokens not parsed, as llama.cpp's test-tokenizer-0).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "test-util.h"

namespace td::test {

inline std::vector<int32_t> parse_ids(const std::string &line) {
    std::vector<int32_t> ids;
    std::istringstream in(line);
    int32_t id;
    while (in >> id) ids.push_back(id);
    return ids;
}

inline std::string ids_str(const std::vector<int32_t> &ids) {
    std::string s;
    for (int32_t id : ids) s += fmt::format(" {}", id);
    return s;
}

struct Loaded {
    std::shared_ptr<const Vocab> vocab;
    std::unique_ptr<Tokenizer> tok;
};

// The vocabulary and tokenizer of a GGUF under ../shared (`rel`), or empty ones after a test failure.
inline Loaded load_gguf(const std::string &rel) {
    auto file = gguf::File::open(shared_path(rel));
    EXPECT_TRUE(file.ok()) << file.status().message();
    if (!file.ok()) return {};
    auto vocab = Vocab::from_gguf(*file);
    EXPECT_TRUE(vocab.ok()) << vocab.status().message();
    if (!vocab.ok()) return {};
    auto shared = std::make_shared<const Vocab>(std::move(vocab).value());
    auto tok = Tokenizer::create(shared);
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    if (!tok.ok()) return {};
    return {shared, std::move(tok).value()};
}

inline std::vector<std::string> read_cases(const std::string &path) {
    const std::string inp = read_file(path);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> cases;
    for (size_t pos = 0; pos < inp.size();) {
        size_t end = inp.find(sep, pos);
        EXPECT_NE(end, std::string::npos) << "unterminated case at byte " << pos;
        if (end == std::string::npos) break;
        cases.push_back(inp.substr(pos, end - pos));
        pos = end + sep.size();
    }
    return cases;
}

// Every case of ../shared/vocab/ggml-vocab-NAME.gguf.inp tokenizes to its .out line and detokenizes back.
// The vocabulary must be of `kind`; `pre` (when not empty) is its expected tokenizer.ggml.pre.
inline void check_vocab_cases(const std::string &name, VocabKind kind, const std::string &pre = "") {
    const std::string base = "vocab/ggml-vocab-" + name + ".gguf";
    if (!shared_exists(base)) GTEST_SKIP() << "missing " << shared_path(base);
    Loaded l = load_gguf(base);
    ASSERT_TRUE(l.tok);
    EXPECT_EQ(l.vocab->kind(), kind);
    if (!pre.empty()) {
        EXPECT_EQ(l.vocab->pre(), pre);
    }

    const std::vector<std::string> cases = read_cases(shared_path(base + ".inp"));
    std::vector<std::string> lines;
    std::istringstream out(read_file(shared_path(base + ".out")));
    for (std::string line; std::getline(out, line);) lines.push_back(line);
    ASSERT_EQ(cases.size(), lines.size());
    ASSERT_GE(cases.size(), 40u);

    int n_fail = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
        std::vector<int32_t> got = l.tok->encode(cases[i], /*add_special=*/false, /*parse_special=*/false);
        std::vector<int32_t> want = parse_ids(lines[i]);
        if (got != want) ++n_fail;
        EXPECT_EQ(ids_str(got), ids_str(want)) << name << " case " << i << ": '" << cases[i] << "'";
        // And the text comes back.
        EXPECT_EQ(detokenize(*l.tok, got), cases[i]) << name << " case " << i;
    }
    EXPECT_EQ(n_fail, 0) << name << ": " << n_fail << " of " << cases.size() << " cases differ";
}

}  // namespace td::test
