// The Collective of a tensor-parallel stage, over the peer links of its group (net/ connections).
//
// Every pair of ranks shares one connection (the lower rank dials the higher one's worker when it loads,
// with a peer Hello naming the group). The computing thread does the I/O itself, with no hand-off to another
// thread either way: it sends small parts directly (they fit any socket buffer, so two ranks sending each
// other at once never wait on each other) and large ones through a sender thread per link (so it can
// receive meanwhile); it receives by busy-polling the socket for up to kSpinUs, then sleeping in poll().
// The spin is what makes a collective cost a network latency rather than a wake-up from sleep (tens of
// microseconds on a virtual machine); it only runs while this rank has nothing to compute, is bounded, and
// stops for a while when it keeps missing (a peer slower than the spin, or one sharing our core).
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
#include <vector>

#include "cluster/frame-queue.h"
#include "model/collective.h"
#include "net/transport.h"

namespace td::cluster {

class PeerCollective : public Collective {
public:
    // peer_names: [size] the ranks' worker addresses, for messages. reduce: what the parts travel as (f16 /
    // bf16 halve the bytes; every rank rounds its own part the same way, so the ranks still agree bit for
    // bit). timeout_ms: the longest wait for a peer's part (also for its link to be attached).
    PeerCollective(int rank, int size, std::vector<std::string> peer_names,
                   net::ReduceType reduce = net::ReduceType::f32, int timeout_ms = 30000);
    ~PeerCollective() override;

    // Hands over the link to `peer` (dialed or accepted, Hello exchanged) and starts its receiver. Errors:
    // a rank out of range, our own rank, a link already attached, or the collective closed.
    Status attach(int peer, std::unique_ptr<net::Connection> conn);
    // Closes every link; a wait in progress and every later call fail. Idempotent, thread-safe.
    void close();
    // Gives back the link to `peer` (what is queued to it written first; a frame lent from it released), for
    // its owner to go on using once the collective's calls on it are done (the computing thread, between
    // calls). nullptr where none is attached. The collective is closed after it (close()), its other links
    // too.
    std::unique_ptr<net::Connection> detach(int peer);

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    Status all_reduce_sum(float *data, size_t n) override;
    Status gather(std::span<const uint8_t> mine, std::vector<std::vector<uint8_t>> &out) override;

    static constexpr size_t kDirectMaxBytes = 64 * 1024;
    // Larger parts go through the sender thread. An inline send must never wait for its peer to read (the peer
    // may be sending to us at the same moment): a rank has at most two parts in flight per link (it can be one
    // collective ahead), and 2 x 64 KiB fits any socket's buffer (Linux's default is 208 KiB, AF_UNIX too).
    static constexpr size_t kInlineSendMaxBytes = 64 * 1024;
    static constexpr int kSpinUs = 200;

    struct Stats {
        uint64_t all_reduces = 0, gathers = 0, bytes_out = 0, bytes_in = 0;
        double wait_seconds = 0.0;
    };
    Stats stats() const;
    // The transport of each attached link, in rank order ("shm shm"; "-" for a link not attached yet).
    std::string links() const;

private:
    struct Peer {
        std::unique_ptr<net::Connection> conn;
        std::unique_ptr<net::AsyncSender> sender;  // large parts
        bool sender_used = false;                  // computing thread only: flush before the next direct send
        Frame frame;  // the last frame received, unless lent in place (computing thread only)
        std::span<const uint8_t> got;  // that frame's payload: in frame.payload or in the link's ring
        // Adaptive spin (computing thread only): after kSpinMisses receives in a row that outlasted the spin,
        // the peer is slower than the spin (or shares our core), so the next kSpinRest receives sleep at once.
        int spin_misses = 0, spin_rest = 0;
    };
    static constexpr int kSpinMisses = 8, kSpinRest = 64;
    // The peer's link, once attached (waits up to timeout_ms). nullptr with *error set otherwise.
    Peer *linked(int peer, Status *error);
    Status send_to(int peer, net::MsgType type, uint64_t id, uint32_t flags, const void *data, size_t bytes);
    // Receives the next frame from `peer` (Peer::got: lent in place where the link can, see
    // Connection::recv_view; release() gives it back); it must be (type, id, flags) with `bytes` of payload
    // (kAnyBytes: any).
    Result<std::span<const uint8_t>> take(int peer, net::MsgType type, uint64_t id, uint32_t flags,
                                          size_t bytes);
    void release(int peer);
    void release_all();
    Status peer_failed(int peer, const Status &why);
    Status flush_senders();

    // The bytes of data[0, n) as they travel (data itself for f32, else wire_ filled); rounds data in place to
    // what the receivers will see.
    std::span<const uint8_t> encode(float *data, size_t n);
    Status receive_floats(int peer, uint64_t id, uint32_t phase, float *dst, size_t n);
    // A peer's part of n floats for a sum: read where it arrived when it travels as aligned f32 (held until
    // release), else decoded into parts_[peer].
    Result<const float *> receive_part(int peer, uint64_t id, uint32_t phase, size_t n);
    // out = ((p0 + p1) + p2) + ... over ptrs_[r] (out holds this rank's part on entry).
    void sum_in_rank_order(float *out, size_t count);

    const int rank_, size_;
    const std::vector<std::string> names_;
    const net::ReduceType reduce_;
    const int timeout_ms_;
    mutable std::mutex mu_;
    std::condition_variable attached_cv_;
    std::vector<Peer> peers_;  // [size]; peers_[rank_] unused
    bool closed_ = false;
    uint64_t next_id_ = 1;  // collective calls so far + 1 (every rank counts the same)

    // Scratch (the computing thread only): the peers' parts as floats where they cannot be read in place, and
    // where each part is for the sum.
    std::vector<std::vector<float>> parts_;  // [size]
    std::vector<const float *> ptrs_;        // [size]
    std::vector<uint16_t> wire_;             // an f16 / bf16 part

    std::atomic<uint64_t> n_all_reduce_{0}, n_gather_{0}, bytes_out_{0}, bytes_in_{0}, wait_ns_{0};
};

}  // namespace td::cluster
