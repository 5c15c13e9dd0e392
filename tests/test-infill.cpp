// Fill in the middle (server/infill.h): the prompt laid out as llama-server lays it out, on vocabularies
// with FIM tokens (StarCoder's, DeepSeek-Coder's) and without (Llama's); llama-server's POST /infill and
// Ollama's `suffix` over a served model.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "core/thread-pool.h"
#include "gguf/gguf.h"
#include "model/synth.h"
#include "server/infill.h"
#include "server/llamacpp.h"
#include "test-server-util.h"
#include "test-util.h"
#include "text/tokenizer.h"

namespace td::server {
namespace {

using nlohmann::json;
using test_server::post;
using test_server::ServerOptions;
using test_server::TestServer;

// The tokenizer of a GGUF file's vocabulary (a path; tokenizer_of: one of ../shared's); null, with the test
// failed, when it does not load.
std::unique_ptr<Tokenizer> tokenizer_at(const std::string &path) {
    auto f = gguf::File::open(path);
    auto v = f.ok() ? Vocab::from_gguf(*f) : Result<Vocab>(f.status());
    auto t = v.ok() ? Tokenizer::create(std::make_shared<const Vocab>(std::move(*v)))
                    : Result<std::unique_ptr<Tokenizer>>(v.status());
    if (!t.ok()) {
        ADD_FAILURE() << t.status().message();
        return nullptr;
    }
    return std::move(*t);
}
std::unique_ptr<Tokenizer> tokenizer_of(const std::string &vocab_file) {
    return tokenizer_at(test::shared_path(vocab_file));
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
    std::vector<int32_t> out;
    for (const auto &p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

TEST(Infill, FimTokensAreFoundByKeyOrText) {
    if (!test::shared_exists("vocab/ggml-vocab-starcoder.gguf")) GTEST_SKIP() << "no StarCoder vocabulary";
    const auto star = tokenizer_of("vocab/ggml-vocab-starcoder.gguf");
    const Vocab &v = star->vocab();
    EXPECT_TRUE(infill_supported(v).ok());
    EXPECT_EQ(v.token_text(v.fim_pre()), "<fim_prefix>");
    EXPECT_EQ(v.token_text(v.fim_suf()), "<fim_suffix>");
    EXPECT_EQ(v.token_text(v.fim_mid()), "<fim_middle>");
    // Its <repo_name> and <file_sep> are none of the texts llama.cpp looks for: no repository-level layout.
    EXPECT_EQ(v.fim_rep(), -1);
    EXPECT_EQ(v.fim_sep(), -1);
    if (test::shared_exists("vocab/ggml-vocab-deepseek-coder.gguf")) {
        const auto ds = tokenizer_of("vocab/ggml-vocab-deepseek-coder.gguf");
        EXPECT_TRUE(infill_supported(ds->vocab()).ok());
        EXPECT_EQ(ds->vocab().token_text(ds->vocab().fim_suf()), "<｜fim▁hole｜>");
    }
    const auto llama = tokenizer_of("vocab/ggml-vocab-llama-spm.gguf");
    const Status none = infill_supported(llama->vocab());
    EXPECT_EQ(none.kind(), ErrorKind::unimplemented);
    EXPECT_EQ(
        none.message(),
        "Infill is not supported by this model: prefix token is missing. suffix token is missing. middle "
        "token is missing.");
}

// The layout, piece by piece: [extra] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>, the extra context
// (no repository or file separator tokens that llama.cpp knows in StarCoder's vocabulary) each chunk after a
// snippet line; suffix first with spm.
TEST(Infill, ThePromptIsLaidOutAsLlamaServerLaysItOut) {
    if (!test::shared_exists("vocab/ggml-vocab-starcoder.gguf")) GTEST_SKIP() << "no StarCoder vocabulary";
    const auto tok = tokenizer_of("vocab/ggml-vocab-starcoder.gguf");
    const Vocab &v = tok->vocab();
    auto enc = [&](const std::string &s) { return tok->encode(s, false, false); };
    InfillInput in;
    in.prefix = "def add(a, b):\n    ";
    in.suffix = "\n\nprint(add(1, 2))\n";
    const std::vector<int32_t> prompt = enc("return");
    InfillLimits lim;
    lim.n_ctx = 4096;
    const std::vector<int32_t> fim = {v.fim_pre()}, suf = {v.fim_suf()}, mid = {v.fim_mid()};
    EXPECT_EQ(infill_prompt(*tok, in, prompt, lim),
              concat({fim, enc(in.prefix), prompt, suf, enc(in.suffix), mid}));
    lim.spm = true;
    EXPECT_EQ(infill_prompt(*tok, in, prompt, lim),
              concat({suf, enc(in.suffix), fim, enc(in.prefix), prompt, mid}));
    lim.spm = false;
    in.extra = {{"util.py", "def sub(a, b):\n    return a - b\n"}, {"tmp", "x = 1\n"}};
    const std::vector<int32_t> snippet = enc("\n\n--- snippet ---\n\n");
    EXPECT_EQ(infill_prompt(*tok, in, {}, lim),
              concat({snippet, enc(in.extra[0].text), snippet, enc(in.extra[1].text), fim, enc(in.prefix),
                      suf, enc(in.suffix), mid}));
}

// Qwen2.5-Coder's repository-level layout, on a small SentencePiece vocabulary of bytes and its FIM tokens
// (with a BOS, which llama-server puts after the extra context):
//   <|fim_repo|>myproject\n <|file_sep|>a.py\n text <|file_sep|>filename\n <s> <|fim_prefix|> ...
TEST(Infill, TheRepositoryLevelLayoutWhereTheVocabularyHasItsTokens) {
    test::TempDir dir;
    gguf::Writer w;
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.model", "llama");
    std::vector<std::string> tokens = {
        "<unk>",          "<s>",          "</s>",        "<|fim_prefix|>", "<|fim_suffix|>",
        "<|fim_middle|>", "<|fim_repo|>", "<|file_sep|>"};
    std::vector<int32_t> types = {2, 3, 3, 3, 3, 3, 3, 3};  // unknown, then control
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(fmt::format("<0x{:02X}>", b));
        types.push_back(6);  // byte
    }
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_f32_array("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f));
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    const std::string path = dir.file("fim-vocab.gguf");
    ASSERT_TRUE(w.write(path).ok());
    const auto tok = tokenizer_at(path);
    ASSERT_NE(tok, nullptr);
    const Vocab &vocab = tok->vocab();
    ASSERT_EQ(vocab.fim_rep(), 6);
    ASSERT_EQ(vocab.fim_sep(), 7);
    auto enc = [&](const std::string &text) { return tok->encode(text, false, false); };
    InfillInput in{"int f() {", "}", {{"a.py", "x = 1"}}};
    InfillLimits lim;
    lim.n_ctx = 4096;
    EXPECT_EQ(infill_prompt(*tok, in, {}, lim), concat({{6},
                                                        enc("myproject\n"),
                                                        {7},
                                                        enc("a.py\n"),
                                                        enc("x = 1"),
                                                        {7},
                                                        enc("filename\n"),
                                                        {1, 3},
                                                        enc("int f() {"),
                                                        {4},
                                                        enc("}"),
                                                        {5}}));
}

// Long inputs: the prefix's last 3/4 n_batch tokens, the suffix's first n_batch/4 - 2 - prompt tokens, and
// the extra context's last n_ctx - n_batch - 2 n_predict tokens.
TEST(Infill, LongInputsKeepWhatIsNearestTheCursor) {
    if (!test::shared_exists("vocab/ggml-vocab-starcoder.gguf")) GTEST_SKIP() << "no StarCoder vocabulary";
    const auto tok = tokenizer_of("vocab/ggml-vocab-starcoder.gguf");
    const Vocab &v = tok->vocab();
    auto enc = [&](const std::string &s) { return tok->encode(s, false, false); };
    std::string prefix, suffix, extra;
    for (int i = 0; i < 200; ++i) {
        prefix += fmt::format("x{} = {}\n", i, i);
        suffix += fmt::format("y{} = {}\n", i, i);
        extra += fmt::format("z{} = {}\n", i, i);
    }
    InfillInput in{prefix, suffix, {{"a.py", extra}}};
    const std::vector<int32_t> prompt = enc("x200");
    InfillLimits lim;
    lim.n_batch = 64;
    lim.n_ctx = 200;
    lim.n_predict = 40;
    const auto p = enc(prefix), s = enc(suffix);
    const auto x = concat({enc("\n\n--- snippet ---\n\n"), enc(extra)});
    ASSERT_GT(p.size(), 48u);
    ASSERT_GT(x.size(), 56u);
    const std::vector<int32_t> want =
        concat({std::vector<int32_t>(x.end() - 56, x.end()),  // 200 - 64 - 80
                {v.fim_pre()},
                std::vector<int32_t>(p.end() - 48, p.end()),
                prompt,
                {v.fim_suf()},
                std::vector<int32_t>(s.begin(), s.begin() + 14 - ptrdiff_t(prompt.size())),
                {v.fim_mid()}});
    EXPECT_EQ(infill_prompt(*tok, in, prompt, lim), want);
    lim.n_predict = -1;  // 200 - 64 + 2 of the extra context
    EXPECT_EQ(infill_prompt(*tok, in, prompt, lim).size(), want.size() - 56 + 138);
}

TEST(Infill, RequestsAreCheckedNamingTheField) {
    auto error = [](const std::string &body) {
        auto r = parse_llama_infill(body);
        return r.ok() ? std::string() : r.status().message();
    };
    EXPECT_EQ(error(R"({"input_prefix": "a", "input_suffix": "b"})"), "");
    EXPECT_NE(error(R"({"input_suffix": "b"})").find("'input_prefix' is required"), std::string::npos);
    EXPECT_NE(error(R"({"input_prefix": "a"})").find("'input_suffix' is required"), std::string::npos);
    EXPECT_NE(error(R"({"input_prefix": 1, "input_suffix": "b"})").find("'input_prefix' must be a string"),
              std::string::npos);
    EXPECT_NE(error(R"({"input_prefix": "a", "input_suffix": "b", "prompt": [1, 2]})")
                  .find("'prompt' must be a string"),
              std::string::npos);
    EXPECT_NE(error(R"({"input_prefix": "a", "input_suffix": "b", "input_extra": {}})").find("'input_extra'"),
              std::string::npos);
    EXPECT_NE(error(R"({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "x"}]})")
                  .find("\"text\""),
              std::string::npos);
    EXPECT_NE(
        error(R"({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t", "filename": 3}]})")
            .find("\"filename\""),
        std::string::npos);
    EXPECT_NE(error(R"({"input_prefix": "a", "input_suffix": "b", "n_predict": 0})").find("n_predict"),
              std::string::npos);
    auto r = parse_llama_infill(
        R"({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "t"}], "prompt": "p", "n_predict": 5})");
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE(r->infill);
    EXPECT_EQ(r->infill->prefix, "a");
    EXPECT_EQ(r->infill->suffix, "b");
    ASSERT_EQ(r->infill->extra.size(), 1u);
    EXPECT_EQ(r->infill->extra[0].filename, "tmp");
    EXPECT_EQ(r->prompts.at(0).text, "p");
    EXPECT_EQ(r->max_tokens, 5);
}

// A small random-weight model with StarCoder's vocabulary: it has FIM tokens (its text is noise).
std::string synth_fim_model(const test::TempDir &dir) {
    SynthParams p;
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.n_ff = 96;
    p.n_ctx = 512;
    p.seed = 3;
    p.vocab_from = test::shared_path("vocab/ggml-vocab-starcoder.gguf");
    const std::string path = dir.file("fim.gguf");
    ThreadPool pool(1);
    const Status st = synth_model(p, path, pool);
    EXPECT_TRUE(st.ok()) << st.message();
    return path;
}

// POST /infill answers as /completion does, over the FIM prompt (its tokens_evaluated count the layout);
// greedy, it is what /completion answers for those tokens. Ollama's suffix is the same prompt without the
// extra context; /api/show lists "insert". A model without FIM tokens: 501 with llama-server's message, and
// Ollama's 400.
TEST(InfillServer, InfillAndOllamasSuffixFillTheMiddle) {
    if (!test::shared_exists("vocab/ggml-vocab-starcoder.gguf")) GTEST_SKIP() << "no StarCoder vocabulary";
    test::TempDir dir;
    ServerOptions o;
    o.model_path = synth_fim_model(dir);
    o.n_ctx_slot = 512;
    TestServer s(o);
    auto c = s.client();
    const json body = {{"input_prefix", "def add(a, b):\n    "},
                       {"input_suffix", "\n\nprint(add(1, 2))\n"},
                       {"prompt", "return"},
                       {"n_predict", 6},
                       {"temperature", 0}};
    auto r = post(c, "/infill", body);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    const auto tok = tokenizer_of("vocab/ggml-vocab-starcoder.gguf");
    InfillInput in{body["input_prefix"], body["input_suffix"], {}};
    InfillLimits lim;
    lim.n_ctx = 512;
    lim.n_predict = 6;
    const std::vector<int32_t> ids = infill_prompt(*tok, in, tok->encode("return", false, true), lim);
    EXPECT_EQ(j["tokens_evaluated"], ids.size());
    EXPECT_EQ(j["tokens_predicted"], 6);
    auto same = post(c, "/completion", {{"prompt", ids}, {"n_predict", 6}, {"temperature", 0}});
    ASSERT_TRUE(same);
    ASSERT_EQ(same->status, 200) << same->body;
    EXPECT_EQ(json::parse(same->body)["content"], j["content"]);

    // Ollama: prompt + suffix, no prompt of its own after the prefix.
    auto ol = post(c, "/api/generate",
                   {{"prompt", "def add(a, b):\n    "},
                    {"suffix", "\n\nprint(add(1, 2))\n"},
                    {"stream", false},
                    {"options", {{"temperature", 0}, {"num_predict", 6}}}});
    ASSERT_TRUE(ol);
    ASSERT_EQ(ol->status, 200) << ol->body;
    auto plain = post(c, "/infill",
                      {{"input_prefix", "def add(a, b):\n    "},
                       {"input_suffix", "\n\nprint(add(1, 2))\n"},
                       {"n_predict", 6},
                       {"temperature", 0},
                       {"repeat_penalty", 1.1}});  // Ollama's default
    ASSERT_TRUE(plain);
    ASSERT_EQ(plain->status, 200) << plain->body;
    const json oj = json::parse(ol->body);
    EXPECT_EQ(oj["response"], json::parse(plain->body)["content"]);
    EXPECT_EQ(oj["prompt_eval_count"], json::parse(plain->body)["tokens_evaluated"]);
    auto show = post(c, "/api/show", {{"model", "stories"}});
    ASSERT_TRUE(show);
    EXPECT_EQ(json::parse(show->body)["capabilities"], json::array({"completion", "insert"})) << show->body;

    // OpenAI's suffix on /v1/completions: the same layout (prompt = the text before the cursor), echo gives
    // the prefix back in front.
    auto oa = post(c, "/v1/completions",
                   {{"prompt", "def add(a, b):\n    "},
                    {"suffix", "\n\nprint(add(1, 2))\n"},
                    {"max_tokens", 6},
                    {"temperature", 0},
                    {"echo", true}});
    auto bare = post(c, "/infill",
                     {{"input_prefix", "def add(a, b):\n    "},
                      {"input_suffix", "\n\nprint(add(1, 2))\n"},
                      {"n_predict", 6},
                      {"temperature", 0}});
    ASSERT_TRUE(oa && bare);
    ASSERT_EQ(oa->status, 200) << oa->body;
    const json oaj = json::parse(oa->body);
    const json bj = json::parse(bare->body);
    const std::string want = std::string("def add(a, b):\n    ") + bj["content"].get<std::string>();
    EXPECT_EQ(oaj["choices"][0]["text"], want);
    EXPECT_EQ(oaj["usage"]["prompt_tokens"], bj["tokens_evaluated"]);

    auto bad = post(c, "/infill", {{"input_prefix", "x"}});
    ASSERT_TRUE(bad);
    EXPECT_EQ(bad->status, 400);
    EXPECT_NE(bad->body.find("input_suffix"), std::string::npos) << bad->body;
}

TEST(InfillServer, AModelWithoutFimTokensIsRefused) {
    TestServer s(ServerOptions{});
    auto c = s.client();
    auto r = post(c, "/infill", {{"input_prefix", "a"}, {"input_suffix", "b"}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 501);
    EXPECT_NE(r->body.find("Infill is not supported by this model: prefix token is missing."),
              std::string::npos)
        << r->body;
    auto ol = post(c, "/api/generate", {{"prompt", "a"}, {"suffix", "b"}, {"stream", false}});
    ASSERT_TRUE(ol);
    EXPECT_EQ(ol->status, 400);
    EXPECT_NE(ol->body.find("does not support insert"), std::string::npos) << ol->body;
    auto show = post(c, "/api/show", {{"model", "stories"}});
    ASSERT_TRUE(show);
    EXPECT_EQ(json::parse(show->body)["capabilities"], json::array({"completion"})) << show->body;
    auto oa = post(c, "/v1/completions", {{"prompt", "a"}, {"suffix", "b"}});
    ASSERT_TRUE(oa);
    EXPECT_EQ(oa->status, 501);
    EXPECT_NE(oa->body.find("prefix token is missing"), std::string::npos) << oa->body;
    oa = post(c, "/v1/completions", {{"prompt", {1, 2}}, {"suffix", "b"}});
    ASSERT_TRUE(oa);
    EXPECT_EQ(oa->status, 400);
    EXPECT_NE(oa->body.find("'suffix' needs one prompt given as text"), std::string::npos) << oa->body;
}

}  // namespace
}  // namespace td::server
