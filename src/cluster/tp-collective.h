// The Collective of a tensor-parallel stage, over the peer links of its group (net/ connections).
//
// Every pair of ranks shares one connection (the lower rank dials the higher one's worker when it loads,
// with a peer Hello naming the group). Each link has a receiving thread that drains it into a small queue
// of reusable frames, so a rank's sends never wait on a peer that is itself sending; the computing thread
// sends directly (no hand-off on the way out) and blocks, without spinning, until the parts it needs arrive.
//
// all_reduce_sum, by size:
//   direct (2 ranks, or a message of at most kDirectMaxBytes): every rank sends its whole partial to every
//     other rank; one message per peer, one network latency.
//   reduce-scatter + all-gather (3+ ranks, larger messages): rank r owns chunk r of the vector; it receives
//     the others' partials of chunk r, sums them, and sends the sum to everyone: 2 (N-1)/N of the bytes of
//     direct's N-1, in two latencies.
// Both add every element as ((p0 + p1) + p2) + ... in rank order, so they give the same bits, and every rank
// ends with the same vector.
//
// Failure: a peer that closes or resets its link fails the collective at once, naming it; a peer that sends
// nothing for timeout_ms fails it too (the head's heartbeats normally notice a stalled node first and drop the
// stage, which closes the links and wakes the waits).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/frame-queue.h"
#include "model/collective.h"
#include "net/transport.h"

namespace td::cluster {

class PeerCollective : public Collective {
public:
    // peer_names: [size] the ranks' worker addresses, for messages. timeout_ms: the longest wait for a peer's
    // part (also for its link to be attached).
    PeerCollective(int rank, int size, std::vector<std::string> peer_names, int timeout_ms = 30000);
    ~PeerCollective() override;

    // Hands over the link to `peer` (dialed or accepted, Hello exchanged) and starts its receiver. Errors:
    // a rank out of range, our own rank, a link already attached, or the collective closed.
    Status attach(int peer, std::unique_ptr<net::Connection> conn);
    // Closes every link; a wait in progress and every later call fail. Idempotent, thread-safe.
    void close();

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    Status all_reduce_sum(float *data, size_t n) override;
    Status gather(std::span<const uint8_t> mine, std::vector<std::vector<uint8_t>> &out) override;

    static constexpr size_t kDirectMaxBytes = 64 * 1024;

    struct Stats {
        uint64_t all_reduces = 0, gathers = 0, bytes_out = 0, bytes_in = 0;
        double wait_seconds = 0.0;
    };
    Stats stats() const;

private:
    struct Peer {
        std::unique_ptr<net::Connection> conn;
        std::unique_ptr<FrameQueue> queue;
        std::thread thread;
        Status error;  // why the receiver stopped (under mu_)
    };
    void recv_loop(int peer);
    Status send_to(int peer, net::MsgType type, uint64_t id, uint32_t flags, const void *data, size_t bytes);
    // The next frame from `peer`, which must be (type, id, flags) with `bytes` of payload; release it after.
    Result<Frame *> take(int peer, net::MsgType type, uint64_t id, uint32_t flags, size_t bytes);
    Status peer_failed(int peer, const std::string &what);

    const int rank_, size_;
    const std::vector<std::string> names_;
    const int timeout_ms_;
    mutable std::mutex mu_;
    std::condition_variable attached_cv_;
    std::vector<Peer> peers_;  // [size]; peers_[rank_] unused
    bool closed_ = false;
    uint64_t next_id_ = 1;  // collective calls so far + 1 (every rank counts the same)

    // Scratch (the computing thread only): the peers' parts as floats.
    std::vector<std::vector<float>> parts_;  // [size]
    std::vector<const float *> ptrs_;        // [size]

    std::atomic<uint64_t> n_all_reduce_{0}, n_gather_{0}, bytes_out_{0}, bytes_in_{0}, wait_ns_{0};
};

}  // namespace td::cluster
