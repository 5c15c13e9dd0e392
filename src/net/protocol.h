// tandem wire protocol: every message that crosses between nodes, in one place.
// docs/protocol.md is the prose spec; a change to anything here bumps kProtocolVersion.
//
// Framing (all integers little-endian):
//
//   0        4        6        8           12          16                  24                  32
//   +--------+--------+--------+-----------+-----------+-------------------+-------------------+
//   | magic  |version | type   |  flags    | reserved  |  payload_bytes    |  request_id       |
//   | "TDM1" |  u16   |  u16   |   u32     |  u32 (0)  |       u64         |      u64          |
//   +--------+--------+--------+-----------+-----------+-------------------+-------------------+
//   | payload: payload_bytes bytes (<= kMaxPayload[type]); fixed struct fields first, then
//   | variable parts in the order each message documents (strings: u32 length + bytes; arrays: as stated)
//   +--------------------------------------------------------------------------------------------
//
// Nothing on the wire is a pointer, a function id or an unbounded length: each message type has a payload
// limit checked before anything is allocated, every string and array length is bounded by a named maximum.
// Tensor payloads are raw bytes after the fixed fields (no serialization framework on the data path).
//
// Topology: the head opens a control connection to every worker. Activations flow along a ring of data
// connections: head -> stage 1 -> ... -> last stage -> head; each sender opens the connection to its next
// hop. A stage may be a tensor-parallel group of ranks: every rank of it receives the same steps (the
// previous hop fans out), the ranks of a group are linked in a mesh of peer connections for their
// all-reduces (tp_partial) and sampling merge (tp_gather), and rank 0 of the last group returns the results.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace td::net {

inline constexpr uint32_t kMagic = 0x314d4454;  // "TDM1" read as little-endian u32
inline constexpr uint16_t kProtocolVersion = 18;
inline constexpr size_t kHeaderBytes = 32;

inline constexpr size_t kMaxString = 4096;                           // names, messages, build ids, addresses
inline constexpr size_t kMaxUcxAddress = 32768;  // a UCX worker address (transport_offer / transport_ready)
inline constexpr size_t kMaxControlPayload = 1 << 20;                // control messages other than weights
inline constexpr size_t kMaxWeightsChunk = 16u << 20;                // one WeightsChunk
inline constexpr size_t kMaxBatchRows = 8192;                        // rows in one Forward
inline constexpr size_t kMaxEmbd = 65536;                            // hidden size
inline constexpr size_t kMaxDataPayload = 1u << 30;                  // one Forward or Result (1 GiB)
inline constexpr size_t kMaxNextHops = 64;                           // destinations one stage rank sends to
inline constexpr size_t kMaxTpSize = 64;                             // ranks in a tensor-parallel group
inline constexpr size_t kMaxSeqHistory = 65536;                      // sampled tokens one SeqStart restores
inline constexpr size_t kMaxSeqLogitBias = 2048;                     // logit-bias entries of one SeqStart
inline constexpr size_t kMaxSeqDryBreakers = 32768;                  // DRY breaker sequences of one SeqStart
inline constexpr size_t kMaxSeqDryTail = 20;                         // tokens in one breaker's tail
inline constexpr size_t kMaxSeqDryTailTokens = 32768;                // tail tokens of one SeqStart, in all
inline constexpr size_t kMaxEchoPayload = 64u << 20;                 // one echo (netbench's largest message)
inline constexpr size_t kMaxProbeMatrices = 128;                     // shapes in one ProbeCompute
inline constexpr size_t kMaxProbeRows = 16;                          // row counts in one ProbeCompute
inline constexpr size_t kMaxProbeSizes = 32;                         // message sizes in one ProbeLink
inline constexpr uint64_t kMaxProbeMatrixBytes = uint64_t(4) << 30;  // one probed matrix
inline constexpr uint64_t kMaxProbeWorkingSet = uint64_t(1) << 30;   // what a compute probe may allocate
inline constexpr uint32_t kMaxProbeBudgetMs = 2000;                  // per measured point
inline constexpr uint64_t kMaxProbeSyncFloats = uint64_t(1) << 24;   // one lock-step probe's all-reduce

// Message types. Pinned: never renumber, only append.
enum class MsgType : uint16_t {
    hello = 1,          // client -> server, first message on every connection
    hello_reply = 2,    // server -> client
    error = 3,          // either way; the connection closes after it
    load_stage = 4,     // head -> worker (control): what to run
    load_reply = 5,     // worker -> head (control)
    weights_chunk = 6,  // head -> worker (control): a piece of the stage file
    stage_ready = 7,    // worker -> head (control): loaded, connected to the next hop
    forward = 8,        // data ring: one step of rows (tokens or hidden state)
    result = 9,         // last stage -> head (data): sampled tokens or logits rows
    seq_start = 10,     // data ring: (re)start a sequence, with its sampling parameters
    seq_clear = 11,     // data ring: forget a sequence
    ping = 12,          // control, either way
    pong = 13,
    stats_request = 14,  // head -> worker (control)
    stats_reply = 15,
    shutdown = 16,  // head -> worker (control): drop the stage, keep listening
    // version 2
    tp_partial =
        17,  // peer: a rank's partial sum (or reduced chunk) in an all-reduce; raw f32 after the header
    tp_gather = 18,  // peer: a rank's candidates for the sampling merge, to rank 0; opaque bytes
    // version 3: measurements (probe connections; they never touch the worker's stage or its head)
    echo = 19,  // probe: opaque bytes; echo_reply returns them (kEchoSink: only their count)
    echo_reply = 20,
    probe_compute = 21,  // probe: time matmuls of the given shapes on the worker's threads
    probe_compute_reply = 22,
    probe_link = 23,  // probe: the worker measures its own link to another worker
    probe_link_reply = 24,
    // version 4: authentication (between hello and hello_reply on every connection)
    auth_challenge = 25,  // server -> client: the server's nonce and its proof over the client's Hello
    auth_proof = 26,      // client -> server: the client's proof over the same transcript
    // version 6: transports (after hello_reply, when it names one other than TCP)
    transport_offer = 27,  // server -> client: how to attach to the chosen transport (ShmOffer for shm)
    transport_ready = 28,  // client -> server: attached (the TCP stream carries nothing after it), or why not
    // version 8: a tensor-parallel pair's synchronisation (probe connections)
    probe_sync = 29,  // probe: run a layer's matrices in lock step with another worker, an all-reduce apart
    probe_sync_reply = 30,
};

const char *msg_type_name(MsgType type);  // "forward", ...; "unknown" for others
bool msg_type_known(uint16_t type);       // hello..shutdown in this version

struct FrameHeader {
    uint32_t magic = kMagic;
    uint16_t version = kProtocolVersion;
    uint16_t type = 0;
    uint32_t flags = 0;
    uint32_t reserved = 0;
    uint64_t payload_bytes = 0;
    uint64_t request_id = 0;  // step id on the data ring; echo of the request on control replies
};
static_assert(sizeof(FrameHeader) == kHeaderBytes, "the header is 32 bytes on the wire");

// Largest payload accepted for a message type (0 for unknown types).
size_t max_payload(MsgType type);

// peer: a tensor-parallel rank's link to another rank of its group (Hello carries group and rank).
// probe: measurements (netbench, plan); a worker serves any number of them beside its head's control link.
enum class ConnRole : uint32_t { control = 1, data = 2, peer = 3, probe = 4 };

// How a connection carries its frames once the handshake is done. TCP is always possible; the others are
// negotiated (Hello.transports, HelloReply.transport) and fall back to TCP when either end cannot use them.
// shm: both processes on one host, frames through rings in a mapping they share (net/shm.h). ucx: UCX's
// tag-matching API (net/ucx.h), over RDMA where the hosts have it, else UCX's own shm / TCP.
enum class Transport : uint32_t { tcp = 0, shm = 1, ucx = 2 };
inline constexpr uint32_t transport_bit(Transport t) {
    return 1u << static_cast<uint32_t>(t);
}
inline constexpr uint32_t kTransportsTcp = transport_bit(Transport::tcp);
// Every transport a link may be asked to use; what this build and host can use is auto_transports().
inline constexpr uint32_t kTransportsAll =
    transport_bit(Transport::tcp) | transport_bit(Transport::shm) | transport_bit(Transport::ucx);
const char *transport_name(Transport t);  // "tcp", "shm", "ucx"
// "auto" (auto_transports()), "tcp", "shm" (shm where both ends share a host, else TCP), "ucx" (UCX, else
// TCP): the set of transports a node may use. Unknown names and ones this build lacks are errors.
bool transports_from_name(const std::string &name, uint32_t *bits, std::string *error);
// What "auto" allows: tcp; shm where this build has it; ucx where UCX sees an RDMA device (over plain
// Ethernet UCX's TCP is no faster than ours, and between processes of one host shm wins).
uint32_t auto_transports();
// Every transport this build and host can run (tcp, shm, ucx where built): what a worker started with "auto"
// accepts when a connector asks for it (the connector's own set decides).
uint32_t built_transports();

// Activation encoding on the wire.
enum class WireType : uint32_t { f32 = 0, f16 = 1, q8_0 = 8 };
const char *wire_type_name(WireType type);
bool wire_type_from_name(const std::string &name, WireType *out);
bool wire_type_known(uint32_t type);
// What the ranks of a tensor-parallel group send each other for an all-reduce (each rank rounds its own part
// the same way, so all ranks still sum the same values).
enum class ReduceType : uint32_t { f32 = 0, f16 = 1, bf16 = 2 };
const char *reduce_type_name(ReduceType type);
bool reduce_type_from_name(const std::string &name, ReduceType *out);
size_t reduce_type_bytes(ReduceType type);  // per value: 4 or 2
// q8_0 on the wire is ggml's block: f16 scale d, then 32 int8 q; x = d * q.
inline constexpr size_t kWireQ8Block = 32;
inline constexpr size_t kWireQ8BlockBytes = 34;
// Bytes of n rows of width n_embd (n_embd must be a multiple of 32 for q8_0).
size_t wire_row_bytes(WireType type, size_t n_embd);

// ---- messages (payload layouts) -------------------------------------------------------------------

// Every connection opens: client Hello (with its nonce) -> server AuthChallenge -> client AuthProof -> server
// HelloReply. The proofs are HMAC-SHA256 under the cluster secret over the Hello's payload bytes and the
// server's nonce (net/auth.h); nothing about the node, its model or its stage is sent before both proofs hold.
// A server speaking another version answers the Hello with a HelloReply that carries only its version and
// build id, so both ends can name the mismatch.
struct Hello {  // u32 protocol_version, u32 role, string build_id, string node_name, u64 group, u32 rank,
                // u8[32] nonce, u32 transports, string host_id
    uint32_t protocol_version = kProtocolVersion;
    ConnRole role = ConnRole::control;
    std::string build_id;   // TD_VERSION + git id
    std::string node_name;  // sender's host:port or "head"
    uint64_t group = 0;     // peer role: LoadStage.group of the sender's stage; else 0
    uint32_t rank = 0;      // peer role: the sender's rank in that group
    std::array<uint8_t, 32> nonce{};  // fresh random bytes for this connection
    uint32_t transports = kTransportsTcp;  // transport_bit()s the client may use for this connection
    std::string host_id;                   // the client's host (net::host_identity()): shm needs the same one
};

struct AuthChallenge {  // u8[32] nonce, u8[32] proof
    std::array<uint8_t, 32> nonce{};  // the server's fresh random bytes
    std::array<uint8_t, 32> proof{};  // HMAC(secret, "server" label || Hello payload || nonce)
};

struct AuthProof {  // u8[32] proof
    std::array<uint8_t, 32> proof{};  // HMAC(secret, "client" label || Hello payload || the server's nonce)
};

struct HelloReply {  // u32 protocol_version, string build_id, string node_name, then NodeInfo fields
    uint32_t protocol_version = kProtocolVersion;
    std::string build_id;
    std::string node_name;
    uint32_t n_threads = 0;
    uint64_t mem_total = 0;      // bytes
    uint64_t mem_available = 0;  // bytes
    float gflops = 0.0f;         // measured at startup (matmul), for placement
    std::string cpu;             // model name, ISA in use
    uint32_t transport = 0;      // Transport the connection continues over (not tcp: transport_offer follows)
};

// transport_offer for shm: the server's shared mapping, a memfd the client opens as /proc/<pid>/fd/<fd>
// (same host, same user). The token, also written in the mapping, proves the client opened the right one.
struct ShmOffer {  // u32 pid, i32 fd, u64 bytes, u8[16] token
    uint32_t pid = 0;
    int32_t fd = -1;
    uint64_t bytes = 0;
    std::array<uint8_t, 16> token{};
};
struct TransportOffer {  // u32 transport, then the transport's part (shm: ShmOffer; ucx: blob address)
    uint32_t transport = 0;
    ShmOffer shm;
    std::string ucx_address;  // the acceptor's UCX worker address (ucp_worker_get_address), <= kMaxUcxAddress
};
struct TransportReady {  // u32 ok (1: attached, 0: both ends stay on TCP), string reason, blob ucx_address
                         // (v7)
    uint32_t ok = 0;
    std::string reason;
    std::string ucx_address;  // ucx, ok 1: the connector's UCX worker address; else empty
};

struct ErrorMsg {  // u32 kind (td::ErrorKind), string message
    uint32_t kind = 0;
    std::string message;
};

struct LoadStage {
    // Which model and which part of it. The fingerprint is a 64-bit content hash (xxh3) of the stage's
    // tensors in file order; a worker with its own copy (--model) hashes the same tensors and must agree.
    uint64_t fingerprint = 0;
    uint64_t stage_file_bytes = 0;  // size of the stage GGUF the head would stream
    int32_t layer_first = 0;
    int32_t layer_last = 0;
    int32_t n_layer = 0;
    int32_t n_ctx = 0;
    int32_t n_seq = 0;
    uint16_t kv_type_k = 0;  // KvType (model/kv-cache.h) of the stage's K cache
    uint16_t kv_type_v = 0;  // and of its V cache
    uint32_t wire = 0;       // WireType of activations this stage receives and sends
    uint32_t n_threads = 0;  // 0: the worker's default
    std::string model_name;  // for messages
    bool is_last = false;    // last stage: samples and sends Result to the head
    // "host:port" of every hop this rank sends its output to: the ranks of the next stage it feeds, or the
    // head's data port. Empty for a rank of the last stage other than 0 (rank 0 sends the results).
    std::vector<std::string> next;  // [<= kMaxNextHops]
    // Tensor parallelism (tp_size 1: the stage is one node, the rest is unused). The stage's model is the
    // slice file of `slice` (kv_first, kv_last, ff_first, ff_last, vocab_first, vocab_last: model/tp-slice.h)
    // of layers [layer_first, layer_last); fingerprint is the slice file's, stage_fingerprint the whole
    // range's (what a worker's own copy must match before it cuts the slice).
    uint32_t tp_rank = 0;
    uint32_t tp_size = 1;
    int32_t slice[6] = {0, 0, 0, 0, 0, 0};
    uint64_t group = 0;  // names this group's mesh (peers' Hello.group)
    uint64_t stage_fingerprint = 0;
    uint32_t tp_reduce = 0;          // ReduceType of the all-reduce parts
    std::vector<std::string> peers;  // [tp_size] "host:port" of every rank's worker, in rank order
    uint32_t transports = kTransportsTcp;  // what the stage's own links (next hops, peers) may use
};

struct LoadReply {
    uint32_t need_weights = 0;  // 1: stream the stage file (no local copy, nothing cached)
    std::string source;         // "local file /models/x.gguf", "cache <hash>", ...
};

// A piece of the stage file (a GGUF holding the stage's tensors) streamed to a worker that has no copy:
// u64 offset, u64 total, then the raw bytes (<= kMaxWeightsChunk) of the file at [offset, offset + size).
// The head sends the pieces in order from offset 0; total is the same in every piece and at most
// kMaxStageFileBytes, which a receiver checks before it creates the file.
inline constexpr size_t kWeightsChunkFixedBytes = 16;
inline constexpr uint64_t kMaxStageFileBytes = uint64_t(1) << 40;  // 1 TiB
struct WeightsChunk {
    uint64_t offset = 0;
    uint64_t total = 0;
    // bytes follow
};

struct StageReady {
    uint64_t weight_bytes = 0;
    uint64_t kv_bytes = 0;
    float load_seconds = 0.0f;
};

// One pipeline step. Fixed part: u32 n_rows, u32 n_embd, u32 wire, u32 flags.
// Then: i32 pos[n_rows], i32 seq[n_rows], u8 want[n_rows] padded to 4 bytes (0 none, 1 logits, 2 embedding,
// 3 draft, 4 score),
// then either i32 token[n_rows] (flag kForwardTokens: first stage input) or hidden rows
// (n_rows * wire_row_bytes(wire, n_embd) bytes); with kForwardRowTokens (v12; set when a row is a draft, want
// 3), the hidden rows follow i32 token[n_rows] too: the last stage compares a draft row's token, the guess,
// with what its sequence samples at the row before. With kForwardTargets (v18; set exactly when a row is a
// score row, want 4), i32 target[n_rows] follows the token ids (or takes their place), before any hidden
// rows: a score row's is the token whose log-probability its result reports (>= 0), the others' -1.
//
//   | header 16 | pos 4n | seq 4n | want n, pad4 | [token 4n] | [target 4n] | [hidden rows] |
inline constexpr uint32_t kForwardTokens = 1u << 0;
inline constexpr uint32_t kForwardRowTokens = 1u << 1;
inline constexpr uint32_t kForwardTargets = 1u << 2;
struct ForwardHeader {
    uint32_t n_rows = 0;
    uint32_t n_embd = 0;
    uint32_t wire = 0;
    uint32_t flags = 0;
};

// Sampled tokens for the rows that wanted logits, and the rows that wanted an embedding (v11), in row order.
// Fixed part: u32 n_outputs, u32 flags. Then per output: i32 seq, i32 token, f32 logprob, f32 mirostat_mu
// (v17: the sampler's Mirostat threshold after the draw); an embedding row has token kEmbeddingRowToken; a
// score row (v18) has its target and the target's log-probability. With kResultTop (v18; set when a seq asked
// for n_probs > 0 in SeqStart): then u32 n_top[logits rows] (each <= kMaxResultTop; the rows that are not
// embedding rows, in order) and sum(n_top) pairs (i32 id, f32 logprob), each row's most likely tokens best
// first. With kResultLogits: followed by (n_outputs - embedding rows) * n_vocab f32 logits, the other rows'
// in order (only when a seq asked for them in SeqStart). With kResultEmbeddings (set exactly when there are
// embedding rows): then u32 n_embd and (embedding rows) * n_embd f32, the rows' final-normed hidden states in
// order.
//
//   | 8 | rows 16n | [n_top 4m, pairs 8k] | [logits 4 m n_vocab] | [n_embd 4, embeddings] |
inline constexpr uint8_t kWantEmbedding = 2;  // forward want: the row's embedding
inline constexpr uint8_t kWantDraft = 3;      // forward want (v12): logits, sampled only if its guess held
inline constexpr uint8_t kWantScore = 4;      // forward want (v18): logits, its target's log-probability
inline constexpr uint32_t kResultTop = 1u << 2;
inline constexpr uint32_t kMaxResultTop = 100;  // alternatives per row (SamplerParams' kMaxNProbs)
struct ResultTop {                              // i32 id, f32 logprob
    int32_t id = 0;
    float logprob = 0.0f;
};
inline constexpr int32_t kEmbeddingRowToken = -1;
inline constexpr int32_t kRejectedRowToken = -2;  // (v12) a draft row whose guess failed: nothing drawn
inline constexpr uint32_t kResultLogits = 1u << 0;
inline constexpr uint32_t kResultEmbeddings = 1u << 1;
inline constexpr size_t kResultRowBytes = 16;
struct ResultRow {
    int32_t seq = 0;
    int32_t token = 0;
    float logprob = 0.0f;
    float mirostat_mu = 0.0f;
};

struct SeqLogitBias {  // i32 id, f32 bias
    int32_t id = 0;
    float bias = 0.0f;
};

struct SeqDryBreaker {  // i32 head, u32 n, i32[n] tail
    int32_t head = 0;
    std::vector<int32_t> tail;  // [<= kMaxSeqDryTail]
};

struct SeqStart {  // sampling parameters, applied on the last stage; clears the sequence everywhere
    int32_t seq = 0;
    uint32_t want_logits = 0;
    float temperature = 0.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float min_p = 0.0f;
    float repeat_penalty = 1.0f;
    int32_t repeat_last_n = 64;
    float presence_penalty = 0.0f;
    float frequency_penalty = 0.0f;
    uint64_t seed = 0;
    // A resumed stream (v5): the sampler counts n_sampled tokens as drawn (one generator draw each when not
    // greedy) and accepts `history` before its first sample: the last of the tokens the stream has seen, its
    // prompt and then those it sampled (v15: the prompt too), as far back as the penalties and DRY read.
    uint64_t n_sampled = 0;
    std::vector<int32_t> history;  // [<= kMaxSeqHistory], each >= 0
    // v5: positions of the sequence every stage keeps (a prefix-cache hit); 0 clears it.
    uint32_t keep = 0;
    // v9: added to the listed tokens' logits before sampling (OpenAI logit_bias); -inf bans a token.
    std::vector<SeqLogitBias> logit_bias;  // [<= kMaxSeqLogitBias], ids >= 0, biases finite or -inf
    // v10: the sequence whose first `keep` positions are kept (>= 0): seq itself, or another one whose are
    // copied (a prompt that starts with the tokens it was fed).
    int32_t keep_from = 0;
    // v14: llama.cpp's further filters (SamplerParams: 1, <= 0, 0 turn them off).
    float typical_p = 1.0f;
    float top_n_sigma = -1.0f;
    float xtc_probability = 0.0f;
    float xtc_threshold = 0.1f;
    // v14: DRY (SamplerParams' fields; its breakers as token sequences).
    float dry_multiplier = 0.0f;
    float dry_base = 1.75f;
    int32_t dry_allowed_length = 2;
    int32_t dry_penalty_last_n = -1;
    std::vector<SeqDryBreaker> dry_breakers;  // [<= kMaxSeqDryBreakers]
    // v16: llama.cpp's dynamic temperature (SamplerParams' fields; a range of 0 turns it off).
    float dynatemp_range = 0.0f;
    float dynatemp_exponent = 1.0f;
    // v17: Mirostat (SamplerParams' fields; 0 turns it off), and its threshold where a resumed stream left
    // it (NaN: the start value, 2 * tau).
    int32_t mirostat = 0;
    float mirostat_tau = 5.0f;
    float mirostat_eta = 0.1f;
    float mirostat_mu = std::numeric_limits<float>::quiet_NaN();
    // v18: what each output reports (SamplerParams::n_probs): -1 nothing, 0 its token's log-probability, up
    // to kMaxResultTop also that many most likely tokens.
    int32_t n_probs = -1;
};

struct SeqClear {
    int32_t seq = 0;
};

// Per-node counters (all since the stage was loaded).
struct StatsReply {
    uint64_t msgs_in = 0, msgs_out = 0;
    uint64_t bytes_in = 0, bytes_out = 0;
    uint64_t forward_steps = 0;
    double compute_seconds = 0.0;  // inside Context::decode (collectives included)
    double wait_seconds = 0.0;     // idle, waiting for input
    double send_seconds = 0.0;     // blocked writing to the next hop
    // Tensor parallelism (version 2): collectives and their peer traffic.
    uint64_t tp_all_reduces = 0, tp_gathers = 0;
    uint64_t tp_bytes_out = 0, tp_bytes_in = 0;
    double tp_wait_seconds = 0.0;  // inside collectives: sending, and waiting for the peers' parts
    // Version 6: how the stage's links travel, "in tcp, out shm, peers shm shm" (the input's, each next hop's
    // and each peer's transport).
    std::string links;
};

// ---- measurements (version 3, probe connections) ----------------------------------------------------
//
// echo: any bytes (<= kMaxEchoPayload). echo_reply carries the same bytes, or with flag kEchoSink in the
// echo's header only a u64: the number of bytes received (one-way throughput without the echo's return).
inline constexpr uint32_t kEchoSink = 1u << 0;

// probe_compute: u32 n_threads, u32 budget_ms, u64 working_set, u32 count + count x (u32 dtype, u32 n_in,
// u32 n_out), u32 count + count x u32 rows. The worker times y = x W^T for every matrix at every row count
// on n_threads threads (0: its own count), each point for about budget_ms, cycling through copies of the
// matrix that together exceed working_set bytes (0: a few times its last-level cache), so the weights come
// from memory as they do in a forward pass. Packed where the engine would pack.
struct ProbeMatrix {
    uint32_t dtype = 0;  // DType
    uint32_t n_in = 0;
    uint32_t n_out = 0;
};
// Then the row ops of a layer (u32 n_embd, n_ff, n_head, n_head_kv, head_dim, n_pos; n_embd 0: none): one
// RMSNorm of n_embd, one SwiGLU of n_ff, RoPE of n_head + n_head_kv heads, one grouped attention of
// n_head / n_head_kv query heads over n_pos f16 positions, and one empty dispatch of the thread pool.
struct ProbeOps {
    uint32_t n_embd = 0, n_ff = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_pos = 0;
};
struct ProbeCompute {
    uint32_t n_threads = 0;
    uint32_t budget_ms = 20;            // <= kMaxProbeBudgetMs
    uint64_t working_set = 0;           // bytes, <= kMaxProbeWorkingSet
    std::vector<ProbeMatrix> matrices;  // [<= kMaxProbeMatrices]
    std::vector<uint32_t> rows;         // [<= kMaxProbeRows], each 1..kMaxBatchRows
    ProbeOps ops;                       // sizes <= kMaxEmbd (n_ff <= 16 x kMaxEmbd), n_pos <= 1 << 20
};
// probe_compute_reply: u32 n_threads, f64 read_gbps, u32 count + count x f64 seconds, then f64 norm, act,
// rope, attn, dispatch (seconds per call; 0 without ops).
struct ProbeComputeReply {
    uint32_t n_threads = 0;       // the threads that ran
    double read_gbps = 0.0;       // a plain read of the working set on those threads
    std::vector<double> seconds;  // [matrices x rows]: seconds per matmul, matrix-major
    double norm_s = 0.0, act_s = 0.0, rope_s = 0.0, attn_s = 0.0, dispatch_s = 0.0;
};

// One measured message size. Round trip (mode 0): echo's round trip, seconds per message. Stream (mode 1):
// messages sent back to back with kEchoSink; p50 .. max are seconds per message, gbps the rate.
struct LinkSample {
    uint64_t bytes = 0;
    uint32_t mode = 0;   // 0 round trip, 1 stream
    uint32_t count = 0;  // messages measured
    double p50 = 0.0, p90 = 0.0, p99 = 0.0, max = 0.0;
    double gbps = 0.0;  // payload bytes per second / 1e9
};
// probe_link: string address, u32 budget_ms, u32 count + count x u64 round-trip sizes, u32 count + count x
// u64 stream sizes (each <= kMaxEchoPayload). The worker opens a probe connection to `address` and runs the
// same measurement netbench runs; probe_link_reply: u32 count + count x LinkSample
// (u64 bytes, u32 mode, u32 count, 5 x f64).
struct ProbeLink {
    std::string address;
    uint32_t budget_ms = 100;            // per size, <= kMaxProbeBudgetMs
    std::vector<uint64_t> rtt_sizes;     // [<= kMaxProbeSizes]
    std::vector<uint64_t> stream_sizes;  // [<= kMaxProbeSizes]
    uint32_t transports = kTransportsTcp;  // what the measured link may use, as the engine's would (v6)
};
struct ProbeLinkReply {
    std::vector<LinkSample> samples;  // [<= 2 * kMaxProbeSizes]
};

// probe_sync (v8): u32 n_threads, u32 budget_ms, u64 working_set, u32 rows, u32 n_embd, u32 reduce, u32
// split, u32 count + count x (u32 dtype, u32 n_in, u32 n_out), string peer, u32 transports. With a peer, the
// worker dials it (a probe connection, `transports` as the engine's peer links may take) and sends it the
// same request without a peer; the two then run as ranks 0 and 1 of a tensor-parallel pair: over and over,
// the matrices [0, split) at `rows` rows, an all-reduce of rows x n_embd values (`reduce`, the engine's own
// collective over that connection), the matrices [split, count), another all-reduce, cycling through copies
// of the matrices that together exceed the working set, for about budget_ms (and at least 8 rounds). Rank 0
// stops them both (a flag summed along with the values). Each rank times its matrices and its waits in the
// all-reduces; rank 1 gives its figures to rank 0, which replies with both (probe_sync_reply). What the
// segments took beyond the slower rank's compute and the link's price is the pair's synchronisation: the
// stalls of either rank that the other waits out, which neither a compute probe nor a link probe sees.
struct ProbeSync {
    uint32_t n_threads = 0;
    uint32_t budget_ms = 300;           // <= kMaxProbeBudgetMs
    uint64_t working_set = 0;           // bytes, <= kMaxProbeWorkingSet (0: the worker's default)
    uint32_t rows = 1;                  // 1..kMaxBatchRows
    uint32_t n_embd = 0;                // 1..kMaxEmbd; rows x n_embd <= kMaxProbeSyncFloats
    uint32_t reduce = 0;                // ReduceType
    uint32_t split = 0;                 // <= matrices.size(): where the second segment starts
    std::vector<ProbeMatrix> matrices;  // [1, kMaxProbeMatrices], as probe_compute's
    std::string peer;                   // "host:port" of the other rank's worker; empty: this is rank 1
    uint32_t transports = kTransportsTcp;
};
// probe_sync_reply: u32 segments, f64 wall_s, u32 count + count x (f64 compute_s, f64 wait_s): per rank, rank
// 0 first (rank 1's own reply to rank 0 carries only its own).
struct ProbeSyncRank {
    double compute_s = 0.0;  // in its matrices, all segments
    double wait_s = 0.0;     // in its all-reduces
};
struct ProbeSyncReply {
    uint32_t segments = 0;  // segments timed (each: its matrices, then an all-reduce)
    double wall_s = 0.0;    // from the first timed segment to the last all-reduce's end (rank 0's clock)
    std::vector<ProbeSyncRank> ranks;  // [<= kMaxTpSize]
};

}  // namespace td::net
