// Reference quantize / dequantize for the K-quants. The quantizers reproduce ggml's quantize_row_*_K_ref
// (ggml-quants.c) operation for operation in float, including the order of every sum and product, so the
// bytes are the ones llama.cpp writes. The kernels target is built with -ffp-contract=off, so no fused
// multiply-add changes a rounding here (ggml-base is built without FMA contraction too).
#include "kernels/ref/kquants-ref.h"

#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/blocks.h"
#include "tensor/fp16.h"

namespace td::kernels::ref {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS: a group below this is all zero

int64_t n_superblocks(int64_t n, const char *type) {
    TD_ASSERT(n >= 0 && n % kQK_K == 0, "{}: {} elements is not a multiple of the block size {}", type, n,
              kQK_K);
    return n / kQK_K;
}

// Round to nearest, ties to even, through the float mantissa (ggml's nearest_int): adding 1.5 * 2^23 leaves
// the rounded integer in the low mantissa bits. Meant for |x| <= 2^22 - 1; larger values give ggml's
// (equally meaningless) result, which the callers clamp.
int nearest_int(float x) {
    const float v = x + 12582912.0f;
    int32_t i;
    std::memcpy(&i, &v, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

int clamp_int(int v, int lo, int hi) {
    return v < lo ? lo : (v > hi ? hi : v);
}

// Symmetric levels -nmax..nmax-1 for n values, scale chosen by a small search that maximises the weighted
// (w = x^2) fit sum(w x l)^2 / sum(w l^2). L gets l + nmax. Returns the scale (0 for an all-zero group).
// ggml's make_qx_quants with rmse_type 1 and no importance weights.
float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f;
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.0f;
    }
    float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0.0f;
    float suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * static_cast<float>(l);
            suml2 += w * static_cast<float>(l) * static_cast<float>(l);
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i)
                L[i] = static_cast<int8_t>(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

// As make_qx_quants for q3_k: start from the absmax scale, then up to 5 rounds of moving single levels where
// that improves the weighted fit. ggml's make_q3_quants with do_rmse.
float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f;
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.0f;
    }
    const float iscale = static_cast<float>(-nmax) / max;
    float sumlx = 0.0f;
    float suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<int8_t>(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * static_cast<float>(l);
        suml2 += w * static_cast<float>(l) * static_cast<float>(l);
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * static_cast<float>(L[i]);
            if (slx > 0.0f) {
                float sl2 = suml2 - w * static_cast<float>(L[i]) * static_cast<float>(L[i]);
                const int new_l = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * static_cast<float>(new_l);
                    sl2 += w * static_cast<float>(new_l) * static_cast<float>(new_l);
                    if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = static_cast<int8_t>(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (n_changed == 0) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

// Asymmetric levels 0..nmax: x ~ scale * l - the_min, fitted by weighted least squares over nstep + 1 trial
// scales around nmax / (max - min). Returns the scale, *the_min >= 0. ggml's make_qkx2_quants.
float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min,
                       uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0];
    float max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    float iscale = static_cast<float>(nmax) / (max - min);
    float scale = 1.0f / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
        float diff = scale * static_cast<float>(L[i]) + min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = static_cast<uint8_t>(l);
            const float w = weights[i];
            const float lf = static_cast<float>(l);
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0.0f;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
                diff = use_mad ? std::fabs(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

// 6-bit scale and min of sub-block j (0..7) of a q4_k/q5_k super-block: j < 4 in the low 6 bits of bytes j
// and j + 4; j >= 4 in the nibbles of byte j + 4 plus the top 2 bits of bytes j - 4 and j.
void get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
        *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// 6-bit scale (0..63, stored + 32) of group g (0..15) of a q3_k super-block.
int q3_k_scale(const uint8_t *scales, int g) {
    const int lo = g < 8 ? (scales[g] & 0x0F) : (scales[g - 8] >> 4);
    const int hi = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    return lo | (hi << 4);
}

// Packs 4 levels of 2 bits: byte l of each 32-byte run holds elements l, l + 32, l + 64, l + 96 of a chunk.
void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < kQK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                                 (L[j + l + 96] << 6));
}

// The 12 scale bytes of q4_k/q5_k from 8 six-bit scales and mins.
void pack_scales_k4(const uint8_t *ls, const uint8_t *lm, uint8_t *scales) {
    for (int j = 0; j < kQK_K / 32; ++j) {
        if (j < 4) {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = static_cast<uint8_t>((ls[j] & 0x0F) | ((lm[j] & 0x0F) << 4));
            scales[j - 4] = static_cast<uint8_t>(scales[j - 4] | ((ls[j] >> 4) << 6));
            scales[j] = static_cast<uint8_t>(scales[j] | ((lm[j] >> 4) << 6));
        }
    }
}

// The shared first half of q4_k and q5_k: per sub-block of 32 a fitted (scale, min), then both quantized to
// 6 bits against the largest, then every element re-quantized against its stored scale and min.
// Fills d, dmin, scales and L [256] (levels 0..nmax).
void quantize_k4_common(const float *x, int nmax, float rmin, int nstep, uint16_t *d_out, uint16_t *dmin_out,
                        uint8_t *scales_out, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32];
    float mins[kQK_K / 32];
    float scales[kQK_K / 32];
    float max_scale = 0.0f;  // scales are positive as the min is subtracted
    float max_min = 0.0f;
    for (int j = 0; j < kQK_K / 32; ++j) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = std::sqrt(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                     nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    uint8_t ls[kQK_K / 32], lm[kQK_K / 32];
    for (int j = 0; j < kQK_K / 32; ++j) {
        // ggml stores nearest_int into a uint8_t before clamping; the value is in 0..63 (+ rounding) anyway.
        const auto s = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
        const auto m = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
        ls[j] = s < 63 ? s : 63;
        lm[j] = m < 63 ? m : 63;
    }
    std::memset(scales_out, 0, 12);
    pack_scales_k4(ls, lm, scales_out);
    *d_out = fp32_to_fp16(max_scale / 63.0f);
    *dmin_out = fp32_to_fp16(max_min / 63.0f);

    for (int j = 0; j < kQK_K / 32; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, scales_out, &sc, &m);
        const float d = fp16_to_fp32(*d_out) * static_cast<float>(sc);
        if (d == 0.0f) continue;  // keeps the levels make_qkx2_quants chose
        const float dm = fp16_to_fp32(*dmin_out) * static_cast<float>(m);
        for (int ii = 0; ii < 32; ++ii) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
        }
    }
}

}  // namespace

// ---- q2_k -------------------------------------------------------------------------------------------------

void to_float_q2_k(const void *src, float *dst, int64_t n) {
    const BlockQ2_K *x = static_cast<const BlockQ2_K *>(src);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q2_k"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float min = fp16_to_fp32(x[b].dmin);
        float *y = dst + b * kQK_K;  // [256]
        for (int e = 0; e < kQK_K; ++e) {
            const int c = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t sc = x[b].scales[e / 16];
            const int q = (x[b].qs[32 * c + l] >> (2 * k)) & 3;
            y[e] =
                d * static_cast<float>(sc & 0x0F) * static_cast<float>(q) - min * static_cast<float>(sc >> 4);
        }
    }
}

void from_float_q2_k(const float *src, void *dst, int64_t n) {
    BlockQ2_K *y = static_cast<BlockQ2_K *>(dst);  // [n / 256]
    const float q4scale = 15.0f;
    for (int64_t b = 0; b < n_superblocks(n, "q2_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        uint8_t L[kQK_K];
        uint8_t Laux[16];
        float weights[16];
        float mins[kQK_K / 16];
        float scales[kQK_K / 16];
        float max_scale = 0.0f;
        float max_min = 0.0f;
        for (int j = 0; j < kQK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f,
                                         15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0.0f) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < kQK_K / 16; ++j)
                y[b].scales[j] = static_cast<uint8_t>(nearest_int(iscale * scales[j]));
            y[b].d = fp32_to_fp16(max_scale / q4scale);
        } else {
            for (int j = 0; j < kQK_K / 16; ++j) y[b].scales[j] = 0;
            y[b].d = fp32_to_fp16(0.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < kQK_K / 16; ++j)
                y[b].scales[j] = static_cast<uint8_t>(y[b].scales[j] | (nearest_int(iscale * mins[j]) << 4));
            y[b].dmin = fp32_to_fp16(max_min / q4scale);
        } else {
            y[b].dmin = fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < kQK_K / 16; ++j) {
            const float d = fp16_to_fp32(y[b].d) * static_cast<float>(y[b].scales[j] & 0x0F);
            if (d == 0.0f) continue;
            const float dm = fp16_to_fp32(y[b].dmin) * static_cast<float>(y[b].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] =
                    static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
        }
        pack_2bit(L, y[b].qs);
    }
}

// ---- q3_k -------------------------------------------------------------------------------------------------

void to_float_q3_k(const void *src, float *dst, int64_t n) {
    const BlockQ3_K *x = static_cast<const BlockQ3_K *>(src);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q3_k"); ++b) {
        const float d_all = fp16_to_fp32(x[b].d);
        float *y = dst + b * kQK_K;  // [256]
        for (int e = 0; e < kQK_K; ++e) {
            const int c = e / 128, k = (e % 128) / 32, l = e % 32;
            const float dl = d_all * static_cast<float>(q3_k_scale(x[b].scales, e / 16) - 32);
            const int q =
                ((x[b].qs[32 * c + l] >> (2 * k)) & 3) - (((x[b].hmask[l] >> (e / 32)) & 1) ? 0 : 4);
            y[e] = dl * static_cast<float>(q);
        }
    }
}

void from_float_q3_k(const float *src, void *dst, int64_t n) {
    BlockQ3_K *y = static_cast<BlockQ3_K *>(dst);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q3_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        int8_t L[kQK_K];
        float scales[kQK_K / 16];
        float max_scale = 0.0f;
        float amax = 0.0f;
        for (int j = 0; j < kQK_K / 16; ++j) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
            const float scale = std::fabs(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        std::memset(y[b].scales, 0, sizeof y[b].scales);
        if (max_scale != 0.0f) {
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < kQK_K / 16; ++j) {
                // ggml keeps l in an int8_t; the clamped value + 32 is 0..63.
                const int l = clamp_int(static_cast<int8_t>(nearest_int(iscale * scales[j])), -32, 31) + 32;
                if (j < 8) {
                    y[b].scales[j] = static_cast<uint8_t>(l & 0x0F);
                } else {
                    y[b].scales[j - 8] = static_cast<uint8_t>(y[b].scales[j - 8] | ((l & 0x0F) << 4));
                }
                y[b].scales[j % 4 + 8] =
                    static_cast<uint8_t>(y[b].scales[j % 4 + 8] | ((l >> 4) << (2 * (j / 4))));
            }
            y[b].d = fp32_to_fp16(1.0f / iscale);
        } else {
            y[b].d = fp32_to_fp16(0.0f);
        }
        for (int j = 0; j < kQK_K / 16; ++j) {
            const int sc = q3_k_scale(y[b].scales, j) - 32;
            const float d = fp16_to_fp32(y[b].d) * static_cast<float>(sc);
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * j + ii] = static_cast<int8_t>(clamp_int(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
        }
        // The high bit of element e goes to bit e / 32 of hmask[e % 32]; the low 2 bits pack like q2_k.
        std::memset(y[b].hmask, 0, sizeof y[b].hmask);
        uint8_t Lu[kQK_K];
        for (int e = 0; e < kQK_K; ++e) {
            int l = L[e];
            if (l > 3) {
                y[b].hmask[e % 32] = static_cast<uint8_t>(y[b].hmask[e % 32] | (1 << (e / 32)));
                l -= 4;
            }
            Lu[e] = static_cast<uint8_t>(l);
        }
        pack_2bit(Lu, y[b].qs);
    }
}

// ---- q4_k -------------------------------------------------------------------------------------------------

void to_float_q4_k(const void *src, float *dst, int64_t n) {
    const BlockQ4_K *x = static_cast<const BlockQ4_K *>(src);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q4_k"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float min = fp16_to_fp32(x[b].dmin);
        float *y = dst + b * kQK_K;  // [256]
        for (int j = 0; j < kQK_K / 32; ++j) {
            uint8_t sc, m;
            get_scale_min_k4(j, x[b].scales, &sc, &m);
            const float dj = d * static_cast<float>(sc);
            const float mj = min * static_cast<float>(m);
            const uint8_t *q = x[b].qs + 32 * (j / 2);  // [32]
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; ++l) y[32 * j + l] = dj * static_cast<float>((q[l] >> shift) & 0x0F) - mj;
        }
    }
}

void from_float_q4_k(const float *src, void *dst, int64_t n) {
    BlockQ4_K *y = static_cast<BlockQ4_K *>(dst);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q4_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        uint8_t L[kQK_K];
        quantize_k4_common(x, 15, -1.0f, 20, &y[b].d, &y[b].dmin, y[b].scales, L);
        for (int j = 0; j < kQK_K; j += 64)
            for (int l = 0; l < 32; ++l)
                y[b].qs[j / 2 + l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
}

// ---- q5_k -------------------------------------------------------------------------------------------------

void to_float_q5_k(const void *src, float *dst, int64_t n) {
    const BlockQ5_K *x = static_cast<const BlockQ5_K *>(src);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q5_k"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        const float min = fp16_to_fp32(x[b].dmin);
        float *y = dst + b * kQK_K;  // [256]
        for (int j = 0; j < kQK_K / 32; ++j) {
            uint8_t sc, m;
            get_scale_min_k4(j, x[b].scales, &sc, &m);
            const float dj = d * static_cast<float>(sc);
            const float mj = min * static_cast<float>(m);
            const uint8_t *q = x[b].qs + 32 * (j / 2);  // [32]
            const int shift = 4 * (j % 2);
            for (int l = 0; l < 32; ++l) {
                const int v = ((q[l] >> shift) & 0x0F) + (((x[b].qh[l] >> j) & 1) ? 16 : 0);
                y[32 * j + l] = dj * static_cast<float>(v) - mj;
            }
        }
    }
}

void from_float_q5_k(const float *src, void *dst, int64_t n) {
    BlockQ5_K *y = static_cast<BlockQ5_K *>(dst);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q5_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        uint8_t L[kQK_K];
        quantize_k4_common(x, 31, -0.5f, 15, &y[b].d, &y[b].dmin, y[b].scales, L);
        // Bit 4 of element 32 j + l goes to bit j of qh[l]; the low nibbles pack like q4_k.
        std::memset(y[b].qh, 0, sizeof y[b].qh);
        for (int j = 0; j < kQK_K; j += 64) {
            for (int l = 0; l < 32; ++l) {
                int l1 = L[j + l];
                int l2 = L[j + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    y[b].qh[l] = static_cast<uint8_t>(y[b].qh[l] | (1 << (j / 32)));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y[b].qh[l] = static_cast<uint8_t>(y[b].qh[l] | (2 << (j / 32)));
                }
                y[b].qs[j / 2 + l] = static_cast<uint8_t>(l1 | (l2 << 4));
            }
        }
    }
}

// ---- q6_k -------------------------------------------------------------------------------------------------

void to_float_q6_k(const void *src, float *dst, int64_t n) {
    const BlockQ6_K *x = static_cast<const BlockQ6_K *>(src);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q6_k"); ++b) {
        const float d = fp16_to_fp32(x[b].d);
        float *y = dst + b * kQK_K;  // [256]
        for (int e = 0; e < kQK_K; ++e) {
            const int c = e / 128, k = (e % 128) / 32, l = e % 32;
            const uint8_t lo = x[b].ql[64 * c + 32 * (k & 1) + l];
            const int q =
                (((k < 2 ? lo : lo >> 4) & 0x0F) | (((x[b].qh[32 * c + l] >> (2 * k)) & 3) << 4)) - 32;
            y[e] = d * static_cast<float>(x[b].scales[e / 16]) * static_cast<float>(q);
        }
    }
}

void from_float_q6_k(const float *src, void *dst, int64_t n) {
    BlockQ6_K *y = static_cast<BlockQ6_K *>(dst);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q6_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        int8_t L[kQK_K];
        float scales[kQK_K / 16];
        float max_scale = 0.0f;
        float max_abs_scale = 0.0f;
        for (int g = 0; g < kQK_K / 16; ++g) {
            scales[g] = make_qx_quants(16, 32, x + 16 * g, L + 16 * g);
            const float abs_scale = std::fabs(scales[g]);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scales[g];
            }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        y[b].d = fp32_to_fp16(1.0f / iscale);
        for (int g = 0; g < kQK_K / 16; ++g) {
            const int s = nearest_int(iscale * scales[g]);
            y[b].scales[g] = static_cast<int8_t>(s < 127 ? s : 127);
        }
        for (int g = 0; g < kQK_K / 16; ++g) {
            const float d = fp16_to_fp32(y[b].d) * static_cast<float>(y[b].scales[g]);
            if (d == 0.0f) continue;
            for (int ii = 0; ii < 16; ++ii)
                L[16 * g + ii] =
                    static_cast<int8_t>(clamp_int(nearest_int(x[16 * g + ii] / d), -32, 31) + 32);
        }
        for (int c = 0; c < 2; ++c) {
            const int8_t *Lc = L + 128 * c;  // [128], levels 0..63
            for (int l = 0; l < 32; ++l) {
                const int q1 = Lc[l], q2 = Lc[l + 32], q3 = Lc[l + 64], q4 = Lc[l + 96];
                y[b].ql[64 * c + l] = static_cast<uint8_t>((q1 & 0x0F) | ((q3 & 0x0F) << 4));
                y[b].ql[64 * c + l + 32] = static_cast<uint8_t>((q2 & 0x0F) | ((q4 & 0x0F) << 4));
                y[b].qh[32 * c + l] =
                    static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

// ---- q8_k -------------------------------------------------------------------------------------------------

void to_float_q8_k(const void *src, float *dst, int64_t n) {
    const BlockQ8_K *x = static_cast<const BlockQ8_K *>(src);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q8_k"); ++b)
        for (int e = 0; e < kQK_K; ++e) dst[b * kQK_K + e] = x[b].d * static_cast<float>(x[b].qs[e]);
}

void from_float_q8_k(const float *src, void *dst, int64_t n) {
    BlockQ8_K *y = static_cast<BlockQ8_K *>(dst);  // [n / 256]
    for (int64_t b = 0; b < n_superblocks(n, "q8_k"); ++b) {
        const float *x = src + b * kQK_K;  // [256]
        // The signed element of largest magnitude (first on ties) maps to -127 exactly: iscale = -127 / max.
        float max = 0.0f;
        float amax = 0.0f;
        for (int e = 0; e < kQK_K; ++e) {
            if (std::fabs(x[e]) > amax) {
                amax = std::fabs(x[e]);
                max = x[e];
            }
        }
        if (amax == 0.0f) {
            std::memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int e = 0; e < kQK_K; ++e) {
            const int v = nearest_int(iscale * x[e]);
            y[b].qs[e] = static_cast<int8_t>(v < 127 ? v : 127);
        }
        for (int g = 0; g < kQK_K / 16; ++g) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[b].qs[16 * g + ii];
            y[b].bsums[g] = static_cast<int16_t>(sum);
        }
        y[b].d = 1.0f / iscale;
    }
}

}  // namespace td::kernels::ref
