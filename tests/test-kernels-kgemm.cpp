// matmul with K-quant weights (q2_k .. q6_k) and several tokens, which runs the K-quant tile kernels
// (kernels/gemm-kquants.cpp), against the scalar reference vec_dot bit for bit: on every ISA this build and
// CPU have, at several thread counts, for row counts and token counts that are not multiples of the tiles,
// row lengths whose super-block count is below, at and above the 8 accumulator lanes, extreme weight bytes,
// and a token's output not depending on the batch it came in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/thread-pool.h"
#include "kernels/blocks.h"
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"
#include "test-isa.h"

namespace td {
namespace {

using kernels::Isa;
using kernels::kQK_K;
using kernels::TypeKernels;
using test::matmul_ref;
using test::quantize_rows;
using test::randn;
using test::weight_view;

constexpr DType kTileTypes[] = {DType::q2_k, DType::q3_k, DType::q4_k, DType::q5_k, DType::q6_k};

// The byte range of a super-block that holds levels and scales (everything but the f16 d / dmin), which a
// file may fill with any bits.
struct Payload {
    size_t begin, end, block;
};

Payload payload_of(DType type) {
    switch (type) {
        case DType::q4_k:
            return {offsetof(kernels::BlockQ4_K, scales), sizeof(kernels::BlockQ4_K),
                    sizeof(kernels::BlockQ4_K)};
        case DType::q5_k:
            return {offsetof(kernels::BlockQ5_K, scales), sizeof(kernels::BlockQ5_K),
                    sizeof(kernels::BlockQ5_K)};
        case DType::q2_k:
            return {0, offsetof(kernels::BlockQ2_K, d), sizeof(kernels::BlockQ2_K)};
        case DType::q3_k:
            return {0, offsetof(kernels::BlockQ3_K, d), sizeof(kernels::BlockQ3_K)};
        default:
            return {0, offsetof(kernels::BlockQ6_K, d), sizeof(kernels::BlockQ6_K)};
    }
}

// Every super-block of row `row` gets random levels and scales; row `row + 1` (if any) gets every bit set,
// the largest levels and scales (q6_k: scale -1, and -128 in its first group).
void extreme_rows(DType type, std::vector<uint8_t> &w, size_t row_bytes, int64_t n_rows, int64_t row,
                  uint32_t seed) {
    const Payload p = payload_of(type);
    std::mt19937 rng(seed);
    for (int64_t r = row; r < row + 2 && r < n_rows; ++r) {
        for (size_t b = 0; b < row_bytes / p.block; ++b) {
            uint8_t *blk = w.data() + static_cast<size_t>(r) * row_bytes + b * p.block;
            for (size_t i = p.begin; i < p.end; ++i)
                blk[i] = r == row ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(0xFF);
            if (r != row && type == DType::q6_k) blk[offsetof(kernels::BlockQ6_K, scales)] = 0x80;
        }
    }
}

// Activations: gaussian tokens, plus (where there is room) a constant token and its negation, whose q8_k
// values are all -127 / 127, the largest products the int16 sums of the AVX2 kernel see.
std::vector<float> activations(int64_t n_in, int64_t n_tokens, uint32_t seed) {
    std::vector<float> x = randn(n_in * n_tokens, seed, 2.0f);
    if (n_tokens >= 3) {
        for (int64_t i = 0; i < n_in; ++i) {
            x[static_cast<size_t>(n_in + i)] = 1.5f;
            x[static_cast<size_t>(2 * n_in + i)] = -1.5f;
        }
    }
    return x;
}

class KGemm : public test::IsaTest {};

// Where the CPU has AVX2, several-token K-quant matmuls run a tile kernel rather than vec_dot per element.
TEST_P(KGemm, TileKernelChosenWhereTheIsaHasOne) {
    for (DType type : kTileTypes) {
        const bool simd = GetParam() == Isa::avx2 || GetParam() == Isa::avx512;
        EXPECT_EQ(simd, kernels::gemm_kquants_for(type) != nullptr) << dtype_name(type);
    }
}

// Every (row, token) equals the reference's single vec_dot: rows 1..40 (tiles of 8 and 16 plus remainders),
// tokens 2..40 (tiles of 4 and 8 plus remainders), 1, 3, 8, 9 super-blocks per row, 1..3 threads.
TEST_P(KGemm, MatmulEqualsReferenceBitForBit) {
    struct Shape {
        int64_t n_in, n_out;
        std::vector<int64_t> tokens;
    };
    const Shape shapes[] = {
        {256, 1, {2, 9}},
        {768, 21, {2, 3, 4, 5, 7, 8, 9, 13, 16, 17}},
        {2048, 16, {3, 8, 40}},
        {2304, 40, {2, 11, 40}},
    };
    ThreadPool pools[] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
    std::vector<uint8_t> scratch;
    for (DType type : kTileTypes) {
        for (const Shape &s : shapes) {
            std::vector<float> wf = randn(s.n_in * s.n_out, static_cast<uint32_t>(s.n_in + s.n_out), 0.5f);
            std::vector<uint8_t> w = quantize_rows(type, wf, s.n_out, s.n_in);
            extreme_rows(type, w, dtype_row_bytes(type, s.n_in), s.n_out, s.n_out / 2, 99);
            const TensorView tv = weight_view(type, w, s.n_in, s.n_out);
            for (int64_t n_tokens : s.tokens) {
                const std::vector<float> x =
                    activations(s.n_in, n_tokens, static_cast<uint32_t>(7 * n_tokens));
                const std::vector<float> want = matmul_ref(type, w, x, s.n_in, s.n_out, n_tokens);
                for (ThreadPool &pool : pools) {
                    std::vector<float> y(want.size(), NAN);
                    kernels::matmul(tv, x.data(), y.data(), n_tokens, pool, scratch);
                    for (size_t i = 0; i < y.size(); ++i) {
                        ASSERT_EQ(0, std::memcmp(&y[i], &want[i], sizeof(float)))
                            << dtype_name(type) << " n_in " << s.n_in << " n_out " << s.n_out << " n_tokens "
                            << n_tokens << " threads " << pool.n_threads() << ": token "
                            << i / static_cast<size_t>(s.n_out) << " row " << i % static_cast<size_t>(s.n_out)
                            << " got " << y[i] << " want " << want[i];
                    }
                }
            }
        }
    }
}

// A token's outputs do not depend on the batch it came in: row t of a 37-token batch equals the same token
// matmul'd alone (the single-token path) and in a batch of two.
TEST_P(KGemm, MatmulBatchedEqualsSeparate) {
    const int64_t n_in = 1024, n_out = 37, n_tokens = 37;
    ThreadPool pool(2);
    std::vector<uint8_t> scratch;
    for (DType type : kTileTypes) {
        const std::vector<uint8_t> w = quantize_rows(type, randn(n_in * n_out, 11), n_out, n_in);
        const TensorView tv = weight_view(type, w, n_in, n_out);
        const std::vector<float> x = randn(n_in * n_tokens, 12);
        std::vector<float> y(static_cast<size_t>(n_out * n_tokens));
        kernels::matmul(tv, x.data(), y.data(), n_tokens, pool, scratch);
        for (int64_t t = 0; t < n_tokens; ++t) {
            std::vector<float> y1(static_cast<size_t>(n_out));
            kernels::matmul(tv, x.data() + t * n_in, y1.data(), 1, pool, scratch);
            ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + t * n_out, y1.size() * sizeof(float)))
                << dtype_name(type) << " token " << t << " alone";
            if (t + 1 < n_tokens) {
                std::vector<float> y2(static_cast<size_t>(2 * n_out));
                kernels::matmul(tv, x.data() + t * n_in, y2.data(), 2, pool, scratch);
                ASSERT_EQ(0, std::memcmp(y2.data(), y.data() + t * n_out, y2.size() * sizeof(float)))
                    << dtype_name(type) << " tokens " << t << ", " << t + 1 << " as a pair";
            }
        }
    }
}

INSTANTIATE_TEST_SUITE_P(AllIsas, KGemm, ::testing::ValuesIn(test::isas_of_this_arch()),
                         test::isa_param_name);

}  // namespace
}  // namespace td
