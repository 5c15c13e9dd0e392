#include "model/sampler.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
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
            std::pop_heap(heap.begin(), heap.end(), cmp);
            heap.back() = s;
            std::push_heap(heap.begin(), heap.end(), cmp);
        }
    }
    std::sort_heap(heap.begin(), heap.end(), cmp);
    return heap;
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
}

void Sampler::reset() {
    history_.clear();
    history_next_ = 0;
    n_final_ = 0;
    last_greedy_ = false;
    last_token_ = -1;
    last_token_logprob_ = 0.0f;
    reseed();
}

void Sampler::restore(uint64_t n_sampled, std::span<const int32_t> history) {
    reset();
    if (params_.temperature > 0.0f) rng_.discard(n_sampled);  // sample() draws exactly once when not greedy
    for (int32_t t : history) accept(t);
}

std::span<const int32_t> sampler_history_tail(const SamplerParams &params, std::span<const int32_t> sampled,
                                              size_t cap) {
    size_t keep = params.repeat_last_n < 0 ? sampled.size() : static_cast<size_t>(params.repeat_last_n);
    keep = std::min({keep, sampled.size(), cap});
    return sampled.subspan(sampled.size() - keep);
}

void Sampler::accept(int32_t token) {
    TD_ASSERT(token >= 0 && token < n_vocab_, "token {} outside the vocabulary [0, {})", token, n_vocab_);
    const int32_t window = params_.repeat_last_n;
    if (window == 0) return;  // nothing reads the history
    if (history_.capacity() == 0) {
        // Room for the whole window up front (capped: the window size may come from a request), so a
        // sequence does not allocate per token while its window fills.
        const size_t reserve = std::min<size_t>(window < 0 ? 256 : size_t(window), k_history_reserve_max);
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

void Sampler::load_logits(const float *logits) {
    cand_.resize(size_t(n_vocab_));  // allocates on the first call only
    for (int32_t i = 0; i < n_vocab_; ++i) cand_[size_t(i)] = {i, sanitize(logits[i])};
    for (const LogitBias &b : params_.logit_bias) {
        float &logit = cand_[size_t(b.id)].logit;
        logit = b.bias == -k_inf ? -k_inf : logit + b.bias;  // a ban holds even over a +inf logit
    }
    apply_penalties();
}

void Sampler::apply_penalties() {
    const SamplerParams &p = params_;
    if (history_.empty()) return;
    if (p.repeat_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) return;

    // Each distinct token of the window once, with its count: sort a copy and walk the runs.
    penalty_ids_.assign(history_.begin(), history_.end());
    std::sort(penalty_ids_.begin(), penalty_ids_.end());
    for (size_t i = 0; i < penalty_ids_.size();) {
        size_t j = i;
        while (j < penalty_ids_.size() && penalty_ids_[j] == penalty_ids_[i]) ++j;
        const float count = float(j - i);
        float &logit = cand_[size_t(penalty_ids_[i])].logit;  // cand_ is still in id order
        // Dividing a negative logit would make the token more likely; multiply it instead (llama.cpp).
        logit = logit <= 0.0f ? logit * p.repeat_penalty : logit / p.repeat_penalty;
        logit -= count * p.frequency_penalty + p.presence_penalty;
        i = j;
    }
}

int32_t Sampler::sample(const float *logits) {
    load_logits(logits);
    Candidate *c = cand_.data();  // [n_vocab], id order

    // Strict > in id order: ties go to the lowest id, a +inf beats everything, all -inf gives token 0.
    size_t best = 0;
    for (size_t i = 1; i < cand_.size(); ++i)
        if (c[i].logit > c[best].logit) best = i;
    float max = c[best].logit;

    const bool greedy = params_.temperature <= 0.0f;
    if (greedy || max == -k_inf) {
        if (!greedy) rng_();  // keep "one number per non-greedy call" even when nothing can be drawn
        n_final_ = 0;
        last_greedy_ = true;
        last_token_ = int32_t(best);
        last_token_logprob_ = 0.0f;
        return last_token_;
    }
    if (max == k_inf) {
        // The limit of the softmax: uniform over the +inf tokens, zero elsewhere.
        for (size_t i = 0; i < cand_.size(); ++i) c[i].logit = c[i].logit == k_inf ? 0.0f : -k_inf;
        max = 0.0f;
    }

    // -inf tokens have probability 0 whatever the filters do; dropping them keeps the sorts short.
    // remove_if keeps the survivors in id order.
    size_t m =
        size_t(std::remove_if(c, c + cand_.size(), [](const Candidate &x) { return x.logit == -k_inf; }) - c);
    auto cmp = [](const Candidate &a, const Candidate &b) { return better(a, b); };
    bool sorted = false;  // [0, m) sorted by cmp; otherwise in id order

    if (params_.top_k > 0 && size_t(params_.top_k) < m) {
        const size_t k = size_t(params_.top_k);
        if (k <= k_heap_top_k_max) {
            // One pass with a heap of the k best (worst on top) in c[0, k): for logits in no particular
            // order almost every candidate costs one comparison. c[k, m) is left as garbage.
            std::make_heap(c, c + k, cmp);
            for (size_t i = k; i < m; ++i) {
                if (!better(c[i], c[0])) continue;
                std::pop_heap(c, c + k, cmp);
                c[k - 1] = c[i];
                std::push_heap(c, c + k, cmp);
            }
            std::sort_heap(c, c + k, cmp);
        } else {
            std::nth_element(c, c + k, c + m, cmp);
            std::sort(c, c + k, cmp);
        }
        m = k;
        sorted = true;
    }

    // top_p sees the distribution after top_k (temperature 1). Its normaliser is taken now, before min_p.
    // Unless the set is already sorted, the same pass fills a histogram of probability mass over the
    // logits, so the nucleus can be cut out with one partition instead of sorting the vocabulary.
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

    // Temperature, softmax, draw. (x - max) / t rather than x * (1 / t): no inf * 0 for a tiny t.
    const float temperature = params_.temperature;
    weight_.resize(cand_.size());  // allocates on the first call only
    float *w = weight_.data();     // [m]
    double sum = 0.0;
    for (size_t i = 0; i < m; ++i) {
        w[i] = std::exp((c[i].logit - max) / temperature);
        sum += w[i];
    }
    const double r = uniform01(rng_) * sum;
    double cum = 0.0;
    size_t pick = 0;  // the max token has weight 1, so a positive-weight candidate exists
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
