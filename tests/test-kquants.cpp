// K-quants (q2_k .. q6_k, q8_k): ggml's bytes, round-trip error, dot products, ISA agreement, matmul, and
// synthesized K-quant models (including llama.cpp's q4_k_m mix) that load and generate.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "core/thread-pool.h"
#include "gguf/gguf.h"
#include "kernels/blocks.h"
#include "kernels/kernels.h"
#include "model/batch.h"
#include "model/context.h"
#include "model/model.h"
#include "model/synth.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "test-isa.h"
#include "test-util.h"

namespace td {
namespace kernels {
void PrintTo(Isa isa, std::ostream *os) {
    *os << isa_name(isa);
}
}  // namespace kernels

namespace {

using kernels::Isa;
using kernels::kQK_K;
using kernels::TypeKernels;

constexpr DType kKTypes[] = {DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k, DType::q8_k};

uint64_t splitmix64(uint64_t &state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Test data built from exact float operations only (the same bits on every machine and libm), with a
// different character per super-block so every quantizer branch runs: 0 roughly normal, 1 mostly
// positive, 2 small values with large outliers, 3 a zero first half (all-zero groups) and a normal rest,
// 4 all zero, 5 integers in [-8, 8].
std::vector<float> kquant_data(int64_t n, uint64_t seed) {
    std::vector<float> x(static_cast<size_t>(n));
    uint64_t state = seed;
    auto u = [&state] { return static_cast<float>(splitmix64(state) >> 40) * 0x1p-24f; };  // [0, 1)
    for (int64_t i = 0; i < n; ++i) {
        const float g = (u() + u() + u() - 1.5f) * 2.0f;  // mean 0, sd 1
        switch ((i / kQK_K) % 6) {
            case 0:
                x[i] = g;
                break;
            case 1:
                x[i] = 0.5f * g + 1.0f;
                break;
            case 2:
                x[i] = i % 37 == 0 ? 20.0f * g : 0.01f * g;
                break;
            case 3:
                x[i] = i % kQK_K < 128 ? 0.0f : g;
                break;
            case 4:
                x[i] = 0.0f;
                break;
            default:
                x[i] = std::floor(u() * 17.0f) - 8.0f;
                break;
        }
    }
    return x;
}

// Normal-ish data without the special blocks, for error and dot statistics.
std::vector<float> smooth_data(int64_t n, uint64_t seed) {
    std::vector<float> x(static_cast<size_t>(n));
    uint64_t state = seed;
    auto u = [&state] { return static_cast<float>(splitmix64(state) >> 40) * 0x1p-24f; };
    for (float &v : x) v = (u() + u() + u() + u() - 2.0f) * 1.7320508f;  // sd 1
    return x;
}

uint64_t fnv1a(const std::vector<uint8_t> &bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
    return h;
}

const TypeKernels &ref_kernels(DType type) {
    const TypeKernels *k = kernels::type_kernels_ref(type);
    EXPECT_NE(k, nullptr) << dtype_name(type);
    return *k;
}

const TypeKernels &active_kernels(DType type) {
    const TypeKernels *k = kernels::type_kernels(type);
    EXPECT_NE(k, nullptr) << dtype_name(type);
    return *k;
}

std::vector<uint8_t> quantize(const TypeKernels &k, const std::vector<float> &x) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(dtype_row_bytes(k.type, n));
    k.from_float(x.data(), q.data(), n);
    return q;
}

std::vector<float> dequantize(const TypeKernels &k, const std::vector<uint8_t> &q, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    k.to_float(q.data(), x.data(), n);
    return x;
}

// ---- reference bytes
// ----------------------------------------------------------------------------------------

// FNV-1a of the bytes ggml's quantize_row_*_ref (llama.cpp ggml-quants.c, built without FMA like ggml-base)
// writes for kquant_data(6 * 256 * 4, 7): 24 super-blocks, four of each kind. For q8_k, ggml leaves bsums of
// an all-zero block unset; they are taken as 0 here, as tandem writes them.
TEST(KQuantsReference, BytesEqualGgmlReferenceQuantizer) {
    const struct {
        DType type;
        uint64_t hash;
    } expected[] = {
        {DType::q2_k, 0xc7c2beb9d40f1b3aull}, {DType::q3_k, 0xb5bbb58189b4857cull},
        {DType::q4_k, 0x2f7636c861ce9edfull}, {DType::q5_k, 0x9d3ebd1b39f28d26ull},
        {DType::q6_k, 0x3a7fdf774fdb258bull}, {DType::q8_k, 0x54cadec212ae9cdcull},
    };
    const std::vector<float> x = kquant_data(6 * kQK_K * 4, 7);
    for (const auto &e : expected)
        EXPECT_EQ(fnv1a(quantize(ref_kernels(e.type), x)), e.hash)
            << dtype_name(e.type) << " hash 0x" << std::hex << fnv1a(quantize(ref_kernels(e.type), x));
}

// x[e] = e: amax 255, iscale = -127 / 255, so qs[e] = -round(127 e / 255) (never a tie) and d = -255 / 127.
TEST(KQuantsReference, KnownBlockQ8_K) {
    std::vector<float> x(kQK_K);
    for (int e = 0; e < kQK_K; ++e) x[e] = static_cast<float>(e);
    kernels::BlockQ8_K b{};
    ref_kernels(DType::q8_k).from_float(x.data(), &b, kQK_K);
    EXPECT_EQ(b.d, 1.0f / (-127.0f / 255.0f));
    EXPECT_NEAR(b.d, -255.0 / 127.0, 1e-6);
    for (int e = 0; e < kQK_K; ++e)
        ASSERT_EQ(b.qs[e], -static_cast<int>(std::lround(127.0 * e / 255.0))) << "element " << e;
    EXPECT_EQ(b.qs[1], 0);      // 0.498 rounds to 0
    EXPECT_EQ(b.qs[2], -1);     // 0.996
    EXPECT_EQ(b.qs[128], -64);  // 63.75
    EXPECT_EQ(b.qs[255], -127);
    for (int g = 0; g < kQK_K / 16; ++g) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += b.qs[16 * g + i];
        EXPECT_EQ(b.bsums[g], sum) << "group " << g;
    }
    EXPECT_EQ(b.bsums[0], -56);  // -(0 + 0 + 1 + 1 + 2 + 2 + ... + 7 + 7)
}

// x[e] = e % 16: every sub-block spans [0, 15], so make_qkx2_quants finds scale 1, min 0; the 6-bit scales
// are all 63 with d = half(1 / 63) = 0x2410, mins 0, and each element quantizes to itself.
TEST(KQuantsReference, KnownBlockQ4_K) {
    std::vector<float> x(kQK_K);
    for (int e = 0; e < kQK_K; ++e) x[e] = static_cast<float>(e % 16);
    kernels::BlockQ4_K b{};
    ref_kernels(DType::q4_k).from_float(x.data(), &b, kQK_K);
    EXPECT_EQ(b.d, 0x2410);
    EXPECT_EQ(b.dmin, 0);
    const uint8_t scales[12] = {0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0, 0x0F, 0x0F, 0x0F, 0x0F};
    for (int i = 0; i < 12; ++i) EXPECT_EQ(b.scales[i], scales[i]) << "scale byte " << i;
    for (int i = 0; i < kQK_K / 2; ++i) ASSERT_EQ(b.qs[i], 0x11 * (i % 16)) << "qs byte " << i;
    std::vector<float> y(kQK_K);
    ref_kernels(DType::q4_k).to_float(&b, y.data(), kQK_K);
    const float step = fp16_to_fp32(0x2410) * 63.0f;  // 0.99975586
    for (int e = 0; e < kQK_K; ++e) ASSERT_EQ(y[e], step * static_cast<float>(e % 16)) << "element " << e;
}

TEST(KQuantsDispatch, EveryKTypeDotsWithQ8_K) {
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon}) {
        for (DType type : kKTypes) {
            const TypeKernels *k = kernels::type_kernels_for(type, isa);
            ASSERT_NE(k, nullptr) << dtype_name(type);
            EXPECT_EQ(k->vec_dot_type, DType::q8_k);
            EXPECT_TRUE(k->to_float && k->from_float && k->vec_dot);
            EXPECT_TRUE(dtype_traits(type).supported);
        }
    }
}

// ---- per-ISA checks ---------------------------------------------------------------------------------------

class KQuantsIsa : public test::IsaTest {};

// RMS(error) / RMS(x) on smooth_data(8192, 3), measured: q2_k 0.2895, q3_k 0.1454, q4_k 0.0686, q5_k 0.0350,
// q6_k 0.0169, q8_k 0.00615 (d = amax / 127 over 256 values). Bounds ~12% above; each must also stay above a
// quarter of its bound (a quantizer that silently kept more bits, or returned its input, fails).
double round_trip_bound(DType type) {
    switch (type) {
        case DType::q2_k:
            return 0.32;
        case DType::q3_k:
            return 0.163;
        case DType::q4_k:
            return 0.077;
        case DType::q5_k:
            return 0.039;
        case DType::q6_k:
            return 0.019;
        case DType::q8_k:
            return 0.0069;
        default:
            return 0.0;
    }
}

TEST_P(KQuantsIsa, RoundTripErrorWithinBound) {
    const int64_t n = 8192;
    const std::vector<float> x = smooth_data(n, 3);
    for (DType type : kKTypes) {
        const TypeKernels &k = active_kernels(type);
        const std::vector<float> y = dequantize(k, quantize(k, x), n);
        double err2 = 0.0, x2 = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            err2 += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
            x2 += static_cast<double>(x[i]) * x[i];
        }
        const double rel_rms = std::sqrt(err2 / x2);
        EXPECT_LE(rel_rms, round_trip_bound(type)) << dtype_name(type);
        EXPECT_GE(rel_rms, round_trip_bound(type) / 4) << dtype_name(type);
    }
}

TEST_P(KQuantsIsa, FromFloatAndToFloatMatchReferenceBitForBit) {
    for (int64_t n : {kQK_K, 6 * kQK_K, 17 * kQK_K}) {
        const std::vector<float> x = kquant_data(n, 100 + static_cast<uint64_t>(n));
        for (DType type : kKTypes) {
            const std::vector<uint8_t> q_ref = quantize(ref_kernels(type), x);
            const std::vector<uint8_t> q = quantize(active_kernels(type), x);
            EXPECT_EQ(q, q_ref) << dtype_name(type) << " n " << n;
            const std::vector<float> y_ref = dequantize(ref_kernels(type), q_ref, n);
            const std::vector<float> y = dequantize(active_kernels(type), q_ref, n);
            EXPECT_EQ(0, std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(float))) << dtype_name(type);
        }
    }
}

// The q8_k activation quantizer's sign rule: the first element of largest magnitude decides, also when
// +a and -a both occur.
TEST_P(KQuantsIsa, Q8_KTiesTakeTheFirstElement) {
    for (float first : {5.0f, -5.0f}) {
        std::vector<float> x = smooth_data(kQK_K, 9);
        x[40] = first;
        x[200] = -first;
        const std::vector<uint8_t> q = quantize(active_kernels(DType::q8_k), x);
        kernels::BlockQ8_K b;
        std::memcpy(&b, q.data(), sizeof b);
        EXPECT_EQ(b.qs[40], -127);
        EXPECT_EQ(b.qs[200], 127);
        EXPECT_EQ(b.d, 1.0f / (-127.0f / first));
        EXPECT_EQ(q, quantize(ref_kernels(DType::q8_k), x));
    }
}

TEST_P(KQuantsIsa, VecDotMatchesReferenceBitForBitAndExactDot) {
    // 1..8 super-blocks use partial lanes; 17 wraps the 8 lanes twice.
    for (int64_t n : {kQK_K, 3 * kQK_K, 8 * kQK_K, 17 * kQK_K}) {
        const std::vector<float> xf = kquant_data(n, 11 + static_cast<uint64_t>(n));
        const std::vector<float> yf = smooth_data(n, 12 + static_cast<uint64_t>(n));
        const std::vector<uint8_t> yq = quantize(ref_kernels(DType::q8_k), yf);
        const std::vector<float> yd = dequantize(ref_kernels(DType::q8_k), yq, n);
        for (DType type : kKTypes) {
            const std::vector<uint8_t> xq = quantize(ref_kernels(type), xf);
            const std::vector<float> xd = dequantize(ref_kernels(type), xq, n);
            float s_ref = NAN, s = NAN;
            ref_kernels(type).vec_dot(n, &s_ref, xq.data(), yq.data());
            active_kernels(type).vec_dot(n, &s, xq.data(), yq.data());
            EXPECT_EQ(0, std::memcmp(&s, &s_ref, sizeof s))
                << dtype_name(type) << " n " << n << ": " << s << " vs reference " << s_ref;
            // Exact dot of the dequantized values. The kernel rounds d * d_y * sum and dmin * d_y * summ
            // separately; both terms are bounded by sum |y| * (|x| + max |x| of the super-block).
            double exact = 0.0, magnitude = 0.0;
            for (int64_t b = 0; b < n / kQK_K; ++b) {
                double amax = 0.0;
                for (int e = 0; e < kQK_K; ++e) amax = std::max(amax, std::fabs(double{xd[b * kQK_K + e]}));
                for (int64_t i = b * kQK_K; i < (b + 1) * kQK_K; ++i) {
                    exact += static_cast<double>(xd[i]) * yd[i];
                    magnitude += (std::fabs(double{xd[i]}) + amax) * std::fabs(double{yd[i]});
                }
            }
            EXPECT_NEAR(s, exact, 1e-5 * magnitude + 1e-30) << dtype_name(type) << " n " << n;
        }
    }
}

struct Weights {
    std::vector<uint8_t> bytes;  // [n_out, row_bytes]
    TensorView view;
};

TEST_P(KQuantsIsa, MatmulWithKQuantWeights) {
    const int64_t n_in = 3 * kQK_K, n_out = 37, n_tokens = 5;
    ThreadPool pool(3);
    std::vector<uint8_t> scratch;
    const std::vector<float> wf = smooth_data(n_in * n_out, 21);    // [n_out, n_in]
    const std::vector<float> x = smooth_data(n_in * n_tokens, 22);  // [n_tokens, n_in]
    for (DType type : kKTypes) {
        Weights w;
        w.bytes = quantize(ref_kernels(type), wf);
        w.view.name = "w";
        w.view.type = type;
        w.view.n_dims = 2;
        w.view.ne[0] = n_in;
        w.view.ne[1] = n_out;
        w.view.data = w.bytes.data();
        std::vector<float> y(static_cast<size_t>(n_tokens * n_out), NAN);  // [n_tokens, n_out]
        kernels::matmul(w.view, x.data(), y.data(), n_tokens, pool, scratch);
        const std::vector<float> wd = dequantize(ref_kernels(type), w.bytes, n_in * n_out);
        for (int64_t t = 0; t < n_tokens; ++t) {
            const std::vector<float> xt(x.begin() + t * n_in, x.begin() + (t + 1) * n_in);
            const std::vector<uint8_t> xq = quantize(ref_kernels(DType::q8_k), xt);
            for (int64_t o = 0; o < n_out; ++o) {
                // One vec_dot per element, bit for bit; and close to the float product of the weights.
                float s = NAN;
                active_kernels(type).vec_dot(n_in, &s, w.view.row(o), xq.data());
                ASSERT_EQ(0, std::memcmp(&s, &y[t * n_out + o], sizeof s)) << dtype_name(type);
                double exact = 0.0, norm = 0.0;
                for (int64_t i = 0; i < n_in; ++i) {
                    exact += static_cast<double>(wd[o * n_in + i]) * xt[i];
                    norm += std::fabs(static_cast<double>(wd[o * n_in + i]) * xt[i]);
                }
                EXPECT_NEAR(y[t * n_out + o], exact, 0.02 * norm) << dtype_name(type);  // q8_k rounding of x
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KQuantsIsa, ::testing::ValuesIn(test::isas_of_this_arch()),
                         test::isa_param_name);

// ---- synthesized K-quant models ---------------------------------------------------------------------------

SynthParams small_model(const std::string &type) {
    SynthParams sp;
    sp.n_embd = 256;
    sp.n_layer = 2;
    sp.n_head = 4;
    sp.n_head_kv = 2;
    sp.n_ff = 512;
    sp.n_ctx = 64;
    sp.vocab_from = test::shared_path("models/stories260K.gguf");
    EXPECT_TRUE(synth_parse_type(type, sp).ok()) << type;
    return sp;
}

class KQuantsSynth : public ::testing::TestWithParam<const char *> {};

TEST_P(KQuantsSynth, LoadsAndGenerates) {
    if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP();
    test::TempDir dir;
    const std::string path = dir.file("synth.gguf");
    const SynthParams sp = small_model(GetParam());
    ThreadPool pool(2);
    ASSERT_TRUE(synth_model(sp, path, pool).ok());

    auto m = Model::load(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const int32_t n_vocab = (*m)->hparams().n_vocab;
    ASSERT_EQ(n_vocab, 512);
    const gguf::TensorInfo *q = (*m)->file().find_tensor("blk.0.attn_q.weight");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->type, synth_tensor_type(sp, "blk.0.attn_q.weight", 0, q->ne[0]));
    const DType base[] = {sp.type, DType::q3_k, DType::q4_k, DType::q5_k};  // SynthMix order
    EXPECT_EQ(q->type, base[static_cast<int>(sp.mix)]);
    auto ctx = Context::create(*m, {}, pool);
    ASSERT_TRUE(ctx.ok()) << ctx.status().message();

    // Greedy: prefill 3 tokens, then feed back 8 sampled tokens.
    Batch batch;
    for (int32_t i = 0; i < 3; ++i) batch.add(std::vector<int32_t>{1, 403, 407}[i], i, 0, i == 2);
    int32_t pos = 3;
    for (int step = 0; step < 8; ++step) {
        ASSERT_TRUE((*ctx)->decode(batch).ok());
        ASSERT_EQ((*ctx)->n_outputs(), 1);
        const float *logits = (*ctx)->logits();  // [n_vocab]
        int32_t best = 0;
        for (int32_t k = 0; k < n_vocab; ++k) {
            ASSERT_TRUE(std::isfinite(logits[k])) << "step " << step << " token " << k;
            if (logits[k] > logits[best]) best = k;
        }
        batch = Batch{};
        batch.add(best, pos++, 0, true);
    }
}

INSTANTIATE_TEST_SUITE_P(KTypes, KQuantsSynth,
                         ::testing::Values("q2_k", "q3_k", "q4_k", "q5_k", "q6_k", "q3_k_m", "q4_k_m",
                                           "q5_k_m"));

TEST(KQuantsSynthMix, Q4_K_MMixesTypesLikeLlamaCpp) {
    if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP();
    test::TempDir dir;
    const std::string path = dir.file("q4km.gguf");
    SynthParams sp = small_model("Q4_K_M");
    sp.n_layer = 8;  // use_more_bits: layers 0 (first eighth), 3 and 6 (every third), 7 (last eighth)
    ThreadPool pool(2);
    ASSERT_TRUE(synth_model(sp, path, pool).ok());
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    auto type_of = [&](const std::string &name) {
        const gguf::TensorInfo *t = f->find_tensor(name);
        EXPECT_NE(t, nullptr) << name;
        return t != nullptr ? t->type : DType::f32;
    };
    EXPECT_EQ(type_of("output.weight"), DType::q6_k);
    EXPECT_EQ(type_of("token_embd.weight"), DType::q4_k);
    EXPECT_EQ(type_of("output_norm.weight"), DType::f32);
    for (int il = 0; il < 8; ++il) {
        const bool more = il == 0 || il == 3 || il == 6 || il == 7;
        const std::string blk = "blk." + std::to_string(il) + ".";
        EXPECT_EQ(type_of(blk + "attn_q.weight"), DType::q4_k) << il;
        EXPECT_EQ(type_of(blk + "ffn_up.weight"), DType::q4_k) << il;
        EXPECT_EQ(type_of(blk + "attn_v.weight"), more ? DType::q6_k : DType::q4_k) << il;
        EXPECT_EQ(type_of(blk + "ffn_down.weight"), more ? DType::q6_k : DType::q4_k) << il;
    }
    // q5_k_m has the same plan on a q5_k base; a tied output puts q6_k on the token embedding.
    SynthParams q5 = small_model("q5_k_m");
    EXPECT_EQ(synth_tensor_type(q5, "blk.0.attn_q.weight", 0, 256), DType::q5_k);
    EXPECT_EQ(synth_tensor_type(q5, "blk.1.attn_v.weight", 1, 256), DType::q6_k);
    q5.tied_output = true;
    EXPECT_EQ(synth_tensor_type(q5, "token_embd.weight", -1, 256), DType::q6_k);
}

// llama-quantize Q3_K_M's plan for a llama model (llama_tensor_get_type): q3_k, with q6_k output, attn_v
// q5_k in layers 0-1 then q4_k, ffn_down q5_k in the first sixteenth then q4_k, attn_output q4_k.
TEST(KQuantsSynthMix, Q3_K_MMixesTypesLikeLlamaCpp) {
    SynthParams sp;
    ASSERT_TRUE(synth_parse_type("Q3_K_M", sp).ok());
    sp.n_layer = 32;
    EXPECT_EQ(synth_tensor_type(sp, "output.weight", -1, 2048), DType::q6_k);
    EXPECT_EQ(synth_tensor_type(sp, "token_embd.weight", -1, 2048), DType::q3_k);
    for (int il : {0, 1, 2, 31}) {
        const std::string blk = "blk." + std::to_string(il) + ".";
        EXPECT_EQ(synth_tensor_type(sp, blk + "attn_q.weight", il, 2048), DType::q3_k) << il;
        EXPECT_EQ(synth_tensor_type(sp, blk + "attn_k.weight", il, 2048), DType::q3_k) << il;
        EXPECT_EQ(synth_tensor_type(sp, blk + "ffn_gate.weight", il, 2048), DType::q3_k) << il;
        EXPECT_EQ(synth_tensor_type(sp, blk + "ffn_up.weight", il, 2048), DType::q3_k) << il;
        EXPECT_EQ(synth_tensor_type(sp, blk + "attn_output.weight", il, 2048), DType::q4_k) << il;
        EXPECT_EQ(synth_tensor_type(sp, blk + "attn_v.weight", il, 2048), il < 2 ? DType::q5_k : DType::q4_k)
            << il;
        EXPECT_EQ(synth_tensor_type(sp, blk + "ffn_down.weight", il, 5632),
                  il < 2 ? DType::q5_k : DType::q4_k)
            << il;
    }
    sp.tied_output = true;
    EXPECT_EQ(synth_tensor_type(sp, "token_embd.weight", -1, 2048), DType::q6_k);
    // Rows off the super-block: q3_k falls back to q4_0 as in llama.cpp.
    EXPECT_EQ(synth_tensor_type(sp, "blk.5.attn_q.weight", 5, 896), DType::q4_0);
}

TEST(KQuantsSynthMix, Names) {
    SynthParams sp;
    EXPECT_TRUE(synth_parse_type("q6_k", sp).ok());
    EXPECT_EQ(sp.type, DType::q6_k);
    EXPECT_EQ(sp.mix, SynthMix::none);
    const Status bad = synth_parse_type("q4_k_x", sp);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.message().find("q4_k_m"), std::string::npos) << bad.message();
}

// Rows that are not a multiple of 256 (Qwen2.5-0.5B's width 896, here 128) take llama.cpp's fallback types,
// and the model still loads and generates.
TEST(KQuantsSynthMix, RowsOffTheSuperBlockFallBackLikeLlamaCpp) {
    SynthParams k;
    ASSERT_TRUE(synth_parse_type("q4_k_m", k).ok());
    k.n_layer = 8;
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 896), DType::q5_0);
    EXPECT_EQ(synth_tensor_type(k, "blk.0.attn_v.weight", 0, 896), DType::q8_0);  // q6_k's fallback
    EXPECT_EQ(synth_tensor_type(k, "blk.1.ffn_down.weight", 1, 4864), DType::q4_k);
    EXPECT_EQ(synth_tensor_type(k, "output.weight", -1, 896), DType::q8_0);
    ASSERT_TRUE(synth_parse_type("q5_k_m", k).ok());
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 896), DType::q5_1);
    ASSERT_TRUE(synth_parse_type("q3_k", k).ok());
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 896), DType::q4_0);
    ASSERT_TRUE(synth_parse_type("q2_k", k).ok());
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 896), DType::q4_0);
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 48), DType::f16);  // no block type fits
    ASSERT_TRUE(synth_parse_type("q8_0", k).ok());
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 48), DType::f16);
    EXPECT_EQ(synth_tensor_type(k, "blk.1.attn_q.weight", 1, 64), DType::q8_0);

    if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP();
    test::TempDir dir;
    SynthParams s = small_model("q4_k_m");
    s.n_embd = 128;
    s.n_head = 2;
    s.n_head_kv = 1;
    const std::string path = dir.file("fallback.gguf");
    ThreadPool pool(2);
    const Status st = synth_model(s, path, pool);
    ASSERT_TRUE(st.ok()) << st.message();
    auto f = gguf::File::open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->find_tensor("blk.1.attn_q.weight")->type, DType::q5_0);
    EXPECT_EQ(f->find_tensor("blk.1.ffn_down.weight")->type, DType::q6_k);  // last layer; n_ff 512 fits
    EXPECT_EQ(f->find_tensor("output.weight")->type, DType::q8_0);
    auto m = Model::load(path);
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto ctx = Context::create(*m, {}, pool);
    ASSERT_TRUE(ctx.ok()) << ctx.status().message();
    Batch batch;
    for (int32_t i = 0; i < 3; ++i) batch.add(std::vector<int32_t>{1, 403, 407}[i], i, 0, i == 2);
    ASSERT_TRUE((*ctx)->decode(batch).ok());
    for (int32_t k = 0; k < (*m)->hparams().n_vocab; ++k)
        ASSERT_TRUE(std::isfinite((*ctx)->logits()[k])) << k;
}

TEST(KQuantsSynthMix, CliAcceptsMixNames) {
    if (!test::shared_exists("models/stories260K.gguf")) GTEST_SKIP();
    test::TempDir dir;
    const std::string out = dir.file("cli.gguf");
    const auto r = test::run_tandem({"synth", "-o", out, "--dim", "256", "--layers", "1", "--heads", "4",
                                     "--kv-heads", "2", "--ffn", "256", "--type", "q4_k_m", "--vocab-from",
                                     test::shared_path("models/stories260K.gguf")});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto f = gguf::File::open(out);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->find_tensor("output.weight")->type, DType::q6_k);
    const auto bad =
        test::run_tandem({"synth", "-o", dir.file("x.gguf"), "--dim", "64", "--heads", "3", "--type", "q4_k",
                          "--vocab-from", test::shared_path("models/stories260K.gguf")});
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("not a multiple of --heads"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace td
