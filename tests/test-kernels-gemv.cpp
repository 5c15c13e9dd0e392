// The one-token matmul path (matrix-vector kernels, kernels/gemv.cpp) against the scalar reference vec_dot,
// bit for bit, on every ISA this build and CPU have: row counts that are not multiples of the kernels' row
// tile, block counts below, at and above multiples of 8, several thread counts, and weight bytes drawn at
// random so every level, scale and min a file can hold (q8_0's -128 included) is exercised.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
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
using test::matmul_ref;
using test::weight_view;

// Random weight rows: every byte random, then each block's half-precision scales set to finite values of a
// realistic size (random halves would be NaN or inf). [n_out][row_bytes]
std::vector<uint8_t> random_weights(DType type, int64_t n_in, int64_t n_out, uint32_t seed) {
    std::mt19937 rng(seed);
    const size_t row_bytes = dtype_row_bytes(type, n_in);
    std::vector<uint8_t> w(row_bytes * static_cast<size_t>(n_out));
    for (uint8_t &b : w) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
    auto put_half = [&](uint8_t *p) {
        const uint16_t h = fp32_to_fp16(scale(rng));
        std::memcpy(p, &h, sizeof h);
    };
    const DTypeTraits &tr = dtype_traits(type);
    const int64_t n_blocks = n_in / tr.block_size * n_out;
    for (int64_t i = 0; i < n_blocks; ++i) {
        uint8_t *blk = w.data() + static_cast<size_t>(i) * tr.block_bytes;
        switch (type) {
            case DType::q4_0:
            case DType::q5_0:
            case DType::q8_0:
                put_half(blk);  // d
                break;
            case DType::q4_1:
            case DType::q5_1:
                put_half(blk);      // d
                put_half(blk + 2);  // m
                break;
            case DType::q4_k:
            case DType::q5_k:  // d and dmin where q4_k has them
                put_half(blk + offsetof(kernels::BlockQ4_K, d));
                put_half(blk + offsetof(kernels::BlockQ4_K, dmin));
                break;
            case DType::q6_k:
                put_half(blk + offsetof(kernels::BlockQ6_K, d));
                break;
            case DType::q2_k:
                put_half(blk + offsetof(kernels::BlockQ2_K, d));
                put_half(blk + offsetof(kernels::BlockQ2_K, dmin));
                break;
            case DType::q3_k:
                put_half(blk + offsetof(kernels::BlockQ3_K, d));
                break;
            default:
                ADD_FAILURE() << "no scale layout for " << dtype_name(type);
        }
    }
    return w;
}

class KernelsGemv : public test::IsaTest {};

struct Case {
    DType type;
    std::vector<int64_t> lengths;
};

// Every output of a one-token matmul equals the reference's vec_dot of that row, bit for bit.
TEST_P(KernelsGemv, OneTokenMatmulEqualsReferenceBitForBit) {
    const Case cases[] = {
        {DType::q4_0, {32, 96, 256, 288, 2048}},  // 1, 3, 8, 9, 64 blocks
        {DType::q5_0, {32, 96, 256, 288, 2048}}, {DType::q8_0, {32, 96, 256, 288, 2048}},
        {DType::q4_k, {256, 768, 2048, 2304}},  // 1, 3, 8, 9 super-blocks
        {DType::q5_k, {256, 768, 2048, 2304}},   {DType::q6_k, {256, 768, 2048, 2304}},
        {DType::q2_k, {256, 768, 2048, 2304}},   {DType::q3_k, {256, 768, 2048, 2304}},
    };
    const int64_t outs[] = {1, 5, 8, 13, 19, 64};
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
    std::vector<uint8_t> scratch;
    uint32_t seed = 1;
    for (const Case &c : cases) {
        for (int64_t n_in : c.lengths) {
            for (int64_t n_out : outs) {
                const std::vector<uint8_t> w = random_weights(c.type, n_in, n_out, ++seed);
                const TensorView tv = weight_view(c.type, w, n_in, n_out);
                std::mt19937 rng(++seed);
                std::normal_distribution<float> dist(0.0f, 2.0f);
                std::vector<float> x(static_cast<size_t>(n_in));  // [n_in]
                for (float &v : x) v = dist(rng);
                const std::vector<float> want = matmul_ref(c.type, w, x, n_in, n_out, 1);
                for (ThreadPool &pool : pools) {
                    std::vector<float> y(want.size(), NAN);
                    kernels::matmul(tv, x.data(), y.data(), 1, pool, scratch);
                    ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
                        << dtype_name(c.type) << " n_in " << n_in << " n_out " << n_out << " threads "
                        << pool.n_threads();
                }
            }
        }
    }
}

// Activations at the extremes of the 8-bit range (every quantized value +-127) with the largest weight
// levels: the integer sums must not saturate anywhere.
TEST_P(KernelsGemv, ExtremeActivationsDoNotSaturate) {
    const int64_t n_in = 2048, n_out = 11;
    ThreadPool pool(2);
    std::vector<uint8_t> scratch;
    for (DType type : {DType::q4_0, DType::q5_0, DType::q4_1, DType::q5_1, DType::q8_0, DType::q2_k,
                       DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k}) {
        std::vector<uint8_t> w = random_weights(type, n_in, n_out, 99);
        // Row 0: every quant byte all ones (top levels and scales; q8_0 gets -1), the half scales kept
        // finite.
        const size_t row_bytes = dtype_row_bytes(type, n_in);
        const std::vector<uint8_t> w0(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(row_bytes));
        std::memset(w.data(), 0xFF, row_bytes);
        const DTypeTraits &tr = dtype_traits(type);
        for (size_t blk = 0; blk < row_bytes / tr.block_bytes; ++blk) {
            uint8_t *p = w.data() + blk * tr.block_bytes;
            const uint8_t *q = w0.data() + blk * tr.block_bytes;
            if (type == DType::q4_k || type == DType::q5_k) {
                std::memcpy(p, q, 4);  // d, dmin
            } else if (type == DType::q6_k) {
                std::memcpy(p + offsetof(kernels::BlockQ6_K, d), q + offsetof(kernels::BlockQ6_K, d), 2);
            } else if (type == DType::q2_k) {
                std::memcpy(p + offsetof(kernels::BlockQ2_K, d), q + offsetof(kernels::BlockQ2_K, d), 4);
            } else if (type == DType::q3_k) {
                std::memcpy(p + offsetof(kernels::BlockQ3_K, d), q + offsetof(kernels::BlockQ3_K, d), 2);
            } else if (type == DType::q4_1 || type == DType::q5_1) {
                std::memcpy(p, q, 4);  // d, m
            } else {
                std::memcpy(p, q, 2);  // d
            }
        }
        if (type == DType::q8_0) w[row_bytes + 2] = 0x80;  // row 1, block 0, element 0: -128
        const TensorView tv = weight_view(type, w, n_in, n_out);
        std::vector<float> x(static_cast<size_t>(n_in));  // [n_in], alternating +-1: quantizes to +-127
        for (int64_t i = 0; i < n_in; ++i) x[i] = (i % 3 == 0) ? -1.0f : 1.0f;
        const std::vector<float> want = matmul_ref(type, w, x, n_in, n_out, 1);
        std::vector<float> y(want.size(), NAN);
        kernels::matmul(tv, x.data(), y.data(), 1, pool, scratch);
        ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float))) << dtype_name(type);
        for (float v : y) ASSERT_TRUE(std::isfinite(v)) << dtype_name(type);
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelsGemv, ::testing::ValuesIn(test::isas_of_this_arch()),
                         test::isa_param_name);

}  // namespace
}  // namespace td
