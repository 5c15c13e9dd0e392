// Gated activations other than SwiGLU (which lives in ops.h with its SIMD variants).
#pragma once

#include <cstdint>

namespace td::kernels {

// out[i] = gelu(gate[i]) * up[i], with gelu the tanh approximation
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// rounded the way llama.cpp's CPU backend computes it (its published GELU table): the input is rounded to
// f16, gelu is evaluated in f32 and the result rounded to f16; x <= -10 gives 0 and x >= 10 gives x.
// gate, up, out: [n]; out may alias gate or up.
void geglu(const float *gate, const float *up, float *out, int64_t n);

// The scalar gelu of one value with the rounding described above (for tests and references).
float gelu_f16_rounded(float x);

}  // namespace td::kernels
