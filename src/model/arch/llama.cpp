// llama: Llama 2 / 3.x, Mistral (without sliding window), TinyLlama, TinyStories.
// RMSNorm -> attention (GQA, RoPE on adjacent pairs: the converter permutes Q/K for it) -> residual ->
// RMSNorm -> SwiGLU FFN -> residual; final RMSNorm; output projection (or tied to the embedding).
#include "model/arch/arch.h"

namespace td {
namespace {

Result<HParams> llama_hparams(const gguf::File &file) {
    TD_ASSIGN_OR_RETURN(HParams hp, read_hparams(file, "llama"));
    hp.rope_order = kernels::RopeOrder::adjacent;
    return hp;
}

}  // namespace

const Architecture &arch_llama() {
    static const Architecture arch{"llama", llama_hparams, false, false};
    return arch;
}

}  // namespace td
