// Wire codec and TCP transport: every message round-trips, hostile bytes are rejected without crashing or
// allocating, and real sockets over 127.0.0.1 (port 0) behave under the failures a cluster meets.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "net/codec.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td::net {
namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

template <typename T>
void put_le(Bytes &b, size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof v);
}

// Decodes a payload with the decoder its type names; a frame's full check as a receiver would do it.
Status decode_any(MsgType type, std::span<const uint8_t> p) {
    switch (type) {
        case MsgType::hello:
            return decode_hello(p).status();
        case MsgType::hello_reply:
            return decode_hello_reply(p).status();
        case MsgType::error:
            return decode_error(p).status();
        case MsgType::load_stage:
            return decode_load_stage(p).status();
        case MsgType::load_reply:
            return decode_load_reply(p).status();
        case MsgType::weights_chunk:
            return decode_weights_chunk(p).status();
        case MsgType::stage_ready:
            return decode_stage_ready(p).status();
        case MsgType::forward: {
            auto v = decode_forward(p);
            if (v.ok() && !(v->header.flags & kForwardTokens)) {
                std::vector<float> out(size_t{v->header.n_rows} * v->header.n_embd);
                wire_to_f32(*v, out.data());
            }
            return v.status();
        }
        case MsgType::result: {
            auto v = decode_result(p, 16, 8);
            if (v.ok())
                for (uint32_t i = 0; i < v->n_outputs; ++i) (void)v->row(i);
            return v.status();
        }
        case MsgType::seq_start:
            return decode_seq_start(p).status();
        case MsgType::seq_clear:
            return decode_seq_clear(p).status();
        case MsgType::stats_reply:
            return decode_stats_reply(p).status();
        case MsgType::stats_request:
        case MsgType::shutdown:
            return decode_empty(type, p);
        case MsgType::ping:
        case MsgType::pong:
        case MsgType::tp_partial:  // raw floats / opaque candidates: their receivers check the size
        case MsgType::tp_gather:
        case MsgType::echo:  // opaque bytes
        case MsgType::echo_reply:
            return {};
        case MsgType::probe_sync:
            return decode_probe_sync(p).status();
        case MsgType::probe_sync_reply:
            return decode_probe_sync_reply(p).status();
        case MsgType::probe_compute:
            return decode_probe_compute(p).status();
        case MsgType::probe_compute_reply:
            return decode_probe_compute_reply(p).status();
        case MsgType::probe_link:
            return decode_probe_link(p).status();
        case MsgType::probe_link_reply:
            return decode_probe_link_reply(p).status();
        case MsgType::auth_challenge:
            return decode_auth_challenge(p).status();
        case MsgType::auth_proof:
            return decode_auth_proof(p).status();
        case MsgType::transport_offer:
            return decode_transport_offer(p).status();
        case MsgType::transport_ready:
            return decode_transport_ready(p).status();
    }
    return invalid_input("unknown type");
}

// ---- sample messages -------------------------------------------------------------------------------------

Hello sample_hello() {
    Hello m;
    m.role = ConnRole::data;
    m.build_id = "0.1.0-abc123";
    m.node_name = "10.0.0.2:9100";
    for (size_t i = 0; i < m.nonce.size(); ++i) m.nonce[i] = static_cast<uint8_t>(i * 7 + 1);
    m.transports = kTransportsAll;
    m.host_id = "5f1c1a4e-0d4b-4bd6-9a43-0a5c1bd2e3f4";
    return m;
}
HelloReply sample_hello_reply() {
    HelloReply m;
    m.build_id = "0.1.0-abc123";
    m.node_name = "worker-a";
    m.n_threads = 16;
    m.mem_total = 64ull << 30;
    m.mem_available = 40ull << 30;
    m.gflops = 812.5f;
    m.cpu = "AMD EPYC (avx2)";
    m.transport = static_cast<uint32_t>(Transport::shm);
    return m;
}
LoadStage sample_load_stage() {
    LoadStage m;
    m.fingerprint = 0x0123456789abcdefull;
    m.stage_file_bytes = 123456789012ull;
    m.layer_first = 4;
    m.layer_last = 8;
    m.n_layer = 32;
    m.n_ctx = 4096;
    m.n_seq = 4;
    m.kv_type_k = 3;
    m.kv_type_v = 1;
    m.wire = static_cast<uint32_t>(WireType::q8_0);
    m.n_threads = 8;
    m.model_name = "llama-7b";
    m.next = {"10.0.0.3:9101", "10.0.0.4:9101"};
    m.is_last = true;
    m.tp_rank = 1;
    m.tp_size = 2;
    m.slice[0] = 2, m.slice[1] = 4, m.slice[2] = 2816, m.slice[3] = 5632, m.slice[4] = 16000, m.slice[5] = 32000;
    m.group = 0xfeedfacecafebeefull;
    m.stage_fingerprint = 0x1122334455667788ull;
    m.peers = {"10.0.0.2:9100", "10.0.0.3:9100"};
    return m;
}
SeqStart sample_seq_start() {
    SeqStart m;
    m.seq = 3;
    m.want_logits = 1;
    m.temperature = 0.7f;
    m.top_k = 40;
    m.top_p = 0.9f;
    m.min_p = 0.05f;
    m.repeat_penalty = 1.1f;
    m.repeat_last_n = 128;
    m.presence_penalty = 0.25f;
    m.frequency_penalty = 0.5f;
    m.seed = 0xdeadbeefcafeull;
    m.n_sampled = 300;
    m.history = {5, 0, 511, 7};
    m.logit_bias = {{2, -std::numeric_limits<float>::infinity()}, {15043, 1.5f}};
    m.keep = 17;
    m.keep_from = 5;
    m.typical_p = 0.9f;
    m.top_n_sigma = 1.5f;
    m.xtc_probability = 0.5f;
    m.xtc_threshold = 0.15f;
    m.dry_multiplier = 0.8f;
    m.dry_base = 1.5f;
    m.dry_allowed_length = 3;
    m.dry_penalty_last_n = 256;
    m.dry_breakers = {{13, {}}, {29901, {1, 2, 3}}};
    m.dynatemp_range = 0.4f;
    m.dynatemp_exponent = 1.5f;
    m.mirostat = 2;
    m.mirostat_tau = 4.5f;
    m.mirostat_eta = 0.25f;
    m.mirostat_mu = 7.75f;
    return m;
}
ProbeCompute sample_probe_compute() {
    ProbeCompute m;
    m.n_threads = 4;
    m.budget_ms = 15;
    m.working_set = 64u << 20;
    m.matrices = {{2, 2048, 2048}, {12, 2048, 8192}};
    m.rows = {1, 16, 512};
    m.ops = {2048, 8192, 32, 8, 64, 256};
    return m;
}
ProbeSync sample_probe_sync() {
    ProbeSync m;
    m.n_threads = 1;
    m.budget_ms = 300;
    m.rows = 16;
    m.n_embd = 2048;
    m.reduce = static_cast<uint32_t>(ReduceType::f16);
    m.split = 2;
    m.matrices = {{2, 2048, 1024}, {2, 1024, 2048}, {2, 2048, 2816}, {2, 2816, 2048}};
    m.peer = "10.0.0.3:9000";
    m.transports = kTransportsAll;
    return m;
}
StatsReply sample_stats() {
    StatsReply m;
    m.msgs_in = 1;
    m.msgs_out = 2;
    m.bytes_in = 3;
    m.bytes_out = 4;
    m.forward_steps = 5;
    m.compute_seconds = 6.5;
    m.wait_seconds = 7.25;
    m.send_seconds = 8.125;
    return m;
}

std::vector<float> random_rows(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float &v : x) v = dist(rng);
    return x;
}

struct Rows {
    std::vector<int32_t> pos, seq, tokens;
    std::vector<uint8_t> want;
};
Rows sample_rows(size_t n) {
    Rows r;
    for (size_t i = 0; i < n; ++i) {
        r.pos.push_back(static_cast<int32_t>(100 + i));
        r.seq.push_back(static_cast<int32_t>(i % 3));
        r.tokens.push_back(static_cast<int32_t>(1000 + 7 * i));
        r.want.push_back(i % 2);
    }
    return r;
}

// Every message type as an encoded (type, payload) pair.
std::vector<std::pair<MsgType, Bytes>> all_messages() {
    std::vector<std::pair<MsgType, Bytes>> v;
    auto add = [&](MsgType t, const auto &m) {
        Bytes b;
        encode(m, b);
        v.emplace_back(t, std::move(b));
    };
    add(MsgType::hello, sample_hello());
    add(MsgType::hello_reply, sample_hello_reply());
    add(MsgType::error, ErrorMsg{static_cast<uint32_t>(ErrorKind::overloaded), "queue full"});
    add(MsgType::load_stage, sample_load_stage());
    add(MsgType::load_reply, LoadReply{1, "cache 9f2c"});
    add(MsgType::stage_ready, StageReady{1u << 30, 1u << 20, 2.5f});
    add(MsgType::seq_start, sample_seq_start());
    add(MsgType::seq_clear, SeqClear{7});
    add(MsgType::stats_reply, sample_stats());
    {
        Bytes b;
        encode(WeightsChunk{64, 256}, b);
        b.insert(b.end(), 100, 0xab);
        v.emplace_back(MsgType::weights_chunk, std::move(b));
    }
    const Rows r = sample_rows(5);
    const std::vector<float> hidden = random_rows(5 * 64, 1);
    for (WireType w : {WireType::f32, WireType::f16, WireType::q8_0}) {
        Bytes b;
        encode_forward(r.pos, r.seq, r.want, {}, hidden.data(), 64, w, b);
        v.emplace_back(MsgType::forward, std::move(b));
    }
    {
        Bytes b;
        encode_forward(r.pos, r.seq, r.want, r.tokens, nullptr, 0, WireType::f32, b);
        v.emplace_back(MsgType::forward, std::move(b));
    }
    {
        Bytes b;  // v12: hidden rows with the token ids of a step with draft rows
        std::vector<uint8_t> want = r.want;
        want.back() = kWantDraft;
        encode_forward(r.pos, r.seq, want, r.tokens, hidden.data(), 64, WireType::f16, b);
        v.emplace_back(MsgType::forward, std::move(b));
    }
    {
        Bytes b;  // v18: score rows with their targets
        std::vector<uint8_t> want = r.want;
        std::vector<int32_t> targets(want.size(), -1);
        want.front() = kWantScore;
        targets.front() = 3;
        encode_forward(r.pos, r.seq, want, {}, hidden.data(), 64, WireType::f32, b, targets);
        v.emplace_back(MsgType::forward, std::move(b));
    }
    const ResultRow rows[2] = {{0, 42, -0.5f}, {2, 7, -1.25f}};
    const std::vector<float> logits = random_rows(2 * 16, 2);
    {
        Bytes b;
        encode_result(rows, nullptr, 16, nullptr, 0, b);
        v.emplace_back(MsgType::result, std::move(b));
        Bytes c;
        encode_result(rows, logits.data(), 16, nullptr, 0, c);
        v.emplace_back(MsgType::result, std::move(c));
        // A sampled row with its logits and an embedding row (n_embd 8).
        const ResultRow mixed[2] = {{0, 42, -0.5f}, {1, kEmbeddingRowToken, 0.0f}};
        const std::vector<float> embd = random_rows(8, 3);
        Bytes d;
        encode_result(mixed, logits.data(), 16, embd.data(), 8, d);
        v.emplace_back(MsgType::result, std::move(d));
        // v18: each row's alternatives.
        const uint32_t counts[2] = {2, 0};
        const ResultTop pairs[2] = {{12, -0.5f}, {3, -1.5f}};
        Bytes e;
        encode_result(rows, nullptr, 16, nullptr, 0, e, counts, pairs);
        v.emplace_back(MsgType::result, std::move(e));
    }
    v.emplace_back(MsgType::stats_request, Bytes{});
    v.emplace_back(MsgType::shutdown, Bytes{});
    v.emplace_back(MsgType::ping, Bytes{1, 2, 3, 4, 5, 6, 7, 8});
    add(MsgType::probe_compute, sample_probe_compute());
    add(MsgType::probe_sync, sample_probe_sync());
    add(MsgType::probe_sync_reply, ProbeSyncReply{1000, 0.31, {{0.2, 0.1}, {0.25, 0.06}}});
    add(MsgType::probe_compute_reply, ProbeComputeReply{2, 31.5, {1e-4, 2e-4, 3e-4}, 1e-6, 2e-6, 1e-6, 5e-6, 3e-6});
    add(MsgType::probe_link, ProbeLink{"10.0.0.3:9000", 50, {64, 4096}, {1u << 20}});
    add(MsgType::probe_link_reply, ProbeLinkReply{{LinkSample{64, 0, 100, 4e-5, 5e-5, 9e-5, 2e-4, 0.003},
                                                   LinkSample{1u << 20, 1, 8, 1e-3, 1e-3, 2e-3, 2e-3, 1.1}}});
    AuthChallenge ch;
    ch.nonce.fill(0x11);
    ch.proof.fill(0x22);
    add(MsgType::auth_challenge, ch);
    AuthProof pr;
    pr.proof.fill(0x33);
    add(MsgType::auth_proof, pr);
    TransportOffer to;
    to.transport = static_cast<uint32_t>(Transport::shm);
    to.shm = ShmOffer{4242, 17, 4096 + (8u << 20), {}};
    to.shm.token.fill(0x44);
    add(MsgType::transport_offer, to);
    add(MsgType::transport_ready, TransportReady{0, "cannot open /proc/4242/fd/17", ""});
    TransportOffer uo;
    uo.transport = static_cast<uint32_t>(Transport::ucx);
    uo.ucx_address = std::string(500, '\x7e');
    add(MsgType::transport_offer, uo);
    add(MsgType::transport_ready, TransportReady{1, "", std::string(400, '\x01')});
    return v;
}

// ---- header ----------------------------------------------------------------------------------------------

TEST(NetCodec, HeaderRoundTripAndLayout) {
    FrameHeader h;
    h.type = static_cast<uint16_t>(MsgType::forward);
    h.flags = 0x5;
    h.payload_bytes = 123456;
    h.request_id = 0x1122334455667788ull;
    uint8_t raw[kHeaderBytes];
    encode_header(h, raw);
    EXPECT_EQ(std::memcmp(raw, "TDM1", 4), 0);  // the magic reads as text on the wire
    EXPECT_EQ(raw[4], kProtocolVersion);
    EXPECT_EQ(raw[6], 8);
    EXPECT_EQ(raw[24], 0x88);  // little-endian request id
    auto d = decode_header(raw);
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d->type, h.type);
    EXPECT_EQ(d->flags, h.flags);
    EXPECT_EQ(d->payload_bytes, h.payload_bytes);
    EXPECT_EQ(d->request_id, h.request_id);
}

TEST(NetCodec, HeaderRejectsBadMagicUnknownTypeAndOversize) {
    FrameHeader h;
    h.type = static_cast<uint16_t>(MsgType::hello);
    uint8_t raw[kHeaderBytes];

    encode_header(h, raw);
    raw[0] = 'X';
    auto d = decode_header(raw);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().kind(), ErrorKind::invalid_input);
    EXPECT_NE(d.status().message().find("magic"), std::string::npos) << d.status().message();

    h.type = 99;
    encode_header(h, raw);
    d = decode_header(raw);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("unknown message type 99"), std::string::npos)
        << d.status().message();

    h.type = static_cast<uint16_t>(MsgType::hello);
    h.payload_bytes = kMaxControlPayload + 1;
    encode_header(h, raw);
    d = decode_header(raw);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("hello: payload of"), std::string::npos) << d.status().message();

    h.type = static_cast<uint16_t>(MsgType::forward);
    h.payload_bytes = 2ull << 30;
    encode_header(h, raw);
    EXPECT_FALSE(decode_header(raw).ok());
    h.payload_bytes = kMaxDataPayload;
    encode_header(h, raw);
    EXPECT_TRUE(decode_header(raw).ok());
}

TEST(NetCodec, OtherVersionDecodesSoTheHandshakeCanReportIt) {
    FrameHeader h;
    h.version = kProtocolVersion + 1;
    h.type = static_cast<uint16_t>(MsgType::hello);
    uint8_t raw[kHeaderBytes];
    encode_header(h, raw);
    auto d = decode_header(raw);
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d->version, kProtocolVersion + 1);

    // A future hello with an extra field still yields its version and names.
    Hello m = sample_hello();
    m.protocol_version = kProtocolVersion + 1;
    Bytes b;
    encode(m, b);
    b.insert(b.end(), {1, 2, 3, 4, 5});
    auto hello = decode_hello(b);
    ASSERT_TRUE(hello.ok()) << hello.status().message();
    EXPECT_EQ(hello->protocol_version, kProtocolVersion + 1);
    EXPECT_EQ(hello->node_name, m.node_name);
    // The same bytes from our own version are trailing garbage.
    m.protocol_version = kProtocolVersion;
    b.clear();
    encode(m, b);
    b.push_back(0);
    EXPECT_FALSE(decode_hello(b).ok());
}

// ---- control messages ------------------------------------------------------------------------------------

TEST(NetCodec, ControlMessagesRoundTrip) {
    Bytes b;
    encode(sample_hello(), b);
    auto hello = decode_hello(b);
    ASSERT_TRUE(hello.ok()) << hello.status().message();
    EXPECT_EQ(hello->role, ConnRole::data);
    EXPECT_EQ(hello->build_id, "0.1.0-abc123");
    EXPECT_EQ(hello->node_name, "10.0.0.2:9100");
    EXPECT_EQ(hello->nonce, sample_hello().nonce);
    EXPECT_EQ(hello->transports, kTransportsAll);
    EXPECT_EQ(hello->host_id, sample_hello().host_id);

    b.clear();
    encode(sample_hello_reply(), b);
    auto hr = decode_hello_reply(b);
    ASSERT_TRUE(hr.ok()) << hr.status().message();
    EXPECT_EQ(hr->node_name, "worker-a");
    EXPECT_EQ(hr->n_threads, 16u);
    EXPECT_EQ(hr->mem_total, 64ull << 30);
    EXPECT_EQ(hr->mem_available, 40ull << 30);
    EXPECT_EQ(hr->gflops, 812.5f);
    EXPECT_EQ(hr->cpu, "AMD EPYC (avx2)");
    EXPECT_EQ(hr->transport, static_cast<uint32_t>(Transport::shm));

    b.clear();
    encode(ErrorMsg{static_cast<uint32_t>(ErrorKind::overloaded), "queue full"}, b);
    auto err = decode_error(b);
    ASSERT_TRUE(err.ok());
    EXPECT_EQ(err->kind, static_cast<uint32_t>(ErrorKind::overloaded));
    EXPECT_EQ(err->message, "queue full");

    b.clear();
    const LoadStage ls = sample_load_stage();
    encode(ls, b);
    auto l = decode_load_stage(b);
    ASSERT_TRUE(l.ok()) << l.status().message();
    EXPECT_EQ(l->fingerprint, ls.fingerprint);
    EXPECT_EQ(l->stage_file_bytes, ls.stage_file_bytes);
    EXPECT_EQ(l->layer_first, 4);
    EXPECT_EQ(l->layer_last, 8);
    EXPECT_EQ(l->n_layer, 32);
    EXPECT_EQ(l->n_ctx, 4096);
    EXPECT_EQ(l->n_seq, 4);
    EXPECT_EQ(l->kv_type_k, 3u);
    EXPECT_EQ(l->kv_type_v, 1u);
    EXPECT_EQ(l->wire, ls.wire);
    EXPECT_EQ(l->n_threads, 8u);
    EXPECT_EQ(l->model_name, "llama-7b");
    EXPECT_EQ(l->next, ls.next);
    EXPECT_TRUE(l->is_last);
    EXPECT_EQ(l->tp_rank, 1u);
    EXPECT_EQ(l->tp_size, 2u);
    EXPECT_EQ(l->slice[3], 5632);
    EXPECT_EQ(l->slice[5], 32000);
    EXPECT_EQ(l->group, ls.group);
    EXPECT_EQ(l->stage_fingerprint, ls.stage_fingerprint);
    EXPECT_EQ(l->peers, ls.peers);

    b.clear();
    encode(LoadReply{1, "cache 9f2c"}, b);
    auto lr = decode_load_reply(b);
    ASSERT_TRUE(lr.ok());
    EXPECT_EQ(lr->need_weights, 1u);
    EXPECT_EQ(lr->source, "cache 9f2c");

    b.clear();
    encode(StageReady{1u << 30, 1u << 20, 2.5f}, b);
    auto sr = decode_stage_ready(b);
    ASSERT_TRUE(sr.ok());
    EXPECT_EQ(sr->weight_bytes, 1u << 30);
    EXPECT_EQ(sr->kv_bytes, 1u << 20);
    EXPECT_EQ(sr->load_seconds, 2.5f);

    b.clear();
    const SeqStart ss = sample_seq_start();
    encode(ss, b);
    auto s = decode_seq_start(b);
    ASSERT_TRUE(s.ok()) << s.status().message();
    EXPECT_EQ(s->seq, 3);
    EXPECT_EQ(s->want_logits, 1u);
    EXPECT_EQ(s->temperature, 0.7f);
    EXPECT_EQ(s->top_k, 40);
    EXPECT_EQ(s->top_p, 0.9f);
    EXPECT_EQ(s->min_p, 0.05f);
    EXPECT_EQ(s->repeat_penalty, 1.1f);
    EXPECT_EQ(s->n_sampled, 300u);
    EXPECT_EQ(s->history, (std::vector<int32_t>{5, 0, 511, 7}));
    EXPECT_EQ(s->typical_p, 0.9f);
    EXPECT_EQ(s->top_n_sigma, 1.5f);
    EXPECT_EQ(s->xtc_probability, 0.5f);
    EXPECT_EQ(s->xtc_threshold, 0.15f);
    EXPECT_EQ(s->dry_multiplier, 0.8f);
    EXPECT_EQ(s->dry_base, 1.5f);
    EXPECT_EQ(s->dry_allowed_length, 3);
    EXPECT_EQ(s->dry_penalty_last_n, 256);
    ASSERT_EQ(s->dry_breakers.size(), 2u);
    EXPECT_EQ(s->dry_breakers[0].head, 13);
    EXPECT_TRUE(s->dry_breakers[0].tail.empty());
    EXPECT_EQ(s->dry_breakers[1].head, 29901);
    EXPECT_EQ(s->dry_breakers[1].tail, (std::vector<int32_t>{1, 2, 3}));
    EXPECT_EQ(s->dynatemp_range, 0.4f);
    EXPECT_EQ(s->dynatemp_exponent, 1.5f);
    EXPECT_EQ(s->mirostat, 2);
    EXPECT_EQ(s->mirostat_tau, 4.5f);
    EXPECT_EQ(s->mirostat_eta, 0.25f);
    EXPECT_EQ(s->mirostat_mu, 7.75f);
    ASSERT_EQ(s->logit_bias.size(), 2u);
    EXPECT_EQ(s->logit_bias[0].id, 2);
    EXPECT_EQ(s->logit_bias[0].bias, -std::numeric_limits<float>::infinity());
    EXPECT_EQ(s->logit_bias[1].id, 15043);
    EXPECT_EQ(s->logit_bias[1].bias, 1.5f);
    EXPECT_EQ(s->repeat_last_n, 128);
    EXPECT_EQ(s->presence_penalty, 0.25f);
    EXPECT_EQ(s->frequency_penalty, 0.5f);
    EXPECT_EQ(s->seed, ss.seed);
    EXPECT_EQ(s->keep, 17u);
    EXPECT_EQ(s->keep_from, 5);

    b.clear();
    encode(SeqClear{7}, b);
    auto sc = decode_seq_clear(b);
    ASSERT_TRUE(sc.ok());
    EXPECT_EQ(sc->seq, 7);

    b.clear();
    encode(sample_stats(), b);
    auto st = decode_stats_reply(b);
    ASSERT_TRUE(st.ok());
    EXPECT_EQ(st->msgs_in, 1u);
    EXPECT_EQ(st->msgs_out, 2u);
    EXPECT_EQ(st->bytes_in, 3u);
    EXPECT_EQ(st->bytes_out, 4u);
    EXPECT_EQ(st->forward_steps, 5u);
    EXPECT_EQ(st->compute_seconds, 6.5);
    EXPECT_EQ(st->wait_seconds, 7.25);
    EXPECT_EQ(st->send_seconds, 8.125);

    b.clear();
    encode(WeightsChunk{64, 256}, b);
    b.insert(b.end(), 100, 0xab);
    auto wc = decode_weights_chunk(b);
    ASSERT_TRUE(wc.ok()) << wc.status().message();
    EXPECT_EQ(wc->header.offset, 64u);
    EXPECT_EQ(wc->header.total, 256u);
    ASSERT_EQ(wc->bytes.size(), 100u);
    EXPECT_EQ(wc->bytes[99], 0xab);
    put_le<uint64_t>(b, 0, 200);  // 100 bytes at 200 run past 256
    EXPECT_FALSE(decode_weights_chunk(b).ok());

    EXPECT_TRUE(decode_empty(MsgType::shutdown, {}).ok());
    const uint8_t one[1] = {0};
    EXPECT_FALSE(decode_empty(MsgType::shutdown, one).ok());
}

TEST(NetCodec, ProbeMessagesRoundTripAndCheckTheirLimits) {
    Bytes b;
    encode(sample_probe_compute(), b);
    auto pc = decode_probe_compute(b);
    ASSERT_TRUE(pc.ok()) << pc.status().message();
    EXPECT_EQ(pc->n_threads, 4u);
    EXPECT_EQ(pc->working_set, 64u << 20);
    ASSERT_EQ(pc->matrices.size(), 2u);
    EXPECT_EQ(pc->matrices[1].dtype, 12u);
    EXPECT_EQ(pc->matrices[1].n_out, 8192u);
    EXPECT_EQ(pc->rows, (std::vector<uint32_t>{1, 16, 512}));
    EXPECT_EQ(pc->ops.n_ff, 8192u);
    EXPECT_EQ(pc->ops.n_pos, 256u);

    ProbeCompute bad = sample_probe_compute();
    bad.rows = {0};  // every row count must be 1..kMaxBatchRows
    b.clear();
    encode(bad, b);
    EXPECT_FALSE(decode_probe_compute(b).ok());
    bad = sample_probe_compute();
    bad.budget_ms = kMaxProbeBudgetMs + 1;
    b.clear();
    encode(bad, b);
    EXPECT_FALSE(decode_probe_compute(b).ok());
    bad = sample_probe_compute();
    bad.ops.n_head = 30;  // not a multiple of the KV heads
    b.clear();
    encode(bad, b);
    EXPECT_FALSE(decode_probe_compute(b).ok());
    bad = sample_probe_compute();
    bad.working_set = kMaxProbeWorkingSet + 1;
    b.clear();
    encode(bad, b);
    EXPECT_FALSE(decode_probe_compute(b).ok());
    bad = sample_probe_compute();
    bad.matrices.assign(kMaxProbeMatrices + 1, ProbeMatrix{2, 32, 32});  // the count is checked before reading
    b.clear();
    encode(bad, b);
    EXPECT_FALSE(decode_probe_compute(b).ok());

    b.clear();
    encode(ProbeLink{"10.0.0.3:9000", 50, {64, 4096}, {1u << 20}}, b);
    auto pl = decode_probe_link(b);
    ASSERT_TRUE(pl.ok()) << pl.status().message();
    EXPECT_EQ(pl->address, "10.0.0.3:9000");
    EXPECT_EQ(pl->rtt_sizes, (std::vector<uint64_t>{64, 4096}));
    b.clear();
    encode(ProbeLink{"x:1", 50, {kMaxEchoPayload + 1}, {}}, b);
    EXPECT_FALSE(decode_probe_link(b).ok());

    b.clear();
    encode(ProbeLinkReply{{LinkSample{64, 0, 100, 4e-5, 5e-5, 9e-5, 2e-4, 0.003}}}, b);
    auto lr = decode_probe_link_reply(b);
    ASSERT_TRUE(lr.ok());
    ASSERT_EQ(lr->samples.size(), 1u);
    EXPECT_EQ(lr->samples[0].count, 100u);
    EXPECT_DOUBLE_EQ(lr->samples[0].p99, 9e-5);
    b.clear();
    encode(ProbeLinkReply{{LinkSample{64, 2, 1, 0, 0, 0, 0, 0}}}, b);  // unknown mode
    EXPECT_FALSE(decode_probe_link_reply(b).ok());
    b.clear();
    encode(ProbeComputeReply{1, 10.0, {-1.0}, 0, 0, 0, 0, 0}, b);  // a negative time
    EXPECT_FALSE(decode_probe_compute_reply(b).ok());

    b.clear();
    encode(sample_probe_sync(), b);
    auto ps = decode_probe_sync(b);
    ASSERT_TRUE(ps.ok()) << ps.status().message();
    EXPECT_EQ(ps->rows, 16u);
    EXPECT_EQ(ps->split, 2u);
    EXPECT_EQ(ps->matrices.size(), 4u);
    EXPECT_EQ(ps->matrices[3].n_in, 2816u);
    EXPECT_EQ(ps->peer, "10.0.0.3:9000");
    EXPECT_EQ(ps->transports, kTransportsAll);
    for (int k = 0; k < 6; ++k) {
        ProbeSync bad = sample_probe_sync();
        if (k == 0) bad.rows = 0;
        if (k == 1) bad.n_embd = 0;
        if (k == 2) bad.rows = 8192, bad.n_embd = 4096;  // 32M values in one all-reduce
        if (k == 3) bad.reduce = 3;
        if (k == 4) bad.split = 5;
        if (k == 5) bad.matrices.clear();
        b.clear();
        encode(bad, b);
        EXPECT_FALSE(decode_probe_sync(b).ok()) << k;
    }
    b.clear();
    encode(ProbeSyncReply{8, 0.5, {{0.3, 0.2}, {0.4, 0.1}}}, b);
    auto sr = decode_probe_sync_reply(b);
    ASSERT_TRUE(sr.ok()) << sr.status().message();
    ASSERT_EQ(sr->ranks.size(), 2u);
    EXPECT_DOUBLE_EQ(sr->ranks[1].compute_s, 0.4);
    b.clear();
    encode(ProbeSyncReply{8, 0.5, {{-0.3, 0.2}}}, b);  // a negative time
    EXPECT_FALSE(decode_probe_sync_reply(b).ok());

    // The echo's limit is what netbench's largest message needs, and no more.
    EXPECT_EQ(max_payload(MsgType::echo), kMaxEchoPayload);
    EXPECT_EQ(max_payload(MsgType::probe_compute), kMaxControlPayload);
}

TEST(NetCodec, TruncatedAndTrailingPayloadsAreErrors) {
    for (const auto &[type, bytes] : all_messages()) {
        ASSERT_TRUE(decode_any(type, bytes).ok())
            << msg_type_name(type) << ": " << decode_any(type, bytes).message();
        if (type == MsgType::ping || type == MsgType::weights_chunk) continue;  // opaque / open-ended tails
        for (size_t n = 0; n < bytes.size(); ++n) {
            Bytes cut(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(n));
            Status st = decode_any(type, cut);
            EXPECT_FALSE(st.ok()) << msg_type_name(type) << " truncated to " << n << " of " << bytes.size();
            if (!st.ok()) {
                EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
            }
        }
        Bytes longer = bytes;
        longer.push_back(0);
        Status st = decode_any(type, longer);
        EXPECT_FALSE(st.ok()) << msg_type_name(type) << " with a trailing byte";
        if (!st.ok() && type != MsgType::forward && type != MsgType::result) {
            const bool named = st.message().find("trailing") != std::string::npos ||
                               st.message().find("must be empty") != std::string::npos;
            EXPECT_TRUE(named) << st.message();
        }
    }
}

TEST(NetCodec, StringLimitsAreCheckedBeforeCopying) {
    Bytes b;
    encode(sample_hello(), b);
    put_le<uint32_t>(b, 8, kMaxString + 1);  // build_id's length
    auto h = decode_hello(b);
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.status().message().find("hello: build_id is 4097 bytes, limit 4096"), std::string::npos)
        << h.status().message();
    put_le<uint32_t>(b, 8, 4000);  // within the limit, longer than the payload
    h = decode_hello(b);
    ASSERT_FALSE(h.ok());
    EXPECT_NE(h.status().message().find("build_id needs 4000 bytes"), std::string::npos)
        << h.status().message();

    // A sender's overlong string is cut to the limit, so the frame stays decodable.
    ErrorMsg e{static_cast<uint32_t>(ErrorKind::failed), std::string(kMaxString + 100, 'x')};
    b.clear();
    encode(e, b);
    auto d = decode_error(b);
    ASSERT_TRUE(d.ok());
    EXPECT_EQ(d->message.size(), kMaxString);
}

TEST(NetCodec, UcxAddressesRoundTripWithinTheirLimit) {
    TransportOffer o;
    o.transport = static_cast<uint32_t>(Transport::ucx);
    o.ucx_address = std::string(
        "\0\x01"
        "address"
        "\xff",
        10);  // opaque bytes, zeros included
    Bytes b;
    encode(o, b);
    auto d = decode_transport_offer(b);
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d->ucx_address, o.ucx_address);
    put_le<uint32_t>(b, 4, kMaxUcxAddress + 1);  // the address's length
    d = decode_transport_offer(b);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("ucx_address is 32769 bytes, limit 32768"), std::string::npos)
        << d.status().message();
    o.ucx_address.clear();  // an offer of UCX without an address to link to
    b.clear();
    encode(o, b);
    EXPECT_FALSE(decode_transport_offer(b).ok());
    TransportReady r{1, "", std::string(kMaxUcxAddress, 'a')};
    b.clear();
    encode(r, b);
    EXPECT_LE(b.size(), max_payload(MsgType::transport_ready));
    auto rd = decode_transport_ready(b);
    ASSERT_TRUE(rd.ok()) << rd.status().message();
    EXPECT_EQ(rd->ucx_address.size(), kMaxUcxAddress);
}

TEST(NetCodec, SemanticChecks) {
    Bytes b;
    LoadStage ls = sample_load_stage();
    ls.layer_first = 8;  // empty range
    encode(ls, b);
    EXPECT_FALSE(decode_load_stage(b).ok());
    b.clear();
    ls = sample_load_stage();
    ls.wire = 5;
    encode(ls, b);
    EXPECT_FALSE(decode_load_stage(b).ok());
    // Tensor parallelism: a rank outside its group, a group without all its peers, an empty slice range.
    for (int c = 0; c < 3; ++c) {
        b.clear();
        ls = sample_load_stage();
        if (c == 0) ls.tp_rank = 2;
        if (c == 1) ls.peers.pop_back();
        if (c == 2) ls.slice[1] = ls.slice[0];
        encode(ls, b);
        EXPECT_FALSE(decode_load_stage(b).ok()) << "case " << c;
    }
    b.clear();
    ls = sample_load_stage();
    ls.next.assign(kMaxNextHops + 1, "10.0.0.5:1");
    encode(ls, b);
    auto many = decode_load_stage(b);
    ASSERT_FALSE(many.ok());
    EXPECT_NE(many.status().message().find("limit 64"), std::string::npos) << many.status().message();
    b.clear();
    SeqStart s = sample_seq_start();
    s.temperature = NAN;
    encode(s, b);
    auto d = decode_seq_start(b);
    ASSERT_FALSE(d.ok());
    EXPECT_NE(d.status().message().find("temperature"), std::string::npos);
    // The history (the prompt's tail, then what a resumed stream sampled): none negative, at most
    // kMaxSeqHistory; a new stream's (n_sampled 0) is its prompt's.
    const auto seq_start_error = [&](const SeqStart &m) {
        b.clear();
        encode(m, b);
        auto r = decode_seq_start(b);
        return r.ok() ? std::string() : r.status().message();
    };
    s = sample_seq_start();
    s.n_sampled = 0;
    EXPECT_EQ(seq_start_error(s), "");
    s = sample_seq_start();
    s.history[1] = -2;
    EXPECT_NE(seq_start_error(s).find("history token -2"), std::string::npos);
    s = sample_seq_start();
    s.n_sampled = kMaxSeqHistory + 1;
    s.history.assign(kMaxSeqHistory, 1);
    EXPECT_EQ(seq_start_error(s), "");
    s.history.push_back(1);
    EXPECT_NE(seq_start_error(s).find("limit 65536"), std::string::npos) << seq_start_error(s);
    // A logit bias: ids >= 0, biases finite or -inf, at most kMaxSeqLogitBias.
    s = sample_seq_start();
    s.logit_bias[1].id = -3;
    EXPECT_NE(seq_start_error(s).find("logit_bias token -3 is negative"), std::string::npos)
        << seq_start_error(s);
    for (float bad : {std::numeric_limits<float>::infinity(), std::nanf("")}) {
        s = sample_seq_start();
        s.logit_bias[1].bias = bad;
        EXPECT_NE(seq_start_error(s).find("logit_bias of token 15043"), std::string::npos)
            << seq_start_error(s);
    }
    s = sample_seq_start();
    s.logit_bias.assign(kMaxSeqLogitBias, SeqLogitBias{1, 1.0f});
    EXPECT_EQ(seq_start_error(s), "");
    s.logit_bias.push_back({1, 1.0f});
    EXPECT_NE(seq_start_error(s).find("limit 2048"), std::string::npos) << seq_start_error(s);
    // DRY's breakers: at most kMaxSeqDryTail tokens a tail, kMaxSeqDryTailTokens in all.
    s = sample_seq_start();
    s.dry_breakers[1].tail.assign(kMaxSeqDryTail + 1, 1);
    EXPECT_NE(seq_start_error(s).find("limit 20"), std::string::npos) << seq_start_error(s);
    s = sample_seq_start();
    s.dry_breakers.assign(kMaxSeqDryTailTokens / kMaxSeqDryTail + 1,
                          SeqDryBreaker{1, std::vector<int32_t>(kMaxSeqDryTail, 1)});
    EXPECT_NE(seq_start_error(s).find("tails hold"), std::string::npos) << seq_start_error(s);
    s = sample_seq_start();
    s.xtc_threshold = NAN;
    EXPECT_NE(seq_start_error(s).find("xtc_threshold"), std::string::npos) << seq_start_error(s);
    s = sample_seq_start();
    s.dynatemp_exponent = INFINITY;
    EXPECT_NE(seq_start_error(s).find("dynatemp_exponent"), std::string::npos) << seq_start_error(s);
    s = sample_seq_start();
    s.mirostat_eta = NAN;
    EXPECT_NE(seq_start_error(s).find("mirostat_eta"), std::string::npos) << seq_start_error(s);
    s = sample_seq_start();
    s.mirostat_mu = NAN;  // the start value
    EXPECT_EQ(seq_start_error(s), "");
    s.mirostat_mu = -INFINITY;
    EXPECT_NE(seq_start_error(s).find("mirostat_mu"), std::string::npos) << seq_start_error(s);
    s = sample_seq_start();
    s.keep_from = -1;
    EXPECT_NE(seq_start_error(s).find("keep_from -1 is negative"), std::string::npos) << seq_start_error(s);
    b.clear();
    encode(ErrorMsg{0, "ok is not an error"}, b);
    EXPECT_FALSE(decode_error(b).ok());
}

// ---- forward / result ------------------------------------------------------------------------------------

TEST(NetCodec, ForwardTokensRoundTrip) {
    const Rows r = sample_rows(12);
    Bytes b;
    encode_forward(r.pos, r.seq, r.want, r.tokens, nullptr, 0, WireType::f32, b);
    auto v = decode_forward(b);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->header.n_rows, 12u);
    EXPECT_TRUE(v->header.flags & kForwardTokens);
    EXPECT_TRUE(v->hidden.empty());
    EXPECT_EQ(std::vector<int32_t>(v->pos.begin(), v->pos.end()), r.pos);
    EXPECT_EQ(std::vector<int32_t>(v->seq.begin(), v->seq.end()), r.seq);
    EXPECT_EQ(std::vector<int32_t>(v->token.begin(), v->token.end()), r.tokens);
    EXPECT_EQ(std::vector<uint8_t>(v->want.begin(), v->want.end()), r.want);
}

// v12: a step with draft rows sends its token ids (the guesses) with the hidden rows past the first stage.
TEST(NetCodec, ForwardHiddenRowsMayCarryTheirTokenIds) {
    const size_t n_rows = 5, n_embd = 64;
    Rows r = sample_rows(n_rows);
    r.want = {1, 3, 3, 0, 1};
    const std::vector<float> x = random_rows(n_rows * n_embd, 4);
    Bytes b;
    encode_forward(r.pos, r.seq, r.want, r.tokens, x.data(), n_embd, WireType::f32, b);
    EXPECT_EQ(b.size(), forward_payload_bytes(n_rows, n_embd, WireType::f32) + 4 * n_rows);
    auto v = decode_forward(b);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->header.flags, kForwardRowTokens);
    EXPECT_EQ(std::vector<int32_t>(v->token.begin(), v->token.end()), r.tokens);
    EXPECT_EQ(std::vector<uint8_t>(v->want.begin(), v->want.end()), r.want);
    std::vector<float> y(n_rows * n_embd);
    wire_to_f32(*v, y.data());
    EXPECT_EQ(y, x);
    // Both flags, a short body, a negative id, an unknown want: refused.
    Bytes bad = b;
    bad[12] = static_cast<uint8_t>(kForwardTokens | kForwardRowTokens);
    EXPECT_FALSE(decode_forward(bad).ok());
    bad = b;
    bad.resize(b.size() - 4 * n_rows);
    EXPECT_FALSE(decode_forward(bad).ok());
    r.tokens[2] = -3;
    encode_forward(r.pos, r.seq, r.want, r.tokens, x.data(), n_embd, WireType::f32, bad);
    EXPECT_FALSE(decode_forward(bad).ok());
    r.want[1] = 5;
    r.tokens[2] = 3;
    encode_forward(r.pos, r.seq, r.want, r.tokens, x.data(), n_embd, WireType::f32, bad);
    EXPECT_FALSE(decode_forward(bad).ok());
}

TEST(NetCodec, ForwardHiddenRoundTripPerWireType) {
    const size_t n_rows = 7, n_embd = 256;
    const Rows r = sample_rows(n_rows);
    const std::vector<float> x = random_rows(n_rows * n_embd, 3);
    for (WireType w : {WireType::f32, WireType::f16, WireType::q8_0}) {
        SCOPED_TRACE(wire_type_name(w));
        Bytes b;
        encode_forward(r.pos, r.seq, r.want, {}, x.data(), n_embd, w, b);
        auto v = decode_forward(b);
        ASSERT_TRUE(v.ok()) << v.status().message();
        EXPECT_EQ(v->hidden.size(), n_rows * wire_row_bytes(w, n_embd));
        EXPECT_EQ(std::vector<int32_t>(v->pos.begin(), v->pos.end()), r.pos);
        std::vector<float> y(n_rows * n_embd);
        wire_to_f32(*v, y.data());
        for (size_t row = 0; row < n_rows; ++row) {
            for (size_t blk = 0; blk < n_embd / 32; ++blk) {
                float amax = 0.0f;
                for (size_t j = 0; j < 32; ++j)
                    amax = std::max(amax, std::fabs(x[row * n_embd + blk * 32 + j]));
                for (size_t j = 0; j < 32; ++j) {
                    const size_t i = row * n_embd + blk * 32 + j;
                    // f32 exact; f16 half an ulp (2^-11 relative); q8_0 half a step of d = amax/127, plus
                    // |q| <= 127 times the f16 rounding of d itself (d 2^-11): d (0.5 + 127 * 2^-11) < 0.57
                    // d.
                    const float tol = w == WireType::f32   ? 0.0f
                                      : w == WireType::f16 ? std::fabs(x[i]) * 4.9e-4f
                                                           : amax / 127.0f * 0.57f + 1e-6f;
                    ASSERT_LE(std::fabs(y[i] - x[i]), tol) << "row " << row << " elem " << i;
                }
            }
        }
    }
}

TEST(NetCodec, EncodeForwardReusesCapacity) {
    const Rows r = sample_rows(16);
    const std::vector<float> x = random_rows(16 * 128, 4);
    Bytes b;
    encode_forward(r.pos, r.seq, r.want, {}, x.data(), 128, WireType::f16, b);
    const uint8_t *data = b.data();
    const size_t cap = b.capacity();
    for (int i = 0; i < 3; ++i) {
        encode_forward(r.pos, r.seq, r.want, {}, x.data(), 128, WireType::q8_0, b);  // smaller
        encode_forward(r.pos, r.seq, r.want, {}, x.data(), 128, WireType::f16, b);
    }
    EXPECT_EQ(b.data(), data);
    EXPECT_EQ(b.capacity(), cap);
}

TEST(NetCodec, ForwardRejectsMalformedPayloads) {
    const Rows r = sample_rows(12);
    const std::vector<float> x = random_rows(12 * 64, 5);
    Bytes good;
    encode_forward(r.pos, r.seq, r.want, {}, x.data(), 64, WireType::f16, good);
    auto expect_error = [](const Bytes &b, const std::string &needle) {
        auto v = decode_forward(b);
        ASSERT_FALSE(v.ok()) << "expected: " << needle;
        EXPECT_EQ(v.status().kind(), ErrorKind::invalid_input);
        EXPECT_NE(v.status().message().find(needle), std::string::npos) << v.status().message();
    };
    Bytes b(good.begin(), good.end() - 800);
    expect_error(b, "forward: 12 f16 rows need " + std::to_string(good.size()) + " bytes, payload has " +
                        std::to_string(good.size() - 800));
    b = good;
    b.push_back(0);
    expect_error(b, "payload has");
    b = good;
    put_le<uint32_t>(b, 0, kMaxBatchRows + 1);
    expect_error(b, "n_rows 8193");
    b = good;
    put_le<uint32_t>(b, 0, 0);
    expect_error(b, "n_rows 0");
    b = good;
    put_le<uint32_t>(b, 4, kMaxEmbd + 1);
    expect_error(b, "n_embd 65537");
    b = good;
    put_le<uint32_t>(b, 8, static_cast<uint32_t>(WireType::q8_0));
    put_le<uint32_t>(b, 4, 48);
    expect_error(b, "divisible by 32");
    b = good;
    put_le<uint32_t>(b, 8, 3);
    expect_error(b, "unknown wire type 3");
    b = good;
    put_le<uint32_t>(b, 12, 0x80);
    expect_error(b, "unknown flags");
    b = good;
    b[16 + 8 * 12 + 3] = 5;  // want[3]: 2 is an embedding (v11), 3 a draft (v12), 4 a score (v18), 5 nothing
    expect_error(b, "want must be 0, 1, 2, 3 or 4");
    b[16 + 8 * 12 + 3] = 4;  // a score row needs the step's targets
    expect_error(b, "is a score row but the step carries no targets");
    b = good;
    put_le<int32_t>(b, 16, -1);  // pos[0]
    expect_error(b, "pos -1");
}

TEST(NetCodec, ResultRoundTripWithAndWithoutLogits) {
    const ResultRow rows[3] = {{0, 42, -0.5f, 9.5f}, {1, 7, -1.25f, -0.75f}, {5, 0, 0.0f, 0.0f}};
    const uint32_t n_vocab = 33;
    const std::vector<float> logits = random_rows(3 * n_vocab, 6);
    Bytes b;
    encode_result(rows, nullptr, n_vocab, nullptr, 0, b);
    auto v = decode_result(b, n_vocab, 8);
    ASSERT_TRUE(v.ok()) << v.status().message();
    ASSERT_EQ(v->n_outputs, 3u);
    EXPECT_FALSE(v->flags & kResultLogits);
    EXPECT_TRUE(v->logits.empty());
    for (uint32_t i = 0; i < 3; ++i) {
        EXPECT_EQ(v->row(i).seq, rows[i].seq);
        EXPECT_EQ(v->row(i).token, rows[i].token);
        EXPECT_EQ(v->row(i).logprob, rows[i].logprob);
        EXPECT_EQ(v->row(i).mirostat_mu, rows[i].mirostat_mu);
    }

    encode_result(rows, logits.data(), n_vocab, nullptr, 0, b);
    v = decode_result(b, n_vocab, 8);
    ASSERT_TRUE(v.ok()) << v.status().message();
    ASSERT_EQ(v->logits.size(), 3 * n_vocab * 4);
    EXPECT_EQ(std::memcmp(v->logits.data(), logits.data(), v->logits.size()), 0);
    EXPECT_EQ(v->row(2).seq, 5);

    auto wrong = decode_result(b, n_vocab + 1, 8);  // the receiver's vocabulary differs
    ASSERT_FALSE(wrong.ok());
    EXPECT_NE(wrong.status().message().find("result: 3 outputs with 34 logits each need"), std::string::npos)
        << wrong.status().message();
    EXPECT_FALSE(decode_result(b, 0, 8).ok());
    put_le<uint32_t>(b, 0, kMaxBatchRows + 1);
    EXPECT_FALSE(decode_result(b, n_vocab, 8).ok());
}

// v11: rows that wanted an embedding carry token -1, and their hidden states follow the other rows' logits.
TEST(NetCodec, ResultCarriesEmbeddingRowsAfterTheSampledRowsLogits) {
    const ResultRow rows[3] = {{0, 42, -0.5f}, {1, kEmbeddingRowToken, 0.0f}, {2, 7, -1.0f}};
    const uint32_t n_vocab = 33, n_embd = 12;
    const std::vector<float> logits = random_rows(2 * n_vocab, 7);  // rows 0 and 2
    const std::vector<float> embd = random_rows(n_embd, 8);         // row 1
    Bytes b;
    encode_result(rows, logits.data(), n_vocab, embd.data(), n_embd, b);
    auto v = decode_result(b, n_vocab, n_embd);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->flags, kResultLogits | kResultEmbeddings);
    EXPECT_EQ(v->n_embedding_rows, 1u);
    EXPECT_EQ(v->n_embd, n_embd);
    ASSERT_EQ(v->logits.size(), 2 * n_vocab * 4);
    EXPECT_EQ(std::memcmp(v->logits.data(), logits.data(), v->logits.size()), 0);
    ASSERT_EQ(v->embeddings.size(), n_embd * 4);
    EXPECT_EQ(std::memcmp(v->embeddings.data(), embd.data(), v->embeddings.size()), 0);
    EXPECT_EQ(v->row(1).token, kEmbeddingRowToken);

    // Without logits: the embeddings follow the rows.
    encode_result(rows, nullptr, n_vocab, embd.data(), n_embd, b);
    v = decode_result(b, n_vocab, n_embd);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->flags, kResultEmbeddings);
    EXPECT_EQ(std::memcmp(v->embeddings.data(), embd.data(), v->embeddings.size()), 0);

    // The receiver's model is another width.
    auto wrong = decode_result(b, n_vocab, n_embd + 1);
    ASSERT_FALSE(wrong.ok());
    EXPECT_NE(wrong.status().message().find("embeddings of 12 values"), std::string::npos)
        << wrong.status().message();
    // Embedding rows without their values.
    Bytes c(b.begin(), b.begin() + 8 + 3 * kResultRowBytes);
    put_le<uint32_t>(c, 4, 0);
    auto missing = decode_result(c, n_vocab, n_embd);
    ASSERT_FALSE(missing.ok());
    EXPECT_NE(missing.status().message().find("1 embedding rows without"), std::string::npos)
        << missing.status().message();
    // A short embeddings block.
    b.resize(b.size() - 4);
    EXPECT_FALSE(decode_result(b, n_vocab, n_embd).ok());
}

// v18: a step with score rows carries each row's target after the token ids, or after none with hidden rows;
// a result carries each logits row's most likely tokens as (id, logprob) pairs before the logits.
TEST(NetCodec, ScoreRowsCarryTheirTargetsAndResultsTheirAlternatives) {
    Rows r = sample_rows(4);
    r.want = {kWantScore, kWantScore, 0, 1};
    const std::vector<int32_t> targets = {5, 9, -1, -1};
    const std::vector<float> hidden = random_rows(4 * 64, 11);
    for (const bool tokens : {true, false}) {
        Bytes b;
        encode_forward(r.pos, r.seq, r.want,
                       tokens ? std::span<const int32_t>(r.tokens) : std::span<const int32_t>(),
                       tokens ? nullptr : hidden.data(), 64, WireType::f16, b, targets);
        auto v = decode_forward(b);
        ASSERT_TRUE(v.ok()) << v.status().message();
        EXPECT_TRUE(v->header.flags & kForwardTargets);
        EXPECT_EQ(std::vector<int32_t>(v->target.begin(), v->target.end()), targets);
        if (tokens) {
            EXPECT_EQ(std::vector<int32_t>(v->token.begin(), v->token.end()), r.tokens);
        } else {
            EXPECT_EQ(v->hidden.size(), 4 * 64 * 2u);
        }
        // A target that breaks the rule: negative on a score row, set on another row.
        for (const auto &[row, value] : {std::pair{0, -1}, std::pair{2, 3}}) {
            Bytes bad = b;
            const size_t at = b.size() - (tokens ? 0 : v->hidden.size()) - 16 + 4 * row;
            put_le<int32_t>(bad, at, value);
            auto e = decode_forward(bad);
            ASSERT_FALSE(e.ok()) << row;
            EXPECT_NE(e.status().message().find("has target"), std::string::npos) << e.status().message();
        }
    }
    // A score row in a step without targets.
    Bytes no_targets;
    encode_forward(r.pos, r.seq, std::vector<uint8_t>{0, 0, 0, 1}, r.tokens, nullptr, 0, WireType::f32,
                   no_targets);
    put_le<uint8_t>(no_targets, 16 + 2 * 4 * 4, kWantScore);
    auto e = decode_forward(no_targets);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find("carries no targets"), std::string::npos) << e.status().message();

    // Result: a score row, an embedding row, a sampled row; the first with 2 alternatives, the last with 1.
    const ResultRow rows[3] = {{0, 5, -2.5f}, {1, kEmbeddingRowToken, 0.0f}, {2, 7, -0.25f}};
    const uint32_t counts[2] = {2, 1};
    const ResultTop pairs[3] = {{3, -0.1f}, {5, -2.5f}, {7, -0.25f}};
    const uint32_t n_vocab = 16, n_embd = 8;
    const std::vector<float> logits = random_rows(2 * n_vocab, 12);
    const std::vector<float> embd = random_rows(n_embd, 13);
    Bytes b;
    encode_result(rows, logits.data(), n_vocab, embd.data(), n_embd, b, counts, pairs);
    auto v = decode_result(b, n_vocab, n_embd);
    ASSERT_TRUE(v.ok()) << v.status().message();
    EXPECT_EQ(v->flags, kResultLogits | kResultEmbeddings | kResultTop);
    ASSERT_EQ(v->top_counts.size(), 8u);
    EXPECT_EQ(v->top_count(0), 2u);
    EXPECT_EQ(v->top_count(1), 1u);
    for (uint64_t k = 0; k < 3; ++k) {
        EXPECT_EQ(v->top_pair(k).id, pairs[k].id);
        EXPECT_EQ(v->top_pair(k).logprob, pairs[k].logprob);
    }
    EXPECT_EQ(std::memcmp(v->logits.data(), logits.data(), v->logits.size()), 0);
    EXPECT_EQ(std::memcmp(v->embeddings.data(), embd.data(), v->embeddings.size()), 0);
    // Too many alternatives, an id outside the vocabulary, a NaN logprob, a short list.
    const size_t counts_at = 8 + 3 * kResultRowBytes, pairs_at = counts_at + 8;
    for (const auto &[at, value, why] :
         {std::tuple{counts_at, uint32_t{kMaxResultTop + 1}, "alternatives, limit"},
          std::tuple{pairs_at, n_vocab, "alternative 0 is token 16"},
          std::tuple{pairs_at + 12, 0x7fc00000u, "with logprob nan"}}) {
        Bytes bad = b;
        put_le<uint32_t>(bad, at, value);
        auto w = decode_result(bad, n_vocab, n_embd);
        ASSERT_FALSE(w.ok()) << why;
        EXPECT_NE(w.status().message().find(why), std::string::npos) << w.status().message();
    }
    Bytes cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(pairs_at + 4));
    EXPECT_FALSE(decode_result(cut, n_vocab, n_embd).ok());

    // SeqStart's n_probs travels and is bounded.
    SeqStart m;
    m.n_probs = 7;
    Bytes s;
    encode(m, s);
    auto d = decode_seq_start(s);
    ASSERT_TRUE(d.ok()) << d.status().message();
    EXPECT_EQ(d->n_probs, 7);
    put_le<int32_t>(s, s.size() - 4, static_cast<int32_t>(kMaxResultTop) + 1);
    EXPECT_FALSE(decode_seq_start(s).ok());
}

// Deterministic mutations of every message: byte flips, truncations, extensions, header-field rewrites.
// Nothing may crash, over-read (ASan) or hang; most mutations must be caught.
TEST(NetCodec, MutatedPayloadsNeverCrash) {
    std::mt19937 rng(1234);
    size_t n_rejected = 0, n_total = 0;
    for (const auto &[type, bytes] : all_messages()) {
        for (int iter = 0; iter < 400; ++iter) {
            Bytes m = bytes;
            switch (rng() % 4) {
                case 0:  // flip 1..4 bytes
                    for (int k = 1 + rng() % 4; k > 0 && !m.empty(); --k)
                        m[rng() % m.size()] ^= 1 + rng() % 255;
                    break;
                case 1:
                    m.resize(m.empty() ? 0 : rng() % m.size());
                    break;
                case 2:
                    for (int k = 1 + rng() % 8; k > 0; --k) m.push_back(static_cast<uint8_t>(rng()));
                    break;
                case 3:  // rewrite an aligned u32 with a boundary value
                    if (m.size() >= 4) {
                        const uint32_t vals[] = {0,           1,    0x7fffffff, 0x80000000u,
                                                 0xffffffffu, 4097, 8193,       65537};
                        put_le<uint32_t>(m, 4 * (rng() % (m.size() / 4)), vals[rng() % 8]);
                    }
                    break;
            }
            ++n_total;
            if (!decode_any(type, m).ok()) ++n_rejected;
        }
    }
    EXPECT_GT(n_rejected, n_total / 2) << n_rejected << " of " << n_total;
}

// ---- TCP -------------------------------------------------------------------------------------------------

struct Pair {
    std::unique_ptr<Listener> listener;
    std::unique_ptr<Connection> client, server;
};

Pair connect_pair() {
    Pair p;
    auto l = tcp_listen("127.0.0.1", 0);
    EXPECT_TRUE(l.ok()) << l.status().message();
    p.listener = std::move(*l);
    auto c = tcp_connect("127.0.0.1", p.listener->port(), 2000);
    EXPECT_TRUE(c.ok()) << c.status().message();
    p.client = std::move(*c);
    auto s = p.listener->accept(2000);
    EXPECT_TRUE(s.ok()) << s.status().message();
    p.server = std::move(*s);
    return p;
}

// A plain socket, for peers that do not speak the protocol.
int raw_connect(uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    return fd;
}

void write_all(int fd, const void *p, size_t n) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    while (n > 0) {
        const ssize_t r = ::send(fd, b, n, MSG_NOSIGNAL);
        ASSERT_GT(r, 0);
        b += r;
        n -= static_cast<size_t>(r);
    }
}

TEST(NetTcp, FramesBothWays) {
    Pair p = connect_pair();
    ASSERT_TRUE(p.server);
    EXPECT_NE(p.listener->address().find("127.0.0.1:"), std::string::npos);
    EXPECT_EQ(p.client->peer(), p.listener->address());
    EXPECT_EQ(p.server->peer(), p.client->local());

    Bytes hello;
    encode(sample_hello(), hello);
    ASSERT_TRUE(p.client->send_msg(MsgType::hello, 17, hello).ok());
    FrameHeader h;
    Bytes payload;
    ASSERT_TRUE(p.server->recv(h, payload, 2000).ok());
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::hello));
    EXPECT_EQ(h.request_id, 17u);
    EXPECT_EQ(payload, hello);
    ASSERT_TRUE(decode_hello(payload).ok());

    // Reply with a frame split over three parts and an empty one.
    Bytes reply;
    encode(sample_hello_reply(), reply);
    std::span<const uint8_t> all(reply);
    std::span<const uint8_t> parts[4] = {all.first(3), {}, all.subspan(3, 10), all.subspan(13)};
    ASSERT_TRUE(p.server->send(MsgType::hello_reply, 17, 0x2, parts).ok());
    ASSERT_TRUE(p.client->recv(h, payload, 2000).ok());
    EXPECT_EQ(h.flags, 0x2u);
    EXPECT_EQ(payload, reply);

    // Empty payload.
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 18, {}).ok());
    ASSERT_TRUE(p.server->recv(h, payload, 2000).ok());
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::ping));
    EXPECT_TRUE(payload.empty());

    EXPECT_EQ(p.client->stats().msgs_sent, 2u);
    EXPECT_EQ(p.client->stats().bytes_sent, 2 * kHeaderBytes + hello.size());
    EXPECT_EQ(p.server->stats().msgs_recv, 2u);
    EXPECT_EQ(p.client->stats().msgs_recv, 1u);
    EXPECT_EQ(p.client->stats().bytes_recv, kHeaderBytes + reply.size());
}

TEST(NetTcp, LocalhostResolves) {
    auto l = tcp_listen("localhost", 0);
    ASSERT_TRUE(l.ok()) << l.status().message();
    auto c = tcp_connect("localhost", (*l)->port(), 2000);
    ASSERT_TRUE(c.ok()) << c.status().message();
    auto s = (*l)->accept(2000);
    ASSERT_TRUE(s.ok()) << s.status().message();
    auto bad = tcp_connect("no-such-host.invalid", 1, 2000);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("no-such-host.invalid"), std::string::npos);
}

TEST(NetTcp, LargeForwardFrame) {
    Pair p = connect_pair();
    const size_t n_rows = 128, n_embd = 65536;  // [128, 65536] f32 = 32 MiB of hidden state
    const Rows r = sample_rows(n_rows);
    std::vector<float> x(n_rows * n_embd);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000) * 0.5f;
    Bytes frame;
    encode_forward(r.pos, r.seq, r.want, {}, x.data(), n_embd, WireType::f32, frame);
    ASSERT_GE(frame.size(), 32u << 20);
    Status sent;
    std::thread sender([&] { sent = p.client->send_msg(MsgType::forward, 9, frame, 10000); });
    FrameHeader h;
    Bytes payload;
    Status got = p.server->recv(h, payload, 10000);
    sender.join();
    ASSERT_TRUE(sent.ok()) << sent.message();
    ASSERT_TRUE(got.ok()) << got.message();
    ASSERT_EQ(payload.size(), frame.size());
    EXPECT_TRUE(payload == frame);
    auto v = decode_forward(payload);
    ASSERT_TRUE(v.ok());
    std::vector<float> y(x.size());
    wire_to_f32(*v, y.data());
    EXPECT_EQ(y, x);
}

TEST(NetTcp, GarbagePeerIsRejectedAndListenerStaysUp) {
    auto l = tcp_listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    const int fd = raw_connect((*l)->port());
    auto s = (*l)->accept(2000);
    ASSERT_TRUE(s.ok());
    const char garbage[] = "GET / HTTP/1.1\r\nHost: example\r\n\r\n";
    write_all(fd, garbage, sizeof garbage);
    FrameHeader h;
    Bytes payload;
    Status st = (*s)->recv(h, payload, 2000);
    EXPECT_EQ(st.kind(), ErrorKind::invalid_input);
    EXPECT_NE(st.message().find("magic"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("127.0.0.1:"), std::string::npos) << st.message();
    EXPECT_EQ((*s)->recv(h, payload, 100).kind(), ErrorKind::invalid_input);  // stays broken
    (*s)->close();
    ::close(fd);

    // The next peer is served normally.
    auto c = tcp_connect("127.0.0.1", (*l)->port(), 2000);
    ASSERT_TRUE(c.ok());
    auto s2 = (*l)->accept(2000);
    ASSERT_TRUE(s2.ok());
    ASSERT_TRUE((*c)->send_msg(MsgType::seq_clear, 1, Bytes{1, 0, 0, 0}).ok());
    ASSERT_TRUE((*s2)->recv(h, payload, 2000).ok());
    EXPECT_EQ(h.type, static_cast<uint16_t>(MsgType::seq_clear));
}

TEST(NetTcp, HugeAnnouncedPayloadIsRejectedWithoutAllocating) {
    auto l = tcp_listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    for (uint64_t announced : {uint64_t{2} << 30, uint64_t{2} << 20}) {
        const int fd = raw_connect((*l)->port());
        auto s = (*l)->accept(2000);
        ASSERT_TRUE(s.ok());
        (*s)->set_recv_limit(1 << 20);
        FrameHeader fh;
        fh.type = static_cast<uint16_t>(MsgType::forward);
        fh.payload_bytes = announced;
        uint8_t raw[kHeaderBytes];
        encode_header(fh, raw);
        write_all(fd, raw, sizeof raw);
        FrameHeader h;
        Bytes payload;
        Status st = (*s)->recv(h, payload, 2000);
        EXPECT_EQ(st.kind(), ErrorKind::invalid_input) << st.message();
        EXPECT_NE(st.message().find("exceeds"), std::string::npos) << st.message();
        EXPECT_EQ(payload.capacity(), 0u);
        ::close(fd);
    }
}

TEST(NetTcp, HalfPayloadThenCloseIsDisconnected) {
    auto l = tcp_listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    const int fd = raw_connect((*l)->port());
    auto s = (*l)->accept(2000);
    ASSERT_TRUE(s.ok());
    FrameHeader fh;
    fh.type = static_cast<uint16_t>(MsgType::weights_chunk);
    fh.payload_bytes = 1000;
    uint8_t raw[kHeaderBytes];
    encode_header(fh, raw);
    write_all(fd, raw, sizeof raw);
    Bytes half(500, 7);
    write_all(fd, half.data(), half.size());
    ::close(fd);
    FrameHeader h;
    Bytes payload;
    Status st = (*s)->recv(h, payload, 2000);
    EXPECT_EQ(st.kind(), ErrorKind::disconnected) << st.message();
    EXPECT_NE(st.message().find("closed the connection"), std::string::npos) << st.message();
    EXPECT_FALSE((*s)->is_open());
}

TEST(NetTcp, RecvTimeoutLeavesAnIdleConnectionUsable) {
    Pair p = connect_pair();
    FrameHeader h;
    Bytes payload;
    const auto t0 = Clock::now();
    Status st = p.server->recv(h, payload, 100);
    const double ms = ms_since(t0);
    EXPECT_EQ(st.kind(), ErrorKind::failed) << st.message();
    EXPECT_NE(st.message().find("within 100 ms"), std::string::npos) << st.message();
    EXPECT_GE(ms, 95.0);
    EXPECT_LT(ms, 2000.0);
    ASSERT_TRUE(p.client->send_msg(MsgType::ping, 3, {}).ok());
    ASSERT_TRUE(p.server->recv(h, payload, 2000).ok());
    EXPECT_EQ(h.request_id, 3u);
}

TEST(NetTcp, CloseFromAnotherThreadUnblocksRecvAndAccept) {
    Pair p = connect_pair();
    Status st;
    Clock::time_point returned;
    std::thread t([&] {
        FrameHeader h;
        Bytes payload;
        st = p.server->recv(h, payload, -1);
        returned = Clock::now();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto closed_at = Clock::now();
    p.server->close();
    t.join();
    EXPECT_EQ(st.kind(), ErrorKind::disconnected) << st.message();
    // The brief asks for 100 ms; the bound leaves room for a loaded machine (it takes well under 1 ms).
    const double wake_ms = std::chrono::duration<double, std::milli>(returned - closed_at).count();
    EXPECT_LT(wake_ms, 250.0);
    EXPECT_FALSE(p.server->is_open());
    EXPECT_EQ(p.server->send_msg(MsgType::ping, 1, {}).kind(), ErrorKind::disconnected);

    Result<std::unique_ptr<Connection>> acc = make_error(ErrorKind::failed, "accept did not run");
    std::thread a([&] { acc = p.listener->accept(-1); });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto t1 = Clock::now();
    p.listener->close();
    a.join();
    EXPECT_LT(ms_since(t1), 250.0);
    ASSERT_FALSE(acc.ok());
    EXPECT_EQ(acc.status().kind(), ErrorKind::disconnected) << acc.status().message();
}

TEST(NetTcp, ConnectToClosedPortFailsFast) {
    uint16_t port = 0;
    {
        auto l = tcp_listen("127.0.0.1", 0);
        ASSERT_TRUE(l.ok());
        port = (*l)->port();
    }
    const auto t0 = Clock::now();
    auto c = tcp_connect("127.0.0.1", port, 5000);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().kind(), ErrorKind::disconnected) << c.status().message();
    EXPECT_NE(c.status().message().find(fmt::format("127.0.0.1:{}", port)), std::string::npos);
    EXPECT_LT(ms_since(t0), 1000.0);
}

TEST(NetTcp, ParseHostPort) {
    std::string host;
    uint16_t port = 0;
    ASSERT_TRUE(parse_host_port("10.0.0.2:9100", &host, &port).ok());
    EXPECT_EQ(host, "10.0.0.2");
    EXPECT_EQ(port, 9100);
    ASSERT_TRUE(parse_host_port("[::1]:80", &host, &port).ok());
    EXPECT_EQ(host, "::1");
    EXPECT_EQ(port, 80);
    ASSERT_TRUE(parse_host_port("localhost:0", &host, &port).ok());
    for (const char *bad : {"nohost", ":9000", "host:", "host:65536", "host:12x", "::1:80", "[::1]80"}) {
        Status st = parse_host_port(bad, &host, &port);
        EXPECT_FALSE(st.ok()) << bad;
        EXPECT_NE(st.message().find(std::string("'") + bad + "'"), std::string::npos) << st.message();
    }
}

// Whole mutated frames through a socketpair: the receiver gets an error or a frame, never a crash or a hang.
TEST(NetTcp, MutatedFramesThroughASocket) {
    std::mt19937 rng(99);
    const auto msgs = all_messages();
    int n_errors = 0;
    for (int iter = 0; iter < 300; ++iter) {
        const auto &[type, payload] = msgs[rng() % msgs.size()];
        FrameHeader fh;
        fh.type = static_cast<uint16_t>(type);
        fh.payload_bytes = payload.size();
        Bytes frame(kHeaderBytes);
        encode_header(fh, frame.data());
        frame.insert(frame.end(), payload.begin(), payload.end());
        for (int k = 1 + rng() % 3; k > 0; --k) frame[rng() % frame.size()] ^= 1 + rng() % 255;
        if (rng() % 4 == 0) frame.resize(rng() % frame.size());

        int sv[2];
        ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        auto conn = connection_from_fd(sv[0]);
        ASSERT_TRUE(conn.ok());
        write_all(sv[1], frame.data(), frame.size());
        ::close(sv[1]);  // EOF after the bytes: a short frame ends in disconnected, not a wait
        FrameHeader h;
        Bytes got;
        for (;;) {
            Status st = (*conn)->recv(h, got, 2000);
            if (!st.ok()) {
                EXPECT_NE(st.kind(), ErrorKind::failed) << st.message();  // never a timeout
                ++n_errors;
                break;
            }
            (void)decode_any(static_cast<MsgType>(h.type), got);
        }
    }
    EXPECT_EQ(n_errors, 300);
}

// ---- AsyncSender -----------------------------------------------------------------------------------------

TEST(NetAsyncSender, ThousandFramesArriveInOrder) {
    Pair p = connect_pair();
    constexpr int kFrames = 1000;
    int n_ok = 0;
    std::thread reader([&] {
        FrameHeader h;
        Bytes payload;
        for (int i = 0; i < kFrames; ++i) {
            Status st = p.server->recv(h, payload, 5000);
            if (!st.ok() || h.request_id != static_cast<uint64_t>(i) ||
                payload.size() != size_t(i % 97) * 64 ||
                (!payload.empty() && payload[0] != static_cast<uint8_t>(i)))
                break;
            ++n_ok;
        }
    });
    {
        AsyncSender sender(*p.client, 4);
        Bytes frame;
        for (int i = 0; i < kFrames; ++i) {
            frame.assign(size_t(i % 97) * 64, static_cast<uint8_t>(i));
            ASSERT_TRUE(sender.enqueue(MsgType::forward, i, 0, frame).ok());
        }
        ASSERT_TRUE(sender.flush().ok());
    }
    reader.join();
    EXPECT_EQ(n_ok, kFrames);
    EXPECT_EQ(p.client->stats().msgs_sent, uint64_t{kFrames});
}

TEST(NetAsyncSender, ReportsThePeersCloseOnALaterCall) {
    Pair p = connect_pair();
    AsyncSender sender(*p.client, 2);
    p.server.reset();  // the peer goes away (with our frames unread: it resets the connection)
    Bytes frame(256 << 10, 1);
    Status st;
    for (int i = 0; i < 400 && st.ok(); ++i) st = sender.enqueue(MsgType::forward, i, 0, frame);
    if (st.ok()) st = sender.flush();
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.kind(), ErrorKind::disconnected) << st.message();
    EXPECT_NE(st.message().find("async send of forward"), std::string::npos) << st.message();
    EXPECT_FALSE(sender.flush().ok());  // sticky
    EXPECT_FALSE(sender.enqueue(MsgType::ping, 1, 0, {}).ok());
}

}  // namespace
}  // namespace td::net
