// Prompt lookup: the drafts of speculative decoding without a draft model (llama.cpp's lookup decoding,
// vLLM's "ngram" speculator). Text that repeats what came before (a quoted document, code being edited, a
// list that follows a pattern) is guessed from the sequence's own history: the tokens that followed the
// latest earlier occurrence of its last few tokens. The engine checks the guesses in the step that feeds them
// (Batch kOutDraft rows), so one step may yield several tokens; what is generated does not change.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace td {

inline constexpr int32_t kMaxDraft = 64;  // DraftParams::n_max at most

struct DraftParams {
    int32_t n_max = 0;      // tokens guessed per step at most; 0: no drafts
    std::string model;      // a draft model's GGUF (model/drafter.h); empty: prompt lookup
    int32_t ngram_min = 2;  // the shortest suffix looked up
    int32_t ngram_max = 4;  // the longest (tried first)
    // A draft model's guesses (model/drafter.h) stop at the first token it gives less than this probability
    // (llama.cpp's --draft-p-min): an unsure guess rarely holds and costs the draft model a step.
    float p_min = 0.75f;
};

// How many guesses the next step of a sequence makes: n_max at first, then one more than the last step's
// guesses that held, doubled when they all held (a guess that fails costs its row; text that repeats at
// length earns long guesses again within a few steps).
inline int32_t next_draft_budget(int32_t budget, int32_t n_guessed, int32_t n_held, int32_t n_max) {
    if (n_guessed == 0) return budget;
    const int32_t next = n_held == n_guessed ? 2 * n_held : n_held + 1;
    return next < 1 ? 1 : next > n_max ? n_max : next;
}

// Fills `out` with up to `n` tokens guessed to follow `history` (what the sequence holds, ending with the
// token fed next): for the longest suffix of ngram_max down to ngram_min tokens that occurs earlier in the
// history, the tokens after its latest earlier occurrence. Empty when no suffix recurs. Cost: one pass over
// the history per suffix length.
void lookup_draft(std::span<const int32_t> history, int32_t n, const DraftParams &params,
                  std::vector<int32_t> &out);

}  // namespace td
