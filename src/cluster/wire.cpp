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

namespace {

// The SeqStart fields that are SamplerParams' own, listed once for both directions: f(params', message's).
template <typename Params, typename Msg, typename F>
void sampling_fields(Params &p, Msg &m, F &&f) {
    f(p.temperature, m.temperature);
    f(p.top_k, m.top_k);
    f(p.top_p, m.top_p);
    f(p.min_p, m.min_p);
    f(p.repeat_penalty, m.repeat_penalty);
    f(p.repeat_last_n, m.repeat_last_n);
    f(p.presence_penalty, m.presence_penalty);
    f(p.frequency_penalty, m.frequency_penalty);
    f(p.typical_p, m.typical_p);
    f(p.top_n_sigma, m.top_n_sigma);
    f(p.xtc_probability, m.xtc_probability);
    f(p.xtc_threshold, m.xtc_threshold);
    f(p.dry_multiplier, m.dry_multiplier);
    f(p.dry_base, m.dry_base);
    f(p.dry_allowed_length, m.dry_allowed_length);
    f(p.dry_penalty_last_n, m.dry_penalty_last_n);
    f(p.dynatemp_range, m.dynatemp_range);
    f(p.dynatemp_exponent, m.dynatemp_exponent);
    f(p.mirostat, m.mirostat);
    f(p.mirostat_tau, m.mirostat_tau);
    f(p.mirostat_eta, m.mirostat_eta);
    f(p.seed, m.seed);
    f(p.n_probs, m.n_probs);
}

}  // namespace

void put_sampling(const SamplerParams &params, net::SeqStart &m) {
    sampling_fields(params, m, [](const auto &p, auto &field) { field = p; });
    static_assert(net::kMaxSeqDryBreakers >= kMaxDryBreakers && net::kMaxSeqDryTail >= kMaxDryTail &&
                  net::kMaxSeqDryTailTokens >= kMaxDryTailTokens);
    m.dry_breakers.clear();
    for (const DryBreaker &b : params.dry_breakers) m.dry_breakers.push_back({b.head, b.tail});
    static_assert(net::kMaxSeqLogitBias >= kMaxLogitBias);
    static_assert(net::kMaxResultTop == static_cast<uint32_t>(kMaxNProbs));
    m.logit_bias.clear();
    for (const LogitBias &b : params.logit_bias) m.logit_bias.push_back({b.id, b.bias});
}

SamplerParams take_sampling(net::SeqStart &m) {
    SamplerParams params;
    sampling_fields(params, m, [](auto &p, const auto &field) { p = field; });
    for (net::SeqDryBreaker &b : m.dry_breakers) params.dry_breakers.push_back({b.head, std::move(b.tail)});
    for (const net::SeqLogitBias &b : m.logit_bias) params.logit_bias.push_back({b.id, b.bias});
    return params;
}

}  // namespace td::cluster
