// One persistent pool of threads used by every op. No thread is created per op or per token.
//
// Waiting: a worker spins briefly (a few microseconds, with a pause instruction) and then sleeps on a
// futex (std::atomic::wait), so a pool on shared or oversubscribed cores degrades gracefully instead of
// burning the cores the other threads need. The calling thread always takes part as thread 0.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace td {

class ThreadPool {
public:
    // n_threads counts the caller; n_threads <= 0 means the number of hardware threads.
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int n_threads() const { return n_threads_; }

    // Runs fn(ith, nth) once on each of the nth threads and returns when all have returned.
    // Not reentrant: fn must not call run() or parallel_for() on the same pool.
    void run(const std::function<void(int ith, int nth)> &fn);

    // Calls fn(begin, end) over disjoint chunks covering [0, n). Chunks are claimed dynamically (guided: each
    // claim takes a share of what is left, so they shrink towards the end) so a thread that was descheduled
    // or runs slower does not stall the others. Each chunk has at least min_chunk items (except the last).
    // Which thread computes a chunk varies; results must not depend on it.
    void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)> &fn,
                      int64_t min_chunk = 1);

private:
    void worker_main(int ith);

    int n_threads_ = 1;
    std::vector<std::thread> workers_;
    const std::function<void(int, int)> *job_ = nullptr;
    std::atomic<uint32_t> generation_{0};
    std::atomic<int> pending_{0};
    std::atomic<bool> stop_{false};
};

}  // namespace td
