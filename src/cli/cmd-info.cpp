// tandem info: what a GGUF file holds and what it costs to run.
#include <fmt/core.h>

#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "model/kv-cache.h"
#include "model/model.h"
#include "text/vocab.h"

namespace td::cli {
namespace {

int info_main(const std::string &model_arg, int32_t n_ctx) {
    auto path = resolve_model(model_arg);
    if (!path.ok()) return fail(path.status());
    auto model_r = Model::load(*path);
    if (!model_r.ok()) return fail(model_r.status());
    const Model &m = **model_r;
    const HParams &hp = m.hparams();
    const gguf::File &f = m.file();

    fmt::print("file:          {} ({}, GGUF v{}, {} tensors, {} keys)\n", f.path(),
               human_bytes(f.file_size()), f.version(), f.tensors().size(), f.metadata().size());
    fmt::print("architecture:  {}{}\n", hp.arch, hp.name.empty() ? "" : "  (" + hp.name + ")");
    fmt::print("layers:        {}\n", hp.n_layer);
    fmt::print("embedding:     {}   feed-forward: {}   vocab: {}\n", hp.n_embd, hp.n_ff, hp.n_vocab);
    fmt::print("heads:         {} query, {} key/value (GQA {}), head size {}\n", hp.n_head, hp.n_head_kv,
               hp.n_gqa(), hp.head_dim);
    fmt::print("context:       {} (training)\n", hp.n_ctx_train);
    fmt::print("norm eps:      {:g}\n", hp.rms_eps);
    const char *scaling = hp.rope_scaling == RopeScaling::linear   ? "linear"
                          : hp.rope_scaling == RopeScaling::llama3 ? "llama3"
                                                                   : "none";
    fmt::print("rope:          {} dims, base {:g}, {} pairs, scaling {}{}\n", hp.n_rot, hp.rope_freq_base,
               hp.rope_order == kernels::RopeOrder::adjacent ? "adjacent" : "half-split", scaling,
               hp.rope_scaling == RopeScaling::none ? "" : fmt::format(" x{:g}", hp.rope_scale_factor));

    std::map<std::string, std::pair<int, size_t>> by_type;
    for (const auto &t : f.tensors()) {
        auto &e = by_type[dtype_name(t.type)];
        e.first += 1;
        e.second += t.n_bytes;
    }
    std::string types;
    for (const auto &[name, e] : by_type)
        types +=
            fmt::format("{}{} x{} ({})", types.empty() ? "" : ", ", name, e.first, human_bytes(e.second));
    fmt::print("tensor types:  {}\n", types);
    fmt::print("output:        {}\n",
               f.find_tensor("output.weight") ? "separate" : "tied to token embedding");

    auto vocab = Vocab::from_gguf(f);
    if (vocab.ok()) {
        fmt::print("tokenizer:     {}{}, {} tokens, bos {}, eos {}, add bos {}\n", vocab->model_name(),
                   vocab->pre().empty() ? "" : " (pre " + vocab->pre() + ")", vocab->n_tokens(), vocab->bos(),
                   vocab->eos(), vocab->add_bos() ? "yes" : "no");
    } else {
        fmt::print("tokenizer:     unusable: {}\n", vocab.status().message());
    }

    const int32_t ctx = n_ctx > 0 ? n_ctx : hp.n_ctx_train;
    const size_t kv_token = KvCache::bytes_per_token(1, hp.n_embd_kv(), KvType::f16, KvType::f16);
    const size_t layer0 = m.layer_weight_bytes(0);
    fmt::print("per layer:     weights {} + KV cache {} per token (f16) = {} at context {}\n",
               human_bytes(layer0), human_bytes(kv_token),
               human_bytes(layer0 + kv_token * static_cast<size_t>(ctx)), ctx);
    const size_t total_kv = kv_token * hp.n_layer * static_cast<size_t>(ctx);
    fmt::print("whole model:   weights {} + KV cache {} at context {}\n", human_bytes(m.tensor_bytes_total()),
               human_bytes(total_kv), ctx);
    return 0;
}

}  // namespace

void register_info(CLI::App &app, Runners &runners) {
    auto model = std::make_shared<std::string>();
    auto n_ctx = std::make_shared<int32_t>(0);
    CLI::App *cmd =
        app.add_subcommand("info", "Show a model's architecture, hyperparameters, types and memory");
    cmd->add_option("model", *model, "GGUF model (default: stories260K)");
    cmd->add_option("-m,--model", *model, "GGUF model");
    cmd->add_option("-c,--ctx-size", *n_ctx, "Context size for the memory estimate (0: the model's)");
    runners.push_back([cmd, model, n_ctx] { return cmd->parsed() ? info_main(*model, *n_ctx) : -1; });
}

}  // namespace td::cli
