// UCX connections: the path to RDMA (RoCE, InfiniBand verbs), and to UCX's own shared-memory and TCP
// transports where a host has no RDMA NIC.
//
// After a TCP connection has authenticated, its server side may offer UCX: each side creates a UCX worker
// (one per connection, on one context per process), the two exchange worker addresses over the TCP connection
// (transport_offer / transport_ready), and each opens an endpoint to the other. A frame is then one tagged
// UCX message, the 32-byte header and the payload sent as one scatter-gather list straight from the caller's
// buffers (UCX registers them for zero-copy where the transport has it) and received straight into the
// header and the payload buffer, its length known before anything is allocated. A waiting side drives UCX's
// progress for set_recv_spin_us (none by default: no core burnt) and then sleeps on the worker's event fd.
// The TCP connection stays open beside it, carrying nothing: its closing is how a dead peer is found, as over
// shm.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "net/transport.h"

namespace td::net {

// Whether this build has UCX (libucx-dev found at configure time).
bool ucx_supported();
// Whether UCX may reach an RDMA device on this host (/sys/class/infiniband lists one): only then does "auto"
// prefer UCX to TCP between hosts.
bool ucx_has_rdma();

// One side's UCX worker before and while its connection runs. Created by ucx_prepare().
class UcxWorker {
public:
    virtual ~UcxWorker() = default;
    // This worker's address for the peer (opaque bytes, at most kMaxUcxAddress).
    virtual const std::string &address() const = 0;
    // Opens the endpoint to the peer's worker address. Once per worker.
    virtual Status link(const std::string &peer_address) = 0;
};

Result<std::unique_ptr<UcxWorker>> ucx_prepare();
// The connection over a linked worker; `control` (the TCP connection that set it up) stays open to watch the
// peer.
std::unique_ptr<Connection> ucx_connection(std::unique_ptr<UcxWorker> worker,
                                           std::unique_ptr<Connection> control);

}  // namespace td::net
