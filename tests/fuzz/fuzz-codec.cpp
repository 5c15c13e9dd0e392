// The protocol codec: a frame header, then the payload through the decoder its type names (what a receiver
// does with every frame). Nothing may crash, over-read or allocate beyond the limits.
#include <cstring>

#include "fuzz-util.h"
#include "net/codec.h"

using namespace td;
using namespace td::net;

namespace {

void decode_payload(MsgType type, std::span<const uint8_t> p) {
    switch (type) {
        case MsgType::hello: (void)decode_hello(p); break;
        case MsgType::hello_reply: (void)decode_hello_reply(p); break;
        case MsgType::error: (void)decode_error(p); break;
        case MsgType::load_stage: (void)decode_load_stage(p); break;
        case MsgType::load_reply: (void)decode_load_reply(p); break;
        case MsgType::weights_chunk: (void)decode_weights_chunk(p); break;
        case MsgType::stage_ready: (void)decode_stage_ready(p); break;
        case MsgType::forward: {
            auto v = decode_forward(p);
            if (v.ok() && !(v->header.flags & kForwardTokens) && v->header.n_rows * size_t{v->header.n_embd} < (1u << 22)) {
                std::vector<float> out(size_t{v->header.n_rows} * v->header.n_embd);
                wire_to_f32(*v, out.data());
            }
            break;
        }
        case MsgType::result: {
            auto v = decode_result(p, 16, 8);
            if (v.ok()) {
                for (uint32_t i = 0; i < v->n_outputs; ++i) (void)v->row(i);
                uint64_t k = 0;
                for (uint32_t i = 0; i < v->top_counts.size() / 4; ++i)
                    for (uint32_t j = 0; j < v->top_count(i); ++j) (void)v->top_pair(k++);
            }
            break;
        }
        case MsgType::seq_start: (void)decode_seq_start(p); break;
        case MsgType::seq_clear: (void)decode_seq_clear(p); break;
        case MsgType::stats_reply: (void)decode_stats_reply(p); break;
        case MsgType::stats_request:
        case MsgType::shutdown: (void)decode_empty(type, p); break;
        case MsgType::probe_compute: (void)decode_probe_compute(p); break;
        case MsgType::probe_compute_reply: (void)decode_probe_compute_reply(p); break;
        case MsgType::probe_link: (void)decode_probe_link(p); break;
        case MsgType::probe_link_reply: (void)decode_probe_link_reply(p); break;
        case MsgType::probe_sync:
            (void)decode_probe_sync(p);
            break;
        case MsgType::probe_sync_reply:
            (void)decode_probe_sync_reply(p);
            break;
        case MsgType::auth_challenge: (void)decode_auth_challenge(p); break;
        case MsgType::auth_proof: (void)decode_auth_proof(p); break;
        case MsgType::transport_offer: (void)decode_transport_offer(p); break;
        case MsgType::transport_ready: (void)decode_transport_ready(p); break;
        default: break;  // opaque payloads (ping, echo, tp_*): their receivers only check the size
    }
}

td::fuzz::Bytes frame(MsgType type, const td::fuzz::Bytes &payload) {
    FrameHeader h;
    h.type = static_cast<uint16_t>(type);
    h.payload_bytes = payload.size();
    td::fuzz::Bytes out(kHeaderBytes);
    encode_header(h, out.data());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

}  // namespace

TD_FUZZ_INIT(codec) {
    std::vector<td::fuzz::Bytes> seeds;
    auto add = [&](MsgType t, const auto &m) {
        td::fuzz::Bytes b;
        encode(m, b);
        seeds.push_back(frame(t, b));
    };
    Hello h;
    h.role = ConnRole::peer;
    h.build_id = "0.1.0";
    h.node_name = "10.0.0.2:9000";
    h.rank = 1;
    add(MsgType::hello, h);
    HelloReply hr;
    hr.node_name = "w";
    hr.cpu = "x86";
    add(MsgType::hello_reply, hr);
    add(MsgType::error, ErrorMsg{3, "bad"});
    LoadStage ls;
    ls.layer_last = 4;
    ls.n_layer = 8;
    ls.n_seq = 2;
    ls.next = {"127.0.0.1:1"};
    add(MsgType::load_stage, ls);
    add(MsgType::seq_clear, SeqClear{3});
    SeqStart ss;
    ss.seq = 1;
    ss.temperature = 0.8f;
    ss.n_sampled = 2;
    ss.history = {5, 7};
    ss.logit_bias = {{2, -1e30f}, {9, 1.5f}};
    add(MsgType::seq_start, ss);
    add(MsgType::probe_link, ProbeLink{"10.0.0.3:9000", 50, {64, 4096}, {1u << 20}});
    ProbeSync ps;
    ps.rows = 4;
    ps.n_embd = 64;
    ps.split = 1;
    ps.matrices = {{2, 64, 64}, {2, 64, 128}};
    ps.peer = "10.0.0.3:9000";
    add(MsgType::probe_sync, ps);
    add(MsgType::probe_sync_reply, ProbeSyncReply{4, 0.01, {{0.005, 0.004}, {0.006, 0.003}}});
    AuthChallenge ch;
    ch.nonce.fill(1);
    add(MsgType::auth_challenge, ch);
    TransportOffer to;
    to.transport = static_cast<uint32_t>(Transport::shm);
    to.shm = ShmOffer{1234, 5, 4096 + (2u << 18), {}};
    add(MsgType::transport_offer, to);
    add(MsgType::transport_ready, TransportReady{0, "no", ""});
    TransportOffer uo;
    uo.transport = static_cast<uint32_t>(Transport::ucx);
    uo.ucx_address = std::string(300, '\x5a');
    add(MsgType::transport_offer, uo);
    add(MsgType::transport_ready, TransportReady{1, "", std::string(200, '\x11')});
    const int32_t pos[2] = {0, 1}, seq[2] = {0, 0};
    const uint8_t want[2] = {0, 1};
    std::vector<float> hidden(2 * 64, 0.5f);
    for (WireType w : {WireType::f32, WireType::f16, WireType::q8_0}) {
        td::fuzz::Bytes b;
        encode_forward(pos, seq, want, {}, hidden.data(), 64, w, b);
        seeds.push_back(frame(MsgType::forward, b));
    }
    {
        // v18: a score row with its target, and a result with each row's alternatives.
        const uint8_t score[2] = {kWantScore, 1};
        const int32_t targets[2] = {3, -1};
        td::fuzz::Bytes b;
        encode_forward(pos, seq, score, {}, hidden.data(), 64, WireType::f32, b, targets);
        seeds.push_back(frame(MsgType::forward, b));
        const ResultRow rows[2] = {{0, 3, -1.5f, 0.0f}, {0, 7, -0.5f, 0.0f}};
        const uint32_t counts[2] = {1, 2};
        const ResultTop pairs[3] = {{7, -0.2f}, {7, -0.5f}, {3, -1.5f}};
        td::fuzz::Bytes r;
        encode_result(rows, nullptr, 16, nullptr, 0, r, counts, pairs);
        seeds.push_back(frame(MsgType::result, r));
    }
    td::fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

TD_FUZZ_TARGET(codec) {
    if (size < kHeaderBytes) return 0;
    auto h = decode_header(data);
    if (!h.ok()) return 0;
    // The payload is what follows (a receiver would read exactly payload_bytes; here whatever the input has).
    // Copied into a vector: receivers decode from their (aligned) receive buffer.
    std::vector<uint8_t> payload(data + kHeaderBytes, data + size);
    decode_payload(static_cast<MsgType>(h->type), payload);
    return 0;
}
