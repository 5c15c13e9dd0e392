// Reference dot products. f32 and f16 use the fixed lane orders described below, bf16 accumulates in double.
// Block types compute each block's integer sum exactly in int32, scale it once in float, and add it into
// lane b % 8 of an accumulator (kernels/blocks.h), the order every SIMD variant reproduces bit for bit.
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/blocks.h"
#include "kernels/ref/quants-ref.h"
#include "tensor/fp16.h"

namespace td::kernels::ref {
namespace {

int64_t n_blocks(int64_t n, const char *name) {
    TD_ASSERT(n >= 0 && n % kQK == 0, "{}: {} elements is not a multiple of the block size {}", name, n, kQK);
    return n / kQK;
}

}  // namespace

// The f16 dot order every ISA reproduces bit for bit:
//   32 lanes accumulate with fused multiply-adds over blocks of 32 (lane l takes i = 32b + l), then whole
//   blocks of 8 go into lanes 0..7; lanes fold as v[l] = (a[l] + a[l+8]) + (a[l+16] + a[l+24]),
//   q[l] = v[l] + v[l+4], sum = (q[0] + q[2]) + (q[1] + q[3]); the last n % 8 products add in order.
// One order on every machine keeps results identical across ISAs (and so across the nodes of a cluster).
template <typename LoadX, typename LoadY>
static float dot_f32_canonical(int64_t n, LoadX load_x, LoadY load_y) {
    float a[32] = {};  // [4 accumulators][8 lanes]
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int l = 0; l < 32; ++l) a[l] = std::fma(load_x(i + l), load_y(i + l), a[l]);
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; ++l) a[l] = std::fma(load_x(i + l), load_y(i + l), a[l]);
    float v[8], q[4];
    for (int l = 0; l < 8; ++l) v[l] = (a[l] + a[l + 8]) + (a[l + 16] + a[l + 24]);
    for (int l = 0; l < 4; ++l) q[l] = v[l] + v[l + 4];
    float sum = (q[0] + q[2]) + (q[1] + q[3]);
    for (; i < n; ++i) sum += load_x(i) * load_y(i);
    return sum;
}

// The f32 dot order every ISA reproduces bit for bit. It is the order of ggml_vec_dot_f32 in a llama.cpp
// built for AVX-512 with gcc (what its CPU backend runs for one-token f32 matmuls), so f32 models give
// llama.cpp's logits to the last bit:
//   64 lanes a[j][l] (j < 4, l < 16) accumulate x[64b + 16j + l] * y[...] with fused multiply-adds;
//   a0 += a2, a1 += a3, a0 += a1 lane by lane; then the 16 lanes fold as a 512-bit reduce-add:
//   h[l] = a[l] + a[l+8], q[l] = h[l] + h[l+4], sum = (q[0] + q[2]) + (q[1] + q[3]);
//   of the n % 64 products left, those before the last n % 8 are rounded and added in order (gcc
//   vectorises that part of ggml's tail loop), the last n % 8 are fused-added in order.
void vec_dot_f32_f32(int64_t n, float *s, const void *vx, const void *vy) {
    const float *x = static_cast<const float *>(vx);  // [n]
    const float *y = static_cast<const float *>(vy);  // [n]
    float a[4][16] = {};                              // [accumulator][lane]
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 16; ++l) a[j][l] = std::fma(x[i + 16 * j + l], y[i + 16 * j + l], a[j][l]);
    float h[8], q[4];
    for (int l = 0; l < 16; ++l) a[0][l] = (a[0][l] + a[2][l]) + (a[1][l] + a[3][l]);
    for (int l = 0; l < 8; ++l) h[l] = a[0][l] + a[0][l + 8];
    for (int l = 0; l < 4; ++l) q[l] = h[l] + h[l + 4];
    float sum = (q[0] + q[2]) + (q[1] + q[3]);
    const int64_t fused = n - n % 8;  // first product of the fused tail
    for (; i < fused; ++i) sum += x[i] * y[i];
    for (; i < n; ++i) sum = std::fma(x[i], y[i], sum);
    *s = sum;
}

void vec_dot_f16_f16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = static_cast<const uint16_t *>(vx);  // [n] half
    const uint16_t *y = static_cast<const uint16_t *>(vy);  // [n] half
    *s = dot_f32_canonical(
        n, [x](int64_t i) { return fp16_to_fp32(x[i]); }, [y](int64_t i) { return fp16_to_fp32(y[i]); });
}

void vec_dot_bf16_bf16(int64_t n, float *s, const void *vx, const void *vy) {
    const uint16_t *x = static_cast<const uint16_t *>(vx);  // [n] bfloat16
    const uint16_t *y = static_cast<const uint16_t *>(vy);  // [n] bfloat16
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
    *s = static_cast<float>(sum);
}

// s = sum_b dx_b * dy_b * sum_j (qx_bj - 8) * qy_bj
void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ4_0 *x = static_cast<const BlockQ4_0 *>(vx);  // [n / 32]
    const BlockQ8_0 *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, "q4_0"); ++b) {
        int32_t sumi = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const int32_t lo = (x[b].qs[j] & 0x0F) - 8;  // element j
            const int32_t hi = (x[b].qs[j] >> 4) - 8;    // element j + 16
            sumi += lo * y[b].qs[j] + hi * y[b].qs[j + kQK / 2];
        }
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

// sum_j (dx qx_j + mx)(dy qy_j) = dx dy sum_j qx_j qy_j + mx (dy sum_j qy_j) = dx dy sumi + mx sy
void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ4_1 *x = static_cast<const BlockQ4_1 *>(vx);  // [n / 32]
    const BlockQ8_1 *y = static_cast<const BlockQ8_1 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, "q4_1"); ++b) {
        int32_t sumi = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            sumi += (x[b].qs[j] & 0x0F) * y[b].qs[j] + (x[b].qs[j] >> 4) * y[b].qs[j + kQK / 2];
        }
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi) +
                              fp16_to_fp32(x[b].m) * fp16_to_fp32(y[b].s);
    }
    *s = dot_lanes_sum(acc);
}

// s = sum_b dx_b * dy_b * sum_j (qx_bj - 16) * qy_bj, qx 5 bits (4 in qs, the 5th in qh)
void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ5_0 *x = static_cast<const BlockQ5_0 *>(vx);  // [n / 32]
    const BlockQ8_0 *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, "q5_0"); ++b) {
        uint32_t qh;
        std::memcpy(&qh, x[b].qh, sizeof qh);
        int32_t sumi = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const int32_t lo = ((x[b].qs[j] & 0x0F) | static_cast<int32_t>(((qh >> j) & 1u) << 4)) - 16;
            const int32_t hi = ((x[b].qs[j] >> 4) | static_cast<int32_t>(((qh >> (j + 16)) & 1u) << 4)) - 16;
            sumi += lo * y[b].qs[j] + hi * y[b].qs[j + kQK / 2];
        }
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

// As q4_1 with 5-bit qx: dx dy sumi + mx sy
void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ5_1 *x = static_cast<const BlockQ5_1 *>(vx);  // [n / 32]
    const BlockQ8_1 *y = static_cast<const BlockQ8_1 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, "q5_1"); ++b) {
        uint32_t qh;
        std::memcpy(&qh, x[b].qh, sizeof qh);
        int32_t sumi = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const int32_t lo = (x[b].qs[j] & 0x0F) | static_cast<int32_t>(((qh >> j) & 1u) << 4);
            const int32_t hi = (x[b].qs[j] >> 4) | static_cast<int32_t>(((qh >> (j + 16)) & 1u) << 4);
            sumi += lo * y[b].qs[j] + hi * y[b].qs[j + kQK / 2];
        }
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi) +
                              fp16_to_fp32(x[b].m) * fp16_to_fp32(y[b].s);
    }
    *s = dot_lanes_sum(acc);
}

// s = sum_b dx_b * dy_b * sum_j qx_bj * qy_bj
void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(vx);  // [n / 32]
    const BlockQ8_0 *y = static_cast<const BlockQ8_0 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, "q8_0"); ++b) {
        int32_t sumi = 0;
        for (int j = 0; j < kQK; ++j) sumi += x[b].qs[j] * y[b].qs[j];
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

// q8_1 is normally only the activation side; as weights it is q8_0 with an unused s.
void vec_dot_q8_1_q8_1(int64_t n, float *s, const void *vx, const void *vy) {
    const BlockQ8_1 *x = static_cast<const BlockQ8_1 *>(vx);  // [n / 32]
    const BlockQ8_1 *y = static_cast<const BlockQ8_1 *>(vy);  // [n / 32]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_blocks(n, "q8_1"); ++b) {
        int32_t sumi = 0;
        for (int j = 0; j < kQK; ++j) sumi += x[b].qs[j] * y[b].qs[j];
        acc[b % kDotLanes] += fp16_to_fp32(x[b].d) * fp16_to_fp32(y[b].d) * static_cast<float>(sumi);
    }
    *s = dot_lanes_sum(acc);
}

}  // namespace td::kernels::ref
