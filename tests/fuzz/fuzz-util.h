// Shared by the libFuzzer targets. Each target is one file with TD_FUZZ_INIT (set-up, and its seeds) and
// TD_FUZZ_TARGET (one input). In the fuzz build they are libFuzzer's entry points; with TD_FUZZ_REPLAY (the
// ordinary test suite, tests/test-fuzz-replay.cpp) they get names of their own, so every seed and every
// input that once crashed (tests/fuzz/corpus/, tests/fuzz/regressions/) runs in each release and sanitizer
// test run. With $TD_FUZZ_WRITE_SEEDS set, TD_FUZZ_INIT writes the target's seeds (built with our own
// encoders) to that folder and exits: that is how tests/fuzz/corpus/ was made.
#pragma once

#include <cstddef>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#ifdef TD_FUZZ_REPLAY
#define TD_FUZZ_INIT(name) extern "C" int td_fuzz_init_##name(int *, char ***)
#define TD_FUZZ_TARGET(name) extern "C" int td_fuzz_one_##name(const uint8_t *data, size_t size)
#else
#define TD_FUZZ_INIT(name) extern "C" int LLVMFuzzerInitialize(int *, char ***)
#define TD_FUZZ_TARGET(name) extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
#endif

namespace td::fuzz {

using Bytes = std::vector<uint8_t>;

// With $TD_FUZZ_WRITE_SEEDS set: writes each seed to that folder (seed-0, seed-1, ...) and exits.
inline void write_seeds_and_exit_if_asked(const std::vector<Bytes> &seeds) {
    const char *dir = std::getenv("TD_FUZZ_WRITE_SEEDS");
    if (dir == nullptr || *dir == '\0') return;
    std::filesystem::create_directories(dir);
    for (size_t i = 0; i < seeds.size(); ++i) {
        std::ofstream out(std::string(dir) + "/seed-" + std::to_string(i), std::ios::binary);
        out.write(reinterpret_cast<const char *>(seeds[i].data()), static_cast<std::streamsize>(seeds[i].size()));
    }
    std::printf("wrote %zu seeds to %s\n", seeds.size(), dir);
    std::exit(0);
}

inline Bytes bytes_of(const std::string &s) {
    return Bytes(s.begin(), s.end());
}

}  // namespace td::fuzz
