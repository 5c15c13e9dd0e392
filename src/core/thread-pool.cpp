#include "core/thread-pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TD_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define TD_CPU_RELAX() __asm__ __volatile__("yield")
#else
#define TD_CPU_RELAX() ((void)0)
#endif

namespace td {
namespace {
// ~2k pause iterations is a few microseconds: long enough to catch the next op of the same token,
// short enough not to steal a shared core for long.
constexpr int kSpinIterations = 2048;
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
    if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    n_threads_ = n_threads;
    workers_.reserve(n_threads_ - 1);
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (auto &t : workers_) t.join();
}

void ThreadPool::worker_main(int ith) {
    uint32_t seen = 0;
    for (;;) {
        uint32_t gen = generation_.load(std::memory_order_acquire);
        for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
            TD_CPU_RELAX();
            gen = generation_.load(std::memory_order_acquire);
        }
        while (gen == seen) {
            generation_.wait(seen, std::memory_order_acquire);
            gen = generation_.load(std::memory_order_acquire);
        }
        seen = gen;
        if (stop_.load(std::memory_order_acquire)) return;
        (*job_)(ith, n_threads_);
        if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
}

void ThreadPool::run(const std::function<void(int, int)> &fn) {
    if (n_threads_ == 1) {
        fn(0, 1);
        return;
    }
    job_ = &fn;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    fn(0, n_threads_);
    int left = pending_.load(std::memory_order_acquire);
    for (int spin = 0; left != 0 && spin < kSpinIterations; ++spin) {
        TD_CPU_RELAX();
        left = pending_.load(std::memory_order_acquire);
    }
    while (left != 0) {
        pending_.wait(left, std::memory_order_acquire);
        left = pending_.load(std::memory_order_acquire);
    }
    job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)> &fn, int64_t min_chunk) {
    if (n <= 0) return;
    min_chunk = std::max<int64_t>(1, min_chunk);
    if (n_threads_ == 1 || n <= min_chunk) {
        fn(0, n);
        return;
    }
    // Guided self-scheduling: each claim takes a share of what is left (1 / (2 * threads) of it, at least
    // min_chunk), so chunks start large (few claims) and shrink towards the end. The threads then finish
    // within about one small chunk of each other, even when one of them runs slower (a shared or throttled
    // core); fixed-size chunks leave on average half a large chunk on one thread at the end of every call.
    const int64_t divisor = 2 * static_cast<int64_t>(n_threads_);
    std::atomic<int64_t> next{0};
    run([&](int, int) {
        int64_t begin = next.load(std::memory_order_relaxed);
        for (;;) {
            if (begin >= n) break;
            const int64_t end = std::min(n, begin + std::max(min_chunk, (n - begin) / divisor));
            if (next.compare_exchange_weak(begin, end, std::memory_order_relaxed)) {
                fn(begin, end);
                begin = next.load(std::memory_order_relaxed);
            }
        }
    });
}

}  // namespace td
