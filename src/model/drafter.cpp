#include "model/drafter.h"

#include <algorithm>
#include <cmath>

namespace td {

Status LookupDrafter::draft(int32_t, std::span<const int32_t> history, int32_t n, std::vector<int32_t> &out) {
    lookup_draft(history, n, params_, out);
    return {};
}

Status draft_vocab_check(const Model &target, const Model &draft) {
    const auto model_of = [](const Model &m) {
        auto v = m.file().get_string("tokenizer.ggml.model");
        return v.ok() ? *v : std::string("(none)");
    };
    if (model_of(target) != model_of(draft))
        return invalid_input("the draft model's tokenizer is '{}', the model's is '{}'", model_of(draft),
                             model_of(target));
    TD_ASSIGN_OR_RETURN(auto t, target.file().get_string_array("tokenizer.ggml.tokens"));
    TD_ASSIGN_OR_RETURN(auto d, draft.file().get_string_array("tokenizer.ggml.tokens"));
    const int64_t diff = std::abs(static_cast<int64_t>(t.size()) - static_cast<int64_t>(d.size()));
    if (diff > 128)
        return invalid_input("the draft model has {} tokens, the model {}: not the same vocabulary", d.size(),
                             t.size());
    for (size_t i = 0; i < std::min(t.size(), d.size()); ++i)
        if (t[i] != d[i])
            return invalid_input(
                "token {} is '{}' in the draft model but '{}' in the model: not the same vocabulary", i, d[i],
                t[i]);
    return {};
}

Result<std::unique_ptr<ModelDrafter>> ModelDrafter::create(std::shared_ptr<const Model> draft,
                                                           const Model &target, const ContextParams &params,
                                                           float p_min, ThreadPool &pool) {
    TD_TRY(draft_vocab_check(target, *draft));
    if (draft->n_vocab_local() != draft->hparams().n_vocab)
        return invalid_input("a tensor-parallel slice cannot draft");
    std::unique_ptr<ModelDrafter> d(new ModelDrafter());
    TD_ASSIGN_OR_RETURN(d->ctx_, Context::create(std::move(draft), params, pool));
    d->held_.resize(d->ctx_->n_seq());
    d->n_vocab_target_ = target.hparams().n_vocab;
    d->p_min_ = p_min;
    return d;
}

Status ModelDrafter::draft(int32_t seq, std::span<const int32_t> history, int32_t n,
                           std::vector<int32_t> &out) {
    out.clear();
    if (seq < 0 || seq >= ctx_->n_seq()) return invalid_input("draft: sequence {} is out of range", seq);
    const int64_t len = static_cast<int64_t>(history.size());
    // The guesses but the last are fed: positions len .. len + n - 2 must be in the context.
    n = static_cast<int32_t>(std::min<int64_t>(n, ctx_->n_ctx() - len + 1));
    if (n <= 0 || len == 0) return {};
    std::vector<int32_t> &held = held_[seq];
    // What the cache holds and the history share; the last history token is fed again if it was held, so its
    // logits come out of this call.
    int64_t common =
        std::mismatch(held.begin(), held.end(), history.begin(), history.end()).first - held.begin();
    common = std::min(common, len - 1);
    if (common < static_cast<int64_t>(held.size()) ||
        ctx_->seq_len(seq) != static_cast<int32_t>(held.size())) {
        if (ctx_->seq_len(seq) < common) common = ctx_->seq_len(seq);
        ctx_->seq_copy(seq, seq, static_cast<int32_t>(common));
        held.resize(common);
    }
    batch_.clear();
    for (int64_t i = common; i < len; ++i) batch_.add(history[i], static_cast<int32_t>(i), seq, i == len - 1);
    const int32_t n_vocab = ctx_->n_vocab_local();
    for (;;) {
        if (Status s = ctx_->decode(batch_); !s.ok()) {
            ctx_->seq_clear(seq);  // as good as unknown now: the next call starts it over
            held.clear();
            return s.with_context("the draft model");
        }
        n_rows_ += batch_.size();
        for (int32_t t : batch_.token) held.push_back(t);
        // Greedy: the draft model's most likely token, while it is sure enough of it.
        const float *row = ctx_->logits();
        const int32_t best = static_cast<int32_t>(std::max_element(row, row + n_vocab) - row);
        if (p_min_ > 0.0f) {
            // p(best) = 1 / sum exp(l - l_best) is below p_min once the sum passes 1 / p_min: an unsure
            // draft stops summing there (float exp: the bound needs no more).
            const float limit = 1.0f / p_min_;
            float sum = 0.0f;
            for (int32_t v = 0; v < n_vocab && sum <= limit; ++v) sum += std::exp(row[v] - row[best]);
            if (sum > limit) break;
        }
        if (best >= n_vocab_target_) break;
        out.push_back(best);
        if (static_cast<int32_t>(out.size()) >= n) break;
        batch_.clear();
        batch_.add(best, static_cast<int32_t>(held.size()), seq, true);
    }
    return {};
}

}  // namespace td
