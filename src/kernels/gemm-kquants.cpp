// Matrix-matrix (several tokens) kernel choice for K-quant weights (q2_K..q6_K x q8_K activations).
// nullptr means matmul() runs vec_dot per element (CPUs without AVX2).
#include "kernels/gemm.h"
#include "kernels/kernels.h"

#if TD_KERNELS_X86
#include "kernels/x86/kquants-x86.h"
#endif

namespace td::kernels {

GemmFn gemm_kquants_for(DType type) {
#if TD_KERNELS_X86
    const Isa isa = isa_active();
    if (isa != Isa::avx2 && isa != Isa::avx512) return nullptr;
    if (avx512_vnni_active()) {
        switch (type) {
            case DType::q2_k:
                return avx512::gemm_q2_k_q8_k;
            case DType::q3_k:
                return avx512::gemm_q3_k_q8_k;
            case DType::q4_k:
                return avx512::gemm_q4_k_q8_k;
            case DType::q5_k:
                return avx512::gemm_q5_k_q8_k;
            case DType::q6_k:
                return avx512::gemm_q6_k_q8_k;
            default:
                return nullptr;
        }
    }
    switch (type) {
        case DType::q2_k:
            return avx2::gemm_q2_k_q8_k;
        case DType::q3_k:
            return avx2::gemm_q3_k_q8_k;
        case DType::q4_k:
            return avx2::gemm_q4_k_q8_k;
        case DType::q5_k:
            return avx2::gemm_q5_k_q8_k;
        case DType::q6_k:
            return avx2::gemm_q6_k_q8_k;
        default:
            return nullptr;
    }
#else
    (void)type;
    return nullptr;
#endif
}

GemmFn gemm_from_packed_for(DType type) {
#if TD_KERNELS_X86
    if (!avx512_vnni_active()) return nullptr;
    switch (type) {
        case DType::q4_k:
            return avx512::gemm_q4_k_packed_q8_k;
        case DType::q5_k:
            return avx512::gemm_q5_k_packed_q8_k;
        case DType::q6_k:
            return avx512::gemm_q6_k_packed_q8_k;
        default:
            return nullptr;
    }
#else
    (void)type;
    return nullptr;
#endif
}

}  // namespace td::kernels
