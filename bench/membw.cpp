// A plain memory read, to put memory-bound benchmark figures next to what the machine can stream at that
// minute: T threads, each summing its own buffer of MIB MiB (2 MiB pages where the kernel grants them), best
// of R passes. Prints one line: "threads T: X GB/s (per thread Y)".
//
//   membw [THREADS] [MIB per thread] [PASSES]      (defaults 1 256 5)
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

uint64_t sum_words(const uint64_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;  // four chains, so the adds are not what limits
    for (size_t i = 0; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    return a + b + c + d;
}

}  // namespace

int main(int argc, char **argv) {
    const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
    const size_t mib = argc > 2 ? static_cast<size_t>(std::atol(argv[2])) : 256;
    const int passes = argc > 3 ? std::atoi(argv[3]) : 5;
    if (threads < 1 || mib < 1 || passes < 1) {
        std::fprintf(stderr, "usage: membw [THREADS] [MIB per thread] [PASSES]\n");
        return 1;
    }
    const size_t bytes = mib << 20;
    std::vector<uint64_t *> bufs(threads);
    for (int t = 0; t < threads; ++t) {
        void *p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            std::perror("mmap");
            return 1;
        }
        (void)madvise(p, bytes, MADV_HUGEPAGE);
        bufs[t] = static_cast<uint64_t *>(p);
    }
    std::vector<uint64_t> sink(threads);
    double best = 0.0;
    for (int pass = 0; pass <= passes; ++pass) {  // pass 0 fills the buffers (first touch)
        std::vector<std::thread> ts;
        const auto t0 = std::chrono::steady_clock::now();
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t, pass] {
                if (pass == 0)
                    std::memset(bufs[t], t + 1, bytes);
                else
                    sink[t] += sum_words(bufs[t], bytes / sizeof(uint64_t));
            });
        for (auto &th : ts) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (pass > 0) best = std::max(best, static_cast<double>(bytes) * threads / s / 1e9);
    }
    uint64_t all = 0;
    for (uint64_t v : sink) all += v;
    std::printf("threads %d: %.1f GB/s (per thread %.1f)%s\n", threads, best, best / threads, all == 1 ? " " : "");
    return 0;
}
