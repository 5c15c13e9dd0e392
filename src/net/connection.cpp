// What every transport's Connection shares: the checks of a received header and the payload's growth.
#include "net/codec.h"
#include "net/transport.h"

namespace td::net {

Result<FrameHeader> Connection::checked_header(const uint8_t raw[kHeaderBytes],
                                               const std::string &peer) const {
    Result<FrameHeader> h = decode_header(raw);
    if (!h.ok()) return h.status().with_context(fmt::format("frame from {}", peer));
    if (h->payload_bytes > recv_limit_)
        return invalid_input("frame from {}: {} payload of {} bytes exceeds this connection's limit of {}",
                             peer, msg_type_name(static_cast<MsgType>(h->type)), h->payload_bytes,
                             recv_limit_);
    return h;
}

void Connection::size_payload(std::vector<uint8_t> &payload, size_t n, size_t first) {
    if (n <= payload.capacity())
        payload.resize(n);
    else
        payload.resize(std::min(n, std::max(payload.capacity(), first)));
}

Result<uint64_t> Connection::encode_frame_header(MsgType type, uint64_t request_id, uint32_t flags,
                                                std::span<const std::span<const uint8_t>> parts,
                                                uint8_t raw[kHeaderBytes]) {
    uint64_t total = 0;
    for (const auto &p : parts) total += p.size();
    if (total > max_payload(type))
        return invalid_input("{}: payload of {} bytes exceeds the limit of {} bytes", msg_type_name(type), total,
                             max_payload(type));
    FrameHeader h;
    h.type = static_cast<uint16_t>(type);
    h.flags = flags;
    h.payload_bytes = total;
    h.request_id = request_id;
    encode_header(h, raw);
    return total;
}

}  // namespace td::net
