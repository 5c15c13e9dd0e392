// Throughput benchmarks in the shape of llama.cpp's llama-bench, so the numbers compare one to one:
//
//   pp<N>: one prompt of N random token ids from an empty context, decoded in batches of n_batch (only the
//          last row of each batch asks for logits, as llama_batch_get_one does); t/s = N / wall time.
//   tg<N>: N decode calls of one token each from an empty context (the first token is BOS when the model
//          adds one, then random ids); t/s = N / wall time.
//
// With n_parallel P > 1, P sequences run together: pp decodes P prompts of N tokens (their rows back to back
// in batches of n_batch), tg has P sequences decode N tokens each, and t/s counts all P * N tokens. A
// pipeline target (n_stages > 1) decodes the P sequences as n_stages micro-batches kept in flight at once,
// each submitting its next step only once its previous one returned (as real sampling would need), so every
// stage is busy; a single stage decodes them as one batch of P rows per step.
//
// With n_depth D > 0 (llama-bench's -d), each repetition first fills every sequence with a D-token prompt,
// untimed, and the timed pp or tg continues from position D: speed with a filled context.
//
// Each test runs a warm-up (a whole pp, or one tg step) and then `reps` timed repetitions, each from a
// cleared cache. What is benchmarked is a BenchTarget (submit, wait, clear): a local Context, or any Engine
// (a cluster pipeline), through the same driver and report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf.h"
#include "model/batch.h"
#include "model/context.h"
#include "model/engine.h"

namespace td {

// One test. Exactly one of n_prompt, n_gen is positive (llama-bench's combined pp+tg is not offered).
struct BenchTest {
    int32_t n_prompt = 0;
    int32_t n_gen = 0;
    int32_t n_parallel = 1;  // sequences run together
    int32_t n_depth = 0;     // positions already in each sequence's cache when the timed part starts

    int32_t n_tokens() const { return n_prompt + n_gen; }  // timed positions per sequence
    std::string name() const;                              // "pp512" or "tg128", as llama-bench prints it
};

// What a benchmark drives: token ids in, over every layer; outputs are discarded.
struct BenchTarget {
    std::function<Status(const Batch &)> submit;  // queue one step (a synchronous target computes it here)
    std::function<Status()> wait;                 // complete the oldest queued step; empty: nothing queues
    std::function<Status()> clear;                // forget every sequence: the next run starts at position 0
    int max_in_flight = 1;                        // steps that may be queued before a wait
    int n_stages = 1;  // pipeline stages: parallel sequences decode as this many micro-batches
    int32_t n_vocab = 0;
    int32_t bos = -1;  // first token of every run when >= 0; random ids otherwise
};

// A target over a local context (synchronous; every sequence slot). `ctx` must outlive the target.
BenchTarget bench_target(Context &ctx, int32_t bos);
// A target over an engine (a cluster pipeline of n_stages stages): clear restarts every sequence slot
// (greedy sampling). `engine` must outlive the target.
BenchTarget bench_target(Engine &engine, int32_t bos, int n_stages);

struct BenchRunParams {
    int32_t n_batch = 512;  // prompt rows per decode call
    int32_t reps = 5;       // timed repetitions
    bool warmup = true;
    uint64_t seed = 1234;  // random token ids (the values do not matter for speed, only their validity)
};

// Runs one test: warm-up, then `reps` timed repetitions. Returns the wall time of each repetition in ns.
// Errors: invalid test or parameters (invalid_input), or the first error submit/wait/clear returns.
Result<std::vector<uint64_t>> bench_run(const BenchTarget &target, const BenchTest &test,
                                        const BenchRunParams &params);

// Statistics as llama-bench computes them: the mean, the sample standard deviation (0 for fewer than two
// samples) and tokens/s per sample (1e9 * n_tokens / ns).
double bench_mean(const std::vector<double> &values);
double bench_stddev(const std::vector<double> &values);
std::vector<double> bench_samples_ts(const std::vector<uint64_t> &samples_ns, int32_t n_tokens);

// Peak resident set size of this process in bytes (VmHWM from /proc/self/status, else getrusage); 0 when
// neither is available.
size_t peak_rss_bytes();

// What llama-bench reports about a model: bytes and element count of all tensors in the file, and a short
// description "<arch> <params> <main weight type>" such as "llama 1.1B Q4_0" (the type holding most bytes).
struct BenchModelInfo {
    uint64_t size_bytes = 0;
    uint64_t n_params = 0;
    std::string type;
};
BenchModelInfo bench_model_info(const gguf::File &file, const std::string &arch);

// "260K", "15.2M", "1.1B": a parameter count the way model cards round it.
std::string bench_params_label(uint64_t n_params);

}  // namespace td
