#include "model/sampler.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "core/check.h"

namespace td {

namespace {

constexpr float k_inf = std::numeric_limits<float>::infinity();

// accept() reserves the history for min(repeat_last_n, this) tokens on first use.
constexpr size_t k_history_reserve_max = 4096;

// top_k up to this uses a one-pass heap selection; larger k uses nth_element.
constexpr size_t k_heap_top_k_max = 512;

// top_p histogram: k_top_p_buckets equal buckets over logits in [max - k_top_p_range, max]; everything
// lower goes to bucket 0. A token 32 below the max has relative probability e^-32 ~ 1e-14, so bucket 0
// only matters for top_p within ~1e-9 of 1 (then the whole set is sorted, which is still correct).
constexpr int k_top_p_buckets = 256;
constexpr double k_top_p_range = 32.0;

size_t top_p_bucket(float logit, float max) {
    const double t = (double(logit) - max + k_top_p_range) * (k_top_p_buckets / k_top_p_range);
    if (t <= 0.0) return 0;  // also keeps a huge negative value away from the int conversion
    if (t >= k_top_p_buckets - 1) return k_top_p_buckets - 1;
    return size_t(t);
}

// The one candidate order used everywhere: larger logit first, then lower id. Ids are unique and NaN has
// been replaced by -inf before any sort, so this is a total order and sorted results do not depend on the
// standard library's algorithm.
template <typename T>
bool better(const T &a, const T &b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// A heap of the k best items seen so far in c[0, k), the worst on top (c[0]): replaces the worst with e,
// which the caller found better than it. One pass that offers many items so costs most of them one
// comparison.
template <typename T>
void replace_worst(T *c, size_t k, const T &e) {
    auto cmp = [](const T &a, const T &b) { return better(a, b); };
    std::pop_heap(c, c + k, cmp);
    c[k - 1] = e;
    std::push_heap(c, c + k, cmp);
}

// A double in [0, 1) from the top 53 bits: exact, and the same on every platform.
double uniform01(std::mt19937_64 &rng) {
    return double(rng() >> 11) * 0x1.0p-53;
}

struct Scored {
    int32_t id;
    float logit;
};

// The n best of count items (item(i) -> Scored), best first. A heap of the n best seen so far with the
// worst on top, so most items cost one comparison.
template <typename ItemAt>
std::vector<Scored> select_best(size_t count, int n, ItemAt item) {
    std::vector<Scored> heap;
    if (n <= 0 || count == 0) return heap;
    const size_t keep = std::min(count, size_t(n));
    heap.reserve(keep);
    auto cmp = [](const Scored &a, const Scored &b) { return better(a, b); };
    for (size_t i = 0; i < count; ++i) {
        const Scored s = item(i);
        if (heap.size() < keep) {
            heap.push_back(s);
            std::push_heap(heap.begin(), heap.end(), cmp);
        } else if (better(s, heap.front())) {
            replace_worst(heap.data(), keep, s);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), cmp);
    return heap;
}

bool dry_on(const SamplerParams &p) {
    return p.dry_multiplier > 0.0f && p.dry_penalty_last_n != 0;
}

bool penalties_on(const SamplerParams &p) {
    return p.repeat_last_n != 0 &&
           (p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f);
}

// Tokens the history keeps: the longer of the penalties' window and DRY's, of those that are on; -1: every
// accepted token; 0: nothing reads the history.
int64_t history_window(const SamplerParams &p) {
    if (p.mirostat != 0) return 0;  // llama.cpp's Mirostat chain has no penalties or DRY
    int64_t w = 0;
    if (penalties_on(p)) {
        if (p.repeat_last_n < 0) return -1;
        w = p.repeat_last_n;
    }
    if (dry_on(p)) {
        if (p.dry_penalty_last_n < 0) return -1;
        w = std::max<int64_t>(w, p.dry_penalty_last_n);
    }
    return w;
}

float sanitize(float x) {
    return std::isnan(x) ? -k_inf : x;
}

// log-softmax of raw logits: logprob(x) = x - max - log(sum exp(x - max)). If some logits are +inf the
// distribution is uniform over them; if all are -inf/NaN every logprob is -inf.
struct RawNormalizer {
    float max = -k_inf;
    int64_t n_inf = 0;
    double log_sum = 0.0;

    RawNormalizer(const float *logits, int32_t n_vocab) {
        for (int32_t i = 0; i < n_vocab; ++i) max = std::max(max, sanitize(logits[i]));
        if (max == k_inf) {
            for (int32_t i = 0; i < n_vocab; ++i) n_inf += logits[i] == k_inf;
        } else if (max > -k_inf) {
            double sum = 0.0;
            for (int32_t i = 0; i < n_vocab; ++i) sum += std::exp(double(sanitize(logits[i])) - max);
            log_sum = std::log(sum);
        }
    }

    float logprob(float x) const {
        x = sanitize(x);
        if (max == k_inf) return x == k_inf ? float(-std::log(double(n_inf))) : -k_inf;
        if (max == -k_inf) return -k_inf;
        return float(double(x) - max - log_sum);
    }
};

}  // namespace

Status sampler_params_validate(const SamplerParams &p) {
    if (!std::isfinite(p.temperature))
        return invalid_input("temperature must be a finite number (<= 0 means greedy), got {}",
                             p.temperature);
    if (!(p.top_p >= 0.0f && p.top_p <= 1.0f))
        return invalid_input("top_p must be in [0, 1] (1 turns it off), got {}", p.top_p);
    if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
        return invalid_input("min_p must be in [0, 1] (0 turns it off), got {}", p.min_p);
    if (!(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f))
        return invalid_input("repeat_penalty must be > 0 (1 turns it off), got {}", p.repeat_penalty);
    if (p.repeat_last_n < -1)
        return invalid_input("repeat_last_n must be >= -1 (0: off, -1: whole history), got {}",
                             p.repeat_last_n);
    if (!std::isfinite(p.presence_penalty))
        return invalid_input("presence_penalty must be a finite number, got {}", p.presence_penalty);
    if (!std::isfinite(p.frequency_penalty))
        return invalid_input("frequency_penalty must be a finite number, got {}", p.frequency_penalty);
    if (!(p.typical_p >= 0.0f && p.typical_p <= 1.0f))
        return invalid_input("typical_p must be in [0, 1] (1 turns it off), got {}", p.typical_p);
    if (!std::isfinite(p.top_n_sigma))
        return invalid_input("top_n_sigma must be a finite number (<= 0 turns it off), got {}",
                             p.top_n_sigma);
    if (!(p.xtc_probability >= 0.0f && p.xtc_probability <= 1.0f))
        return invalid_input("xtc_probability must be in [0, 1] (0 turns it off), got {}", p.xtc_probability);
    if (!(p.xtc_threshold >= 0.0f && p.xtc_threshold <= 1.0f))
        return invalid_input("xtc_threshold must be in [0, 1] (above 0.5 turns it off), got {}",
                             p.xtc_threshold);
    if (!(std::isfinite(p.dynatemp_range) && p.dynatemp_range >= 0.0f))
        return invalid_input("dynatemp_range must be >= 0 (0 turns dynamic temperature off), got {}",
                             p.dynatemp_range);
    if (!(std::isfinite(p.dynatemp_exponent) && p.dynatemp_exponent >= 0.0f))
        return invalid_input("dynatemp_exponent must be >= 0, got {}", p.dynatemp_exponent);
    if (p.n_probs < -1 || p.n_probs > kMaxNProbs)
        return invalid_input("n_probs must be in [-1, {}] (-1: off), got {}", kMaxNProbs, p.n_probs);
    if (p.mirostat < 0 || p.mirostat > 2)
        return invalid_input("mirostat must be 0 (off), 1 (Mirostat) or 2 (Mirostat 2.0), got {}",
                             p.mirostat);
    if (!(std::isfinite(p.mirostat_tau) && p.mirostat_tau >= 0.0f))
        return invalid_input("mirostat_tau must be >= 0 (the target surprise in bits), got {}",
                             p.mirostat_tau);
    if (!(std::isfinite(p.mirostat_eta) && p.mirostat_eta >= 0.0f))
        return invalid_input("mirostat_eta must be >= 0 (its learning rate), got {}", p.mirostat_eta);
    if (!(std::isfinite(p.dry_multiplier) && p.dry_multiplier >= 0.0f))
        return invalid_input("dry_multiplier must be >= 0 (0 turns DRY off), got {}", p.dry_multiplier);
    if (!(std::isfinite(p.dry_base) && p.dry_base >= 1.0f))
        return invalid_input("dry_base must be >= 1, got {}", p.dry_base);
    if (p.dry_allowed_length < 0)
        return invalid_input("dry_allowed_length must be >= 0, got {}", p.dry_allowed_length);
    if (p.dry_penalty_last_n < -1)
        return invalid_input("dry_penalty_last_n must be >= -1 (0: off, -1: whole history), got {}",
                             p.dry_penalty_last_n);
    if (p.dry_breakers.size() > kMaxDryBreakers)
        return invalid_input("DRY's sequence breakers are spelled by {} token sequences, at most {}",
                             p.dry_breakers.size(), kMaxDryBreakers);
    size_t tail_tokens = 0;
    for (const DryBreaker &b : p.dry_breakers) {
        if (b.head < 0 || b.tail.size() > kMaxDryTail ||
            std::any_of(b.tail.begin(), b.tail.end(), [](int32_t t) { return t < 0; }))
            return invalid_input("a DRY sequence breaker has a negative token or a tail over {} tokens",
                                 kMaxDryTail);
        tail_tokens += b.tail.size();
    }
    if (tail_tokens > kMaxDryTailTokens)
        return invalid_input("DRY's sequence breakers' tails hold {} tokens, at most {}", tail_tokens,
                             kMaxDryTailTokens);
    if (p.logit_bias.size() > kMaxLogitBias)
        return invalid_input("logit_bias has {} entries, at most {}", p.logit_bias.size(), kMaxLogitBias);
    for (const LogitBias &b : p.logit_bias) {
        if (b.id < 0) return invalid_input("logit_bias: token {} is negative", b.id);
        if (std::isnan(b.bias) || b.bias == k_inf)
            return invalid_input(
                "logit_bias: token {} has bias {}; a bias is a finite number, or -inf to ban it", b.id,
                b.bias);
    }
    return {};
}

Result<LogitBias> parse_logit_bias(std::string_view text) {
    const size_t sign = text.find_first_of("+-");
    LogitBias b;
    bool ok = sign != std::string_view::npos && sign > 0;
    if (ok) {
        const auto [end, ec] = std::from_chars(text.data(), text.data() + sign, b.id);
        ok = ec == std::errc{} && end == text.data() + sign && b.id >= 0;
    }
    const std::string_view value = ok ? text.substr(sign + 1) : std::string_view{};
    if (ok && value == "inf" && text[sign] == '-') {
        b.bias = -k_inf;
    } else if (ok) {
        // from_chars for float is in libstdc++ 11+; strtof would read the locale's decimal point.
        const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), b.bias);
        ok = !value.empty() && ec == std::errc{} && end == value.data() + value.size() &&
             std::isfinite(b.bias) && value[0] != '-' && value[0] != '+';
        if (text[sign] == '-') b.bias = -b.bias;
    }
    if (!ok)
        return invalid_input(
            "--logit-bias '{}': expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 2-inf)", text);
    return b;
}

Status logit_bias_validate(const SamplerParams &p, int32_t n_vocab) {
    for (const LogitBias &b : p.logit_bias)
        if (b.id >= n_vocab)
            return invalid_input("logit_bias: token {} is outside the vocabulary ({} tokens)", b.id, n_vocab);
    return {};
}

Sampler::Sampler(const SamplerParams &params, int32_t n_vocab) : params_(params), n_vocab_(n_vocab) {
    TD_ASSERT(n_vocab >= 1, "n_vocab {}", n_vocab);
    Status status = sampler_params_validate(params);
    if (status.ok()) status = logit_bias_validate(params, n_vocab);
    TD_ASSERT(status.ok(), "unvalidated sampler params: {}", status.message());
    window_ = history_window(params_);
    if (dry_on(params_)) {
        for (size_t i = 0; i < params_.dry_breakers.size(); ++i) {
            const DryBreaker &b = params_.dry_breakers[i];
            dry_by_head_.push_back({b.head, uint32_t(i)});
            if (b.tail.empty()) dry_single_.push_back(b.head);
        }
        std::sort(dry_by_head_.begin(), dry_by_head_.end());
        std::sort(dry_single_.begin(), dry_single_.end());
    }
    mu_ = 2.0f * params_.mirostat_tau;
    reseed();
}

void Sampler::reseed() {
    seed_ = params_.seed;
    if (seed_ == SamplerParams::seed_random) {
        std::random_device device;
        seed_ = (uint64_t(device()) << 32) ^ uint64_t(device());
        seed_ ^=
            uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()) * 0x9E3779B97F4A7C15ull;
        if (seed_ == SamplerParams::seed_random) seed_ = 0;  // seed() must be reusable as a fixed seed
    }
    rng_.seed(seed_);
    xtc_rng_.seed(seed_ ^ 0x5854432D53454544ull);  // its own stream, from the same seed
}

void Sampler::reset() {
    history_.clear();
    history_next_ = 0;
    n_final_ = 0;
    last_greedy_ = false;
    last_token_ = -1;
    last_token_logprob_ = 0.0f;
    mu_ = 2.0f * params_.mirostat_tau;
    reseed();
}

void Sampler::restore(uint64_t n_sampled, std::span<const int32_t> history,
                      std::optional<float> mirostat_mu) {
    reset();
    if (mirostat_mu) {
        TD_ASSERT(std::isfinite(*mirostat_mu), "mirostat mu {}", *mirostat_mu);
        mu_ = *mirostat_mu;
    }
    if (params_.temperature > 0.0f) {
        rng_.discard(n_sampled);  // sample() draws exactly once when not greedy
        if (xtc_on()) xtc_rng_.discard(n_sampled);
    }
    for (int32_t t : history) accept(t);
}

bool sampler_reads_history(const SamplerParams &params) {
    return history_window(params) != 0;
}

std::span<const int32_t> sampler_history_tail(const SamplerParams &params, std::span<const int32_t> tokens,
                                              size_t cap) {
    const int64_t window = history_window(params);
    size_t keep = window < 0 ? tokens.size() : static_cast<size_t>(window);
    keep = std::min({keep, tokens.size(), cap});
    return tokens.subspan(tokens.size() - keep);
}

void Sampler::accept(int32_t token) {
    TD_ASSERT(token >= 0 && token < n_vocab_, "token {} outside the vocabulary [0, {})", token, n_vocab_);
    const int64_t window = window_;
    if (window == 0) return;  // nothing reads the history
    if (history_.capacity() == 0) {
        // Room for the whole window up front (capped: the window size may come from a request), so a
        // sequence does not allocate per token while its window fills.
        const size_t reserve = size_t(std::min<int64_t>(window < 0 ? 256 : window, k_history_reserve_max));
        history_.reserve(reserve);
        penalty_ids_.reserve(reserve);
    }
    if (window < 0 || history_.size() < size_t(window)) {
        history_.push_back(token);
    } else {
        history_[history_next_] = token;  // overwrite the oldest
        history_next_ = (history_next_ + 1) % size_t(window);
    }
}

int32_t Sampler::recent(size_t i) const {
    const size_t n = history_.size();
    if (window_ < 0 || n < size_t(window_)) return history_[n - 1 - i];
    return history_[(history_next_ + n - 1 - i) % n];  // a full ring: the newest is just before next
}

void Sampler::load_logits(const float *logits) {
    cand_.resize(size_t(n_vocab_));  // allocates on the first call only
    for (int32_t i = 0; i < n_vocab_; ++i) cand_[size_t(i)] = {i, sanitize(logits[i])};
    adjust([this](int32_t id) -> float & { return cand_[size_t(id)].logit; });  // cand_ is in id order
}

template <typename LogitOf>
void Sampler::adjust(LogitOf &&logit_of) {
    for (const LogitBias &b : params_.logit_bias) {
        float &logit = logit_of(b.id);
        logit = b.bias == -k_inf ? -k_inf : logit + b.bias;  // a ban holds even over a +inf logit
    }
    apply_penalties(logit_of);
    apply_dry(logit_of);
}

void Sampler::adjust_sparse(const float *logits) {
    for (const Candidate &e : sparse_) sparse_index_[size_t(e.id)] = -1;
    sparse_.clear();
    adjust([&](int32_t id) -> float & {
        int32_t &at = sparse_index_[size_t(id)];
        if (at < 0) {
            at = int32_t(sparse_.size());
            sparse_.push_back({id, sanitize(logits[id])});
        }
        return sparse_[size_t(at)].logit;
    });
}

template <typename LogitOf>
void Sampler::apply_penalties(LogitOf &&logit_of) {
    const SamplerParams &p = params_;
    if (history_.empty() || !penalties_on(p)) return;

    // Each distinct token of the window once, with its count: sort a copy and walk the runs. The history
    // may be longer than the window (DRY's is): then only its latest repeat_last_n.
    const size_t n =
        p.repeat_last_n < 0 ? history_.size() : std::min(history_.size(), size_t(p.repeat_last_n));
    if (n == history_.size()) {
        penalty_ids_.assign(history_.begin(), history_.end());
    } else {
        penalty_ids_.resize(n);
        for (size_t i = 0; i < n; ++i) penalty_ids_[i] = recent(i);
    }
    std::sort(penalty_ids_.begin(), penalty_ids_.end());
    for (size_t i = 0; i < penalty_ids_.size();) {
        size_t j = i;
        while (j < penalty_ids_.size() && penalty_ids_[j] == penalty_ids_[i]) ++j;
        const float count = float(j - i);
        float &logit = logit_of(penalty_ids_[i]);
        // Dividing a negative logit would make the token more likely; multiply it instead (llama.cpp).
        logit = logit <= 0.0f ? logit * p.repeat_penalty : logit / p.repeat_penalty;
        logit -= count * p.frequency_penalty + p.presence_penalty;
        i = j;
    }
}

template <typename LogitOf>
void Sampler::apply_dry(LogitOf &&logit_of) {
    const SamplerParams &p = params_;
    if (!dry_on(p)) return;
    size_t n = history_.size();
    if (p.dry_penalty_last_n > 0) n = std::min(n, size_t(p.dry_penalty_last_n));
    const size_t allowed = size_t(p.dry_allowed_length);
    if (n <= allowed) return;
    dry_recent_.resize(n);
    int32_t *r = dry_recent_.data();  // [n] latest first
    for (size_t i = 0; i < n; ++i) r[i] = recent(i);

    // A repeat reaches back no further than the latest breaker: the nearest position i whose token heads
    // a breaker whose tail is the i' < i tokens after it. The longest such tail at that position counts.
    size_t limit = n;
    for (size_t i = 0; i < n && limit == n; ++i) {
        auto it =
            std::lower_bound(dry_by_head_.begin(), dry_by_head_.end(), std::pair<int32_t, uint32_t>{r[i], 0});
        ptrdiff_t longest = -1;
        for (; it != dry_by_head_.end() && it->first == r[i]; ++it) {
            const std::vector<int32_t> &tail = p.dry_breakers[it->second].tail;
            if (ptrdiff_t(tail.size()) <= longest || tail.size() > i) continue;
            bool match = true;
            for (size_t k = 0; k < tail.size() && match; ++k) match = tail[k] == r[i - 1 - k];
            if (match) longest = ptrdiff_t(tail.size());
        }
        if (longest >= 0) limit = i - size_t(longest);
    }
    if (limit < allowed) return;

    // z[k]: how many of the latest tokens repeat, in order, ending k tokens back (the Z-function of the
    // reversed history). The token after that earlier occurrence, r[k - 1], would extend the repeat.
    dry_z_.assign(n, 0);
    uint32_t *z = dry_z_.data();
    size_t left = 0, right = 0;  // the rightmost match found so far: r[left, right) equals r[0, right - left)
    for (size_t k = 1; k < n; ++k) {
        size_t len = k < right ? std::min(right - k, size_t(z[k - left])) : 0;
        while (k + len < n && r[len] == r[k + len]) ++len;
        if (k + len > right) left = k, right = k + len;
        z[k] = uint32_t(len);
    }
    dry_hits_.clear();
    for (size_t k = 1; k < n; ++k) {
        const size_t len = std::min(size_t(z[k]), limit);
        if (len >= allowed) dry_hits_.push_back({r[k - 1], uint32_t(len)});
    }
    if (dry_hits_.empty()) return;
    std::sort(dry_hits_.begin(), dry_hits_.end());  // per token, its longest repeat last

    // multiplier * base^(len - allowed), the exponent capped where the power would overflow a float.
    const int max_exponent = p.dry_base > 1.000001f ? int(88.7228391f / std::log(p.dry_base)) : 0;
    for (size_t i = 0; i < dry_hits_.size(); ++i) {
        if (i + 1 < dry_hits_.size() && dry_hits_[i + 1].first == dry_hits_[i].first) continue;
        const int32_t token = dry_hits_[i].first;
        if (token >= n_vocab_ || std::binary_search(dry_single_.begin(), dry_single_.end(), token)) continue;
        int exponent = int(dry_hits_[i].second - allowed);
        if (max_exponent > 0 && exponent > max_exponent) exponent = max_exponent;
        logit_of(token) -= p.dry_multiplier * std::pow(p.dry_base, float(exponent));
    }
}

bool Sampler::logits_as_given() const {
    const SamplerParams &p = params_;
    return p.logit_bias.empty() && (history_.empty() || history_window(p) == 0);
}

bool Sampler::top_k_of_raw(const float *logits, size_t &m, bool adjusted) {
    // One pass over the row with a heap of the k best (worst on top) in cand_[0, k): for logits in no
    // particular order almost every token costs one comparison, and nothing is copied but the k best.
    // `adjusted`: the tokens in sparse_ (what the bias, penalties and DRY moved) are offered with their
    // moved logits instead, after the pass.
    const size_t k = size_t(params_.top_k);
    cand_.resize(size_t(n_vocab_));  // allocates on the first call only
    Candidate *c = cand_.data();
    auto cmp = [](const Candidate &a, const Candidate &b) { return better(a, b); };
    auto moved = [&](size_t i) { return adjusted && sparse_index_[i] >= 0; };
    size_t h = 0;  // the heap's size until it holds k
    size_t i = 0;
    for (; i < size_t(n_vocab_) && h < k; ++i)
        if (!moved(i)) c[h++] = {int32_t(i), sanitize(logits[i])};
    std::make_heap(c, c + h, cmp);
    float worst = h > 0 ? c[0].logit : k_inf;  // the heap's top: a token must beat it
    for (; i < size_t(n_vocab_); ++i) {
        const float x = logits[i];
        if (!(x > worst)) continue;  // NaN and ties fail too: a tie's later id loses
        if (moved(i)) continue;
        replace_worst(c, k, Candidate{int32_t(i), x});
        worst = c[0].logit;
    }
    if (adjusted) {
        for (const Candidate &e : sparse_) {  // out of id order: the full comparison
            if (h < k) {
                c[h++] = e;
                std::push_heap(c, c + h, cmp);
            } else if (better(e, c[0])) {
                replace_worst(c, k, e);
            }
        }
    }
    if (h < k) return false;  // fewer tokens than k: the general path
    std::sort_heap(c, c + k, cmp);
    if (c[0].logit == k_inf || c[0].logit == -k_inf) return false;  // the general path handles the limits
    m = k;
    while (c[m - 1].logit == -k_inf) --m;  // fewer than k tokens can occur
    return true;
}

int32_t Sampler::sample(const float *logits) {
    const bool greedy = params_.temperature <= 0.0f;
    const bool as_given = logits_as_given();
    if (greedy && as_given) {
        // What the general path below picks (the lowest id of the largest logit, NaN as -inf, 0 if none is
        // above -inf) without copying the row: the max in independent lanes (no chain of dependent
        // compares), then the first token that holds it.
        cand_.resize(size_t(n_vocab_));  // allocated on the first call, for when penalties start to apply
        const size_t n = size_t(n_vocab_);
        constexpr size_t kLanes = 16;
        std::array<float, kLanes> lane;
        lane.fill(-k_inf);
        size_t i = 0;
        for (; i + kLanes <= n; i += kLanes)
            for (size_t l = 0; l < kLanes; ++l) lane[l] = lane[l] < logits[i + l] ? logits[i + l] : lane[l];
        for (; i < n; ++i) lane[0] = lane[0] < logits[i] ? logits[i] : lane[0];  // NaN never replaces
        const float max = *std::max_element(lane.begin(), lane.end());
        size_t best = 0;
        if (max > -k_inf)
            while (logits[best] != max) ++best;
        n_final_ = 0;
        last_greedy_ = true;
        last_token_ = int32_t(best);
        last_token_logprob_ = 0.0f;
        return last_token_;
    }
    Candidate *c = nullptr;
    size_t m = 0;
    float max = 0.0f;
    bool sorted = false;  // c[0, m) sorted by cmp; otherwise in id order
    const bool top_k_first = !greedy && params_.mirostat == 0 && params_.top_n_sigma <= 0.0f &&
                             params_.top_k > 0 && size_t(params_.top_k) <= k_heap_top_k_max &&
                             params_.top_k < n_vocab_;
    if (top_k_first && sparse_index_.empty()) {      // the first call: room for every token the bias and the
        sparse_index_.assign(size_t(n_vocab_), -1);  // history can move, whether or not they move yet
        sparse_.reserve(params_.logit_bias.size() +
                        size_t(std::min<int64_t>(window_ < 0 ? 256 : window_, k_history_reserve_max)));
    }
    if (top_k_first && !as_given) adjust_sparse(logits);  // the few tokens the bias, penalties and DRY move
    if (top_k_first && top_k_of_raw(logits, m, !as_given)) {
        c = cand_.data();
        max = c[0].logit;
        sorted = true;
    } else {
        sample_prefilter(logits, c, m, max, sorted);
        if (c == nullptr) return last_token_;  // greedy, or nothing can be drawn
    }
    if (params_.mirostat == 0) return sample_filtered(c, m, max, sorted);

    // Mirostat: truncate, draw, and move mu by the surprise of the draw in the distribution it came from.
    const float temperature = params_.temperature;
    const size_t keep = mirostat_keep(c, m, max, temperature);
    const int32_t token = draw(c, keep, max, temperature, /*weighted=*/params_.mirostat == 2);
    const double surprise = -double(last_token_logprob_) / std::log(2.0);
    mu_ = float(double(mu_) - double(params_.mirostat_eta) * (surprise - double(params_.mirostat_tau)));
    return token;
}

void Sampler::sample_prefilter(const float *logits, Candidate *&c, size_t &m, float &max, bool &sorted) {
    load_logits(logits);
    c = cand_.data();  // [n_vocab], id order
    auto cmp = [](const Candidate &a, const Candidate &b) { return better(a, b); };

    // Strict > in id order: ties go to the lowest id, a +inf beats everything, all -inf gives token 0.
    size_t best = 0;
    for (size_t i = 1; i < cand_.size(); ++i)
        if (c[i].logit > c[best].logit) best = i;
    max = c[best].logit;

    const bool greedy = params_.temperature <= 0.0f;
    if (greedy || max == -k_inf) {
        if (!greedy) {  // keep "one number per non-greedy call" even when nothing can be drawn
            rng_();
            if (xtc_on()) xtc_rng_();
        }
        n_final_ = 0;
        last_greedy_ = true;
        last_token_ = int32_t(best);
        last_token_logprob_ = 0.0f;
        c = nullptr;
        return;
    }
    if (max == k_inf) {
        // The limit of the softmax: uniform over the +inf tokens, zero elsewhere.
        for (size_t i = 0; i < cand_.size(); ++i) c[i].logit = c[i].logit == k_inf ? 0.0f : -k_inf;
        max = 0.0f;
    }

    // -inf tokens have probability 0 whatever the filters do; dropping them keeps the sorts short.
    // remove_if keeps the survivors in id order.
    m = size_t(std::remove_if(c, c + cand_.size(), [](const Candidate &x) { return x.logit == -k_inf; }) - c);
    sorted = false;
    if (params_.mirostat != 0) return;  // it replaces the filters

    // top_n_sigma: over every token that can still occur (a +inf row is all 0 here: std 0 keeps them all).
    if (params_.top_n_sigma > 0.0f && m > 1) {
        double mean = 0.0;
        for (size_t i = 0; i < m; ++i) mean += c[i].logit;
        mean /= double(m);
        double var = 0.0;
        for (size_t i = 0; i < m; ++i) var += (c[i].logit - mean) * (c[i].logit - mean);
        const double threshold = double(max) - double(params_.top_n_sigma) * std::sqrt(var / double(m));
        m = size_t(std::remove_if(c, c + m, [&](const Candidate &x) { return double(x.logit) < threshold; }) -
                   c);
    }

    if (params_.top_k > 0 && size_t(params_.top_k) < m) {
        const size_t k = size_t(params_.top_k);
        if (k <= k_heap_top_k_max) {
            // One pass with a heap of the k best (worst on top) in c[0, k): for logits in no particular
            // order almost every candidate costs one comparison. c[k, m) is left as garbage.
            std::make_heap(c, c + k, cmp);
            for (size_t i = k; i < m; ++i)
                if (better(c[i], c[0])) replace_worst(c, k, c[i]);
            std::sort_heap(c, c + k, cmp);
        } else {
            std::nth_element(c, c + k, c + m, cmp);
            std::sort(c, c + k, cmp);
        }
        m = k;
        sorted = true;
    } else if (params_.top_k > 0 && params_.top_k < n_vocab_) {
        // Fewer tokens can occur than top_k keeps (m <= k): they are still walked best first, as when top_k
        // cut.
        std::sort(c, c + m, cmp);
        sorted = true;
    }
}

int32_t Sampler::sample_filtered(Candidate *c, size_t m, float max, bool sorted) {
    auto cmp = [](const Candidate &a, const Candidate &b) { return better(a, b); };
    if (params_.typical_p < 1.0f && m > 1) {
        m = apply_typical(c, m, max);  // leaves the survivors sorted
        sorted = true;
        max = c[0].logit;
    }

    // top_p sees the distribution after top_k and typical_p (temperature 1). Its normaliser is taken now,
    // before min_p. Unless the set is already sorted, the same pass fills a histogram of probability mass
    // over the logits, so the nucleus can be cut out with one partition instead of sorting the vocabulary.
    const bool use_top_p = params_.top_p < 1.0f;
    double sum_t1 = 0.0;
    std::array<double, k_top_p_buckets> bucket_mass{};  // [k_top_p_buckets] mass per logit bucket
    if (use_top_p) {
        for (size_t i = 0; i < m; ++i) {
            const double e = std::exp(c[i].logit - max);  // float exp: 2x cheaper, ample precision
            sum_t1 += e;
            if (!sorted) bucket_mass[top_p_bucket(c[i].logit, max)] += e;
        }
    }

    // min_p: p >= min_p * p_max  <=>  logit >= max + log(min_p). Both top_p and min_p keep a prefix of the
    // sorted order, so "top_p then min_p" is the shorter prefix: filtering by min_p first (order-preserving)
    // and then cutting the nucleus with the pre-min_p normaliser gives exactly llama.cpp's result.
    if (params_.min_p > 0.0f) {
        const float threshold = max + std::log(params_.min_p);
        m = size_t(std::remove_if(c, c + m, [&](const Candidate &x) { return x.logit < threshold; }) - c);
    }

    if (use_top_p) {
        size_t sorted_end = m;  // [0, sorted_end) is sorted and is a prefix of the sorted order of [0, m)
        if (!sorted) {
            // The top buckets holding at least top_p of the mass contain the nucleus. Partitioning on a
            // logit threshold moves a prefix of the sorted order to the front; if rounding made it too
            // short, the loop below sorts the rest.
            const double target = double(params_.top_p) * sum_t1;
            double acc = 0.0;
            int b = k_top_p_buckets - 1;
            for (; b > 0; --b) {
                acc += bucket_mass[size_t(b)];
                if (acc >= target) break;
            }
            if (b > 0) {
                const double lower = double(max) - k_top_p_range + b * (k_top_p_range / k_top_p_buckets);
                sorted_end = size_t(
                    std::partition(c, c + m, [&](const Candidate &x) { return double(x.logit) >= lower; }) -
                    c);
            }
            std::sort(c, c + sorted_end, cmp);
        }
        double cum = 0.0;
        size_t i = 0;
        while (i < m) {
            if (i == sorted_end) {
                std::sort(c + sorted_end, c + m, cmp);
                sorted_end = m;
            }
            cum += std::exp(c[i].logit - max) / sum_t1;
            ++i;
            if (cum >= double(params_.top_p)) break;
        }
        m = i;
        sorted = true;
    }
    TD_ASSERT(m >= 1, "the max-logit token survives every filter");

    if (xtc_on()) {
        // One draw whatever the set (restore() counts on it); llama.cpp's test is chance <= probability.
        const bool hit = uniform01(xtc_rng_) <= double(params_.xtc_probability);
        if (hit && m > 1) {
            if (!sorted) std::sort(c, c + m, cmp);
            sorted = true;
            m = apply_xtc(c, m);
            max = c[0].logit;
        }
    }

    // Temperature, softmax, draw. (x - max) / t rather than x * (1 / t): no inf * 0 for a tiny t.
    float temperature = params_.temperature;
    if (params_.dynatemp_range > 0.0f && m > 1) {
        temperature = dynamic_temperature(c, m, max);
        if (temperature <= 0.0f) {
            // llama.cpp's temperature 0: only the best survivor keeps its logit.
            c[0] = *std::min_element(c, c + m,
                                     [](const Candidate &a, const Candidate &b) { return better(a, b); });
            m = 1;
            temperature = 1.0f;
        }
    }
    return draw(c, m, max, temperature);
}

int32_t Sampler::draw(Candidate *c, size_t m, float max, float temperature, bool weighted) {
    weight_.resize(cand_.size());  // allocates on the first call only
    float *w = weight_.data();     // [m]
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) {
        if (!weighted) w[i] = std::exp((c[i].logit - max) / temperature);
        sum += w[i];
    }
    const double r = uniform01(rng_) * sum;
    double cum = 0.0;
    size_t pick = 0;  // the best survivor has weight 1, so a positive-weight candidate exists
    for (size_t i = 0; i < m; ++i) {
        if (w[i] <= 0.0f) continue;
        pick = i;
        cum += w[i];
        if (cum > r) break;  // falls through to the last positive weight if rounding puts r at sum
    }

    n_final_ = m;
    last_greedy_ = false;
    final_max_ = max;
    final_temp_ = temperature;
    final_log_sum_ = std::log(sum);
    last_token_ = c[pick].id;
    last_token_logprob_ = float(double(c[pick].logit - max) / temperature - final_log_sum_);
    return last_token_;
}

Sampler::ExpMoments Sampler::exp_moments(const Candidate *c, size_t m, float max) {
    ExpMoments r;
    double weighted = 0.0;
    for (size_t i = 0; i < m; ++i) {
        const double d = double(c[i].logit) - max;
        const double e = std::exp(d);
        r.sum += e;
        if (e > 0.0) weighted += e * d;  // a -inf logit adds nothing (not 0 * -inf)
    }
    r.mean = weighted / r.sum;
    return r;
}

size_t Sampler::mirostat_keep(Candidate *c, size_t m, float max, float t) {
    weight_.resize(cand_.size());  // allocates on the first call only
    float *w = weight_.data();     // [m]
    if (params_.mirostat == 2) {
        // The weights draw() would compute, kept for it: p_i = w_i / S, and -log2 p_i <= mu <=> w_i >= S
        // 2^-mu.
        double sum = 0.0;
        for (size_t i = 0; i < m; ++i) {
            w[i] = std::exp((c[i].logit - max) / t);
            sum += w[i];
        }
        const double floor = sum * std::exp2(-double(mu_));
        if (!(floor <= 1.0)) {  // mu is below even the best token's surprise: keep just that one (w = 1)
            const size_t best =
                size_t(std::find_if(c, c + m, [&](const Candidate &x) { return x.logit == max; }) - c);
            c[0] = c[best];
            w[0] = 1.0f;
            return 1;
        }
        size_t keep = 0;  // in id order
        for (size_t i = 0; i < m; ++i) {
            if (double(w[i]) < floor) continue;
            c[keep] = c[i];
            w[keep++] = w[i];
        }
        return keep;
    }
    // Mirostat 1: the Zipf exponent s from the least-squares fit of log(p_i / p_i+1) = (l_i - l_i+1) / t
    // against log((i + 2) / (i + 1)) over the 100 largest logits; then the k that makes the expected surprise
    // of a Zipf distribution with that exponent over n_vocab tokens mu. Only values are needed: a copy of the
    // logits is selected, and c stays in id order.
    constexpr size_t kFit = 100;
    const size_t top = std::min(m, kFit);
    // The `top` largest into w[0, top) with a heap (the smallest on top) in one pass, most tokens one
    // comparison; the rest after them, for the cut below.
    for (size_t i = 0; i < top; ++i) w[i] = c[i].logit;
    std::make_heap(w, w + top, std::greater<>());
    for (size_t i = top; i < m; ++i) {
        const float x = c[i].logit;
        if (x > w[0]) {
            std::pop_heap(w, w + top, std::greater<>());
            w[i] = w[top - 1];
            w[top - 1] = x;
            std::push_heap(w, w + top, std::greater<>());
        } else {
            w[i] = x;
        }
    }
    std::sort(w, w + top, std::greater<>());
    double sum_tb = 0.0, sum_tt = 0.0;
    for (size_t i = 0; i + 1 < top; ++i) {
        const double ti = std::log(double(i + 2) / double(i + 1));
        sum_tb += ti * (double(w[i] - w[i + 1]) / t);
        sum_tt += ti * ti;
    }
    const double s = sum_tb / sum_tt;  // NaN for one token: k is then 1
    const double e = s - 1.0;
    const double k = std::pow(e * std::exp2(double(mu_)) / (1.0 - std::pow(double(n_vocab_), -e)), 1.0 / s);
    const size_t keep = k >= double(m) ? m : k >= 1.0 ? size_t(k) : 1;  // NaN: 1
    if (keep == m) return m;
    // The top `keep` in the candidates' order: every logit above the keep-th largest, then the lowest ids of
    // those equal to it.
    if (keep > top) std::nth_element(w + top, w + keep - 1, w + m, std::greater<>());
    const float edge = w[keep - 1];
    size_t ties = keep;
    for (size_t i = 0; i < m; ++i) ties -= c[i].logit > edge;
    size_t n = 0;
    for (size_t i = 0; i < m; ++i) {
        if (c[i].logit > edge) {
            c[n++] = c[i];
        } else if (c[i].logit == edge && ties > 0) {
            c[n++] = c[i];
            --ties;
        }
    }
    return n;
}

float Sampler::dynamic_temperature(const Candidate *c, size_t m, float max) const {
    // H = -sum p_i log p_i with p_i = e^(l_i - max) / S: H = log S - E[l - max].
    const ExpMoments moments = exp_moments(c, m, max);
    const double entropy = std::max(0.0, std::log(moments.sum) - moments.mean);
    const double normalised = std::min(1.0, entropy / std::log(double(m)));
    const double low = std::max(0.0, double(params_.temperature) - params_.dynatemp_range);
    const double high = double(params_.temperature) + params_.dynatemp_range;
    return float(low + (high - low) * std::pow(normalised, double(params_.dynatemp_exponent)));
}

size_t Sampler::apply_typical(Candidate *c, size_t m, float max) {
    // With p_i = e^(l_i - max) / S, -log p_i - H = E[l] - l_i, where E[l] = sum p_j l_j: a token's distance
    // from the entropy is its logit's distance from the mean logit. One pass of exp gives S and E[l].
    const ExpMoments moments = exp_moments(c, m, max);
    const double sum = moments.sum;
    const double mean = double(max) + moments.mean;
    auto score = [&](const Candidate &x) { return std::fabs(double(x.logit) - mean); };
    // Ties go to the sorted order (logit descending, id ascending): a total order, whatever the sort.
    auto closer = [&](const Candidate &a, const Candidate &b) {
        const double sa = score(a), sb = score(b);
        return sa < sb || (sa == sb && better(a, b));
    };
    // The kept tokens are the fewest closest whose mass passes typical_p, usually a few dozen: select them in
    // growing chunks (nth_element over what is left, then sort the chunk) rather than sorting everything.
    double cum = 0.0;
    size_t done = 0;
    bool reached = false;
    for (size_t chunk = 64; done < m && !reached; chunk *= 8) {
        const size_t end = std::min(m, done + chunk);
        if (end < m) std::nth_element(c + done, c + end, c + m, closer);
        std::sort(c + done, c + end, closer);
        while (done < end && !reached) {
            cum += std::exp(double(c[done++].logit) - max) / sum;
            reached = cum > double(params_.typical_p);
        }
    }
    const size_t keep = done;  // all of them if rounding kept the mass from passing typical_p
    std::sort(c, c + keep, [](const Candidate &a, const Candidate &b) { return better(a, b); });
    return keep;
}

size_t Sampler::apply_xtc(Candidate *c, size_t m) {
    const float top = c[0].logit;
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) sum += std::exp(double(c[i].logit) - top);
    // The tokens at or above the threshold are a prefix of the sorted order; all but its last go.
    size_t last = 0;
    for (size_t i = 0; i < m; ++i) {
        if (std::exp(double(c[i].logit) - top) / sum < double(params_.xtc_threshold)) break;
        last = i;
    }
    if (last == 0) return m;
    std::move(c + last, c + m, c);
    return m - last;
}

float Sampler::last_logprob() const {
    return last_token_logprob_;
}

std::vector<TokenProb> Sampler::last_top_logprobs(int n) const {
    std::vector<TokenProb> out;
    if (last_token_ < 0 || n <= 0) return out;
    if (last_greedy_) {
        out.push_back({last_token_, 0.0f});
        return out;
    }
    const Candidate *c = cand_.data();
    const auto best = select_best(n_final_, n, [&](size_t i) { return Scored{c[i].id, c[i].logit}; });
    out.reserve(best.size());
    for (const Scored &s : best)
        out.push_back({s.id, float(double(s.logit - final_max_) / final_temp_ - final_log_sum_)});
    return out;
}

std::vector<TokenProb> Sampler::top_logprobs(const float *logits, int n) const {
    const RawNormalizer norm(logits, n_vocab_);
    const auto best = select_best(size_t(n_vocab_), n, [&](size_t i) {
        return Scored{int32_t(i), sanitize(logits[i])};
    });
    std::vector<TokenProb> out;
    out.reserve(best.size());
    for (const Scored &s : best) out.push_back({s.id, norm.logprob(s.logit)});
    return out;
}

float Sampler::token_logprob(const float *logits, int32_t token) const {
    TD_ASSERT(token >= 0 && token < n_vocab_, "token {} outside the vocabulary [0, {})", token, n_vocab_);
    return RawNormalizer(logits, n_vocab_).logprob(logits[token]);
}

}  // namespace td
