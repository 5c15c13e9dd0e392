#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "model/sampler.h"

// Heap allocations made by this thread; the global operator new below counts them so a test can check that
// sample() does not allocate per token. This replacement is local to the test-sampler binary.
thread_local long long g_allocations = 0;

// noinline: once inlined into the standard containers, GCC 12 pairs malloc with operator delete and warns
// (-Wmismatched-new-delete).
[[gnu::noinline]] void *operator new(std::size_t size) {
    ++g_allocations;
    void *p = std::malloc(size ? size : 1);
    if (!p) std::abort();
    return p;
}
[[gnu::noinline]] void operator delete(void *p) noexcept {
    std::free(p);
}
[[gnu::noinline]] void operator delete(void *p, std::size_t) noexcept {
    std::free(p);
}
// The nothrow forms too (std::stable_sort's buffer comes from them and goes back through operator delete):
// otherwise the sanitizer's own nothrow new would meet the free() above.
[[gnu::noinline]] void *operator new(std::size_t size, const std::nothrow_t &) noexcept {
    ++g_allocations;
    return std::malloc(size ? size : 1);
}
[[gnu::noinline]] void operator delete(void *p, const std::nothrow_t &) noexcept {
    std::free(p);
}

namespace td {
namespace {

constexpr float k_inf = std::numeric_limits<float>::infinity();

// Temperature t and no filters: the plain softmax draw.
SamplerParams plain(float temperature, uint64_t seed = 1234) {
    SamplerParams p;
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

SamplerParams greedy() {
    return plain(0.0f);
}

std::vector<float> logits_from_probs(const std::vector<double> &probs) {
    std::vector<float> logits;
    for (double p : probs) logits.push_back(float(std::log(p)));
    return logits;
}

// counts[id] over n draws (no accept(): the history stays empty).
std::vector<int> histogram(Sampler &s, const std::vector<float> &logits, int n) {
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < n; ++i) counts[size_t(s.sample(logits.data()))]++;
    return counts;
}

std::set<int> support(const std::vector<int> &counts) {
    std::set<int> ids;
    for (size_t i = 0; i < counts.size(); ++i)
        if (counts[i] > 0) ids.insert(int(i));
    return ids;
}

std::vector<float> random_logits(size_t n, uint64_t seed, float scale = 3.0f) {
    std::mt19937_64 rng(seed);
    std::vector<float> v(n);
    for (float &x : v) x = float(double(rng() >> 11) * 0x1.0p-53 * 2.0 - 1.0) * scale;
    return v;
}

std::vector<double> softmax(const std::vector<float> &logits, double temperature) {
    double max = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    double sum = 0.0;
    for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp((logits[i] - max) / temperature);
    for (double &x : p) x /= sum;
    return p;
}

// Pearson chi-square of observed counts against expected probabilities (cells with p = 0 must be empty).
double chi_square(const std::vector<int> &counts, const std::vector<double> &probs, int n) {
    double chi2 = 0.0;
    for (size_t i = 0; i < counts.size(); ++i) {
        if (probs[i] == 0.0) {
            EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
            continue;
        }
        const double expected = probs[i] * n;
        chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
    }
    return chi2;
}

TEST(SamplerParams, ValidateNamesTheBadField) {
    EXPECT_TRUE(sampler_params_validate(SamplerParams{}).ok());
    auto bad = [](auto mutate) {
        SamplerParams p;
        mutate(p);
        return sampler_params_validate(p);
    };
    Status s = bad([](SamplerParams &p) { p.top_p = 1.5f; });
    EXPECT_EQ(s.kind(), ErrorKind::invalid_input);
    EXPECT_NE(s.message().find("top_p"), std::string::npos) << s.message();
    EXPECT_NE(bad([](SamplerParams &p) { p.min_p = -0.1f; }).message().find("min_p"), std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.repeat_penalty = 0.0f; }).message().find("repeat_penalty"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.repeat_last_n = -2; }).message().find("repeat_last_n"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.temperature = std::nanf(""); }).message().find("temperature"),
              std::string::npos);
    EXPECT_FALSE(bad([](SamplerParams &p) { p.presence_penalty = k_inf; }).ok());
    EXPECT_FALSE(bad([](SamplerParams &p) { p.frequency_penalty = std::nanf(""); }).ok());
    EXPECT_TRUE(bad([](SamplerParams &p) { p.temperature = -1.0f; }).ok());  // greedy
    EXPECT_TRUE(bad([](SamplerParams &p) { p.top_k = -5; }).ok());           // off
    EXPECT_NE(bad([](SamplerParams &p) { p.typical_p = 1.5f; }).message().find("typical_p"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.top_n_sigma = k_inf; }).message().find("top_n_sigma"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.xtc_probability = -0.1f; }).message().find("xtc_probability"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.xtc_threshold = std::nanf(""); }).message().find("xtc_threshold"),
              std::string::npos);
    EXPECT_TRUE(bad([](SamplerParams &p) { p.top_n_sigma = -3.0f; }).ok());   // off
    EXPECT_TRUE(bad([](SamplerParams &p) { p.xtc_threshold = 0.9f; }).ok());  // off
    EXPECT_NE(bad([](SamplerParams &p) { p.dry_multiplier = -1.0f; }).message().find("dry_multiplier"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.dry_base = 0.5f; }).message().find("dry_base"), std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.dry_allowed_length = -1; }).message().find("dry_allowed_length"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.dry_penalty_last_n = -2; }).message().find("dry_penalty_last_n"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.dynatemp_range = -0.5f; }).message().find("dynatemp_range"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.dynatemp_exponent = std::nanf(""); })
                  .message()
                  .find("dynatemp_exponent"),
              std::string::npos);
    EXPECT_FALSE(bad([](SamplerParams &p) { p.dynatemp_exponent = -1.0f; }).ok());
    EXPECT_FALSE(bad([](SamplerParams &p) { p.dynatemp_range = k_inf; }).ok());
    EXPECT_FALSE(bad([](SamplerParams &p) { p.dry_breakers = {{1, std::vector<int32_t>(21, 2)}}; }).ok());
    EXPECT_FALSE(bad([](SamplerParams &p) { p.dry_breakers = {{-1, {}}}; }).ok());
    EXPECT_NE(bad([](SamplerParams &p) { p.mirostat = 3; }).message().find("mirostat must be 0"),
              std::string::npos);
    EXPECT_FALSE(bad([](SamplerParams &p) { p.mirostat = -1; }).ok());
    EXPECT_NE(bad([](SamplerParams &p) { p.mirostat_tau = -1.0f; }).message().find("mirostat_tau"),
              std::string::npos);
    EXPECT_NE(bad([](SamplerParams &p) { p.mirostat_eta = std::nanf(""); }).message().find("mirostat_eta"),
              std::string::npos);
    EXPECT_TRUE(bad([](SamplerParams &p) { p.mirostat = 2; }).ok());
}

TEST(Sampler, GreedyPicksMax) {
    for (uint64_t seed = 0; seed < 5; ++seed) {
        const auto logits = random_logits(1000, seed);
        Sampler s(greedy(), 1000);
        const auto expect = std::max_element(logits.begin(), logits.end()) - logits.begin();
        EXPECT_EQ(s.sample(logits.data()), expect);
    }
}

TEST(Sampler, GreedyTieGoesToLowestId) {
    const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f, 3.0f};
    Sampler s(greedy(), 5);
    EXPECT_EQ(s.sample(logits.data()), 1);

    // A tie created by the penalty: 2 / 2 == 1 exactly, so tokens 0, 1, 2 tie and 0 wins.
    SamplerParams p = greedy();
    p.repeat_penalty = 2.0f;
    Sampler pen(p, 3);
    const std::vector<float> tied = {2.0f, 1.0f, 1.0f};
    EXPECT_EQ(pen.sample(tied.data()), 0);
    pen.accept(0);
    EXPECT_EQ(pen.sample(tied.data()), 0);
    // Penalising the lowest of a tie hands it to the next id.
    Sampler pen2(p, 3);
    const std::vector<float> tie3 = {1.0f, 1.0f, 1.0f};
    pen2.accept(0);
    EXPECT_EQ(pen2.sample(tie3.data()), 1);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedsDiffer) {
    const auto logits = random_logits(300, 7, 1.0f);  // flat enough that many tokens are likely
    auto run = [&](uint64_t seed) {
        SamplerParams p;  // defaults: top_k 40, top_p 0.95, min_p 0.05, temperature 0.8
        p.seed = seed;
        p.repeat_penalty = 1.1f;
        Sampler s(p, 300);
        std::vector<int32_t> out;
        for (int i = 0; i < 200; ++i) {
            out.push_back(s.sample(logits.data()));
            s.accept(out.back());
        }
        return out;
    };
    const auto a = run(42);
    EXPECT_EQ(a, run(42));
    EXPECT_NE(a, run(43));
    EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 10u);
}

TEST(Sampler, RandomSeedIsReportedAndReplayable) {
    const auto logits = random_logits(100, 3, 1.0f);
    Sampler a(plain(1.0f, SamplerParams::seed_random), 100);
    EXPECT_NE(a.seed(), SamplerParams::seed_random);
    Sampler b(plain(1.0f, a.seed()), 100);
    for (int i = 0; i < 50; ++i) ASSERT_EQ(a.sample(logits.data()), b.sample(logits.data()));
}

// Pins the exact stream: any change to the generator, the bits-to-double conversion, the candidate order or
// the chain shows up here (and so would a platform that disagrees).
TEST(Sampler, GoldenSequenceForFixedSeed) {
    const std::vector<float> logits = {0.1f, 1.3f, -0.4f, 0.9f, 0.0f, 1.1f, -1.2f, 0.5f};
    Sampler s(plain(1.0f, 42), 8);
    std::vector<int32_t> got;
    for (int i = 0; i < 16; ++i) got.push_back(s.sample(logits.data()));
    const std::vector<int32_t> golden = {5, 4, 5, 1, 7, 1, 4, 2, 1, 2, 0, 3, 5, 4, 5, 7};
    EXPECT_EQ(got, golden);
}

TEST(Sampler, TopKOneEqualsGreedy) {
    SamplerParams p = plain(1.5f, 9);
    p.top_k = 1;
    Sampler topk(p, 64);
    Sampler greedy_sampler(greedy(), 64);
    for (uint64_t row = 0; row < 50; ++row) {
        auto logits = random_logits(64, 100 + row);
        logits[size_t(row % 7) + 20] = logits[size_t(row % 5)] = 10.0f;  // a tie for the max
        EXPECT_EQ(topk.sample(logits.data()), greedy_sampler.sample(logits.data())) << "row " << row;
    }
}

TEST(Sampler, TopKRestrictsSupport) {
    const auto logits = random_logits(100, 11, 0.5f);
    SamplerParams p = plain(1.0f);
    p.top_k = 5;
    Sampler s(p, 100);
    std::vector<int> order(100);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    EXPECT_EQ(support(histogram(s, logits, 2000)), std::set<int>(order.begin(), order.begin() + 5));

    // A large k takes the nth_element path instead of the heap.
    const auto wide = random_logits(4000, 12, 0.5f);
    p.top_k = 1000;
    Sampler big(p, 4000);
    std::vector<int> wide_order(wide.size());
    std::iota(wide_order.begin(), wide_order.end(), 0);
    std::sort(wide_order.begin(), wide_order.end(),
              [&](int a, int b) { return wide[size_t(a)] > wide[size_t(b)]; });
    const std::set<int> top1000(wide_order.begin(), wide_order.begin() + 1000);
    const auto got = support(histogram(big, wide, 1500));
    EXPECT_TRUE(std::includes(top1000.begin(), top1000.end(), got.begin(), got.end()));
    EXPECT_GT(got.size(), 600u);
}

TEST(Sampler, TopPRestrictsSupportToNucleus) {
    // Shuffled ids so the nucleus is not simply a prefix of the vocabulary.
    std::vector<double> probs = {0.05, 0.3, 0.1, 0.4, 0.15};
    const auto logits = logits_from_probs(probs);
    SamplerParams p = plain(1.0f);
    p.top_p = 0.8f;  // 0.4, 0.7, 0.85: the smallest prefix reaching 0.8 has three tokens
    Sampler s(p, 5);
    const auto counts = histogram(s, logits, 2000);
    EXPECT_EQ(support(counts), (std::set<int>{1, 3, 4}));
    // Renormalised over the nucleus: 0.4 / 0.85 of the draws for token 3.
    EXPECT_NEAR(counts[3] / 2000.0, 0.4 / 0.85, 0.04);

    p.top_p = 0.0f;  // at least one token is kept
    Sampler one(p, 5);
    EXPECT_EQ(support(histogram(one, logits, 200)), std::set<int>{3});
}

TEST(Sampler, TopPOnLargeVocabMatchesBruteForceNucleus) {
    // No top_k: the nucleus is found by growing a sorted prefix; compare with a full sort.
    const int32_t n_vocab = 20000;
    const auto logits = random_logits(size_t(n_vocab), 5, 24.0f);  // a nucleus of a few hundred tokens
    SamplerParams p = plain(1.0f);
    p.top_p = 0.5f;
    const auto probs = softmax(logits, 1.0);
    std::vector<int> order(static_cast<size_t>(n_vocab));
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return probs[size_t(a)] > probs[size_t(b)]; });
    std::set<int> nucleus;
    double cum = 0.0;
    for (int id : order) {
        nucleus.insert(id);
        if ((cum += probs[size_t(id)]) >= 0.5) break;
    }
    ASSERT_GT(nucleus.size(), 128u);  // more than the first two sorted chunks
    Sampler s(p, n_vocab);
    const auto got = support(histogram(s, logits, 400));
    EXPECT_TRUE(std::includes(nucleus.begin(), nucleus.end(), got.begin(), got.end()));
    EXPECT_GT(got.size(), 100u);
}

TEST(Sampler, MinPRestrictsSupport) {
    const auto logits = logits_from_probs({0.05, 0.3, 0.1, 0.4, 0.15});
    SamplerParams p = plain(1.0f);
    p.min_p = 0.3f;  // keep p >= 0.12
    Sampler s(p, 5);
    EXPECT_EQ(support(histogram(s, logits, 2000)), (std::set<int>{1, 3, 4}));
}

TEST(Sampler, FiltersRunInLlamaCppOrder) {
    // top_p before min_p: top_p 0.5 over {0.4, 0.3, 0.2, 0.1} keeps {0, 1}; min_p 0.6 keeps p >= 0.24, also
    // {0, 1}. Had min_p run first, top_p over the renormalised {0.57, 0.43} would keep only token 0.
    const auto logits = logits_from_probs({0.4, 0.3, 0.2, 0.1});
    SamplerParams p = plain(1.0f);
    p.top_p = 0.5f;
    p.min_p = 0.6f;
    Sampler s(p, 4);
    EXPECT_EQ(support(histogram(s, logits, 1000)), (std::set<int>{0, 1}));

    // Filters see temperature 1, temperature comes last: a very hot sampler still never leaves the set
    // min_p chose, but inside it the draw is nearly uniform.
    const auto logits3 = logits_from_probs({0.5, 0.3, 0.2});
    SamplerParams hot = plain(100.0f);
    hot.min_p = 0.5f;  // keep p >= 0.25: {0, 1}
    Sampler h(hot, 3);
    const auto counts = histogram(h, logits3, 4000);
    EXPECT_EQ(support(counts), (std::set<int>{0, 1}));
    EXPECT_NEAR(counts[0] / 4000.0, 0.5, 0.04);
}

// llama.cpp's locally typical filter written out plainly over doubles: the set it keeps.
std::set<int> typical_set(const std::vector<float> &logits, double mass) {
    const auto p = softmax(logits, 1.0);
    double entropy = 0.0;
    for (double x : p)
        if (x > 0.0) entropy -= x * std::log(x);
    std::vector<int> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
        return std::fabs(-std::log(p[size_t(a)]) - entropy) < std::fabs(-std::log(p[size_t(b)]) - entropy);
    });
    std::set<int> keep;
    double cum = 0.0;
    for (int id : order) {
        keep.insert(id);
        if ((cum += p[size_t(id)]) > mass) break;
    }
    return keep;
}

TEST(Sampler, TypicalPKeepsTheTokensNearestTheEntropy) {
    // p = {0.15, 0.5, 0.05, 0.2, 0.1}: H = 1.333 nats; |-log p - H| is 0.564, 0.640, 1.663, 0.276, 0.970.
    // By that distance: 3 (0.2), 0 (0.15), 1 (0.5), 4, 2. typical_p 0.3 stops once the mass passes 0.3:
    // {3, 0}, and the most likely token is gone.
    const auto logits = logits_from_probs({0.15, 0.5, 0.05, 0.2, 0.1});
    SamplerParams p = plain(1.0f);
    p.typical_p = 0.3f;
    Sampler s(p, 5);
    const auto counts = histogram(s, logits, 4000);
    EXPECT_EQ(support(counts), (std::set<int>{0, 3}));
    EXPECT_NEAR(counts[3] / 4000.0, 0.2 / 0.35, 0.03);  // renormalised over what it kept
    p.typical_p = 0.5f;
    Sampler wider(p, 5);
    EXPECT_EQ(support(histogram(wider, logits, 4000)), (std::set<int>{0, 1, 3}));
    p.typical_p = 0.0f;  // at least one token: the most typical
    Sampler one(p, 5);
    EXPECT_EQ(support(histogram(one, logits, 200)), std::set<int>{3});

    // The filters after it measure from the best survivor, token 3's 0.2 (measured from the dropped 0.5, no
    // survivor would pass). min_p 0.7 keeps p >= 0.14: {0, 3}; min_p 0.8 keeps p >= 0.16: {3}.
    p.typical_p = 0.3f;
    p.min_p = 0.7f;
    Sampler with_min_p(p, 5);
    EXPECT_EQ(support(histogram(with_min_p, logits, 2000)), (std::set<int>{0, 3}));
    p.min_p = 0.8f;
    Sampler stricter(p, 5);
    EXPECT_EQ(support(histogram(stricter, logits, 2000)), std::set<int>{3});

    // Against the plain implementation on wider rows, after top_k and without it. A hot temperature makes
    // the draw nearly uniform over the kept set, so a few thousand draws see all of it.
    for (uint64_t seed = 0; seed < 4; ++seed) {
        SCOPED_TRACE(::testing::Message() << "row " << seed);
        const auto row = random_logits(300, 40 + seed, 6.0f);
        SamplerParams q = plain(200.0f, seed);
        q.typical_p = 0.25f;
        Sampler all(q, 300);
        EXPECT_EQ(support(histogram(all, row, 6000)), typical_set(row, 0.25));
        q.top_k = 30;
        std::vector<int> order(300);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return row[size_t(a)] > row[size_t(b)]; });
        std::vector<float> top(300, -k_inf);
        for (int i = 0; i < 30; ++i) top[size_t(order[size_t(i)])] = row[size_t(order[size_t(i)])];
        Sampler after_top_k(q, 300);
        EXPECT_EQ(support(histogram(after_top_k, row, 6000)), typical_set(top, 0.25));
    }
}

TEST(Sampler, TopNSigmaKeepsLogitsNearTheBest) {
    // Logits {0, 10, 0, 9, 0, 0, 0, 0}: mean 2.375, standard deviation 4.12. One sigma keeps logits >= 5.88
    // ({1, 3}); three keep everything above -2.0 (all of them).
    std::vector<float> logits(8, 0.0f);
    logits[1] = 10.0f;
    logits[3] = 9.0f;
    SamplerParams p = plain(100.0f);
    p.top_n_sigma = 1.0f;
    Sampler one(p, 8);
    EXPECT_EQ(support(histogram(one, logits, 2000)), (std::set<int>{1, 3}));
    p.top_n_sigma = 3.0f;
    Sampler three(p, 8);
    EXPECT_EQ(support(histogram(three, logits, 4000)).size(), 8u);

    // Against the formula on a wider row; a -inf (banned) token is not part of the spread.
    auto row = random_logits(500, 3, 4.0f);
    row[7] = -k_inf;
    double mean = 0.0, var = 0.0, max = -1e9;
    for (float x : row)
        if (x > -k_inf) mean += x, max = std::max(max, double(x));
    mean /= 499.0;
    for (float x : row)
        if (x > -k_inf) var += (x - mean) * (x - mean);
    const double cut = max - 0.3 * std::sqrt(var / 499.0);
    std::set<int> want;
    for (size_t i = 0; i < row.size(); ++i)
        if (row[i] > -k_inf && row[i] >= cut) want.insert(int(i));
    ASSERT_GT(want.size(), 5u);
    ASSERT_LT(want.size(), 100u);
    p.top_n_sigma = 0.3f;
    Sampler wide(p, 500);
    EXPECT_EQ(support(histogram(wide, row, 8000)), want);
}

TEST(Sampler, XtcDropsTheTopChoicesButTheLeastLikelyOfThem) {
    // p = {0.4, 0.3, 0.2, 0.1}, threshold 0.25: tokens 0 and 1 reach it, all but the least likely (1) go.
    const auto logits = logits_from_probs({0.4, 0.3, 0.2, 0.1});
    SamplerParams p = plain(1.0f);
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.25f;
    Sampler always(p, 4);
    const auto counts = histogram(always, logits, 4000);
    EXPECT_EQ(support(counts), (std::set<int>{1, 2, 3}));
    EXPECT_NEAR(counts[1] / 4000.0, 0.5, 0.03);
    // Half the time: token 0 comes only from the draws XTC left alone, 0.5 * 0.4.
    p.xtc_probability = 0.5f;
    Sampler half(p, 4);
    EXPECT_NEAR(histogram(half, logits, 8000)[0] / 8000.0, 0.2, 0.02);
    // Only one token reaches the threshold: nothing goes (XTC never leaves no top choice).
    p.xtc_probability = 1.0f;
    p.xtc_threshold = 0.35f;
    Sampler lone(p, 4);
    EXPECT_EQ(support(histogram(lone, logits, 4000)), (std::set<int>{0, 1, 2, 3}));

    // XTC's coin is its own generator: where it removes nothing the tokens are the plain sampler's, and a
    // threshold above 0.5 turns it off.
    p.xtc_probability = 0.7f;
    p.xtc_threshold = 0.45f;
    Sampler plain_s(plain(1.0f), 4), coin(p, 4);
    for (int i = 0; i < 500; ++i) ASSERT_EQ(coin.sample(logits.data()), plain_s.sample(logits.data())) << i;
    p.xtc_threshold = 0.6f;
    const auto one_top = logits_from_probs({0.65, 0.2, 0.1, 0.05});
    Sampler off(p, 4), plain_again(plain(1.0f), 4);
    for (int i = 0; i < 500; ++i)
        ASSERT_EQ(off.sample(one_top.data()), plain_again.sample(one_top.data())) << i;
}

// The logit DRY takes off each token after `history` was accepted: the sampler's final distribution over
// flat logits at temperature 1 with no filters, read back as logprob differences against token `reference`
// (one DRY leaves alone).
std::vector<double> dry_penalties(const SamplerParams &dry, const std::vector<int32_t> &history,
                                  int32_t n_vocab, int32_t reference) {
    SamplerParams p = plain(1.0f);
    p.dry_multiplier = dry.dry_multiplier;
    p.dry_base = dry.dry_base;
    p.dry_allowed_length = dry.dry_allowed_length;
    p.dry_penalty_last_n = dry.dry_penalty_last_n;
    p.dry_breakers = dry.dry_breakers;
    Sampler s(p, n_vocab);
    for (int32_t t : history) s.accept(t);
    const std::vector<float> flat(size_t(n_vocab), 0.0f);
    s.sample(flat.data());
    std::vector<double> logprob(static_cast<size_t>(n_vocab), 0.0);
    for (const TokenProb &tp : s.last_top_logprobs(n_vocab)) logprob[size_t(tp.id)] = tp.logprob;
    std::vector<double> out(static_cast<size_t>(n_vocab));
    for (int32_t t = 0; t < n_vocab; ++t) out[size_t(t)] = logprob[size_t(reference)] - logprob[size_t(t)];
    return out;
}

// DRY written out plainly: for each earlier position, how many of the latest tokens repeat up to it (no
// Z-function), capped at the latest breaker.
std::vector<double> dry_reference(const SamplerParams &p, const std::vector<int32_t> &all, int32_t n_vocab) {
    std::vector<double> pen(size_t(n_vocab), 0.0);
    std::vector<int32_t> h = all;
    if (p.dry_penalty_last_n > 0 && h.size() > size_t(p.dry_penalty_last_n))
        h.erase(h.begin(), h.end() - p.dry_penalty_last_n);
    const size_t n = h.size(), allowed = size_t(p.dry_allowed_length);
    if (n <= allowed) return pen;
    size_t limit = n;
    for (size_t i = 0; i < n && limit == n; ++i) {  // i tokens back from the latest
        const int32_t token = h[n - 1 - i];
        long longest = -1;
        for (const DryBreaker &b : p.dry_breakers) {
            if (b.head != token || b.tail.size() > i) continue;
            bool match = true;
            for (size_t k = 0; k < b.tail.size(); ++k) match = match && b.tail[k] == h[n - i + k];
            if (match) longest = std::max(longest, long(b.tail.size()));
        }
        if (longest >= 0) limit = i - size_t(longest);
    }
    if (limit < allowed) return pen;
    std::vector<size_t> best(size_t(n_vocab), 0);
    std::vector<bool> hit(size_t(n_vocab), false);
    for (size_t j = 0; j + 1 < n; ++j) {  // the repeat ends at h[j]; h[j + 1] would extend it
        size_t len = 0;
        while (len <= j && h[j - len] == h[n - 1 - len]) ++len;
        len = std::min(len, limit);
        if (len < allowed) continue;
        const size_t t = size_t(h[j + 1]);
        best[t] = hit[t] ? std::max(best[t], len) : len;
        hit[t] = true;
    }
    // llama.cpp caps the exponent where base^exponent would pass a float's range.
    const double max_exponent = std::floor(88.7228391 / std::log(double(p.dry_base)));
    for (int32_t t = 0; t < n_vocab; ++t) {
        bool alone = false;
        for (const DryBreaker &b : p.dry_breakers) alone = alone || (b.head == t && b.tail.empty());
        if (hit[size_t(t)] && !alone)
            pen[size_t(t)] =
                p.dry_multiplier *
                std::pow(double(p.dry_base), std::min(double(best[size_t(t)] - allowed), max_exponent));
    }
    return pen;
}

TEST(Sampler, DryPenalizesTheTokenThatWouldExtendARepeat) {
    // llama.cpp's example: a b c c b c y a b c. The latest "a b c" was seen before, followed by c (3 long);
    // "b c" by y (2 long); "c" by b (1 long). With 2 allowed: c loses 0.8 * 1.75, y 0.8, b nothing.
    SamplerParams p;
    p.dry_multiplier = 0.8f;
    p.dry_base = 1.75f;
    p.dry_allowed_length = 2;
    const int32_t a = 1, b = 2, c = 3, y = 4;
    const std::vector<int32_t> history = {a, b, c, c, b, c, y, a, b, c};
    const auto pen = dry_penalties(p, history, 6, /*reference=*/0);
    EXPECT_NEAR(pen[size_t(c)], 0.8 * 1.75, 1e-5);
    EXPECT_NEAR(pen[size_t(y)], 0.8, 1e-5);
    EXPECT_NEAR(pen[size_t(b)], 0.0, 1e-5);
    EXPECT_NEAR(pen[size_t(a)], 0.0, 1e-5);
    // With a as a breaker, a repeat reaches back no further than the latest a: "b c" (2), so c loses 0.8 ...
    p.dry_breakers = {{a, {}}};
    EXPECT_NEAR(dry_penalties(p, history, 6, 0)[size_t(c)], 0.8, 1e-5);
    // ... and with y, 3 tokens back, all of "a b c" still counts.
    p.dry_breakers = {{y, {}}};
    EXPECT_NEAR(dry_penalties(p, history, 6, 0)[size_t(c)], 0.8 * 1.75, 1e-5);
    // ... and a breaker is never penalized itself.
    p.dry_breakers = {{c, {}}};
    EXPECT_NEAR(dry_penalties(p, history, 6, 0)[size_t(c)], 0.0, 1e-5);

    // Against the plain reference: random histories over a few tokens, with one-token and two-token breakers,
    // windows and allowed lengths, and a base whose power would overflow (capped, not inf).
    std::mt19937_64 rng(3);
    for (int trial = 0; trial < 300; ++trial) {
        SCOPED_TRACE(::testing::Message() << "trial " << trial);
        const int32_t n_vocab = 7;
        std::vector<int32_t> h(size_t(5 + rng() % 60));
        for (int32_t &t : h) t = int32_t(rng() % 5);  // tokens 5 and 6 never appear: 6 is the reference
        if (trial % 3 == 0)                           // long repeats
            for (size_t i = 12; i < h.size(); ++i) h[i] = h[i - 12];
        SamplerParams q;
        q.dry_multiplier = 0.5f;
        q.dry_base = trial % 10 == 0 ? 400.0f : 1.75f;
        q.dry_allowed_length = int32_t(rng() % 4);
        q.dry_penalty_last_n = std::array<int32_t, 3>{-1, 20, 7}[size_t(trial) % 3];
        if (trial % 4 == 1) q.dry_breakers = {{4, {}}};
        if (trial % 4 == 2) q.dry_breakers = {{3, {0}}, {3, {0, 1}}, {2, {}}};
        const auto got = dry_penalties(q, h, n_vocab, 6);
        const auto want = dry_reference(q, h, n_vocab);
        for (int32_t t = 0; t < n_vocab; ++t) {
            ASSERT_TRUE(std::isfinite(got[size_t(t)])) << "token " << t;
            ASSERT_NEAR(got[size_t(t)], want[size_t(t)], 1e-3 * std::max(1.0, want[size_t(t)]))
                << "token " << t;
        }
    }
}

TEST(Sampler, DrysLongerWindowLeavesThePenaltiesWindowAlone) {
    // DRY looks back 50 tokens, the repeat penalty 8: the history keeps 50, the penalty still reads 8. DRY
    // is on but allows repeats longer than its window, so it never moves a logit: the tokens equal the
    // sampler's without DRY.
    SamplerParams with = plain(1.0f, 21);
    with.repeat_penalty = 1.5f;
    with.repeat_last_n = 8;
    SamplerParams without = with;
    with.dry_multiplier = 1.0f;
    with.dry_penalty_last_n = 50;
    with.dry_allowed_length = 60;
    Sampler a(with, 16), b(without, 16);
    for (int i = 0; i < 300; ++i) {
        const auto logits = random_logits(16, 500 + uint64_t(i), 2.0f);
        const int32_t ta = a.sample(logits.data()), tb = b.sample(logits.data());
        ASSERT_EQ(ta, tb) << "step " << i;
        a.accept(ta);
        b.accept(tb);
    }
    EXPECT_EQ(sampler_history_tail(with, std::vector<int32_t>(100, 1)).size(), 50u);
    with.dry_penalty_last_n = -1;
    EXPECT_EQ(sampler_history_tail(with, std::vector<int32_t>(100, 1)).size(), 100u);
    with.dry_multiplier = 0.0f;  // off: only the penalty's window
    EXPECT_EQ(sampler_history_tail(with, std::vector<int32_t>(100, 1)).size(), 8u);
}

TEST(Sampler, TemperatureOneMatchesSoftmax) {
    const std::vector<float> logits = {0.0f, 0.5f, 1.0f, -1.0f, 2.0f, -0.5f, 1.5f, -2.0f};
    const int n = 40000;
    Sampler s(plain(1.0f, 77), 8);
    // 7 degrees of freedom: P(chi2 > 24.3) = 0.001.
    EXPECT_LT(chi_square(histogram(s, logits, n), softmax(logits, 1.0), n), 24.3);

    // Temperature 0.5 with top_k 3: softmax(x / 0.5) renormalised over the three best.
    SamplerParams p = plain(0.5f, 78);
    p.top_k = 3;
    Sampler k3(p, 8);
    std::vector<float> top3(8, -k_inf);
    for (size_t i : {4u, 6u, 2u}) top3[i] = logits[i];
    // 2 degrees of freedom: P(chi2 > 13.8) = 0.001.
    EXPECT_LT(chi_square(histogram(k3, logits, n), softmax(top3, 0.5), n), 13.8);
}

// llama.cpp's dynamic temperature (llama_sampler_temp_ext), written from its definition: the entropy of the
// survivors' softmax at temperature 1, over the largest entropy m survivors can have, to the exponent, mapped
// onto [max(0, t - r), t + r].
double dynatemp_reference(const std::vector<float> &survivors, double t, double r, double exponent) {
    const std::vector<double> p = softmax(survivors, 1.0);
    double entropy = 0.0;
    for (double x : p)
        if (x > 0.0) entropy -= x * std::log(x);
    const double lo = std::max(0.0, t - r), hi = t + r;
    return lo + (hi - lo) * std::pow(entropy / std::log(double(survivors.size())), exponent);
}

// The temperature the last draw used, read back from its distribution: logprobs differ by (l_a - l_b) / t.
double temperature_of_last_draw(const Sampler &s, const std::vector<float> &logits) {
    const auto top = s.last_top_logprobs(2);
    EXPECT_EQ(top.size(), 2u);
    if (top.size() < 2) return 0.0;
    return (double(logits[size_t(top[0].id)]) - logits[size_t(top[1].id)]) /
           (top[0].logprob - top[1].logprob);
}

TEST(Sampler, DynamicTemperatureFollowsTheEntropy) {
    // A peaked and a flat row over 16 tokens, all 16 surviving: the peaked one is drawn colder.
    std::vector<float> peaked(16, 0.0f), flat(16, 0.0f);
    peaked[3] = 6.0f;
    for (size_t i = 0; i < flat.size(); ++i) flat[i] = 0.05f * float(i);
    SamplerParams p = plain(1.0f, 5);
    p.dynatemp_range = 0.5f;
    for (float exponent : {1.0f, 0.5f, 2.0f, 0.0f}) {
        p.dynatemp_exponent = exponent;
        Sampler s(p, 16);
        s.sample(peaked.data());
        const double t_peaked = temperature_of_last_draw(s, peaked);
        EXPECT_NEAR(t_peaked, dynatemp_reference(peaked, 1.0, 0.5, exponent), 1e-4) << exponent;
        s.sample(flat.data());
        const double t_flat = temperature_of_last_draw(s, flat);
        EXPECT_NEAR(t_flat, dynatemp_reference(flat, 1.0, 0.5, exponent), 1e-4) << exponent;
        if (exponent == 0.0f) {
            EXPECT_NEAR(t_peaked, 1.5, 1e-4);  // x^0 = 1: always the top of the range
        } else {
            EXPECT_LT(t_peaked, t_flat);
            EXPECT_GT(t_flat, 1.45);  // nearly uniform: nearly the top of the range
        }
    }

    // After the filters: the entropy is of what top_k kept, renormalised (5 survivors, log 5).
    const auto logits = random_logits(200, 17);
    p = plain(0.8f, 6);
    p.top_k = 5;
    p.dynatemp_range = 0.6f;
    p.dynatemp_exponent = 1.0f;
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const std::vector<float> kept(sorted.begin(), sorted.begin() + 5);
    const double t = dynatemp_reference(kept, 0.8, 0.6, 1.0);
    Sampler k5(p, 200);
    k5.sample(logits.data());
    EXPECT_NEAR(temperature_of_last_draw(k5, logits), t, 1e-4);
    // The draws follow softmax(kept / t): 4 degrees of freedom, P(chi2 > 18.5) = 0.001.
    std::vector<float> top5(200, -k_inf);
    for (size_t i = 0; i < logits.size(); ++i)
        if (logits[i] >= kept.back()) top5[i] = logits[i];
    const int n = 20000;
    EXPECT_LT(chi_square(histogram(k5, logits, n), softmax(top5, t), n), 18.5);

    // Range 0 is the fixed temperature, draw for draw.
    SamplerParams off = plain(0.8f, 7);
    SamplerParams zero = off;
    zero.dynatemp_range = 0.0f;
    zero.dynatemp_exponent = 3.0f;
    Sampler a(off, 200), b(zero, 200);
    for (int i = 0; i < 50; ++i) ASSERT_EQ(a.sample(logits.data()), b.sample(logits.data()));

    // Greedy stays greedy, as every other filter leaves it.
    SamplerParams g = greedy();
    g.dynatemp_range = 2.0f;
    Sampler gs(g, 200);
    EXPECT_EQ(gs.sample(logits.data()),
              int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
}

TEST(Sampler, DynamicTemperatureOfZeroKeepsTheBestAndStillDrawsOnce) {
    // temperature 0.3, range 0.5: the bottom of the range is 0. A row whose other tokens underflow has
    // entropy 0, so the temperature is 0 and only the best survivor is left.
    const std::vector<float> one = {-2000.0f, 0.0f, -1500.0f, -1800.0f};
    SamplerParams p = plain(0.3f, 9);
    p.dynatemp_range = 0.5f;
    Sampler s(p, 4);
    for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(s.sample(one.data()), 1);
        EXPECT_EQ(s.last_logprob(), 0.0f);
        ASSERT_EQ(s.last_top_logprobs(4).size(), 1u);
    }
    // Each of those took one generator draw, as every non-greedy sample() does: a sampler restored past
    // three draws stays in step.
    Sampler restored(p, 4);
    restored.restore(3, {});
    const auto row = random_logits(4, 3);
    for (int i = 0; i < 30; ++i) ASSERT_EQ(s.sample(row.data()), restored.sample(row.data())) << i;
}

TEST(Sampler, HighTemperatureFlattens) {
    std::vector<float> logits(50);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = -0.2f * float(i);
    Sampler cold(plain(0.3f), 50);
    Sampler hot(plain(3.0f), 50);
    const auto n_cold = support(histogram(cold, logits, 1000)).size();
    const auto n_hot = support(histogram(hot, logits, 1000)).size();
    EXPECT_LT(n_cold, 20u);
    EXPECT_GT(n_hot, 40u);
}

TEST(Sampler, RepeatPenaltyFlipsGreedy) {
    SamplerParams p = greedy();
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = 2;
    Sampler s(p, 3);
    const std::vector<float> logits = {2.0f, 1.9f, 0.5f};
    EXPECT_EQ(s.sample(logits.data()), 0);
    s.accept(0);  // 2.0 / 1.1 = 1.82 < 1.9
    EXPECT_EQ(s.sample(logits.data()), 1);
    s.accept(2);
    s.accept(2);  // token 0 left the window of 2
    EXPECT_EQ(s.sample(logits.data()), 0);

    // Negative logits are multiplied, so a penalty never makes a token more likely.
    Sampler neg(p, 2);
    const std::vector<float> negative = {-1.0f, -1.05f};
    neg.accept(0);  // -1.0 * 1.1 = -1.1 < -1.05
    EXPECT_EQ(neg.sample(negative.data()), 1);

    // It lowers the sampled share of a repeated token.
    SamplerParams sp = plain(1.0f);
    sp.repeat_penalty = 1.5f;
    Sampler with(sp, 3), without(plain(1.0f), 3);
    with.accept(0);
    without.accept(0);
    EXPECT_LT(histogram(with, logits, 2000)[0] + 150, histogram(without, logits, 2000)[0]);
}

// OpenAI's logit_bias: added to the listed logits before anything else, -inf bans; greedy and drawn alike.
TEST(Sampler, LogitBiasMovesAndBansTokensBeforeThePenalties) {
    const std::vector<float> logits = {2.0f, 1.9f, 0.5f, k_inf};
    SamplerParams p = greedy();
    p.logit_bias = {{3, -k_inf}};  // a ban holds even over +inf
    Sampler ban(p, 4);
    EXPECT_EQ(ban.sample(logits.data()), 0);
    p.logit_bias = {{3, -k_inf}, {2, 1.0f}, {2, 0.6f}};  // listed twice: both apply, 0.5 + 1.6 = 2.1
    Sampler twice(p, 4);
    EXPECT_EQ(twice.sample(logits.data()), 2);
    // Before the penalties (llama.cpp's order): token 0 at 0.5 biased by +1 is 1.5 and beats 1.0; once it
    // repeats, a penalty of 2 makes it (0.5 + 1) / 2 = 0.75 < 1.0. Penalised first and biased after, it would
    // be 0.5 / 2 + 1 = 1.25 and win again.
    const std::vector<float> close = {0.5f, 1.0f, 0.2f};
    SamplerParams q = greedy();
    q.logit_bias = {{0, 1.0f}};
    q.repeat_penalty = 2.0f;
    q.repeat_last_n = 4;
    Sampler pen(q, 3);
    EXPECT_EQ(pen.sample(close.data()), 0);
    pen.accept(0);
    EXPECT_EQ(pen.sample(close.data()), 1);
    // A drawn sample: the biased distribution is the softmax of the biased logits, the banned token never.
    SamplerParams d = plain(1.0f);
    d.logit_bias = {{0, -1.0f}, {2, 2.0f}, {3, -k_inf}};
    Sampler drawn(d, 4);
    const int n = 20000;
    const auto counts = histogram(drawn, logits, n);
    EXPECT_EQ(counts[3], 0);
    const auto probs = softmax({1.0f, 1.9f, 2.5f}, 1.0);
    EXPECT_LT(chi_square({counts[0], counts[1], counts[2]}, probs, n), 13.8);  // 2 dof, p = 0.001
    // A zero bias changes nothing: the same seed draws the same tokens.
    SamplerParams none = plain(1.0f, 77);
    none.logit_bias = {{1, 0.0f}};
    Sampler a(plain(1.0f, 77), 4), b(none, 4);
    const std::vector<float> finite = {2.0f, 1.9f, 0.5f, 0.1f};
    for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(finite.data()), b.sample(finite.data()));
}

TEST(SamplerParams, LogitBiasIsCheckedAndParsedAsLlamaCppWritesIt) {
    SamplerParams p;
    p.logit_bias = {{5, -k_inf}, {0, 3.5f}};
    EXPECT_TRUE(sampler_params_validate(p).ok());
    EXPECT_TRUE(logit_bias_validate(p, 6).ok());
    const Status outside = logit_bias_validate(p, 5);
    EXPECT_EQ(outside.kind(), ErrorKind::invalid_input);
    EXPECT_NE(outside.message().find("token 5 is outside the vocabulary (5 tokens)"), std::string::npos)
        << outside.message();
    p.logit_bias = {{-1, 1.0f}};
    EXPECT_NE(sampler_params_validate(p).message().find("negative"), std::string::npos);
    p.logit_bias = {{1, k_inf}};
    EXPECT_FALSE(sampler_params_validate(p).ok());
    p.logit_bias = {{1, std::nanf("")}};
    EXPECT_FALSE(sampler_params_validate(p).ok());
    p.logit_bias.assign(kMaxLogitBias + 1, LogitBias{1, 1.0f});
    EXPECT_NE(sampler_params_validate(p).message().find("at most"), std::string::npos);

    EXPECT_EQ(*parse_logit_bias("15043+1"), (LogitBias{15043, 1.0f}));
    EXPECT_EQ(*parse_logit_bias("15043-0.5"), (LogitBias{15043, -0.5f}));
    EXPECT_EQ(*parse_logit_bias("2-inf"), (LogitBias{2, -k_inf}));
    for (const char *bad :
         {"", "15043", "+1", "-1+1", "x+1", "1+", "1+inf", "1--1", "1+1x", "1+nan", "1 +1"}) {
        auto r = parse_logit_bias(bad);
        EXPECT_FALSE(r.ok()) << bad;
        if (!r.ok()) {
            EXPECT_NE(r.status().message().find("TOKEN_ID+BIAS"), std::string::npos) << bad;
        }
    }
}

TEST(Sampler, RepeatLastNMinusOneSeesWholeHistory) {
    SamplerParams p = greedy();
    p.repeat_penalty = 1.1f;
    p.repeat_last_n = -1;
    Sampler s(p, 3);
    const std::vector<float> logits = {2.0f, 1.9f, 0.5f};
    s.accept(0);
    for (int i = 0; i < 500; ++i) s.accept(2);
    EXPECT_EQ(s.sample(logits.data()), 1);

    p.repeat_last_n = 0;  // off
    Sampler off(p, 3);
    off.accept(0);
    EXPECT_EQ(off.sample(logits.data()), 0);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
    SamplerParams p = greedy();
    p.presence_penalty = 0.3f;
    Sampler pres(p, 2);
    const std::vector<float> a = {1.0f, 0.8f};
    pres.accept(0);  // 1.0 - 0.3 = 0.7 < 0.8
    EXPECT_EQ(pres.sample(a.data()), 1);
    // Presence does not stack with the count: 1.0 - 0.3 = 0.7 > 0.6 after three repeats.
    Sampler pres3(p, 2);
    const std::vector<float> b = {1.0f, 0.6f};
    for (int i = 0; i < 3; ++i) pres3.accept(0);
    EXPECT_EQ(pres3.sample(b.data()), 0);

    p = greedy();
    p.frequency_penalty = 0.2f;
    Sampler freq(p, 2);
    const std::vector<float> c = {1.0f, 0.5f};
    freq.accept(0);  // 0.8
    EXPECT_EQ(freq.sample(c.data()), 0);
    freq.accept(0);  // 0.6
    EXPECT_EQ(freq.sample(c.data()), 0);
    freq.accept(0);  // 0.4 < 0.5: frequency stacks
    EXPECT_EQ(freq.sample(c.data()), 1);

    // Negative values encourage repeats (OpenAI allows [-2, 2]).
    p = greedy();
    p.presence_penalty = -0.5f;
    Sampler enc(p, 2);
    const std::vector<float> d = {0.8f, 1.0f};
    enc.accept(0);
    EXPECT_EQ(enc.sample(d.data()), 0);
}

TEST(Sampler, ResetRestoresSequenceAndClearsHistory) {
    const auto logits = random_logits(64, 21, 1.0f);
    SamplerParams p = plain(1.0f, 5);
    p.repeat_penalty = 1.3f;
    Sampler s(p, 64);
    auto run = [&] {
        std::vector<int32_t> out;
        for (int i = 0; i < 100; ++i) {
            out.push_back(s.sample(logits.data()));
            s.accept(out.back());
        }
        return out;
    };
    const auto first = run();
    s.reset();
    EXPECT_EQ(run(), first);

    SamplerParams g = greedy();
    g.repeat_penalty = 1.1f;
    Sampler gs(g, 3);
    const std::vector<float> l = {2.0f, 1.9f, 0.5f};
    gs.accept(0);
    EXPECT_EQ(gs.sample(l.data()), 1);
    gs.reset();
    EXPECT_EQ(gs.sample(l.data()), 0);
}

// A stream resumed elsewhere (a lost node): a fresh sampler restored with the tokens it has seen (its prompt,
// then those it sampled) draws exactly what the uninterrupted one draws next, with penalties over a window
// and over the whole history.
TEST(Sampler, RestoreContinuesTheUninterruptedStream) {
    for (int32_t window : {64, 8, -1, 0}) {
        for (float temperature : {0.9f, 0.0f, 1.1f}) {
            SCOPED_TRACE(::testing::Message()
                         << "repeat_last_n " << window << ", temperature " << temperature);
            SamplerParams p = plain(temperature, 77);
            if (temperature > 1.0f) {  // with typical_p, XTC's own generator, and DRY's longer window
                p.typical_p = 0.9f;
                p.xtc_probability = 0.5f;
                p.xtc_threshold = 0.05f;
                p.dry_multiplier = 0.7f;
                p.dry_allowed_length = 1;
                p.dry_penalty_last_n = window == 0 ? 12 : -1;
                p.dry_breakers = {{5, {}}, {6, {7}}};
                p.dynatemp_range = 0.5f;  // no state of its own: restores as the fixed temperature does
            }
            p.repeat_penalty = 1.4f;
            p.frequency_penalty = 0.3f;
            p.repeat_last_n = window;
            p.top_k = 20;
            p.top_p = 0.9f;
            std::vector<std::vector<float>> steps;
            for (int i = 0; i < 90; ++i) steps.push_back(random_logits(64, 100 + i, 2.0f));
            Sampler whole(p, 64);
            std::vector<int32_t> prompt;
            for (int32_t i = 0; i < 20; ++i) prompt.push_back((i * 7) % 64);
            for (int32_t t : prompt) whole.accept(t);
            std::vector<int32_t> tokens;
            for (const auto &l : steps) {
                tokens.push_back(whole.sample(l.data()));
                whole.accept(tokens.back());
            }
            for (size_t cut : {size_t(1), size_t(30), size_t(89)}) {
                Sampler resumed(p, 64);
                std::vector<int32_t> seen = prompt;
                seen.insert(seen.end(), tokens.begin(), tokens.begin() + std::ptrdiff_t(cut));
                resumed.restore(cut, sampler_history_tail(p, seen));
                for (size_t i = cut; i < steps.size(); ++i) {
                    const int32_t t = resumed.sample(steps[i].data());
                    ASSERT_EQ(t, tokens[i]) << "cut at " << cut << ", step " << i;
                    resumed.accept(t);
                }
            }
        }
    }
    const std::vector<int32_t> sampled = {1, 2, 3, 4, 5};
    SamplerParams p;
    p.repeat_last_n = 2;
    EXPECT_TRUE(sampler_history_tail(p, sampled).empty());  // no penalty and no DRY: nothing reads it
    EXPECT_FALSE(sampler_reads_history(p));
    p.repeat_penalty = 1.1f;
    EXPECT_TRUE(sampler_reads_history(p));
    EXPECT_EQ(sampler_history_tail(p, sampled).size(), 2u);
    EXPECT_EQ(sampler_history_tail(p, sampled)[0], 4);
    p.repeat_last_n = -1;
    EXPECT_EQ(sampler_history_tail(p, sampled).size(), 5u);
    EXPECT_EQ(sampler_history_tail(p, sampled, 3).size(), 3u);
    p.repeat_last_n = 0;
    EXPECT_TRUE(sampler_history_tail(p, sampled).empty());
}

TEST(Sampler, NonFiniteLogits) {
    const float nan = std::nanf("");
    const std::vector<float> logits = {-k_inf, 0.5f, nan, 0.3f, -k_inf, 0.4f};
    for (SamplerParams p : {plain(1.0f), plain(5.0f), SamplerParams{}}) {
        p.seed = 3;
        Sampler s(p, 6);
        const auto ids = support(histogram(s, logits, 2000));
        EXPECT_EQ(ids.count(0) + ids.count(2) + ids.count(4), 0u);
        EXPECT_EQ(ids.size(), 3u);
    }
    Sampler g(greedy(), 3);
    const std::vector<float> first_nan = {nan, -k_inf, -3.0f};
    EXPECT_EQ(g.sample(first_nan.data()), 2);

    // One finite token: always it.
    const std::vector<float> single = {-k_inf, -k_inf, 7.0f, -k_inf};
    Sampler one(SamplerParams{}, 4);
    EXPECT_EQ(support(histogram(one, single, 100)), std::set<int>{2});

    // +inf: uniform over the +inf tokens.
    const std::vector<float> pos = {1.0f, k_inf, 5.0f, k_inf};
    Sampler inf(plain(1.0f), 4);
    const auto counts = histogram(inf, pos, 2000);
    EXPECT_EQ(support(counts), (std::set<int>{1, 3}));
    EXPECT_NEAR(counts[1] / 2000.0, 0.5, 0.05);
    Sampler ginf(greedy(), 4);
    EXPECT_EQ(ginf.sample(pos.data()), 1);
    const auto top = ginf.top_logprobs(pos.data(), 3);
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top[0].id, 1);
    EXPECT_EQ(top[1].id, 3);
    EXPECT_NEAR(top[0].logprob, std::log(0.5f), 1e-6f);
    EXPECT_EQ(top[2].logprob, -k_inf);

    // Nothing to choose: token 0, no crash.
    const std::vector<float> none = {-k_inf, nan, -k_inf};
    Sampler z(plain(1.0f), 3);
    EXPECT_EQ(z.sample(none.data()), 0);
    EXPECT_EQ(z.top_logprobs(none.data(), 2)[0].logprob, -k_inf);
}

TEST(Sampler, VocabOfOne) {
    const float logit = -2.5f;
    for (SamplerParams p : {greedy(), plain(1.0f), SamplerParams{}}) {
        Sampler s(p, 1);
        for (int i = 0; i < 5; ++i) {
            EXPECT_EQ(s.sample(&logit), 0);
            s.accept(0);
        }
        EXPECT_EQ(s.last_logprob(), 0.0f);
        const auto top = s.top_logprobs(&logit, 3);
        ASSERT_EQ(top.size(), 1u);
        EXPECT_EQ(top[0].id, 0);
        EXPECT_NEAR(top[0].logprob, 0.0f, 1e-6f);
    }
}

TEST(Sampler, RawLogprobsAreLogSoftmax) {
    const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -k_inf};
    Sampler s(SamplerParams{}, 6);
    const auto probs = softmax(logits, 1.0);
    const auto top = s.top_logprobs(logits.data(), 3);
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top[0].id, 1);  // tie with 3: lower id first
    EXPECT_EQ(top[1].id, 3);
    EXPECT_EQ(top[2].id, 4);
    for (const TokenProb &t : top) EXPECT_NEAR(t.logprob, std::log(probs[size_t(t.id)]), 1e-5);
    EXPECT_EQ(s.top_logprobs(logits.data(), 100).size(), 6u);
    EXPECT_TRUE(s.top_logprobs(logits.data(), 0).empty());
    EXPECT_NEAR(s.token_logprob(logits.data(), 2), std::log(probs[2]), 1e-5);
    EXPECT_EQ(s.token_logprob(logits.data(), 5), -k_inf);
}

TEST(Sampler, LastLogprobsDescribeTheFinalDistribution) {
    // top_k 2 over two equal best logits: the final distribution is 50/50 whatever the temperature.
    const std::vector<float> logits = {3.0f, 0.0f, 3.0f, 1.0f};
    SamplerParams p = plain(0.7f);
    p.top_k = 2;
    Sampler s(p, 4);
    EXPECT_TRUE(s.last_top_logprobs(5).empty());
    const int32_t tok = s.sample(logits.data());
    EXPECT_TRUE(tok == 0 || tok == 2);
    EXPECT_NEAR(s.last_logprob(), std::log(0.5f), 1e-6f);
    const auto top = s.last_top_logprobs(5);
    ASSERT_EQ(top.size(), 2u);
    EXPECT_EQ(top[0].id, 0);
    EXPECT_EQ(top[1].id, 2);

    // Temperature 2 without filters: log softmax(x / 2).
    Sampler t(plain(2.0f), 4);
    const int32_t tok2 = t.sample(logits.data());
    const auto probs = softmax(logits, 2.0);
    EXPECT_NEAR(t.last_logprob(), std::log(probs[size_t(tok2)]), 1e-5);
    const auto all = t.last_top_logprobs(4);
    ASSERT_EQ(all.size(), 4u);
    EXPECT_EQ(all[3].id, 1);
    EXPECT_NEAR(all[3].logprob, std::log(probs[1]), 1e-5);

    Sampler g(greedy(), 4);
    EXPECT_EQ(g.sample(logits.data()), 0);
    EXPECT_EQ(g.last_logprob(), 0.0f);
    ASSERT_EQ(g.last_top_logprobs(3).size(), 1u);
}

// Mirostat as llama.cpp defines it (llama_sampler_mirostat / _v2), written from that definition in doubles:
// softmax at the temperature, sorted best first; v2 keeps the prefix whose surprise -log2 p is at most mu, v1
// fits the Zipf exponent s to the 100 most likely tokens and keeps the top k = (e 2^mu / (1 - n^-e))^(1/s),
// e = s - 1; both keep at least one token and renormalise; mu -= eta * (surprise of the draw - tau).
struct MirostatReference {
    int version = 2;
    double tau = 5.0, eta = 0.1, mu = 10.0;
    // (id, probability) of the tokens it keeps, best first.
    std::vector<std::pair<int32_t, double>> keep(const std::vector<float> &logits, double t) const {
        const std::vector<double> p = softmax(logits, t);
        std::vector<int32_t> order(logits.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
        size_t k = 0;
        if (version == 2) {
            while (k < order.size() && -std::log2(p[size_t(order[k])]) <= mu) ++k;
        } else {
            double tb = 0.0, tt = 0.0;
            for (size_t i = 0; i + 1 < std::min<size_t>(100, order.size()); ++i) {
                const double ti = std::log(double(i + 2) / double(i + 1));
                tb += ti * std::log(p[size_t(order[i])] / p[size_t(order[i + 1])]);
                tt += ti * ti;
            }
            const double s = tb / tt, e = s - 1.0;
            const double kk =
                std::pow(e * std::pow(2.0, mu) / (1.0 - std::pow(double(logits.size()), -e)), 1 / s);
            k = std::min(order.size(), size_t(std::max(kk, 1.0)));
        }
        k = std::max<size_t>(k, 1);
        double sum = 0.0;
        for (size_t i = 0; i < k; ++i) sum += p[size_t(order[i])];
        std::vector<std::pair<int32_t, double>> kept;
        for (size_t i = 0; i < k; ++i) kept.push_back({order[i], p[size_t(order[i])] / sum});
        return kept;
    }
    void update(double p_drawn) { mu -= eta * (-std::log2(p_drawn) - tau); }
};

TEST(Sampler, MirostatKeepsWhatLlamaCppsKeepsAndMovesMuAlike) {
    for (int version : {1, 2}) {
        for (float temperature : {1.0f, 0.7f}) {
            SCOPED_TRACE(::testing::Message() << "mirostat " << version << ", temperature " << temperature);
            SamplerParams p = plain(temperature, 41);
            p.mirostat = version;
            p.mirostat_tau = 4.0f;
            p.mirostat_eta = 0.2f;
            Sampler s(p, 500);
            EXPECT_FLOAT_EQ(s.mirostat_mu(), 8.0f);  // 2 * tau
            MirostatReference ref;
            ref.version = version;
            ref.tau = 4.0;
            ref.eta = 0.2;
            ref.mu = 8.0;
            size_t sizes_seen = 0, last_size = 0;
            for (int step = 0; step < 260; ++step) {
                auto logits = random_logits(500, 900 + uint64_t(step), 4.0f);
                if (step >=
                    200)  // many tokens share a logit: where the cut falls among equals, lower ids first
                    for (float &x : logits) x = std::round(x * 2.0f) / 2.0f;
                const auto kept = ref.keep(logits, temperature);
                const int32_t token = s.sample(logits.data());
                const auto top = s.last_top_logprobs(500);
                ASSERT_EQ(top.size(), kept.size()) << "step " << step;
                for (size_t i = 0; i < kept.size(); ++i) {
                    ASSERT_EQ(top[i].id, kept[i].first) << "step " << step;
                    ASSERT_NEAR(top[i].logprob, std::log(kept[i].second), 1e-4) << "step " << step;
                }
                const auto drawn =
                    std::find_if(kept.begin(), kept.end(), [&](auto &e) { return e.first == token; });
                ASSERT_NE(drawn, kept.end()) << "step " << step;
                EXPECT_NEAR(s.last_logprob(), std::log(drawn->second), 1e-4);
                ref.update(drawn->second);
                ASSERT_NEAR(s.mirostat_mu(), ref.mu, 1e-3) << "step " << step;
                ref.mu = s.mirostat_mu();  // no drift between float and double over the steps
                sizes_seen += kept.size() != last_size;
                last_size = kept.size();
            }
            EXPECT_GT(sizes_seen, 20u);  // the truncation really moved with mu
        }
    }
}

TEST(Sampler, MirostatHoldsTheSurpriseAtTau) {
    // A Zipf-like row over 2,000 tokens (surprise from ~2 bits up to ~20): over many draws the mean surprise
    // of what was drawn settles at tau, which is what Mirostat is for. Without it (the plain draw) it does
    // not.
    std::vector<float> logits(2000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = -1.1f * std::log(float(i + 1));
    std::vector<double> probs = softmax(logits, 1.0);
    double entropy = 0.0;
    for (double q : probs) entropy -= q * std::log2(q);
    for (int version : {1, 2}) {
        for (float tau : {3.0f, 5.0f}) {
            SamplerParams p = plain(1.0f, 1000 + uint64_t(version));
            p.mirostat = version;
            p.mirostat_tau = tau;
            Sampler s(p, int32_t(logits.size()));
            double total = 0.0;
            int n = 0;
            for (int i = 0; i < 6000; ++i) {
                s.sample(logits.data());
                if (i < 1000) continue;  // mu settles first
                total += -double(s.last_logprob()) / std::log(2.0);
                ++n;
            }
            EXPECT_NEAR(total / n, tau, 0.25) << "mirostat " << version << ", tau " << tau;
        }
    }
    EXPECT_GT(entropy, 6.0);  // the plain draw's mean surprise, far from both taus
}

// llama.cpp's Mirostat chain is the bias, the temperature and Mirostat: top-k, top-p, min-p, typical-p, XTC,
// the penalties and DRY are not in it, so here they change nothing and the history is not kept.
TEST(Sampler, MirostatReplacesTheFiltersAndPenalties) {
    const auto logits = random_logits(300, 3, 3.0f);
    SamplerParams bare = plain(0.9f, 12);
    bare.mirostat = 2;
    SamplerParams busy = bare;
    busy.top_k = 3;
    busy.top_p = 0.5f;
    busy.min_p = 0.3f;
    busy.typical_p = 0.5f;
    busy.xtc_probability = 1.0f;
    busy.repeat_penalty = 3.0f;
    busy.frequency_penalty = 1.0f;
    busy.dry_multiplier = 2.0f;
    busy.dry_breakers = {{7, {}}};
    busy.dynatemp_range = 0.5f;
    EXPECT_FALSE(sampler_reads_history(busy));
    EXPECT_TRUE(sampler_history_tail(busy, std::vector<int32_t>{1, 2, 3}).empty());
    Sampler a(bare, 300), b(busy, 300);
    for (int i = 0; i < 100; ++i) {
        const int32_t t = a.sample(logits.data());
        ASSERT_EQ(b.sample(logits.data()), t) << i;
        a.accept(t);
        b.accept(t);
        ASSERT_EQ(a.mirostat_mu(), b.mirostat_mu());
    }
    // The bias still applies before it: a banned token is never drawn.
    SamplerParams banned = bare;
    const int32_t best = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    banned.logit_bias = {{best, -k_inf}};
    Sampler c(banned, 300);
    for (int i = 0; i < 200; ++i) ASSERT_NE(c.sample(logits.data()), best);
    // Temperature 0 is greedy with Mirostat too (the argmax after the bias), and leaves mu alone.
    SamplerParams g = greedy();
    g.mirostat = 1;
    g.repeat_penalty = 5.0f;
    Sampler gs(g, 300);
    for (int i = 0; i < 3; ++i) {
        gs.accept(gs.sample(logits.data()));
        EXPECT_EQ(gs.last_logprob(), 0.0f);
    }
    EXPECT_EQ(gs.sample(logits.data()), best);  // the penalty would have moved it
    EXPECT_EQ(gs.mirostat_mu(), 10.0f);
}

// Mirostat 1 on an exact Zipf row p_i ~ (i + 1)^-s: the fit finds s, so the tokens kept are the formula's k;
// the temperature comes first (it divides the exponent).
TEST(Sampler, MirostatOneKeepsTheZipfFormulasK) {
    std::vector<float> logits(1000);
    for (size_t i = 0; i < logits.size(); ++i) logits[i] = -1.2f * std::log(float(i + 1));
    for (float t : {1.0f, 2.0f}) {
        SamplerParams p = plain(t, 5);
        p.mirostat = 1;
        p.mirostat_tau = 3.0f;  // mu = 6 at the start
        Sampler s(p, 1000);
        s.sample(logits.data());
        const double zipf = 1.2 / t, e = zipf - 1.0;
        const double k = std::pow(e * 64.0 / (1.0 - std::pow(1000.0, -e)), 1.0 / zipf);
        EXPECT_EQ(s.last_top_logprobs(1000).size(), size_t(k)) << "temperature " << t << ", k " << k;
    }
}

// A Mirostat stream resumed elsewhere needs its mu: restored with the draws and mu it draws what the
// uninterrupted sampler draws; restored without mu it soon does not.
TEST(Sampler, MirostatRestoresItsThreshold) {
    for (int version : {1, 2}) {
        SamplerParams p = plain(1.0f, 66);
        p.mirostat = version;
        p.mirostat_tau = 3.0f;
        std::vector<std::vector<float>> steps;
        for (int i = 0; i < 80; ++i) steps.push_back(random_logits(200, 300 + uint64_t(i), 4.0f));
        Sampler whole(p, 200);
        std::vector<int32_t> tokens;
        std::vector<float> mus;
        for (const auto &l : steps) {
            tokens.push_back(whole.sample(l.data()));
            whole.accept(tokens.back());
            mus.push_back(whole.mirostat_mu());
        }
        for (size_t cut : {size_t(1), size_t(40)}) {
            Sampler resumed(p, 200), forgetful(p, 200);
            resumed.restore(cut, {}, mus[cut - 1]);
            forgetful.restore(cut, {});
            size_t differ = 0;
            for (size_t i = cut; i < steps.size(); ++i) {
                ASSERT_EQ(resumed.sample(steps[i].data()), tokens[i])
                    << "mirostat " << version << ", step " << i;
                EXPECT_EQ(resumed.mirostat_mu(), mus[i]);
                differ += forgetful.sample(steps[i].data()) != tokens[i];
            }
            EXPECT_GT(differ, 0u) << "mirostat " << version << ", cut " << cut;
        }
    }
}

TEST(Sampler, NoAllocationPerTokenAfterFirstCall) {
    const auto logits = random_logits(5000, 31, 2.0f);
    SamplerParams top_p_only = plain(1.0f);
    top_p_only.top_p = 0.9f;
    SamplerParams big_k = plain(0.9f);
    big_k.top_k = 1000;
    SamplerParams mirostat1 = plain(1.0f), mirostat2 = plain(1.0f);
    mirostat1.mirostat = 1;
    mirostat2.mirostat = 2;
    for (SamplerParams p :
         {SamplerParams{}, top_p_only, big_k, plain(1.0f), greedy(), mirostat1, mirostat2}) {
        p.repeat_penalty = 1.1f;
        p.frequency_penalty = 0.1f;
        Sampler s(p, 5000);
        s.accept(s.sample(logits.data()));
        const long long before = g_allocations;
        for (int i = 0; i < 200; ++i) s.accept(s.sample(logits.data()));
        EXPECT_EQ(g_allocations - before, 0) << "top_k " << p.top_k << " top_p " << p.top_p;
        EXPECT_EQ(s.last_top_logprobs(0).size(), 0u);  // keeps s and the loop observable
    }
}

void expect_same_draw(Sampler &a, Sampler &b, int row) {
    ASSERT_EQ(a.last_logprob(), b.last_logprob()) << "row " << row;
    const auto ta = a.last_top_logprobs(5), tb = b.last_top_logprobs(5);
    ASSERT_EQ(ta.size(), tb.size()) << "row " << row;
    for (size_t j = 0; j < ta.size(); ++j) {
        ASSERT_EQ(ta[j].id, tb[j].id) << "row " << row;
        ASSERT_EQ(ta[j].logprob, tb[j].logprob) << "row " << row;
    }
}

TEST(Sampler, ReadingTheRowAsGivenDrawsWhatTheGeneralPathDraws) {
    // top_n_sigma 1e30 keeps every token that can occur but sends each call down the general path (a copy
    // of the row, then the filters). Against it: the row read as given (no bias), and read as given with the
    // few tokens a bias moves (a bias of 0 here) set aside and offered at their moved logits. The same tokens
    // and final distributions, on rows with NaN, -inf and +inf in them and with fewer tokens that can occur
    // than top_k keeps.
    for (const int32_t top_k : {40, 1, 512}) {
        for (const float temperature : {0.8f, 0.0f}) {
            SCOPED_TRACE(::testing::Message() << "top_k " << top_k << ", temperature " << temperature);
            SamplerParams p = plain(temperature, 99);
            p.top_k = top_k;
            p.top_p = top_k == 40 ? 0.9f : 1.0f;  // without top_p, only top_k orders the walk
            p.min_p = 0.02f;
            SamplerParams general = p, moved = p;
            general.top_n_sigma = 1e30f;
            moved.logit_bias = {{7, 0.0f}, {2999, 0.0f}};
            Sampler fast(p, 3000), slow(general, 3000), sparse(moved, 3000);
            for (int i = 0; i < 200; ++i) {
                auto row = random_logits(3000, 900 + uint64_t(i), 4.0f);
                if (i % 5 == 1) row[size_t(i)] = std::nanf("");
                if (i % 7 == 2)  // only 20 tokens can occur
                    for (size_t t = 20; t < row.size(); ++t) row[t] = -k_inf;
                if (i % 11 == 3) row[size_t(i * 3)] = k_inf;
                if (i == 4) std::fill(row.begin(), row.end(), -k_inf);
                const int32_t a = fast.sample(row.data()), b = slow.sample(row.data()),
                              c = sparse.sample(row.data());
                ASSERT_EQ(a, b) << "row " << i;
                ASSERT_EQ(c, b) << "row " << i;
                expect_same_draw(fast, slow, i);
                expect_same_draw(sparse, slow, i);
            }
        }
    }
    // The penalties and DRY move the tokens of the history: the same, set aside, against the general path.
    SamplerParams p = plain(0.9f, 5);
    p.top_k = 40;
    p.top_p = 0.95f;
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.2f;
    p.presence_penalty = 0.1f;
    p.repeat_last_n = 32;
    p.dry_multiplier = 0.6f;
    p.dry_allowed_length = 1;
    p.dry_breakers = {{3, {}}};
    p.logit_bias = {{10, 2.0f}, {11, -k_inf}, {10, -0.5f}};
    SamplerParams general = p;
    general.top_n_sigma = 1e30f;
    Sampler sparse(p, 300), slow(general, 300);
    for (int i = 0; i < 400; ++i) {
        auto row = random_logits(300, 7000 + uint64_t(i), 3.0f);
        if (i % 9 == 4) row[size_t(i % 300)] = std::nanf("");
        const int32_t a = sparse.sample(row.data()), b = slow.sample(row.data());
        ASSERT_EQ(a, b) << "row " << i;
        expect_same_draw(sparse, slow, i);
        sparse.accept(a);
        slow.accept(b);
    }
}

TEST(Sampler, LargeVocabDefaultChain) {
    // A 150k vocabulary with the default chain: every pick lies in the top 40.
    const int32_t n_vocab = 150000;
    const auto logits = random_logits(size_t(n_vocab), 99, 6.0f);
    std::vector<int> order(static_cast<size_t>(n_vocab));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                      [&](int a, int b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const std::set<int> top40(order.begin(), order.begin() + 40);
    SamplerParams p;
    p.seed = 8;
    Sampler s(p, n_vocab);
    for (int i = 0; i < 30; ++i) {
        const int32_t tok = s.sample(logits.data());
        ASSERT_TRUE(top40.count(tok)) << tok;
        s.accept(tok);
    }
}

}  // namespace
}  // namespace td
