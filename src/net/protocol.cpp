// Names and limits of the wire messages (protocol.h).
#include "net/protocol.h"

#include "net/shm.h"
#include "net/ucx.h"

namespace td::net {

const char *msg_type_name(MsgType type) {
    switch (type) {
        case MsgType::hello:
            return "hello";
        case MsgType::hello_reply:
            return "hello_reply";
        case MsgType::error:
            return "error";
        case MsgType::load_stage:
            return "load_stage";
        case MsgType::load_reply:
            return "load_reply";
        case MsgType::weights_chunk:
            return "weights_chunk";
        case MsgType::stage_ready:
            return "stage_ready";
        case MsgType::forward:
            return "forward";
        case MsgType::result:
            return "result";
        case MsgType::seq_start:
            return "seq_start";
        case MsgType::seq_clear:
            return "seq_clear";
        case MsgType::ping:
            return "ping";
        case MsgType::pong:
            return "pong";
        case MsgType::stats_request:
            return "stats_request";
        case MsgType::stats_reply:
            return "stats_reply";
        case MsgType::shutdown:
            return "shutdown";
        case MsgType::tp_partial:
            return "tp_partial";
        case MsgType::tp_gather:
            return "tp_gather";
        case MsgType::echo:
            return "echo";
        case MsgType::echo_reply:
            return "echo_reply";
        case MsgType::probe_compute:
            return "probe_compute";
        case MsgType::probe_compute_reply:
            return "probe_compute_reply";
        case MsgType::probe_link:
            return "probe_link";
        case MsgType::probe_link_reply:
            return "probe_link_reply";
        case MsgType::auth_challenge:
            return "auth_challenge";
        case MsgType::auth_proof:
            return "auth_proof";
        case MsgType::transport_offer:
            return "transport_offer";
        case MsgType::transport_ready:
            return "transport_ready";
        case MsgType::probe_sync:
            return "probe_sync";
        case MsgType::probe_sync_reply:
            return "probe_sync_reply";
    }
    return "unknown";
}

size_t max_payload(MsgType type) {
    switch (type) {
        case MsgType::hello:
        case MsgType::hello_reply:
        case MsgType::error:
        case MsgType::load_stage:
        case MsgType::load_reply:
        case MsgType::stage_ready:
        case MsgType::seq_start:
        case MsgType::seq_clear:
        case MsgType::stats_reply:
        case MsgType::ping:  // ping's payload is opaque; pong echoes it
        case MsgType::pong:
        case MsgType::stats_request:  // empty in version 1
        case MsgType::shutdown:       // empty in version 1
        case MsgType::probe_compute:
        case MsgType::probe_compute_reply:
        case MsgType::probe_link:
        case MsgType::probe_link_reply:
        case MsgType::probe_sync:
        case MsgType::probe_sync_reply:
            return kMaxControlPayload;
        case MsgType::auth_challenge:
            return 64;
        case MsgType::auth_proof:
            return 32;
        case MsgType::transport_offer:
        case MsgType::transport_ready:
            return kMaxUcxAddress + 8192;
        case MsgType::echo:
        case MsgType::echo_reply:
            return kMaxEchoPayload;
        case MsgType::weights_chunk:
            return kWeightsChunkFixedBytes + kMaxWeightsChunk;
        case MsgType::forward:
        case MsgType::result:
        case MsgType::tp_partial:
        case MsgType::tp_gather:
            return kMaxDataPayload;
    }
    return 0;
}

bool msg_type_known(uint16_t type) {
    return type >= static_cast<uint16_t>(MsgType::hello) &&
           type <= static_cast<uint16_t>(MsgType::probe_sync_reply);
}

const char *transport_name(Transport t) {
    switch (t) {
        case Transport::tcp:
            return "tcp";
        case Transport::shm:
            return "shm";
        case Transport::ucx:
            return "ucx";
    }
    return "unknown";
}

bool transports_from_name(const std::string &name, uint32_t *bits, std::string *error) {
    if (name == "auto") {
        *bits = auto_transports();
    } else if (name == "tcp") {
        *bits = kTransportsTcp;
    } else if (name == "shm") {
        *bits = kTransportsTcp | transport_bit(Transport::shm);
    } else if (name == "ucx") {
        if (!ucx_supported()) {
            *error =
                "--transport ucx: this build has no UCX transport (install libucx-dev and rebuild; auto, tcp "
                "and shm are available)";
            return false;
        }
        *bits = kTransportsTcp | transport_bit(Transport::ucx);
    } else {
        error->assign("--transport ");
        error->append(name).append(": expected auto, tcp, shm or ucx");
        return false;
    }
    return true;
}

uint32_t auto_transports() {
    uint32_t bits = kTransportsTcp;
    if (shm_supported()) bits |= transport_bit(Transport::shm);
    if (ucx_supported() && ucx_has_rdma()) bits |= transport_bit(Transport::ucx);
    return bits;
}

uint32_t built_transports() {
    uint32_t bits = kTransportsTcp;
    if (shm_supported()) bits |= transport_bit(Transport::shm);
    if (ucx_supported()) bits |= transport_bit(Transport::ucx);
    return bits;
}

const char *reduce_type_name(ReduceType type) {
    switch (type) {
        case ReduceType::f32:
            return "f32";
        case ReduceType::f16:
            return "f16";
        case ReduceType::bf16:
            return "bf16";
    }
    return "unknown";
}

bool reduce_type_from_name(const std::string &name, ReduceType *out) {
    for (ReduceType t : {ReduceType::f32, ReduceType::f16, ReduceType::bf16})
        if (name == reduce_type_name(t)) {
            *out = t;
            return true;
        }
    return false;
}

size_t reduce_type_bytes(ReduceType type) {
    return type == ReduceType::f32 ? 4 : 2;
}

const char *wire_type_name(WireType type) {
    switch (type) {
        case WireType::f32:
            return "f32";
        case WireType::f16:
            return "f16";
        case WireType::q8_0:
            return "q8_0";
    }
    return "unknown";
}

bool wire_type_from_name(const std::string &name, WireType *out) {
    for (WireType t : {WireType::f32, WireType::f16, WireType::q8_0}) {
        if (name == wire_type_name(t)) {
            *out = t;
            return true;
        }
    }
    return false;
}

bool wire_type_known(uint32_t type) {
    return type == static_cast<uint32_t>(WireType::f32) || type == static_cast<uint32_t>(WireType::f16) ||
           type == static_cast<uint32_t>(WireType::q8_0);
}

size_t wire_row_bytes(WireType type, size_t n_embd) {
    switch (type) {
        case WireType::f32:
            return n_embd * 4;
        case WireType::f16:
            return n_embd * 2;
        case WireType::q8_0:
            return n_embd / kWireQ8Block * kWireQ8BlockBytes;  // n_embd % 32 == 0 (checked by the codec)
    }
    return 0;
}

}  // namespace td::net
