// Measurements of nodes and links, as netbench and plan take them: a probe connection to a worker (protocol
// version 3, ConnRole::probe) that never touches the worker's stage or its head.
//
//   ProbeClient   the head's (or a worker's) side: echo round trips and streams, compute probes, and asking
//                 a worker to measure its own link to another worker.
//   run_*         the worker's side of each request.
//
// Round trips: each size is echoed back and forth for about budget_ms (at least kMinRounds times); the
// percentiles are of those round trips. Streams: messages of one size go back to back with kEchoSink (the
// worker acknowledges each with 8 bytes), so the rate is the link's one-way throughput.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/mmap.h"
#include "core/status.h"
#include "core/thread-pool.h"
#include "net/auth.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::cluster {

inline constexpr int kMinRounds = 8;

struct LinkOptions {
    std::vector<uint64_t> rtt_sizes;     // round-trip sizes; empty: none
    std::vector<uint64_t> stream_sizes;  // stream sizes; empty: none
    int budget_ms = 100;                 // per size
    uint32_t transports = net::kTransportsTcp;  // link_to: what the worker's link to the target may take
};
// 64 B, 256 B ... 64 KiB round trips; 1, 4, 16, 64 MiB streams.
LinkOptions default_link_options();

class ProbeClient {
public:
    // Connects with a probe Hello and checks the protocol version (errors as the head's handshake words them:
    // "worker 10.0.0.2:9000 speaks protocol 2, this build speaks 3"; unreachable is disconnected).
    // transports: what the probe link may take (net::transport_bit()s; TCP by default, as the plan's links).
    static Result<std::unique_ptr<ProbeClient>> connect(const std::string &address,
                                                        const net::ClusterSecret &secret,
                                                        int timeout_ms = 3000,
                                                        uint32_t transports = net::kTransportsTcp);

    const net::HelloReply &hello() const { return hello_; }
    net::Transport transport() const { return conn_->transport(); }
    const std::string &address() const { return address_; }
    std::string local_address() const { return conn_->local(); }  // this end, as the worker sees it
    double connect_seconds() const { return connect_seconds_; }

    // Round trips and streams of every size in `options`, in that order.
    Result<std::vector<net::LinkSample>> measure_link(const LinkOptions &options);
    // The worker times the matrices (ProbeCompute); the reply has matrices x rows timings.
    Result<net::ProbeComputeReply> compute(const net::ProbeCompute &request);
    // The worker measures its link to `target` ("host:port" of another worker) with `options`.
    Result<std::vector<net::LinkSample>> link_to(const std::string &target, const LinkOptions &options);
    // The worker runs `request` in lock step with request.peer (net::ProbeSync): both ranks' figures, this
    // worker's first. Errors: no peer named, the peer unreachable, a rank's probe failing.
    Result<net::ProbeSyncReply> sync(const net::ProbeSync &request);
    // The connection, for its new owner to go on with (a worker leading a lock-step probe); the client is
    // unusable after.
    std::unique_ptr<net::Connection> take_connection() { return std::move(conn_); }

private:
    ProbeClient() = default;
    Result<net::LinkSample> round_trips(uint64_t bytes, int budget_ms);
    Result<net::LinkSample> stream(uint64_t bytes, int budget_ms);

    std::unique_ptr<net::Connection> conn_;
    net::HelloReply hello_;
    std::string address_;
    double connect_seconds_ = 0.0;
    uint64_t next_id_ = 1;
};

// Seconds per message: half the median 64-byte-ish round trip (the smallest measured), and the stream rate of
// the largest stream (bytes/s); both 0 where not measured.
double link_latency_seconds(const std::vector<net::LinkSample> &samples);
double link_bytes_per_second(const std::vector<net::LinkSample> &samples);

// ---- the worker's side -------------------------------------------------------------------------------

// The memory a probe connection's compute probes read, kept while it lasts. Fresh pages for every request
// cost the kernel's zeroing at first touch, and in a VM whose host has taken free pages back that took
// 0.6-5 s per request here (60% of the workers' time in clear_page), at random: two nodes' timed windows
// then missed each other.
class ProbeArena {
public:
    // `bytes` in 2 MiB pages for one use (`slot` < kSlots; contents undefined): the same memory as the last
    // call for the slot when it fits. Errors: overloaded (HugeBuffer::allocate).
    Result<uint8_t *> get(size_t slot, size_t bytes);
    static constexpr size_t kSlots = 3;

private:
    std::array<HugeBuffer, kSlots> buffers_;
};

// Bytes per second of a plain read of `bytes` (split over the pool's threads, each summing its part), best of
// `passes` after one pass that faults the pages in (in `arena`'s slot 0 where given).
double measure_read_bytes_per_second(ThreadPool &pool, size_t bytes, int passes = 3,
                                     ProbeArena *arena = nullptr);

// What a compute probe cycles through when the request says 0: 4 x the last-level cache, at least 64 MiB.
size_t default_probe_working_set();

// Runs a ProbeCompute (already validated by the codec). Errors: a matrix type without kernels, n_in not a
// multiple of the block size, a matrix larger than kMaxProbeMatrixBytes (invalid_input).
// Its memory comes from `arena` where given (a probe connection's), else is mapped for this request.
Result<net::ProbeComputeReply> run_compute_probe(const net::ProbeCompute &request, ThreadPool &pool,
                                                 ProbeArena *arena = nullptr);

// The acceptor's side of a probe connection's handshake (cluster/handshake.h, then a hello_reply naming
// `name`), for a listener that is not a worker (plan's head end). Errors: a peer without the secret, another
// role or protocol version.
// Returns the connection to serve: the same one, or shared memory when the prober allows it (`transports`)
// and shares this host.
Result<std::unique_ptr<net::Connection>> accept_probe(std::unique_ptr<net::Connection> conn,
                                                      const std::string &name,
                                                      const net::ClusterSecret &secret, uint32_t transports);

// Serves one probe connection (after its handshake) until the peer closes it: echo, probe_compute (on a pool
// of the request's threads, default_threads when it says 0), probe_link and probe_sync with a peer (which
// dial the named node with `secret`, so they reach only the cluster's own members). A probe_sync without a
// peer (rank 1 of a lock-step probe) lends `conn` to the probe's collective for its length; it is back in
// `conn` after (the object is the same one throughout).
void serve_probe(std::unique_ptr<net::Connection> &conn, int default_threads,
                 const net::ClusterSecret &secret);

}  // namespace td::cluster
