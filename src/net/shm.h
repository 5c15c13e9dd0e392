// Shared-memory connections between two processes on one host.
//
// After a TCP connection has authenticated, its server side may offer a shared mapping (a memfd, opened by
// the client as /proc/<pid>/fd/<fd>, checked by a random token written in it). The mapping holds two
// single-producer / single-consumer byte rings, one per direction; frames are written into them exactly as
// they would go on a socket (header, then payload), so a frame larger than a ring streams through it. A
// sender copies once in, a receiver once out. A waiting receiver spins for set_recv_spin_us (none by default,
// as over TCP: a spinning thread steals the core of the compute it waits for) and then sleeps on a futex in
// the mapping, which the other side wakes only when someone sleeps.
//
// The TCP connection stays open beside the rings and carries nothing more: it is how each side learns that
// the other has gone (a killed process's socket closes), so a dead peer is found as fast as over TCP. The
// memfd has no name anywhere: when both processes have unmapped it (or died) the memory is gone.
#pragma once

#include <memory>

#include "core/status.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::net {

// Per direction. Small enough that a ring's lines stay in the caches the two cores share (a 4 MiB ring made
// an 8 KiB round trip 30% slower); a larger frame streams through it.
inline constexpr size_t kShmRingBytes = 256u << 10;

// Whether this build and host can map shared rings (Linux: memfd and futex).
bool shm_supported();
// Names this host's running kernel (its boot id): two nodes with the same identity may share memory.
std::string host_identity();

// A mapping of two rings. Unmapped (and its memfd closed) when destroyed.
class ShmRegion {
public:
    ~ShmRegion();
    ShmRegion(const ShmRegion &) = delete;
    ShmRegion &operator=(const ShmRegion &) = delete;
    uint8_t *base() const { return base_; }
    size_t bytes() const { return bytes_; }
    size_t ring_bytes() const { return ring_bytes_; }
    void close_fd();  // the server's memfd, once the client holds its own mapping

private:
    ShmRegion() = default;
    friend struct ShmAccess;
    uint8_t *base_ = nullptr;
    size_t bytes_ = 0, ring_bytes_ = 0;
    int fd_ = -1;
};

// The server's half before the client attached: the mapping and the offer to send.
struct ShmPending {
    std::unique_ptr<ShmRegion> region;
    ShmOffer offer;
};
// Creates a mapping with two rings of ring_bytes (a power of two) each.
Result<ShmPending> shm_create(size_t ring_bytes = kShmRingBytes);
// The client's half: opens the server's memfd and checks the token and the sizes.
Result<std::unique_ptr<ShmRegion>> shm_attach(const ShmOffer &offer);
// The connection over an attached region; `control` (the TCP connection that set it up) stays open to watch
// the peer. server: the side that created the region.
std::unique_ptr<Connection> shm_connection(std::unique_ptr<ShmRegion> region,
                                           std::unique_ptr<Connection> control, bool server);

}  // namespace td::net
