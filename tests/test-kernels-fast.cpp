// The fast paths against the scalar reference, bit for bit: matmul's tile kernels (every shape a tile can
// be cut into: rows and tokens not multiples of the tile, block counts not multiples of 8) at several thread
// counts, and the vectorised attention. Each check runs once per ISA this build and CPU have.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread-pool.h"
#include "kernels/kernels.h"
#include "kernels/ops.h"
#include "kernels/ref/ops-ref.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/tensor.h"
#include "test-isa.h"

namespace td {
namespace {

using kernels::Isa;
using kernels::TypeKernels;
using test::matmul_ref;
using test::quantize_rows;
using test::randn;
using test::weight_view;

class KernelsFast : public test::IsaTest {};

// Every (row, token) of matmul equals the reference's single vec_dot, for tile remainders in both
// directions, block counts below, at and above multiples of 8, and any thread count. The q4_0/q5_0/q8_0
// kernels cut rows into panels of 8 or 16-row vectors (1 or 2 per panel: 19 and 40 rows give full and partial
// panels) and tokens into tiles of 4 or 8 (9 and 17 tokens leave remainders).
TEST_P(KernelsFast, MatmulEqualsReferenceBitForBit) {
    const DType types[] = {DType::q4_0, DType::q5_0, DType::q4_1, DType::q5_1,
                           DType::q8_0, DType::f16,  DType::f32};
    const int64_t lengths[] = {32, 96, 256, 288, 4096};  // 1, 3, 8, 9, 128 blocks
    const int64_t outs[] = {1, 5, 19, 40};
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
    std::vector<uint8_t> scratch;
    for (DType type : types) {
        for (int64_t n_in : lengths) {
            for (int64_t n_out : outs) {
                std::vector<float> wf = randn(n_in * n_out, static_cast<uint32_t>(n_in + n_out), 0.5f);
                std::vector<uint8_t> w = quantize_rows(type, wf, n_out, n_in);
                // A q8_0 weight of -128 (ggml's quantizer never writes it, a file may hold it) must work.
                if (type == DType::q8_0) w[2 + 5] = 0x80;  // row 0, block 0, element 5
                // ... and in a row of a panel's second vector (rows 16..31; element 30 of its last block).
                if (type == DType::q8_0 && n_out > 17) {
                    const size_t row17_end = 18 * w.size() / static_cast<size_t>(n_out);
                    w[row17_end - 34 + 2 + 30] = 0x80;  // a q8_0 block is 34 bytes: d, then qs
                }
                const TensorView tv = weight_view(type, w, n_in, n_out);
                for (int64_t n_tokens : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}) {
                    if ((n_in == 4096 || n_out == 40) && n_tokens % 4 != 1) continue;  // keep the test cheap
                    const std::vector<float> x =
                        randn(n_in * n_tokens, static_cast<uint32_t>(7 * n_tokens), 2.0f);
                    const std::vector<float> want = matmul_ref(type, w, x, n_in, n_out, n_tokens);
                    for (ThreadPool &pool : pools) {
                        std::vector<float> y(want.size(), NAN);
                        kernels::matmul(tv, x.data(), y.data(), n_tokens, pool, scratch);
                        ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
                            << dtype_name(type) << " n_in " << n_in << " n_out " << n_out << " n_tokens "
                            << n_tokens << " threads " << pool.n_threads();
                    }
                }
            }
        }
    }
}

// A token's outputs do not depend on the batch it came in: row t of a batched matmul equals a matmul of
// token t alone (tile path vs the single-token path).
TEST_P(KernelsFast, MatmulBatchedEqualsSeparate) {
    const int64_t n_in = 512, n_out = 37, n_tokens = 11;
    ThreadPool pool(2);
    std::vector<uint8_t> scratch;
    for (DType type : {DType::q4_0, DType::q8_0}) {
        const std::vector<uint8_t> w = quantize_rows(type, randn(n_in * n_out, 11), n_out, n_in);
        const TensorView tv = weight_view(type, w, n_in, n_out);
        const std::vector<float> x = randn(n_in * n_tokens, 12);
        std::vector<float> y(static_cast<size_t>(n_out * n_tokens));
        kernels::matmul(tv, x.data(), y.data(), n_tokens, pool, scratch);
        for (int64_t t = 0; t < n_tokens; ++t) {
            std::vector<float> y1(static_cast<size_t>(n_out));
            kernels::matmul(tv, x.data() + t * n_in, y1.data(), 1, pool, scratch);
            ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + t * n_out, y1.size() * sizeof(float)))
                << dtype_name(type) << " token " << t;
        }
    }
}

// K/V rows of an f16 or f32 cache, with a stride wider than the head: [n_kv][stride].
std::vector<uint8_t> kv_rows(const std::vector<float> &v, bool f16) {
    if (!f16) {
        std::vector<uint8_t> out(v.size() * sizeof(float));
        std::memcpy(out.data(), v.data(), out.size());
        return out;
    }
    std::vector<uint8_t> out(v.size() * sizeof(uint16_t));
    for (size_t i = 0; i < v.size(); ++i) {
        const uint16_t h = fp32_to_fp16(v[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
    }
    return out;
}

// K and V rows of n_kv positions (stride elements each, head_dim of them used) in the cache's type. The keys
// grow along the positions, so the running max moves often (the accumulator rescale path).
struct KvRows {
    std::vector<uint8_t> k, v;
};
KvRows make_kv_rows(int64_t stride, int32_t head_dim, int32_t n_kv, uint32_t seed, bool f16) {
    std::vector<float> kf = randn(stride * n_kv, seed + 1);
    for (int32_t j = 0; j < n_kv; ++j)
        for (int32_t d = 0; d < head_dim; ++d) kf[j * stride + d] *= 1.0f + 0.05f * static_cast<float>(j % 7);
    return {kv_rows(kf, f16), kv_rows(randn(stride * n_kv, seed + 2, 3.0f), f16)};
}

// With and without gemma2's logit soft-capping (a cap of 2 bends most of these scores).
TEST_P(KernelsFast, AttentionHeadEqualsReferenceBitForBit) {
    const int32_t head_dims[] = {8, 64, 100, 128};
    const int32_t n_kvs[] = {1, 2, 3, 5, 8, 17, 130};
    for (int variant = 0; variant < 4; ++variant) {
        const bool f16 = variant < 2;
        const float softcap = variant % 2 == 0 ? 0.0f : 2.0f;
        for (int32_t head_dim : head_dims) {
            const int64_t stride = head_dim + 24;
            for (int32_t n_kv : n_kvs) {
                const uint32_t seed = static_cast<uint32_t>(head_dim * 1000 + n_kv);
                const std::vector<float> q = randn(head_dim, seed, 2.0f);
                const auto [k, v] = make_kv_rows(stride, head_dim, n_kv, seed, f16);
                const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
                std::vector<float> scores(2 * static_cast<size_t>(n_kv));
                std::vector<float> want(static_cast<size_t>(head_dim)),
                    got(static_cast<size_t>(head_dim), NAN);
                kernels::ref::attention_head(q.data(), k.data(), v.data(), f16, stride, head_dim, n_kv, scale,
                                             softcap, scores.data(), want.data());
                kernels::attention_head(q.data(), k.data(), v.data(), f16, stride, head_dim, n_kv, scale,
                                        softcap, scores.data(), got.data());
                ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                    << (f16 ? "f16" : "f32") << " head_dim " << head_dim << " n_kv " << n_kv << " softcap "
                    << softcap;
            }
        }
    }
}

// Grouped-query attention: every head of a group gives the reference's single-head result bit for bit, for
// the head sizes with a register kernel (64, 128, 256) and others, whole and partial blocks of heads.
TEST_P(KernelsFast, AttentionGroupEqualsReferenceBitForBit) {
    const int32_t head_dims[] = {8, 64, 100, 128, 256};
    const int32_t n_qs[] = {1, 2, 3, 4, 5, 8};
    const int32_t n_kvs[] = {1, 3, 17, 130};
    for (int variant = 0; variant < 4; ++variant) {
        const bool f16 = variant < 2;
        const float softcap = variant % 2 == 0 ? 0.0f : 2.0f;
        for (int32_t head_dim : head_dims) {
            const int64_t stride = head_dim * 2 + 16;  // a K/V row holds other heads too
            for (int32_t n_q : n_qs) {
                for (int32_t n_kv : n_kvs) {
                    const uint32_t seed = static_cast<uint32_t>(head_dim * 7919 + n_q * 101 + n_kv);
                    const std::vector<float> q = randn(static_cast<size_t>(n_q) * head_dim, seed, 2.0f);
                    const auto [k, v] = make_kv_rows(stride, head_dim, n_kv, seed, f16);
                    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
                    std::vector<float> scores(2 * static_cast<size_t>(n_q) * n_kv);
                    std::vector<float> want(static_cast<size_t>(n_q) * head_dim),
                        got(static_cast<size_t>(n_q) * head_dim, NAN);
                    for (int32_t g = 0; g < n_q; ++g)
                        kernels::ref::attention_head(&q[g * head_dim], k.data(), v.data(), f16, stride,
                                                     head_dim, n_kv, scale, softcap, scores.data(),
                                                     &want[g * head_dim]);
                    kernels::attention_group(q.data(), n_q, k.data(), v.data(), f16, stride, head_dim, n_kv,
                                             scale, softcap, scores.data(), got.data());
                    ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                        << (f16 ? "f16" : "f32") << " head_dim " << head_dim << " n_q " << n_q << " n_kv "
                        << n_kv << " softcap " << softcap;
                }
            }
        }
    }
}

// Soft-capping (gemma2) against the formula in doubles: s_j = c * tanh(scale * q.k_j / c), then the softmax.
// The scores here reach ~8 and the cap is 1.5, so an uncapped or wrongly capped softmax is far off.
TEST_P(KernelsFast, AttentionHeadSoftcapEqualsTheFormula) {
    const int32_t head_dim = 16, n_kv = 7;
    const std::vector<float> q = randn(head_dim, 5, 2.0f), k = randn(head_dim * n_kv, 6, 2.0f),
                             v = randn(head_dim * n_kv, 7);
    const float scale = 0.25f, cap = 1.5f;
    std::vector<double> s(n_kv);
    double mx = -1e300, sum = 0;
    for (int32_t j = 0; j < n_kv; ++j) {
        double dot = 0;
        for (int32_t d = 0; d < head_dim; ++d) dot += static_cast<double>(q[d]) * k[j * head_dim + d];
        s[j] = cap * std::tanh(scale * dot / cap);
        mx = std::max(mx, s[j]);
    }
    for (double &sj : s) sum += (sj = std::exp(sj - mx));
    std::vector<float> got(head_dim), scores(2 * n_kv);
    kernels::attention_head(q.data(), k.data(), v.data(), false, head_dim, head_dim, n_kv, scale, cap,
                            scores.data(), got.data());
    for (int32_t d = 0; d < head_dim; ++d) {
        double want = 0;
        for (int32_t j = 0; j < n_kv; ++j) want += s[j] / sum * v[j * head_dim + d];
        EXPECT_NEAR(got[d], want, 1e-5) << "d " << d;
    }
}

// The f32 dot (f32 matmuls, attention over an f32 cache) and the f16 dot (f16 weights) in the reference's
// lane orders, tails included.
TEST_P(KernelsFast, VecDotF32AndF16EqualReferenceBitForBit) {
    for (DType type : {DType::f32, DType::f16}) {
        const TypeKernels *k = kernels::type_kernels(type);
        const TypeKernels *r = kernels::type_kernels_ref(type);
        for (int64_t n : {1, 7, 8, 33, 64, 100, 172, 2048, 2049}) {
            const std::vector<uint8_t> x =
                test::quantize_rows(type, randn(n, static_cast<uint32_t>(n)), 1, n);
            const std::vector<uint8_t> y =
                test::quantize_rows(type, randn(n, static_cast<uint32_t>(n + 1)), 1, n);
            float s = NAN, s_ref = NAN;
            k->vec_dot(n, &s, x.data(), y.data());
            r->vec_dot(n, &s_ref, x.data(), y.data());
            ASSERT_EQ(0, std::memcmp(&s, &s_ref, sizeof(float)))
                << dtype_name(type) << " n " << n << ": " << s << " vs " << s_ref;
        }
    }
}

// SwiGLU over one row: the polynomial e^x in groups of 16 and libm for the rest, including the lanes where
// e^x leaves the normal range (|x| > 87), saturates, or sees infinities and NaN.
TEST_P(KernelsFast, SwigluEqualsReferenceBitForBit) {
    const float specials[] = {0.0f,   -0.0f,  87.0f,   -87.0f, 88.5f,   -88.5f,   100.0f,    -100.0f,
                              -104.f, 133.0f, -140.0f, 200.0f, -200.0f, INFINITY, -INFINITY, NAN};
    for (int64_t n : {1, 15, 16, 17, 172, 5632}) {
        std::vector<float> gate = randn(n, static_cast<uint32_t>(n), 4.0f);
        const std::vector<float> up = randn(n, static_cast<uint32_t>(n + 1));
        for (size_t i = 0; i < std::size(specials) && 3 * i < gate.size(); ++i) gate[3 * i] = specials[i];
        std::vector<float> want(gate.size()), got(gate.size(), 1.0f);
        kernels::ref::swiglu(gate.data(), up.data(), want.data(), n);
        kernels::swiglu(gate.data(), up.data(), got.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            if (std::isnan(want[i])) {
                EXPECT_TRUE(std::isnan(got[i])) << "n " << n << " i " << i;
            } else {
                ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(float)))
                    << "n " << n << " i " << i << " gate " << gate[i] << ": " << got[i] << " vs " << want[i];
            }
        }
    }
}

TEST_P(KernelsFast, RmsnormEqualsReferenceBitForBit) {
    for (int64_t n : {1, 7, 8, 9, 64, 100, 2048, 5632}) {
        const std::vector<float> x = randn(n, static_cast<uint32_t>(3 * n), 3.0f);
        const std::vector<float> w = randn(n, static_cast<uint32_t>(3 * n + 1));
        std::vector<float> want(n), got(n, NAN), inplace = x;
        kernels::ref::rmsnorm(x.data(), w.data(), want.data(), n, 1e-5f);
        kernels::rmsnorm(x.data(), w.data(), got.data(), n, 1e-5f);
        kernels::rmsnorm(inplace.data(), w.data(), inplace.data(), n, 1e-5f);  // y may alias x
        ASSERT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float))) << "n " << n;
        ASSERT_EQ(0, std::memcmp(inplace.data(), want.data(), n * sizeof(float))) << "n " << n;
    }
}

// Both pair orders, partial rotation (n_rot < head_dim), pair counts that leave a scalar tail, llama3's
// frequency factors, linear scaling and large positions.
TEST_P(KernelsFast, RopeEqualsReferenceBitForBit) {
    struct Shape {
        int32_t head_dim, n_rot;
    };
    const Shape shapes[] = {{64, 64}, {128, 128}, {128, 64}, {80, 80}, {96, 32}, {6, 6}, {256, 256}};
    for (const Shape &sh : shapes) {
        for (int order = 0; order < 2; ++order) {
            for (int32_t pos : {0, 1, 17, 4095, 131071}) {
                kernels::RopeParams p;
                p.n_rot = sh.n_rot;
                p.order = order == 0 ? kernels::RopeOrder::adjacent : kernels::RopeOrder::halves;
                p.freq_base = pos % 2 ? 500000.0f : 10000.0f;
                p.freq_scale = pos == 17 ? 0.25f : 1.0f;
                const std::vector<float> factors = randn(sh.n_rot / 2, 9, 0.1f);
                std::vector<float> ff(factors.size());
                for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + std::fabs(factors[i]) * 8.0f;
                if (pos == 4095) p.freq_factors = ff.data();
                const int32_t n_head = 3;
                const std::vector<float> x = randn(static_cast<size_t>(n_head) * sh.head_dim,
                                                   static_cast<uint32_t>(pos + sh.head_dim));
                std::vector<float> want = x, got = x;
                kernels::ref::rope(want.data(), n_head, sh.head_dim, pos, p);
                kernels::rope(got.data(), n_head, sh.head_dim, pos, p);
                ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                    << "head_dim " << sh.head_dim << " n_rot " << sh.n_rot << " order " << order << " pos "
                    << pos;
            }
        }
    }
}

// f16 stores with every rounding case: ties, the largest finite, overflow to infinity, subnormal results,
// underflow to zero, infinities and NaNs (quiet, payload kept). f32 stores copy.
TEST_P(KernelsFast, StoreRowAndAddEqualReferenceBitForBit) {
    const float specials[] = {0.0f,      -0.0f,      1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 65504.0f,
                              65519.99f, 65520.0f,   -70000.0f,       0x1p-14f,        0x1.8p-24f,
                              0x1p-25f,  0x1.1p-25f, 0x1p-26f,        INFINITY,        -INFINITY,
                              NAN,       -NAN,       1e-30f,          6.1e-5f,         -3.3e-7f};
    for (int64_t n : {1, 7, 8, 9, 20, 512, 1000}) {
        std::vector<float> x = randn(n, static_cast<uint32_t>(n + 5), 100.0f);
        for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i) x[i] = specials[i];
        for (bool f16 : {true, false}) {
            const size_t bytes = static_cast<size_t>(n) * (f16 ? 2 : 4);
            std::vector<uint8_t> want(bytes), got(bytes, 0xAB);
            kernels::ref::store_row(x.data(), want.data(), f16, n);
            kernels::store_row(x.data(), got.data(), f16, n);
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), bytes)) << "n " << n << " f16 " << f16;
        }
        const std::vector<float> y0 = randn(n, static_cast<uint32_t>(n + 6));
        std::vector<float> want = y0, got = y0;
        kernels::ref::add_inplace(want.data(), x.data(), n);
        kernels::add_inplace(got.data(), x.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            if (std::isnan(want[i])) {
                EXPECT_TRUE(std::isnan(got[i])) << "n " << n << " i " << i;
            } else {
                ASSERT_EQ(0, std::memcmp(&got[i], &want[i], sizeof(float))) << "n " << n << " i " << i;
            }
        }
    }
}

// The cache types of --cache-type-k/-v: every K type with every V type, head sizes of one to four blocks
// (rows wider than the head: the head is at an offset of one block), grouped heads, with and without soft
// capping. Each head equals the reference's; bit for bit except a bf16 K, whose dot products only agree
// within rounding between ISAs (as every float type's vec_dot).
TEST_P(KernelsFast, AttentionOverEveryCacheTypeEqualsTheReference) {
    const DType types[] = {DType::f16,  DType::f32,  DType::bf16, DType::q8_0,
                           DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1};
    const int32_t head_dims[] = {32, 64, 128};
    const int32_t n_kvs[] = {1, 17, 130};
    for (DType tk : types) {
        for (DType tv : types) {
            for (int32_t head_dim : head_dims) {
                const int64_t stride = head_dim + 32;  // another head's block before this one
                for (int32_t n_kv : n_kvs) {
                    const int32_t n_q = n_kv == 17 ? 5 : n_kv == 1 ? 1 : 3;
                    const float softcap = n_kv == 17 ? 2.0f : 0.0f;
                    const uint32_t seed = static_cast<uint32_t>(head_dim * 1000 + n_kv);
                    const std::vector<float> q = randn(static_cast<int64_t>(n_q) * head_dim, seed, 2.0f);
                    std::vector<float> kf = randn(stride * n_kv, seed + 1),
                                       vf = randn(stride * n_kv, seed + 2, 3.0f);
                    for (int32_t j = 0; j < n_kv; ++j)  // the keys grow along the positions: the max moves
                        for (int64_t d = 0; d < stride; ++d) kf[j * stride + d] *= 1.0f + 0.05f * (j % 7);
                    const std::vector<uint8_t> k = quantize_rows(tk, kf, n_kv, stride);
                    const std::vector<uint8_t> v = quantize_rows(tv, vf, n_kv, stride);
                    const kernels::KvRows kr{k.data() + dtype_row_bytes(tk, 32), tk,
                                             dtype_row_bytes(tk, stride)};
                    const kernels::KvRows vr{v.data() + dtype_row_bytes(tv, 32), tv,
                                             dtype_row_bytes(tv, stride)};
                    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
                    std::vector<float> scores(2 * 4 * static_cast<size_t>(n_kv));
                    std::vector<float> got(q.size(), NAN);
                    kernels::attention_group_typed(q.data(), n_q, kr, vr, head_dim, n_kv, scale, softcap,
                                                   scores.data(), got.data());
                    kernels::ref::KvReaders rd;
                    if (tk != DType::f16 && tk != DType::f32) {
                        rd.k_dot = kernels::type_kernels_ref(tk)->vec_dot;
                        rd.q_to_k = kernels::type_kernels_ref(kernels::type_kernels_ref(tk)->vec_dot_type)
                                        ->from_float;
                    }
                    if (tv != DType::f16 && tv != DType::f32)
                        rd.v_to_float = kernels::type_kernels_ref(tv)->to_float;
                    for (int32_t g = 0; g < n_q; ++g) {
                        std::vector<float> want(static_cast<size_t>(head_dim));
                        kernels::ref::attention_head_typed(&q[static_cast<size_t>(g) * head_dim], kr, vr, rd,
                                                           head_dim, n_kv, scale, softcap, want.data());
                        const float *gg = &got[static_cast<size_t>(g) * head_dim];
                        for (int32_t d = 0; d < head_dim; ++d) {
                            if (tk == DType::bf16) {
                                ASSERT_NEAR(gg[d], want[d], 1e-4f * (1.0f + std::fabs(want[d])));
                            } else {
                                ASSERT_EQ(0, std::memcmp(&gg[d], &want[d], sizeof(float)))
                                    << "K " << dtype_name(tk) << " V " << dtype_name(tv) << " head_dim "
                                    << head_dim << " n_kv " << n_kv << " head " << g << " d " << d;
                            }
                        }
                    }
                }
            }
        }
    }
}

// What a quantized cache changes is the rounding of K, V and the query, nothing else: the result is close to
// f32 attention over the dequantized rows (the query's q8_0 or q8_1 rounding is what remains), and f16 or f32
// rows of both give attention_group's result exactly.
TEST_P(KernelsFast, AttentionOverAQuantizedCacheIsAttentionOverItsValues) {
    const int32_t head_dim = 64, n_kv = 40, stride = 128;
    const std::vector<float> q = randn(head_dim, 5, 1.0f);
    const std::vector<float> kf = randn(stride * n_kv, 6), vf = randn(stride * n_kv, 7);
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    std::vector<float> scores(2 * 4 * n_kv), got(head_dim), want(head_dim);
    for (DType t : {DType::q8_0, DType::q4_0, DType::q5_1}) {
        const std::vector<uint8_t> k = quantize_rows(t, kf, n_kv, stride),
                                   v = quantize_rows(t, vf, n_kv, stride);
        std::vector<float> kd(kf.size()), vd(vf.size());
        for (int32_t j = 0; j < n_kv; ++j) {
            kernels::type_kernels_ref(t)->to_float(k.data() + j * dtype_row_bytes(t, stride), &kd[j * stride],
                                                   stride);
            kernels::type_kernels_ref(t)->to_float(v.data() + j * dtype_row_bytes(t, stride), &vd[j * stride],
                                                   stride);
        }
        kernels::attention_group_typed(q.data(), 1, {k.data(), t, dtype_row_bytes(t, stride)},
                                       {v.data(), t, dtype_row_bytes(t, stride)}, head_dim, n_kv, scale, 0.0f,
                                       scores.data(), got.data());
        kernels::attention_group(q.data(), 1, kd.data(), vd.data(), false, stride, head_dim, n_kv, scale,
                                 0.0f, scores.data(), want.data());
        float worst = 0.0f, size = 0.0f;
        for (int32_t d = 0; d < head_dim; ++d) {
            worst = std::max(worst, std::fabs(got[d] - want[d]));
            size = std::max(size, std::fabs(want[d]));
        }
        EXPECT_LT(worst, 0.02f * size) << dtype_name(t);
        EXPECT_GT(worst, 0.0f) << dtype_name(t);  // the query was rounded
    }
    const std::vector<uint8_t> kh = quantize_rows(DType::f16, kf, n_kv, stride);
    const std::vector<uint8_t> vh = quantize_rows(DType::f16, vf, n_kv, stride);
    kernels::attention_group_typed(q.data(), 1, {kh.data(), DType::f16, stride * 2u},
                                   {vh.data(), DType::f16, stride * 2u}, head_dim, n_kv, scale, 0.0f,
                                   scores.data(), got.data());
    kernels::attention_group(q.data(), 1, kh.data(), vh.data(), true, stride, head_dim, n_kv, scale, 0.0f,
                             scores.data(), want.data());
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
}

// Dequantizing a row (a quantized cache's V, embedding rows) gives the reference's floats on every ISA.
TEST_P(KernelsFast, ToFloatEqualsReferenceBitForBit) {
    for (DType t :
         {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::bf16, DType::f16}) {
        for (int64_t n : {32, 64, 96, 4096}) {
            const std::vector<uint8_t> q =
                quantize_rows(t, randn(n, static_cast<uint32_t>(n + 3), 2.0f), 1, n);
            std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n), NAN);
            kernels::type_kernels_ref(t)->to_float(q.data(), want.data(), n);
            kernels::type_kernels(t)->to_float(q.data(), got.data(), n);
            ASSERT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
                << dtype_name(t) << " n " << n;
        }
    }
}

// Rows stored into a cache of a block type are the reference quantizer's bytes on every ISA.
TEST_P(KernelsFast, StoringACacheRowWritesTheReferencesBytes) {
    for (DType t :
         {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::bf16, DType::f16}) {
        for (int64_t n : {32, 96, 512}) {
            const std::vector<float> x = randn(n, static_cast<uint32_t>(n + 1), 3.0f);
            const std::vector<uint8_t> want = quantize_rows(t, x, 1, n);
            std::vector<uint8_t> got(want.size(), 0xAB);
            kernels::store_row_typed(x.data(), got.data(), t, n);
            ASSERT_EQ(got, want) << dtype_name(t) << " n " << n;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelsFast, ::testing::ValuesIn(test::isas_of_this_arch()),
                         test::isa_param_name);

}  // namespace
}  // namespace td
