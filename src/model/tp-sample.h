// Sampling when the output head is split by vocabulary rows over a tensor-parallel group: each rank holds
// logits for its rows [vocab_first, vocab_last); rank 0 holds the samplers and returns the tokens.
//
// What crosses between ranks per output row is what the exact merge needs, chosen from the sequence's
// sampling parameters (the same on every rank):
//   greedy, no penalties             each rank's best (id, logit): 8 bytes
//   top_k in 1..kTpSparseTopK, no penalties
//                                    each rank's top_k (id, logit) by (logit desc, id asc): the global top_k
//                                    is among them, and top_p / min_p / temperature act on those only
//   otherwise (penalties or a logit bias move tokens; top_k off; Mirostat; want_logits; n_probs;
//   a kOutScore row)
//                                    the rank's whole slice of logits
// Rank 0 lays the candidates into a row of n_vocab logits, the others -inf, and runs the sequence's own
// Sampler on it, so a seed gives the same tokens as one machine would given the same logits (-inf tokens are
// never drawn, penalties leave them -inf).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/batch.h"
#include "model/collective.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "model/tp-slice.h"

namespace td {

inline constexpr int32_t kTpSparseTopK = 1024;

class TpOutputMerger {
public:
    // Every rank calls it for the same batch with its logits [n_outputs, slice.n_vocab()]. samplers and
    // want_logits are [n_seq] on every rank (ranks other than 0 read only the parameters; their samplers are
    // never drawn from). Rank 0 fills `out` as sample_outputs does; other ranks leave it empty.
    Status sample(const Batch &batch, const float *logits, const TpSlice &slice, int32_t n_vocab,
                  const std::vector<Sampler *> &samplers, const std::vector<bool> &want_logits,
                  Collective &collective, std::vector<StepOutput> &out);

    // Rank 0, after sample(): [n_outputs, n_vocab] the merged logits (exact for the sequences that wanted
    // logits; other rows hold only their candidates, -inf elsewhere).
    const float *logits() const { return full_.data(); }

private:
    std::vector<uint8_t> mine_;                   // this rank's encoded candidates
    std::vector<std::vector<uint8_t>> all_;       // rank 0: every rank's
    std::vector<int32_t> order_;                  // [n_vocab_local] scratch for top-k
    std::vector<float> full_;                     // rank 0: [n_outputs, n_vocab]
};

}  // namespace td
