// AVX2 matrix-matrix kernels for q4_0, q5_0 and q8_0 weights x q8_0 activations and q4_1, q5_1 x q8_1: the
// panel kernel of gemm-panel.h (layout and canonical order explained there) with 8 rows per ymm. Compiled
// with -mavx2 -mfma -mf16c; same linkage rule as vec-dot-avx2.cpp.
//
// The group multiply-add is vpmaddubsw (u8 x s8 -> pairs summed in saturating int16) then vpmaddwd by 1:
// exact while every pair sum stays below 32768.
//   q4_0: u = q in 0..15 (c = 8 taken out through the block sums): |pair| <= 2 * 15 * 127.
//   q5_0: u = q in 0..31 (c = 16): |pair| <= 2 * 31 * 127.
//   q4_1, q5_1: u = q in 0..15 or 0..31 (c = 0; the minimum enters through q8_1's s): as above.
//   q8_0: |x| as u8 times y with x's sign (c = 0): |pair| <= 2 * 128 * 127, because y is never -128
//         (from_float) while a weight of -128 (which a file may hold) gives |x| = 128.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/x86/gemm-panel.h"
#include "kernels/x86/kernels-x86.h"

namespace td::kernels::avx2 {
namespace {

// 8 rows x 16 bytes (at p[r] + off) -> o[g] = [row r: bytes 4g..4g+3] for r < 8, g < 4.
inline void transpose_8x4(const uint8_t *const p[8], size_t off, __m256i o[4]) {
    // z[i] holds rows i and 4 + i in its halves; a 4x4 dword transpose inside each half then leaves row
    // 4L + j in lane 4L + j.
    __m256i z[4];
    for (int i = 0; i < 4; ++i)
        z[i] = _mm256_loadu2_m128i(reinterpret_cast<const __m128i *>(p[4 + i] + off),
                                   reinterpret_cast<const __m128i *>(p[i] + off));
    const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]);
    const __m256i t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]);
    const __m256i t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    o[0] = _mm256_unpacklo_epi64(t0, t2);
    o[1] = _mm256_unpackhi_epi64(t0, t2);
    o[2] = _mm256_unpacklo_epi64(t1, t3);
    o[3] = _mm256_unpackhi_epi64(t1, t3);
}

// Vector arithmetic of the panel kernel on ymm: 8 rows per vector, 2 row vectors x 4 tokens per tile
// (8 accumulators of the 16 registers).
struct Ymm {
    using VI = __m256i;
    using VF = __m256;
    static constexpr int kLanes = 8;
    static constexpr int kMaxRowVecs = 2;
    static constexpr int kMaxTokens = 4;

    static VI madd(VI acc, VI u, VI s) {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
    }
    static VI set1_i(int32_t v) { return _mm256_set1_epi32(v); }
    template <typename L>
    static VI load_i(const L *p) {
        return _mm256_load_si256(reinterpret_cast<const __m256i *>(p));
    }
    template <typename L>
    static void store_i(L *p, VI v) {
        _mm256_store_si256(reinterpret_cast<__m256i *>(p), v);
    }
    static VF set1_f(float v) { return _mm256_set1_ps(v); }
    static VF load_f(const float *p) { return _mm256_load_ps(p); }
    static void store_f(float *p, VF v) { _mm256_store_ps(p, v); }
    static VF add_f(VF a, VF b) { return _mm256_add_ps(a, b); }
    static VF mul_f(VF a, VF b) { return _mm256_mul_ps(a, b); }
    static VF cvt_f(VI v) { return _mm256_cvtepi32_ps(v); }
    static VF scales_f(const uint16_t *d) {
        return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i *>(d)));
    }
    static void store_rows(float *y, VF v, int n) {
        if (n >= kLanes) return _mm256_storeu_ps(y, v);
        const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        _mm256_maskstore_ps(y, m, v);
    }
};

// Group g of a block pairs with activation bytes 4g..4g+3 in every type.
// Low nibbles of qs bytes 4g.. are elements 4g..; high nibbles are elements 16 + 4g.. (group g + 4).
inline void unpack_nibbles(const uint8_t *const qs[8], __m256i out[panel::kGroups]) {
    __m256i o[4];
    transpose_8x4(qs, 0, o);
    const __m256i m = _mm256_set1_epi8(0x0F);
    for (int g = 0; g < 4; ++g) {
        out[g] = _mm256_and_si256(o[g], m);
        out[g + 4] = _mm256_and_si256(_mm256_srli_epi16(o[g], 4), m);
    }
}

// Adds 16 where the element's bit of qh is set (q5_0, q5_1): lane r of group g takes bits 4g..4g+3 of row
// r's qh, one per byte.
template <typename Block>
void add_fifth_bits(const Block *const blk[8], __m256i out[panel::kGroups]) {
    alignas(32) uint32_t h[8];
    for (int r = 0; r < 8; ++r) std::memcpy(&h[r], blk[r]->qh, sizeof h[r]);
    const __m256i qh = _mm256_load_si256(reinterpret_cast<const __m256i *>(h));
    const __m256i low_byte = _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12, 0, 0, 0, 0,
                                              4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12);
    const __m256i bit = _mm256_set1_epi32(0x08040201);  // byte j selects bit j
    for (int g = 0; g < panel::kGroups; ++g) {
        const __m256i b = _mm256_shuffle_epi8(_mm256_srli_epi32(qh, 4 * g), low_byte);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
        out[g] = _mm256_or_si256(out[g], _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
}

// q4_0, q5_0, q4_1, q5_1: the nibbles, plus 16 from qh for the 5-bit types. The offset c: q4_0 8, q5_0 16;
// the types with a minimum keep their unsigned levels (c = 0), the minimum enters through q8_1's s.
template <typename B>
struct Nibbles : Ymm {
    using Block = B;
    static constexpr bool kFifth = kBlockHasQh<B>;
    static constexpr int kLinesPerGroup = 1;
    static constexpr int32_t kOffset = kBlockHasMin<B> ? 0 : (kFifth ? 16 : 8);
    static VI dot(VI acc, const VI *w, VI y) { return madd(acc, w[0], y); }
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

struct Q8_0 : Ymm {
    using Block = BlockQ8_0;
    static constexpr int kLinesPerGroup = 2;  // |x|, x (for its sign)
    static constexpr int32_t kOffset = 0;
    static VI dot(VI acc, const VI *w, VI y) { return madd(acc, w[0], _mm256_sign_epi8(y, w[1])); }
    static void unpack(const Block *const *, const uint8_t *const qs[kLanes], VI out[2 * panel::kGroups]) {
        VI x[panel::kGroups];
        transpose_8x4(qs, 0, x);
        transpose_8x4(qs, 16, x + 4);
        for (int g = 0; g < panel::kGroups; ++g) {
            out[2 * g] = _mm256_abs_epi8(x[g]);
            out[2 * g + 1] = x[g];
        }
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

}  // namespace td::kernels::avx2
