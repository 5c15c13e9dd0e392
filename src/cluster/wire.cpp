#include "cluster/wire.h"

namespace td::cluster {
namespace {

ErrorKind kind_from_wire(uint32_t k) {
    if (k >= static_cast<uint32_t>(ErrorKind::invalid_input) &&
        k <= static_cast<uint32_t>(ErrorKind::unimplemented))
        return static_cast<ErrorKind>(k);
    return ErrorKind::failed;
}

}  // namespace

Status send_empty(net::Connection &conn, net::MsgType type, uint64_t request_id, int timeout_ms) {
    return conn.send_msg(type, request_id, {}, timeout_ms);
}

void send_error(net::Connection &conn, const Status &status) {
    net::ErrorMsg m;
    m.kind = static_cast<uint32_t>(status.ok() ? ErrorKind::failed : status.kind());
    m.message = status.message().substr(0, net::kMaxString);
    (void)send_control(conn, net::MsgType::error, m, 0, 1000);
}

Status recv_frame(net::Connection &conn, net::FrameHeader &header, std::vector<uint8_t> &payload,
                  int timeout_ms, const std::string &peer_name) {
    Status s = conn.recv(header, payload, timeout_ms);
    if (!s.ok()) return peer_name.empty() ? s : s.with_context(peer_name);
    if (static_cast<net::MsgType>(header.type) == net::MsgType::error) {
        auto e = net::decode_error(payload);
        if (!e.ok()) return peer_name.empty() ? e.status() : e.status().with_context(peer_name);
        return Status(kind_from_wire(e->kind), e->message);
    }
    return {};
}

Status recv_expect(net::Connection &conn, net::MsgType want, std::vector<uint8_t> &payload, int timeout_ms,
                   const std::string &peer_name) {
    net::FrameHeader h;
    TD_TRY(recv_frame(conn, h, payload, timeout_ms, peer_name));
    if (h.type != static_cast<uint16_t>(want))
        return invalid_input("{}{}expected a {} message, got {}", peer_name, peer_name.empty() ? "" : ": ",
                             net::msg_type_name(want), net::msg_type_name(static_cast<net::MsgType>(h.type)));
    return {};
}

}  // namespace td::cluster
