// Per-type row kernels and the matrix multiply, with run-time ISA dispatch.
//
// Every type has a scalar reference (kernels/ref/) that reads like llama2.c; ISA variants (kernels/x86/,
// kernels/arm/) are chosen once at startup from cpuid and are tested against the reference. Weights are
// never dequantized as whole matrices: a matmul quantizes the activation rows once into the weight type's
// vec_dot_type (e.g. q8_0 for q4_0 weights) and runs integer/float dot products row by row.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread-pool.h"
#include "tensor/dtype.h"
#include "tensor/tensor.h"

namespace td::kernels {

enum class Isa { scalar = 0, avx2 = 1, avx512 = 2, neon = 3 };

const char *isa_name(Isa isa);
// The best ISA this CPU supports among those compiled in.
Isa isa_detected();
// The ISA in use: isa_detected() unless TANDEM_ISA=scalar|avx2|avx512|neon (or isa_force) says less.
Isa isa_active();
// Tests use this to run the same checks on each ISA; returns false if the CPU lacks it (or it is not compiled
// in). Scalar is always available.
bool isa_force(Isa isa);
// Forgets isa_force: the next isa_active() reads TANDEM_ISA again.
void isa_reset();
// True when the active ISA is avx512 and the CPU also has AVX-512 VNNI, so the x86/*-avx512vnni.cpp kernels
// may run (not every AVX-512 CPU has it).
bool avx512_vnni_active();

using ToFloatFn = void (*)(const void *src, float *dst, int64_t n);
using FromFloatFn = void (*)(const float *src, void *dst, int64_t n);
// *s = dot(x, y) over n elements; x is of the kernel's type, y of its vec_dot_type.
using VecDotFn = void (*)(int64_t n, float *s, const void *x, const void *y);

// Supported: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1 (ggml's block layouts, kernels/blocks.h).
// vec_dot_type: f32->f32, f16->f16, bf16->bf16, q4_0/q5_0/q8_0->q8_0, q4_1/q5_1/q8_1->q8_1, as in ggml.
// from_float writes the bytes ggml's reference quantizer writes, on every ISA. Every ISA's vec_dot for a
// block type returns the reference's result bit for bit; float types agree within rounding.
// For block types n must be a multiple of 32; q8_0/q8_1 y operands must come from from_float (never -128).
struct TypeKernels {
    DType type = DType::f32;
    ToFloatFn to_float = nullptr;      // dequantize one row of n elements
    FromFloatFn from_float = nullptr;  // quantize one row of n elements (n a multiple of the block size)
    VecDotFn vec_dot = nullptr;
    DType vec_dot_type = DType::f32;  // what the other operand of vec_dot must be quantized to
};

// Kernels for the active ISA; nullptr when the type is not supported.
const TypeKernels *type_kernels(DType type);
// Scalar reference kernels; nullptr when the type is not supported.
const TypeKernels *type_kernels_ref(DType type);
// Kernels of a given ISA. Where that ISA has no specialisation for a function, the next lower ISA's is used
// (avx512 -> avx2 -> reference); an ISA not compiled into this build gives the reference. Does not check
// that the CPU supports the ISA (isa_force does).
const TypeKernels *type_kernels_for(DType type, Isa isa);

// y = x W^T:  w [n_out rows of n_in] (any supported type, w.ne = {n_in, n_out}),
//             x [n_tokens, n_in] f32 rows, y [n_tokens, n_out] f32 rows (y must not overlap x).
// n_in must be a multiple of the weight type's block size and w.data aligned to its element/block type
// (asserted: the loader validates both). Uses the active ISA's kernels.
// `scratch` holds the activations quantized to the weight's vec_dot_type; it grows as needed and is
// reused across calls so nothing is allocated on the steady-state path. Each output element is computed by
// one vec_dot call independent of n_tokens, so results do not depend on the batch it came in.
void matmul(const TensorView &w, const float *x, float *y, int64_t n_tokens, ThreadPool &pool,
            std::vector<uint8_t> &scratch);

// Several matmuls of the same x (q, k and v; gate and up): y_i = x W_i^T for each (w, y) of outs (1 to 4),
// bit for bit what matmul gives for each, with x quantized once and all rows in one parallel dispatch (one
// wait instead of one per matrix). Matrices that disagree on n_in or vec_dot_type run one after another.
struct MatmulOut {
    const TensorView *w;
    float *y;  // [n_tokens, w->ne[1]]
};
void matmul_group(const MatmulOut *outs, int n_outs, const float *x, int64_t n_tokens, ThreadPool &pool,
                  std::vector<uint8_t> &scratch);

}  // namespace td::kernels
