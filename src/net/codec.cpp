// Bytes <-> message structs. Every integer is little-endian on the wire; tandem builds only for little-endian
// hosts (static_assert below), so a field is one memcpy. A big-endian port would byte-swap in put/get only.
//
// Decoding reads through a Reader that knows the message name and the bytes left, so every length is checked
// against what is present and against its named maximum before anything is allocated or copied.
#include "net/codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "kernels/kernels.h"

namespace td::net {

static_assert(std::endian::native == std::endian::little,
              "the wire is little-endian; add byte swaps to port");

namespace {

// ---- writing ---------------------------------------------------------------------------------------------

template <typename T>
void put(std::vector<uint8_t> &out, T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out.size();
    out.resize(at + sizeof(T));
    std::memcpy(out.data() + at, &v, sizeof(T));
}

template <typename T>
void put_at(uint8_t *p, T v) {
    std::memcpy(p, &v, sizeof(T));
}

void put_string(std::vector<uint8_t> &out, const std::string &s) {
    // A longer string is a bug in the sender (names and messages are bounded where they are made); cut it so
    // the peer still gets a well-formed frame rather than one it must reject.
    const size_t n = std::min(s.size(), kMaxString);
    put<uint32_t>(out, static_cast<uint32_t>(n));
    out.insert(out.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
}

// The Reader's interface for writing, so each message's field list is written once (`*_fields` below) and
// serves both directions.
class Writer {
public:
    explicit Writer(std::vector<uint8_t> &out) : out_(out) {}
    template <typename T>
    Status field(const T &v, const char *) {
        put<T>(out_, v);
        return {};
    }
    Status finite(const float &v, const char *) { return field(v, nullptr); }
    Status string(const std::string &s, const char *) {
        put_string(out_, s);
        return {};
    }
    Status flag(const bool &v, const char *) { return field<uint8_t>(v ? 1 : 0, nullptr); }
    Status strings(const std::vector<std::string> &v, size_t, const char *) {
        put<uint32_t>(out_, static_cast<uint32_t>(v.size()));
        for (const std::string &s : v) put_string(out_, s);
        return {};
    }
    template <size_t N>
    Status bytes(const std::array<uint8_t, N> &v, const char *) {
        out_.insert(out_.end(), v.begin(), v.end());
        return {};
    }
    Status blob(const std::string &s, size_t max, const char *) {
        const size_t n = std::min(s.size(), max);
        put<uint32_t>(out_, static_cast<uint32_t>(n));
        out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
        return {};
    }
    Status timing(const double &v, const char *) { return field(v, nullptr); }
    // u32 count, then each element's fields.
    template <typename V, typename F>
    Status list(const V &v, size_t, const char *, F &&each) {
        put<uint32_t>(out_, static_cast<uint32_t>(v.size()));
        for (const auto &x : v) (void)each(x);
        return {};
    }

private:
    std::vector<uint8_t> &out_;
};

// ---- reading ---------------------------------------------------------------------------------------------

class Reader {
public:
    Reader(const char *what, std::span<const uint8_t> payload) : what_(what), p_(payload) {}

    template <typename T>
    Status field(T &v, const char *name) {
        static_assert(std::is_trivially_copyable_v<T>);
        if (p_.size() - off_ < sizeof(T)) {
            return invalid_input("{}: payload ends at byte {} reading {} ({} bytes needed, {} left)", what_,
                                 p_.size(), name, sizeof(T), p_.size() - off_);
        }
        std::memcpy(&v, p_.data() + off_, sizeof(T));
        off_ += sizeof(T);
        return {};
    }

    Status string(std::string &s, const char *name) {
        uint32_t n = 0;
        TD_TRY(field(n, name));
        if (n > kMaxString) return invalid_input("{}: {} is {} bytes, limit {}", what_, name, n, kMaxString);
        if (p_.size() - off_ < n) {
            return invalid_input("{}: {} needs {} bytes, payload has {} left", what_, name, n,
                                 p_.size() - off_);
        }
        s.assign(reinterpret_cast<const char *>(p_.data() + off_), n);
        off_ += n;
        return {};
    }

    // u32 count (<= max), then that many strings.
    Status strings(std::vector<std::string> &v, size_t max, const char *name) {
        uint32_t n = 0;
        TD_TRY(field(n, name));
        if (n > max) return invalid_input("{}: {} has {} entries, limit {}", what_, name, n, max);
        v.resize(n);
        for (std::string &s : v) TD_TRY(string(s, name));
        return {};
    }

    // u32 length (<= max), then that many bytes.
    Status blob(std::string &s, size_t max, const char *name) {
        uint32_t n = 0;
        TD_TRY(field(n, name));
        if (n > max) return invalid_input("{}: {} is {} bytes, limit {}", what_, name, n, max);
        if (left() < n)
            return invalid_input("{}: {} needs {} bytes, payload has {} left", what_, name, n, left());
        s.assign(reinterpret_cast<const char *>(p_.data() + off_), n);
        off_ += n;
        return {};
    }

    // A fixed-size byte array.
    template <size_t N>
    Status bytes(std::array<uint8_t, N> &v, const char *name) {
        if (left() < N)
            return invalid_input("{}: {} needs {} bytes at offset {}, the payload has {}", what_, name, N, off_,
                                 left());
        std::memcpy(v.data(), p_.data() + off_, N);
        off_ += N;
        return {};
    }

    Status finite(float &v, const char *name) {
        TD_TRY(field(v, name));
        if (!std::isfinite(v)) return invalid_input("{}: {} is not finite ({})", what_, name, v);
        return {};
    }

    // A measured time or rate: finite and not negative.
    Status timing(double &v, const char *name) {
        TD_TRY(field(v, name));
        if (!std::isfinite(v) || v < 0) return invalid_input("{}: {} of {} is not a finite, non-negative value", what_, name, v);
        return {};
    }

    // u32 count (<= max), then each element's fields.
    template <typename V, typename F>
    Status list(V &v, size_t max, const char *name, F &&each) {
        uint32_t n = 0;
        TD_TRY(field(n, name));
        if (n > max) return invalid_input("{}: {} has {} entries, limit {}", what_, name, n, max);
        v.resize(n);
        for (auto &x : v) TD_TRY(each(x));
        return {};
    }

    Status flag(bool &v, const char *name) {
        uint8_t b = 0;
        TD_TRY(field(b, name));
        if (b > 1) return invalid_input("{}: {} must be 0 or 1, got {}", what_, name, b);
        v = b != 0;
        return {};
    }

    // Exact size: a payload longer than its fields is corrupt (or from a version that should have bumped).
    Status finish() const {
        if (off_ != p_.size()) {
            return invalid_input(
                "{}: {} trailing bytes after the last field (payload is {} bytes, fields end at {})", what_,
                p_.size() - off_, p_.size(), off_);
        }
        return {};
    }

    size_t offset() const { return off_; }
    size_t left() const { return p_.size() - off_; }
    void skip_rest() { off_ = p_.size(); }

private:
    const char *what_;
    std::span<const uint8_t> p_;
    size_t off_ = 0;
};

size_t pad4(size_t n) {
    return (n + 3) & ~size_t{3};
}

// Forward payload layout (offsets from the payload start).
struct ForwardLayout {
    size_t pos = 0, seq = 0, want = 0, body = 0, total = 0;
};
ForwardLayout forward_layout(uint64_t n_rows, uint64_t body_bytes) {
    ForwardLayout l;
    l.pos = sizeof(ForwardHeader);
    l.seq = l.pos + 4 * n_rows;
    l.want = l.seq + 4 * n_rows;
    l.body = l.want + pad4(n_rows);
    l.total = l.body + body_bytes;
    return l;
}

const kernels::TypeKernels *wire_kernels(WireType wire) {
    const kernels::TypeKernels *k = nullptr;
    switch (wire) {
        case WireType::f32:
            return nullptr;
        case WireType::f16:
            k = kernels::type_kernels(DType::f16);
            break;
        case WireType::q8_0:
            k = kernels::type_kernels(DType::q8_0);
            break;
    }
    TD_ASSERT(k != nullptr && k->from_float != nullptr && k->to_float != nullptr,
              "no kernels for wire type {}", wire_type_name(wire));
    return k;
}

}  // namespace

// ---- header ----------------------------------------------------------------------------------------------

void encode_header(const FrameHeader &h, uint8_t out[kHeaderBytes]) {
    put_at(out + 0, h.magic);
    put_at(out + 4, h.version);
    put_at(out + 6, h.type);
    put_at(out + 8, h.flags);
    put_at(out + 12, h.reserved);
    put_at(out + 16, h.payload_bytes);
    put_at(out + 24, h.request_id);
}

Result<FrameHeader> decode_header(const uint8_t in[kHeaderBytes]) {
    FrameHeader h;
    std::memcpy(&h.magic, in + 0, 4);
    std::memcpy(&h.version, in + 4, 2);
    std::memcpy(&h.type, in + 6, 2);
    std::memcpy(&h.flags, in + 8, 4);
    std::memcpy(&h.reserved, in + 12, 4);
    std::memcpy(&h.payload_bytes, in + 16, 8);
    std::memcpy(&h.request_id, in + 24, 8);
    if (h.magic != kMagic) {
        return invalid_input(
            "bad frame magic 0x{:08x} (expected 0x{:08x} \"TDM1\"): the peer is not a tandem node "
            "or the stream is corrupt",
            h.magic, kMagic);
    }
    if (!msg_type_known(h.type)) {
        return invalid_input("unknown message type {} (protocol version {}, we speak {})", h.type, h.version,
                             kProtocolVersion);
    }
    const MsgType type = static_cast<MsgType>(h.type);
    if (h.payload_bytes > max_payload(type)) {
        return invalid_input("{}: payload of {} bytes exceeds the limit of {} bytes", msg_type_name(type),
                             h.payload_bytes, max_payload(type));
    }
    return h;
}

// ---- control messages ------------------------------------------------------------------------------------

// The fields after the ones a peer of another version may still send (version, role, build, name).
template <typename Io, typename M>
Status hello_tail_fields(Io &io, M &m) {
    TD_TRY(io.field(m.group, "group"));
    TD_TRY(io.field(m.rank, "rank"));
    TD_TRY(io.bytes(m.nonce, "nonce"));
    TD_TRY(io.field(m.transports, "transports"));
    return io.string(m.host_id, "host_id");
}

void encode(const Hello &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)w.field(m.protocol_version, "protocol_version");
    (void)w.field(static_cast<uint32_t>(m.role), "role");
    (void)w.string(m.build_id, "build_id");
    (void)w.string(m.node_name, "node_name");
    (void)hello_tail_fields(w, m);
}

Result<Hello> decode_hello(std::span<const uint8_t> payload) {
    Reader r("hello", payload);
    Hello m;
    uint32_t role = 0;
    TD_TRY(r.field(m.protocol_version, "protocol_version"));
    if (m.protocol_version != kProtocolVersion) {
        // Another version: only protocol_version is frozen. Take what parses so the handshake can name the
        // peer, and let it report the mismatch with both versions.
        if (r.field(role, "role").ok()) m.role = static_cast<ConnRole>(role);
        if (r.string(m.build_id, "build_id").ok()) (void)r.string(m.node_name, "node_name");
        return m;
    }
    TD_TRY(r.field(role, "role"));
    if (role < static_cast<uint32_t>(ConnRole::control) || role > static_cast<uint32_t>(ConnRole::probe)) {
        return invalid_input("hello: unknown connection role {} (1 control, 2 data, 3 peer, 4 probe)", role);
    }
    m.role = static_cast<ConnRole>(role);
    TD_TRY(r.string(m.build_id, "build_id"));
    TD_TRY(r.string(m.node_name, "node_name"));
    TD_TRY(hello_tail_fields(r, m));
    TD_TRY(r.finish());
    if (m.role == ConnRole::peer && m.rank >= kMaxTpSize)
        return invalid_input("hello: peer rank {} is beyond the limit of {} ranks", m.rank, kMaxTpSize);
    return m;
}

// Everything after protocol_version (only that field is frozen across versions).
template <typename Io, typename M>
Status hello_reply_fields(Io &io, M &m) {
    TD_TRY(io.string(m.build_id, "build_id"));
    TD_TRY(io.string(m.node_name, "node_name"));
    TD_TRY(io.field(m.n_threads, "n_threads"));
    TD_TRY(io.field(m.mem_total, "mem_total"));
    TD_TRY(io.field(m.mem_available, "mem_available"));
    TD_TRY(io.finite(m.gflops, "gflops"));
    TD_TRY(io.string(m.cpu, "cpu"));
    return io.field(m.transport, "transport");
}

void encode(const HelloReply &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)w.field(m.protocol_version, "protocol_version");
    (void)hello_reply_fields(w, m);
}

Result<HelloReply> decode_hello_reply(std::span<const uint8_t> payload) {
    Reader r("hello_reply", payload);
    HelloReply m;
    TD_TRY(r.field(m.protocol_version, "protocol_version"));
    if (m.protocol_version != kProtocolVersion) {
        if (r.string(m.build_id, "build_id").ok()) (void)r.string(m.node_name, "node_name");
        return m;
    }
    TD_TRY(hello_reply_fields(r, m));
    TD_TRY(r.finish());
    if (m.transport > static_cast<uint32_t>(Transport::ucx))
        return invalid_input("hello_reply: unknown transport {} (0 tcp, 1 shm, 2 ucx)", m.transport);
    return m;
}

void encode(const TransportOffer &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)w.field(m.transport, "transport");
    if (m.transport == static_cast<uint32_t>(Transport::shm)) {
        (void)w.field(m.shm.pid, "pid");
        (void)w.field(m.shm.fd, "fd");
        (void)w.field(m.shm.bytes, "bytes");
        (void)w.bytes(m.shm.token, "token");
    } else if (m.transport == static_cast<uint32_t>(Transport::ucx)) {
        (void)w.blob(m.ucx_address, kMaxUcxAddress, "ucx_address");
    }
}

Result<TransportOffer> decode_transport_offer(std::span<const uint8_t> payload) {
    Reader r("transport_offer", payload);
    TransportOffer m;
    TD_TRY(r.field(m.transport, "transport"));
    if (m.transport == static_cast<uint32_t>(Transport::ucx)) {
        TD_TRY(r.blob(m.ucx_address, kMaxUcxAddress, "ucx_address"));
        TD_TRY(r.finish());
        if (m.ucx_address.empty()) return invalid_input("transport_offer: an empty UCX address");
        return m;
    }
    if (m.transport != static_cast<uint32_t>(Transport::shm))
        return invalid_input("transport_offer: transport {} has no offer (1 shm, 2 ucx)", m.transport);
    TD_TRY(r.field(m.shm.pid, "pid"));
    TD_TRY(r.field(m.shm.fd, "fd"));
    TD_TRY(r.field(m.shm.bytes, "bytes"));
    TD_TRY(r.bytes(m.shm.token, "token"));
    TD_TRY(r.finish());
    if (m.shm.pid == 0 || m.shm.fd < 0)
        return invalid_input("transport_offer: no process or file (pid {}, fd {})", m.shm.pid, m.shm.fd);
    return m;
}

void encode(const TransportReady &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)w.field(m.ok, "ok");
    (void)w.string(m.reason, "reason");
    (void)w.blob(m.ucx_address, kMaxUcxAddress, "ucx_address");
}

Result<TransportReady> decode_transport_ready(std::span<const uint8_t> payload) {
    Reader r("transport_ready", payload);
    TransportReady m;
    TD_TRY(r.field(m.ok, "ok"));
    TD_TRY(r.string(m.reason, "reason"));
    TD_TRY(r.blob(m.ucx_address, kMaxUcxAddress, "ucx_address"));
    TD_TRY(r.finish());
    if (m.ok > 1) return invalid_input("transport_ready: ok is {}, must be 0 or 1", m.ok);
    return m;
}

template <typename Io, typename M>
Status auth_challenge_fields(Io &io, M &m) {
    TD_TRY(io.bytes(m.nonce, "nonce"));
    return io.bytes(m.proof, "proof");
}

void encode(const AuthChallenge &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)auth_challenge_fields(w, m);
}

Result<AuthChallenge> decode_auth_challenge(std::span<const uint8_t> payload) {
    Reader r("auth_challenge", payload);
    AuthChallenge m;
    TD_TRY(auth_challenge_fields(r, m));
    TD_TRY(r.finish());
    return m;
}

void encode(const AuthProof &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)w.bytes(m.proof, "proof");
}

Result<AuthProof> decode_auth_proof(std::span<const uint8_t> payload) {
    Reader r("auth_proof", payload);
    AuthProof m;
    TD_TRY(r.bytes(m.proof, "proof"));
    TD_TRY(r.finish());
    return m;
}

template <typename Io, typename M>
Status error_fields(Io &io, M &m) {
    TD_TRY(io.field(m.kind, "kind"));
    return io.string(m.message, "message");
}

void encode(const ErrorMsg &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)error_fields(w, m);
}

Result<ErrorMsg> decode_error(std::span<const uint8_t> payload) {
    Reader r("error", payload);
    ErrorMsg m;
    TD_TRY(error_fields(r, m));
    TD_TRY(r.finish());
    if (m.kind == static_cast<uint32_t>(ErrorKind::ok) ||
        m.kind > static_cast<uint32_t>(ErrorKind::unimplemented)) {
        return invalid_input("error: unknown error kind {}", m.kind);
    }
    return m;
}

template <typename Io, typename M>
Status load_stage_fields(Io &io, M &m, uint8_t &pad) {
    TD_TRY(io.field(m.fingerprint, "fingerprint"));
    TD_TRY(io.field(m.stage_file_bytes, "stage_file_bytes"));
    TD_TRY(io.field(m.layer_first, "layer_first"));
    TD_TRY(io.field(m.layer_last, "layer_last"));
    TD_TRY(io.field(m.n_layer, "n_layer"));
    TD_TRY(io.field(m.n_ctx, "n_ctx"));
    TD_TRY(io.field(m.n_seq, "n_seq"));
    TD_TRY(io.field(m.kv_type_k, "kv_type_k"));
    TD_TRY(io.field(m.kv_type_v, "kv_type_v"));
    TD_TRY(io.field(m.wire, "wire"));
    TD_TRY(io.field(m.n_threads, "n_threads"));
    TD_TRY(io.field(m.tp_rank, "tp_rank"));
    TD_TRY(io.field(m.tp_size, "tp_size"));
    for (auto &v : m.slice) TD_TRY(io.field(v, "slice"));
    TD_TRY(io.field(m.group, "group"));
    TD_TRY(io.field(m.stage_fingerprint, "stage_fingerprint"));
    TD_TRY(io.field(m.tp_reduce, "tp_reduce"));
    TD_TRY(io.flag(m.is_last, "is_last"));
    TD_TRY(io.field(pad, "padding"));
    TD_TRY(io.string(m.model_name, "model_name"));
    TD_TRY(io.strings(m.next, kMaxNextHops, "next"));
    TD_TRY(io.strings(m.peers, kMaxTpSize, "peers"));
    return io.field(m.transports, "transports");
}

void encode(const LoadStage &m, std::vector<uint8_t> &out) {
    Writer w(out);
    uint8_t pad = 0;
    (void)load_stage_fields(w, m, pad);
}

Result<LoadStage> decode_load_stage(std::span<const uint8_t> payload) {
    Reader r("load_stage", payload);
    LoadStage m;
    uint8_t pad = 0;
    TD_TRY(load_stage_fields(r, m, pad));
    TD_TRY(r.finish());
    if (pad != 0) return invalid_input("load_stage: padding byte at offset 101 is {}, must be 0", pad);
    if (m.tp_size < 1 || m.tp_size > kMaxTpSize || m.tp_rank >= m.tp_size)
        return invalid_input("load_stage: rank {} of a group of {} (1..{} ranks)", m.tp_rank, m.tp_size,
                             kMaxTpSize);
    if (m.tp_reduce > static_cast<uint32_t>(ReduceType::bf16))
        return invalid_input("load_stage: unknown all-reduce type {} (0 f32, 1 f16, 2 bf16)", m.tp_reduce);
    if (m.tp_size > 1 && m.peers.size() != m.tp_size)
        return invalid_input("load_stage: a group of {} ranks lists {} peers", m.tp_size, m.peers.size());
    if (m.tp_size > 1)
        for (int i = 0; i < 6; i += 2)
            if (m.slice[i] < 0 || m.slice[i] >= m.slice[i + 1])
                return invalid_input("load_stage: slice range [{}, {}) is empty", m.slice[i], m.slice[i + 1]);
    if (m.layer_first < 0 || m.layer_first >= m.layer_last || m.layer_last > m.n_layer) {
        return invalid_input("load_stage: layer range [{}, {}) is not a non-empty part of 0..{}",
                             m.layer_first, m.layer_last, m.n_layer);
    }
    if (m.n_ctx < 0 || m.n_seq < 0) {
        return invalid_input("load_stage: n_ctx {} and n_seq {} must not be negative", m.n_ctx, m.n_seq);
    }
    if (!wire_type_known(m.wire)) return invalid_input("load_stage: unknown wire type {}", m.wire);
    return m;
}

template <typename Io, typename M>
Status load_reply_fields(Io &io, M &m) {
    TD_TRY(io.field(m.need_weights, "need_weights"));
    return io.string(m.source, "source");
}

void encode(const LoadReply &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)load_reply_fields(w, m);
}

Result<LoadReply> decode_load_reply(std::span<const uint8_t> payload) {
    Reader r("load_reply", payload);
    LoadReply m;
    TD_TRY(load_reply_fields(r, m));
    TD_TRY(r.finish());
    if (m.need_weights > 1)
        return invalid_input("load_reply: need_weights must be 0 or 1, got {}", m.need_weights);
    return m;
}

void encode(const WeightsChunk &m, std::vector<uint8_t> &out) {
    put<uint64_t>(out, m.offset);
    put<uint64_t>(out, m.total);
}

Result<WeightsChunkView> decode_weights_chunk(std::span<const uint8_t> payload) {
    Reader r("weights_chunk", payload);
    WeightsChunkView v;
    TD_TRY(r.field(v.header.offset, "offset"));
    TD_TRY(r.field(v.header.total, "total"));
    v.bytes = payload.subspan(r.offset());
    if (v.bytes.size() > kMaxWeightsChunk) {
        return invalid_input("weights_chunk: {} bytes, limit {}", v.bytes.size(), kMaxWeightsChunk);
    }
    if (v.header.total == 0 || v.header.total > kMaxStageFileBytes) {
        return invalid_input("weights_chunk: a stage file of {} bytes is outside 1..{}", v.header.total,
                             kMaxStageFileBytes);
    }
    if (v.header.offset > v.header.total || v.bytes.size() > v.header.total - v.header.offset) {
        return invalid_input("weights_chunk: {} bytes at offset {} run past the total of {} bytes",
                             v.bytes.size(), v.header.offset, v.header.total);
    }
    return v;
}

template <typename Io, typename M>
Status stage_ready_fields(Io &io, M &m) {
    TD_TRY(io.field(m.weight_bytes, "weight_bytes"));
    TD_TRY(io.field(m.kv_bytes, "kv_bytes"));
    return io.finite(m.load_seconds, "load_seconds");
}

void encode(const StageReady &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)stage_ready_fields(w, m);
}

Result<StageReady> decode_stage_ready(std::span<const uint8_t> payload) {
    Reader r("stage_ready", payload);
    StageReady m;
    TD_TRY(stage_ready_fields(r, m));
    TD_TRY(r.finish());
    return m;
}

template <typename Io, typename M>
Status seq_start_fields(Io &io, M &m) {
    TD_TRY(io.field(m.seq, "seq"));
    TD_TRY(io.field(m.want_logits, "want_logits"));
    TD_TRY(io.finite(m.temperature, "temperature"));
    TD_TRY(io.field(m.top_k, "top_k"));
    TD_TRY(io.finite(m.top_p, "top_p"));
    TD_TRY(io.finite(m.min_p, "min_p"));
    TD_TRY(io.finite(m.repeat_penalty, "repeat_penalty"));
    TD_TRY(io.field(m.repeat_last_n, "repeat_last_n"));
    TD_TRY(io.finite(m.presence_penalty, "presence_penalty"));
    TD_TRY(io.finite(m.frequency_penalty, "frequency_penalty"));
    TD_TRY(io.field(m.seed, "seed"));
    TD_TRY(io.field(m.n_sampled, "n_sampled"));
    TD_TRY(io.list(m.history, kMaxSeqHistory, "history", [&](auto &t) { return io.field(t, "history"); }));
    TD_TRY(io.field(m.keep, "keep"));
    TD_TRY(io.list(m.logit_bias, kMaxSeqLogitBias, "logit_bias", [&](auto &b) -> Status {
        TD_TRY(io.field(b.id, "logit_bias id"));
        return io.field(b.bias, "logit_bias bias");
    }));
    TD_TRY(io.field(m.keep_from, "keep_from"));
    TD_TRY(io.finite(m.typical_p, "typical_p"));
    TD_TRY(io.finite(m.top_n_sigma, "top_n_sigma"));
    TD_TRY(io.finite(m.xtc_probability, "xtc_probability"));
    TD_TRY(io.finite(m.xtc_threshold, "xtc_threshold"));
    TD_TRY(io.finite(m.dry_multiplier, "dry_multiplier"));
    TD_TRY(io.finite(m.dry_base, "dry_base"));
    TD_TRY(io.field(m.dry_allowed_length, "dry_allowed_length"));
    TD_TRY(io.field(m.dry_penalty_last_n, "dry_penalty_last_n"));
    TD_TRY(io.list(m.dry_breakers, kMaxSeqDryBreakers, "dry_breakers", [&](auto &b) -> Status {
        TD_TRY(io.field(b.head, "dry_breakers head"));
        return io.list(b.tail, kMaxSeqDryTail, "dry_breakers tail",
                       [&](auto &t) { return io.field(t, "tail"); });
    }));
    TD_TRY(io.finite(m.dynatemp_range, "dynatemp_range"));
    TD_TRY(io.finite(m.dynatemp_exponent, "dynatemp_exponent"));
    TD_TRY(io.field(m.mirostat, "mirostat"));
    TD_TRY(io.finite(m.mirostat_tau, "mirostat_tau"));
    TD_TRY(io.finite(m.mirostat_eta, "mirostat_eta"));
    TD_TRY(io.field(m.mirostat_mu, "mirostat_mu"));
    return io.field(m.n_probs, "n_probs");
}

void encode(const SeqStart &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)seq_start_fields(w, m);
}

Result<SeqStart> decode_seq_start(std::span<const uint8_t> payload) {
    Reader r("seq_start", payload);
    SeqStart m;
    TD_TRY(seq_start_fields(r, m));
    TD_TRY(r.finish());
    if (m.seq < 0) return invalid_input("seq_start: seq {} is negative", m.seq);
    if (m.keep_from < 0) return invalid_input("seq_start: keep_from {} is negative", m.keep_from);
    if (m.want_logits > 1)
        return invalid_input("seq_start: want_logits must be 0 or 1, got {}", m.want_logits);
    for (int32_t t : m.history)
        if (t < 0) return invalid_input("seq_start: history token {} is negative", t);
    for (const SeqLogitBias &b : m.logit_bias) {
        if (b.id < 0) return invalid_input("seq_start: logit_bias token {} is negative", b.id);
        if (std::isnan(b.bias) || b.bias == std::numeric_limits<float>::infinity())
            return invalid_input("seq_start: logit_bias of token {} is {} (finite or -inf)", b.id, b.bias);
    }
    size_t tail_tokens = 0;
    for (const SeqDryBreaker &b : m.dry_breakers) tail_tokens += b.tail.size();
    if (tail_tokens > kMaxSeqDryTailTokens)
        return invalid_input("seq_start: the DRY breakers' tails hold {} tokens, limit {}", tail_tokens,
                             kMaxSeqDryTailTokens);
    if (std::isinf(m.mirostat_mu))
        return invalid_input("seq_start: mirostat_mu is {} (finite, or NaN for the start value)",
                             m.mirostat_mu);
    if (m.n_probs < -1 || m.n_probs > static_cast<int32_t>(kMaxResultTop))
        return invalid_input("seq_start: n_probs {} is outside -1..{}", m.n_probs, kMaxResultTop);
    return m;
}

void encode(const SeqClear &m, std::vector<uint8_t> &out) {
    put<int32_t>(out, m.seq);
}

Result<SeqClear> decode_seq_clear(std::span<const uint8_t> payload) {
    Reader r("seq_clear", payload);
    SeqClear m;
    TD_TRY(r.field(m.seq, "seq"));
    TD_TRY(r.finish());
    if (m.seq < 0) return invalid_input("seq_clear: seq {} is negative", m.seq);
    return m;
}

template <typename Io, typename M>
Status stats_reply_fields(Io &io, M &m) {
    TD_TRY(io.field(m.msgs_in, "msgs_in"));
    TD_TRY(io.field(m.msgs_out, "msgs_out"));
    TD_TRY(io.field(m.bytes_in, "bytes_in"));
    TD_TRY(io.field(m.bytes_out, "bytes_out"));
    TD_TRY(io.field(m.forward_steps, "forward_steps"));
    TD_TRY(io.field(m.compute_seconds, "compute_seconds"));
    TD_TRY(io.field(m.wait_seconds, "wait_seconds"));
    TD_TRY(io.field(m.send_seconds, "send_seconds"));
    TD_TRY(io.field(m.tp_all_reduces, "tp_all_reduces"));
    TD_TRY(io.field(m.tp_gathers, "tp_gathers"));
    TD_TRY(io.field(m.tp_bytes_out, "tp_bytes_out"));
    TD_TRY(io.field(m.tp_bytes_in, "tp_bytes_in"));
    TD_TRY(io.field(m.tp_wait_seconds, "tp_wait_seconds"));
    return io.string(m.links, "links");
}

void encode(const StatsReply &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)stats_reply_fields(w, m);
}

Result<StatsReply> decode_stats_reply(std::span<const uint8_t> payload) {
    Reader r("stats_reply", payload);
    StatsReply m;
    TD_TRY(stats_reply_fields(r, m));
    TD_TRY(r.finish());
    return m;
}

Status decode_empty(MsgType type, std::span<const uint8_t> payload) {
    if (!payload.empty()) {
        return invalid_input("{}: payload must be empty, has {} bytes", msg_type_name(type), payload.size());
    }
    return {};
}

// ---- forward ---------------------------------------------------------------------------------------------

Result<ForwardView> decode_forward(std::span<const uint8_t> payload) {
    // The int32 views below point into the payload: it must be 4-byte aligned (a std::vector's data is).
    TD_ASSERT(reinterpret_cast<uintptr_t>(payload.data()) % 4 == 0,
              "forward payload buffer is not 4-byte aligned");
    Reader r("forward", payload);
    ForwardView v;
    ForwardHeader &h = v.header;
    TD_TRY(r.field(h.n_rows, "n_rows"));
    TD_TRY(r.field(h.n_embd, "n_embd"));
    TD_TRY(r.field(h.wire, "wire"));
    TD_TRY(r.field(h.flags, "flags"));
    constexpr uint32_t known = kForwardTokens | kForwardRowTokens | kForwardTargets;
    if (h.flags & ~known) return invalid_input("forward: unknown flags 0x{:x}", h.flags & ~known);
    if ((h.flags & kForwardTokens) && (h.flags & kForwardRowTokens))
        return invalid_input("forward: token rows cannot carry token ids again");
    if (h.n_rows == 0 || h.n_rows > kMaxBatchRows) {
        return invalid_input("forward: n_rows {} is outside 1..{}", h.n_rows, kMaxBatchRows);
    }
    if (h.n_embd > kMaxEmbd)
        return invalid_input("forward: n_embd {} exceeds the limit of {}", h.n_embd, kMaxEmbd);
    if (!wire_type_known(h.wire)) return invalid_input("forward: unknown wire type {}", h.wire);
    const bool tokens = (h.flags & kForwardTokens) != 0;
    const WireType wire = static_cast<WireType>(h.wire);
    if (!tokens) {
        if (h.n_embd == 0) return invalid_input("forward: hidden rows with n_embd 0");
        if (wire == WireType::q8_0 && h.n_embd % kWireQ8Block != 0) {
            return invalid_input("forward: q8_0 rows need n_embd divisible by 32, got {}", h.n_embd);
        }
    }
    const bool row_tokens = (h.flags & kForwardRowTokens) != 0;
    const bool targets = (h.flags & kForwardTargets) != 0;
    const uint64_t ids =
        (tokens || row_tokens ? uint64_t{4} * h.n_rows : 0) + (targets ? uint64_t{4} * h.n_rows : 0);
    const uint64_t body = ids + (tokens ? 0 : uint64_t{h.n_rows} * wire_row_bytes(wire, h.n_embd));
    const ForwardLayout l = forward_layout(h.n_rows, body);
    if (l.total != payload.size()) {
        return invalid_input("forward: {} {} rows{} need {} bytes, payload has {}", h.n_rows,
                             tokens ? "token" : wire_type_name(wire), row_tokens ? " with token ids" : "",
                             l.total, payload.size());
    }
    const uint8_t *p = payload.data();
    v.pos = {reinterpret_cast<const int32_t *>(p + l.pos), h.n_rows};
    v.seq = {reinterpret_cast<const int32_t *>(p + l.seq), h.n_rows};
    v.want = {p + l.want, h.n_rows};
    for (uint32_t i = 0; i < h.n_rows; ++i) {
        if (v.pos[i] < 0 || v.seq[i] < 0) {
            return invalid_input("forward: row {} has pos {} seq {} (must not be negative)", i, v.pos[i],
                                 v.seq[i]);
        }
        if (v.want[i] > kWantScore)
            return invalid_input("forward: row {} want must be 0, 1, 2, 3 or 4, got {}", i, v.want[i]);
        if (v.want[i] == kWantScore && !targets)
            return invalid_input("forward: row {} is a score row but the step carries no targets", i);
    }
    for (size_t i = l.want + h.n_rows; i < l.body; ++i) {
        if (p[i] != 0) return invalid_input("forward: padding byte at offset {} is {}, must be 0", i, p[i]);
    }
    size_t at = l.body;
    if (tokens || row_tokens) {
        v.token = {reinterpret_cast<const int32_t *>(p + at), h.n_rows};
        at += 4 * size_t{h.n_rows};
        for (uint32_t i = 0; i < h.n_rows; ++i) {
            if (v.token[i] < 0) return invalid_input("forward: row {} has negative token {}", i, v.token[i]);
        }
    }
    if (targets) {
        v.target = {reinterpret_cast<const int32_t *>(p + at), h.n_rows};
        for (uint32_t i = 0; i < h.n_rows; ++i) {
            const bool score = v.want[i] == kWantScore;
            if (score ? v.target[i] < 0 : v.target[i] != -1)
                return invalid_input(
                    "forward: row {} has target {} ({})", i, v.target[i],
                    score ? "a score row's must not be negative" : "must be -1 off score rows");
        }
    }
    if (!tokens) v.hidden = payload.subspan(l.body + ids);
    return v;
}

void encode_forward(std::span<const int32_t> pos, std::span<const int32_t> seq, std::span<const uint8_t> want,
                    std::span<const int32_t> tokens, const float *hidden, uint32_t n_embd, WireType wire,
                    std::vector<uint8_t> &out, std::span<const int32_t> targets) {
    const size_t n_rows = pos.size();
    const bool with_tokens = !tokens.empty();
    const bool with_hidden = hidden != nullptr;
    TD_ASSERT(seq.size() == n_rows && want.size() == n_rows, "forward: pos/seq/want sizes {}/{}/{} differ",
              n_rows, seq.size(), want.size());
    TD_ASSERT(n_rows > 0 && n_rows <= kMaxBatchRows, "forward: n_rows {} outside 1..{}", n_rows,
              kMaxBatchRows);
    TD_ASSERT(n_embd <= kMaxEmbd, "forward: n_embd {} over the limit", n_embd);
    TD_ASSERT(with_tokens || with_hidden, "forward: rows need tokens or hidden data");
    if (with_tokens) TD_ASSERT(tokens.size() == n_rows, "forward: tokens need one per row");
    const bool with_targets = !targets.empty();
    if (with_targets) TD_ASSERT(targets.size() == n_rows, "forward: targets need one per row");
    if (with_hidden) {
        TD_ASSERT(n_embd > 0, "forward: hidden rows need n_embd > 0");
        TD_ASSERT(wire != WireType::q8_0 || n_embd % kWireQ8Block == 0,
                  "forward: q8_0 needs n_embd % 32 == 0");
    }
    const size_t row_bytes = wire_row_bytes(wire, n_embd);
    const size_t n_tokens_bytes = with_tokens ? 4 * n_rows : 0;
    const size_t ids = n_tokens_bytes + (with_targets ? 4 * n_rows : 0);
    const ForwardLayout l = forward_layout(n_rows, ids + (with_hidden ? n_rows * row_bytes : 0));
    out.resize(l.total);  // capacity is kept across calls: no allocation once the largest step has been seen
    uint8_t *p = out.data();
    ForwardHeader h;
    h.n_rows = static_cast<uint32_t>(n_rows);
    h.n_embd = n_embd;
    h.wire = static_cast<uint32_t>(wire);
    h.flags = (!with_tokens  ? 0
               : with_hidden ? kForwardRowTokens
                             : kForwardTokens) |
              (with_targets ? kForwardTargets : 0);
    put_at(p + 0, h.n_rows);
    put_at(p + 4, h.n_embd);
    put_at(p + 8, h.wire);
    put_at(p + 12, h.flags);
    std::memcpy(p + l.pos, pos.data(), 4 * n_rows);
    std::memcpy(p + l.seq, seq.data(), 4 * n_rows);
    std::memcpy(p + l.want, want.data(), n_rows);
    std::memset(p + l.want + n_rows, 0, l.body - l.want - n_rows);
    if (with_tokens) std::memcpy(p + l.body, tokens.data(), n_tokens_bytes);
    if (with_targets) std::memcpy(p + l.body + n_tokens_bytes, targets.data(), 4 * n_rows);
    if (!with_hidden) {
    } else if (wire == WireType::f32) {
        std::memcpy(p + l.body + ids, hidden, n_rows * row_bytes);
    } else {
        // Rows are contiguous and n_embd is a whole number of blocks, so all rows convert in one call.
        wire_kernels(wire)->from_float(hidden, p + l.body + ids, static_cast<int64_t>(n_rows) * n_embd);
    }
}

void wire_to_f32(const ForwardView &v, float *out) {
    const WireType wire = static_cast<WireType>(v.header.wire);
    const size_t n = size_t{v.header.n_rows} * v.header.n_embd;
    TD_ASSERT(v.hidden.size() == v.header.n_rows * wire_row_bytes(wire, v.header.n_embd),
              "wire_to_f32 on a view without hidden rows");
    if (wire == WireType::f32) {
        std::memcpy(out, v.hidden.data(), n * 4);
    } else {
        wire_kernels(wire)->to_float(v.hidden.data(), out, static_cast<int64_t>(n));
    }
}

// ---- result ----------------------------------------------------------------------------------------------

ResultRow ResultView::row(uint32_t i) const {
    TD_ASSERT(i < n_outputs, "result row {} of {}", i, n_outputs);
    ResultRow r;
    const uint8_t *p = rows.data() + size_t{i} * kResultRowBytes;
    std::memcpy(&r.seq, p + 0, 4);
    std::memcpy(&r.token, p + 4, 4);
    std::memcpy(&r.logprob, p + 8, 4);
    std::memcpy(&r.mirostat_mu, p + 12, 4);
    return r;
}

uint32_t ResultView::top_count(uint32_t i) const {
    TD_ASSERT(i < top_counts.size() / 4, "result alternative count {} of {}", i, top_counts.size() / 4);
    uint32_t c = 0;
    std::memcpy(&c, top_counts.data() + 4 * size_t{i}, 4);
    return c;
}

ResultTop ResultView::top_pair(uint64_t k) const {
    TD_ASSERT(k < top_pairs.size() / 8, "result alternative {} of {}", k, top_pairs.size() / 8);
    ResultTop t;
    std::memcpy(&t.id, top_pairs.data() + 8 * k, 4);
    std::memcpy(&t.logprob, top_pairs.data() + 8 * k + 4, 4);
    return t;
}

Result<ResultView> decode_result(std::span<const uint8_t> payload, uint32_t n_vocab, uint32_t n_embd) {
    Reader r("result", payload);
    ResultView v;
    TD_TRY(r.field(v.n_outputs, "n_outputs"));
    TD_TRY(r.field(v.flags, "flags"));
    constexpr uint32_t known = kResultLogits | kResultEmbeddings | kResultTop;
    if (v.flags & ~known) return invalid_input("result: unknown flags 0x{:x}", v.flags & ~known);
    if (v.n_outputs > kMaxBatchRows) {
        return invalid_input("result: n_outputs {} exceeds the limit of {}", v.n_outputs, kMaxBatchRows);
    }
    const bool logits = (v.flags & kResultLogits) != 0;
    const bool embeddings = (v.flags & kResultEmbeddings) != 0;
    if (logits && n_vocab == 0)
        return invalid_input("result: logits sent but the receiver expects none (n_vocab 0)");
    const uint64_t rows_bytes = uint64_t{v.n_outputs} * kResultRowBytes;
    if (payload.size() < 8 + rows_bytes)
        return invalid_input("result: {} outputs need at least {} bytes, payload has {}", v.n_outputs,
                             8 + rows_bytes, payload.size());
    v.rows = payload.subspan(8, rows_bytes);
    for (uint32_t i = 0; i < v.n_outputs; ++i) v.n_embedding_rows += v.row(i).token == kEmbeddingRowToken;
    if (v.n_embedding_rows > 0 && !embeddings)
        return invalid_input("result: {} embedding rows without their embeddings", v.n_embedding_rows);
    const uint32_t n_logit_rows = v.n_outputs - v.n_embedding_rows;
    uint64_t top_bytes = 0;
    if (v.flags & kResultTop) {
        const uint64_t counts_at = 8 + rows_bytes;
        if (payload.size() < counts_at + uint64_t{4} * n_logit_rows)
            return invalid_input("result: {} rows' alternative counts need {} bytes, payload has {}",
                                 n_logit_rows, counts_at + uint64_t{4} * n_logit_rows, payload.size());
        v.top_counts = payload.subspan(counts_at, uint64_t{4} * n_logit_rows);
        uint64_t n_pairs = 0;
        for (uint32_t i = 0; i < n_logit_rows; ++i) {
            if (v.top_count(i) > kMaxResultTop)
                return invalid_input("result: row {} has {} alternatives, limit {}", i, v.top_count(i),
                                     kMaxResultTop);
            n_pairs += v.top_count(i);
        }
        const uint64_t pairs_at = counts_at + uint64_t{4} * n_logit_rows;
        if (payload.size() < pairs_at + 8 * n_pairs)
            return invalid_input("result: {} alternatives need {} bytes, payload has {}", n_pairs,
                                 pairs_at + 8 * n_pairs, payload.size());
        v.top_pairs = payload.subspan(pairs_at, 8 * n_pairs);
        for (uint64_t k = 0; k < n_pairs; ++k) {
            const ResultTop t = v.top_pair(k);
            if (t.id < 0 || (n_vocab > 0 && static_cast<uint32_t>(t.id) >= n_vocab) || std::isnan(t.logprob))
                return invalid_input("result: alternative {} is token {} with logprob {}", k, t.id,
                                     t.logprob);
        }
        top_bytes = uint64_t{4} * n_logit_rows + 8 * n_pairs;
    }
    const uint64_t logits_bytes = logits ? uint64_t{n_logit_rows} * n_vocab * 4 : 0;
    uint64_t at = 8 + rows_bytes + top_bytes + logits_bytes;
    if (embeddings) {
        if (payload.size() < at + 4)
            return invalid_input("result: the embeddings' width is missing ({} bytes)", payload.size());
        std::memcpy(&v.n_embd, payload.data() + at, 4);
        if (v.n_embd != n_embd)
            return invalid_input("result: embeddings of {} values, the receiver's model has {}", v.n_embd,
                                 n_embd);
        at += 4;
    }
    const uint64_t embd_bytes = embeddings ? uint64_t{v.n_embedding_rows} * v.n_embd * 4 : 0;
    const uint64_t total = at + embd_bytes;
    if (total != payload.size()) {
        return invalid_input(
            "result: {} outputs{}{} need {} bytes, payload has {}", v.n_outputs,
            logits ? fmt::format(" with {} logits each", n_vocab) : std::string(),
            embeddings ? fmt::format(", {} embeddings of {}", v.n_embedding_rows, v.n_embd) : std::string(),
            total, payload.size());
    }
    v.logits = payload.subspan(8 + rows_bytes + top_bytes, logits_bytes);
    v.embeddings = payload.subspan(at, embd_bytes);
    return v;
}

void encode_result(std::span<const ResultRow> rows, const float *logits, uint32_t n_vocab,
                   const float *embeddings, uint32_t n_embd, std::vector<uint8_t> &out,
                   std::span<const uint32_t> top_counts, std::span<const ResultTop> top_pairs) {
    const size_t n = rows.size();
    TD_ASSERT(n <= kMaxBatchRows, "result: {} outputs over the limit", n);
    TD_ASSERT(logits == nullptr || n_vocab > 0, "result: logits need n_vocab > 0");
    size_t n_emb = 0;
    for (const ResultRow &row : rows) n_emb += row.token == kEmbeddingRowToken;
    TD_ASSERT(n_emb == 0 || (embeddings != nullptr && n_embd > 0),
              "result: {} embedding rows need their values", n_emb);
    const bool with_embeddings = n_emb > 0;
    const bool with_top = !top_counts.empty();
    if (with_top) {
        TD_ASSERT(top_counts.size() == n - n_emb, "result: {} alternative counts for {} rows",
                  top_counts.size(), n - n_emb);
        size_t n_pairs = 0;
        for (uint32_t c : top_counts) {
            TD_ASSERT(c <= kMaxResultTop, "result: {} alternatives over the limit", c);
            n_pairs += c;
        }
        TD_ASSERT(n_pairs == top_pairs.size(), "result: {} alternatives, counts say {}", top_pairs.size(),
                  n_pairs);
    }
    const size_t top_bytes = with_top ? 4 * top_counts.size() + 8 * top_pairs.size() : 0;
    const size_t logits_bytes = logits ? (n - n_emb) * n_vocab * 4 : 0;
    const size_t embd_bytes = with_embeddings ? 4 + n_emb * n_embd * 4 : 0;
    out.resize(8 + n * kResultRowBytes + top_bytes + logits_bytes + embd_bytes);
    uint8_t *p = out.data();
    put_at(p + 0, static_cast<uint32_t>(n));
    put_at(p + 4, (logits ? kResultLogits : 0u) | (with_embeddings ? kResultEmbeddings : 0u) |
                      (with_top ? kResultTop : 0u));
    for (size_t i = 0; i < n; ++i) {
        uint8_t *q = p + 8 + i * kResultRowBytes;
        put_at(q + 0, rows[i].seq);
        put_at(q + 4, rows[i].token);
        put_at(q + 8, rows[i].logprob);
        put_at(q + 12, rows[i].mirostat_mu);
    }
    uint8_t *at = p + 8 + n * kResultRowBytes;
    if (with_top) {
        std::memcpy(at, top_counts.data(), 4 * top_counts.size());
        at += 4 * top_counts.size();
        for (const ResultTop &t : top_pairs) {
            put_at(at, t.id);
            put_at(at + 4, t.logprob);
            at += 8;
        }
    }
    if (logits) std::memcpy(at, logits, logits_bytes);
    at += logits_bytes;
    if (with_embeddings) {
        put_at(at, n_embd);
        std::memcpy(at + 4, embeddings, n_emb * n_embd * 4);
    }
}

size_t forward_payload_bytes(uint32_t n_rows, uint32_t n_embd, WireType wire, bool tokens) {
    return forward_layout(n_rows, tokens ? 4ull * n_rows : uint64_t{n_rows} * wire_row_bytes(wire, n_embd))
        .total;
}

// ---- measurements (version 3) ----------------------------------------------------------------------------

namespace {

template <typename Io, typename M>
Status probe_compute_fields(Io &io, M &m) {
    TD_TRY(io.field(m.n_threads, "n_threads"));
    TD_TRY(io.field(m.budget_ms, "budget_ms"));
    TD_TRY(io.field(m.working_set, "working_set"));
    TD_TRY(io.list(m.matrices, kMaxProbeMatrices, "matrices", [&](auto &x) {
        TD_TRY(io.field(x.dtype, "dtype"));
        TD_TRY(io.field(x.n_in, "n_in"));
        return io.field(x.n_out, "n_out");
    }));
    TD_TRY(io.list(m.rows, kMaxProbeRows, "rows", [&](auto &v) { return io.field(v, "rows"); }));
    TD_TRY(io.field(m.ops.n_embd, "n_embd"));
    TD_TRY(io.field(m.ops.n_ff, "n_ff"));
    TD_TRY(io.field(m.ops.n_head, "n_head"));
    TD_TRY(io.field(m.ops.n_head_kv, "n_head_kv"));
    TD_TRY(io.field(m.ops.head_dim, "head_dim"));
    return io.field(m.ops.n_pos, "n_pos");
}

Status check_probe_compute(const ProbeCompute &m) {
    if (m.budget_ms > kMaxProbeBudgetMs)
        return invalid_input("probe_compute: budget of {} ms per point, limit {}", m.budget_ms,
                             kMaxProbeBudgetMs);
    if (m.working_set > kMaxProbeWorkingSet)
        return invalid_input("probe_compute: working set of {} bytes, limit {}", m.working_set,
                             kMaxProbeWorkingSet);
    if (m.n_threads > 4096) return invalid_input("probe_compute: {} threads", m.n_threads);
    for (const ProbeMatrix &x : m.matrices) {
        if (x.n_in == 0 || x.n_out == 0 || x.n_in > (1u << 24) || x.n_out > (1u << 24))
            return invalid_input("probe_compute: a {} x {} matrix", x.n_out, x.n_in);
    }
    for (uint32_t r : m.rows)
        if (r == 0 || r > kMaxBatchRows)
            return invalid_input("probe_compute: {} rows, must be 1..{}", r, kMaxBatchRows);
    const ProbeOps &o = m.ops;
    if (o.n_embd != 0 &&
        (o.n_embd > kMaxEmbd || o.n_ff == 0 || o.n_ff > 16 * kMaxEmbd || o.head_dim == 0 ||
         o.head_dim > 1024 || o.head_dim % 2 != 0 || o.n_head_kv == 0 || o.n_head % o.n_head_kv != 0 ||
         o.n_head > 4096 || o.n_pos == 0 || o.n_pos > (1u << 20)))
        return invalid_input(
            "probe_compute: row ops of n_embd {}, n_ff {}, {} heads ({} KV) of {}, {} positions", o.n_embd,
            o.n_ff, o.n_head, o.n_head_kv, o.head_dim, o.n_pos);
    return {};
}

template <typename Io, typename M>
Status probe_compute_reply_fields(Io &io, M &m) {
    TD_TRY(io.field(m.n_threads, "n_threads"));
    TD_TRY(io.timing(m.read_gbps, "read_gbps"));
    TD_TRY(io.list(m.seconds, kMaxProbeMatrices * kMaxProbeRows, "seconds",
                   [&](auto &v) { return io.timing(v, "seconds"); }));
    TD_TRY(io.timing(m.norm_s, "norm_s"));
    TD_TRY(io.timing(m.act_s, "act_s"));
    TD_TRY(io.timing(m.rope_s, "rope_s"));
    TD_TRY(io.timing(m.attn_s, "attn_s"));
    return io.timing(m.dispatch_s, "dispatch_s");
}

template <typename Io, typename M>
Status probe_link_fields(Io &io, M &m) {
    TD_TRY(io.string(m.address, "address"));
    TD_TRY(io.field(m.budget_ms, "budget_ms"));
    TD_TRY(io.list(m.rtt_sizes, kMaxProbeSizes, "rtt_sizes", [&](auto &v) { return io.field(v, "rtt_sizes"); }));
    TD_TRY(io.list(m.stream_sizes, kMaxProbeSizes, "stream_sizes",
                   [&](auto &v) { return io.field(v, "stream_sizes"); }));
    return io.field(m.transports, "transports");
}

template <typename Io, typename M>
Status probe_link_reply_fields(Io &io, M &m) {
    return io.list(m.samples, 2 * kMaxProbeSizes, "samples", [&](auto &x) {
        TD_TRY(io.field(x.bytes, "bytes"));
        TD_TRY(io.field(x.mode, "mode"));
        TD_TRY(io.field(x.count, "count"));
        TD_TRY(io.timing(x.p50, "p50"));
        TD_TRY(io.timing(x.p90, "p90"));
        TD_TRY(io.timing(x.p99, "p99"));
        TD_TRY(io.timing(x.max, "max"));
        return io.timing(x.gbps, "gbps");
    });
}

Status check_probe_link(const ProbeLink &m) {
    if (m.budget_ms > kMaxProbeBudgetMs)
        return invalid_input("probe_link: budget of {} ms per size, limit {}", m.budget_ms, kMaxProbeBudgetMs);
    for (const std::vector<uint64_t> *sizes : {&m.rtt_sizes, &m.stream_sizes})
        for (uint64_t x : *sizes)
            if (x > kMaxEchoPayload)
                return invalid_input("probe_link: a message of {} bytes, limit {}", x, kMaxEchoPayload);
    return {};
}

template <typename Io, typename M>
Status probe_sync_fields(Io &io, M &m) {
    TD_TRY(io.field(m.n_threads, "n_threads"));
    TD_TRY(io.field(m.budget_ms, "budget_ms"));
    TD_TRY(io.field(m.working_set, "working_set"));
    TD_TRY(io.field(m.rows, "rows"));
    TD_TRY(io.field(m.n_embd, "n_embd"));
    TD_TRY(io.field(m.reduce, "reduce"));
    TD_TRY(io.field(m.split, "split"));
    TD_TRY(io.list(m.matrices, kMaxProbeMatrices, "matrices", [&](auto &x) {
        TD_TRY(io.field(x.dtype, "dtype"));
        TD_TRY(io.field(x.n_in, "n_in"));
        return io.field(x.n_out, "n_out");
    }));
    TD_TRY(io.string(m.peer, "peer"));
    return io.field(m.transports, "transports");
}

Status check_probe_sync(const ProbeSync &m) {
    if (m.budget_ms > kMaxProbeBudgetMs)
        return invalid_input("probe_sync: budget of {} ms, limit {}", m.budget_ms, kMaxProbeBudgetMs);
    if (m.working_set > kMaxProbeWorkingSet)
        return invalid_input("probe_sync: working set of {} bytes, limit {}", m.working_set,
                             kMaxProbeWorkingSet);
    if (m.n_threads > 4096) return invalid_input("probe_sync: {} threads", m.n_threads);
    if (m.rows == 0 || m.rows > kMaxBatchRows)
        return invalid_input("probe_sync: {} rows, must be 1..{}", m.rows, kMaxBatchRows);
    if (m.n_embd == 0 || m.n_embd > kMaxEmbd ||
        static_cast<uint64_t>(m.rows) * m.n_embd > kMaxProbeSyncFloats)
        return invalid_input("probe_sync: an all-reduce of {} rows of {} values, limit {} values", m.rows,
                             m.n_embd, kMaxProbeSyncFloats);
    if (m.reduce > static_cast<uint32_t>(ReduceType::bf16))
        return invalid_input("probe_sync: unknown reduce type {}", m.reduce);
    if (m.matrices.empty() || m.split > m.matrices.size())
        return invalid_input("probe_sync: {} matrices split at {}", m.matrices.size(), m.split);
    for (const ProbeMatrix &x : m.matrices)
        if (x.n_in == 0 || x.n_out == 0 || x.n_in > (1u << 24) || x.n_out > (1u << 24))
            return invalid_input("probe_sync: a {} x {} matrix", x.n_out, x.n_in);
    return {};
}

template <typename Io, typename M>
Status probe_sync_reply_fields(Io &io, M &m) {
    TD_TRY(io.field(m.segments, "segments"));
    TD_TRY(io.timing(m.wall_s, "wall_s"));
    return io.list(m.ranks, kMaxTpSize, "ranks", [&](auto &x) {
        TD_TRY(io.timing(x.compute_s, "compute_s"));
        return io.timing(x.wait_s, "wait_s");
    });
}

}  // namespace

void encode(const ProbeCompute &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)probe_compute_fields(w, m);
}

Result<ProbeCompute> decode_probe_compute(std::span<const uint8_t> payload) {
    Reader r("probe_compute", payload);
    ProbeCompute m;
    TD_TRY(probe_compute_fields(r, m));
    TD_TRY(r.finish());
    TD_TRY(check_probe_compute(m));
    return m;
}

void encode(const ProbeComputeReply &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)probe_compute_reply_fields(w, m);
}

Result<ProbeComputeReply> decode_probe_compute_reply(std::span<const uint8_t> payload) {
    Reader r("probe_compute_reply", payload);
    ProbeComputeReply m;
    TD_TRY(probe_compute_reply_fields(r, m));
    TD_TRY(r.finish());
    return m;
}

void encode(const ProbeLink &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)probe_link_fields(w, m);
}

Result<ProbeLink> decode_probe_link(std::span<const uint8_t> payload) {
    Reader r("probe_link", payload);
    ProbeLink m;
    TD_TRY(probe_link_fields(r, m));
    TD_TRY(r.finish());
    TD_TRY(check_probe_link(m));
    return m;
}

void encode(const ProbeLinkReply &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)probe_link_reply_fields(w, m);
}

Result<ProbeLinkReply> decode_probe_link_reply(std::span<const uint8_t> payload) {
    Reader r("probe_link_reply", payload);
    ProbeLinkReply m;
    TD_TRY(probe_link_reply_fields(r, m));
    TD_TRY(r.finish());
    for (const LinkSample &x : m.samples)
        if (x.mode > 1) return invalid_input("probe_link_reply: unknown mode {}", x.mode);
    return m;
}

void encode(const ProbeSync &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)probe_sync_fields(w, m);
}

Result<ProbeSync> decode_probe_sync(std::span<const uint8_t> payload) {
    Reader r("probe_sync", payload);
    ProbeSync m;
    TD_TRY(probe_sync_fields(r, m));
    TD_TRY(r.finish());
    TD_TRY(check_probe_sync(m));
    return m;
}

void encode(const ProbeSyncReply &m, std::vector<uint8_t> &out) {
    Writer w(out);
    (void)probe_sync_reply_fields(w, m);
}

Result<ProbeSyncReply> decode_probe_sync_reply(std::span<const uint8_t> payload) {
    Reader r("probe_sync_reply", payload);
    ProbeSyncReply m;
    TD_TRY(probe_sync_reply_fields(r, m));
    TD_TRY(r.finish());
    return m;
}

}  // namespace td::net
