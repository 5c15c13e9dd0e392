// Token sampler: turns one row of logits into a token id. One Sampler per sequence.
//
// The chain follows llama.cpp's default order (common_sampler with default params), so the knobs mean what
// llama.cpp users expect:
//
//   logit bias -> penalties -> DRY -> top_n_sigma -> top_k -> typical_p -> top_p -> min_p -> xtc ->
//   temperature
//   -> softmax -> draw
//
//   logit bias   adds each listed token's bias to its logit (OpenAI logit_bias; -inf bans the token)
//   penalties    over the distinct tokens among the last repeat_last_n accepted tokens, each with its count:
//                repeat:  logit > 0 ? logit / repeat_penalty : logit * repeat_penalty  (CTRL, sign-fixed)
//                OpenAI:  logit -= frequency_penalty * count + presence_penalty * (count > 0)
//   DRY          "don't repeat yourself" (llama.cpp's, from koboldcpp): a token that would extend a repeat of
//                L >= dry_allowed_length tokens (the history's latest tokens, seen before and then followed
//                by this token) loses dry_multiplier * dry_base^(L - dry_allowed_length) from its logit
//                (dry_multiplier 0: off). A repeat reaches back no further than the latest sequence breaker
//                (token sequences spelling text such as "\n" or ":"); a token that is a breaker by itself is
//                never penalized. Over the last dry_penalty_last_n accepted tokens (-1: all, 0: off).
//   top_n_sigma  keep tokens whose logit >= max - top_n_sigma * (standard deviation of the finite logits)
//                (top_n_sigma <= 0: off). Before top_k, over every token that can still occur.
//   top_k        keep the k largest logits (k <= 0 or k >= n_vocab: off)
//   typical_p    locally typical sampling: order the tokens by |-log p - H| (H the entropy of the
//                distribution) and keep the smallest such prefix whose cumulative probability exceeds
//                typical_p, at least one token (typical_p >= 1: off). May drop the most likely token.
//   top_p        keep the smallest prefix of the sorted distribution whose cumulative probability >= top_p,
//                at least one token (top_p >= 1: off). Probabilities are at temperature 1.
//   min_p        keep tokens with p >= min_p * p_max (min_p <= 0: off). Also at temperature 1.
//   xtc          exclude top choices: with probability xtc_probability, drop every token with p >=
//                xtc_threshold except the least likely of them (off: xtc_probability 0, or a threshold
//                above 0.5, where at most one token can reach it). At temperature 1, over the survivors.
//
// Each filter's probabilities are over the tokens that survived the filters before it, and a filter that
// removes the most likely token (typical_p, xtc) makes the best survivor the reference of those after it.
//   temperature  divide the surviving logits by temperature, softmax, draw one token. With dynatemp_range
//                r > 0 (llama.cpp's dynamic temperature) the temperature follows the entropy H of the m
//                survivors' softmax at temperature 1: t = lo + (hi - lo) * (H / log m)^dynatemp_exponent,
//                with lo = max(0, temperature - r) and hi = temperature + r. A flat distribution gets hi, a
//                peaked one nearly lo; a t of 0 keeps only the best survivor. One survivor: nothing to scale.
//
// Mirostat (mirostat 1 or 2, llama.cpp's --mirostat) replaces the chain after the bias, as llama.cpp's does:
//
//   logit bias -> temperature -> mirostat -> draw
//
// (no penalties, DRY or filters: they are ignored while it is on). It steers the surprise -log2 p of the
// drawn tokens towards mirostat_tau bits with a running threshold mu (2 * tau at the start), after each draw
// mu -= mirostat_eta * (surprise - tau), the surprise taken in the distribution it drew from:
//   2 (Mirostat 2.0)  keeps the tokens whose surprise at the temperature is at most mu (at least the best).
//   1 (Mirostat)      estimates the Zipf exponent s of the distribution from its 100 most likely tokens and
//                     keeps the top k = (e 2^mu / (1 - n_vocab^-e))^(1/s) of them, e = s - 1 (at least one).
// mu is the sampler's only state besides the generator: mirostat_mu() reads it, restore() sets it.
//
// temperature <= 0 is greedy: penalties, then the argmax; ties go to the lowest token id. Greedy never
// touches the random generator. (So is temperature <= 0 with a dynatemp_range, where llama.cpp would still
// draw at up to dynatemp_range.)
//
// Determinism: the same seed and the same sequence of logits and accept() calls give the same tokens on
// every platform. XTC draws from a second generator seeded from the same seed, once per non-greedy sample()
// while it is on, so turning it on does not move the main generator's draws. The generator is std::mt19937_64
// (fully specified by the standard); a draw is its top 53 bits scaled to [0, 1) by hand (no
// std::uniform_real_distribution, whose algorithm is implementation- defined). The draw walks the survivors
// either in id order (when no filter needed a sort) or sorted by (logit descending, id ascending), a total
// order, so it never depends on how the standard library's sort/select algorithms arrange equal elements. The
// one residue is std::exp, which may differ by an ulp between C libraries and could flip a draw that lands
// exactly on a boundary.
//
// Non-finite logits: NaN counts as -inf; -inf tokens are never drawn; if some logits are +inf the draw is
// uniform over those. If every logit is -inf or NaN there is nothing to choose and sample() returns 0.
//
// Cost: creating a Sampler allocates nothing but the generator state (and DRY's breaker index). The first
// sample() allocates its [n_vocab] scratch arrays; later calls allocate nothing (with a window of -1 the
// history grows with the sequence, amortised). Per token: a few linear passes over the vocabulary, no full
// sort: top_k selects with a heap (nth_element for k > 512) and sorts only the k survivors; top_p without
// top_k cuts the nucleus out with a probability histogram and sorts only the nucleus. typical_p without
// top_k selects its set in growing chunks; DRY is linear in its window (a Z-function over the history). top_k
// up to 512 reads the row as given, with no copy of it: the few tokens the bias, penalties and DRY move are
// set aside at their moved logits and offered after the pass ("the first sample()" above then also allocates
// an [n_vocab] index). Greedy reads the row as given where nothing moves a logit. However it gets there,
// top_k leaves its survivors sorted, so the draw walks them best first even when fewer tokens than k can
// occur.
//
// Thread safety: a Sampler belongs to one sequence and is used by one thread at a time; the const methods
// may run concurrently with each other.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace td {

// One entry of a logit bias: added to token `id`'s logit before anything else looks at it.
struct LogitBias {
    int32_t id = 0;
    float bias = 0.0f;  // finite, or -inf: the token is never chosen
    bool operator==(const LogitBias &) const = default;
};

// The most entries a sampler's logit bias may have: a request's own (the API takes up to half of this) and
// the end-of-generation tokens its ignore_eos bans.
inline constexpr size_t kMaxLogitBias = 2048;

// One of DRY's sequence breakers as tokens: a token that holds the start of the breaker's text, and the
// tokens that must follow it to complete it (empty: the head token holds the whole breaker). Made from the
// breaker strings with the model's tokenizer (server/dry-breakers.h).
struct DryBreaker {
    int32_t head = 0;
    std::vector<int32_t> tail;  // [<= kMaxDryTail]
    bool operator==(const DryBreaker &) const = default;
};
inline constexpr size_t kMaxDryBreakers = 32768;    // sequences per sampler
inline constexpr size_t kMaxDryTailTokens = 32768;  // their tails' tokens, all together
inline constexpr size_t kMaxDryTail = 20;           // tokens in one tail (llama.cpp's cap)

// The most alternatives an output reports (SamplerParams::n_probs); OpenAI's top_logprobs stops at 20.
inline constexpr int32_t kMaxNProbs = 100;

struct SamplerParams {
    // seed value meaning "pick a random seed" (from std::random_device) at construction and at each reset().
    static constexpr uint64_t seed_random = UINT64_MAX;

    float temperature = 0.8f;         // <= 0: greedy
    int32_t top_k = 40;               // <= 0: off
    float top_p = 0.95f;              // in [0, 1]; 1: off
    float min_p = 0.05f;              // in [0, 1]; 0: off
    float repeat_penalty = 1.0f;      // > 0; 1: off
    int32_t repeat_last_n = 64;       // window of accepted tokens the penalties look at; 0: off; -1: all
                                      // (the window is sorted once per token: keep it to a few thousand)
    float presence_penalty = 0.0f;    // OpenAI presence_penalty (OpenAI allows [-2, 2]); 0: off
    float frequency_penalty = 0.0f;   // OpenAI frequency_penalty; 0: off
    float typical_p = 1.0f;           // in [0, 1]; 1: off
    float top_n_sigma = -1.0f;        // finite; <= 0: off
    float xtc_probability = 0.0f;     // in [0, 1]; 0: off
    float xtc_threshold = 0.1f;       // in [0, 1]; > 0.5: off
    float dynatemp_range = 0.0f;      // >= 0; 0: off (the temperature is fixed)
    float dynatemp_exponent = 1.0f;   // >= 0: how the normalised entropy maps onto the temperature range
    int32_t mirostat = 0;             // 0: off; 1: Mirostat; 2: Mirostat 2.0 (in place of the filters)
    float mirostat_tau = 5.0f;        // >= 0: the surprise Mirostat aims at, in bits
    float mirostat_eta = 0.1f;        // >= 0: how fast its threshold follows
    float dry_multiplier = 0.0f;      // >= 0; 0: off
    float dry_base = 1.75f;           // >= 1
    int32_t dry_allowed_length = 2;   // >= 0
    int32_t dry_penalty_last_n = -1;  // tokens DRY looks back; -1: every accepted token; 0: off
    std::vector<DryBreaker> dry_breakers;
    uint64_t seed = seed_random;
    std::vector<LogitBias> logit_bias;  // in order; a token listed twice gets both biases
    // Not a sampling parameter: what each output of the sequence reports (llama.cpp's n_probs). -1: nothing;
    // 0..kMaxNProbs: the log-probability of its token under the raw logits (StepOutput::logprob), and with
    // n > 0 the n most likely tokens (StepOutput::top), computed where the logits are (a cluster's last
    // stage) so that only these cross the network.
    int32_t n_probs = -1;

    // The cheapest draw, greedy without penalties: for an engine whose token a caller replaces with its own
    // draw from the logits (constrained sampling).
    static SamplerParams plain_greedy() {
        SamplerParams p;
        p.temperature = 0.0f;
        p.repeat_penalty = 1.0f;
        p.presence_penalty = 0.0f;
        p.frequency_penalty = 0.0f;
        return p;
    }
};

// Whether the penalties or DRY are on (and Mirostat, which skips them, off): the only parts of the chain that
// read the accepted tokens.
bool sampler_reads_history(const SamplerParams &params);

// The tail of a stream's tokens (its prompt, then what it sampled) that the penalties and DRY can still see:
// the last repeat_last_n or dry_penalty_last_n of those that are on, whichever is longer (all with -1, none
// with 0 or when neither is on), at most `cap`. What Sampler::restore needs as history.
std::span<const int32_t> sampler_history_tail(const SamplerParams &params, std::span<const int32_t> tokens,
                                              size_t cap = SIZE_MAX);

// Checks parameters that came from a user (CLI flag, HTTP request). Returns invalid_input naming the field,
// e.g. "top_p must be in [0, 1], got 1.5". The Sampler constructor asserts what this checks.
Status sampler_params_validate(const SamplerParams &params);
// llama.cpp's --logit-bias form: "TOKEN_ID+BIAS" or "TOKEN_ID-BIAS" ("15043+1", "15043-0.5", "2-inf" bans
// token 2). Error (invalid_input) quoting the text otherwise.
Result<LogitBias> parse_logit_bias(std::string_view text);

// Checks the logit bias against the model's vocabulary: "logit_bias: token 32000 is outside the vocabulary
// (32000 tokens)". sampler_params_validate checks the rest (ids >= 0, biases not NaN or +inf, the count).
Status logit_bias_validate(const SamplerParams &params, int32_t n_vocab);

struct TokenProb {
    int32_t id = 0;
    float logprob = 0.0f;  // natural log of the probability; -inf for a token that cannot occur
};

class Sampler {
public:
    // params must pass sampler_params_validate and logit_bias_validate (asserted); n_vocab >= 1 (asserted).
    Sampler(const SamplerParams &params, int32_t n_vocab);

    // Picks the next token from logits (after penalties from the accepted history and the chain above).
    // logits: [n_vocab], read only. Does not add the token to the history: call accept() with it.
    // Each non-greedy call consumes exactly one number from the generator, even when one candidate is left.
    int32_t sample(const float *logits);

    // Appends a token to the history the penalties and DRY look at: the prompt's tokens first, then every
    // sampled token (the engines feed both, as llama.cpp does). token in [0, n_vocab) (asserted).
    void accept(int32_t token);

    // Clears the history and reseeds: with a fixed seed the next samples repeat the sequence from the start;
    // with seed_random a fresh random seed is drawn.
    void reset();

    // Continues a stream as if this sampler had already produced it: reset(), then one generator draw
    // skipped per sampled token (none when greedy: greedy never draws) and `history` accepted. With the
    // same seed the next sample() is what the uninterrupted sampler would have drawn. n_sampled: tokens the
    // stream has sampled; history: the last of the tokens it has seen, its prompt and then those it sampled
    // (at least the window the penalties read, see sampler_history_tail), each in [0, n_vocab) (asserted).
    // mirostat_mu: Mirostat's threshold as the stream left it (mirostat_mu() after its last draw); nullopt:
    // the start value. A finite number (asserted).
    void restore(uint64_t n_sampled, std::span<const int32_t> history,
                 std::optional<float> mirostat_mu = std::nullopt);

    // Mirostat's threshold mu now, in bits: 2 * mirostat_tau until the first draw (also with Mirostat off).
    float mirostat_mu() const { return mu_; }

    // The distribution the last sample() drew from (after penalties, filters and temperature), for
    // logprobs of the sampled token. Greedy is a point mass: the chosen token with logprob 0.
    // last_top_logprobs returns the min(n, survivors) most likely tokens, best first (ties: lower id); tokens
    // the filters removed have probability 0 and are not listed. Before the first sample(): 0 / empty.
    float last_logprob() const;  // log p of the token sample() returned
    std::vector<TokenProb> last_top_logprobs(int n) const;

    // OpenAI logprobs semantics: log-softmax of the raw logits (no penalties, filters or temperature).
    // logits: [n_vocab]. top_logprobs returns min(n, n_vocab) entries, best first, ties by lower id.
    std::vector<TokenProb> top_logprobs(const float *logits, int n) const;
    float token_logprob(const float *logits, int32_t token) const;  // token in [0, n_vocab) (asserted)

    const SamplerParams &params() const { return params_; }
    int32_t n_vocab() const { return n_vocab_; }
    uint64_t seed() const { return seed_; }  // the seed in use (the drawn one when params.seed is random)

private:
    struct Candidate {
        int32_t id;
        float logit;  // after the bias and penalties
    };

    void load_logits(const float *logits);  // fills cand_ in id order, adds the bias, applies the penalties
    // The bias, then the penalties and DRY, on logit_of(id) (a float& for token id).
    template <typename LogitOf>
    void adjust(LogitOf &&logit_of);
    template <typename LogitOf>
    void apply_penalties(LogitOf &&logit_of);
    template <typename LogitOf>
    void apply_dry(LogitOf &&logit_of);
    // adjust() on just the tokens it touches: their moved logits into sparse_ (sparse_index_ maps id to
    // entry), the row itself left alone.
    void adjust_sparse(const float *logits);
    // The chain in two halves: up to and including top_k (sets c = nullptr when it already chose: greedy or
    // nothing can occur), then the rest and the draw.
    void sample_prefilter(const float *logits, Candidate *&c, size_t &m, float &max, bool &sorted);
    int32_t sample_filtered(Candidate *c, size_t m, float max, bool sorted);
    // No bias, penalty or DRY would move a logit: the row can be read as given.
    bool logits_as_given() const;
    // top_k straight from the row into cand_[0, m) sorted, the tokens in sparse_ at their moved logits when
    // `adjusted`; false (nothing usable) if a logit is infinite at the top or fewer than k tokens are left,
    // which the general path handles.
    bool top_k_of_raw(const float *logits, size_t &m, bool adjusted);
    int32_t recent(size_t i) const;  // the i-th most recent accepted token, i < history_.size()
    void reseed();
    bool xtc_on() const {
        return params_.mirostat == 0 && params_.xtc_probability > 0.0f && params_.xtc_threshold <= 0.5f;
    }
    // The filters after top_k on c[0, m) (xtc: sorted); they return the new m, the survivors sorted at c.
    size_t apply_typical(Candidate *c, size_t m, float max);  // max: the largest logit in c[0, m)
    size_t apply_xtc(Candidate *c, size_t m);
    // One pass of exp over c[0, m) (max: their largest logit): S = sum e^(l - max) and E[l - max] under the
    // softmax, what typical_p's and dynatemp's entropies are made of.
    struct ExpMoments {
        double sum = 0.0;
        double mean = 0.0;
    };
    static ExpMoments exp_moments(const Candidate *c, size_t m, float max);
    // dynatemp: the temperature for the survivors c[0, m), m >= 2 (max: their largest logit).
    float dynamic_temperature(const Candidate *c, size_t m, float max) const;
    // Mirostat's truncation of c[0, m) (the tokens that can occur, id order; max: their largest logit) at
    // temperature t: returns how many survive, at c's front in id order (v2: their weights in weight_).
    size_t mirostat_keep(Candidate *c, size_t m, float max, float t);
    // The temperature, softmax and draw over c[0, m) that end every non-greedy sample(). weighted: weight_[0,
    // m) already holds e^((logit - max) / temperature) of c[0, m).
    int32_t draw(Candidate *c, size_t m, float max, float temperature, bool weighted = false);

    SamplerParams params_;
    int32_t n_vocab_ = 0;
    uint64_t seed_ = 0;
    std::mt19937_64 rng_;
    std::mt19937_64 xtc_rng_;  // XTC's coin, one draw per non-greedy sample() while XTC is on
    float mu_ = 0.0f;          // Mirostat's threshold (bits)

    int64_t window_ = 0;            // tokens the history keeps: the longer of the two windows; -1: all
    std::vector<int32_t> history_;  // [min(n_accepted, window_)] ring buffer; all tokens when -1
    size_t history_next_ = 0;       // ring position the next accept() overwrites once history_ is full
    // DRY's breakers by head token (indices into params_.dry_breakers), and the heads that are breakers
    // alone.
    std::vector<std::pair<int32_t, uint32_t>> dry_by_head_;
    std::vector<int32_t> dry_single_;

    // Scratch kept between calls so sample() does not allocate.
    std::vector<Candidate> cand_;       // [n_vocab]; after sample(), [0, n_final_) is the final set
    std::vector<float> weight_;         // [n_vocab]; exp((logit - max) / temperature) of the final set
    std::vector<int32_t> penalty_ids_;  // [history_.size()] sorted copy of the window
    std::vector<int32_t> dry_recent_;   // [<= history] DRY: the history, latest first
    std::vector<uint32_t> dry_z_;       // [<= history] DRY: Z-function of dry_recent_
    std::vector<std::pair<int32_t, uint32_t>> dry_hits_;  // DRY: (token, repeat it would extend)
    std::vector<Candidate> sparse_;      // the tokens adjust_sparse moved, at their moved logits
    std::vector<int32_t> sparse_index_;  // [n_vocab] entry in sparse_, or -1

    // The last final distribution: logprob of cand_[i] = (cand_[i].logit - final_max_) / final_temp_
    // - final_log_sum_.
    size_t n_final_ = 0;
    bool last_greedy_ = false;
    int32_t last_token_ = -1;
    float last_token_logprob_ = 0.0f;
    float final_max_ = 0.0f;
    float final_temp_ = 1.0f;
    double final_log_sum_ = 0.0;
};

}  // namespace td
