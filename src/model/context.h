// A context runs a model's layer range over batches: it owns the KV cache of those layers and the scratch
// buffers, and uses a thread pool it is given. One context serves many sequences (slots).
//
//   first == 0:        input is token ids (embedding lookup)
//   first > 0:         input is the hidden state [n_tokens, n_embd] from the previous stage
//   last == n_layer:   output is logits [n_outputs, n_vocab] for the rows that asked for them, and the
//                      final-normed hidden state [n_embeddings, n_embd] for the rows that asked for an
//                      embedding
//   last < n_layer:    output is the hidden state [n_tokens, n_embd] for the next stage
// Splitting [0, n) into [0, k) + [k, n) gives bit-identical results: the math per row does not depend on
// which call it ran in.
//
// Tensor parallelism: a model loaded from a slice file (model/tp-slice.h) computes its heads and FFN rows and
// sums the partial results with the group's Collective twice per layer; logits() then holds the rank's
// vocabulary rows [n_outputs, n_vocab_local]. The context never knows how the collective is carried.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/thread-pool.h"
#include "model/batch.h"
#include "model/collective.h"
#include "model/kv-cache.h"
#include "model/model.h"

namespace td {

struct ContextParams {
    int32_t n_ctx = 0;  // positions per sequence; 0 = the model's training context
    int32_t n_seq = 1;  // sequence slots
    KvType type_k = KvType::f16;  // the KV cache's K and V types (kv-cache.h); a block type needs the
    KvType type_v = KvType::f16;  // model's head size to be a multiple of its block size
};

class Context {
public:
    // Errors: n_ctx above the model's training context is allowed (with a warning) but must be positive
    // and at most 1M; the KV cache must fit in memory.
    // collective: required when the model is a slice (a rank of a tensor-parallel group), else ignored;
    // it must outlive the context.
    static Result<std::unique_ptr<Context>> create(std::shared_ptr<const Model> model,
                                                   const ContextParams &params, ThreadPool &pool,
                                                   Collective *collective = nullptr);

    // Runs the layer range over `batch`. hidden_in: [batch.size(), n_embd], required when layer_first > 0.
    // Bad input (token id out of range, position beyond the context, gap in a sequence's positions,
    // sequence slot out of range) returns invalid_input and leaves the cache unchanged. A collective's error
    // is returned as it is; the sequences in the batch are then in an undefined state (clear them).
    Status decode(const Batch &batch, const float *hidden_in = nullptr);

    const float *logits() const { return logits_.data(); }  // [n_outputs, n_vocab_local], last stage only
    int32_t n_vocab_local() const { return model_->n_vocab_local(); }
    int32_t n_outputs() const { return n_outputs_; }
    // [n_embeddings, n_embd], the rows with kOutEmbedding in batch order (last stage only; every rank of a
    // tensor-parallel group holds them whole).
    const float *embeddings() const { return embd_rows_.data(); }
    int32_t n_embeddings() const { return n_embeddings_; }
    const float *hidden() const { return x_.data(); }  // [n_tokens, n_embd], non-last stage only

    const Model &model() const { return *model_; }
    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_seq() const { return kv_.n_seq(); }
    KvCache &kv() { return kv_; }
    const KvCache &kv() const { return kv_; }
    void seq_clear(int32_t seq) { kv_.seq_clear(seq); }
    void seq_copy(int32_t src, int32_t dst, int32_t n) { kv_.seq_copy(src, dst, n); }  // KvCache::seq_copy
    int32_t seq_len(int32_t seq) const { return kv_.seq_len(seq); }

    // Rows a layer computes at once: a longer step runs its layers in micro-batches of this many rows.
    static constexpr int32_t kMaxUbatch = 256;

private:
    Context() = default;
    Status validate(const Batch &batch, const float *hidden_in) const;
    // A layer over the whole batch, in micro-batches of at most kMaxUbatch rows so the scratch stays small
    // for long prompts (rows of one sequence are in position order, so a later micro-batch sees the keys
    // an earlier one stored). The math per row does not depend on the split.
    Status layer_forward(int32_t il, const Batch &batch);
    Status layer_forward_rows(int32_t il, const Batch &batch, int32_t r0, int32_t n);
    // Sums the ranks' partial results (rows [0, n) of xn_) when the model is a slice; else nothing.
    Status reduce(int32_t n);
    // xn_ rows [0, n) = rmsnorm(xn_ rows) * norm, when the layer has that post-norm (gemma2); else nothing.
    void post_norm(const TensorView &norm, int32_t n);
    // Query heads per attention job at most (each needs 2 * n_ctx floats of scratch per thread).
    static constexpr int32_t kAttnBlock = 4;
    void ensure_scratch(int32_t n_tokens);

    std::shared_ptr<const Model> model_;
    ThreadPool *pool_ = nullptr;
    Collective *collective_ = nullptr;  // set for a slice
    int32_t n_ctx_ = 0;
    KvCache kv_;
    kernels::RopeParams rope_;

    // Scratch, grown to the largest batch seen and reused.
    std::vector<float> x_;         // [n, n_embd] residual stream
    std::vector<float> xn_;        // [ub, n_embd] normed (ub: rows of one micro-batch)
    // Sizes of a slice's own heads and FFN rows (the whole model's on one machine): *_local in model.h.
    std::vector<float> q_;         // [ub, n_embd_q_local]
    std::vector<float> k_;         // [ub, n_embd_kv_local]
    std::vector<float> v_;         // [ub, n_embd_kv_local]
    std::vector<float> attn_;      // [ub, n_embd_q_local]
    std::vector<float> gate_;      // [ub, n_ff_local]
    std::vector<float> up_;        // [ub, n_ff_local]
    std::vector<float> scores_;    // [n_threads, n_ctx] attention scores per thread
    std::vector<float> logits_;    // [n_outputs, n_vocab_local]
    std::vector<float> out_rows_;  // [n_outputs, n_embd]
    std::vector<float> embd_rows_;  // [n_embeddings, n_embd]
    std::vector<uint8_t> mm_scratch_;
    int32_t n_outputs_ = 0;
    int32_t n_embeddings_ = 0;
};

}  // namespace td
