#include "cluster/node-info.h"

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <random>
#include <vector>

#include "core/build-id.h"
#include "kernels/kernels.h"
#include "tensor/tensor.h"

namespace td::cluster {

MemInfo read_meminfo() {
    MemInfo m;
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kb = 0;
    std::string unit;
    while (in >> key >> kb) {
        std::getline(in, unit);
        if (key == "MemTotal:") m.total = kb * 1024;
        if (key == "MemAvailable:") m.available = kb * 1024;
    }
    return m;
}

std::string cpu_model_name(const std::string &root) {
    std::ifstream in(root + "/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line))
        if (line.compare(0, 10, "model name") == 0) {
            const size_t colon = line.find(':');
            return colon != std::string::npos && colon + 2 <= line.size() ? line.substr(colon + 2) : "";
        }
    return "";
}

std::string cpu_description() {
    std::string name = cpu_model_name();
    if (name.empty()) name = "unknown cpu";
    return fmt::format("{} ({})", name, kernels::isa_name(kernels::isa_active()));
}

float measure_gflops(ThreadPool &pool, int budget_ms) {
    // w: [n_out rows of n_in] q4_0, x: [n_tok, n_in], y: [n_tok, n_out]: one decode-like step of a 1B model.
    constexpr int64_t n_in = 1024, n_out = 1024, n_tok = 4;
    const kernels::TypeKernels *q4 = kernels::type_kernels(DType::q4_0);
    if (q4 == nullptr) return 0.0f;
    std::vector<float> src(static_cast<size_t>(n_in));
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const size_t row_bytes = dtype_row_bytes(DType::q4_0, n_in);
    std::vector<uint8_t> w_bytes(row_bytes * n_out);
    for (int64_t r = 0; r < n_out; ++r) {
        for (auto &v : src) v = dist(rng);
        q4->from_float(src.data(), w_bytes.data() + r * row_bytes, n_in);
    }
    std::vector<float> x(static_cast<size_t>(n_tok * n_in)), y(static_cast<size_t>(n_tok * n_out));
    for (auto &v : x) v = dist(rng);
    TensorView w;
    w.name = "gflops";
    w.type = DType::q4_0;
    w.n_dims = 2;
    w.ne[0] = n_in;
    w.ne[1] = n_out;
    w.data = w_bytes.data();
    std::vector<uint8_t> scratch;
    using clock = std::chrono::steady_clock;
    kernels::matmul(w, x.data(), y.data(), n_tok, pool, scratch);  // warm up
    const auto t0 = clock::now();
    int64_t runs = 0;
    double seconds = 0.0;
    do {
        kernels::matmul(w, x.data(), y.data(), n_tok, pool, scratch);
        ++runs;
        seconds = std::chrono::duration<double>(clock::now() - t0).count();
    } while (seconds * 1000.0 < budget_ms);
    return static_cast<float>(2.0 * n_in * n_out * n_tok * static_cast<double>(runs) / seconds / 1e9);
}

std::string build_id() {
    return fmt::format("{}+{}", TD_VERSION, build_git_id());
}

}  // namespace td::cluster
