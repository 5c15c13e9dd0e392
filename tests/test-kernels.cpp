// Type kernels (quantize, dequantize, vec_dot), ISA dispatch and matmul.
//
// Every check runs once per ISA this build and CPU have (isa_force); the reference is the scalar table.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/thread-pool.h"
#include "kernels/blocks.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/tensor.h"
#include "test-isa.h"

namespace td {
namespace {

using kernels::Isa;
using kernels::TypeKernels;
using test::randn;

}  // namespace

namespace kernels {
// Lets gtest print "avx2" instead of the enum's bytes.
void PrintTo(Isa isa, std::ostream *os) {
    *os << isa_name(isa);
}
}  // namespace kernels

namespace {

constexpr DType kTypes[] = {DType::f32,  DType::f16,  DType::bf16, DType::q4_0, DType::q4_1,
                            DType::q5_0, DType::q5_1, DType::q8_0, DType::q8_1};

// Quantize -> dequantize error on N(0,1) data, as RMS(error) / RMS(x). Measured on these 2048 values:
// f16 2.06e-4, bf16 1.63e-3, q4_0 0.0886, q4_1 0.0783, q5_0 0.0436, q5_1 0.0382, q8_0/q8_1 5.45e-3 (a uniform
// rounding error of d / sqrt(12) with d = absmax / 127 ~ 2.4 / 127 predicts 5.5e-3). The bounds leave ~15%
// headroom; a quantizer that lost one bit would double its error.
double round_trip_bound(DType type) {
    switch (type) {
        case DType::f32:
            return 0.0;
        case DType::f16:
            return 2.4e-4;
        case DType::bf16:
            return 1.9e-3;
        case DType::q4_0:
            return 0.1;
        case DType::q4_1:
            return 0.09;
        case DType::q5_0:
            return 0.05;
        case DType::q5_1:
            return 0.044;
        case DType::q8_0:
            return 0.0063;
        case DType::q8_1:
            return 0.0063;
        default:
            return 0.0;
    }
}

// A dot product in float may differ from the exact one by this fraction of sum_i |x_i y_i| (float rounding
// of a few hundred accumulations, with margin).
constexpr double kDotRelTol = 1e-5;
// q8_1 keeps s = d * sum(q) as a half, so q4_1/q5_1's offset term m * s is off by up to half an ulp of half.
constexpr double kHalfRelErr = 0x1p-11;

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
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(dtype_row_bytes(k.type, n));
    k.from_float(x.data(), q.data(), n);
    return q;
}

std::vector<float> dequantize(const TypeKernels &k, const std::vector<uint8_t> &q, int64_t n) {
    std::vector<float> x(static_cast<size_t>(n));
    k.to_float(q.data(), x.data(), n);
    return x;
}

bool all_finite(const std::vector<float> &v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

uint16_t read_u16(const uint8_t *p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

bool is_block_type(DType type) {
    return dtype_traits(type).block_size > 1;
}

// Row lengths that exercise the SIMD paths: whole groups of 8 blocks, partial groups and tails.
std::vector<int64_t> test_lengths(DType type) {
    if (is_block_type(type)) return {32, 32 * 7, 32 * 8, 32 * 9, 32 * 17, 32 * 64};
    return {1, 7, 8, 33, 100, 2048};
}

// Blocks whose scale comes out as exactly 1 with every other value halfway between two levels, so the
// rounding rule of each quantizer is visible (ggml rounds q8 half away from zero, q4/q5 half up):
//   block 0, q8_0/q8_1: absmax 127 -> d = 1, values k + 0.5
//   block 1, q4_0: max -8 -> d = 1;  block 2, q5_0: max -16 -> d = 1
//   block 3, q4_1: [0, 15] -> d = 1, m = 0;  block 4, q5_1: [0, 31] -> d = 1, m = 0
void add_tie_blocks(std::vector<float> &x) {
    struct TieBlock {
        float first, last;  // x[0], x[31]: fix the scale
        float lo;           // x[j] = lo + (j - 1) % period for 0 < j < 31
        int period;
    };
    const TieBlock blocks[5] = {
        {127.0f, -126.0f, -15.5f, 30}, {-8.0f, 7.0f, -7.5f, 15}, {-16.0f, 15.0f, -15.5f, 30},
        {0.0f, 15.0f, 0.5f, 14},       {0.0f, 31.0f, 0.5f, 30},
    };
    for (size_t b = 0; b < 5 && (b + 1) * 32 <= x.size(); ++b) {
        float *blk = x.data() + b * 32;  // [32]
        blk[0] = blocks[b].first;
        blk[31] = blocks[b].last;
        for (int j = 1; j < 31; ++j) blk[j] = blocks[b].lo + static_cast<float>((j - 1) % blocks[b].period);
    }
}

// dot(dequant(x), dequant(y)) in double, and how far a correct float kernel may be from it.
struct ExpectedDot {
    double value = 0.0;
    double tol = 0.0;
};

ExpectedDot expected_dot(DType type, const uint8_t *x, const uint8_t *y, int64_t n) {
    const TypeKernels &kx = ref_kernels(type);
    const TypeKernels &ky = ref_kernels(kx.vec_dot_type);
    std::vector<float> xf(static_cast<size_t>(n)), yf(static_cast<size_t>(n));
    kx.to_float(x, xf.data(), n);
    ky.to_float(y, yf.data(), n);
    ExpectedDot e;
    double magnitude = 0.0;  // bounds every partial sum a kernel forms
    for (int64_t i = 0; i < n; ++i) {
        e.value += static_cast<double>(xf[i]) * yf[i];
        magnitude += std::fabs(static_cast<double>(xf[i]) * yf[i]);
    }
    double offset_err = 0.0;
    if (type == DType::q4_1 || type == DType::q5_1) {
        // The kernel computes d_x d_y sum(q_x q_y) + m s: both terms can be larger than the result.
        const size_t bx = dtype_traits(type).block_bytes;
        const size_t by = dtype_traits(DType::q8_1).block_bytes;
        for (int64_t b = 0; b < n / kernels::kQK; ++b) {
            const double m = fp16_to_fp32(read_u16(x + b * bx + 2));
            const double s = fp16_to_fp32(read_u16(y + b * by + 2));
            double y_abs = 0.0;
            for (int j = 0; j < kernels::kQK; ++j) y_abs += std::fabs(yf[b * kernels::kQK + j]);
            magnitude += 2 * std::fabs(m) * y_abs + std::fabs(m * s);
            offset_err += std::fabs(m * s) * kHalfRelErr;
        }
    }
    e.tol = kDotRelTol * magnitude + offset_err + 1e-30;
    return e;
}

// ---- dispatch
// -------------------------------------------------------------------------------------------------

TEST(KernelsDispatch, EveryTypeHasAllFunctionsAndGgmlsVecDotType) {
    const std::pair<DType, DType> expected[] = {
        {DType::f32, DType::f32},   {DType::f16, DType::f16},   {DType::bf16, DType::bf16},
        {DType::q4_0, DType::q8_0}, {DType::q4_1, DType::q8_1}, {DType::q5_0, DType::q8_0},
        {DType::q5_1, DType::q8_1}, {DType::q8_0, DType::q8_0}, {DType::q8_1, DType::q8_1},
    };
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::neon}) {
        for (auto [type, vdt] : expected) {
            const TypeKernels *k = kernels::type_kernels_for(type, isa);
            ASSERT_NE(k, nullptr) << dtype_name(type) << " " << kernels::isa_name(isa);
            EXPECT_EQ(k->type, type);
            EXPECT_EQ(k->vec_dot_type, vdt) << dtype_name(type);
            EXPECT_TRUE(k->to_float && k->from_float && k->vec_dot) << dtype_name(type);
        }
    }
    EXPECT_EQ(kernels::type_kernels(DType::i8), nullptr);
    EXPECT_EQ(kernels::type_kernels_ref(DType::i32), nullptr);
}

TEST(KernelsDispatch, ForceResetAndEnvironment) {
    const Isa detected = kernels::isa_detected();
    EXPECT_TRUE(kernels::isa_force(Isa::scalar));
    EXPECT_EQ(kernels::isa_active(), Isa::scalar);
#if defined(__x86_64__)
    EXPECT_FALSE(kernels::isa_force(Isa::neon));
    EXPECT_EQ(kernels::isa_active(), Isa::scalar) << "a refused force must not change the active ISA";
#endif

    const char *saved = std::getenv("TANDEM_ISA");
    const std::string saved_value = saved ? saved : "";
    setenv("TANDEM_ISA", "scalar", 1);
    kernels::isa_reset();
    EXPECT_EQ(kernels::isa_active(), Isa::scalar);
    setenv("TANDEM_ISA", "sse9", 1);  // not an ISA: ignored (with a warning)
    kernels::isa_reset();
    EXPECT_EQ(kernels::isa_active(), detected);
    unsetenv("TANDEM_ISA");
    kernels::isa_reset();
    EXPECT_EQ(kernels::isa_active(), detected);
    if (saved) setenv("TANDEM_ISA", saved_value.c_str(), 1);
    kernels::isa_reset();
    EXPECT_STREQ(kernels::isa_name(Isa::avx512), "avx512");
}

// ---- per-ISA checks
// -------------------------------------------------------------------------------------------

class KernelsIsa : public test::IsaTest {};

TEST_P(KernelsIsa, RoundTripErrorWithinBound) {
    const int64_t n = 2048;
    const std::vector<float> x = randn(n, 1);
    for (DType type : kTypes) {
        const TypeKernels &k = active_kernels(type);
        const std::vector<float> y = dequantize(k, quantize(k, x), n);
        double err2 = 0.0, x2 = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            err2 += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
            x2 += static_cast<double>(x[i]) * x[i];
        }
        const double rel_rms = std::sqrt(err2 / x2);
        EXPECT_LE(rel_rms, round_trip_bound(type)) << dtype_name(type);
        // Not vacuous: every lossy type loses at least a little.
        if (type != DType::f32) {
            EXPECT_GT(rel_rms, round_trip_bound(type) / 4) << dtype_name(type);
        }
        EXPECT_TRUE(all_finite(y)) << dtype_name(type);
    }
}

TEST_P(KernelsIsa, FromFloatAndToFloatMatchReferenceBitForBit) {
    for (DType type : kTypes) {
        const TypeKernels &k = active_kernels(type);
        const TypeKernels &r = ref_kernels(type);
        for (int64_t n : test_lengths(type)) {
            std::vector<float> x = randn(n, static_cast<uint32_t>(n), 3.0f);
            if (is_block_type(type)) add_tie_blocks(x);
            if (!is_block_type(type) && n >= 8) {
                // Conversion corner cases: infinities, NaN, overflow to inf, half subnormals, ties.
                const float specials[] = {INFINITY, -INFINITY, NAN,    65504.0f,
                                          65520.0f, 1e-7f,     -3e-8f, 1e-40f};
                for (size_t i = 0; i < std::size(specials) && i < x.size(); ++i)
                    x[i * (x.size() / 8)] = specials[i];
            }
            const std::vector<uint8_t> q = quantize(k, x);
            const std::vector<uint8_t> q_ref = quantize(r, x);
            ASSERT_EQ(q, q_ref) << dtype_name(type) << " from_float n=" << n;
            const std::vector<float> y = dequantize(k, q, n);
            const std::vector<float> y_ref = dequantize(r, q, n);
            ASSERT_EQ(0, std::memcmp(y.data(), y_ref.data(), y.size() * sizeof(float)))
                << dtype_name(type) << " to_float n=" << n;
        }
    }
}

TEST_P(KernelsIsa, VecDotMatchesReferenceAndExactDot) {
    for (DType type : kTypes) {
        const TypeKernels &k = active_kernels(type);
        const TypeKernels &r = ref_kernels(type);
        const TypeKernels &ky = ref_kernels(k.vec_dot_type);
        for (int64_t n : test_lengths(type)) {
            const std::vector<uint8_t> x = quantize(r, randn(n, 100 + static_cast<uint32_t>(n)));
            const std::vector<uint8_t> y = quantize(ky, randn(n, 200 + static_cast<uint32_t>(n)));
            float s = NAN, s_ref = NAN;
            k.vec_dot(n, &s, x.data(), y.data());
            r.vec_dot(n, &s_ref, x.data(), y.data());
            const ExpectedDot e = expected_dot(type, x.data(), y.data(), n);
            EXPECT_NEAR(s_ref, e.value, e.tol) << dtype_name(type) << " reference, n=" << n;
            EXPECT_NEAR(s, e.value, e.tol) << dtype_name(type) << " n=" << n;
            if (is_block_type(type)) {
                // Integer block sums and the shared lane order make every ISA exact to the reference.
                EXPECT_EQ(fp32_to_bits(s), fp32_to_bits(s_ref)) << dtype_name(type) << " n=" << n;
            }
        }
    }
}

TEST_P(KernelsIsa, Q8_0WeightsMayHoldMinus128) {
    // ggml's quantizer never writes -128, but a file may hold it; only the activation side is ours.
    const int64_t n = 32 * 9;
    std::vector<uint8_t> x = quantize(ref_kernels(DType::q8_0), randn(n, 41));
    for (int64_t b = 0; b < n / 32; ++b) std::memset(x.data() + b * 34 + 2 + b % 4 * 8, 0x80, 8);
    const std::vector<uint8_t> y = quantize(ref_kernels(DType::q8_0), randn(n, 42));
    float s = NAN, s_ref = NAN;
    active_kernels(DType::q8_0).vec_dot(n, &s, x.data(), y.data());
    ref_kernels(DType::q8_0).vec_dot(n, &s_ref, x.data(), y.data());
    const ExpectedDot e = expected_dot(DType::q8_0, x.data(), y.data(), n);
    EXPECT_NEAR(s_ref, e.value, e.tol);
    EXPECT_EQ(fp32_to_bits(s), fp32_to_bits(s_ref));
}

TEST_P(KernelsIsa, KnownBlocksQ4_0AndQ8_0) {
    std::vector<float> x(32);
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j);

    // q4_0: the largest magnitude is 31, so d = 31 / -8 = -3.875 (exact in half: 0xC3C0) and
    // q[j] = floor(8.5 - 8 j / 31): 8 8 7 7 7 7 6 6 6 6 5 5 5 5 4 4 | 4 4 3 3 3 3 2 2 2 2 1 1 1 1 0 0.
    // Byte j holds q[j] | q[j + 16] << 4.
    const std::vector<uint8_t> q4 = quantize(active_kernels(DType::q4_0), x);
    const uint8_t expected_q4[18] = {0xC0, 0xC3, 0x48, 0x48, 0x37, 0x37, 0x37, 0x37, 0x26,
                                     0x26, 0x26, 0x26, 0x15, 0x15, 0x15, 0x15, 0x04, 0x04};
    ASSERT_EQ(q4, std::vector<uint8_t>(std::begin(expected_q4), std::end(expected_q4)));
    const std::vector<float> y4 = dequantize(active_kernels(DType::q4_0), q4, 32);
    EXPECT_EQ(y4[0], 0.0f);    // (8 - 8) * d
    EXPECT_EQ(y4[31], 31.0f);  // (0 - 8) * -3.875
    EXPECT_EQ(y4[2], 3.875f);  // (7 - 8) * -3.875
    EXPECT_EQ(y4[16], 15.5f);  // (4 - 8) * -3.875

    // q8_0: d = 31 / 127 = 0.244094..., as half 0x33D0; q[j] = round(127 j / 31) (no ties: 31 is prime).
    const std::vector<uint8_t> q8 = quantize(active_kernels(DType::q8_0), x);
    const int8_t expected_q8[32] = {0,  4,  8,  12, 16, 20, 25, 29, 33, 37,  41,  45,  49,  53,  57,  61,
                                    66, 70, 74, 78, 82, 86, 90, 94, 98, 102, 107, 111, 115, 119, 123, 127};
    EXPECT_EQ(read_u16(q8.data()), 0x33D0);
    EXPECT_EQ(0, std::memcmp(q8.data() + 2, expected_q8, 32));
}

TEST_P(KernelsIsa, KnownBlocksQ5AndQ4_1Layout) {
    // Values on the grid of each type, so q[j] = j exactly and the bit placement is visible.
    std::vector<float> x(32);

    // q5_0: x[j] = (j - 16) / 2, the largest magnitude is x[0] = -8: d = -8 / -16 = 0.5, q[j] = j.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) * 0.5f;
    std::vector<uint8_t> q = quantize(active_kernels(DType::q5_0), x);
    EXPECT_EQ(read_u16(q.data()), fp32_to_fp16(0.5f));
    uint32_t qh;
    std::memcpy(&qh, q.data() + 2, 4);
    EXPECT_EQ(qh, 0xFFFF0000u);  // bit 4 of q[j] is set exactly for j >= 16
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q[6 + j], j | (j << 4)) << j;  // low bits of j and j + 16
    EXPECT_EQ(dequantize(active_kernels(DType::q5_0), q, 32), x);

    // q5_1: x[j] = 1 + j / 2: m = 1, d = 15.5 / 31 = 0.5, q[j] = j.
    for (int j = 0; j < 32; ++j) x[j] = 1.0f + static_cast<float>(j) * 0.5f;
    q = quantize(active_kernels(DType::q5_1), x);
    EXPECT_EQ(read_u16(q.data()), fp32_to_fp16(0.5f));
    EXPECT_EQ(read_u16(q.data() + 2), fp32_to_fp16(1.0f));
    std::memcpy(&qh, q.data() + 4, 4);
    EXPECT_EQ(qh, 0xFFFF0000u);
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q[8 + j], j | (j << 4)) << j;
    EXPECT_EQ(dequantize(active_kernels(DType::q5_1), q, 32), x);

    // q4_1: x[j] = 1 + (j % 16): m = 1, d = 15 / 15 = 1, q[j] = j % 16, so byte j = j | j << 4.
    for (int j = 0; j < 32; ++j) x[j] = 1.0f + static_cast<float>(j % 16);
    q = quantize(active_kernels(DType::q4_1), x);
    EXPECT_EQ(read_u16(q.data()), fp32_to_fp16(1.0f));
    EXPECT_EQ(read_u16(q.data() + 2), fp32_to_fp16(1.0f));
    for (int j = 0; j < 16; ++j) EXPECT_EQ(q[4 + j], j | (j << 4)) << j;
    EXPECT_EQ(dequantize(active_kernels(DType::q4_1), q, 32), x);

    // q8_1: s = d * sum(q). Values 0..31 quantize as in q8_0; sum(round(127 j / 31)) = 2032.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j);
    q = quantize(active_kernels(DType::q8_1), x);
    EXPECT_EQ(read_u16(q.data()), 0x33D0);
    EXPECT_EQ(read_u16(q.data() + 2), fp32_to_fp16(2032.0f * (31.0f / 127)));
}

TEST_P(KernelsIsa, EdgeBlocksZeroAndOneHugeValue) {
    const int64_t n = 64;
    for (DType type : kTypes) {
        const TypeKernels &k = active_kernels(type);
        const TypeKernels &ky = active_kernels(k.vec_dot_type);
        const std::vector<float> y_f = randn(n, 7);
        const std::vector<uint8_t> y = quantize(ky, y_f);

        // All zero: d = 0 must not become 1/0; everything decodes to exactly 0.
        const std::vector<float> zeros(n, 0.0f);
        const std::vector<uint8_t> qz = quantize(k, zeros);
        EXPECT_EQ(dequantize(k, qz, n), zeros) << dtype_name(type);
        float s = NAN;
        k.vec_dot(n, &s, qz.data(), y.data());
        EXPECT_EQ(s, 0.0f) << dtype_name(type);

        // One value 3e4 times the rest (still finite in half): it survives to the precision of its scale,
        // and nothing overflows.
        std::vector<float> x = randn(n, 8);
        x[37] = 30000.0f;
        const std::vector<uint8_t> qh = quantize(k, x);
        const std::vector<float> xh = dequantize(k, qh, n);
        EXPECT_TRUE(all_finite(xh)) << dtype_name(type);
        EXPECT_NEAR(xh[37], 30000.0f, 30000.0f * 5e-3) << dtype_name(type);
        k.vec_dot(n, &s, qh.data(), y.data());
        EXPECT_TRUE(std::isfinite(s)) << dtype_name(type);
        const ExpectedDot e = expected_dot(type, qh.data(), y.data(), n);
        EXPECT_NEAR(s, e.value, e.tol) << dtype_name(type);
    }
}

// ---- matmul
// -----------------------------------------------------------------------------------------------------

// A weight matrix [n_out, n_in] of the given type, quantized from N(0,1) values.
struct Weights {
    std::vector<uint8_t> bytes;  // [n_out][row_bytes]
    TensorView view;
};

Weights make_weights(DType type, int64_t n_in, int64_t n_out, uint32_t seed) {
    Weights w;
    w.bytes = quantize(ref_kernels(type), randn(n_in * n_out, seed));
    w.view.name = "w";
    w.view.type = type;
    w.view.n_dims = 2;
    w.view.ne[0] = n_in;
    w.view.ne[1] = n_out;
    w.view.data = w.bytes.data();
    return w;
}

TEST_P(KernelsIsa, MatmulMatchesNaiveDoubleReference) {
    // n_in = 10 blocks (one group of 8 and a tail), n_out not a multiple of the 16-row chunk.
    const int64_t n_in = 320, n_out = 37;
    ThreadPool pool(3);
    std::vector<uint8_t> scratch;
    for (DType type : kTypes) {
        const Weights w = make_weights(type, n_in, n_out, 11);
        const TypeKernels &kw = ref_kernels(type);
        const TypeKernels &kx = ref_kernels(kw.vec_dot_type);
        for (int64_t n_tokens : {1, 7}) {
            const std::vector<float> x = randn(n_tokens * n_in, 12);           // [n_tokens, n_in]
            std::vector<float> y(static_cast<size_t>(n_tokens * n_out), NAN);  // [n_tokens, n_out]
            kernels::matmul(w.view, x.data(), y.data(), n_tokens, pool, scratch);
            for (int64_t t = 0; t < n_tokens; ++t) {
                const std::vector<float> xt(x.begin() + t * n_in, x.begin() + (t + 1) * n_in);
                const std::vector<uint8_t> xq = quantize(kx, xt);
                for (int64_t o = 0; o < n_out; ++o) {
                    const ExpectedDot e = expected_dot(type, w.view.row(o), xq.data(), n_in);
                    ASSERT_NEAR(y[t * n_out + o], e.value, e.tol)
                        << dtype_name(type) << " token " << t << " row " << o << " of " << n_tokens;
                }
            }
        }
    }
}

TEST_P(KernelsIsa, MatmulIsBitIdenticalAcrossThreadsAndBatching) {
    const int64_t n_in = 256, n_out = 53, n_tokens = 7;
    ThreadPool pool1(1), pool3(3);
    std::vector<uint8_t> scratch;
    for (DType type : kTypes) {
        const Weights w = make_weights(type, n_in, n_out, 21);
        const std::vector<float> x = randn(n_tokens * n_in, 22);       // [n_tokens, n_in]
        std::vector<float> y1(static_cast<size_t>(n_tokens * n_out));  // [n_tokens, n_out], 1 thread
        std::vector<float> y3(y1.size());                              // 3 threads
        std::vector<float> y_each(y1.size());                          // one token per call
        kernels::matmul(w.view, x.data(), y1.data(), n_tokens, pool1, scratch);
        kernels::matmul(w.view, x.data(), y3.data(), n_tokens, pool3, scratch);
        for (int64_t t = 0; t < n_tokens; ++t)
            kernels::matmul(w.view, x.data() + t * n_in, y_each.data() + t * n_out, 1, pool3, scratch);
        EXPECT_TRUE(all_finite(y1)) << dtype_name(type);
        EXPECT_EQ(0, std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float))) << dtype_name(type);
        EXPECT_EQ(0, std::memcmp(y1.data(), y_each.data(), y1.size() * sizeof(float))) << dtype_name(type);
    }
}

TEST_P(KernelsIsa, MatmulReusesScratch) {
    const Weights w = make_weights(DType::q4_0, 64, 20, 31);
    ThreadPool pool(2);
    std::vector<uint8_t> scratch;
    const std::vector<float> x = randn(4 * 64, 32);  // [4, 64]
    std::vector<float> y(4 * 20);                    // [4, 20]
    kernels::matmul(w.view, x.data(), y.data(), 4, pool, scratch);
    ASSERT_EQ(scratch.size(), 4 * dtype_row_bytes(DType::q8_0, 64));
    const uint8_t *buffer = scratch.data();
    kernels::matmul(w.view, x.data(), y.data(), 1, pool, scratch);
    kernels::matmul(w.view, x.data(), y.data(), 4, pool, scratch);
    EXPECT_EQ(scratch.data(), buffer) << "scratch was reallocated although it was big enough";
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelsIsa, ::testing::ValuesIn(test::isas_of_this_arch()),
                         test::isa_param_name);

}  // namespace
}  // namespace td
