// Perplexity (model/perplexity.h, `tandem perplexity`): the chunked scoring llama-perplexity does, checked
// against each chunk's logits computed alone, and the command on one machine, a 2-worker pipeline and --tp 2.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/engine.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "test-child-process.h"
#include "test-util.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace td {
namespace {

const std::string kModel = "models/stories260K.gguf";

// A story in the model's own domain (TinyStories), long enough for several chunks of 64 tokens.
const std::string kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her "
    "friends. One day, she saw a big, red ball under a tree. She wanted to play with it, but it was too "
    "high. "
    "Lily asked her mom for help. Her mom smiled and said, \"Let's get it together.\" They went to the tree "
    "and "
    "her mom took the ball down. Lily was very happy. She said thank you to her mom and ran to play with her "
    "friends. They played all day until the sun went down. When it was time to go home, Lily gave her mom a "
    "big hug. She said, \"I love you, mom.\" Her mom hugged her back and they walked home together. The next "
    "day, Lily saw a little dog in the park. The dog was sad because it was lost. Lily wanted to help the "
    "dog "
    "find its home. She looked around and saw a boy who was crying. The boy said, \"My dog is lost!\" Lily "
    "smiled and showed him the dog. The boy was so happy. He gave Lily a big hug and said thank you.";

struct Loaded {
    std::shared_ptr<const Model> model;
    std::vector<int32_t> tokens;
    int32_t bos = -1;
};

Loaded load(const std::string &text) {
    Loaded l;
    auto m = Model::load(test::shared_path(kModel));
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (!m.ok()) return l;
    l.model = std::move(m).value();
    auto v = Vocab::from_gguf(l.model->file());
    EXPECT_TRUE(v.ok());
    if (!v.ok()) return l;
    auto vocab = std::make_shared<const Vocab>(std::move(v).value());
    auto tok = Tokenizer::create(vocab);
    EXPECT_TRUE(tok.ok());
    if (!tok.ok()) return l;
    l.tokens = (*tok)->encode(text, vocab->add_bos(), false);
    l.bos = vocab->bos();
    return l;
}

std::unique_ptr<LocalEngine> engine_for(const Loaded &l, ThreadPool &pool, int32_t n_ctx, int32_t n_seq) {
    ContextParams cp;
    cp.n_ctx = n_ctx;
    cp.n_seq = n_seq;
    auto e = LocalEngine::create(l.model, cp, pool);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(e).value() : nullptr;
}

// The reference: each chunk alone, every position's logits, the NLL of the chunk's second half in long
// double.
struct Reference {
    long double nll = 0;
    int64_t scored = 0;
};

Reference reference(const Loaded &l, int32_t n_ctx, int32_t n_chunks) {
    ThreadPool pool(1);
    Reference r;
    for (int32_t c = 0; c < n_chunks; ++c) {
        auto e = engine_for(l, pool, n_ctx, 1);
        if (!e) return r;
        EXPECT_TRUE(e->seq_start(0, SamplerParams{}, true).ok());
        Batch b;
        for (int32_t p = 0; p < n_ctx; ++p)
            b.add(p == 0 ? l.bos : l.tokens[static_cast<size_t>(c * n_ctx + p)], p, 0, true);
        EXPECT_TRUE(e->submit(b).ok());
        auto outs = e->wait();
        EXPECT_TRUE(outs.ok());
        if (!outs.ok()) return r;
        EXPECT_EQ(outs->size(), static_cast<size_t>(n_ctx));
        for (int32_t p = n_ctx / 2; p + 1 < n_ctx; ++p) {
            const std::vector<float> &row = (*outs)[static_cast<size_t>(p)].logits;
            long double sum = 0;
            for (float x : row) sum += std::exp(static_cast<long double>(x));
            const int32_t next = l.tokens[static_cast<size_t>(c * n_ctx + p + 1)];
            r.nll += std::log(sum) - static_cast<long double>(row[static_cast<size_t>(next)]);
            ++r.scored;
        }
    }
    return r;
}

// Chunks side by side in 3 slots, steps cut across chunk boundaries (batch 50), each scored token a score row
// the engine rates: the same NLL as each chunk's logits computed alone give, the running totals once per
// chunk in order.
TEST(Perplexity, EqualsEachChunkScoredAlone) {
    const Loaded l = load(kStory);
    ASSERT_NE(l.model, nullptr);
    const int32_t n_ctx = 64;
    const int32_t n_chunks = static_cast<int32_t>(l.tokens.size()) / n_ctx;
    ASSERT_GE(n_chunks, 4) << l.tokens.size();
    const Reference ref = reference(l, n_ctx, n_chunks);
    ASSERT_EQ(ref.scored, static_cast<int64_t>(n_chunks) * (n_ctx - 1 - n_ctx / 2));

    ThreadPool pool(1);
    auto e = engine_for(l, pool, n_ctx, 3);
    ASSERT_NE(e, nullptr);
    PerplexityParams pp;
    pp.n_ctx = n_ctx;
    pp.n_batch = 50;
    pp.bos = l.bos;
    std::vector<int32_t> seen;
    std::vector<double> running;
    auto r = perplexity(*e, l.tokens, pp, [&](int32_t chunk, const PerplexityResult &so_far) {
        seen.push_back(chunk);
        running.push_back(so_far.ppl());
        EXPECT_EQ(so_far.n_chunks, chunk + 1);
    });
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->n_chunks, n_chunks);
    EXPECT_EQ(r->n_scored, ref.scored);
    EXPECT_NEAR(r->nll_sum, static_cast<double>(ref.nll), 1e-6 * static_cast<double>(ref.nll));
    EXPECT_NEAR(r->ppl(), std::exp(static_cast<double>(ref.nll) / ref.scored), 1e-6 * r->ppl());
    ASSERT_EQ(seen.size(), static_cast<size_t>(n_chunks));
    for (int32_t c = 0; c < n_chunks; ++c) EXPECT_EQ(seen[static_cast<size_t>(c)], c);
    EXPECT_DOUBLE_EQ(running.back(), r->ppl());
    // A real model on text of its own kind: far better than chance (512 tokens), and better than the same
    // tokens backwards (an NLL taken against the wrong position would not tell them apart).
    EXPECT_LT(r->ppl(), 40.0);
    Loaded backwards = l;
    std::reverse(backwards.tokens.begin() + 1, backwards.tokens.end());
    auto rb = perplexity(*e, backwards.tokens, pp);
    ASSERT_TRUE(rb.ok());
    EXPECT_GT(rb->ppl(), 2.0 * r->ppl());

    // At most two chunks, one step per chunk, one slot: the first two chunks of the same NLLs.
    auto e1 = engine_for(l, pool, n_ctx, 1);
    ASSERT_NE(e1, nullptr);
    pp.n_chunks = 2;
    pp.n_batch = 2048;
    auto r2 = perplexity(*e1, l.tokens, pp);
    ASSERT_TRUE(r2.ok());
    EXPECT_EQ(r2->n_chunks, 2);
    EXPECT_NEAR(r2->ppl(), running[1], 1e-6 * running[1]);
}

TEST(Perplexity, ErrorIsLlamaCppsStandardErrorOfTheMean) {
    PerplexityResult r;
    EXPECT_EQ(r.ppl(), 0.0);
    EXPECT_EQ(r.ppl_error(), 0.0);
    // NLLs 1, 2, 3: mean 2, population variance 2/3, standard error sqrt((2/3) / 2).
    r.n_scored = 3;
    r.nll_sum = 6.0;
    r.nll2_sum = 14.0;
    EXPECT_NEAR(r.ppl(), std::exp(2.0), 1e-12);
    EXPECT_NEAR(r.ppl_error(), std::sqrt(1.0 / 3.0) * std::exp(2.0), 1e-12);
}

TEST(Perplexity, RefusesWhatItCannotScore) {
    const Loaded l = load(kStory);
    ASSERT_NE(l.model, nullptr);
    ThreadPool pool(1);
    auto e = engine_for(l, pool, 64, 2);
    ASSERT_NE(e, nullptr);
    PerplexityParams pp;
    pp.n_ctx = 64;
    const auto refused = [&](std::span<const int32_t> tokens, const std::string &why) {
        auto r = perplexity(*e, tokens, pp);
        ASSERT_FALSE(r.ok()) << why;
        EXPECT_EQ(r.status().kind(), ErrorKind::invalid_input) << why;
        EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
    };
    refused(std::span(l.tokens).first(63), "less than one chunk of 64");
    std::vector<int32_t> bad = l.tokens;
    bad[70] = 512;
    refused(bad, "token 70 (id 512) is outside the vocabulary");
    pp.n_ctx = 128;
    refused(l.tokens, "do not fit the context of 64");
    pp.n_ctx = 3;
    refused(l.tokens, "at least 4 tokens");
    pp.n_ctx = 64;
    pp.n_chunks = 0;
    refused(l.tokens, "-1 (all) or at least 1");
    pp.n_chunks = -1;
    pp.bos = 600;
    refused(l.tokens, "BOS id 600");
}

nlohmann::json run_json(std::vector<std::string> args) {
    test::ProcessResult p = test::run_tandem(args);
    EXPECT_EQ(p.exit_code, 0) << p.err;
    try {
        return nlohmann::json::parse(p.out);
    } catch (const std::exception &ex) {
        ADD_FAILURE() << ex.what() << ": " << p.out << p.err;
        return {};
    }
}

// `tandem perplexity` prints llama-perplexity's lines, and gives one machine's perplexity through a pipeline
// (f32 wire: the same numbers) and --tp 2 (partial sums added across ranks: the same up to rounding).
TEST(Perplexity, TheCommandScoresAlikeOnEveryLayout) {
    test::TempDir dir;
    const std::string text = dir.file("story.txt");
    std::ofstream(text) << kStory << "\n" << kStory << "\n";
    const std::string model = test::shared_path(kModel);
    const std::vector<std::string> base = {"perplexity", "-m", model, "-f", text, "-c", "64", "-t", "1"};

    test::ProcessResult p = test::run_tandem(base);
    ASSERT_EQ(p.exit_code, 0) << p.err;
    EXPECT_EQ(p.out.rfind("[1]", 0), 0u) << p.out;
    EXPECT_NE(p.out.find(",[2]"), std::string::npos) << p.out;
    EXPECT_NE(p.out.find("\nFinal estimate: PPL = "), std::string::npos) << p.out;
    EXPECT_NE(p.err.find("scored per chunk"), std::string::npos) << p.err;

    std::vector<std::string> args = base;
    args.push_back("--json");
    const nlohmann::json local = run_json(args);
    ASSERT_TRUE(local.contains("ppl"));
    const int64_t chunks = local["chunks"].get<int64_t>();
    EXPECT_EQ(chunks, local["tokens"].get<int64_t>() / 64);
    EXPECT_EQ(local["scored"].get<int64_t>(), chunks * 31);
    EXPECT_EQ(local["chunk_ppl"].size(), static_cast<size_t>(chunks));
    EXPECT_DOUBLE_EQ(local["chunk_ppl"].back().get<double>(), local["ppl"].get<double>());
    EXPECT_GT(local["ppl_error"].get<double>(), 0.0);
    const double ppl = local["ppl"].get<double>();

    test::WorkerProcess w1(dir.file("w1")), w2(dir.file("w2"));
    ASSERT_TRUE(w1.running() && w2.running());
    const std::string workers = w1.address() + "," + w2.address();
    std::vector<std::string> pipe = args;
    pipe.insert(pipe.end(), {"--workers", workers, "--wire", "f32"});
    const nlohmann::json piped = run_json(pipe);
    ASSERT_TRUE(piped.contains("ppl"));
    EXPECT_NEAR(piped["ppl"].get<double>(), ppl, 1e-5 * ppl);
    EXPECT_EQ(piped["scored"], local["scored"]);

    std::vector<std::string> tp = args;
    tp.insert(tp.end(), {"--workers", workers, "--tp", "2"});
    const nlohmann::json split = run_json(tp);
    ASSERT_TRUE(split.contains("ppl"));
    EXPECT_NEAR(split["ppl"].get<double>(), ppl, 1e-3 * ppl);

    // At most 2 chunks; a text shorter than a chunk is refused with the sizes.
    args.insert(args.end(), {"--chunks", "2"});
    EXPECT_EQ(run_json(args)["chunks"], 2);
    p = test::run_tandem({"perplexity", "-m", model, "-p", "Once upon a time", "-c", "64"});
    EXPECT_EQ(p.exit_code, 1);
    EXPECT_NE(p.err.find("less than one chunk of 64"), std::string::npos) << p.err;
}

}  // namespace
}  // namespace td
