#include "model/bench.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <random>

namespace td {

std::string BenchTest::name() const {
    if (n_gen == 0) return fmt::format("pp{}", n_prompt);
    if (n_prompt == 0) return fmt::format("tg{}", n_gen);
    return fmt::format("pp{}+tg{}", n_prompt, n_gen);
}

BenchTarget bench_target(Context &ctx, int32_t bos) {
    BenchTarget t;
    t.submit = [&ctx](const Batch &batch) { return ctx.decode(batch); };
    t.clear = [&ctx] {
        ctx.kv().clear();
        return Status();
    };
    t.n_vocab = ctx.model().hparams().n_vocab;
    t.bos = bos;
    return t;
}

BenchTarget bench_target(Engine &engine, int32_t bos, int n_stages) {
    BenchTarget t;
    t.submit = [&engine](const Batch &batch) { return engine.submit(batch); };
    t.wait = [&engine]() -> Status { return engine.wait().status(); };
    t.clear = [&engine]() -> Status {
        SamplerParams greedy;
        greedy.temperature = 0.0f;
        for (int32_t s = 0; s < engine.n_seq(); ++s) TD_TRY(engine.seq_start(s, greedy));
        return {};
    };
    t.max_in_flight = std::max(1, engine.max_in_flight());
    t.n_stages = std::max(1, n_stages);
    t.n_vocab = engine.n_vocab();
    t.bos = bos;
    return t;
}

namespace {

class Runner {
public:
    Runner(const BenchTarget &target, const BenchRunParams &params)
        : target_(target), params_(params), rng_(params.seed), pick_(0, target.n_vocab - 1) {}

    // n_par prompts of n tokens from position p0, their rows back to back in batches of n_batch; logits only
    // for each batch's last row. Batches are queued up to the target's depth (a pipeline overlaps them).
    Status prompt(int32_t n, int32_t n_par, int32_t p0) {
        const int64_t total = static_cast<int64_t>(n) * n_par;
        int in_flight = 0;
        for (int64_t start = 0; start < total; start += params_.n_batch) {
            const int64_t end = std::min<int64_t>(total, start + params_.n_batch);
            batch_.clear();
            for (int64_t r = start; r < end; ++r) {
                const int32_t i = static_cast<int32_t>(r % n);
                batch_.add(token(p0 + i == 0), p0 + i, static_cast<int32_t>(r / n), r == end - 1);
            }
            if (in_flight == target_.max_in_flight) {
                TD_TRY(wait());
                --in_flight;
            }
            TD_TRY(target_.submit(batch_));
            ++in_flight;
        }
        for (; in_flight > 0; --in_flight) TD_TRY(wait());
        return {};
    }

    // n single-token steps from position p0 for each of n_par sequences. The sequences form
    // min(n_par, n_stages, max_in_flight) groups (micro-batches); each group submits its next step once its
    // previous one has returned, and the groups' steps are in flight together.
    Status gen(int32_t n, int32_t n_par, int32_t p0) {
        const int32_t n_groups =
            target_.wait ? std::max(1, std::min({n_par, target_.n_stages, target_.max_in_flight})) : 1;
        std::vector<int32_t> next(n_groups, p0);  // [n_groups] the position each group submits next
        std::deque<int32_t> queued;               // groups in submission order
        auto submit = [&](int32_t g) -> Status {
            batch_.clear();
            const int32_t first = g * n_par / n_groups, last = (g + 1) * n_par / n_groups;
            for (int32_t s = first; s < last; ++s) batch_.add(token(next[g] == 0), next[g], s, true);
            ++next[g];
            queued.push_back(g);
            return target_.submit(batch_);
        };
        for (int32_t g = 0; g < n_groups; ++g) TD_TRY(submit(g));
        while (!queued.empty()) {
            TD_TRY(wait());
            const int32_t g = queued.front();
            queued.pop_front();
            if (next[g] < p0 + n) TD_TRY(submit(g));
        }
        return {};
    }

private:
    Status wait() { return target_.wait ? target_.wait() : Status(); }

    int32_t token(bool first) {
        if (first && target_.bos >= 0) return target_.bos;
        return pick_(rng_);
    }

    const BenchTarget &target_;
    const BenchRunParams &params_;
    std::mt19937_64 rng_;
    std::uniform_int_distribution<int32_t> pick_;
    Batch batch_;
};

}  // namespace

Result<std::vector<uint64_t>> bench_run(const BenchTarget &target, const BenchTest &test,
                                        const BenchRunParams &params) {
    if (test.n_prompt < 0 || test.n_gen < 0 || (test.n_prompt > 0) == (test.n_gen > 0))
        return invalid_input("a benchmark test is either a prompt (pp) or a generation (tg), got pp={} tg={}",
                             test.n_prompt, test.n_gen);
    if (test.n_parallel < 1)
        return invalid_input("parallel sequences must be at least 1, got {}", test.n_parallel);
    if (test.n_depth < 0) return invalid_input("the depth must not be negative, got {}", test.n_depth);
    if (params.n_batch < 1) return invalid_input("the batch size must be at least 1, got {}", params.n_batch);
    if (params.reps < 1) return invalid_input("repetitions must be at least 1, got {}", params.reps);
    if (target.n_vocab < 1 || !target.submit || !target.clear)
        return invalid_input("the benchmark target has no vocabulary or no submit function");
    if (target.bos >= target.n_vocab)
        return invalid_input("BOS token {} is outside the vocabulary of {}", target.bos, target.n_vocab);

    using clock = std::chrono::steady_clock;
    Runner run(target, params);
    // A cleared cache, then the untimed context of n_depth positions.
    auto fill = [&]() -> Status {
        TD_TRY(target.clear());
        if (test.n_depth > 0) TD_TRY(run.prompt(test.n_depth, test.n_parallel, 0));
        return {};
    };
    auto once = [&](bool warmup) -> Status {
        if (test.n_prompt > 0) return run.prompt(test.n_prompt, test.n_parallel, test.n_depth);
        return run.gen(warmup ? 1 : test.n_gen, test.n_parallel, test.n_depth);
    };
    if (params.warmup) {
        TD_TRY(fill());
        TD_TRY(once(true));
    }
    std::vector<uint64_t> samples_ns;
    samples_ns.reserve(params.reps);
    for (int32_t r = 0; r < params.reps; ++r) {
        TD_TRY(fill());
        const auto t0 = clock::now();
        TD_TRY(once(false));
        const auto t1 = clock::now();
        samples_ns.push_back(
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
    }
    TD_TRY(target.clear());
    return samples_ns;
}

double bench_mean(const std::vector<double> &values) {
    if (values.empty()) return 0.0;
    double sum = 0.0;
    for (double v : values) sum += v;
    return sum / static_cast<double>(values.size());
}

double bench_stddev(const std::vector<double> &values) {
    if (values.size() < 2) return 0.0;
    const double mean = bench_mean(values);
    double sq = 0.0;
    for (double v : values) sq += (v - mean) * (v - mean);
    return std::sqrt(sq / static_cast<double>(values.size() - 1));
}

std::vector<double> bench_samples_ts(const std::vector<uint64_t> &samples_ns, int32_t n_tokens) {
    std::vector<double> ts;
    ts.reserve(samples_ns.size());
    for (uint64_t ns : samples_ns) ts.push_back(ns == 0 ? 0.0 : 1e9 * n_tokens / static_cast<double>(ns));
    return ts;
}

size_t peak_rss_bytes() {
    if (FILE *f = std::fopen("/proc/self/status", "r")) {
        char line[256];
        size_t kib = 0;
        bool found = false;
        while (std::fgets(line, sizeof(line), f)) {
            if (std::strncmp(line, "VmHWM:", 6) == 0) {
                found = std::sscanf(line + 6, "%zu", &kib) == 1;
                break;
            }
        }
        std::fclose(f);
        if (found) return kib * 1024;
    }
    struct rusage ru {};
    if (getrusage(RUSAGE_SELF, &ru) == 0) return static_cast<size_t>(ru.ru_maxrss) * 1024;  // KiB on Linux
    return 0;
}

std::string bench_params_label(uint64_t n_params) {
    const double n = static_cast<double>(n_params);
    auto fmt_scaled = [](double v, const char *unit) {
        return v >= 100 ? fmt::format("{:.0f}{}", v, unit) : fmt::format("{:.3g}{}", v, unit);
    };
    if (n >= 1e9) return fmt_scaled(n / 1e9, "B");
    if (n >= 1e6) return fmt_scaled(n / 1e6, "M");
    if (n >= 1e3) return fmt_scaled(n / 1e3, "K");
    return fmt::format("{}", n_params);
}

BenchModelInfo bench_model_info(const gguf::File &file, const std::string &arch) {
    BenchModelInfo info;
    std::map<DType, uint64_t> bytes_by_type;
    for (const gguf::TensorInfo &t : file.tensors()) {
        uint64_t n = 1;
        for (int d = 0; d < t.n_dims; ++d) n *= static_cast<uint64_t>(t.ne[d]);
        info.n_params += n;
        info.size_bytes += t.n_bytes;
        if (t.n_dims >= 2) bytes_by_type[t.type] += t.n_bytes;
    }
    std::string type = "?";
    uint64_t best = 0;
    for (const auto &[dtype, bytes] : bytes_by_type) {
        if (bytes > best) {
            best = bytes;
            type = dtype_name(dtype);
        }
    }
    std::transform(type.begin(), type.end(), type.begin(), [](unsigned char c) { return std::toupper(c); });
    info.type = fmt::format("{} {} {}", arch, bench_params_label(info.n_params), type);
    return info;
}

}  // namespace td
