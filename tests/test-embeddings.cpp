// Embeddings over real loopback HTTP: OpenAI's /v1/embeddings, llama-server's /embedding, Ollama's /api/embed
// and /api/embeddings, on one machine, a 2-worker pipeline and --tp 2, against the hidden states a
// LocalEngine in this process computes for the same tokens.
#include <algorithm>
#include <cmath>

#include "model/engine.h"
#include "server/embeddings.h"
#include "test-server-util.h"

namespace td::server {
namespace {

using namespace test_server;

const std::vector<int32_t> k_a = {1, 403, 407, 338, 401, 396, 385, 403, 300, 412};
const std::vector<int32_t> k_b = {1, 296, 349, 411, 260, 389};

// Each token's final-normed hidden state, computed by a LocalEngine alone.
std::vector<std::vector<float>> token_rows(const std::vector<int32_t> &prompt) {
    auto m = Model::load(test::shared_path(k_model));
    EXPECT_TRUE(m.ok());
    ThreadPool pool(1);
    ContextParams cp;
    cp.n_ctx = 256;
    auto e = LocalEngine::create(std::move(m).value(), cp, pool);
    EXPECT_TRUE(e.ok());
    Batch b;
    for (size_t i = 0; i < prompt.size(); ++i)
        b.add_out(prompt[i], static_cast<int32_t>(i), 0, kOutEmbedding);
    EXPECT_TRUE((*e)->submit(b).ok());
    auto r = (*e)->wait();
    EXPECT_TRUE(r.ok());
    std::vector<std::vector<float>> rows;
    for (const StepOutput &o : *r) rows.push_back(o.embedding);
    return rows;
}

double max_abs(const std::vector<float> &v) {
    double m = 0;
    for (float x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
}

// Equal up to the rounding a layout adds (hidden rows in f16 between stages, partial sums added across
// ranks).
void expect_close(const std::vector<float> &got, const std::vector<float> &want, double rel,
                  const std::string &what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
    EXPECT_LE(worst, rel * max_abs(want)) << what << ": largest difference " << worst;
}

std::vector<float> floats(const json &j) {
    return j.get<std::vector<float>>();
}

double norm2(const std::vector<float> &v) {
    double s = 0;
    for (float x : v) s += static_cast<double>(x) * x;
    return std::sqrt(s);
}

std::vector<float> scaled(std::vector<float> v, double by) {
    for (float &x : v) x = static_cast<float>(x * by);
    return v;
}

class EmbeddingsTest : public ::testing::TestWithParam<Backend> {};

INSTANTIATE_TEST_SUITE_P(Backends, EmbeddingsTest,
                         ::testing::Values(Backend::local, Backend::cluster, Backend::tp),
                         [](const auto &info) { return backend_test_name(info.param); });

// Every token's vector (--pooling none) comes back through the layout as the engine computed it, for several
// inputs at once; with no pooling, OpenAI's and Ollama's endpoints refuse (one vector per input is their
// shape).
TEST_P(EmbeddingsTest, EachTokensHiddenStateComesThroughTheLayout) {
    ServerOptions o;
    o.backend = GetParam();
    o.pooling = Pooling::none;
    TestServer s(o);
    auto c = s.client();
    auto r = post(c, "/embedding", {{"content", {k_a, k_b}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    ASSERT_EQ(j.size(), 2u);
    const double tolerance = GetParam() == Backend::local ? 0.0 : 0.02;
    for (size_t i = 0; i < 2; ++i) {
        const auto &prompt = i == 0 ? k_a : k_b;
        EXPECT_EQ(j[i]["index"], i);
        const std::vector<std::vector<float>> want = token_rows(prompt);
        ASSERT_EQ(j[i]["embedding"].size(), prompt.size());
        for (size_t t = 0; t < prompt.size(); ++t)
            expect_close(floats(j[i]["embedding"][t]), want[t], tolerance,
                         fmt::format("input {} token {}", i, t));
    }
    // Generation still works beside them, on the same slots.
    auto g = post(c, "/v1/completions", {{"prompt", k_a}, {"max_tokens", 4}, {"temperature", 0}});
    ASSERT_TRUE(g);
    EXPECT_EQ(g->status, 200) << g->body;
    auto oai = post(c, "/v1/embeddings", {{"input", "Once upon a time"}});
    ASSERT_TRUE(oai);
    EXPECT_EQ(oai->status, 400) << oai->body;
    auto ollama = post(c, "/api/embed", {{"model", "stories"}, {"input", "Once upon a time"}});
    ASSERT_TRUE(ollama);
    EXPECT_EQ(ollama->status, 400) << ollama->body;
}

// Each pooling makes of the token vectors what llama.cpp's does: their mean, the first, the last.
TEST(Embeddings, EachPoolingPoolsTheTokenVectors) {
    const std::vector<std::vector<float>> rows = token_rows(k_a);
    std::vector<float> mean(rows[0].size(), 0.0f);
    for (const auto &r : rows)
        for (size_t i = 0; i < r.size(); ++i) mean[i] += r[i];
    for (float &x : mean) x /= static_cast<float>(rows.size());
    for (Pooling p : {Pooling::mean, Pooling::cls, Pooling::last}) {
        SCOPED_TRACE(pooling_name(p));
        ServerOptions o;
        o.pooling = p;
        TestServer s(o);
        auto c = s.client();
        auto r = post(c, "/embedding", {{"content", k_a}, {"embd_normalize", -1}});
        ASSERT_TRUE(r);
        ASSERT_EQ(r->status, 200) << r->body;
        const json j = json::parse(r->body);
        ASSERT_EQ(j.size(), 1u);
        ASSERT_EQ(j[0]["embedding"].size(), 1u);
        const std::vector<float> got = floats(j[0]["embedding"][0]);
        if (p == Pooling::mean) {
            expect_close(got, mean, 1e-6, "mean");
        } else {
            EXPECT_EQ(got, p == Pooling::cls ? rows.front() : rows.back());
        }
        // The default normalization is euclidean.
        auto unit = post(c, "/embedding", {{"content", k_a}});
        ASSERT_TRUE(unit);
        expect_close(floats(json::parse(unit->body)[0]["embedding"][0]), scaled(got, 1.0 / norm2(got)), 1e-6,
                     "euclidean");
    }
}

// OpenAI's and Ollama's shapes over one server (last pooling, the default for a model that names none): unit
// vectors in input order, base64, usage, many more inputs than slots and queue places, truncation, errors.
TEST(Embeddings, OpenAiAndOllamaAnswerInTheirShapes) {
    ServerOptions o;
    o.max_queue = 2;
    TestServer s(o);
    auto c = s.client();
    const std::vector<float> last_a = token_rows(k_a).back(), last_b = token_rows(k_b).back();
    const std::vector<float> unit_a = scaled(last_a, 1.0 / norm2(last_a)),
                             unit_b = scaled(last_b, 1.0 / norm2(last_b));

    auto r = post(c, "/v1/embeddings", {{"model", "stories"}, {"input", {k_a, k_b}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    json j = json::parse(r->body);
    EXPECT_EQ(j["object"], "list");
    EXPECT_EQ(j["model"], "stories");
    ASSERT_EQ(j["data"].size(), 2u);
    EXPECT_EQ(j["data"][1]["object"], "embedding");
    EXPECT_EQ(j["data"][1]["index"], 1);
    expect_close(floats(j["data"][0]["embedding"]), unit_a, 1e-6, "a");
    expect_close(floats(j["data"][1]["embedding"]), unit_b, 1e-6, "b");
    EXPECT_EQ(j["usage"]["prompt_tokens"], k_a.size() + k_b.size());
    EXPECT_EQ(j["usage"]["total_tokens"], k_a.size() + k_b.size());

    // base64: the same floats' little-endian bytes (the OpenAI SDKs ask for this by default).
    r = post(c, "/v1/embeddings", {{"input", k_a}, {"encoding_format", "base64"}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    const std::vector<float> f =
        floats(json::parse(post(c, "/v1/embeddings", {{"input", k_a}})->body)["data"][0]["embedding"]);
    EXPECT_EQ(j["data"][0]["embedding"], base64_floats(f));
    EXPECT_EQ(base64_floats({1.0f}), "AACAPw==");
    EXPECT_EQ(base64_floats({1.0f, -2.0f}), "AACAPwAAAMA=");

    // 30 inputs: more than the 4 slots and 2 queue places; each is what it is alone.
    json many = json::array();
    for (int i = 0; i < 30; ++i) many.push_back(i % 2 == 0 ? k_a : k_b);
    r = post(c, "/v1/embeddings", {{"input", many}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    ASSERT_EQ(j["data"].size(), 30u);
    for (int i = 0; i < 30; ++i) {
        EXPECT_EQ(j["data"][i]["index"], i);
        expect_close(floats(j["data"][i]["embedding"]), i % 2 == 0 ? unit_a : unit_b, 1e-6,
                     fmt::format("{}", i));
    }

    // Text is tokenized as a prompt is (BOS first): the same vector as its token ids.
    auto t = post(c, "/tokenize", {{"content", "Once upon a time"}, {"add_special", true}});
    ASSERT_TRUE(t);
    const json ids = json::parse(t->body)["tokens"];
    auto by_text = post(c, "/v1/embeddings", {{"input", "Once upon a time"}});
    auto by_ids = post(c, "/v1/embeddings", {{"input", ids}});
    ASSERT_TRUE(by_text && by_ids);
    EXPECT_EQ(json::parse(by_text->body)["data"][0]["embedding"],
              json::parse(by_ids->body)["data"][0]["embedding"]);

    // Errors.
    for (const json &bad :
         {json{{"input", "x"}, {"model", "other"}}, json{{"input", json::array()}}, json{{"input", 5}},
          json{{"input", {1, 99999}}}, json{{"input", "x"}, {"dimensions", 3}},
          json{{"input", "x"}, {"encoding_format", "hex"}}, json{{"model", "stories"}}}) {
        auto e = post(c, "/v1/embeddings", bad);
        ASSERT_TRUE(e);
        EXPECT_EQ(e->status, bad.contains("model") && bad["model"] == "other" ? 404 : 400) << bad.dump();
        EXPECT_TRUE(json::parse(e->body).contains("error")) << e->body;
    }

    // Ollama: unit vectors, shortened on request; the legacy endpoint gives the vector as it is.
    r = post(c, "/api/embed",
             {{"model", "stories"}, {"input", json::array({"Once upon a time", "The end"})}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    j = json::parse(r->body);
    ASSERT_EQ(j["embeddings"].size(), 2u);
    EXPECT_EQ(j["embeddings"][0], json::parse(by_text->body)["data"][0]["embedding"]);
    EXPECT_EQ(
        j["prompt_eval_count"],
        ids.size() +
            json::parse(post(c, "/tokenize", {{"content", "The end"}, {"add_special", true}})->body)["tokens"]
                .size());
    EXPECT_GT(j["total_duration"].get<int64_t>(), 0);
    r = post(c, "/api/embed", {{"model", "stories"}, {"input", "Once upon a time"}, {"dimensions", 4}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const std::vector<float> short4 = floats(json::parse(r->body)["embeddings"][0]);
    ASSERT_EQ(short4.size(), 4u);
    EXPECT_NEAR(norm2(short4), 1.0, 1e-6);
    r = post(c, "/api/embeddings", {{"model", "stories"}, {"prompt", "Once upon a time"}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    auto raw = post(c, "/embedding", {{"content", "Once upon a time"}, {"embd_normalize", -1}});
    ASSERT_TRUE(raw);
    EXPECT_EQ(json::parse(r->body)["embedding"], json::parse(raw->body)[0]["embedding"][0]);
    r = post(c, "/api/embed", {{"model", "stories"}, {"input", ""}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(json::parse(r->body)["embeddings"], json::array());
    EXPECT_EQ(post(c, "/api/embed", {{"model", "nope"}, {"input", "x"}})->status, 404);

    // An input longer than a slot: Ollama truncates it unless asked not to; OpenAI's endpoint refuses it.
    std::vector<int32_t> long_ids(300, 403);
    long_ids[0] = 1;
    std::string long_text;
    for (int i = 0; i < 300; ++i) long_text += "dog ";
    r = post(c, "/api/embed", {{"model", "stories"}, {"input", long_text}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["prompt_eval_count"], o.n_ctx_slot);
    r = post(c, "/api/embed", {{"model", "stories"}, {"input", long_text}, {"truncate", false}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    r = post(c, "/v1/embeddings", {{"input", long_ids}});
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
    EXPECT_NE(r->body.find("exceeds the context size 256"), std::string::npos) << r->body;
}

// With --max-per-client 2, ten inputs go two at a time: the next wave waits for the client's places.
TEST(Embeddings, AListLongerThanAClientsPlacesGoesInWaves) {
    ServerOptions o;
    o.max_per_client = 2;
    TestServer s(o);
    auto c = s.client();
    const std::vector<float> last_a = token_rows(k_a).back(), last_b = token_rows(k_b).back();
    json many = json::array();
    for (int i = 0; i < 10; ++i) many.push_back(i % 3 == 0 ? k_a : k_b);
    auto r = post(c, "/embedding", {{"content", many}, {"embd_normalize", -1}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json j = json::parse(r->body);
    ASSERT_EQ(j.size(), 10u);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(floats(j[i]["embedding"][0]), i % 3 == 0 ? last_a : last_b) << i;
}

// `tandem embed` prints what /v1/embeddings answers (JSON), or a line per vector; with no pooling, one per
// token.
TEST(Embeddings, TheEmbedCommandPrintsTheServersVectors) {
    TestServer s;
    auto c = s.client();
    auto r = post(c, "/v1/embeddings", {{"input", {"Once upon a time", "The end"}}});
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    const json served = json::parse(r->body);
    const std::string model = test::shared_path(k_model);
    test::ProcessResult p =
        test::run_tandem({"embed", "-m", model, "-t", "1", "-p", "Once upon a time", "-p", "The end"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    const json printed = json::parse(p.out);
    ASSERT_EQ(printed["data"].size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
        EXPECT_EQ(printed["data"][i]["index"], i);
        expect_close(floats(printed["data"][i]["embedding"]), floats(served["data"][i]["embedding"]), 1e-5,
                     fmt::format("input {}", i));
    }
    p = test::run_tandem(
        {"embed", "-m", model, "-t", "1", "--pooling", "none", "--format", "text", "-p", "Once upon a time"});
    ASSERT_EQ(p.exit_code, 0) << p.err;
    auto t = post(c, "/tokenize", {{"content", "Once upon a time"}, {"add_special", true}});
    ASSERT_TRUE(t);
    const size_t n_tokens = json::parse(t->body)["tokens"].size();
    EXPECT_EQ(static_cast<size_t>(std::count(p.out.begin(), p.out.end(), '\n')), n_tokens) << p.out;
    EXPECT_EQ(p.out.rfind("embedding 0 token 0:", 0), 0u) << p.out;
    p = test::run_tandem({"embed", "-m", model});
    EXPECT_NE(p.exit_code, 0);
    EXPECT_NE(p.err.find("nothing to embed"), std::string::npos) << p.err;
}

TEST(Embeddings, NormalizationsAreLlamaCpps) {
    std::vector<float> v = {3.0f, -4.0f};
    normalize_embedding(v, 2);
    EXPECT_FLOAT_EQ(v[0], 0.6f);
    EXPECT_FLOAT_EQ(v[1], -0.8f);
    v = {3.0f, -4.0f};
    normalize_embedding(v, 1);  // taxicab
    EXPECT_FLOAT_EQ(v[0], 3.0f / 7.0f);
    v = {3.0f, -4.0f};
    normalize_embedding(v, 0);  // largest magnitude 32760
    EXPECT_FLOAT_EQ(v[1], -32760.0f);
    v = {3.0f, -4.0f};
    normalize_embedding(v, -1);
    EXPECT_FLOAT_EQ(v[1], -4.0f);
    v = {0.0f, 0.0f};
    normalize_embedding(v, 2);
    EXPECT_EQ(v[0], 0.0f);
}

}  // namespace
}  // namespace td::server
