// Reference quantize / dequantize for every supported type. The quantizers reproduce ggml's reference
// algorithms (quantize_row_*_ref in ggml-quants.c) operation for operation, in float, so the bytes are the
// ones llama.cpp writes. The kernels target is built with -ffp-contract=off so no fused multiply-add can
// change a rounding here.
#include "kernels/ref/quants-ref.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/blocks.h"
#include "tensor/fp16.h"

namespace td::kernels::ref {
namespace {

int64_t n_blocks(int64_t n, const char *type) {
    TD_ASSERT(n >= 0 && n % kQK == 0, "{}: {} elements is not a multiple of the block size {}", type, n, kQK);
    return n / kQK;
}

// The element of largest magnitude with its sign (the first one on ties).
float signed_absmax(const float *x) {
    float amax = 0.0f;
    float max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

float absmax(const float *x) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    return amax;
}

void min_max(const float *x, float *min, float *max) {
    *min = FLT_MAX;
    *max = -FLT_MAX;
    for (int j = 0; j < kQK; ++j) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

}  // namespace

// ---- plain float types ------------------------------------------------------------------------------------

void to_float_f32(const void *src, float *dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void from_float_f32(const float *src, void *dst, int64_t n) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

void to_float_f16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = static_cast<const uint16_t *>(src);  // [n]
    for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(x[i]);
}

void from_float_f16(const float *src, void *dst, int64_t n) {
    uint16_t *y = static_cast<uint16_t *>(dst);  // [n]
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(src[i]);
}

void to_float_bf16(const void *src, float *dst, int64_t n) {
    const uint16_t *x = static_cast<const uint16_t *>(src);  // [n]
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(x[i]);
}

void from_float_bf16(const float *src, void *dst, int64_t n) {
    uint16_t *y = static_cast<uint16_t *>(dst);  // [n]
    for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(src[i]);
}

// ---- q4_0: x = d * (q - 8) --------------------------------------------------------------------------------

void to_float_q4_0(const void *src, float *dst, int64_t n) {
    const BlockQ4_0 *x = static_cast<const BlockQ4_0 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q4_0"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        float *y = dst + b * kQK;  // [32]
        for (int j = 0; j < kQK / 2; ++j) {
            y[j] = static_cast<float>((x[b].qs[j] & 0x0F) - 8) * d;
            y[j + kQK / 2] = static_cast<float>((x[b].qs[j] >> 4) - 8) * d;
        }
    }
}

void from_float_q4_0(const float *src, void *dst, int64_t n) {
    BlockQ4_0 *y = static_cast<BlockQ4_0 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q4_0"); ++b) {
        const float *x = src + b * kQK;  // [32]
        // d = max / -8 maps the element of largest magnitude to q = 0 exactly (x = -8 d); the other end
        // of the range only reaches +7 d, hence the clamp. q = trunc(x / d + 8.5) rounds half up.
        const float d = signed_absmax(x) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK / 2; ++j) {
            const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
            const int q1 = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
            y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
    }
}

// ---- q4_1: x = d * q + m ----------------------------------------------------------------------------------

void to_float_q4_1(const void *src, float *dst, int64_t n) {
    const BlockQ4_1 *x = static_cast<const BlockQ4_1 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q4_1"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float m = fp16_to_fp32(x[b].m);
        float *y = dst + b * kQK;  // [32]
        for (int j = 0; j < kQK / 2; ++j) {
            y[j] = static_cast<float>(x[b].qs[j] & 0x0F) * d + m;
            y[j + kQK / 2] = static_cast<float>(x[b].qs[j] >> 4) * d + m;
        }
    }
}

void from_float_q4_1(const float *src, void *dst, int64_t n) {
    BlockQ4_1 *y = static_cast<BlockQ4_1 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q4_1"); ++b) {
        const float *x = src + b * kQK;  // [32]
        // [min, max] is cut into 15 steps: d = (max - min) / 15, q = round((x - min) / d).
        float min, max;
        min_max(x, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        y[b].m = fp32_to_fp16(min);
        for (int j = 0; j < kQK / 2; ++j) {
            const int q0 = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
            const int q1 = std::min(15, static_cast<int>((x[j + kQK / 2] - min) * id + 0.5f));
            y[b].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
    }
}

// ---- q5_0: x = d * (q - 16) -------------------------------------------------------------------------------

void to_float_q5_0(const void *src, float *dst, int64_t n) {
    const BlockQ5_0 *x = static_cast<const BlockQ5_0 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q5_0"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        uint32_t qh;
        std::memcpy(&qh, x[b].qh, sizeof qh);
        float *y = dst + b * kQK;  // [32]
        for (int j = 0; j < kQK / 2; ++j) {
            const int q0 = (x[b].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
            const int q1 = (x[b].qs[j] >> 4) | static_cast<int>(((qh >> (j + kQK / 2)) & 1u) << 4);
            y[j] = static_cast<float>(q0 - 16) * d;
            y[j + kQK / 2] = static_cast<float>(q1 - 16) * d;
        }
    }
}

void from_float_q5_0(const float *src, void *dst, int64_t n) {
    BlockQ5_0 *y = static_cast<BlockQ5_0 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q5_0"); ++b) {
        const float *x = src + b * kQK;  // [32]
        // As q4_0 with 32 levels: d = max / -16, q = min(31, trunc(x / d + 16.5)).
        const float d = signed_absmax(x) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
            const int q1 = std::min(31, static_cast<int>(x[j + kQK / 2] * id + 16.5f));
            y[b].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= static_cast<uint32_t>(q0 >> 4) << j;
            qh |= static_cast<uint32_t>(q1 >> 4) << (j + kQK / 2);
        }
        std::memcpy(y[b].qh, &qh, sizeof qh);
    }
}

// ---- q5_1: x = d * q + m ----------------------------------------------------------------------------------

void to_float_q5_1(const void *src, float *dst, int64_t n) {
    const BlockQ5_1 *x = static_cast<const BlockQ5_1 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q5_1"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float m = fp16_to_fp32(x[b].m);
        uint32_t qh;
        std::memcpy(&qh, x[b].qh, sizeof qh);
        float *y = dst + b * kQK;  // [32]
        for (int j = 0; j < kQK / 2; ++j) {
            const int q0 = (x[b].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
            const int q1 = (x[b].qs[j] >> 4) | static_cast<int>(((qh >> (j + kQK / 2)) & 1u) << 4);
            y[j] = static_cast<float>(q0) * d + m;
            y[j + kQK / 2] = static_cast<float>(q1) * d + m;
        }
    }
}

void from_float_q5_1(const float *src, void *dst, int64_t n) {
    BlockQ5_1 *y = static_cast<BlockQ5_1 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q5_1"); ++b) {
        const float *x = src + b * kQK;  // [32]
        // As q4_1 with 31 steps. ggml does not clamp here ((x - min) / d <= 31 up to rounding, so
        // trunc(+0.5) <= 31); neither do we, to keep the bytes identical even in that corner.
        float min, max;
        min_max(x, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        y[b].m = fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const uint32_t q0 = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
            const uint32_t q1 = static_cast<uint8_t>((x[j + kQK / 2] - min) * id + 0.5f);
            y[b].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((q0 & 0x10u) >> 4) << j;
            qh |= ((q1 & 0x10u) >> 4) << (j + kQK / 2);
        }
        std::memcpy(y[b].qh, &qh, sizeof qh);
    }
}

// ---- q8_0: x = d * q
// ----------------------------------------------------------------------------------------

void to_float_q8_0(const void *src, float *dst, int64_t n) {
    const BlockQ8_0 *x = static_cast<const BlockQ8_0 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q8_0"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = static_cast<float>(x[b].qs[j]) * d;
    }
}

void from_float_q8_0(const float *src, void *dst, int64_t n) {
    BlockQ8_0 *y = static_cast<BlockQ8_0 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q8_0"); ++b) {
        const float *x = src + b * kQK;  // [32]
        // d = absmax / 127, q = round(x / d) (half away from zero), so q in -127..127.
        const float d = absmax(x) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        for (int j = 0; j < kQK; ++j) y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
    }
}

// ---- q8_1: x = d * q, s = d * sum(q)
// -------------------------------------------------------------------------

void to_float_q8_1(const void *src, float *dst, int64_t n) {
    const BlockQ8_1 *x = static_cast<const BlockQ8_1 *>(src);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q8_1"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        for (int j = 0; j < kQK; ++j) dst[b * kQK + j] = static_cast<float>(x[b].qs[j]) * d;
    }
}

void from_float_q8_1(const float *src, void *dst, int64_t n) {
    BlockQ8_1 *y = static_cast<BlockQ8_1 *>(dst);  // [n / 32]
    for (int64_t b = 0; b < n_blocks(n, "q8_1"); ++b) {
        const float *x = src + b * kQK;  // [32]
        const float d = absmax(x) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < kQK; ++j) {
            y[b].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
            sum += y[b].qs[j];
        }
        y[b].s = fp32_to_fp16(static_cast<float>(sum) * d);
    }
}

}  // namespace td::kernels::ref
