// Benchmark records and their output formats, field for field as llama.cpp's llama-bench writes them (same
// names, types and order; JSON is an array of records with samples_ns/samples_ts), so scripts written for
// llama-bench read tandem's output unchanged. tandem adds fields after llama-bench's (peak_rss_bytes,
// n_parallel, pipeline) and leaves the rest as they are, so a cluster run reads like one machine's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace td {

struct BenchRecord {
    // Build and machine.
    std::string build_commit;
    int64_t build_number = 0;
    std::string cpu_info;
    std::string gpu_info;
    std::string backends = "CPU";
    // Model.
    std::string model_filename;
    std::string model_type;  // "llama 1.1B Q4_0"
    uint64_t model_size = 0;
    uint64_t model_n_params = 0;
    // Settings. Those tandem has no counterpart for keep llama-bench's CPU-only values.
    int32_t n_batch = 512;
    int32_t n_ubatch = 512;
    int32_t n_threads = 1;
    std::string type_k = "f16";
    std::string type_v = "f16";
    int32_t n_gpu_layers = 0;
    std::string devices = "none";
    // Test and results.
    int32_t n_prompt = 0;
    int32_t n_gen = 0;
    int32_t n_depth = 0;
    std::string test_time;  // RFC 3339, UTC
    std::vector<uint64_t> samples_ns;
    // tandem only.
    uint64_t peak_rss_bytes = 0;
    int32_t n_parallel = 1;  // sequences decoding together; t/s counts the tokens of all of them
    std::string pipeline;    // cluster runs: "2-stage 0-7,8-15 wire f16" (the head's layers first); "" local

    std::string test_name() const;  // "pp512", "tg128"
    uint64_t avg_ns() const;
    uint64_t stddev_ns() const;
    std::vector<double> samples_ts() const;
    double avg_ts() const;
    double stddev_ts() const;
};

// One scalar field of a record, in output order; `type` decides JSON quoting like llama-bench's
// get_field_type.
struct BenchField {
    enum class Type { string, boolean, integer, floating };
    std::string name;
    Type type;
    std::string value;  // as llama-bench prints it: "1"/"0" for booleans, "%f" for floats
};
std::vector<BenchField> bench_record_fields(const BenchRecord &record);

// The output formats. JSON: `[ {...}, ... ]`; JSONL: one object per line; CSV: a header line, then one quoted
// row per record; Markdown: llama-bench's table (model, size, params, backend, threads, [type_k, type_v
// when not f16], [pipeline with any cluster record], [seqs with any n_parallel > 1], test, t/s) and a
// footer with the build and the peak RSS.
std::string bench_format_json(const std::vector<BenchRecord> &records);
std::string bench_format_jsonl(const std::vector<BenchRecord> &records);
std::string bench_format_csv(const std::vector<BenchRecord> &records);
std::string bench_format_markdown(const std::vector<BenchRecord> &records);

// "2024-05-01T12:00:00Z" for now.
std::string bench_time_now();

// The CPU's model name from /proc/cpuinfo ("" when unknown).
std::string bench_cpu_info();

}  // namespace td
