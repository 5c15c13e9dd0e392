// Matrix-vector (one token) kernel choice for matmul(). nullptr means vec_dot per weight row, which streams
// each row once; a specialised kernel may process several rows per pass to share the activation loads.
#include "kernels/gemm.h"

namespace td::kernels {

GemmFn gemv_for(DType type) {
    (void)type;
    return nullptr;
}

}  // namespace td::kernels
