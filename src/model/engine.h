// Engine: what generation, the benchmark and the server drive, whether the model runs here (LocalEngine) or
// as a pipeline across machines (cluster/ClusterEngine). Sampling happens inside the engine, so a cluster's
// last stage returns token ids, never full-vocabulary logits.
//
// Steps are queued with submit() and their outputs collected in submission order with wait(); up to
// max_in_flight() steps may be queued, which is how prompt chunks and independent sequences overlap in a
// pipeline (stage 2 computes step k while stage 1 computes step k+1). A LocalEngine computes at submit().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "core/status.h"
#include "model/batch.h"
#include "model/context.h"
#include "model/sampler.h"

namespace td {

struct StepOutput {
    // A row that wanted an embedding (kOutEmbedding) has this token and no sampling.
    static constexpr int32_t kEmbeddingToken = -1;
    // A draft row (kOutDraft) whose guess, or an earlier one of its sequence in the step, was wrong: nothing
    // was drawn for it.
    static constexpr int32_t kRejectedToken = -2;
    int32_t seq = 0;
    // Sampled with the sequence's sampler (already accepted into its history); a kOutScore row's target.
    int32_t token = 0;
    // log-probability of `token` under the raw distribution (the log-softmax of the logits): for score rows,
    // and for sampled rows whose sequence wants logits or n_probs.
    float logprob = 0.0f;
    // The row's SamplerParams::n_probs most likely tokens under the raw distribution, best first (ties: lower
    // id); empty when n_probs <= 0.
    std::vector<TokenProb> top;
    float mirostat_mu = 0.0f;   // the sampler's Mirostat threshold after this draw (what a resumed stream
                                // restores: SamplerHistory::mirostat_mu)
    std::vector<float> logits;  // [n_vocab], only when the sequence was started with want_logits
    std::vector<float> embedding;  // [n_embd], the row's final-normed hidden state (kOutEmbedding rows)
};

// What a sequence's sampler has seen before its first sample(). llama.cpp feeds the prompt to the penalties
// and DRY, and so do the engines: `tokens` is the prompt, then (a stream resumed after a lost node, or a
// chat's later turn) what the stream sampled and what came after; the sampler keeps the tail its windows
// read (sampler_history_tail). n_drawn: how many of the stream's tokens were sampled, each one generator
// draw (Sampler::restore), so a seeded stream goes on with the draws it would have made. mirostat_mu:
// Mirostat's threshold after the stream's last draw (StepOutput::mirostat_mu), finite; nullopt: its start
// value.
struct SamplerHistory {
    std::span<const int32_t> tokens;  // each in [0, n_vocab)
    uint64_t n_drawn = 0;
    std::optional<float> mirostat_mu = std::nullopt;
};

class Engine {
public:
    virtual ~Engine() = default;

    virtual int32_t n_ctx() const = 0;
    virtual int32_t n_seq() const = 0;
    virtual int32_t n_vocab() const = 0;
    virtual int max_in_flight() const = 0;

    // Starts (or restarts) a sequence slot with its sampling parameters; clears its cache.
    // want_logits: StepOutput carries the full logits row (tests, logprobs); costly across a cluster.
    // history: what the sampler has seen (SamplerHistory); empty: nothing yet.
    // keep: the first `keep` positions the slot holds stay (its new prompt starts with the tokens they were
    // computed from: a prefix-cache hit), at most seq_cached(seq); 0 clears the slot.
    // keep_from: the slot those positions come from; another slot's first `keep` (at most its seq_cached) are
    // copied into this one (its prompt starts with the tokens that slot was fed, e.g. the other choices of
    // one request). -1: this slot's own. Steps already submitted for keep_from are ordered before the copy.
    virtual Status seq_start(int32_t seq, const SamplerParams &params, bool want_logits = false,
                             const SamplerHistory &history = {}, int32_t keep = 0,
                             int32_t keep_from = -1) = 0;
    // Positions the slot holds now (what seq_start may keep): 0 after seq_clear, or when the engine lost its
    // state (a cluster that reconnected).
    virtual int32_t seq_cached(int32_t seq) const = 0;
    virtual Status seq_clear(int32_t seq) = 0;

    // Queues one step. Rows with an output (Batch::want_logits kOutLogits, kOutDraft or kOutEmbedding)
    // produce one StepOutput each, in row order; a row that wants logits needs its sequence started
    // (seq_start), a row that wants an embedding does not sample. Errors: bad batch (invalid_input), node
    // failure (disconnected/failed, naming the node).
    virtual Status submit(const Batch &batch) = 0;
    // Outputs of the oldest queued step. Error if nothing is queued.
    virtual Result<std::vector<StepOutput>> wait() = 0;
};

// Runs the whole model in this process on one Context.
class LocalEngine : public Engine {
public:
    static Result<std::unique_ptr<LocalEngine>> create(std::shared_ptr<const Model> model, const ContextParams &params,
                                                       ThreadPool &pool);
    int32_t n_ctx() const override { return ctx_->n_ctx(); }
    int32_t n_seq() const override { return ctx_->n_seq(); }
    int32_t n_vocab() const override { return ctx_->model().hparams().n_vocab; }
    int max_in_flight() const override { return 1; }
    Status seq_start(int32_t seq, const SamplerParams &params, bool want_logits = false,
                     const SamplerHistory &history = {}, int32_t keep = 0, int32_t keep_from = -1) override;
    int32_t seq_cached(int32_t seq) const override;
    Status seq_clear(int32_t seq) override;
    Status submit(const Batch &batch) override;
    Result<std::vector<StepOutput>> wait() override;

    Context &context() { return *ctx_; }

private:
    struct Slot {
        std::unique_ptr<Sampler> sampler;
        bool want_logits = false;
    };
    std::unique_ptr<Context> ctx_;
    std::vector<Slot> slots_;  // [n_seq]
    bool has_pending_ = false;
    std::vector<StepOutput> pending_;
};

// seq_start's check of the history's tokens against the vocabulary.
Status sampler_history_validate(const SamplerHistory &history, int32_t n_vocab);
// seq_start's checks of keep and keep_from against the positions the slots hold (`cached`: seq_cached).
Status seq_keep_validate(int32_t seq, int32_t keep, int32_t keep_from, int32_t n_seq,
                         const std::function<int32_t(int32_t)> &cached);

// Samples the rows of `logits` ([n_outputs, n_vocab], in batch row order) for the batch rows that want
// logits, with each row's sequence sampler, and adds the rows that want an embedding (`embeddings`:
// [n_embeddings, n_embd]; null: leaves them out); used by LocalEngine and by a cluster's last stage.
void sample_outputs(const Batch &batch, const float *logits, int32_t n_vocab,
                    const std::vector<Sampler *> &samplers /*[n_seq]*/, const std::vector<bool> &want_logits,
                    const float *embeddings, int32_t n_embd, std::vector<StepOutput> &out);
// `out` holds the outputs of the rows that want logits, in row order; adds those of the rows that want an
// embedding where they belong (row order).
void add_embedding_outputs(const Batch &batch, const float *embeddings /*[n_embeddings, n_embd]*/,
                           int32_t n_embd, std::vector<StepOutput> &out);

}  // namespace td
