// What the transports that wait by spinning share (net/tcp.cpp, net/shm.cpp, net/ucx.cpp): a monotonic clock
// in ns, the CPU's spin-wait hint and a yield of the core.
#pragma once

#include <sched.h>

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

// Lets another thread that is ready to run on this core have it (sched_yield; returns at once when none is).
inline void spin_yield() {
#if defined(__unix__) || defined(__APPLE__)
    ::sched_yield();
#endif
}

// A spin-wait's yields: call with the time on every turn of the spin; yields the core once every 20 us of it.
// Where two ranks share a core, a receiver spinning 200 us without yielding holds the core while the peer it
// waits for cannot run: measured here, --tp 3 over workers pinned to cores 0, 1, 0 decoded 42 tokens/s
// without yields, 59-63 yielding every 10 or 30 us, 47-61 yielding on every turn (a syscall each time).
// On a core of its own the yield returns at once (~0.3 us per 20 us of spin).
class SpinYield {
public:
    static constexpr int64_t kEveryNs = 20000;
    void operator()(int64_t now) {
        if (next_ == 0) {
            next_ = now + kEveryNs;
        } else if (now >= next_) {
            spin_yield();
            next_ = now + kEveryNs;
        }
    }

private:
    int64_t next_ = 0;
};

}  // namespace td::net
