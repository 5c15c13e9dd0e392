// The sampler's cost per token for each chain of filters, over logits shaped like a model's (most of the
// vocabulary far below a few likely tokens), at llama's and Qwen's vocabulary sizes, 2,048 tokens into a
// sequence. Each round times every
// chain once on the same rows, the order rotating; a figure is the median of the rounds' per-token means, and
// its ratio to the default chain (top-k 40, top-p 0.95, min-p 0.05, temperature 0.8) is the median of the
// rounds' ratios. Single-threaded and compute-bound: no read bandwidth is recorded.
//
//   sampler [ROUNDS] [TOKENS_PER_ROUND]
#include "model/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

using namespace td;

namespace {

struct Chain {
    const char *name;
    SamplerParams params;
};

std::vector<Chain> chains() {
    const SamplerParams base;  // llama.cpp's defaults: top_k 40, top_p 0.95, min_p 0.05, temperature 0.8
    std::vector<Chain> out;
    out.push_back({"default (top-k 40, top-p 0.95, min-p 0.05)", base});
    SamplerParams p = base;
    p.temperature = 0.0f;
    out.push_back({"greedy", p});
    p = base;
    p.typical_p = 0.9f;
    out.push_back({"default + typical-p 0.9", p});
    p = base;
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.1f;
    out.push_back({"default + XTC (probability 1, threshold 0.1)", p});
    p = base;
    p.top_n_sigma = 1.0f;
    out.push_back({"default + top-n-sigma 1", p});
    p = base;
    p.dynatemp_range = 0.5f;
    out.push_back({"default + dynamic temperature 0.8 +- 0.5", p});
    p = base;
    p.mirostat = 2;  // llama.cpp's defaults: tau 5, eta 0.1; the filters are off while it is on
    out.push_back({"Mirostat 2.0 (tau 5, eta 0.1) in place of the filters", p});
    p = base;
    p.mirostat = 1;
    out.push_back({"Mirostat (tau 5, eta 0.1) in place of the filters", p});
    p = base;
    p.repeat_penalty = 1.1f;
    out.push_back({"default + repeat penalty 1.1 (64 tokens)", p});
    p = base;
    p.dry_multiplier = 0.8f;  // over the whole history (dry_penalty_last_n -1), the new line a breaker
    p.dry_breakers = {{13, {}}};
    out.push_back({"default + DRY 0.8 (whole history)", p});
    p = base;
    p.top_k = 0;
    out.push_back({"top-k off (top-p 0.95, min-p 0.05)", p});
    p = base;
    p.top_k = 0;
    p.typical_p = 0.9f;
    out.push_back({"top-k off + typical-p 0.9", p});
    p = base;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    out.push_back({"no filters (plain softmax draw)", p});
    return out;
}

// Tokens already accepted before the timed ones: text with repeats in it (what DRY scans), the new line
// now and then.
constexpr int kHistory = 2048;
std::vector<int32_t> history_like_text(int32_t n_vocab, std::mt19937_64 &rng) {
    std::vector<int32_t> h;
    std::uniform_int_distribution<int32_t> pick(100, std::min(n_vocab, 8000) - 1);
    while (h.size() < size_t(kHistory)) {
        if (h.size() > 40 && rng() % 4 == 0) {  // repeat an earlier stretch
            const size_t from = rng() % (h.size() - 20), len = 3 + rng() % 12;
            for (size_t i = 0; i < len; ++i) h.push_back(h[from + i]);
        } else {
            h.push_back(rng() % 30 == 0 ? 13 : pick(rng));
        }
    }
    h.resize(size_t(kHistory));
    return h;
}

// A row like a model's: a normal spread of logits with a few tokens well above it.
std::vector<float> model_like_row(int32_t n_vocab, std::mt19937_64 &rng) {
    std::normal_distribution<float> spread(0.0f, 2.5f);
    std::vector<float> row(static_cast<size_t>(n_vocab));
    for (float &x : row) x = spread(rng);
    std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
    for (int i = 0; i < 8; ++i) row[static_cast<size_t>(pick(rng))] = 12.0f + 1.5f * float(i);
    return row;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char **argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
    const int tokens = argc > 2 ? std::atoi(argv[2]) : 200;
    if (rounds < 1 || tokens < 1) {
        std::fprintf(stderr, "usage: sampler [ROUNDS >= 1] [TOKENS_PER_ROUND >= 1]\n");
        return 2;
    }
    const std::vector<Chain> list = chains();
    std::printf("| vocabulary | chain | µs per token (median of %d rounds) | vs default |\n", rounds);
    std::printf("| ---: | --- | ---: | ---: |\n");
    for (int32_t n_vocab : {32000, 151936}) {
        std::mt19937_64 rng(42);
        std::vector<std::vector<float>> rows;
        for (int i = 0; i < 16; ++i) rows.push_back(model_like_row(n_vocab, rng));
        const std::vector<int32_t> history = history_like_text(n_vocab, rng);
        std::vector<std::vector<double>> us(list.size()), ratio(list.size());
        int32_t sink = 0;
        for (int r = 0; r < rounds; ++r) {
            std::vector<double> round_us(list.size());
            for (size_t k = 0; k < list.size(); ++k) {
                const size_t c = (k + size_t(r)) % list.size();  // rotate the order
                SamplerParams params = list[c].params;
                params.seed = 7;
                Sampler s(params, n_vocab);
                for (int32_t t : history) s.accept(t);
                sink += s.sample(rows[0].data());  // the first call allocates its scratch
                const auto t0 = std::chrono::steady_clock::now();
                for (int t = 0; t < tokens; ++t) {
                    const int32_t id = s.sample(rows[size_t(t) % rows.size()].data());
                    s.accept(id);
                    sink += id;
                }
                round_us[c] =
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
                    tokens;
            }
            for (size_t c = 0; c < list.size(); ++c) {
                us[c].push_back(round_us[c]);
                ratio[c].push_back(round_us[c] / round_us[0]);
            }
        }
        for (size_t c = 0; c < list.size(); ++c)
            std::printf("| %d | %s | %.1f | %.2fx |\n", n_vocab, list[c].name, median(us[c]),
                        median(ratio[c]));
        if (sink == -1) std::printf("\n");  // keeps the draws alive
    }
    return 0;
}
