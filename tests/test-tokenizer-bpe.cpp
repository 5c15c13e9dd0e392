// Byte-level BPE tokenizer tests: llama.cpp's test vectors for every BPE vocabulary in ../shared/vocab (each
// with its own pre-tokenizer), round trips, special tokens, the pre-tokenizer splitters, the Unicode tables
// and malformed merges.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "gguf/gguf.h"
#include "text/detokenizer.h"
#include "text/pre-tokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"
#include "text/vocab.h"
#include "test-util.h"
#include "test-vocab-cases.h"

namespace td {
namespace {

using test::check_vocab_cases;
using test::ids_str;
using test::load_gguf;
using test::Loaded;
using test::parse_ids;
using test::read_cases;
using test::read_file;

TEST(BpeVectors, Gpt2) {
    check_vocab_cases("gpt-2", VocabKind::bpe, "gpt-2");
}
TEST(BpeVectors, DeepseekCoder) {
    check_vocab_cases("deepseek-coder", VocabKind::bpe, "deepseek-coder");
}
TEST(BpeVectors, DeepseekLlm) {
    check_vocab_cases("deepseek-llm", VocabKind::bpe, "deepseek-llm");
}
TEST(BpeVectors, Falcon) {
    check_vocab_cases("falcon", VocabKind::bpe, "falcon");
}
TEST(BpeVectors, Starcoder) {
    check_vocab_cases("starcoder", VocabKind::bpe, "starcoder");
}
TEST(BpeVectors, Refact) {
    check_vocab_cases("refact", VocabKind::bpe, "refact");
}
TEST(BpeVectors, Mpt) {
    check_vocab_cases("mpt", VocabKind::bpe, "mpt");
}

// gpt-neox has no tokenizer.ggml.pre (llama.cpp's default rules) and no test pair: check round trips and a
// few splits the default rules make (punctuation runs and digits in threes are their own words).
TEST(BpeVectors, GptNeoxDefaultRulesRoundTrip) {
    const std::string base = "vocab/ggml-vocab-gpt-neox.gguf";
    if (!test::shared_exists(base)) GTEST_SKIP();
    Loaded l = load_gguf(base);
    ASSERT_TRUE(l.tok);
    EXPECT_EQ(l.vocab->pre(), "");
    for (const std::string &s : read_cases(test::shared_path("vocab/ggml-vocab-gpt-2.gguf.inp"))) {
        std::vector<int32_t> ids = l.tok->encode(s, false, false);
        EXPECT_EQ(detokenize(*l.tok, ids), s);
    }
    std::vector<int32_t> ids = l.tok->encode("1234567", false, false);
    ASSERT_EQ(ids.size(), 3u);
    EXPECT_EQ(l.tok->token_to_piece(ids[0]), "123");
    EXPECT_EQ(l.tok->token_to_piece(ids[1]), "456");
    EXPECT_EQ(l.tok->token_to_piece(ids[2]), "7");
}

// --- the GPT-2 vocabulary ---

class Gpt2 : public ::testing::Test {
protected:
    void SetUp() override {
        if (!loaded_) {
            if (!test::shared_exists("vocab/ggml-vocab-gpt-2.gguf"))
                GTEST_SKIP() << "no ggml-vocab-gpt-2.gguf";
            loaded_ = std::make_unique<Loaded>(load_gguf("vocab/ggml-vocab-gpt-2.gguf"));
        }
        ASSERT_TRUE(loaded_->tok);
    }
    const Tokenizer &tok() const { return *loaded_->tok; }
    const Vocab &vocab() const { return *loaded_->vocab; }
    std::vector<std::string> pieces(const std::string &text) const {
        std::vector<std::string> out;
        for (int32_t id : tok().encode(text, false, false)) out.push_back(tok().token_to_piece(id, true));
        return out;
    }
    static std::unique_ptr<Loaded> loaded_;
};
std::unique_ptr<Loaded> Gpt2::loaded_;

TEST_F(Gpt2, KnownIds) {
    // GPT-2's well-known ids: "Hello" 15496, " world" 995, "<|endoftext|>" 50256.
    EXPECT_EQ(tok().encode("Hello world", false, false), (std::vector<int32_t>{15496, 995}));
    EXPECT_EQ(vocab().token_text(995), "\xC4\xA0world");  // "Ġworld"
    EXPECT_EQ(tok().token_to_piece(995), " world");
    EXPECT_FALSE(vocab().add_bos());
}

TEST_F(Gpt2, SpecialTokensOnlyWhenParsed) {
    const int32_t eot = vocab().find("<|endoftext|>");
    ASSERT_EQ(eot, 50256);
    std::vector<int32_t> parsed = tok().encode("a<|endoftext|>b", false, true);
    EXPECT_EQ(parsed.size(), 3u);
    EXPECT_EQ(parsed[1], eot);
    std::vector<int32_t> plain = tok().encode("a<|endoftext|>b", false, false);
    EXPECT_EQ(std::find(plain.begin(), plain.end(), eot), plain.end());
    EXPECT_EQ(detokenize(tok(), plain), "a<|endoftext|>b");
    EXPECT_EQ(detokenize(tok(), parsed), "ab");
    EXPECT_EQ(detokenize(tok(), parsed, Detokenizer::Start::text, /*render_special=*/true),
              "a<|endoftext|>b");
}

TEST_F(Gpt2, Gpt2Splits) {
    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ (case-sensitive
    // contractions)
    EXPECT_EQ(pieces("I'm  here"), (std::vector<std::string>{"I", "'m", " ", " here"}));
    EXPECT_EQ(pieces("don'T"), (std::vector<std::string>{"don", "'", "T"}));
}

TEST_F(Gpt2, RoundTripsAndStreams) {
    const std::vector<std::string> texts = {
        "",
        " ",
        "\n\n",
        "Hello world",
        "  two leading spaces",
        "trailing   ",
        "tabs\tand\r\nnewlines",
        "\xC3\x84pfel und \xC3\x96l",                                           // Äpfel und Öl
        "\xF0\x9F\x9A\x80 emoji \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB",  // 🚀 emoji 😶‍🌫
        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xE3\x80\x80x",  // 日本語 + ideographic space
        "3.14159 + 2 = 5.14159",
        "<s> not special </s>",
    };
    for (const std::string &s : texts) {
        std::vector<int32_t> ids = tok().encode(s, false, false);
        EXPECT_EQ(detokenize(tok(), ids), s) << "'" << s << "'" << ids_str(ids);
        Detokenizer detok(tok());
        std::string streamed;
        for (int32_t id : ids) streamed += detok.push(id);
        streamed += detok.flush();
        EXPECT_EQ(streamed, s);
    }
}

TEST_F(Gpt2, InvalidUtf8BecomesReplacementCharacters) {
    // As llama.cpp: each byte that starts no valid sequence is encoded as U+FFFD.
    std::vector<int32_t> ids = tok().encode(
        "a\xFF"
        "b\xC3",
        false, false);
    EXPECT_EQ(detokenize(tok(), ids),
              "a\xEF\xBF\xBD"
              "b\xEF\xBF\xBD");
}

TEST_F(Gpt2, RandomBytesAreSafe) {
    uint64_t state = 987654321;
    auto next = [&]() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<uint32_t>(state >> 33);
    };
    for (int iter = 0; iter < 200; ++iter) {
        std::string s(next() % 40, '\0');
        for (char &c : s) c = static_cast<char>(next() & 0xFF);
        std::vector<int32_t> ids = tok().encode(s, false, true);
        for (int32_t id : ids) ASSERT_TRUE(vocab().is_valid(id));
        (void)detokenize(tok(), ids);
    }
}

// --- small hand-made vocabularies: merges, fallback, defaults ---

std::string g(std::string_view text) {  // GPT-2 byte encoding of plain text
    std::string out;
    for (char c : text) out += unicode::byte_to_utf8(static_cast<uint8_t>(c));
    return out;
}

Result<std::unique_ptr<Tokenizer>> make_tok(const std::string &pre, std::vector<std::string> tokens,
                                            std::vector<std::string> merges) {
    VocabSpec s;
    s.model = "gpt2";
    s.pre = pre;
    s.tokens = std::move(tokens);
    s.merges = std::move(merges);
    s.add_bos = false;  // these tables have no BOS token (llama-bpe would add one by default)
    TD_ASSIGN_OR_RETURN(Vocab v, Vocab::from_spec(std::move(s)));
    return Tokenizer::create(std::make_shared<const Vocab>(std::move(v)));
}

TEST(BpeAlgorithm, LowestRankMergesFirst) {
    // Tokens: a b c ab bc abc. "a b" has rank 1, "b c" rank 0: "abc" -> (a)(bc) -> no "a bc" merge -> a, bc.
    auto tok = make_tok("gpt-2", {"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b"});
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ((*tok)->encode("abc", false, false), (std::vector<int32_t>{0, 4}));
    // With "a b" first: (ab)c, then "ab c" merges to abc.
    tok = make_tok("gpt-2", {"a", "b", "c", "ab", "bc", "abc"}, {"a b", "b c", "ab c"});
    ASSERT_TRUE(tok.ok());
    EXPECT_EQ((*tok)->encode("abc", false, false), (std::vector<int32_t>{5}));
}

TEST(BpeAlgorithm, IgnoreMergesTakesWholeWordsForLlama3) {
    // "abc" is a token but no merge reaches it; "a b" merges to "ab", which is not a token, so it falls back
    // to the tokens of its single bytes.
    std::vector<std::string> tokens = {"a", "b", "c", "abc"};
    auto gpt2 = make_tok("gpt-2", tokens, {"a b"});
    ASSERT_TRUE(gpt2.ok()) << gpt2.status().message();
    EXPECT_EQ((*gpt2)->encode("abc", false, false), (std::vector<int32_t>{0, 1, 2}));
    auto llama3 = make_tok("llama-bpe", tokens, {"a b"});
    ASSERT_TRUE(llama3.ok()) << llama3.status().message();
    EXPECT_EQ((*llama3)->encode("abc", false, false), (std::vector<int32_t>{3}));
}

TEST(BpeAlgorithm, PreTokenizerDefaults) {
    std::vector<std::string> tokens(20);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = fmt::format("t{}", i);
    auto vocab_of = [&](const std::string &pre) {
        VocabSpec s;
        s.model = "gpt2";
        s.pre = pre;
        s.tokens = tokens;
        auto v = Vocab::from_spec(s);
        EXPECT_TRUE(v.ok()) << v.status().message();
        return std::move(v).value();
    };
    EXPECT_TRUE(vocab_of("llama-bpe").add_bos());
    EXPECT_EQ(vocab_of("llama-bpe").bos(), 11);
    EXPECT_FALSE(vocab_of("gpt-2").add_bos());
    EXPECT_FALSE(vocab_of("qwen2").add_bos());
    EXPECT_EQ(vocab_of("glm4").bos(), -1);
    // The file's add_bos_token wins over the default.
    VocabSpec s;
    s.model = "gpt2";
    s.pre = "llama-bpe";
    s.tokens = tokens;
    s.add_bos = false;
    EXPECT_FALSE(Vocab::from_spec(s)->add_bos());
}

TEST(BpeAlgorithm, BadMergesAreAnError) {
    for (std::string bad : {"ab", "a ", " ", ""}) {
        auto tok = make_tok("gpt-2", {"a", "b", "ab"}, {"a b", bad});
        ASSERT_FALSE(tok.ok()) << "'" << bad << "'";
        EXPECT_EQ(tok.status().kind(), ErrorKind::invalid_input);
        EXPECT_NE(tok.status().message().find("tokenizer.ggml.merges[1]"), std::string::npos)
            << tok.status().message();
    }
    // Merges that name tokens the vocabulary lacks are not an error (llama.cpp accepts them): the pieces
    // fall back to single-byte tokens and unknown bytes are dropped.
    auto tok = make_tok("gpt-2", {"a", "b"}, {"a b", "ab c", "x y"});
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ((*tok)->encode("abz ab", false, false), (std::vector<int32_t>{0, 1, 0, 1}));
}

TEST(BpeAlgorithm, UnknownPreTokenizerIsUnimplemented) {
    auto tok = make_tok("tekken", {"a"}, {});
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().kind(), ErrorKind::unimplemented);
    EXPECT_NE(tok.status().message().find("tekken"), std::string::npos);
}

TEST(BpeAlgorithm, PiecesMapBytesBack) {
    auto tok = make_tok("gpt-2", {g(" the"), g("\n"), g("\xE6\x97"), "\xC3\xA9"}, {});
    ASSERT_TRUE(tok.ok());
    EXPECT_EQ((*tok)->token_to_piece(0), " the");
    EXPECT_EQ((*tok)->token_to_piece(1), "\n");
    EXPECT_EQ((*tok)->token_to_piece(2), "\xE6\x97");  // half a character: the detokenizer holds it back
    EXPECT_EQ((*tok)->token_to_piece(3), "\xE9");      // 'é' is GPT-2's character for byte 0xE9
}

// --- pre-tokenizer splits ---

std::vector<std::string> split(const std::string &pre, const std::string &text) {
    auto p = PreTokenizer::create(pre);
    EXPECT_TRUE(p.ok()) << p.status().message();
    std::vector<uint32_t> cpts;
    unicode::decode_utf8(text, cpts);
    std::vector<size_t> lengths;
    p->split(cpts, lengths);
    std::vector<std::string> words;
    size_t begin = 0;
    for (size_t n : lengths) {
        EXPECT_GT(n, 0u);
        std::string w;
        for (size_t i = begin; i < begin + n; ++i) unicode::append_utf8(cpts[i], w);
        words.push_back(w);
        begin += n;
    }
    EXPECT_EQ(begin, cpts.size());
    return words;
}

using Words = std::vector<std::string>;

TEST(PreTokenizer, Llama3) {
    EXPECT_EQ(split("llama-bpe", "Hello world 123456 I'M ok\n\n  x"),
              (Words{"Hello", " world", " ", "123", "456", " I", "'M", " ok", "\n\n", " ", " x"}));
    EXPECT_EQ(split("llama-bpe", "a...\n\nb  "), (Words{"a", "...\n\n", "b", "  "}));
    // Non-ASCII: letters with a leading non-letter, numbers, white space U+3000.
    EXPECT_EQ(split("llama-bpe",
                    "\xC2\xBF"
                    "caf\xC3\xA9? \xD9\xA1\xD9\xA2\xD9\xA3\xD9\xA4\xE3\x80\x80z"),
              (Words{"\xC2\xBF"
                     "caf\xC3\xA9",
                     "?", " ", "\xD9\xA1\xD9\xA2\xD9\xA3", "\xD9\xA4", "\xE3\x80\x80z"}));
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
    EXPECT_EQ(split("qwen2", "x 2024!"), (Words{"x", " ", "2", "0", "2", "4", "!"}));
}

TEST(PreTokenizer, Gpt2) {
    EXPECT_EQ(split("gpt-2", "Hello   world's 42!!\n"),
              (Words{"Hello", "  ", " world", "'s", " 42", "!!", "\n"}));
}

TEST(PreTokenizer, DeepseekCoderSplitsDigitsAndPunctuation) {
    // '=' is a symbol, not \p{P}: it stays in the text between matches.
    EXPECT_EQ(split("deepseek-coder", "x = 12;\n"), (Words{"x", " = ", "1", "2", ";", "\n"}));
    EXPECT_EQ(split("deepseek-coder", "f(a, b)"), (Words{"f", "(", "a", ",", " b", ")"}));
    // llama.cpp's collapsed \p{P} has a fixed ASCII set without '~' (a symbol, like '$' and '+').
    EXPECT_EQ(split("deepseek-coder", "a ~~!"), (Words{"a", " ~~", "!"}));
}

TEST(PreTokenizer, Falcon) {
    // Punctuation runs first, then GPT-2, then digits in threes.
    EXPECT_EQ(split("falcon", "a+=1234"), (Words{"a", "+=", "123", "4"}));
    // Falcon's punctuation class has '`', the default one does not.
    EXPECT_EQ(split("falcon", "x`("), (Words{"x", "`("}));
    EXPECT_EQ(split("default", "x`("), (Words{"x", "`", "("}));
}

TEST(PreTokenizer, EmptyTextHasNoWords) {
    EXPECT_TRUE(split("gpt-2", "").empty());
    EXPECT_TRUE(split("deepseek-llm", "").empty());
}

// --- Unicode tables ---

TEST(Unicode, Categories) {
    using unicode::Category;
    EXPECT_EQ(unicode::category('A'), Category::letter);
    EXPECT_EQ(unicode::category('7'), Category::number);
    EXPECT_EQ(unicode::category('!'), Category::punctuation);
    EXPECT_EQ(unicode::category('$'), Category::symbol);
    EXPECT_EQ(unicode::category('\n'), Category::control);
    EXPECT_EQ(unicode::category(0x00E9), Category::letter);  // é
    EXPECT_EQ(unicode::category(0x4E00), Category::letter);  // 一 (inside a First/Last range)
    EXPECT_EQ(unicode::category(0x0661), Category::number);  // Arabic-Indic one
    EXPECT_EQ(unicode::category(0x0301), Category::mark);    // combining acute
    EXPECT_EQ(unicode::category(0x3000), Category::separator);
    EXPECT_EQ(unicode::category(0x1F600), Category::symbol);    // 😀
    EXPECT_EQ(unicode::category(0x20000), Category::letter);    // CJK extension B
    EXPECT_EQ(unicode::category(0x0378), Category::undefined);  // unassigned
    EXPECT_EQ(unicode::category(0x110000), Category::undefined);
    EXPECT_TRUE(unicode::is_whitespace(0x3000));
    EXPECT_TRUE(unicode::is_whitespace(0x85));
    EXPECT_TRUE(unicode::is_whitespace('\t'));
    EXPECT_FALSE(unicode::is_whitespace(0x200B));  // zero width space is not White_Space
    EXPECT_FALSE(unicode::is_whitespace('x'));
}

TEST(Unicode, ByteMapIsABijection) {
    EXPECT_EQ(unicode::byte_to_utf8(' '), "\xC4\xA0");   // Ġ
    EXPECT_EQ(unicode::byte_to_utf8('\n'), "\xC4\x8A");  // Ċ
    EXPECT_EQ(unicode::byte_to_utf8('A'), "A");
    for (int b = 0; b < 256; ++b) {
        std::vector<uint32_t> cpts;
        unicode::decode_utf8(unicode::byte_to_utf8(static_cast<uint8_t>(b)), cpts);
        ASSERT_EQ(cpts.size(), 1u);
        EXPECT_EQ(unicode::utf8_to_byte(cpts[0]), b);
    }
    EXPECT_EQ(unicode::utf8_to_byte(' '), -1);
    EXPECT_EQ(unicode::utf8_to_byte(0x4E00), -1);
}

TEST(Unicode, DecodeReplacesEachBadByte) {
    std::vector<uint32_t> cpts;
    unicode::decode_utf8(
        "a\xE2\x82"
        "b\x80\xF4\x90\x80\x80\xF0\x9F\x98\x80",
        cpts);
    EXPECT_EQ(cpts, (std::vector<uint32_t>{'a', 0xFFFD, 0xFFFD, 'b', 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD,
                                           0x1F600}));
}

}  // namespace
}  // namespace td
