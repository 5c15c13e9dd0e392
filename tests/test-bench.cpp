// `tandem bench`: the driver's calls (batch shapes, positions, warm-up, cleared cache per repetition), the
// statistics, and the real binary's llama-bench compatible output (JSON, JSONL, CSV, Markdown) and errors.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gguf/gguf.h"
#include "model/bench-report.h"
#include "model/bench.h"
#include "test-util.h"

namespace td {
namespace {

const char *kStories = "models/stories260K.gguf";

// A target that records every call instead of computing: the driver under test is bench_run.
struct FakeTarget {
    std::vector<Batch> calls;
    int clears = 0;
    int fail_at = -1;  // submit call index that returns an error
    // Queued mode (a pipeline): submit queues, wait completes the oldest.
    std::vector<std::string> events;  // "s<seq of row 0>@<pos>" per submit, "w" per wait
    int queued = 0, max_queued = 0;

    BenchTarget target(int32_t n_vocab, int32_t bos) {
        BenchTarget t;
        t.submit = [this](const Batch &b) -> Status {
            if (static_cast<int>(calls.size()) == fail_at) return make_error(ErrorKind::failed, "boom");
            calls.push_back(b);
            return {};
        };
        t.clear = [this] {
            ++clears;
            return Status();
        };
        t.n_vocab = n_vocab;
        t.bos = bos;
        return t;
    }
    BenchTarget pipeline(int32_t n_vocab, int n_stages, int max_in_flight) {
        BenchTarget t = target(n_vocab, -1);
        t.submit = [this, max_in_flight](const Batch &b) -> Status {
            if (queued == max_in_flight) return make_error(ErrorKind::failed, "queue full");
            calls.push_back(b);
            events.push_back(fmt::format("s{}@{}", b.seq[0], b.pos[0]));
            max_queued = std::max(max_queued, ++queued);
            return {};
        };
        t.wait = [this]() -> Status {
            if (queued == 0) return make_error(ErrorKind::failed, "nothing queued");
            --queued;
            events.push_back("w");
            return {};
        };
        t.n_stages = n_stages;
        t.max_in_flight = max_in_flight;
        return t;
    }
};

TEST(BenchRun, PromptRunsInBatchesWithLogitsOnlyOnEachBatchesLastRow) {
    FakeTarget fake;
    BenchRunParams p;
    p.n_batch = 512;
    p.reps = 3;
    auto samples = bench_run(fake.target(100, 1), BenchTest{1000, 0}, p);
    ASSERT_TRUE(samples.ok()) << samples.status().message();
    EXPECT_EQ(samples->size(), 3u);
    // Warm-up + 3 reps, each 512 + 488 rows.
    ASSERT_EQ(fake.calls.size(), 8u);
    for (size_t c = 0; c < fake.calls.size(); ++c) {
        const Batch &b = fake.calls[c];
        const int32_t start = c % 2 == 0 ? 0 : 512;
        ASSERT_EQ(b.size(), c % 2 == 0 ? 512 : 488);
        for (int32_t i = 0; i < b.size(); ++i) {
            EXPECT_EQ(b.pos[i], start + i);
            EXPECT_EQ(b.seq[i], 0);
            EXPECT_EQ(b.want_logits[i], i == b.size() - 1 ? 1 : 0);
            EXPECT_GE(b.token[i], 0);
            EXPECT_LT(b.token[i], 100);
        }
        if (start == 0) {
            EXPECT_EQ(b.token[0], 1);  // BOS first
        }
    }
    // A cleared cache before the warm-up, before each repetition, and after the last.
    EXPECT_EQ(fake.clears, 5);
}

TEST(BenchRun, GenerationIsOneTokenPerCallFromPositionZero) {
    FakeTarget fake;
    BenchRunParams p;
    p.reps = 2;
    auto samples = bench_run(fake.target(50, -1), BenchTest{0, 5}, p);
    ASSERT_TRUE(samples.ok()) << samples.status().message();
    EXPECT_EQ(samples->size(), 2u);
    // Warm-up is a single step (as llama-bench), then 2 x 5 steps.
    ASSERT_EQ(fake.calls.size(), 11u);
    EXPECT_EQ(fake.calls[0].pos[0], 0);
    for (size_t c = 1; c < fake.calls.size(); ++c) {
        const Batch &b = fake.calls[c];
        ASSERT_EQ(b.size(), 1);
        EXPECT_EQ(b.pos[0], static_cast<int32_t>((c - 1) % 5));
        EXPECT_EQ(b.want_logits[0], 1);
        EXPECT_LT(b.token[0], 50);
    }
}

// -d: every repetition first fills each sequence with an untimed prompt of n_depth positions (BOS first),
// then the test continues from there.
TEST(BenchRun, DepthFillsTheContextFirst) {
    FakeTarget fake;
    BenchRunParams p;
    p.reps = 1;
    p.warmup = false;
    p.n_batch = 4;
    BenchTest t{0, 3, 2};
    t.n_depth = 6;
    ASSERT_TRUE(bench_run(fake.target(50, 1), t, p).ok());
    // 2 x 6 prompt rows in batches of 4, then 3 steps of both sequences.
    ASSERT_EQ(fake.calls.size(), 6u);
    std::vector<std::pair<int32_t, int32_t>> rows;  // (seq, pos) of the prompt rows
    for (size_t c = 0; c < 3; ++c) {
        const Batch &b = fake.calls[c];
        ASSERT_EQ(b.size(), 4);
        for (int32_t i = 0; i < b.size(); ++i) {
            rows.emplace_back(b.seq[i], b.pos[i]);
            if (b.pos[i] == 0) {
                EXPECT_EQ(b.token[i], 1);  // BOS
            }
        }
    }
    for (int32_t r = 0; r < 12; ++r) EXPECT_EQ(rows[r], std::make_pair(r / 6, r % 6));
    for (int32_t step = 0; step < 3; ++step) {
        const Batch &b = fake.calls[3 + step];
        ASSERT_EQ(b.size(), 2);
        for (int32_t s = 0; s < 2; ++s) {
            EXPECT_EQ(b.seq[s], s);
            EXPECT_EQ(b.pos[s], 6 + step);
        }
    }
    t.n_depth = -1;
    EXPECT_FALSE(bench_run(fake.target(50, 1), t, p).ok());
}

TEST(BenchRun, NoWarmupAndErrors) {
    FakeTarget fake;
    BenchRunParams p;
    p.reps = 1;
    p.warmup = false;
    ASSERT_TRUE(bench_run(fake.target(10, -1), BenchTest{0, 3}, p).ok());
    EXPECT_EQ(fake.calls.size(), 3u);

    FakeTarget failing;
    failing.fail_at = 2;
    auto r = bench_run(failing.target(10, -1), BenchTest{0, 4}, p);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("boom"), std::string::npos);

    FakeTarget any;
    EXPECT_FALSE(bench_run(any.target(10, -1), BenchTest{4, 4}, p).ok());  // pp+tg is not offered
    EXPECT_FALSE(bench_run(any.target(10, -1), BenchTest{0, 0}, p).ok());
    EXPECT_FALSE(bench_run(any.target(10, 10), BenchTest{0, 1}, p).ok());  // BOS outside the vocabulary
    p.reps = 0;
    EXPECT_FALSE(bench_run(any.target(10, -1), BenchTest{0, 1}, p).ok());
    EXPECT_TRUE(any.calls.empty());
}

TEST(BenchRun, ParallelSequencesDecodeAsOneBatchOnOneStage) {
    FakeTarget fake;
    BenchRunParams p;
    p.reps = 1;
    p.warmup = false;
    ASSERT_TRUE(bench_run(fake.target(50, 1), BenchTest{0, 3, 4}, p).ok());
    ASSERT_EQ(fake.calls.size(), 3u);
    for (int32_t step = 0; step < 3; ++step) {
        const Batch &b = fake.calls[step];
        ASSERT_EQ(b.size(), 4);
        for (int32_t s = 0; s < 4; ++s) {
            EXPECT_EQ(b.seq[s], s);
            EXPECT_EQ(b.pos[s], step);
            EXPECT_EQ(b.want_logits[s], 1);
            if (step == 0) {
                EXPECT_EQ(b.token[s], 1);  // every sequence starts with BOS
            }
        }
    }
}

// On a 2-stage pipeline, 4 sequences decode as 2 micro-batches in flight together; a micro-batch's next
// step goes out only after its previous step came back.
TEST(BenchRun, ParallelSequencesKeepOneMicroBatchPerStageInFlight) {
    FakeTarget fake;
    BenchRunParams p;
    p.reps = 1;
    p.warmup = false;
    ASSERT_TRUE(bench_run(fake.pipeline(50, 2, 8), BenchTest{0, 3, 4}, p).ok());
    const std::vector<std::string> want = {"s0@0", "s2@0", "w", "s0@1", "w", "s2@1",
                                           "w",    "s0@2", "w", "s2@2", "w", "w"};
    EXPECT_EQ(fake.events, want);
    EXPECT_EQ(fake.max_queued, 2);
    for (const Batch &b : fake.calls) {
        ASSERT_EQ(b.size(), 2);
        EXPECT_EQ(b.seq[1], b.seq[0] + 1);
    }
}

TEST(BenchRun, ParallelPromptsGoBackToBackUpToTheTargetsDepth) {
    FakeTarget fake;
    BenchRunParams p;
    p.reps = 1;
    p.warmup = false;
    p.n_batch = 4;
    ASSERT_TRUE(bench_run(fake.pipeline(50, 2, 2), BenchTest{5, 0, 2}, p).ok());
    // 10 rows (2 prompts of 5) in batches of 4, 4, 2; at most 2 queued.
    const std::vector<std::string> want = {"s0@0", "s0@4", "w", "s1@3", "w", "w"};
    EXPECT_EQ(fake.events, want);
    ASSERT_EQ(fake.calls.size(), 3u);
    EXPECT_EQ(fake.calls[1].seq[1], 1);  // row 5: the second prompt's first token
    EXPECT_EQ(fake.calls[1].pos[1], 0);
    EXPECT_EQ(fake.calls[2].size(), 2);
}

TEST(BenchStats, MatchLlamaBench) {
    EXPECT_DOUBLE_EQ(bench_mean({2, 4, 6}), 4.0);
    EXPECT_DOUBLE_EQ(bench_stddev({2, 4, 6}), 2.0);  // sample (n - 1) standard deviation
    EXPECT_DOUBLE_EQ(bench_stddev({5}), 0.0);
    auto ts = bench_samples_ts({1'000'000'000, 500'000'000}, 128);
    ASSERT_EQ(ts.size(), 2u);
    EXPECT_DOUBLE_EQ(ts[0], 128.0);
    EXPECT_DOUBLE_EQ(ts[1], 256.0);
    EXPECT_EQ(bench_params_label(292'800), "293K");
    EXPECT_EQ(bench_params_label(1'100'048'384), "1.1B");
    EXPECT_GT(peak_rss_bytes(), 0u);
}

TEST(BenchStats, ModelInfoSumsTheTensors) {
    auto f = gguf::File::open(test::shared_path(kStories));
    ASSERT_TRUE(f.ok());
    BenchModelInfo info = bench_model_info(*f, "llama");
    uint64_t bytes = 0;
    for (const auto &t : f->tensors()) bytes += t.n_bytes;
    EXPECT_EQ(info.size_bytes, bytes);
    EXPECT_EQ(info.n_params * 4, bytes);  // an all-f32 model
    EXPECT_EQ(info.type, "llama 293K F32");
}

// ---- the real binary -------------------------------------------------------------------------------------

std::vector<std::string> bench_args(std::vector<std::string> extra) {
    std::vector<std::string> args = {"bench", "-m", test::shared_path(kStories), "-p", "16", "-n", "8",
                                     "-r",    "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
}

nlohmann::json run_json(const std::vector<std::string> &extra) {
    test::ProcessResult r = test::run_tandem(bench_args(extra));
    EXPECT_FALSE(r.signaled);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
}

TEST(BenchCli, JsonHasLlamaBenchFields) {
    nlohmann::json j = run_json({"-t", "1", "-o", "json"});
    ASSERT_TRUE(j.is_array());
    ASSERT_EQ(j.size(), 2u);
    const char *strings[] = {"build_commit",
                             "cpu_info",
                             "gpu_info",
                             "backends",
                             "model_filename",
                             "model_type",
                             "cpu_mask",
                             "type_k",
                             "type_v",
                             "split_mode",
                             "devices",
                             "tensor_split",
                             "tensor_buft_overrides",
                             "load_mode",
                             "test_time"};
    const char *ints[] = {"build_number", "model_size",    "model_n_params", "n_batch",     "n_ubatch",
                          "n_threads",    "poll",          "n_gpu_layers",   "n_cpu_moe",   "main_gpu",
                          "flash_attn",   "no_op_offload", "fit_target",     "fit_min_ctx", "n_prompt",
                          "n_gen",        "n_depth",       "avg_ns",         "stddev_ns",   "peak_rss_bytes"};
    const char *bools[] = {"cpu_strict", "no_kv_offload", "embeddings", "no_host"};
    for (const auto &rec : j) {
        for (const char *k : strings) EXPECT_TRUE(rec.contains(k) && rec[k].is_string()) << k;
        for (const char *k : ints) EXPECT_TRUE(rec.contains(k) && rec[k].is_number_integer()) << k;
        for (const char *k : bools) EXPECT_TRUE(rec.contains(k) && rec[k].is_boolean()) << k;
        for (const char *k : {"avg_ts", "stddev_ts"}) EXPECT_TRUE(rec.contains(k) && rec[k].is_number()) << k;
        ASSERT_TRUE(rec["samples_ns"].is_array());
        ASSERT_TRUE(rec["samples_ts"].is_array());
        EXPECT_EQ(rec["samples_ns"].size(), 2u);
        EXPECT_EQ(rec["samples_ts"].size(), 2u);
        EXPECT_EQ(rec["n_threads"], 1);
        EXPECT_EQ(rec["backends"], "CPU");
        EXPECT_EQ(rec["model_filename"], test::shared_path(kStories));
        EXPECT_EQ(rec["model_n_params"], 292800);
        EXPECT_GT(rec["avg_ts"].get<double>(), 0.0);
        EXPECT_GT(rec["avg_ns"].get<int64_t>(), 0);
        // avg_ts is the mean of the per-sample t/s.
        const double mean_ts = (rec["samples_ts"][0].get<double>() + rec["samples_ts"][1].get<double>()) / 2;
        EXPECT_NEAR(rec["avg_ts"].get<double>(), mean_ts, 1e-3 * mean_ts);
    }
    EXPECT_EQ(j[0]["n_prompt"], 16);
    EXPECT_EQ(j[0]["n_gen"], 0);
    EXPECT_EQ(j[1]["n_prompt"], 0);
    EXPECT_EQ(j[1]["n_gen"], 8);
}

TEST(BenchCli, ThreadListGivesOneRecordPerThreadCountAndTest) {
    nlohmann::json j = run_json({"-t", "1,2", "-o", "json"});
    ASSERT_EQ(j.size(), 4u);
    const int threads[] = {1, 1, 2, 2};
    const int prompt[] = {16, 0, 16, 0};
    for (size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(j[k]["n_threads"], threads[k]);
        EXPECT_EQ(j[k]["n_prompt"], prompt[k]);
        EXPECT_EQ(j[k]["n_gen"], prompt[k] == 0 ? 8 : 0);
    }
}

TEST(BenchCli, KvTypeAndPromptListsMultiply) {
    test::ProcessResult r =
        test::run_tandem({"bench", "-m", test::shared_path(kStories), "-p", "4,8", "-n", "0", "-r", "1", "-t",
                          "1", "--kv-type", "f16,f32", "-o", "jsonl"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream in(r.out);
    std::string line;
    std::vector<nlohmann::json> recs;
    while (std::getline(in, line)) recs.push_back(nlohmann::json::parse(line, nullptr, false));
    ASSERT_EQ(recs.size(), 4u);
    const char *kv[] = {"f16", "f16", "f32", "f32"};
    const int prompt[] = {4, 8, 4, 8};
    for (size_t k = 0; k < 4; ++k) {
        ASSERT_FALSE(recs[k].is_discarded()) << line;
        EXPECT_EQ(recs[k]["type_k"], kv[k]);
        EXPECT_EQ(recs[k]["type_v"], kv[k]);
        EXPECT_EQ(recs[k]["n_prompt"], prompt[k]);
    }
}

TEST(BenchCli, DepthListGivesRecordsAtEachDepth) {
    nlohmann::json j = run_json({"-t", "1", "-d", "0,32", "-o", "json"});
    ASSERT_EQ(j.size(), 4u);
    const int depth[] = {0, 0, 32, 32};
    const int prompt[] = {16, 0, 16, 0};
    for (size_t k = 0; k < 4; ++k) {
        EXPECT_EQ(j[k]["n_depth"], depth[k]);
        EXPECT_EQ(j[k]["n_prompt"], prompt[k]);
        EXPECT_GT(j[k]["avg_ts"].get<double>(), 0.0);
    }
    test::ProcessResult r = test::run_tandem(bench_args({"-t", "1", "-d", "32", "-o", "md"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("pp16 @ d32"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("tg8 @ d32"), std::string::npos) << r.out;
}

TEST(BenchCli, MarkdownTable) {
    test::ProcessResult r = test::run_tandem(bench_args({"-t", "1", "-o", "md"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream in(r.out);
    std::vector<std::string> rows;
    for (std::string line; std::getline(in, line);)
        if (line.rfind("|", 0) == 0) rows.push_back(line);
    ASSERT_EQ(rows.size(), 4u) << r.out;  // header, separator, pp16, tg8
    for (const char *col : {"model", "size", "params", "backend", "threads", "test", "t/s"})
        EXPECT_NE(rows[0].find(col), std::string::npos) << col;
    EXPECT_NE(rows[1].find("---:"), std::string::npos);
    EXPECT_NE(rows[2].find(" pp16 |"), std::string::npos) << rows[2];
    EXPECT_NE(rows[3].find(" tg8 |"), std::string::npos) << rows[3];
    for (size_t k = 2; k < 4; ++k) {
        EXPECT_NE(rows[k].find("llama 293K F32"), std::string::npos);
        EXPECT_NE(rows[k].find("| CPU "), std::string::npos);
        EXPECT_NE(rows[k].find(" ± "), std::string::npos);
    }
    EXPECT_NE(r.out.find("peak RSS:"), std::string::npos);
}

TEST(BenchCli, CsvHeaderAndRows) {
    test::ProcessResult r = test::run_tandem(bench_args({"-t", "1", "-o", "csv"}));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::istringstream in(r.out);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[0].rfind("build_commit,build_number,cpu_info,", 0), 0u) << lines[0];
    const auto commas = [](const std::string &s) { return std::count(s.begin(), s.end(), ','); };
    // No field of these rows holds a comma, so every row has as many as the header.
    EXPECT_EQ(commas(lines[1]), commas(lines[0]));
    EXPECT_EQ(commas(lines[2]), commas(lines[0]));
    EXPECT_NE(lines[1].find("\"16\",\"0\",\"0\""), std::string::npos) << lines[1];  // n_prompt,n_gen,n_depth
}

void expect_clean_failure(const std::vector<std::string> &args, const std::string &needle) {
    test::ProcessResult r = test::run_tandem(args);
    ASSERT_FALSE(r.signaled) << "killed by signal " << r.signal << "\n" << r.err;
    EXPECT_NE(r.exit_code, 0) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(BenchCli, BadFlagsFailCleanly) {
    const std::string m = test::shared_path(kStories);
    expect_clean_failure({"bench", "-m", m, "-p", "12x"}, "tandem: error: -p/--n-prompt takes");
    expect_clean_failure({"bench", "-m", m, "-n", "-3"}, "tandem: error: -n/--n-gen takes");
    expect_clean_failure({"bench", "-m", m, "-t", "1,,2"}, "tandem: error: -t/--threads takes");
    expect_clean_failure({"bench", "-m", m, "-d", "-1"}, "tandem: error: -d/--n-depth takes");
    expect_clean_failure({"bench", "-m", m, "-t", "0"}, "tandem: error: -t/--threads takes");
    expect_clean_failure({"bench", "-m", m, "-o", "xml"}, "tandem: error: -o/--output takes md, json");
    expect_clean_failure({"bench", "-m", m, "--kv-type", "q3_k"},
                         "tandem: error: --kv-type (a comma-separated list)");
    expect_clean_failure({"bench", "-m", m, "--kv-type", "q8_0"},
                         "K cache needs a head size that is a multiple of 32");
    expect_clean_failure({"bench", "-m", m, "-p", "0", "-n", "0"}, "tandem: error: nothing to run");
    expect_clean_failure({"bench", "-m", m, "-r", "0"}, "--repetitions");
    expect_clean_failure({"bench", "-m", m, "--no-such-flag"}, "--no-such-flag");
    expect_clean_failure({"bench", "-m", "/nonexistent/model.gguf", "-p", "4", "-n", "0", "-r", "1"},
                         "tandem: error: ");
}

}  // namespace
}  // namespace td
