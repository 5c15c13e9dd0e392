// Reference K-quant dot products against q8_k. Each super-block's integer sums are exact int32 (bounds in
// the comments); the float expression per super-block and the lane order are the contract of kquants-ref.h,
// which x86/kquants-avx2.cpp reproduces bit for bit.
#include "core/check.h"
#include "kernels/blocks.h"
#include "kernels/ref/kquants-ref.h"
#include "tensor/fp16.h"

namespace td::kernels::ref {
namespace {

int64_t n_superblocks(int64_t n, const char *type) {
    TD_ASSERT(n >= 0 && n % kQK_K == 0, "{}: {} elements is not a multiple of the block size {}", type, n,
              kQK_K);
    return n / kQK_K;
}

// sum over elements e0 .. e0 + 15 of y.qs[e] * q(e)
template <typename Level>
int32_t group_dot(const BlockQ8_K &y, int e0, int len, Level q) {
    int32_t s = 0;
    for (int e = e0; e < e0 + len; ++e) s += q(e) * y.qs[e];
    return s;
}

void get_scale_min_k4(int j, const uint8_t *q, int32_t *sc, int32_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// *s = sum over super-blocks of dot(x[b], y[b]), each added into accumulator lane b % 8 and the lanes folded
// in the canonical tree: the loop every K-quant dot shares. dot returns the super-block's scaled float.
template <typename Block, typename SuperDot>
void superblock_dot(int64_t n, float *s, const void *vx, const void *vy, const char *type, SuperDot dot) {
    const Block *x = static_cast<const Block *>(vx);          // [n / 256]
    const BlockQ8_K *y = static_cast<const BlockQ8_K *>(vy);  // [n / 256]
    float acc[kDotLanes] = {};
    for (int64_t b = 0; b < n_superblocks(n, type); ++b) acc[b % kDotLanes] += dot(x[b], y[b]);
    *s = dot_lanes_sum(acc);
}

// q4_k and q5_k: eight runs of 32 with 6-bit scales and mins; q(e) is element e's level.
// dall * sum_j sc_j (run j . y) - dmin * sum_j m_j bsum_j.
template <typename Block, typename Level>
float scale_min_superblock(const Block &xb, const BlockQ8_K &yb, Level q) {
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < kQK_K / 32; ++j) {
        int32_t sc, m;
        get_scale_min_k4(j, xb.scales, &sc, &m);
        sumi += sc * group_dot(yb, 32 * j, 32, q);
        summ += m * (yb.bsums[2 * j] + yb.bsums[2 * j + 1]);
    }
    const float dall = fp16_to_fp32(xb.d) * yb.d;
    const float dmin = fp16_to_fp32(xb.dmin) * yb.d;
    return dall * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
}

}  // namespace

// |sumi| <= 16 groups * 15 * 16 * 3 * 127, |summ| <= 16 * 15 * 16 * 127.
void vec_dot_q2_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    superblock_dot<BlockQ2_K>(n, s, vx, vy, "q2_k", [](const BlockQ2_K &xb, const BlockQ8_K &yb) {
        auto q = [&xb](int e) { return (xb.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; };
        int32_t sumi = 0, summ = 0;
        for (int g = 0; g < kQK_K / 16; ++g) {
            sumi += (xb.scales[g] & 0x0F) * group_dot(yb, 16 * g, 16, q);
            summ += (xb.scales[g] >> 4) * yb.bsums[g];
        }
        const float dall = fp16_to_fp32(xb.d) * yb.d;
        const float dmin = fp16_to_fp32(xb.dmin) * yb.d;
        return dall * static_cast<float>(sumi) - dmin * static_cast<float>(summ);
    });
}

// |sumi| <= 16 * 32 * 16 * 4 * 127.
void vec_dot_q3_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    superblock_dot<BlockQ3_K>(n, s, vx, vy, "q3_k", [](const BlockQ3_K &xb, const BlockQ8_K &yb) {
        auto q = [&xb](int e) {
            const int lo = (xb.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
            return lo - (((xb.hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
        };
        int32_t sumi = 0;
        for (int g = 0; g < kQK_K / 16; ++g) {
            const int lo = g < 8 ? (xb.scales[g] & 0x0F) : (xb.scales[g - 8] >> 4);
            const int hi = (xb.scales[8 + g % 4] >> (2 * (g / 4))) & 3;
            sumi += ((lo | (hi << 4)) - 32) * group_dot(yb, 16 * g, 16, q);
        }
        return fp16_to_fp32(xb.d) * yb.d * static_cast<float>(sumi);
    });
}

// |sumi| <= 8 * 63 * 32 * 15 * 127, |summ| <= 8 * 63 * 32 * 127.
void vec_dot_q4_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    superblock_dot<BlockQ4_K>(n, s, vx, vy, "q4_k", [](const BlockQ4_K &xb, const BlockQ8_K &yb) {
        return scale_min_superblock(
            xb, yb, [&xb](int e) { return (xb.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0F; });
    });
}

// |sumi| <= 8 * 63 * 32 * 31 * 127, |summ| as q4_k.
void vec_dot_q5_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    superblock_dot<BlockQ5_K>(n, s, vx, vy, "q5_k", [](const BlockQ5_K &xb, const BlockQ8_K &yb) {
        return scale_min_superblock(xb, yb, [&xb](int e) {
            const int lo = (xb.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0F;
            return lo | (((xb.qh[e % 32] >> (e / 32)) & 1) << 4);
        });
    });
}

// |sumi| <= 16 * 128 * 16 * 32 * 127.
void vec_dot_q6_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    superblock_dot<BlockQ6_K>(n, s, vx, vy, "q6_k", [](const BlockQ6_K &xb, const BlockQ8_K &yb) {
        auto q = [&xb](int e) {
            const int c = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t lo = xb.ql[64 * c + 32 * (k & 1) + l];
            return (((k < 2 ? lo : lo >> 4) & 0x0F) | (((xb.qh[32 * c + l] >> (2 * k)) & 3) << 4)) - 32;
        };
        int32_t sumi = 0;
        for (int g = 0; g < kQK_K / 16; ++g) sumi += xb.scales[g] * group_dot(yb, 16 * g, 16, q);
        return fp16_to_fp32(xb.d) * yb.d * static_cast<float>(sumi);
    });
}

// q8_k is the activation type; as a weight it is a plain int8 dot. |sumi| <= 256 * 127 * 127.
void vec_dot_q8_k_q8_k(int64_t n, float *s, const void *vx, const void *vy) {
    superblock_dot<BlockQ8_K>(n, s, vx, vy, "q8_k", [](const BlockQ8_K &xb, const BlockQ8_K &yb) {
        int32_t sumi = 0;
        for (int e = 0; e < kQK_K; ++e) sumi += xb.qs[e] * yb.qs[e];
        return xb.d * yb.d * static_cast<float>(sumi);
    });
}

}  // namespace td::kernels::ref
