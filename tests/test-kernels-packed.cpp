// Packed q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k and q6_k weights (kernels/pack.h): packing round-trips, and
// matmul on a packed matrix equals the reference on the row-major one bit for bit, on every ISA, for one
// token (the packed matrix-vector kernel), a few (the packed small-batch kernel) and many (chunks unpacked
// into the row kernels).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread-pool.h"
#include "kernels/blocks.h"
#include "kernels/kernels.h"
#include "kernels/pack.h"
#include "test-isa.h"

namespace td {
namespace {

using test::matmul_ref;
using test::quantize_rows;
using test::randn;
using test::weight_view;

TEST(KernelsPack, OnlyLaidOutTypesWithWholeGroupsArePackable) {
    EXPECT_TRUE(kernels::packable(DType::q4_0, 64, 16));
    EXPECT_TRUE(kernels::packable(DType::q4_k, 512, 32));
    EXPECT_FALSE(kernels::packable(DType::q4_k, 128, 32));  // not whole super-blocks
    EXPECT_TRUE(kernels::packable(DType::q5_k, 256, 16));
    EXPECT_TRUE(kernels::packable(DType::q4_0, 2048, 5632));
    EXPECT_FALSE(kernels::packable(DType::q4_0, 64, 24));  // not whole groups of 16 rows
    EXPECT_FALSE(kernels::packable(DType::q4_0, 48, 16));  // not whole blocks
    EXPECT_TRUE(kernels::packable(DType::q8_0, 64, 16));
    EXPECT_TRUE(kernels::packable(DType::q5_0, 896, 4864));
    EXPECT_FALSE(kernels::packable(DType::q8_0, 64, 8));
    EXPECT_TRUE(kernels::packable(DType::q5_1, 64, 16));
    EXPECT_FALSE(kernels::packable(DType::q8_1, 64, 16));
    EXPECT_FALSE(kernels::packable(DType::f32, 64, 16));
}

TEST(KernelsPack, PackThenUnpackGivesTheRowsBack) {
    for (auto [type, n] : {std::pair{DType::q4_0, int64_t{96}}, std::pair{DType::q5_0, int64_t{96}},
                           std::pair{DType::q4_1, int64_t{96}}, std::pair{DType::q5_1, int64_t{96}},
                           std::pair{DType::q8_0, int64_t{96}}, std::pair{DType::q4_k, int64_t{768}},
                           std::pair{DType::q5_k, int64_t{768}}, std::pair{DType::q6_k, int64_t{768}}}) {
        const int64_t rows = 48;
        const std::vector<uint8_t> w = quantize_rows(type, randn(n * rows, 3), rows, n);
        std::vector<uint8_t> packed(w.size()), back(w.size());
        kernels::pack_rows(type, w.data(), n, rows, packed.data());
        EXPECT_NE(packed, w) << dtype_name(type);  // really regrouped
        kernels::unpack_rows(type, packed.data(), n, 0, rows, back.data());
        EXPECT_EQ(back, w) << dtype_name(type);
        // A later group alone: rows 16..47.
        std::vector<uint8_t> tail(w.size() / 3 * 2);
        kernels::unpack_rows(type, packed.data(), n, 16, 32, tail.data());
        EXPECT_TRUE(
            std::equal(tail.begin(), tail.end(), w.begin() + static_cast<std::ptrdiff_t>(w.size() / 3)))
            << dtype_name(type);
    }
}

class KernelsPacked : public test::IsaTest {};

// y from the packed matrix equals the reference on the rows, for every batch size the kernels treat
// differently (1, pairs and an odd one, around the small-batch limit, and far above it).
TEST_P(KernelsPacked, MatmulEqualsReferenceBitForBit) {
    struct Case {
        DType type;
        std::vector<int64_t> lengths;
    };
    const Case cases[] = {
        {DType::q4_0, {32, 96, 256, 288, 2048}},  // 1, 3, 8, 9, 64 blocks
        {DType::q5_0, {32, 96, 256, 288, 2048}}, {DType::q4_1, {32, 96, 256, 288, 2048}},
        {DType::q5_1, {32, 96, 256, 288, 2048}}, {DType::q8_0, {32, 96, 256, 288, 2048}},
        {DType::q4_k, {256, 768, 2048, 2304}},  // 1, 3, 8, 9 super-blocks
        {DType::q5_k, {256, 768, 2048, 2304}},   {DType::q6_k, {256, 768, 2048, 2304}},
    };
    const int64_t outs[] = {16, 48, 160};
    const int64_t batches[] = {1, 2, 3, 5, 16, 17, 40, 60};  // 60: past every packed kernel's batch limit
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(3)};
    std::vector<uint8_t> scratch;
    uint32_t seed = 7;
    for (const Case &c : cases) {
        for (int64_t n_in : c.lengths) {
            for (int64_t n_out : outs) {
                const std::vector<uint8_t> w =
                    quantize_rows(c.type, randn(n_in * n_out, ++seed), n_out, n_in);
                std::vector<uint8_t> packed(w.size());
                kernels::pack_rows(c.type, w.data(), n_in, n_out, packed.data());
                TensorView tv = weight_view(c.type, w, n_in, n_out);
                tv.packed = packed.data();
                for (int64_t n_tokens : batches) {
                    const std::vector<float> x = randn(n_in * n_tokens, ++seed, 2.0f);  // [n_tokens][n_in]
                    const std::vector<float> want = matmul_ref(c.type, w, x, n_in, n_out, n_tokens);
                    for (ThreadPool &pool : pools) {
                        std::vector<float> y(want.size(), NAN);
                        kernels::matmul(tv, x.data(), y.data(), n_tokens, pool, scratch);
                        ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
                            << dtype_name(c.type) << " n_in " << n_in << " n_out " << n_out << " tokens "
                            << n_tokens << " threads " << pool.n_threads();
                    }
                }
            }
        }
    }
}

// matmul_group gives each matrix what matmul gives it alone, bit for bit: packed and row-major matrices, odd
// row counts (items split across the matrices' boundaries), and a group whose activation types differ
// (q8_0 with q8_K), which runs one matrix after another.
TEST_P(KernelsPacked, MatmulGroupEqualsOneMatmulPerMatrix) {
    struct Mat {
        DType type;
        int64_t n_out;
        bool pack;
    };
    const std::vector<std::vector<Mat>> groups = {
        {{DType::q4_0, 160, true}, {DType::q4_0, 48, true}, {DType::q4_0, 48, true}},
        {{DType::q4_k, 96, true}, {DType::q6_k, 32, true}, {DType::q4_k, 16, false}},
        {{DType::q5_k, 48, true}, {DType::q5_k, 32, false}, {DType::q4_k, 16, true}},
        {{DType::q4_0, 80, true}, {DType::q8_0, 70, false}},
        {{DType::q8_0, 33, false}, {DType::q4_k, 64, true}},
    };
    const int64_t n_in = 512;
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
    std::vector<uint8_t> scratch;
    uint32_t seed = 101;
    for (const auto &group : groups) {
        std::vector<std::vector<uint8_t>> rows, packed;
        std::vector<TensorView> views;
        for (const Mat &m : group) {
            rows.push_back(quantize_rows(m.type, randn(n_in * m.n_out, ++seed), m.n_out, n_in));
            packed.emplace_back(rows.back().size());
        }
        for (size_t i = 0; i < group.size(); ++i) {
            views.push_back(weight_view(group[i].type, rows[i], n_in, group[i].n_out));
            if (group[i].pack) {
                kernels::pack_rows(group[i].type, rows[i].data(), n_in, group[i].n_out, packed[i].data());
                views.back().packed = packed[i].data();
            }
        }
        for (int64_t n_tokens : {1, 3, 9}) {
            const std::vector<float> x = randn(n_in * n_tokens, ++seed, 2.0f);
            for (ThreadPool &pool : pools) {
                std::vector<std::vector<float>> want, got;
                std::vector<kernels::MatmulOut> outs;
                for (size_t i = 0; i < group.size(); ++i) {
                    want.emplace_back(static_cast<size_t>(n_tokens * group[i].n_out));
                    kernels::matmul(views[i], x.data(), want.back().data(), n_tokens, pool, scratch);
                    got.emplace_back(want.back().size(), NAN);
                }
                for (size_t i = 0; i < group.size(); ++i) outs.push_back({&views[i], got[i].data()});
                kernels::matmul_group(outs.data(), static_cast<int>(outs.size()), x.data(), n_tokens, pool,
                                      scratch);
                for (size_t i = 0; i < group.size(); ++i)
                    ASSERT_EQ(0, std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)))
                        << "matrix " << i << " " << dtype_name(group[i].type) << " tokens " << n_tokens
                        << " threads " << pool.n_threads();
            }
        }
    }
}

// Extreme levels (q4_0: all 15 or all 0, i.e. -8; q8_0: all 127 or all -128) with activations of +-127: the
// integer sums must not saturate (AVX2 adds eight vpmaddubsw results in int16 before widening) and q8_0's
// -128, which no quantizer writes but a file may hold, must come out right through the flip to unsigned.
TEST_P(KernelsPacked, ExtremeValuesDoNotSaturate) {
    const int64_t n_in = 2048, n_out = 32;
    for (DType type : {DType::q4_0, DType::q8_0}) {
        const bool q8 = type == DType::q8_0;
        const size_t block_bytes = q8 ? sizeof(kernels::BlockQ8_0) : sizeof(kernels::BlockQ4_0),
                     qs_bytes = block_bytes - 2;
        std::vector<uint8_t> w = quantize_rows(type, randn(n_in * n_out, 5), n_out, n_in);
        for (size_t blk = 0; blk < w.size() / block_bytes; ++blk) {
            const uint8_t level = blk % 2 ? (q8 ? 0x7F : 0xFF) : (q8 ? 0x80 : 0x00);
            std::memset(w.data() + blk * block_bytes + 2, level, qs_bytes);
        }
        std::vector<uint8_t> packed(w.size());
        kernels::pack_rows(type, w.data(), n_in, n_out, packed.data());
        TensorView tv = weight_view(type, w, n_in, n_out);
        tv.packed = packed.data();
        ThreadPool pool(2);
        std::vector<uint8_t> scratch;
        for (int64_t n_tokens : {1, 4}) {
            std::vector<float> x(static_cast<size_t>(n_in * n_tokens));  // +-1: quantizes to +-127
            for (size_t i = 0; i < x.size(); ++i) x[i] = (i / 32) % 2 ? -1.0f : 1.0f;
            const std::vector<float> want = matmul_ref(type, w, x, n_in, n_out, n_tokens);
            std::vector<float> y(want.size(), NAN);
            kernels::matmul(tv, x.data(), y.data(), n_tokens, pool, scratch);
            ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
                << dtype_name(type) << " tokens " << n_tokens;
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KernelsPacked, ::testing::ValuesIn(test::isas_of_this_arch()),
                         test::isa_param_name);

}  // namespace
}  // namespace td
