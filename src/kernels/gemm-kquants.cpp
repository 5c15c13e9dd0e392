// Matrix-matrix (several tokens) kernel choice for K-quant weights (q2_K..q6_K x q8_K activations).
// nullptr means matmul() runs vec_dot per element.
#include "kernels/gemm.h"

namespace td::kernels {

GemmFn gemm_kquants_for(DType type) {
    (void)type;
    return nullptr;
}

}  // namespace td::kernels
