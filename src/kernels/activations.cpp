#include "kernels/activations.h"

#include <cmath>

#include "tensor/fp16.h"

namespace td::kernels {

float gelu_f16_rounded(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
    constexpr float kCoefA = 0.044715f;
    const float h = fp16_to_fp32(fp32_to_fp16(x));
    const float g = 0.5f * h * (1.0f + std::tanh(kSqrt2OverPi * h * (1.0f + kCoefA * h * h)));
    return fp16_to_fp32(fp32_to_fp16(g));
}

void geglu(const float *gate, const float *up, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_f16_rounded(gate[i]) * up[i];
}

}  // namespace td::kernels
