// Constrained sampling (structured output, grammars): a step's logits are masked to the tokens a JSON schema
// or a GBNF grammar allows next, the request's own sampler draws from what is left, and the matcher reads
// the token. The scheduler runs one per constrained request; `tandem run` one for --grammar / --json-schema.
// Knows nothing about HTTP, the scheduler or the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/sampler.h"
#include "text/grammar.h"
#include "text/json-schema.h"
#include "text/token-trie.h"
#include "text/tokenizer.h"

namespace td::server {

// A vocabulary as the matchers see it, built once per tokenizer: every token's bytes but control and
// end-of-generation tokens (an end is allowed where a grammar's sentence may end, never inside a document).
struct ConstraintVocab {
    ConstraintVocab(const Tokenizer &tokenizer, int32_t n_vocab);  // n_vocab: the model's output rows
    int32_t n_vocab = 0;
    std::vector<std::string> pieces;  // [n_vocab]; "" = never allowed
    std::vector<int32_t> eog_ids;     // the end-of-generation ids below n_vocab
    TokenTrie trie;
};

class ConstrainedSampler {
public:
    // Exactly one of schema and grammar (asserted); sampling passes sampler_params_validate (asserted by the
    // Sampler). vocab outlives this. The sampler sees `prompt` first (the penalties and DRY read it, as
    // llama.cpp's do); its tokens are in [0, vocab.n_vocab) (asserted).
    ConstrainedSampler(const ConstraintVocab &vocab, std::shared_ptr<const JsonSchema> schema,
                       std::shared_ptr<const Grammar> grammar, const SamplerParams &sampling,
                       std::span<const int32_t> prompt);
    // Draws the next token from logits [n_vocab] among the allowed ones and feeds it to the matcher. Error
    // (failed) when no token of the vocabulary continues the document or the sentence.
    Result<int32_t> sample(const float *logits);
    // Nothing may follow: the document is closed, or the sentence can go no further.
    bool must_end() const;

private:
    const ConstraintVocab &vocab_;
    std::optional<JsonMatcher> json_;
    std::optional<GrammarMatcher> grammar_;
    GrammarMasks grammar_masks_;  // the allowed tokens of the grammar's recent states
    Sampler sampler_;
    std::vector<uint8_t> allowed_;  // [n_vocab] scratch
    std::vector<float> masked_;     // [n_vocab] scratch
};

}  // namespace td::server
