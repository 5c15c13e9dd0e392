// The opening of every connection between nodes: Hello, mutual proof of the cluster secret, HelloReply
// (net/protocol.h, docs/protocol.md "Authentication"). Control, data, peer and probe connections all go
// through these two functions, so no role can skip it.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "net/auth.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::cluster {

inline constexpr int kHandshakeTimeoutMs = 5000;              // the whole handshake, either side
inline constexpr uint64_t kHandshakeRecvLimit = 64u << 10;    // largest frame a peer may send before it proved itself

// Client side: sends `hello` (with a fresh nonce), checks the server's proof, sends ours and returns the
// server's HelloReply. Errors name `peer_name`: another protocol version (both numbers), a server holding
// another secret (invalid_input: retrying will not help), a timeout or a closed connection.
Result<net::HelloReply> handshake_connect(net::Connection &conn, net::Hello hello, const net::ClusterSecret &secret,
                                          const std::string &peer_name, int timeout_ms = kHandshakeTimeoutMs);

// Server side: receives the Hello, proves this node and checks the client's proof. Returns the client's Hello;
// the caller then answers with its HelloReply (or an error). A client of another protocol version gets a
// HelloReply with only our version, build id and `node_name`; one that fails the proof gets "authentication
// failed" and nothing else. Until the proofs hold, frames over kHandshakeRecvLimit are refused unread.
Result<net::Hello> handshake_accept(net::Connection &conn, const net::ClusterSecret &secret,
                                    const std::string &node_name, int timeout_ms = kHandshakeTimeoutMs);

// The transport a connection continues over once both proofs hold: shm when both ends allow it, the client
// names this host (Hello.host_id) and this build has it; else ucx when both allow it and this build has it;
// else TCP.
net::Transport choose_transport(const net::Hello &hello, uint32_t server_allows);

// Server side, after handshake_accept: chooses the transport (reply.transport), sends the HelloReply and, for
// shm, offers the shared rings (ucx: this side's worker address) and waits for the client to attach. Returns
// the connection to go on with: the shm or ucx one, or the TCP one when it could not be set up on either end
// (both then stay on TCP; the reason is logged).
Result<std::unique_ptr<net::Connection>> answer_hello(std::unique_ptr<net::Connection> conn,
                                                      const net::Hello &hello, net::HelloReply reply,
                                                      uint32_t server_allows,
                                                      int timeout_ms = kHandshakeTimeoutMs);

// Client side, after handshake_connect: attaches to the transport the reply names (TCP: the same connection).
Result<std::unique_ptr<net::Connection>> follow_transport(std::unique_ptr<net::Connection> conn,
                                                          const net::HelloReply &reply,
                                                          const std::string &peer_name,
                                                          int timeout_ms = kHandshakeTimeoutMs);

struct Dialed {
    std::unique_ptr<net::Connection> conn;
    net::HelloReply reply;
};
// tcp_connect to "host:port", handshake_connect and follow_transport. hello.transports says which transports
// this end allows (host_id is filled in here). An unreachable address is disconnected ("cannot reach worker
// ADDR: ...").
Result<Dialed> dial_node(const std::string &address, const net::Hello &hello, const net::ClusterSecret &secret,
                         int connect_timeout_ms);

}  // namespace td::cluster
