// Matrix-vector (one token) kernel choice for matmul(). nullptr means vec_dot per weight row, which streams
// each row once in one linear stream; a specialised kernel processes 8 rows per pass (sharing the activation
// loads and the per-block float work) where that is faster: the 4-bit and K-quant types, whose dot products
// are compute-bound. q8_0 stays on vec_dot: it is memory-bound, and one linear stream reads faster.
#include "kernels/gemm.h"
#include "kernels/kernels.h"

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
            case DType::q4_k:
                return avx512::gemv_q4_k_q8_k;
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

}  // namespace td::kernels
