// Scalar reference row ops: the oracle every ISA variant is tested against. Contracts are those of the
// functions of the same name in kernels/ops.h, which dispatch here or to an ISA variant.
#pragma once

#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/ops.h"

namespace td::kernels::ref {

void rmsnorm(const float *x, const float *w, float *y, int64_t n, float eps);
void rope(float *x, int32_t n_head, int32_t head_dim, int32_t pos, const RopeParams &p);
void softmax(float *x, int64_t n);
void swiglu(const float *gate, const float *up, float *out, int64_t n);
void add_inplace(float *y, const float *x, int64_t n);
void attention_head(const float *q, const void *k, const void *v, bool kv_f16, int64_t kv_stride,
                    int32_t head_dim, int32_t n_kv, float scale, float softcap, float *scores, float *out);
void store_row(const float *src, void *dst, bool to_f16, int64_t n);

// How attention reads K and V of types other than f16 and f32: one ISA's TypeKernels for them (ops.cpp).
struct KvReaders {
    VecDotFn k_dot = nullptr;        // K's vec_dot
    FromFloatFn q_to_k = nullptr;    // the query into K's vec_dot_type
    ToFloatFn v_to_float = nullptr;  // one V row into f32
};
// kernels/ops.h attention_group_typed for one query head (attention_head is this with f16 or f32 rows).
void attention_head_typed(const float *q, const KvRows &k, const KvRows &v, const KvReaders &rd,
                          int32_t head_dim, int32_t n_kv, float scale, float softcap, float *out);

// RoPE's angles for one position, as rope() computes them: cos_out[i], sin_out[i] of theta_i for the n_rot /
// 2 pairs (n_rot <= 1024). Returns n_rot / 2. Shared with the SIMD rope, which rotates with them.
int32_t rope_angles(int32_t pos, const RopeParams &p, float *cos_out, float *sin_out);

// The scalar side of attention_head's online softmax, for the SIMD kernels that compute all scores first:
// given the scores s_j (already scaled; soft-capped here as attention_head does when softcap > 0), writes
// w[j] = e^(s_j - M_j), or 1 when s_j raises the running max M, and rescale[j] = e^(M_(j-1) - M_j) when it
// does, else 1, with the reference's libm calls; returns the sum S in the reference's order. w may alias s.
float softmax_weights(const float *s, int32_t n_kv, float softcap, float *w, float *rescale);

}  // namespace td::kernels::ref
