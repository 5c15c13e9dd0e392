#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace td {
namespace {

struct ChunkSums {
    double nll = 0.0;
    double nll2 = 0.0;
};

// The steps of one group of chunks (one per slot), and for each output row of each step the slot it scores
// and the token it predicts.
struct GroupSteps {
    std::vector<Batch> steps;
    std::vector<std::vector<std::pair<int32_t, int32_t>>> targets;  // [step][output row] = {slot, next token}
};

GroupSteps group_steps(std::span<const int32_t> tokens, int32_t first_chunk, int32_t n_slots,
                       const PerplexityParams &params) {
    const int32_t n_ctx = params.n_ctx;
    const int32_t first = n_ctx / 2;
    GroupSteps g;
    Batch cur;
    std::vector<std::pair<int32_t, int32_t>> cur_targets;
    const auto flush = [&] {
        if (cur.empty()) return;
        g.steps.push_back(std::move(cur));
        g.targets.push_back(std::move(cur_targets));
        cur = Batch();
        cur_targets.clear();
    };
    for (int32_t s = 0; s < n_slots; ++s) {
        const int32_t *chunk = tokens.data() + static_cast<size_t>(first_chunk + s) * n_ctx;
        // The last position predicts nothing in the chunk: it is not computed.
        for (int32_t pos = 0; pos < n_ctx - 1; ++pos) {
            if (cur.size() == params.n_batch) flush();
            const int32_t tok = pos == 0 && params.bos >= 0 ? params.bos : chunk[pos];
            // A scored row rates the token after it where the logits are: one number comes back, not a row of
            // n_vocab logits (what crosses a cluster's links).
            if (pos >= first) {
                cur.add_score(tok, pos, s, chunk[pos + 1]);
                cur_targets.emplace_back(s, chunk[pos + 1]);
            } else {
                cur.add_out(tok, pos, s, kOutNone);
            }
        }
    }
    flush();
    return g;
}

}  // namespace

double PerplexityResult::ppl() const {
    return n_scored > 0 ? std::exp(nll_sum / static_cast<double>(n_scored)) : 0.0;
}

double PerplexityResult::ppl_error() const {
    if (n_scored < 2) return 0.0;
    const double n = static_cast<double>(n_scored);
    const double mean = nll_sum / n;
    const double var = nll2_sum / n - mean * mean;
    return var > 0.0 ? std::sqrt(var / (n - 1.0)) * ppl() : 0.0;
}

Result<PerplexityResult> perplexity(
    Engine &engine, std::span<const int32_t> tokens, const PerplexityParams &params,
    const std::function<void(int32_t chunk, const PerplexityResult &so_far)> &on_chunk) {
    const int32_t n_ctx = params.n_ctx;
    const int32_t n_vocab = engine.n_vocab();
    if (n_ctx < 4) return invalid_input("the chunk size must be at least 4 tokens, got {}", n_ctx);
    if (n_ctx > engine.n_ctx())
        return invalid_input("chunks of {} tokens do not fit the context of {}", n_ctx, engine.n_ctx());
    if (params.n_batch < 1) return invalid_input("the batch size must be at least 1, got {}", params.n_batch);
    if (params.n_chunks == 0 || params.n_chunks < -1)
        return invalid_input("the number of chunks must be -1 (all) or at least 1, got {}", params.n_chunks);
    if (params.bos >= n_vocab)
        return invalid_input("BOS id {} is outside the vocabulary of {}", params.bos, n_vocab);
    if (tokens.size() < static_cast<size_t>(n_ctx))
        return invalid_input(
            "the text is {} tokens, less than one chunk of {}: give a longer text or a smaller "
            "context",
            tokens.size(), n_ctx);
    for (size_t i = 0; i < tokens.size(); ++i)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return invalid_input("token {} (id {}) is outside the vocabulary of {}", i, tokens[i], n_vocab);

    int64_t n_chunks = static_cast<int64_t>(tokens.size() / static_cast<size_t>(n_ctx));
    if (params.n_chunks > 0) n_chunks = std::min<int64_t>(n_chunks, params.n_chunks);
    const int32_t per_chunk = n_ctx - 1 - n_ctx / 2;
    const int32_t n_slots = static_cast<int32_t>(std::min<int64_t>(std::max(engine.n_seq(), 1), n_chunks));
    const size_t max_in_flight = static_cast<size_t>(std::max(engine.max_in_flight(), 1));
    SamplerParams greedy;  // score rows draw nothing; the sampler is only what a started slot needs
    greedy.temperature = 0.0f;

    PerplexityResult total;
    for (int64_t group = 0; group < n_chunks; group += n_slots) {
        const int32_t n_group = static_cast<int32_t>(std::min<int64_t>(n_slots, n_chunks - group));
        for (int32_t s = 0; s < n_group; ++s) TD_TRY(engine.seq_start(s, greedy));
        const GroupSteps g = group_steps(tokens, static_cast<int32_t>(group), n_group, params);
        std::vector<ChunkSums> sums(static_cast<size_t>(n_group));
        size_t submitted = 0;
        for (size_t done = 0; done < g.steps.size(); ++done) {
            while (submitted < g.steps.size() && submitted - done < max_in_flight)
                TD_TRY(engine.submit(g.steps[submitted++]));
            TD_ASSIGN_OR_RETURN(std::vector<StepOutput> outs, engine.wait());
            const auto &targets = g.targets[done];
            if (outs.size() != targets.size())
                return make_error(ErrorKind::failed, "a step of {} scored rows returned {} outputs",
                                  targets.size(), outs.size());
            for (size_t i = 0; i < outs.size(); ++i) {
                if (outs[i].token != targets[i].second || !std::isfinite(outs[i].logprob))
                    return make_error(ErrorKind::failed, "a scored row rated token {} at {}, not token {}",
                                      outs[i].token, outs[i].logprob, targets[i].second);
                const double v = -static_cast<double>(outs[i].logprob);
                ChunkSums &c = sums[static_cast<size_t>(targets[i].first)];
                c.nll += v;
                c.nll2 += v * v;
            }
        }
        for (int32_t s = 0; s < n_group; ++s) {
            ++total.n_chunks;
            total.n_scored += per_chunk;
            total.nll_sum += sums[static_cast<size_t>(s)].nll;
            total.nll2_sum += sums[static_cast<size_t>(s)].nll2;
            if (on_chunk) on_chunk(static_cast<int32_t>(group) + s, total);
        }
    }
    return total;
}

}  // namespace td
