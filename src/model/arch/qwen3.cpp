// qwen3: Qwen 3 dense models. The llama block without biases, with an RMSNorm over each head of Q and K
// (attn_q_norm / attn_k_norm, [head_dim]) before RoPE, gpt-neox RoPE order, and a head size that need
// not be n_embd / n_head (attention.key_length, e.g. 128 with n_embd 1024 and 16 heads).
#include "model/arch/arch.h"

namespace td {
namespace {

Result<HParams> qwen3_hparams(const gguf::File &file) {
    TD_ASSIGN_OR_RETURN(HParams hp, read_hparams(file, "qwen3"));
    hp.rope_order = kernels::RopeOrder::halves;
    return hp;
}

}  // namespace

const Architecture &arch_qwen3() {
    static const Architecture arch{"qwen3", qwen3_hparams, /*has_qkv_bias=*/false, /*has_qk_norm=*/true};
    return arch;
}

}  // namespace td
