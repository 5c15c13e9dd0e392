// qwen2: Qwen 1.5 / 2 / 2.5. The llama block with biases on the Q, K and V projections and RoPE rotating
// the two halves of each head (gpt-neox order); the output projection may be tied to the embedding.
#include "model/arch/arch.h"

namespace td {
namespace {

Result<HParams> qwen2_hparams(const gguf::File &file) {
    TD_ASSIGN_OR_RETURN(HParams hp, read_hparams(file, "qwen2"));
    hp.rope_order = kernels::RopeOrder::halves;
    return hp;
}

}  // namespace

const Architecture &arch_qwen2() {
    static const Architecture arch{"qwen2", qwen2_hparams, /*has_qkv_bias=*/true, /*has_qk_norm=*/false};
    return arch;
}

}  // namespace td
