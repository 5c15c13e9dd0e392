// Tokenizer tests: llama.cpp's own test vectors for SentencePiece vocabularies, the stories260K reference
// run, streaming detokenization, round trips and malformed vocabularies.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "gguf/gguf.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "test-util.h"
#include "test-vocab-cases.h"

namespace td {
namespace {

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
const std::string kFffd = "\xEF\xBF\xBD";   // U+FFFD

using test::check_vocab_cases;
using test::ids_str;
using test::load_gguf;
using test::Loaded;
using test::parse_ids;
using test::read_cases;
using test::read_file;

TEST(TokenizerVectors, LlamaSpm) {
    check_vocab_cases("llama-spm", VocabKind::spm);
}
TEST(TokenizerVectors, Phi3) {
    check_vocab_cases("phi-3", VocabKind::spm);
}

// --- stories260K: the reference llama.cpp run ---

struct Reference {
    std::vector<int32_t> prompt_ids;
    std::vector<int32_t> generated_ids;
    std::string prompt;
    std::string generated_text;
    std::string full_text;
};

std::string unescape(const std::string &s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) {
            char c = s[++i];
            out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
        } else {
            out += s[i];
        }
    }
    return out;
}

Reference read_reference() {
    Reference ref;
    std::istringstream in(read_file(test::shared_path("reference/stories260K-once-upon-a-time.txt")));
    for (std::string line; std::getline(in, line);) {
        auto value = [&](std::string_view key) -> std::optional<std::string> {
            if (!line.starts_with(key)) return std::nullopt;
            return line.substr(key.size());
        };
        if (auto v = value("prompt_token_ids: ")) ref.prompt_ids = parse_ids(*v);
        if (auto v = value("generated_token_ids: ")) ref.generated_ids = parse_ids(*v);
        if (auto v = value("prompt: ")) ref.prompt = *v;
        if (auto v = value("generated_text: ")) ref.generated_text = unescape(*v);
        if (auto v = value("full_text: ")) ref.full_text = unescape(*v);
    }
    return ref;
}

class Stories : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP() << "no stories260K.gguf";
        l_ = load_gguf("models/stories260K.gguf");
        ASSERT_TRUE(l_.tok);
        ref_ = read_reference();
        ASSERT_EQ(ref_.generated_ids.size(), 64u);
    }
    Loaded l_;
    Reference ref_;
};

TEST_F(Stories, VocabFacts) {
    const Vocab &v = *l_.vocab;
    EXPECT_EQ(v.n_tokens(), 512);
    EXPECT_EQ(v.bos(), 1);
    EXPECT_EQ(v.eos(), 2);
    EXPECT_EQ(v.unk(), 0);
    EXPECT_EQ(v.sep(), -1);  // stored as 0xFFFFFFFF: not set
    EXPECT_EQ(v.pad(), -1);
    EXPECT_TRUE(v.add_bos());
    EXPECT_FALSE(v.add_eos());
    EXPECT_TRUE(v.add_space_prefix());
    EXPECT_TRUE(v.is_eog(2));
    EXPECT_FALSE(v.is_eog(1));
    EXPECT_FALSE(v.is_eog(13));
    EXPECT_EQ(v.token_type(0), TokenType::unknown);
    EXPECT_EQ(v.token_type(1), TokenType::control);
    EXPECT_EQ(v.token_type(13), TokenType::byte);
    EXPECT_EQ(v.token_byte(13), '\n');
    EXPECT_EQ(v.byte_token('\n'), 13);
    EXPECT_EQ(v.token_text(403), kSpace + "Once");
}

TEST_F(Stories, EncodesPrompt) {
    EXPECT_EQ(ref_.prompt, "Once upon a time");
    EXPECT_EQ(l_.tok->encode(ref_.prompt, /*add_special=*/true, /*parse_special=*/false), ref_.prompt_ids);
    EXPECT_EQ(l_.tok->encode(ref_.prompt, true, false), (std::vector<int32_t>{1, 403, 407, 261, 378}));
    EXPECT_EQ(l_.tok->encode(ref_.prompt, false, false), (std::vector<int32_t>{403, 407, 261, 378}));
}

TEST_F(Stories, StreamsGeneratedText) {
    Detokenizer detok(*l_.tok, Detokenizer::Start::continuation);
    std::string text;
    for (int32_t id : ref_.generated_ids) text += detok.push(id);
    text += detok.flush();
    EXPECT_EQ(text, ref_.generated_text);
    EXPECT_NE(text.find(".\nLily"), std::string::npos);  // token 13 is <0x0A>
}

TEST_F(Stories, DecodesFullTextAfterBos) {
    std::vector<int32_t> all = ref_.prompt_ids;
    all.insert(all.end(), ref_.generated_ids.begin(), ref_.generated_ids.end());
    EXPECT_EQ(detokenize(*l_.tok, all), ref_.full_text);
    // Without BOS too; and ids -> pieces one by one.
    std::vector<int32_t> no_bos(all.begin() + 1, all.end());
    EXPECT_EQ(detokenize(*l_.tok, no_bos), ref_.full_text);
    EXPECT_EQ(l_.tok->token_to_piece(403), " Once");
    EXPECT_EQ(l_.tok->token_to_piece(1), "");
    EXPECT_EQ(l_.tok->token_to_piece(1, /*special=*/true), "<s>");
    EXPECT_EQ(l_.tok->token_to_piece(13), "\n");
    // Continuing text keeps the space; render_special shows control tokens.
    EXPECT_EQ(detokenize(*l_.tok, std::vector<int32_t>{403, 407}, Detokenizer::Start::continuation),
              " Once upon");
    EXPECT_EQ(detokenize(*l_.tok, std::vector<int32_t>{1, 403, 2}, Detokenizer::Start::text, true),
              "<s> Once</s>");
}

// --- llama-spm: special tokens, round trips, streaming UTF-8 ---

class LlamaSpm : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        if (test::shared_exists("vocab/ggml-vocab-llama-spm.gguf")) {
            loaded_ = new Loaded(load_gguf("vocab/ggml-vocab-llama-spm.gguf"));
        }
    }
    static void TearDownTestSuite() {
        delete loaded_;
        loaded_ = nullptr;
    }
    void SetUp() override {
        if (!loaded_) GTEST_SKIP() << "no ggml-vocab-llama-spm.gguf";
        ASSERT_TRUE(loaded_->tok);
    }
    const Tokenizer &tok() const { return *loaded_->tok; }
    const Vocab &vocab() const { return *loaded_->vocab; }
    static Loaded *loaded_;
};
Loaded *LlamaSpm::loaded_ = nullptr;

TEST_F(LlamaSpm, SpecialTokensOnlyWhenParsed) {
    const int32_t hello = vocab().find(kSpace + "Hello");
    ASSERT_GE(hello, 0);
    EXPECT_EQ(tok().encode("<s>Hello</s>", false, true), (std::vector<int32_t>{1, hello, 2}));
    EXPECT_EQ(tok().encode("<s>Hello</s>", true, true), (std::vector<int32_t>{1, 1, hello, 2}));
    std::vector<int32_t> plain = tok().encode("<s>Hello</s>", false, false);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
    EXPECT_EQ(detokenize(tok(), plain), "<s>Hello</s>");
    // A space prefix only at the start and after a special token, not after ordinary text.
    const int32_t world = vocab().find(kSpace + "world");
    EXPECT_EQ(tok().encode("Hello world", false, false), (std::vector<int32_t>{hello, world}));
    EXPECT_EQ(tok().encode("", true, false), (std::vector<int32_t>{1}));
    EXPECT_TRUE(tok().encode("", false, false).empty());
}

TEST_F(LlamaSpm, EmojiFallsBackToBytes) {
    // U+1F600 is not a piece of the Llama vocabulary: four byte tokens after "▁".
    std::vector<int32_t> ids = tok().encode("\xF0\x9F\x98\x80", false, false);
    std::vector<int32_t> want = {vocab().find(kSpace), vocab().byte_token(0xF0), vocab().byte_token(0x9F),
                                 vocab().byte_token(0x98), vocab().byte_token(0x80)};
    EXPECT_EQ(ids, want);
}

TEST_F(LlamaSpm, StreamingHoldsBackPartialCharacters) {
    Detokenizer detok(tok(), Detokenizer::Start::continuation);
    EXPECT_EQ(detok.push(vocab().byte_token(0xF0)), "");
    EXPECT_EQ(detok.push(vocab().byte_token(0x9F)), "");
    EXPECT_EQ(detok.push(vocab().byte_token(0x98)), "");
    EXPECT_EQ(detok.n_pending(), 3u);
    EXPECT_EQ(detok.push(vocab().byte_token(0x80)), "\xF0\x9F\x98\x80");
    EXPECT_EQ(detok.n_pending(), 0u);
    // A piece with text and the start of a character: the text comes out at once.
    EXPECT_EQ(detok.push(vocab().find(kSpace + "Hello")), " Hello");
    EXPECT_EQ(detok.push(vocab().byte_token(0xC3)), "");
    EXPECT_EQ(detok.push(vocab().byte_token(0xA4)), "\xC3\xA4");  // ä
    EXPECT_EQ(detok.flush(), "");
}

TEST_F(LlamaSpm, StreamingReplacesInvalidBytes) {
    Detokenizer detok(tok(), Detokenizer::Start::continuation);
    EXPECT_EQ(detok.push(vocab().byte_token(0xFF)), kFffd);  // never valid: at once
    EXPECT_EQ(detok.push(vocab().byte_token(0x80)), kFffd);  // stray continuation byte
    EXPECT_EQ(detok.push(vocab().byte_token(0xF0)), "");
    EXPECT_EQ(detok.push(vocab().byte_token(0x9F)), "");
    EXPECT_EQ(detok.push(vocab().find("a")), kFffd + "a");  // cut off by another character
    EXPECT_EQ(detok.push(vocab().byte_token(0xE2)), "");
    EXPECT_EQ(detok.flush(), kFffd);  // cut off by the end
    EXPECT_EQ(detok.push(vocab().find("a")), "a");
    EXPECT_EQ(detok.flush(), "");
}

TEST_F(LlamaSpm, RoundTrips) {
    const std::vector<std::string> texts = {
        "Hello world",
        " Hello world",
        "  two leading spaces",
        "trailing spaces   ",
        "",
        " ",
        "\n\n",
        "tabs\tand\nnewlines\r\n",
        "\xC3\x84pfel und \xC3\x96l",  // Äpfel und Öl
        // 🚀 emoji 😶‍🌫️ (a ZWJ sequence)
        "\xF0\x9F\x9A\x80 emoji \xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F",
        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E",  // 日本語
        "<s> not special </s>",
        "a  b   c    d",
        "3.14159 + 2 = 5.14159",
    };
    for (const std::string &s : texts) {
        std::vector<int32_t> ids = tok().encode(s, false, false);
        EXPECT_EQ(detokenize(tok(), ids), s) << "'" << s << "'" << ids_str(ids);
        std::vector<int32_t> with_bos = tok().encode(s, true, false);
        ASSERT_FALSE(with_bos.empty());
        EXPECT_EQ(with_bos[0], 1);
        EXPECT_EQ(detokenize(tok(), with_bos), s) << "'" << s << "' with BOS";
        // Streaming one id at a time gives the same text.
        Detokenizer detok(tok());
        std::string streamed;
        for (int32_t id : ids) streamed += detok.push(id);
        streamed += detok.flush();
        EXPECT_EQ(streamed, s);
    }
}

TEST_F(LlamaSpm, InvalidUtf8InputIsEncodedAsBytes) {
    std::string bad =
        "a\xFF"
        "b\xC3";
    std::vector<int32_t> ids = tok().encode(bad, false, false);
    EXPECT_NE(std::find(ids.begin(), ids.end(), vocab().byte_token(0xFF)), ids.end());
    EXPECT_NE(std::find(ids.begin(), ids.end(), vocab().byte_token(0xC3)), ids.end());
    EXPECT_EQ(detokenize(tok(), ids), "a" + kFffd + "b" + kFffd);
}

TEST_F(LlamaSpm, RandomTextRoundTripsAndJunkIsSafe) {
    uint64_t state = 12345;  // deterministic LCG
    auto next = [&]() {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<uint32_t>(state >> 33);
    };
    // Valid UTF-8 pieces, spaces and special-token look-alikes.
    const std::string valid[] = {
        " ",  "  ", "a", "Z", "<s>", "</s>", "<unk>", "\xC3\xA4", "\xF0\x9F\x98\x80", "\xE2\x82\xAC",
        "\n", "\t", "7"};
    for (int round = 0; round < 200; ++round) {
        std::string text;
        const uint32_t len = next() % 30;
        for (uint32_t i = 0; i < len; ++i) text += valid[next() % std::size(valid)];
        std::vector<int32_t> ids = tok().encode(text, true, false);
        EXPECT_EQ(detokenize(tok(), ids), text) << "'" << text << "'" << ids_str(ids);
        // With special tokens parsed the text comes back without them (control tokens render as "").
        ids = tok().encode(text, false, true);
        for (int32_t id : ids) ASSERT_TRUE(vocab().is_valid(id));
    }
    // Random bytes: any ids come out and decode to valid UTF-8. (A bad lead byte right before a space can
    // swallow part of the escaped space "\xE2\x96\x81": llama.cpp splits characters the same way, so the
    // text does not always come back.)
    for (int round = 0; round < 200; ++round) {
        std::string text;
        const uint32_t len = next() % 40;
        for (uint32_t i = 0; i < len; ++i) {
            text += next() % 2 ? valid[next() % std::size(valid)]
                               : std::string(1, static_cast<char>(next() % 256));
        }
        for (bool parse_special : {false, true}) {
            std::vector<int32_t> ids = tok().encode(text, true, parse_special);
            for (int32_t id : ids) ASSERT_TRUE(vocab().is_valid(id));
            std::string out = detokenize(tok(), ids);
            std::string check;
            utf8_append_valid(out, true, check);
            EXPECT_EQ(check, out) << "decoded text is not valid UTF-8";
        }
    }
}

// --- Phi-3: special tokens with rstrip, end-of-generation set ---

TEST(Phi3, SpecialTokens) {
    if (!test::shared_exists("vocab/ggml-vocab-phi-3.gguf")) GTEST_SKIP();
    Loaded l = load_gguf("vocab/ggml-vocab-phi-3.gguf");
    ASSERT_TRUE(l.tok);
    const Vocab &v = *l.vocab;
    EXPECT_EQ(v.eos(), 32000);
    EXPECT_TRUE(v.is_eog(32000));  // <|endoftext|>
    EXPECT_TRUE(v.is_eog(32007));  // <|end|>
    EXPECT_EQ(v.eot(), 32007);     // found by text
    EXPECT_FALSE(v.is_eog(32010));
    EXPECT_EQ(v.find("<|user|>"), 32010);
    // Phi-3 special tokens eat the whitespace after them (llama.cpp's rstrip rule for this model).
    std::vector<int32_t> a = l.tok->encode("<|user|>\nHi<|end|>", false, true);
    std::vector<int32_t> b = l.tok->encode("<|user|>Hi<|end|>", false, true);
    EXPECT_EQ(a, b);
    ASSERT_EQ(a.size(), 3u);
    EXPECT_EQ(a[0], 32010);
    EXPECT_EQ(a[1], v.find(kSpace + "Hi"));
    EXPECT_EQ(a[2], 32007);
    EXPECT_EQ(detokenize(*l.tok, a), "Hi");
}

// --- in-memory vocabularies: the algorithm on small cases, and validation ---

VocabSpec tiny_spec() {
    VocabSpec s;
    s.model = "llama";
    s.tokens = {"<unk>", "<s>", "</s>"};
    s.types = {2, 3, 3};
    for (int b = 0; b < 256; ++b) {
        s.tokens.push_back(fmt::format("<0x{:02X}>", b));
        s.types.push_back(6);
    }
    s.scores.assign(s.tokens.size(), 0.0f);
    auto add = [&](std::string text, float score) {
        s.tokens.push_back(std::move(text));
        s.scores.push_back(score);
        s.types.push_back(1);
    };
    add(kSpace, -1.0f);         // 259
    add("a", -2.0f);            // 260
    add("b", -2.0f);            // 261
    add("c", -2.0f);            // 262
    add("ab", -5.0f);           // 263
    add("bc", -4.0f);           // 264: beats "ab"
    add(kSpace + "a", -3.0f);   // 265
    add("aa", -6.0f);           // 266
    add(kSpace + "ab", -7.0f);  // 267
    return s;
}

std::unique_ptr<Tokenizer> make_tokenizer(VocabSpec spec) {
    auto vocab = Vocab::from_spec(std::move(spec));
    EXPECT_TRUE(vocab.ok()) << vocab.status().message();
    if (!vocab.ok()) return nullptr;
    auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(vocab).value()));
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    return tok.ok() ? std::move(tok).value() : nullptr;
}

TEST(SpmAlgorithm, MergesByScore) {
    auto tok = make_tokenizer(tiny_spec());
    ASSERT_TRUE(tok);
    // "▁abc": pairs ▁a(-3) ab(-5) bc(-4): ▁a first, then "▁a"+"b" = "▁ab"(-7) vs bc(-4): bc wins.
    EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{265, 264}));
    // "▁ab": ▁a then ▁ab.
    EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{267}));
    // Ties go to the leftmost pair: "▁aaaa" -> ▁a(-3) first; then "aa"(-6) twice in a row: the left one.
    EXPECT_EQ(tok->encode("aaaa", false, false), (std::vector<int32_t>{265, 266, 260}));
    // Not in the vocabulary: byte fallback (z = 0x7A -> id 3 + 0x7A).
    EXPECT_EQ(tok->encode("z", false, false), (std::vector<int32_t>{259, 3 + 0x7A}));
    EXPECT_EQ(detokenize(*tok, tok->encode("abc z", false, false)), "abc z");
}

TEST(SpmAlgorithm, NoSpacePrefixWhenTheVocabSaysSo) {
    VocabSpec s = tiny_spec();
    s.add_space_prefix = false;
    auto tok = make_tokenizer(s);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->encode("ab", false, false), (std::vector<int32_t>{263}));
    EXPECT_EQ(detokenize(*tok, std::vector<int32_t>{265}), " a");  // nothing stripped either
}

TEST(SpmAlgorithm, AddsEosWhenAsked) {
    VocabSpec s = tiny_spec();
    s.add_eos = true;
    s.add_bos = false;
    auto tok = make_tokenizer(s);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->encode("a", true, false), (std::vector<int32_t>{265, 2}));
    EXPECT_EQ(tok->encode("a", false, false), (std::vector<int32_t>{265}));
}

TEST(SpmAlgorithm, UserDefinedTokensAreAlwaysMatched) {
    VocabSpec s = tiny_spec();
    s.tokens.push_back("<tool>");
    s.scores.push_back(0.0f);
    s.types.push_back(4);  // user_defined
    const auto tool = static_cast<int32_t>(s.tokens.size() - 1);
    auto tok = make_tokenizer(s);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->encode("a<tool>a", false, false), (std::vector<int32_t>{265, tool, 265}));
    EXPECT_EQ(tok->token_to_piece(tool), "<tool>");
    EXPECT_EQ(detokenize(*tok, std::vector<int32_t>{265, tool, 265}), "a<tool> a");
}

TEST(SpmAlgorithm, LongerSpecialTokenWins) {
    VocabSpec s = tiny_spec();
    for (std::string t : {"<x>", "<x><x>"}) {
        s.tokens.push_back(t);
        s.scores.push_back(0.0f);
        s.types.push_back(3);
    }
    const auto x = static_cast<int32_t>(s.tokens.size() - 2), xx = x + 1;
    auto tok = make_tokenizer(s);
    ASSERT_TRUE(tok);
    EXPECT_EQ(tok->encode("<x><x><x>", false, true), (std::vector<int32_t>{xx, x}));
    EXPECT_EQ(detokenize(*tok, std::vector<int32_t>{xx, x}), "");
}

TEST(Utf8, MaximalSubpartsBecomeOneReplacementEach) {
    auto valid = [](std::string_view in) {
        std::string out;
        EXPECT_EQ(utf8_append_valid(in, true, out), 0u);
        return out;
    };
    EXPECT_EQ(valid("abc"), "abc");
    EXPECT_EQ(valid("\xC0\x80"), kFffd + kFffd);                          // overlong
    EXPECT_EQ(valid("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // surrogate
    EXPECT_EQ(valid("\xF0\x9F\x98"), kFffd);                              // truncated at the end
    EXPECT_EQ(valid("\xF0\x9F\x98x"), kFffd + "x");                       // truncated by a character
    EXPECT_EQ(valid("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
    EXPECT_EQ(valid("\xE2\x82\xAC"), "\xE2\x82\xAC");                     // €
    std::string out;
    EXPECT_EQ(utf8_append_valid("x\xE2\x82", false, out), 2u);  // held back, not final
    EXPECT_EQ(out, "x");
}

// --- validation ---

Status spec_error(VocabSpec s) {
    auto v = Vocab::from_spec(std::move(s), "bad.gguf");
    return v.status();
}

TEST(VocabValidation, RejectsMalformedSpecs) {
    {
        VocabSpec s = tiny_spec();
        s.tokens.clear();
        s.scores.clear();
        s.types.clear();
        Status st = spec_error(s);
        EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
        EXPECT_NE(st.message().find("empty"), std::string::npos) << st.message();
    }
    {
        VocabSpec s = tiny_spec();
        s.scores.pop_back();
        Status st = spec_error(s);
        EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
        EXPECT_NE(st.message().find("tokenizer.ggml.scores"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find("bad.gguf"), std::string::npos) << st.message();
    }
    {
        VocabSpec s = tiny_spec();
        s.types.push_back(1);
        Status st = spec_error(s);
        EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
        EXPECT_NE(st.message().find("tokenizer.ggml.token_type"), std::string::npos) << st.message();
    }
    {
        VocabSpec s = tiny_spec();
        s.types[260] = 9;
        EXPECT_NE(spec_error(s).message().find("not a token type"), std::string::npos);
    }
    {
        VocabSpec s = tiny_spec();
        s.eos = 5000;
        Status st = spec_error(s);
        EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
        EXPECT_NE(st.message().find("eos_token_id = 5000 is out of range"), std::string::npos)
            << st.message();
    }
    {
        VocabSpec s = tiny_spec();
        s.bos = -7;
        EXPECT_EQ(spec_error(s).kind(), ErrorKind::invalid_input);
    }
    {
        VocabSpec s = tiny_spec();
        s.tokens[262] = "a";  // duplicate of 260
        EXPECT_NE(spec_error(s).message().find("twice"), std::string::npos);
    }
    {
        VocabSpec s = tiny_spec();
        s.tokens[10] = "<0xZZ>";
        EXPECT_NE(spec_error(s).message().find("has type byte"), std::string::npos);
    }
    {
        VocabSpec s;
        s.tokens = {"a", "b"};  // SentencePiece default bos is 1 ("b"); eos default 2 is dropped
        s.add_eos = true;
        EXPECT_NE(spec_error(s).message().find("no EOS token"), std::string::npos);
    }
    {
        VocabSpec s = tiny_spec();
        s.model = "t5";
        Status st = spec_error(s);
        EXPECT_EQ(st.kind(), ErrorKind::unimplemented);
        EXPECT_NE(st.message().find("'t5'"), std::string::npos);
    }
}

TEST(VocabValidation, UnsetIdsKeepDefaults) {
    VocabSpec s = tiny_spec();
    s.pad = 0xFFFFFFFFll;
    s.sep = -1;
    s.eos = 2;
    auto v = Vocab::from_spec(s);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->pad(), -1);
    EXPECT_EQ(v->sep(), -1);
    EXPECT_EQ(v->bos(), 1);
    EXPECT_EQ(v->eog_ids(), std::vector<int32_t>{2});
}

TEST(VocabValidation, BpeWithUnknownPreTokenizerIsUnimplemented) {
    VocabSpec s;
    s.model = "gpt2";
    s.pre = "no-such-pre";
    s.tokens = {"a", "b", "ab"};
    s.merges = {"a b"};
    auto v = Vocab::from_spec(s);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->kind(), VocabKind::bpe);
    EXPECT_FALSE(v->add_space_prefix());
    EXPECT_EQ(v->bos(), -1);  // default 11 is outside this table
    auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(v).value()));
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().kind(), ErrorKind::unimplemented);
    EXPECT_NE(tok.status().message().find("no-such-pre"), std::string::npos) << tok.status().message();
}

// Malformed vocabularies in real GGUF files.
TEST(VocabValidation, RejectsMalformedFiles) {
    test::TempDir dir;
    auto write = [&](const std::string &name, auto fill) {
        gguf::Writer w;
        w.set_string("general.architecture", "llama");
        fill(w);
        std::string path = dir.file(name);
        Status st = w.write(path);
        EXPECT_TRUE(st.ok()) << st.message();
        return path;
    };
    auto load = [](const std::string &path) -> Status {
        auto f = gguf::File::open(path);
        if (!f.ok()) return f.status();
        return Vocab::from_gguf(*f).status();
    };

    std::string no_tokens =
        write("no-tokens.gguf", [](gguf::Writer &w) { w.set_string("tokenizer.ggml.model", "llama"); });
    Status st = load(no_tokens);
    EXPECT_EQ(st.kind(), ErrorKind::not_found);
    EXPECT_NE(st.message().find("tokenizer.ggml.tokens"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("no-tokens.gguf"), std::string::npos) << st.message();

    std::string short_scores = write("short-scores.gguf", [](gguf::Writer &w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
        w.set_f32_array("tokenizer.ggml.scores", {0.0f, 0.0f, 0.0f});
    });
    st = load(short_scores);
    EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
    EXPECT_NE(st.message().find("has 3 entries but tokenizer.ggml.tokens has 4"), std::string::npos)
        << st.message();

    std::string bad_types = write("bad-types.gguf", [](gguf::Writer &w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
        w.set_string("tokenizer.ggml.token_type", "normal");
    });
    st = load(bad_types);
    EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
    EXPECT_NE(st.message().find("expected an array of i32"), std::string::npos) << st.message();

    std::string bad_eos = write("bad-eos.gguf", [](gguf::Writer &w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
        w.set_u32("tokenizer.ggml.eos_token_id", 4);
    });
    st = load(bad_eos);
    EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
    EXPECT_NE(st.message().find("tokenizer.ggml.eos_token_id = 4 is out of range"), std::string::npos)
        << st.message();

    std::string gpt2 = write("gpt2-no-merges.gguf", [](gguf::Writer &w) {
        w.set_string("tokenizer.ggml.model", "gpt2");
        w.set_string_array("tokenizer.ggml.tokens", {"a", "b"});
    });
    st = load(gpt2);
    EXPECT_EQ(st.kind(), ErrorKind::not_found);
    EXPECT_NE(st.message().find("tokenizer.ggml.merges"), std::string::npos) << st.message();

    std::string ok = write("ok.gguf", [](gguf::Writer &w) {
        w.set_string("tokenizer.ggml.model", "llama");
        w.set_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a"});
        w.set_i32_array("tokenizer.ggml.token_type", {2, 3, 3, 1});
        w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
        w.set_bool("tokenizer.ggml.add_bos_token", false);
    });
    EXPECT_TRUE(load(ok).ok()) << load(ok).message();
}

TEST(VocabValidation, GptTwoFileLoadsAsBpe) {
    if (!test::shared_exists("vocab/ggml-vocab-gpt-2.gguf")) GTEST_SKIP();
    auto f = gguf::File::open(test::shared_path("vocab/ggml-vocab-gpt-2.gguf"));
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto v = Vocab::from_gguf(*f);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->kind(), VocabKind::bpe);
    EXPECT_EQ(v->n_tokens(), 50257);
    EXPECT_FALSE(v->merges().empty());
    EXPECT_EQ(v->pre(), "gpt-2");
    auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(v).value()));
    EXPECT_TRUE(tok.ok()) << tok.status().message();  // encoding is tested in test-tokenizer-bpe.cpp
}

}  // namespace
}  // namespace td
