// Shared by the kernel tests: the ISAs a test runs on (those this build's target architecture compiles in,
// x86: scalar, avx2, avx512; ARM: scalar, neon; a CPU that lacks one reports that test as skipped), a
// fixture that forces the ISA, and the reference matmul every fast kernel is compared with.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace td::test {

inline std::vector<kernels::Isa> isas_of_this_arch() {
#if defined(__x86_64__) || defined(_M_X64)
    return {kernels::Isa::scalar, kernels::Isa::avx2, kernels::Isa::avx512};
#elif defined(__aarch64__)
    return {kernels::Isa::scalar, kernels::Isa::neon};
#else
    return {kernels::Isa::scalar};
#endif
}

inline std::string isa_param_name(const ::testing::TestParamInfo<kernels::Isa> &info) {
    return kernels::isa_name(info.param);
}

// A parameterised test on one ISA: forced for the test's duration, skipped when the CPU or build lacks it.
class IsaTest : public ::testing::TestWithParam<kernels::Isa> {
protected:
    void SetUp() override {
        if (!kernels::isa_force(GetParam()))
            GTEST_SKIP() << "this CPU or build lacks " << kernels::isa_name(GetParam());
    }
    void TearDown() override { kernels::isa_reset(); }
};

inline std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(static_cast<size_t>(n));
    for (float &x : v) x = dist(rng);
    return v;
}

// Rows of n floats quantized with the reference: [rows][row_bytes].
inline std::vector<uint8_t> quantize_rows(DType type, const std::vector<float> &x, int64_t rows, int64_t n) {
    const kernels::TypeKernels *r = kernels::type_kernels_ref(type);
    const size_t row_bytes = dtype_row_bytes(type, n);
    std::vector<uint8_t> q(row_bytes * static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) r->from_float(x.data() + i * n, q.data() + i * row_bytes, n);
    return q;
}

// y[t][o] = reference vec_dot(W row o, reference-quantized x row t).   w: [n_out][row bytes], x:
// [n_tokens][n_in]
inline std::vector<float> matmul_ref(DType type, const std::vector<uint8_t> &w, const std::vector<float> &x,
                                     int64_t n_in, int64_t n_out, int64_t n_tokens) {
    const kernels::TypeKernels *r = kernels::type_kernels_ref(type);
    const std::vector<uint8_t> xq = quantize_rows(r->vec_dot_type, x, n_tokens, n_in);
    const size_t w_row = dtype_row_bytes(type, n_in);
    const size_t x_row = dtype_row_bytes(r->vec_dot_type, n_in);
    std::vector<float> y(static_cast<size_t>(n_tokens * n_out));
    for (int64_t t = 0; t < n_tokens; ++t)
        for (int64_t o = 0; o < n_out; ++o)
            r->vec_dot(n_in, &y[t * n_out + o], w.data() + o * w_row, xq.data() + t * x_row);
    return y;
}

// A [n_out rows of n_in] weight matrix over `w`'s bytes.
inline TensorView weight_view(DType type, const std::vector<uint8_t> &w, int64_t n_in, int64_t n_out) {
    TensorView tv;
    tv.name = "w";
    tv.type = type;
    tv.n_dims = 2;
    tv.ne[0] = n_in;
    tv.ne[1] = n_out;
    tv.data = w.data();
    return tv;
}

}  // namespace td::test
