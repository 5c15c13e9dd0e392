#include "cluster/handshake.h"

#include <algorithm>
#include <chrono>

#include "cluster/node-info.h"
#include "cluster/wire.h"
#include "core/log.h"
#include "net/codec.h"
#include "net/shm.h"
#include "net/ucx.h"

namespace td::cluster {
namespace {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return static_cast<int>(std::max<int64_t>(left, 1));
}

std::string prefix(const std::string &peer_name) {
    return peer_name.empty() ? "" : peer_name + ": ";
}

Status version_mismatch(const std::string &peer_name, const net::HelloReply &reply) {
    return invalid_input("{} speaks protocol {}, this build speaks {} (its build: {}, ours: {})",
                         peer_name.empty() ? "the peer" : peer_name, reply.protocol_version, net::kProtocolVersion,
                         reply.build_id, build_id());
}

}  // namespace

Result<net::HelloReply> handshake_connect(net::Connection &conn, net::Hello hello, const net::ClusterSecret &secret,
                                          const std::string &peer_name, int timeout_ms) {
    if (secret.empty()) return invalid_input("{}no cluster secret to authenticate with", prefix(peer_name));
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    hello.nonce = net::make_nonce();
    std::vector<uint8_t> transcript;  // the Hello's payload: what both proofs cover
    net::encode(hello, transcript);
    TD_TRY(conn.send_msg(net::MsgType::hello, 0, transcript, ms_left(deadline)).with_context(peer_name));
    net::FrameHeader h;
    std::vector<uint8_t> payload;
    TD_TRY(recv_frame(conn, h, payload, ms_left(deadline), peer_name));
    if (h.type == static_cast<uint16_t>(net::MsgType::hello_reply)) {
        TD_ASSIGN_OR_RETURN(net::HelloReply reply, net::decode_hello_reply(payload));
        if (reply.protocol_version != net::kProtocolVersion) return version_mismatch(peer_name, reply);
        return invalid_input("{}answered without authenticating", prefix(peer_name));
    }
    if (h.type != static_cast<uint16_t>(net::MsgType::auth_challenge))
        return invalid_input("{}expected an auth_challenge message, got {}", prefix(peer_name),
                             net::msg_type_name(static_cast<net::MsgType>(h.type)));
    TD_ASSIGN_OR_RETURN(net::AuthChallenge challenge, net::decode_auth_challenge(payload));
    if (!secret.verify(net::AuthSide::server, transcript, challenge.nonce, challenge.proof)) {
        send_error(conn, invalid_input("authentication failed: your proof does not match this node's cluster secret"));
        return invalid_input(
            "{}authentication failed: it holds a different cluster secret (every node needs the same file: "
            "--secret-file, default {})",
            prefix(peer_name), net::default_secret_path());
    }
    net::AuthProof proof;
    proof.proof = secret.prove(net::AuthSide::client, transcript, challenge.nonce);
    TD_TRY(send_control(conn, net::MsgType::auth_proof, proof, 0, ms_left(deadline)).with_context(peer_name));
    TD_TRY(recv_expect(conn, net::MsgType::hello_reply, payload, ms_left(deadline), peer_name));
    TD_ASSIGN_OR_RETURN(net::HelloReply reply, net::decode_hello_reply(payload));
    if (reply.protocol_version != net::kProtocolVersion) return version_mismatch(peer_name, reply);
    return reply;
}

Result<net::Hello> handshake_accept(net::Connection &conn, const net::ClusterSecret &secret,
                                    const std::string &node_name, int timeout_ms) {
    const std::string peer = conn.peer();
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    conn.set_recv_limit(kHandshakeRecvLimit);
    std::vector<uint8_t> transcript;
    TD_TRY(recv_expect(conn, net::MsgType::hello, transcript, ms_left(deadline), peer));
    auto hello = net::decode_hello(transcript);
    if (!hello.ok()) {
        send_error(conn, hello.status());
        return hello.status().with_context(peer);
    }
    if (hello->protocol_version != net::kProtocolVersion) {
        net::HelloReply r;  // only what names the mismatch
        r.build_id = build_id();
        r.node_name = node_name;
        (void)send_control(conn, net::MsgType::hello_reply, r, 0, ms_left(deadline));
        return invalid_input("{} speaks protocol {} (build {}), this node speaks {}", peer, hello->protocol_version,
                             hello->build_id, net::kProtocolVersion);
    }
    if (secret.empty()) {
        send_error(conn, invalid_input("authentication failed"));
        return invalid_input("{}: refused: this node has no cluster secret", peer);
    }
    net::AuthChallenge challenge;
    challenge.nonce = net::make_nonce();
    challenge.proof = secret.prove(net::AuthSide::server, transcript, challenge.nonce);
    TD_TRY(send_control(conn, net::MsgType::auth_challenge, challenge, 0, ms_left(deadline)).with_context(peer));
    std::vector<uint8_t> payload;
    Status s = recv_expect(conn, net::MsgType::auth_proof, payload, ms_left(deadline), peer);
    if (!s.ok()) {
        // The client checks our proof first: one holding another secret says so instead of proving itself.
        return Status(s.kind(), fmt::format("authentication failed for {} (role {}): {}", peer,
                                            static_cast<uint32_t>(hello->role), s.message()));
    }
    auto proof = net::decode_auth_proof(payload);
    if (!proof.ok() || !secret.verify(net::AuthSide::client, transcript, challenge.nonce, proof->proof)) {
        send_error(conn, invalid_input("authentication failed"));
        return invalid_input("authentication failed for {} (role {}): its proof does not match this node's cluster "
                             "secret (a different secret, or a replayed handshake)",
                             peer, static_cast<uint32_t>(hello->role));
    }
    conn.set_recv_limit(UINT64_MAX);
    return std::move(hello).value();
}

net::Transport choose_transport(const net::Hello &hello, uint32_t server_allows) {
    const uint32_t both = hello.transports & server_allows;
    if ((both & net::transport_bit(net::Transport::shm)) != 0 && net::shm_supported() &&
        !hello.host_id.empty() && hello.host_id == net::host_identity())
        return net::Transport::shm;
    if ((both & net::transport_bit(net::Transport::ucx)) != 0 && net::ucx_supported())
        return net::Transport::ucx;
    return net::Transport::tcp;
}

Result<std::unique_ptr<net::Connection>> answer_hello(std::unique_ptr<net::Connection> conn,
                                                      const net::Hello &hello, net::HelloReply reply,
                                                      uint32_t server_allows, int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    const std::string peer = conn->peer();
    Result<net::ShmPending> shm = make_error(ErrorKind::failed, "not chosen");
    Result<std::unique_ptr<net::UcxWorker>> ucx = make_error(ErrorKind::failed, "not chosen");
    const net::Transport chosen = choose_transport(hello, server_allows);
    if (chosen == net::Transport::shm) {
        shm = net::shm_create();
        if (shm.ok())
            reply.transport = static_cast<uint32_t>(net::Transport::shm);
        else
            log_warn("{}: shared memory unavailable, staying on TCP: {}", peer, shm.status().message());
    } else if (chosen == net::Transport::ucx) {
        ucx = net::ucx_prepare();
        if (ucx.ok())
            reply.transport = static_cast<uint32_t>(net::Transport::ucx);
        else
            log_warn("{}: UCX unavailable, staying on TCP: {}", peer, ucx.status().message());
    }
    TD_TRY(send_control(*conn, net::MsgType::hello_reply, reply, 0, ms_left(deadline)).with_context(peer));
    if (reply.transport == static_cast<uint32_t>(net::Transport::tcp)) return conn;
    net::TransportOffer offer;
    offer.transport = reply.transport;
    if (shm.ok()) offer.shm = shm->offer;
    if (ucx.ok()) offer.ucx_address = (*ucx)->address();
    TD_TRY(
        send_control(*conn, net::MsgType::transport_offer, offer, 0, ms_left(deadline)).with_context(peer));
    std::vector<uint8_t> payload;
    TD_TRY(recv_expect(*conn, net::MsgType::transport_ready, payload, ms_left(deadline), peer));
    TD_ASSIGN_OR_RETURN(net::TransportReady ready, net::decode_transport_ready(payload));
    if (ready.ok == 0) {
        log_warn("{} could not attach to {}, staying on TCP: {}", peer,
                 net::transport_name(static_cast<net::Transport>(reply.transport)), ready.reason);
        return conn;
    }
    if (ucx.ok()) {
        // The client already sends over UCX: an endpoint we cannot open back loses the connection.
        TD_TRY((*ucx)->link(ready.ucx_address).with_context(peer));
        return net::ucx_connection(std::move(ucx).value(), std::move(conn));
    }
    shm->region
        ->close_fd();  // the client holds its own mapping now; the memory lives as long as the mappings
    return net::shm_connection(std::move(shm->region), std::move(conn), true);
}

Result<std::unique_ptr<net::Connection>> follow_transport(std::unique_ptr<net::Connection> conn,
                                                          const net::HelloReply &reply,
                                                          const std::string &peer_name, int timeout_ms) {
    if (reply.transport == static_cast<uint32_t>(net::Transport::tcp)) return conn;
    std::vector<uint8_t> payload;
    TD_TRY(recv_expect(*conn, net::MsgType::transport_offer, payload, timeout_ms, peer_name));
    TD_ASSIGN_OR_RETURN(net::TransportOffer offer, net::decode_transport_offer(payload));
    if (offer.transport != reply.transport)
        return invalid_input("{}offered transport {} after choosing {}", prefix(peer_name), offer.transport,
                             reply.transport);
    if (offer.transport == static_cast<uint32_t>(net::Transport::ucx)) {
        auto w = net::ucx_prepare();
        if (w.ok()) {
            if (Status s = (*w)->link(offer.ucx_address); !s.ok()) w = std::move(s);
        }
        net::TransportReady ready;
        ready.ok = w.ok() ? 1 : 0;
        if (w.ok()) {
            ready.ucx_address = (*w)->address();
        } else {
            ready.reason = w.status().message();
            log_warn("{}UCX offered but not linked, staying on TCP: {}", prefix(peer_name), ready.reason);
        }
        TD_TRY(
            send_control(*conn, net::MsgType::transport_ready, ready, 0, timeout_ms).with_context(peer_name));
        if (!w.ok()) return conn;
        return net::ucx_connection(std::move(w).value(), std::move(conn));
    }
    auto region = net::shm_attach(offer.shm);
    net::TransportReady ready;
    ready.ok = region.ok() ? 1 : 0;
    if (!region.ok()) {
        ready.reason = region.status().message();
        log_warn("{}shared memory offered but not attached, staying on TCP: {}", prefix(peer_name),
                 ready.reason);
    }
    TD_TRY(send_control(*conn, net::MsgType::transport_ready, ready, 0, timeout_ms).with_context(peer_name));
    if (!region.ok()) return conn;
    return net::shm_connection(std::move(region).value(), std::move(conn), false);
}

Result<Dialed> dial_node(const std::string &address, const net::Hello &hello_in,
                         const net::ClusterSecret &secret, int connect_timeout_ms) {
    net::Hello hello = hello_in;
    if ((hello.transports & ~net::kTransportsTcp) != 0) hello.host_id = net::host_identity();
    std::string host;
    uint16_t port = 0;
    TD_TRY(net::parse_host_port(address, &host, &port));
    auto conn = net::tcp_connect(host, port, connect_timeout_ms);
    if (!conn.ok())
        return Status(ErrorKind::disconnected,
                      fmt::format("cannot reach worker {}: {}", address, conn.status().message()));
    Dialed d;
    d.conn = std::move(conn).value();
    const std::string name = fmt::format("worker {}", address);
    TD_ASSIGN_OR_RETURN(d.reply, handshake_connect(*d.conn, hello, secret, name));
    TD_ASSIGN_OR_RETURN(d.conn, follow_transport(std::move(d.conn), d.reply, name));
    return d;
}

}  // namespace td::cluster
