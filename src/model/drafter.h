// Where speculative decoding's guesses (Batch kOutDraft rows) come from:
// - LookupDrafter: the sequence's own history (prompt lookup, model/draft.h).
// - ModelDrafter: a small draft model that shares the target's vocabulary, run here greedily for a few tokens
//   (llama.cpp's --model-draft, vLLM's draft-model speculator). It keeps each slot's KV cache and the tokens
//   it was computed from; where a history no longer starts with them (guesses that failed, a new request in
//   the slot), the cache is cut back to the common prefix, so each step computes only the new tokens.
// The engine checks guesses by sampling the target model (a guess holds when the target draws it), so what is
// generated never depends on the drafter; a better drafter only saves steps.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread-pool.h"
#include "model/context.h"
#include "model/draft.h"
#include "model/model.h"

namespace td {

class Drafter {
public:
    virtual ~Drafter() = default;
    // Fills `out` with up to `n` tokens guessed to follow `history` in slot `seq` (what the sequence holds,
    // ending with the token fed next). Errors leave `out` empty.
    virtual Status draft(int32_t seq, std::span<const int32_t> history, int32_t n,
                         std::vector<int32_t> &out) = 0;
};

class LookupDrafter : public Drafter {
public:
    explicit LookupDrafter(const DraftParams &params) : params_(params) {}
    Status draft(int32_t seq, std::span<const int32_t> history, int32_t n,
                 std::vector<int32_t> &out) override;

private:
    DraftParams params_;
};

// Errors unless `draft` can guess for `target`: the same tokenizer model, vocabularies of at most 128 tokens
// difference in size (padding, as llama.cpp allows) whose common ids have the same texts. Names the first
// token that differs.
Status draft_vocab_check(const Model &target, const Model &draft);

class ModelDrafter : public Drafter {
public:
    // n_ctx and n_seq: the target engine's positions per slot and slots. p_min: DraftParams::p_min. The
    // pool runs the draft model's forward passes (the caller's thread drives them, between target steps).
    // Errors: draft_vocab_check's, the KV cache's.
    static Result<std::unique_ptr<ModelDrafter>> create(std::shared_ptr<const Model> draft,
                                                        const Model &target, const ContextParams &params,
                                                        float p_min, ThreadPool &pool);
    Status draft(int32_t seq, std::span<const int32_t> history, int32_t n,
                 std::vector<int32_t> &out) override;

    int64_t n_forward_rows() const {
        return n_rows_;
    }  // rows the draft model computed (catch-up and guesses)

private:
    ModelDrafter() = default;
    std::unique_ptr<Context> ctx_;
    std::vector<std::vector<int32_t>> held_;  // [n_seq] the tokens each slot's cache was computed from
    int32_t n_vocab_target_ = 0;
    float p_min_ = 0.0f;
    Batch batch_;
    int64_t n_rows_ = 0;
};

}  // namespace td
