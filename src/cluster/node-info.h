// What a worker tells the head about itself when it joins: threads, memory, a measured speed.
#pragma once

#include <cstdint>
#include <string>

#include "core/thread-pool.h"

namespace td::cluster {

struct MemInfo {
    uint64_t total = 0;      // bytes; 0 when unknown
    uint64_t available = 0;  // bytes
};
// From /proc/meminfo (MemTotal, MemAvailable); zeros when it cannot be read.
MemInfo read_meminfo();

// "model name" from /proc/cpuinfo plus the kernel ISA in use, e.g. "AMD EPYC 7B13 (avx2)".
std::string cpu_description();
// The first "model name" of <root>/proc/cpuinfo ("" when there is none).
std::string cpu_model_name(const std::string &root = "/");

// GFLOP/s of a q4_0 matmul (the common weight type) on `pool`, measured for about `budget_ms`.
float measure_gflops(ThreadPool &pool, int budget_ms = 60);

// The build id both sides of a handshake print: "0.1.0+<git id>".
std::string build_id();

}  // namespace td::cluster
