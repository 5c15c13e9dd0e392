#include "model/tp-sample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace td {
namespace {

// Encoding of one output row: u32 header, then either n (i32 id, f32 logit) pairs or, with kDense, i32 first
// id and the slice's n logits in id order.
constexpr uint32_t kDense = 1u << 31;

// How many candidates a rank sends for a row: 0 = the dense slice. A logit bias, like the penalties and DRY,
// moves tokens past each other before top-k sees them, so rank 0's sampler gets every logit and applies it;
// so does top_n_sigma, which reads the spread of every logit before top-k. typical_p and XTC act on what
// top-k kept, so the global top-k is all they need. Mirostat skips top-k and reads the whole distribution.
int32_t sparse_count(const SamplerParams &p, bool want_logits, int32_t n_vocab) {
    if (want_logits || sampler_reads_history(p) || !p.logit_bias.empty()) return 0;
    if (p.temperature > 0.0f && (p.top_n_sigma > 0.0f || p.mirostat != 0)) return 0;
    if (p.temperature <= 0.0f) return 1;
    if (p.top_k > 0 && p.top_k < n_vocab && p.top_k <= kTpSparseTopK) return p.top_k;
    return 0;
}

// NaN ranks as -inf, as in the sampler.
float key(float v) {
    return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

template <typename T>
void put(std::vector<uint8_t> &buf, T v) {
    const size_t at = buf.size();
    buf.resize(at + sizeof(T));
    std::memcpy(&buf[at], &v, sizeof(T));
}

template <typename T>
bool get(const std::vector<uint8_t> &buf, size_t &at, T *v) {
    if (at > buf.size() || buf.size() - at < sizeof(T)) return false;
    std::memcpy(v, &buf[at], sizeof(T));
    at += sizeof(T);
    return true;
}

}  // namespace

Status TpOutputMerger::sample(const Batch &batch, const float *logits, const TpSlice &slice, int32_t n_vocab,
                              const std::vector<Sampler *> &samplers, const std::vector<bool> &want_logits,
                              Collective &collective, std::vector<StepOutput> &out) {
    out.clear();
    const int32_t n_local = slice.n_vocab();
    mine_.clear();
    int32_t o = 0;
    for (int32_t i = 0; i < batch.size(); ++i) {
        if (!out_has_logits(batch.want_logits[i])) continue;
        const float *row = logits + static_cast<size_t>(o++) * n_local;  // [n_local]
        const int32_t s = batch.seq[i];
        const Sampler *sampler = samplers[s];
        // A score row, and a row that reports its log-probabilities, need the whole distribution.
        const int32_t k =
            batch.want_logits[i] == kOutScore ? 0
            : sampler == nullptr
                ? 1
                : sparse_count(sampler->params(), want_logits[s] || sampler->params().n_probs >= 0, n_vocab);
        if (k == 0) {
            put<uint32_t>(mine_, kDense | static_cast<uint32_t>(n_local));
            put<int32_t>(mine_, slice.vocab_first);
            const size_t at = mine_.size();
            mine_.resize(at + sizeof(float) * n_local);
            std::memcpy(&mine_[at], row, sizeof(float) * n_local);
            continue;
        }
        const int32_t n = std::min(k, n_local);
        auto better = [row](int32_t a, int32_t b) {
            const float ka = key(row[a]), kb = key(row[b]);
            return ka > kb || (ka == kb && a < b);
        };
        order_.resize(n_local);
        if (n == 1) {  // greedy: one pass, the first of the largest
            int32_t best = 0;
            for (int32_t j = 1; j < n_local; ++j)
                if (better(j, best)) best = j;
            order_[0] = best;
        } else {
            for (int32_t j = 0; j < n_local; ++j) order_[j] = j;
            std::partial_sort(order_.begin(), order_.begin() + n, order_.end(), better);
        }
        put<uint32_t>(mine_, static_cast<uint32_t>(n));
        for (int32_t j = 0; j < n; ++j) {
            put<int32_t>(mine_, slice.vocab_first + order_[j]);
            put<float>(mine_, row[order_[j]]);
        }
    }
    TD_TRY(collective.gather(mine_, all_));
    if (collective.rank() != 0) return {};

    const int32_t n_out = o;
    full_.assign(static_cast<size_t>(n_out) * n_vocab, -std::numeric_limits<float>::infinity());
    for (size_t r = 0; r < all_.size(); ++r) {
        const std::vector<uint8_t> &buf = all_[r];
        size_t at = 0;
        for (int32_t row = 0; row < n_out; ++row) {
            float *dst = &full_[static_cast<size_t>(row) * n_vocab];  // [n_vocab]
            uint32_t head = 0;
            if (!get(buf, at, &head)) return make_error(ErrorKind::failed, "rank {}: short candidate list", r);
            const uint32_t n = head & ~kDense;
            if (head & kDense) {
                int32_t first = 0;
                if (!get(buf, at, &first) || buf.size() - at < sizeof(float) * n)
                    return make_error(ErrorKind::failed, "rank {}: short logits slice", r);
                if (first < 0 || static_cast<uint64_t>(first) + n > static_cast<uint64_t>(n_vocab))
                    return make_error(ErrorKind::failed, "rank {}: logits slice outside the vocabulary", r);
                std::memcpy(dst + first, &buf[at], sizeof(float) * n);
                at += sizeof(float) * n;
                continue;
            }
            for (uint32_t j = 0; j < n; ++j) {
                int32_t id = 0;
                float v = 0.0f;
                if (!get(buf, at, &id) || !get(buf, at, &v))
                    return make_error(ErrorKind::failed, "rank {}: short candidate list", r);
                if (id < 0 || id >= n_vocab)
                    return make_error(ErrorKind::failed, "rank {}: candidate id {} outside the vocabulary", r, id);
                dst[id] = v;
            }
        }
    }
    sample_outputs(batch, full_.data(), n_vocab, samplers, want_logits, nullptr, 0, out);
    return {};
}

}  // namespace td
