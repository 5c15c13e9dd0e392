// The ISAs a kernel test runs on: those this build's target architecture compiles in (x86: scalar, avx2,
// avx512; ARM: scalar, neon). A CPU that lacks one of them still reports that test as skipped.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/kernels.h"

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

}  // namespace td::test
