// Kernel choice for matmul() beyond the tile GEMM: on row-major weights, the matrix-vector (one token)
// kernel; nullptr means vec_dot per weight row, which streams each row once in one linear stream; a
// specialised kernel processes 8 rows per pass (sharing the activation loads and the per-block float work)
// where that is faster: the 4- and 5-bit and K-quant types, whose dot products are compute-bound. q8_0 stays
// on vec_dot: it is memory-bound, and one linear stream reads faster. On packed weights (kernels/pack.h), the
// packed kernels.
#include "kernels/gemm.h"
#include "kernels/kernels.h"
#include "kernels/pack.h"

#if TD_KERNELS_X86
#include "kernels/x86/kernels-x86.h"
#endif

namespace td::kernels {

GemmFn gemv_for(DType type) {
#if TD_KERNELS_X86
    if (avx512_vnni_active()) {
        switch (type) {
            case DType::q4_0:
                return avx512::gemv_q4_0_q8_0;
            case DType::q5_0:
                return avx512::gemv_q5_0_q8_0;
            case DType::q4_1:
                return avx512::gemv_q4_1_q8_1;
            case DType::q5_1:
                return avx512::gemv_q5_1_q8_1;
            case DType::q2_k:
                return avx512::gemv_q2_k_q8_k;
            case DType::q3_k:
                return avx512::gemv_q3_k_q8_k;
            case DType::q4_k:
                return avx512::gemv_q4_k_q8_k;
            case DType::q5_k:
                return avx512::gemv_q5_k_q8_k;
            case DType::q6_k:
                return avx512::gemv_q6_k_q8_k;
            default:
                break;
        }
    }
#else
    (void)type;
#endif
    return nullptr;
}

// Up to how many tokens the AVX2 packed kernel beats unpacking a chunk and running the panel GEMM (tandem
// bench pp on the 1B q4_0 synth model, 1 thread: 84 against 69 t/s at 16 tokens, 88 against 93 at 64). The
// AVX-512 VNNI one wins at every batch size measured (1 to 512 tokens).
constexpr int64_t kPackedMaxTokensAvx2 = 32;
// Up to how many tokens the VNNI packed kernels of q5_0, q4_1, q5_1 and the K-quants beat unpacking a chunk
// into the row-major panel GEMM (measurements at each type below).
constexpr int64_t kPackedMaxTokens = 48;

GemmFn gemm_packed_for(DType type, int64_t n_tokens) {
#if TD_KERNELS_X86
    // K-quants (q5_k on q4_k's kernel): packed only with VNNI (the AVX2 machines keep the rows), and up to
    // kPackedMaxTokens tokens; larger batches run the K-quant panel GEMM on the packed groups
    // (gemm_from_packed_for). Measured when that GEMM still took 32-row chunks unpacked first (1B synth
    // Q4_K_M, 1 thread, packed kernel against it): pp16 146 / 83, pp32 137 / 103, pp48 170 / 156, pp64
    // 168 / 165, pp128 162 / 178, pp256 151 / 175, pp512 127 / 140 t/s; 2 threads pp512 231 / 276, and Q6_K
    // 187 / 249. Reading the groups directly made the GEMM side faster still (pp512 140 -> 149).
    if (type == DType::q4_k || type == DType::q5_k || type == DType::q6_k) {
        if (!avx512_vnni_active() || n_tokens > kPackedMaxTokens) return nullptr;
        return type == DType::q4_k
                   ? avx512::gemm_q4_kx16_q8_k
                   : (type == DType::q5_k ? avx512::gemm_q5_kx16_q8_k : avx512::gemm_q6_kx16_q8_k);
    }
    // q8_0 packed against rows (1B synth model, 1 thread): pp16 149 / 88, pp64 166 / 143, pp128 160 / 153,
    // pp512 127 / 133 t/s; unpacking 32-row chunks into the panel GEMM instead gives only 76-95 at pp512.
    if (type == DType::q8_0) return avx512_vnni_active() ? avx512::gemm_q8_0x16_q8_0 : nullptr;
    // q5_0 packed against unpacking 32-row chunks into the panel GEMM (Qwen2.5-0.5B-shaped Q4_K_M synth
    // model, 1 thread): pp8 253 / 110, pp32 276 / 222, pp64 249 / 260, pp512 201 / 230 t/s.
    // q4_1 and q5_1 share q5_0's kernel shape and limit.
    if (type == DType::q5_0 || type == DType::q4_1 || type == DType::q5_1) {
        if (!avx512_vnni_active() || n_tokens > kPackedMaxTokens) return nullptr;
        return type == DType::q5_0
                   ? avx512::gemm_q5_0x16_q8_0
                   : (type == DType::q4_1 ? avx512::gemm_q4_1x16_q8_1 : avx512::gemm_q5_1x16_q8_1);
    }
    if (type != DType::q4_0) return nullptr;
    if (avx512_vnni_active()) return avx512::gemm_q4_0x16_q8_0;
    const Isa isa = isa_active();
    if (isa == Isa::avx2 || isa == Isa::avx512)
        return n_tokens <= kPackedMaxTokensAvx2 ? avx2::gemm_q4_0x16_q8_0 : nullptr;
#else
    (void)type;
    (void)n_tokens;
#endif
    return nullptr;
}

bool pack_pays(DType type) {
    return gemm_packed_for(type, 1) != nullptr;
}

}  // namespace td::kernels
