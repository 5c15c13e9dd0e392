// AVX-512 VNNI matrix-matrix kernels for q4_0, q5_0 and q8_0 weights x q8_0 activations and q4_1, q5_1 x
// q8_1: the panel kernel of gemm-panel.h (layout and canonical order explained there) with 16 rows per zmm
// and vpdpbusd (u8 x s8 -> int32, exact) as the group multiply-add. Compiled with the AVX-512 F/BW/VL + VNNI
// flags; matmul calls it only when cpuid reports avx512vnni. Same linkage rule as vec-dot-avx2.cpp.
//
// vpdpbusd wants an unsigned first operand, so weights are made unsigned by an offset and the offset is taken
// back out exactly: sum_j (u_j - c) y_j = sum_j u_j y_j - c * sum_j y_j, with u = q (q4_0, c = 8) or
// u = q (q5_0, c = 16) or u = x + 128 (q8_0, c = 128); q4_1 and q5_1 levels are unsigned already (c = 0).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/x86/gemm-panel.h"
#include "kernels/x86/kernels-x86.h"

// g++ 12 reports the deliberately undefined pass-through operands inside its AVX-512 intrinsics
// (_mm512_cvtepi32_ps, _mm512_broadcast_i32x4, ...) as (maybe) uninitialized once they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace td::kernels::avx512 {
namespace {

inline __m512i load4x128(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3) {
    __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p0)));
    z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i *>(p1)), 1);
    z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i *>(p2)), 2);
    return _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i *>(p3)), 3);
}

// 16 rows x 16 bytes (at p[r] + off) -> o[g] = [row r: bytes 4g..4g+3] for r < 16, g < 4.
inline void transpose_16x4(const uint8_t *const p[16], size_t off, __m512i o[4]) {
    // z[i] holds rows i, 4 + i, 8 + i, 12 + i in its 128-bit quarters; a 4x4 dword transpose inside each
    // quarter then leaves row 4L + j in lane 4L + j.
    __m512i z[4];
    for (int i = 0; i < 4; ++i) z[i] = load4x128(p[i] + off, p[4 + i] + off, p[8 + i] + off, p[12 + i] + off);
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    const __m512i t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    const __m512i t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    o[0] = _mm512_unpacklo_epi64(t0, t2);
    o[1] = _mm512_unpackhi_epi64(t0, t2);
    o[2] = _mm512_unpacklo_epi64(t1, t3);
    o[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Vector arithmetic of the panel kernel on zmm: 16 rows per vector, 2 row vectors x 8 tokens per tile
// (16 accumulators of the 32 registers).
struct Zmm {
    using VI = __m512i;
    using VF = __m512;
    static constexpr int kLanes = 16;
    static constexpr int kMaxRowVecs = 2;
    static constexpr int kMaxTokens = 8;
    static constexpr int kLinesPerGroup = 1;

    static VI dot(VI acc, const VI *w, VI y) { return _mm512_dpbusd_epi32(acc, w[0], y); }
    static VI set1_i(int32_t v) { return _mm512_set1_epi32(v); }
    template <typename L>
    static VI load_i(const L *p) {
        return _mm512_load_si512(p);
    }
    template <typename L>
    static void store_i(L *p, VI v) {
        _mm512_store_si512(p, v);
    }
    static VF set1_f(float v) { return _mm512_set1_ps(v); }
    static VF load_f(const float *p) { return _mm512_load_ps(p); }
    static void store_f(float *p, VF v) { _mm512_store_ps(p, v); }
    static VF add_f(VF a, VF b) { return _mm512_add_ps(a, b); }
    static VF mul_f(VF a, VF b) { return _mm512_mul_ps(a, b); }
    static VF cvt_f(VI v) { return _mm512_cvtepi32_ps(v); }
    static VF scales_f(const uint16_t *d) {
        return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i *>(d)));
    }
    static void store_rows(float *y, VF v, int n) {
        _mm512_mask_storeu_ps(y, n >= kLanes ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1), v);
    }
};

// Group g of a block pairs with activation bytes 4g..4g+3 in every type.
// Low nibbles of qs bytes 4g.. are elements 4g..; high nibbles are elements 16 + 4g.. (group g + 4).
inline void unpack_nibbles(const uint8_t *const qs[16], __m512i out[panel::kGroups]) {
    __m512i o[4];
    transpose_16x4(qs, 0, o);
    const __m512i m = _mm512_set1_epi8(0x0F);
    for (int g = 0; g < 4; ++g) {
        out[g] = _mm512_and_si512(o[g], m);
        out[g + 4] = _mm512_and_si512(_mm512_srli_epi16(o[g], 4), m);
    }
}

// Adds 16 where the element's bit of qh is set (q5_0, q5_1): lane r of group g takes bits 4g..4g+3 of row
// r's qh, one per byte.
template <typename Block>
void add_fifth_bits(const Block *const blk[16], __m512i out[panel::kGroups]) {
    alignas(64) uint32_t h[16];
    for (int r = 0; r < 16; ++r) std::memcpy(&h[r], blk[r]->qh, sizeof h[r]);
    const __m512i qh = _mm512_load_si512(h);
    // Each byte of a lane takes the lane's low byte (vpshufb indexes within each 128-bit quarter).
    const __m512i low_byte =
        _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
    const __m512i bit = _mm512_set1_epi32(0x08040201);  // byte j selects bit j
    for (int g = 0; g < panel::kGroups; ++g) {
        const __m512i b = _mm512_shuffle_epi8(_mm512_srli_epi32(qh, 4 * g), low_byte);
        const __mmask64 set = _mm512_test_epi8_mask(b, bit);
        out[g] = _mm512_or_si512(out[g], _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(16)));
    }
}

// q4_0, q5_0, q4_1, q5_1: the nibbles, plus 16 from qh for the 5-bit types. The offset c: q4_0 8, q5_0 16;
// the types with a minimum keep their unsigned levels (c = 0), the minimum enters through q8_1's s.
template <typename B>
struct Nibbles : Zmm {
    using Block = B;
    static constexpr bool kFifth = kBlockHasQh<B>;
    static constexpr int32_t kOffset = kBlockHasMin<B> ? 0 : (kFifth ? 16 : 8);
    static void unpack(const Block *const blk[kLanes], const uint8_t *const qs[kLanes],
                       VI out[panel::kGroups]) {
        unpack_nibbles(qs, out);
        if constexpr (kFifth) add_fifth_bits(blk, out);
    }
};
using Q4_0 = Nibbles<BlockQ4_0>;
using Q5_0 = Nibbles<BlockQ5_0>;
using Q4_1 = Nibbles<BlockQ4_1>;
using Q5_1 = Nibbles<BlockQ5_1>;

struct Q8_0 : Zmm {
    using Block = BlockQ8_0;
    static constexpr int32_t kOffset = 128;
    static void unpack(const Block *const *, const uint8_t *const qs[kLanes], VI out[panel::kGroups]) {
        transpose_16x4(qs, 0, out);
        transpose_16x4(qs, 16, out + 4);
        for (int g = 0; g < panel::kGroups; ++g) out[g] = _mm512_xor_si512(out[g], _mm512_set1_epi8(-128));
    }
};

}  // namespace

void gemm_q4_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    panel::gemm<Q4_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

void gemm_q5_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    panel::gemm<Q5_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

void gemm_q4_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    panel::gemm<Q4_1>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

void gemm_q5_1_q8_1(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    panel::gemm<Q5_1>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

void gemm_q8_0_q8_0(int64_t n, const void *w, size_t w_stride, const void *x, size_t x_stride, float *y,
                    int64_t y_stride, int64_t n_rows, int64_t n_tokens) {
    panel::gemm<Q8_0>(n, w, w_stride, x, x_stride, y, y_stride, n_rows, n_tokens);
}

}  // namespace td::kernels::avx512
