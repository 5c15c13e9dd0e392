// What the transports that wait by spinning share (net/shm.cpp, net/ucx.cpp): a monotonic clock in ns and the
// CPU's spin-wait hint.
#pragma once

#include <chrono>
#include <cstdint>

namespace td::net {

inline int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Tells the core this thread spins (pause / yield), so its sibling hyper-thread gets the pipeline meanwhile.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

}  // namespace td::net
