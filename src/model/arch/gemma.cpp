// gemma: Gemma (1). The llama block with the token embeddings scaled by sqrt(n_embd), a GELU-gated
// feed-forward (GeGLU) instead of SwiGLU, gpt-neox RoPE order, a head size of its own (key_length, 256) and
// the output projection tied to the embedding. The converter already stores RMSNorm weights as 1 + w.
// Gemma 2 (post-norms, logit soft-capping, alternating sliding windows) is gemma2.cpp.
#include "model/arch/arch.h"

namespace td {
namespace {

Result<HParams> gemma_hparams(const gguf::File &file) {
    TD_ASSIGN_OR_RETURN(HParams hp, read_hparams(file, "gemma"));
    hp.rope_order = kernels::RopeOrder::halves;
    return hp;
}

Architecture make_gemma() {
    Architecture a{"gemma", gemma_hparams, /*has_qkv_bias=*/false, /*has_qk_norm=*/false};
    a.scale_embd = true;
    a.ffn_act = FfnAct::gelu;
    return a;
}

}  // namespace

const Architecture &arch_gemma() {
    static const Architecture arch = make_gemma();
    return arch;
}

}  // namespace td
