#include "server/served-model.h"

#include "core/log.h"
#include "model/vocab.h"

namespace td::server {

namespace {
constexpr int32_t min_ctx_slot = 16;
}

Result<std::unique_ptr<ServedModel>> ServedModel::load(const ServeParams &params) {
    if (params.n_parallel < 1 || params.n_parallel > 256)
        return invalid_input("--parallel must be in [1, 256], got {}", params.n_parallel);
    if (params.n_ctx < 0) return invalid_input("--ctx-size must be >= 0, got {}", params.n_ctx);
    if (params.n_batch < 1) return invalid_input("--batch-size must be >= 1, got {}", params.n_batch);

    std::unique_ptr<ServedModel> sm(new ServedModel());
    TD_ASSIGN_OR_RETURN(sm->model_, Model::load(params.model_path));
    TD_ASSIGN_OR_RETURN(Vocab vocab, Vocab::from_gguf(sm->model_->file()));
    TD_ASSIGN_OR_RETURN(sm->tokenizer_, Tokenizer::create(std::make_shared<const Vocab>(std::move(vocab))));
    TD_ASSIGN_OR_RETURN(sm->template_, chat_template_for_model(sm->model_->file(), params.chat_template));

    int32_t n_ctx_slot = sm->model_->hparams().n_ctx_train;
    if (params.n_ctx > 0) {
        n_ctx_slot = params.n_ctx / params.n_parallel;
        if (n_ctx_slot < min_ctx_slot)
            return invalid_input(
                "--ctx-size {} over --parallel {} leaves {} positions per slot; at least {} are "
                "needed (the context is shared by the slots, as in llama-server)",
                params.n_ctx, params.n_parallel, n_ctx_slot, min_ctx_slot);
    }
    ContextParams cp;
    cp.n_ctx = n_ctx_slot;
    cp.n_seq = params.n_parallel;
    cp.kv_type = params.kv_type;
    sm->pool_ = std::make_unique<ThreadPool>(params.n_threads);
    // TODO(cluster): with worker addresses, create a ClusterEngine over them here instead.
    TD_ASSIGN_OR_RETURN(auto local, LocalEngine::create(sm->model_, cp, *sm->pool_));
    sm->engine_ = std::move(local);
    if (params.wrap_engine) sm->engine_ = params.wrap_engine(std::move(sm->engine_));

    SchedulerParams sp;
    sp.n_batch = params.n_batch;
    sp.max_queue = params.max_queue >= 0 ? params.max_queue : 4 * params.n_parallel;
    sm->scheduler_ = std::make_unique<Scheduler>(*sm->engine_, *sm->tokenizer_, sp);
    return sm;
}

ServedModel::~ServedModel() {
    if (scheduler_) scheduler_->stop();
}

ServerBackend ServedModel::backend() {
    ServerBackend be;
    be.scheduler = scheduler_.get();
    be.tokenizer = tokenizer_.get();
    be.chat_template = template_.kind;
    return be;
}

}  // namespace td::server
