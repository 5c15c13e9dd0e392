// tandem synth: write a random-weight llama GGUF of a given shape and type, with a real vocabulary.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/synth.h"

namespace td::cli {
namespace {

struct SynthOptions {
    SynthParams params;
    std::string out;
    std::string type = "f32";
    int32_t n_threads = 0;
};

int synth_main(SynthOptions &opt) {
    if (Status s = synth_parse_type(opt.type, opt.params); !s.ok()) return fail(s);
    ThreadPool pool(opt.n_threads);
    if (Status s = synth_model(opt.params, opt.out, pool); !s.ok()) return fail(s);
    std::fprintf(stderr, "tandem: wrote %s\n", opt.out.c_str());
    return 0;
}

}  // namespace

void register_synth(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<SynthOptions>();
    SynthParams &p = opt->params;
    CLI::App *cmd =
        app.add_subcommand("synth", "Write a random-weight llama GGUF (real shape, real vocabulary)");
    cmd->add_option("-o,--output", opt->out, "Output GGUF path")->required();
    cmd->add_option("--arch", p.arch,
                    "Architecture: llama, qwen2 (Q/K/V biases), qwen3 (Q/K norms), gemma (GeGLU), gemma2 "
                    "(gemma plus post-norms, soft-capping, alternating windows)")
        ->default_val("llama");
    cmd->add_option("--dim", p.n_embd, "Embedding size")->default_val(256);
    cmd->add_option("--layers", p.n_layer, "Layers")->default_val(4);
    cmd->add_option("--heads", p.n_head, "Attention heads")->default_val(8);
    cmd->add_option("--kv-heads", p.n_head_kv, "Key/value heads")->default_val(4);
    cmd->add_option("--head-dim", p.head_dim, "Head size (0: dim / heads)")->default_val(0);
    cmd->add_option("--ffn", p.n_ff, "Feed-forward size")->default_val(768);
    cmd->add_option("--ctx", p.n_ctx, "Training context length to record")->default_val(2048);
    cmd->add_option("--swa", p.n_swa,
                    "Sliding attention window in tokens, every layer; gemma2: every other layer (0: off; "
                    "gemma2: the default 4096)")
        ->default_val(0);
    cmd->add_option("--attn-softcap", p.attn_softcap, "gemma2: attention logit soft-cap")->default_val(50.0f);
    cmd->add_option("--final-softcap", p.final_softcap, "gemma2: output logit soft-cap")->default_val(30.0f);
    cmd->add_option("--rope-base", p.rope_freq_base, "RoPE frequency base")->default_val(10000.0f);
    cmd->add_option("--vocab-from", p.vocab_from, "GGUF whose tokenizer is copied")->required();
    cmd->add_option("--type", opt->type,
                    "Weight type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k..q6_k, "
                    "or a llama.cpp mix: q3_k_m, q4_k_m, q5_k_m")
        ->default_val("f32");
    cmd->add_flag("--tied", p.tied_output, "Tie the output projection to the token embedding");
    cmd->add_option("--seed", p.seed, "Random seed")->default_val(42);
    cmd->add_option("-t,--threads", opt->n_threads, "Threads (0: all cores)")->default_val(0);
    runners.push_back([cmd, opt] { return cmd->parsed() ? synth_main(*opt) : -1; });
}

}  // namespace td::cli
