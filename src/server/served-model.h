// Everything `tandem serve` generates with, built from the command line: the model, its tokenizer and chat
// template, the Engine (one LocalEngine with one sequence slot per parallel request) and the Scheduler.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread-pool.h"
#include "model/chat-template.h"
#include "model/engine.h"
#include "model/kv-cache.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "server/http.h"
#include "server/scheduler.h"

namespace td::server {

struct ServeParams {
    std::string model_path;
    int32_t n_parallel = 4;  // sequence slots
    // Context: like llama-server, n_ctx is the total over all slots and each slot gets n_ctx / n_parallel
    // positions. 0: each slot gets the model's training context.
    int32_t n_ctx = 0;
    int32_t n_threads = 0;   // compute threads; 0: all cores
    int32_t n_batch = 512;   // rows per engine step
    int32_t max_queue = -1;  // requests waiting for a slot; -1: 4 * n_parallel
    KvType kv_type = KvType::f16;
    std::string chat_template;  // "" = the model's (chatml when it has none)
    // Test hook: wraps the engine (stall or fault injection around a real LocalEngine). Null: none.
    std::function<std::unique_ptr<Engine>(std::unique_ptr<Engine>)> wrap_engine;
    // TODO(cluster): worker addresses (--workers); when set, a ClusterEngine replaces the LocalEngine.
};

class ServedModel {
public:
    // Errors: the model file (not found, invalid), a bad template name, a per-slot context under 16
    // positions ("--ctx-size 64 over --parallel 8 leaves 8 positions per slot; ...").
    static Result<std::unique_ptr<ServedModel>> load(const ServeParams &params);
    ~ServedModel();  // stops the scheduler first

    ServerBackend backend();
    Scheduler &scheduler() { return *scheduler_; }
    const Tokenizer &tokenizer() const { return *tokenizer_; }
    int32_t n_ctx_slot() const { return scheduler_->n_ctx(); }
    const ChatTemplateChoice &chat_template() const { return template_; }
    int n_threads() const { return pool_->n_threads(); }

private:
    ServedModel() = default;

    std::unique_ptr<ThreadPool> pool_;
    std::shared_ptr<Model> model_;
    std::unique_ptr<Tokenizer> tokenizer_;
    ChatTemplateChoice template_;
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<Scheduler> scheduler_;
};

}  // namespace td::server
