#include "model/engine.h"

#include <cmath>

namespace td {

void sample_outputs(const Batch &batch, const float *logits, int32_t n_vocab,
                    const std::vector<Sampler *> &samplers, const std::vector<bool> &want_logits,
                    const float *embeddings, int32_t n_embd, std::vector<StepOutput> &out) {
    out.clear();
    int32_t o = 0;
    for (int32_t i = 0; i < batch.size(); ++i) {
        const uint8_t kind = batch.want_logits[i];
        if (!out_has_logits(kind)) continue;
        const float *row = logits + static_cast<size_t>(o++) * n_vocab;  // [n_vocab]
        const int32_t s = batch.seq[i];
        Sampler *sampler = samplers[s];
        StepOutput so;
        so.seq = s;
        const int32_t n_probs = sampler != nullptr ? sampler->params().n_probs : -1;
        if (kind == kOutScore) {
            // Rated, not drawn: the sampler neither draws nor sees the token.
            so.token = batch.target[i];
            if (sampler != nullptr) {
                so.logprob = sampler->token_logprob(row, so.token);
                so.mirostat_mu = sampler->mirostat_mu();
                if (n_probs > 0) so.top = sampler->top_logprobs(row, n_probs);
            }
            if (want_logits[s]) so.logits.assign(row, row + n_vocab);
            out.push_back(std::move(so));
            continue;
        }
        // A draft row counts only if the row before it (its sequence's, validated) drew the token it guessed;
        // once a guess fails, the sequence's later draft rows in the batch are rejected without a draw, so
        // the sampler draws exactly for the tokens the sequence keeps, as without drafts.
        const bool rejected =
            kind == kOutDraft && (out.empty() || out.back().seq != s || out.back().token != batch.token[i]);
        if (rejected) {
            so.token = StepOutput::kRejectedToken;
        } else if (sampler != nullptr) {
            so.token = sampler->sample(row);
            sampler->accept(so.token);
            so.mirostat_mu = sampler->mirostat_mu();
        }
        // The log-softmax costs a pass over the vocabulary: only when asked.
        if ((want_logits[s] || n_probs >= 0) && sampler != nullptr && !rejected) {
            so.logprob = sampler->token_logprob(row, so.token);
            if (n_probs > 0) so.top = sampler->top_logprobs(row, n_probs);
        }
        if (want_logits[s]) so.logits.assign(row, row + n_vocab);
        out.push_back(std::move(so));
    }
    if (embeddings != nullptr) add_embedding_outputs(batch, embeddings, n_embd, out);
}

void add_embedding_outputs(const Batch &batch, const float *embeddings, int32_t n_embd,
                           std::vector<StepOutput> &out) {
    if (batch.n_embeddings() == 0) return;
    std::vector<StepOutput> sampled = std::move(out);
    out.clear();
    size_t o = 0;
    int32_t e = 0;
    for (int32_t i = 0; i < batch.size(); ++i) {
        if (out_has_logits(batch.want_logits[i]) && o < sampled.size()) {
            out.push_back(std::move(sampled[o++]));
        } else if (batch.want_logits[i] == kOutEmbedding) {
            StepOutput so;
            so.seq = batch.seq[i];
            so.token = StepOutput::kEmbeddingToken;
            const float *row = embeddings + static_cast<size_t>(e++) * n_embd;
            so.embedding.assign(row, row + n_embd);
            out.push_back(std::move(so));
        }
    }
}

Result<std::unique_ptr<LocalEngine>> LocalEngine::create(std::shared_ptr<const Model> model,
                                                         const ContextParams &params, ThreadPool &pool) {
    TD_ASSIGN_OR_RETURN(auto ctx, Context::create(std::move(model), params, pool));
    std::unique_ptr<LocalEngine> e(new LocalEngine());
    e->ctx_ = std::move(ctx);
    e->slots_.resize(e->ctx_->n_seq());
    return e;
}

int32_t LocalEngine::seq_cached(int32_t seq) const {
    return seq >= 0 && seq < n_seq() ? ctx_->kv().seq_len(seq) : 0;
}

Status LocalEngine::seq_start(int32_t seq, const SamplerParams &params, bool want_logits,
                              const SamplerHistory &history, int32_t keep, int32_t keep_from) {
    if (seq < 0 || seq >= n_seq()) return invalid_input("sequence {} is out of range (0..{})", seq, n_seq() - 1);
    TD_TRY(seq_keep_validate(seq, keep, keep_from, n_seq(), [&](int32_t s) { return seq_cached(s); }));
    TD_TRY(sampler_params_validate(params));
    TD_TRY(logit_bias_validate(params, n_vocab()));
    TD_TRY(sampler_history_validate(history, n_vocab()));
    slots_[seq].sampler = std::make_unique<Sampler>(params, n_vocab());
    const auto tail = sampler_history_tail(params, history.tokens);
    if (history.n_drawn > 0 || !tail.empty() || history.mirostat_mu)
        slots_[seq].sampler->restore(history.n_drawn, tail, history.mirostat_mu);
    slots_[seq].want_logits = want_logits;
    ctx_->seq_copy(keep_from < 0 ? seq : keep_from, seq, keep);
    return {};
}

Status sampler_history_validate(const SamplerHistory &history, int32_t n_vocab) {
    for (int32_t t : history.tokens)
        if (t < 0 || t >= n_vocab)
            return invalid_input("history token {} is out of range (vocabulary has {} tokens)", t, n_vocab);
    if (history.mirostat_mu && !std::isfinite(*history.mirostat_mu))
        return invalid_input("mirostat mu must be a finite number, got {}", *history.mirostat_mu);
    return {};
}

Status seq_keep_validate(int32_t seq, int32_t keep, int32_t keep_from, int32_t n_seq,
                         const std::function<int32_t(int32_t)> &cached) {
    if (keep_from < -1 || keep_from >= n_seq)
        return invalid_input("keep_from: sequence {} is out of range (0..{})", keep_from, n_seq - 1);
    const int32_t from = keep_from < 0 ? seq : keep_from;
    if (keep < 0 || keep > cached(from))
        return invalid_input("sequence {} holds {} positions, cannot keep {}", from, cached(from), keep);
    return {};
}

Status LocalEngine::seq_clear(int32_t seq) {
    if (seq < 0 || seq >= n_seq()) return invalid_input("sequence {} is out of range (0..{})", seq, n_seq() - 1);
    ctx_->seq_clear(seq);
    return {};
}

Status LocalEngine::submit(const Batch &batch) {
    if (has_pending_) return make_error(ErrorKind::failed, "a step is already queued; call wait() first");
    for (int32_t i = 0; i < batch.size(); ++i)
        if (out_has_logits(batch.want_logits[i]) && batch.seq[i] >= 0 && batch.seq[i] < n_seq() &&
            !slots_[batch.seq[i]].sampler)
            return invalid_input("sequence {} wants logits but was not started (seq_start)", batch.seq[i]);
    TD_TRY(ctx_->decode(batch));
    std::vector<Sampler *> samplers(n_seq());
    std::vector<bool> want(n_seq());
    for (int32_t s = 0; s < n_seq(); ++s) {
        samplers[s] = slots_[s].sampler.get();
        want[s] = slots_[s].want_logits;
    }
    sample_outputs(batch, ctx_->logits(), n_vocab(), samplers, want, ctx_->embeddings(),
                   ctx_->model().hparams().n_embd, pending_);
    has_pending_ = true;
    return {};
}

Result<std::vector<StepOutput>> LocalEngine::wait() {
    if (!has_pending_) return make_error(ErrorKind::failed, "no step is queued");
    has_pending_ = false;
    return std::move(pending_);
}

}  // namespace td
