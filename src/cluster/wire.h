// Small helpers over net/ used by both the head and the worker: typed control sends and receiving with peer
// errors turned into Status. (Message layouts, WeightsChunk's included, live in net/protocol.h and
// net/codec.h only.)
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/sampler.h"
#include "net/codec.h"
#include "net/transport.h"

namespace td::cluster {

inline constexpr int kControlTimeoutMs = 5000;  // a control reply that takes longer means a stuck peer

template <typename Msg>
Status send_control(net::Connection &conn, net::MsgType type, const Msg &msg, uint64_t request_id = 0,
                    int timeout_ms = kControlTimeoutMs) {
    std::vector<uint8_t> payload;
    net::encode(msg, payload);
    return conn.send_msg(type, request_id, payload, timeout_ms);
}
Status send_empty(net::Connection &conn, net::MsgType type, uint64_t request_id = 0,
                  int timeout_ms = kControlTimeoutMs);
// Sends ErrorMsg (best effort: a failure to send is ignored, the connection is closing anyway).
void send_error(net::Connection &conn, const Status &status);

// Receives one frame. An Error frame from the peer becomes its Status, prefixed with `peer_name`.
Status recv_frame(net::Connection &conn, net::FrameHeader &header, std::vector<uint8_t> &payload,
                  int timeout_ms, const std::string &peer_name);
// Receives one frame and checks it is `want` (anything else is invalid_input naming both types).
Status recv_expect(net::Connection &conn, net::MsgType want, std::vector<uint8_t> &payload, int timeout_ms,
                   const std::string &peer_name);

// The sampler's parameters in a SeqStart (the head sends them; the last stage builds its sampler from them),
// and back. take_sampling moves the breakers out of `m`; sampler_params_validate still checks the result.
void put_sampling(const SamplerParams &params, net::SeqStart &m);
SamplerParams take_sampling(net::SeqStart &m);

}  // namespace td::cluster
