#include "cluster/wire.h"

#include <cstring>

namespace td::cluster {
namespace {

uint64_t read_le64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

void write_le64(uint64_t v, uint8_t *p) {
    for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

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

void encode_weights_chunk_header(uint64_t offset, uint64_t total, uint8_t out[kWeightsChunkHeader]) {
    write_le64(offset, out);
    write_le64(total, out + 8);
}

Result<net::WeightsChunk> decode_weights_chunk(std::span<const uint8_t> payload,
                                               std::span<const uint8_t> *bytes) {
    if (payload.size() < kWeightsChunkHeader)
        return invalid_input("weights_chunk: payload of {} bytes is shorter than its 16-byte header",
                             payload.size());
    net::WeightsChunk c;
    c.offset = read_le64(payload.data());
    c.total = read_le64(payload.data() + 8);
    *bytes = payload.subspan(kWeightsChunkHeader);
    if (c.total > kMaxStageFileBytes)
        return invalid_input("weights_chunk: total of {} bytes exceeds the limit of {}", c.total,
                             kMaxStageFileBytes);
    if (c.offset > c.total || bytes->size() > c.total - c.offset)
        return invalid_input("weights_chunk: {} bytes at offset {} do not fit in a file of {} bytes",
                             bytes->size(), c.offset, c.total);
    return c;
}

}  // namespace td::cluster
