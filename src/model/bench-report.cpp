#include "model/bench-report.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#include "model/bench.h"

namespace td {

std::string BenchRecord::test_name() const {
    BenchTest t{n_prompt, n_gen};
    std::string name = t.name();
    if (n_depth > 0) name += fmt::format(" @ d{}", n_depth);
    return name;
}

uint64_t BenchRecord::avg_ns() const {
    if (samples_ns.empty()) return 0;
    uint64_t sum = 0;
    for (uint64_t ns : samples_ns) sum += ns;
    return sum / samples_ns.size();
}

uint64_t BenchRecord::stddev_ns() const {
    std::vector<double> v(samples_ns.begin(), samples_ns.end());
    return static_cast<uint64_t>(std::llround(bench_stddev(v)));
}

std::vector<double> BenchRecord::samples_ts() const {
    return bench_samples_ts(samples_ns, (n_prompt + n_gen) * n_parallel);
}
double BenchRecord::avg_ts() const {
    return bench_mean(samples_ts());
}
double BenchRecord::stddev_ts() const {
    return bench_stddev(samples_ts());
}

std::vector<BenchField> bench_record_fields(const BenchRecord &r) {
    using T = BenchField::Type;
    auto s = [](std::string v) { return v; };
    auto i = [](int64_t v) { return std::to_string(v); };
    auto u = [](uint64_t v) { return std::to_string(v); };
    auto f = [](double v) { return fmt::format("{:.6f}", v); };  // std::to_string(double), as llama-bench
    // The names, order and types of llama-bench's test::get_fields() / get_field_type().
    return {
        {"build_commit", T::string, s(r.build_commit)},
        {"build_number", T::integer, i(r.build_number)},
        {"cpu_info", T::string, s(r.cpu_info)},
        {"gpu_info", T::string, s(r.gpu_info)},
        {"backends", T::string, s(r.backends)},
        {"model_filename", T::string, s(r.model_filename)},
        {"model_type", T::string, s(r.model_type)},
        {"model_size", T::integer, u(r.model_size)},
        {"model_n_params", T::integer, u(r.model_n_params)},
        {"n_batch", T::integer, i(r.n_batch)},
        {"n_ubatch", T::integer, i(r.n_ubatch)},
        {"n_threads", T::integer, i(r.n_threads)},
        {"cpu_mask", T::string, "0x0"},
        {"cpu_strict", T::boolean, "0"},
        {"poll", T::integer, "50"},
        {"type_k", T::string, s(r.type_k)},
        {"type_v", T::string, s(r.type_v)},
        {"n_gpu_layers", T::integer, i(r.n_gpu_layers)},
        {"n_cpu_moe", T::integer, "0"},
        {"split_mode", T::string, "layer"},
        {"main_gpu", T::integer, "0"},
        {"no_kv_offload", T::boolean, "0"},
        {"flash_attn", T::integer, "0"},
        {"devices", T::string, s(r.devices)},
        {"tensor_split", T::string, "0.00"},
        {"tensor_buft_overrides", T::string, "none"},
        {"load_mode", T::string, "mmap"},
        {"embeddings", T::boolean, "0"},
        {"no_op_offload", T::integer, "0"},
        {"no_host", T::boolean, "0"},
        {"fit_target", T::integer, "0"},
        {"fit_min_ctx", T::integer, "0"},
        {"n_prompt", T::integer, i(r.n_prompt)},
        {"n_gen", T::integer, i(r.n_gen)},
        {"n_depth", T::integer, i(r.n_depth)},
        {"test_time", T::string, s(r.test_time)},
        {"avg_ns", T::integer, u(r.avg_ns())},
        {"stddev_ns", T::integer, u(r.stddev_ns())},
        {"avg_ts", T::floating, f(r.avg_ts())},
        {"stddev_ts", T::floating, f(r.stddev_ts())},
        // tandem's own, after llama-bench's.
        {"peak_rss_bytes", T::integer, u(r.peak_rss_bytes)},
        {"n_parallel", T::integer, i(r.n_parallel)},
        {"pipeline", T::string, s(r.pipeline)},
    };
}

namespace {

std::string json_escape(const std::string &v) {
    std::string out;
    out.reserve(v.size() + 2);
    out += '"';
    for (char c : v) {
        if (c == '"') {
            out += "\\\"";
        } else if (c == '\\') {
            out += "\\\\";
        } else if (static_cast<unsigned char>(c) <= 0x1f) {
            out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
            out += c;
        }
    }
    out += '"';
    return out;
}

std::string json_value(const BenchField &field) {
    switch (field.type) {
        case BenchField::Type::string:
            return json_escape(field.value);
        case BenchField::Type::boolean:
            return field.value == "0" ? "false" : "true";
        case BenchField::Type::integer:
        case BenchField::Type::floating:
            return field.value;
    }
    return field.value;
}

template <typename T>
std::string join(const std::vector<T> &values, const char *sep) {
    std::string out;
    for (size_t k = 0; k < values.size(); ++k) {
        if (k) out += sep;
        out += fmt::format("{}", values[k]);
    }
    return out;
}

// The members of one JSON object, `indent` before each, `sep` between them.
std::string json_members(const BenchRecord &r, const char *indent, const char *sep) {
    std::string out;
    for (const BenchField &field : bench_record_fields(r))
        out += fmt::format("{}\"{}\": {}{}", indent, field.name, json_value(field), sep);
    out += fmt::format("{}\"samples_ns\": [ {} ]{}", indent, join(r.samples_ns, ", "), sep);
    out += fmt::format("{}\"samples_ts\": [ {} ]", indent, join(r.samples_ts(), ", "));
    return out;
}

std::string csv_quote(const std::string &v) {
    std::string out = "\"";
    for (char c : v) {
        if (c == '"') out += '"';
        out += c;
    }
    out += '"';
    return out;
}

// " value |" padded to |width| columns, left aligned when width < 0.
std::string cell(const std::string &v, int width) {
    return width < 0 ? fmt::format(" {:<{}} |", v, -width) : fmt::format(" {:>{}} |", v, width);
}

std::string human_size(uint64_t bytes) {
    if (bytes < 1024ull * 1024 * 1024) return fmt::format("{:.2f} MiB", bytes / 1024.0 / 1024.0);
    return fmt::format("{:.2f} GiB", bytes / 1024.0 / 1024.0 / 1024.0);
}

std::string human_params(uint64_t n) {
    if (n < 1000ull * 1000 * 1000) return fmt::format("{:.2f} M", n / 1e6);
    return fmt::format("{:.2f} B", n / 1e9);
}

}  // namespace

std::string bench_format_json(const std::vector<BenchRecord> &records) {
    std::string out = "[\n";
    for (size_t k = 0; k < records.size(); ++k) {
        out += "  {\n";
        out += json_members(records[k], "    ", ",\n");
        out += k + 1 < records.size() ? "\n  },\n" : "\n  }\n";
    }
    out += "]\n";
    return out;
}

std::string bench_format_jsonl(const std::vector<BenchRecord> &records) {
    std::string out;
    for (const BenchRecord &r : records) {
        out += '{';
        out += json_members(r, "", ", ");
        out += "}\n";
    }
    return out;
}

std::string bench_format_csv(const std::vector<BenchRecord> &records) {
    std::string out;
    const BenchRecord header_source;
    const std::vector<BenchField> names = bench_record_fields(header_source);
    for (size_t k = 0; k < names.size(); ++k) {
        if (k) out += ',';
        out += names[k].name;
    }
    out += '\n';
    for (const BenchRecord &r : records) {
        const std::vector<BenchField> fields = bench_record_fields(r);
        for (size_t k = 0; k < fields.size(); ++k) {
            if (k) out += ',';
            out += csv_quote(fields[k].value);
        }
        out += '\n';
    }
    return out;
}

std::string bench_format_markdown(const std::vector<BenchRecord> &records) {
    // Column name and width as llama-bench prints them: negative = left aligned.
    struct Column {
        const char *name;
        int width;
    };
    bool show_kv = false, show_pipeline = false, show_seqs = false;
    for (const BenchRecord &r : records) {
        show_kv |= r.type_k != "f16" || r.type_v != "f16";
        show_pipeline |= !r.pipeline.empty();
        show_seqs |= r.n_parallel > 1;
    }
    std::vector<Column> cols = {
        {"model", -30}, {"size", 10}, {"params", 10}, {"backend", -10}, {"threads", 7}};
    if (show_kv) {
        cols.push_back({"type_k", 6});
        cols.push_back({"type_v", 6});
    }
    if (show_pipeline) cols.push_back({"pipeline", -30});
    if (show_seqs) cols.push_back({"seqs", 4});
    cols.push_back({"test", 15});
    cols.push_back({"t/s", 20});

    std::string out = "|";
    for (const Column &c : cols) out += cell(c.name, c.width);
    out += "\n|";
    for (const Column &c : cols)
        out += fmt::format(" {}{} |", std::string(std::abs(c.width) - 1, '-'), c.width > 0 ? ":" : "-");
    out += '\n';
    uint64_t peak_rss = 0;
    for (const BenchRecord &r : records) {
        peak_rss = std::max(peak_rss, r.peak_rss_bytes);
        out += "|";
        for (const Column &c : cols) {
            std::string v;
            const std::string name = c.name;
            const int width = std::abs(c.width);
            if (name == "model") v = r.model_type;
            if (name == "size") v = human_size(r.model_size);
            if (name == "params") v = human_params(r.model_n_params);
            if (name == "backend") v = r.backends;
            if (name == "threads") v = std::to_string(r.n_threads);
            if (name == "type_k") v = r.type_k;
            if (name == "type_v") v = r.type_v;
            if (name == "pipeline") v = r.pipeline.empty() ? "local" : r.pipeline;
            if (name == "seqs") v = std::to_string(r.n_parallel);
            if (name == "test") v = r.test_name();
            if (name == "t/s") {
                // fmt pads by code points where llama-bench's printf pads bytes (and adds one for the
                // two-byte '±'): both give 20 columns.
                v = fmt::format("{:.2f} ± {:.2f}", r.avg_ts(), r.stddev_ts());
            }
            out += cell(v, c.width < 0 ? -width : width);
        }
        out += '\n';
    }
    const std::string commit = records.empty() ? std::string("unknown") : records.front().build_commit;
    const int64_t number = records.empty() ? 0 : records.front().build_number;
    out += fmt::format("\nbuild: {} ({})\n", commit, number);
    if (peak_rss > 0) out += fmt::format("peak RSS: {:.1f} MiB\n", peak_rss / 1024.0 / 1024.0);
    return out;
}

std::string bench_time_now() {
    char buf[64];
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    std::strftime(buf, sizeof(buf), "%FT%TZ", &tm);
    return buf;
}

std::string bench_cpu_info() {
    FILE *f = std::fopen("/proc/cpuinfo", "r");
    if (!f) return "";
    char line[512];
    std::string name;
    while (std::fgets(line, sizeof(line), f)) {
        if (std::strncmp(line, "model name", 10) != 0) continue;
        const char *colon = std::strchr(line, ':');
        if (!colon) continue;
        name = colon + 1;
        break;
    }
    std::fclose(f);
    while (!name.empty() && (name.front() == ' ' || name.front() == '\t')) name.erase(name.begin());
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return name;
}

}  // namespace td
