// gemma2: Gemma 2. Gemma (1) (scaled embeddings, GeGLU, gpt-neox RoPE, key_length head size, tied output)
// plus:
//   - an RMSNorm of the attention output and of the FFN output before each residual add
//     (blk.N.post_attention_norm / blk.N.post_ffw_norm);
//   - logit soft-capping s -> c * tanh(s / c) of the attention scores (attn_logit_softcapping, 50) and of the
//     output logits (final_logit_softcapping, 30);
//   - sliding-window attention (attention.sliding_window, 4096 when absent) on every other layer, starting
//     with layer 0 (period 2 unless attention.sliding_window_pattern says otherwise);
//   - queries scaled by 1/sqrt(query_pre_attn_scalar) before attention. The converter does not store that
//     scalar; like llama.cpp we infer it from the size: the 27B model (46 layers) uses n_embd / n_head, the
//     others head_dim.
#include <cmath>

#include "model/arch/arch.h"

namespace td {
namespace {

Result<float> softcap_key(const gguf::File &file, const char *key, float fallback) {
    TD_ASSIGN_OR_RETURN(auto v, file.get_f32_opt(key));
    const float c = v.value_or(fallback);
    if (!(c > 0.0f && c < 1e30f))
        return invalid_input("{}: key '{}' = {} must be positive", file.path(), key, c);
    return c;
}

Result<HParams> gemma2_hparams(const gguf::File &file) {
    // llama.cpp's defaults: a 4096 window on every other layer, starting with layer 0.
    TD_ASSIGN_OR_RETURN(HParams hp, read_hparams(file, "gemma2", SwaDefaults{4096, 2}));
    hp.rope_order = kernels::RopeOrder::halves;
    TD_ASSIGN_OR_RETURN(hp.attn_softcap, softcap_key(file, "gemma2.attn_logit_softcapping", 50.0f));
    TD_ASSIGN_OR_RETURN(hp.final_softcap, softcap_key(file, "gemma2.final_logit_softcapping", 30.0f));

    // llama.cpp also reads a RoPE base for the sliding layers; Gemma 2 converters write none (same base).
    TD_ASSIGN_OR_RETURN(auto base_swa, file.get_f32_opt("gemma2.rope.freq_base_swa"));
    if (base_swa && *base_swa != hp.rope_freq_base)
        return make_error(
            ErrorKind::unimplemented,
            "{}: a RoPE base of its own for the sliding layers (rope.freq_base_swa {}) is not supported",
            file.path(), *base_swa);

    const int32_t pre_attn = hp.n_layer == 46 ? hp.n_embd / hp.n_head : hp.head_dim;
    hp.attn_q_scale = 1.0f / std::sqrt(static_cast<float>(pre_attn));
    return hp;
}

Architecture make_gemma2() {
    Architecture a{"gemma2", gemma2_hparams, /*has_qkv_bias=*/false, /*has_qk_norm=*/false};
    a.scale_embd = true;
    a.has_post_norms = true;
    a.ffn_act = FfnAct::gelu;
    return a;
}

}  // namespace

const Architecture &arch_gemma2() {
    static const Architecture arch = make_gemma2();
    return arch;
}

}  // namespace td
