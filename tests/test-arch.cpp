// Architectures (src/model/arch/): each one tandem synthesizes runs through the engine and equals a plain,
// independent double-precision forward pass written from the architecture's definition (below), so a
// missing bias, a skipped Q/K norm or the wrong RoPE pairing shows up as wrong logits. Layer ranges give
// bit-identical logits for every architecture. gemma2's soft-caps are set far below the real ones (50, 30)
// so that they bend this small model's scores and logits: a wrong or missing cap shows up too. (Against
// llama.cpp itself, the same synthesized models were checked by hand: see docs/benchmarks.md's notes; that
// binary is not part of the test suite.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "core/thread-pool.h"
#include "gguf/gguf.h"
#include "kernels/activations.h"
#include "model/batch.h"
#include "model/context.h"
#include "model/model.h"
#include "model/synth.h"
#include "test-util.h"

namespace td {
namespace {

struct ArchCase {
    std::string arch;
    int32_t head_dim = 0;  // 0: n_embd / n_head
    int32_t n_swa = 0;     // sliding window, every layer (gemma2: every other layer) (0: off)
};

// Soft-caps of the synthesized gemma2 models: below this model's largest attention scores (~0.1) and logits
// (~0.5), so both caps change the result.
constexpr float kGemma2AttnCap = 0.05f, kGemma2FinalCap = 0.3f;

void PrintTo(const ArchCase &c, std::ostream *os) {
    *os << c.arch << " head_dim " << c.head_dim << " swa " << c.n_swa;
}

std::string synth_arch(const test::TempDir &dir, const ArchCase &c, DType type) {
    SynthParams p;
    p.arch = c.arch;
    p.n_embd = 64;
    p.n_layer = 2;
    p.n_head = 4;
    p.n_head_kv = 2;
    p.head_dim = c.head_dim;
    p.n_swa = c.n_swa;
    p.attn_softcap = kGemma2AttnCap;
    p.final_softcap = kGemma2FinalCap;
    p.n_ff = 96;
    p.n_ctx = 64;
    p.type = type;
    p.seed = 11;
    p.vocab_from = test::shared_path("models/stories260K.gguf");
    const std::string path = dir.file(c.arch + "-swa" + std::to_string(c.n_swa) + ".gguf");
    ThreadPool pool(2);
    const Status st = synth_model(p, path, pool);
    EXPECT_TRUE(st.ok()) << st.message();
    return path;
}

// ---- the plain reference: one token at a time, doubles, f32 weights read straight from the file ----------

struct Plain {
    const gguf::File &f;
    explicit Plain(const gguf::File &file) : f(file) {}

    const float *t(const std::string &name) const {
        const gguf::TensorInfo *ti = f.find_tensor(name);
        return ti ? reinterpret_cast<const float *>(ti->data) : nullptr;
    }
    int64_t key(const std::string &arch, const char *k, int64_t fallback) const {
        auto v = f.get_int_opt(arch + "." + k);
        return v.ok() && v->has_value() ? **v : fallback;
    }
    double key_f(const std::string &arch, const char *k, double fallback) const {
        auto v = f.get_f32_opt(arch + "." + k);
        return v.ok() && v->has_value() ? **v : fallback;
    }
};

// y = W x for W [n_out rows of n_in].
std::vector<double> mat_vec(const float *w, const std::vector<double> &x, int64_t n_out) {
    const int64_t n_in = static_cast<int64_t>(x.size());
    std::vector<double> y(n_out, 0.0);
    for (int64_t o = 0; o < n_out; ++o)
        for (int64_t i = 0; i < n_in; ++i) y[o] += static_cast<double>(w[o * n_in + i]) * x[i];
    return y;
}

void rms_norm(double *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
    const double s = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * s * w[i];
}

// Rotates one head: gpt-neox order pairs (i, i + n/2) when `halves`, else (2i, 2i + 1).
void rope_head(double *x, int32_t n, int32_t pos, bool halves, double base) {
    for (int32_t i = 0; i < n / 2; ++i) {
        const double theta = pos * std::pow(base, -2.0 * i / n);
        const int32_t a = halves ? i : 2 * i, b = halves ? i + n / 2 : 2 * i + 1;
        const double x0 = x[a], x1 = x[b];
        x[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
        x[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
}

// gemma2's soft-capping: c * tanh(x / c).
double softcap(double x, double c) {
    return c * std::tanh(x / c);
}

// Logits [n_tokens][n_vocab] of every prompt position. gemma2 (from its definition, Gemma 2 paper and HF
// modeling_gemma2): queries scaled by query_pre_attn_scalar^-1/2 (head_dim; n_embd / n_head for the 46-layer
// 27B), capped scores, post-attention and post-FFN RMSNorms before the residual adds, a 4096 window (unless
// the file says) on layers 0, 2, 4, ..., capped logits.
std::vector<double> plain_forward(const std::string &path, const std::vector<int32_t> &tokens) {
    auto file = gguf::File::open(path);
    EXPECT_TRUE(file.ok());
    Plain m(*file);
    const std::string arch = *file->get_string("general.architecture");
    const int64_t n_embd = m.key(arch, "embedding_length", 0), n_layer = m.key(arch, "block_count", 0);
    const int64_t n_head = m.key(arch, "attention.head_count", 0);
    const int64_t n_kv_head = m.key(arch, "attention.head_count_kv", n_head);
    const int64_t hd = m.key(arch, "attention.key_length", n_embd / n_head),
                  n_ff = m.key(arch, "feed_forward_length", 0);
    const int64_t n_vocab = m.key(arch, "vocab_size", 0);
    const bool gemma2 = arch == "gemma2";
    const int64_t n_swa = m.key(arch, "attention.sliding_window", gemma2 ? 4096 : 0);
    const bool halves = arch != "llama";
    const bool gemma = arch == "gemma" || gemma2;
    const double attn_cap = m.key_f(arch, "attn_logit_softcapping", 50.0);
    const double final_cap = m.key_f(arch, "final_logit_softcapping", 30.0);
    const double q_scale = 1.0 / std::sqrt(static_cast<double>(n_layer == 46 ? n_embd / n_head : hd));
    const double eps = 1e-5, base = 10000.0;
    const int64_t n_q = n_head * hd, n_kv = n_kv_head * hd;

    std::vector<std::vector<std::vector<double>>> k_cache(n_layer), v_cache(n_layer);  // [layer][pos][n_kv]
    std::vector<double> logits;
    for (size_t pos = 0; pos < tokens.size(); ++pos) {
        const float *e = m.t("token_embd.weight") + static_cast<int64_t>(tokens[pos]) * n_embd;
        std::vector<double> x(e, e + n_embd);
        if (gemma)
            for (double &xi : x) xi *= std::sqrt(static_cast<float>(n_embd));
        for (int64_t il = 0; il < n_layer; ++il) {
            auto name = [il](const char *w) { return "blk." + std::to_string(il) + "." + w; };
            std::vector<double> xn = x;
            rms_norm(xn.data(), m.t(name("attn_norm.weight")), n_embd, eps);
            std::vector<double> q = mat_vec(m.t(name("attn_q.weight")), xn, n_q);
            std::vector<double> k = mat_vec(m.t(name("attn_k.weight")), xn, n_kv);
            std::vector<double> v = mat_vec(m.t(name("attn_v.weight")), xn, n_kv);
            if (const float *bq = m.t(name("attn_q.bias"))) {
                for (int64_t i = 0; i < n_q; ++i) q[i] += bq[i];
                for (int64_t i = 0; i < n_kv; ++i) k[i] += m.t(name("attn_k.bias"))[i];
                for (int64_t i = 0; i < n_kv; ++i) v[i] += m.t(name("attn_v.bias"))[i];
            }
            if (const float *qn = m.t(name("attn_q_norm.weight"))) {
                for (int64_t h = 0; h < n_head; ++h) rms_norm(&q[h * hd], qn, hd, eps);
                for (int64_t h = 0; h < n_kv_head; ++h)
                    rms_norm(&k[h * hd], m.t(name("attn_k_norm.weight")), hd, eps);
            }
            for (int64_t h = 0; h < n_head; ++h) rope_head(&q[h * hd], hd, pos, halves, base);
            for (int64_t h = 0; h < n_kv_head; ++h) rope_head(&k[h * hd], hd, pos, halves, base);
            k_cache[il].push_back(k);
            v_cache[il].push_back(v);
            std::vector<double> attn(n_q, 0.0);
            for (int64_t h = 0; h < n_head; ++h) {
                const int64_t kvh = h / (n_head / n_kv_head);
                // A sliding window of n_swa keys ends at the query's own position.
                const bool window = n_swa > 0 && (!gemma2 || il % 2 == 0);
                const size_t first = window && pos + 1 > static_cast<size_t>(n_swa) ? pos + 1 - n_swa : 0;
                std::vector<double> s(pos + 1, -1e300);
                double mx = -1e300, sum = 0;
                for (size_t j = first; j <= pos; ++j) {
                    double d = 0;
                    for (int64_t i = 0; i < hd; ++i) d += q[h * hd + i] * k_cache[il][j][kvh * hd + i];
                    s[j] = gemma2 ? softcap(d * q_scale, attn_cap) : d / std::sqrt(static_cast<double>(hd));
                    mx = std::max(mx, s[j]);
                }
                for (double &sj : s) sum += (sj = std::exp(sj - mx));  // masked keys give exp(-inf) = 0
                for (size_t j = first; j <= pos; ++j)
                    for (int64_t i = 0; i < hd; ++i)
                        attn[h * hd + i] += s[j] / sum * v_cache[il][j][kvh * hd + i];
            }
            std::vector<double> o = mat_vec(m.t(name("attn_output.weight")), attn, n_embd);
            if (gemma2) rms_norm(o.data(), m.t(name("post_attention_norm.weight")), n_embd, eps);
            for (int64_t i = 0; i < n_embd; ++i) x[i] += o[i];
            xn = x;
            rms_norm(xn.data(), m.t(name("ffn_norm.weight")), n_embd, eps);
            std::vector<double> g = mat_vec(m.t(name("ffn_gate.weight")), xn, n_ff);
            const std::vector<double> u = mat_vec(m.t(name("ffn_up.weight")), xn, n_ff);
            for (int64_t i = 0; i < n_ff; ++i) {
                // Gemma's GELU is taken with llama.cpp's f16 rounding (kernels/activations.h): an exact
                // tanh here would differ by ~1e-3 relative.
                g[i] = gemma ? kernels::gelu_f16_rounded(static_cast<float>(g[i])) * u[i]
                             : g[i] / (1.0 + std::exp(-g[i])) * u[i];
            }
            std::vector<double> d = mat_vec(m.t(name("ffn_down.weight")), g, n_embd);
            if (gemma2) rms_norm(d.data(), m.t(name("post_ffw_norm.weight")), n_embd, eps);
            for (int64_t i = 0; i < n_embd; ++i) x[i] += d[i];
        }
        rms_norm(x.data(), m.t("output_norm.weight"), n_embd, eps);
        const float *out = m.t("output.weight") ? m.t("output.weight") : m.t("token_embd.weight");
        std::vector<double> l = mat_vec(out, x, n_vocab);
        if (gemma2)
            for (double &li : l) li = softcap(li, final_cap);
        logits.insert(logits.end(), l.begin(), l.end());
    }
    return logits;
}

// tandem's logits [n_tokens][n_vocab] for the prompt in one batch, through layer ranges `cuts`.
std::vector<float> engine_forward(const std::string &path, const std::vector<int32_t> &tokens,
                                  const std::vector<int32_t> &cuts, KvType kv_type) {
    ThreadPool pool(2);
    std::vector<std::unique_ptr<Context>> stages;
    for (size_t s = 0; s + 1 < cuts.size(); ++s) {
        ModelLoadOptions lo;
        lo.layer_first = cuts[s];
        lo.layer_last = cuts[s + 1];
        auto m = Model::load(path, lo);
        EXPECT_TRUE(m.ok()) << m.status().message();
        if (!m.ok()) return {};
        ContextParams cp;
        cp.n_ctx = 32;
        cp.type_k = cp.type_v = kv_type;
        auto c = Context::create(*m, cp, pool);
        EXPECT_TRUE(c.ok());
        stages.push_back(std::move(c).value());
    }
    Batch b;
    for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], static_cast<int32_t>(i), 0, true);
    std::vector<float> hidden;
    for (auto &st : stages) {
        EXPECT_TRUE(st->decode(b, hidden.empty() ? nullptr : hidden.data()).ok());
        const int64_t n_embd = st->model().hparams().n_embd;
        if (st->model().layer_last() < st->model().hparams().n_layer)
            hidden.assign(st->hidden(), st->hidden() + b.size() * n_embd);
    }
    const Context &last = *stages.back();
    const size_t n = static_cast<size_t>(last.n_outputs()) * last.model().hparams().n_vocab;
    return std::vector<float>(last.logits(), last.logits() + n);
}

class Arch : public ::testing::TestWithParam<ArchCase> {};

TEST_P(Arch, LoadsWithItsOwnHyperparameters) {
    test::TempDir dir;
    const std::string path = synth_arch(dir, GetParam(), DType::f32);
    auto model = Model::load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    const HParams &hp = (*model)->hparams();
    EXPECT_EQ(hp.arch, GetParam().arch);
    EXPECT_EQ(hp.head_dim, GetParam().head_dim > 0 ? GetParam().head_dim : 16);
    const bool gemma = GetParam().arch == "gemma" || GetParam().arch == "gemma2";
    EXPECT_EQ((*model)->arch().ffn_act, gemma ? FfnAct::gelu : FfnAct::silu);
    EXPECT_EQ(hp.rope_order,
              GetParam().arch == "llama" ? kernels::RopeOrder::adjacent : kernels::RopeOrder::halves);
}

TEST_P(Arch, LogitsEqualAPlainForwardPass) {
    test::TempDir dir;
    const std::string path = synth_arch(dir, GetParam(), DType::f32);
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 300};
    const std::vector<double> want = plain_forward(path, prompt);
    const std::vector<float> got = engine_forward(path, prompt, {0, 2}, KvType::f32);
    ASSERT_EQ(got.size(), want.size());
    double max_err = 0, max_logit = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        max_err = std::max(max_err, std::fabs(got[i] - want[i]));
        max_logit = std::max(max_logit, std::fabs(want[i]));
    }
    // f32 arithmetic against doubles: errors of a few ulps of the logits' size, far below what a wrong
    // operation gives (a missing bias or norm moves logits by ~10% of their size).
    EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_logit)) << "largest logit " << max_logit;
    EXPECT_GT(max_logit, 1e-3) << "degenerate model: all logits ~0";
}

TEST_P(Arch, LayerRangesGiveBitIdenticalLogits) {
    test::TempDir dir;
    const std::string path = synth_arch(dir, GetParam(), DType::q8_0);
    const std::vector<int32_t> prompt = {1, 403, 407, 261};
    const std::vector<float> full = engine_forward(path, prompt, {0, 2}, KvType::f16);
    const std::vector<float> split = engine_forward(path, prompt, {0, 1, 2}, KvType::f16);
    ASSERT_FALSE(full.empty());
    ASSERT_EQ(full, split);
}

INSTANTIATE_TEST_SUITE_P(All, Arch,
                         ::testing::Values(ArchCase{"llama", 0}, ArchCase{"qwen2", 0}, ArchCase{"qwen3", 0},
                                           ArchCase{"qwen3", 32}, ArchCase{"llama", 0, 3},
                                           ArchCase{"qwen2", 0, 2}, ArchCase{"gemma", 0},
                                           ArchCase{"gemma", 32}, ArchCase{"gemma2", 0},
                                           ArchCase{"gemma2", 32, 3}),
                         [](const ::testing::TestParamInfo<ArchCase> &info) {
                             const ArchCase &c = info.param;
                             return c.arch + (c.head_dim ? "_head" + std::to_string(c.head_dim) : "") +
                                    (c.n_swa ? "_swa" + std::to_string(c.n_swa) : "");
                         });

// The window is not ignored: positions the window does not cut equal full attention, later ones differ.
TEST(ArchSlidingWindow, ChangesOnlyPositionsBeyondTheWindow) {
    test::TempDir dir;
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 300};
    const std::vector<float> full =
        engine_forward(synth_arch(dir, {"llama", 0, 0}, DType::f32), prompt, {0, 2}, KvType::f32);
    const std::vector<float> swa =
        engine_forward(synth_arch(dir, {"llama", 0, 3}, DType::f32), prompt, {0, 2}, KvType::f32);
    ASSERT_EQ(full.size(), swa.size());
    const size_t nv = full.size() / prompt.size();
    for (size_t pos = 0; pos < prompt.size(); ++pos) {
        const bool same =
            std::equal(full.begin() + pos * nv, full.begin() + (pos + 1) * nv, swa.begin() + pos * nv);
        EXPECT_EQ(same, pos < 3) << "position " << pos;
    }
}

// gemma2's hyperparameters: the caps from the file, the window on even layers only (4096 when the file has
// none), queries scaled by 1/sqrt(head_dim); and the logits never leave (-cap, cap).
TEST(ArchGemma2, ReadsItsKeysAndCapsTheLogits) {
    test::TempDir dir;
    auto model = Model::load(synth_arch(dir, {"gemma2", 32, 3}, DType::f32));
    ASSERT_TRUE(model.ok()) << model.status().message();
    const HParams &hp = (*model)->hparams();
    EXPECT_EQ(hp.attn_softcap, kGemma2AttnCap);
    EXPECT_EQ(hp.final_softcap, kGemma2FinalCap);
    EXPECT_EQ(hp.n_swa, 3);
    EXPECT_TRUE(hp.layer_is_swa(0));
    EXPECT_FALSE(hp.layer_is_swa(1));
    EXPECT_EQ(hp.attn_q_scale, 1.0f / std::sqrt(32.0f));
    EXPECT_TRUE((*model)->arch().has_post_norms);

    const std::string path = synth_arch(dir, {"gemma2", 0, 0}, DType::f32);
    auto no_window = Model::load(path);
    ASSERT_TRUE(no_window.ok()) << no_window.status().message();
    EXPECT_EQ((*no_window)->hparams().n_swa, 4096);

    const std::vector<float> logits = engine_forward(path, {1, 403, 407, 261}, {0, 2}, KvType::f16);
    ASSERT_FALSE(logits.empty());
    float max_abs = 0;
    for (float l : logits) max_abs = std::max(max_abs, std::fabs(l));
    EXPECT_LE(max_abs, kGemma2FinalCap);
    EXPECT_GT(max_abs, 0.5f * kGemma2FinalCap);  // the cap is reached, not idle
}

// A model without the post-norms gemma2 requires is refused with the tensor's name.
TEST(ArchGemma2, MissingPostNormIsAnError) {
    test::TempDir dir;
    auto src = gguf::File::open(synth_arch(dir, {"gemma2", 0, 0}, DType::f32));
    ASSERT_TRUE(src.ok());
    gguf::Writer w;
    for (const auto &[key, value] : src->metadata()) w.set_value(key, value);
    for (const auto &t : src->tensors())
        if (t.name != "blk.1.post_ffw_norm.weight")
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), t.data, t.n_bytes);
    const std::string path = dir.file("no-post-norm.gguf");
    ASSERT_TRUE(w.write(path).ok());
    auto model = Model::load(path);
    ASSERT_FALSE(model.ok());
    EXPECT_NE(model.status().message().find("blk.1.post_ffw_norm.weight"), std::string::npos)
        << model.status().message();
}

// A batch longer than one micro-batch (Context::kMaxUbatch rows) gives the bits of the same rows sent in
// small batches: the layer loop splits it, and the later part sees the keys the earlier part stored.
TEST(ArchLongBatch, EqualsTheSameRowsInSmallBatches) {
    test::TempDir dir;
    const std::string path = synth_arch(dir, {"qwen2", 0, 0}, DType::q8_0);
    auto model = Model::load(path);
    ASSERT_TRUE(model.ok()) << model.status().message();
    ThreadPool pool(2);
    ContextParams cp;
    cp.n_ctx = 320;
    const int32_t n = 300;  // > kMaxUbatch (256)
    const int32_t nv = (*model)->hparams().n_vocab;
    auto run = [&](int32_t step) {
        auto ctx = Context::create(*model, cp, pool);
        EXPECT_TRUE(ctx.ok());
        std::vector<float> logits;  // [n][n_vocab]
        for (int32_t start = 0; start < n; start += step) {
            Batch b;
            for (int32_t p = start; p < std::min(n, start + step); ++p) b.add((p * 37 + 11) % nv, p, 0, true);
            EXPECT_TRUE((*ctx)->decode(b).ok());
            logits.insert(logits.end(), (*ctx)->logits(),
                          (*ctx)->logits() + static_cast<size_t>(b.size()) * nv);
        }
        return logits;
    };
    const std::vector<float> whole = run(n);
    ASSERT_EQ(whole.size(), static_cast<size_t>(n) * nv);
    EXPECT_TRUE(whole == run(50));
}

TEST(ArchSynth, UnknownArchitectureIsRefused) {
    test::TempDir dir;
    SynthParams p;
    p.arch = "gpt2";
    p.vocab_from = test::shared_path("models/stories260K.gguf");
    ThreadPool pool(1);
    const Status st = synth_model(p, dir.file("x.gguf"), pool);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("gpt2"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace td
