#include "server/constrained.h"

#include <algorithm>
#include <limits>

#include "core/check.h"

namespace td::server {

namespace {

std::vector<std::string> matcher_pieces(const Tokenizer &tokenizer, int32_t n_vocab) {
    std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
    const Vocab &vocab = tokenizer.vocab();
    for (int32_t id = 0; id < n_vocab && id < vocab.n_tokens(); ++id)
        if (!vocab.is_control(id) && !vocab.is_eog(id))
            pieces[static_cast<size_t>(id)] = tokenizer.token_to_piece(id);
    return pieces;
}

}  // namespace

ConstraintVocab::ConstraintVocab(const Tokenizer &tokenizer, int32_t n_vocab_)
    : n_vocab(n_vocab_), pieces(matcher_pieces(tokenizer, n_vocab_)), trie(pieces) {
    for (int32_t id : tokenizer.vocab().eog_ids())
        if (id < n_vocab) eog_ids.push_back(id);
}

ConstrainedSampler::ConstrainedSampler(const ConstraintVocab &vocab, std::shared_ptr<const JsonSchema> schema,
                                       std::shared_ptr<const Grammar> grammar, const SamplerParams &sampling,
                                       std::span<const int32_t> prompt)
    : vocab_(vocab), sampler_(sampling, vocab.n_vocab) {
    TD_ASSERT((schema != nullptr) != (grammar != nullptr),
              "a constrained sampler takes a schema or a grammar");
    for (int32_t t : sampler_history_tail(sampling, prompt)) sampler_.accept(t);
    if (schema) json_.emplace(std::move(schema));
    if (grammar) grammar_.emplace(std::move(grammar));
}

Result<int32_t> ConstrainedSampler::sample(const float *logits) {
    size_t n_allowed = 0;
    const std::vector<uint8_t> *allowed = &allowed_;
    if (json_)
        n_allowed = vocab_.trie.allowed(*json_, allowed_);
    else
        allowed = &grammar_masks_.allowed(vocab_.trie, *grammar_, n_allowed);
    // A sentence that may end here may end with the end of generation.
    const bool may_end = grammar_ && grammar_->can_end();
    if (may_end) n_allowed += vocab_.eog_ids.size();
    if (n_allowed == 0)
        return make_error(ErrorKind::failed, "no token of the vocabulary continues the {} here",
                          json_ ? "JSON document" : "grammar's sentence");
    masked_.assign(logits, logits + vocab_.n_vocab);
    for (size_t i = 0; i < masked_.size(); ++i)
        if (!(*allowed)[i]) masked_[i] = -std::numeric_limits<float>::infinity();
    if (may_end)
        for (int32_t id : vocab_.eog_ids) masked_[static_cast<size_t>(id)] = logits[id];
    const int32_t token = sampler_.sample(masked_.data());
    sampler_.accept(token);
    const std::string &piece = vocab_.pieces[static_cast<size_t>(token)];
    if (piece.empty()) {
        // An end of generation (the caller ends the reply), or every allowed token was banned (a logit bias).
        if (std::find(vocab_.eog_ids.begin(), vocab_.eog_ids.end(), token) != vocab_.eog_ids.end())
            return token;
        return make_error(ErrorKind::failed,
                          "every token that continues the {} here is banned by a logit bias",
                          json_ ? "JSON document" : "grammar's sentence");
    }
    const bool ok = json_ ? json_->feed(piece) : grammar_->feed(piece);
    TD_ASSERT(ok, "token {} was allowed but the {} matcher refused it", token, json_ ? "JSON" : "grammar");
    return token;
}

bool ConstrainedSampler::must_end() const {
    return json_ ? json_->complete() : grammar_->must_end();
}

}  // namespace td::server
