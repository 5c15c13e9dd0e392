// A batch: the rows one forward call computes. Each row is a token (or, for a stage that does not start at
// layer 0, a row of the incoming hidden state) at a position of a sequence, and says what output it wants:
// none, its logits (sampled by its sequence's sampler), or its embedding (the final-normed hidden state, what
// llama.cpp pools into an embedding). A long prompt and many decoding sequences go through the same call.
#pragma once

#include <cstdint>
#include <vector>

namespace td {

// Batch::want_logits values (one byte per row; forward frames carry them as they are).
inline constexpr uint8_t kOutNone = 0;
inline constexpr uint8_t kOutLogits = 1;     // logits, sampled into a token
inline constexpr uint8_t kOutEmbedding = 2;  // the row's final-normed hidden state [n_embd]
// Speculative decoding: the row's token is a guess (a draft) of what its sequence samples at the row before,
// which must be the same sequence's previous position in this batch and want logits or be a draft too. The
// row is sampled, as a kOutLogits row, only if every guess of its sequence up to it was right; otherwise its
// output is StepOutput::kRejectedToken and the positions from it on are to be written again.
inline constexpr uint8_t kOutDraft = 3;
// Scoring a text (prompt log-probabilities, perplexity): the row's logits are computed but not sampled; its
// output is the log-probability of Batch::target[i], the token that follows the row in the text, and, when
// its sequence asks (SamplerParams::n_probs), the row's most likely tokens. Its sequence's sampler is
// untouched.
inline constexpr uint8_t kOutScore = 4;
inline constexpr uint8_t kOutLast = kOutScore;
// Rows whose logits the last stage computes.
inline constexpr bool out_has_logits(uint8_t out) {
    return out == kOutLogits || out == kOutDraft || out == kOutScore;
}
// Rows whose logits are sampled into a token.
inline constexpr bool out_is_sampled(uint8_t out) {
    return out == kOutLogits || out == kOutDraft;
}

struct Batch {
    std::vector<int32_t> token;        // [n] token ids (read only when the range starts at layer 0)
    std::vector<int32_t> pos;          // [n] position in its sequence
    std::vector<int32_t> seq;          // [n] sequence slot (KV cache slot)
    std::vector<uint8_t> want_logits;  // [n] kOut*: what the last stage outputs for this row
    // [n], or empty when no row is a kOutScore row: the token a score row rates (in the vocabulary); -1 for
    // the other rows.
    std::vector<int32_t> target;

    int32_t size() const { return static_cast<int32_t>(pos.size()); }
    bool empty() const { return pos.empty(); }
    void clear() {
        token.clear();
        pos.clear();
        seq.clear();
        want_logits.clear();
        target.clear();
    }
    void add(int32_t tok, int32_t p, int32_t s, bool logits) {
        add_out(tok, p, s, logits ? kOutLogits : kOutNone);
    }
    void add_out(int32_t tok, int32_t p, int32_t s, uint8_t out) {
        token.push_back(tok);
        pos.push_back(p);
        seq.push_back(s);
        want_logits.push_back(out);
        if (!target.empty()) target.push_back(-1);
    }
    // A kOutScore row: what the model at (p, s) gives `next`, the token that follows it.
    void add_score(int32_t tok, int32_t p, int32_t s, int32_t next) {
        add_out(tok, p, s, kOutScore);
        target.resize(pos.size(), -1);
        target.back() = next;
    }
    bool has_targets() const { return !target.empty(); }
    int32_t n_outputs() const {  // rows with logits
        return count(kOutLogits) + count(kOutDraft) + count(kOutScore);
    }
    int32_t n_embeddings() const { return count(kOutEmbedding); }  // rows with an embedding
    int32_t count(uint8_t out) const {
        int32_t n = 0;
        for (uint8_t w : want_logits) n += w == out;
        return n;
    }
};

}  // namespace td
