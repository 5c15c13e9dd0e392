// A bounded hand-off of received frames between a receiving thread and a computing thread. The frames are
// a fixed set of reusable buffers (their capacity grows to the largest message and stays), so the data path
// allocates nothing per message in steady state; when all are in use the receiver waits (backpressure).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "net/protocol.h"

namespace td::cluster {

struct Frame {
    net::FrameHeader header;
    std::vector<uint8_t> payload;
};

class FrameQueue {
public:
    explicit FrameQueue(size_t n_frames) : frames_(n_frames) {
        for (Frame &f : frames_) free_.push_back(&f);
    }

    // Producer: a free frame to fill; nullptr once closed.
    Frame *acquire() {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !free_.empty(); });
        if (closed_) return nullptr;
        Frame *f = free_.back();
        free_.pop_back();
        return f;
    }
    void push(Frame *f) {
        std::lock_guard lock(mu_);
        ready_.push_back(f);
        cv_.notify_all();
    }
    // Consumer: the oldest filled frame; nullptr once closed.
    Frame *pop() {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return closed_ || !ready_.empty(); });
        if (closed_) return nullptr;
        Frame *f = ready_.front();
        ready_.pop_front();
        return f;
    }
    // Same with a limit: nullptr and *timed_out = true when nothing arrived within timeout_ms.
    Frame *pop_for(int timeout_ms, bool *timed_out) {
        std::unique_lock lock(mu_);
        *timed_out = !cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                   [&] { return closed_ || !ready_.empty(); });
        if (closed_ || *timed_out) return nullptr;
        Frame *f = ready_.front();
        ready_.pop_front();
        return f;
    }
    void release(Frame *f) {
        std::lock_guard lock(mu_);
        free_.push_back(f);
        cv_.notify_all();
    }
    void close() {
        std::lock_guard lock(mu_);
        closed_ = true;
        cv_.notify_all();
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Frame> frames_;
    std::vector<Frame *> free_;
    std::deque<Frame *> ready_;
    bool closed_ = false;
};

}  // namespace td::cluster
