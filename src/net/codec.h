// The only place that turns bytes into message structs and back. Decoding validates every length against
// the named maxima in protocol.h and the bytes actually present; a malformed payload is invalid_input with a
// message naming the message type and the problem, never a crash or an over-read.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/protocol.h"

namespace td::net {

// Header <-> 32 bytes. decode_header checks magic, payload_bytes <= max_payload(type) and known type; a
// version other than kProtocolVersion is NOT an error here (the handshake reports it with both versions).
void encode_header(const FrameHeader &h, uint8_t out[kHeaderBytes]);
Result<FrameHeader> decode_header(const uint8_t in[kHeaderBytes]);

// Control messages: encode appends the payload to `out`; decode parses a whole payload.
void encode(const Hello &m, std::vector<uint8_t> &out);
void encode(const HelloReply &m, std::vector<uint8_t> &out);
void encode(const ErrorMsg &m, std::vector<uint8_t> &out);
void encode(const AuthChallenge &m, std::vector<uint8_t> &out);
void encode(const AuthProof &m, std::vector<uint8_t> &out);
void encode(const LoadStage &m, std::vector<uint8_t> &out);
void encode(const LoadReply &m, std::vector<uint8_t> &out);
void encode(const StageReady &m, std::vector<uint8_t> &out);
void encode(const SeqStart &m, std::vector<uint8_t> &out);
void encode(const SeqClear &m, std::vector<uint8_t> &out);
void encode(const StatsReply &m, std::vector<uint8_t> &out);
void encode(const TransportOffer &m, std::vector<uint8_t> &out);
void encode(const TransportReady &m, std::vector<uint8_t> &out);
Result<Hello> decode_hello(std::span<const uint8_t> payload);
Result<HelloReply> decode_hello_reply(std::span<const uint8_t> payload);
Result<ErrorMsg> decode_error(std::span<const uint8_t> payload);
Result<AuthChallenge> decode_auth_challenge(std::span<const uint8_t> payload);
Result<AuthProof> decode_auth_proof(std::span<const uint8_t> payload);
Result<LoadStage> decode_load_stage(std::span<const uint8_t> payload);
Result<LoadReply> decode_load_reply(std::span<const uint8_t> payload);
Result<StageReady> decode_stage_ready(std::span<const uint8_t> payload);
Result<SeqStart> decode_seq_start(std::span<const uint8_t> payload);
Result<SeqClear> decode_seq_clear(std::span<const uint8_t> payload);
Result<StatsReply> decode_stats_reply(std::span<const uint8_t> payload);
Result<TransportOffer> decode_transport_offer(std::span<const uint8_t> payload);
Result<TransportReady> decode_transport_ready(std::span<const uint8_t> payload);
// Measurements (version 3). decode checks every count against its kMaxProbe* limit, each row count in
// 1..kMaxBatchRows, sizes <= kMaxEchoPayload and budgets <= kMaxProbeBudgetMs.
void encode(const ProbeCompute &m, std::vector<uint8_t> &out);
void encode(const ProbeComputeReply &m, std::vector<uint8_t> &out);
void encode(const ProbeLink &m, std::vector<uint8_t> &out);
void encode(const ProbeLinkReply &m, std::vector<uint8_t> &out);
Result<ProbeCompute> decode_probe_compute(std::span<const uint8_t> payload);
Result<ProbeComputeReply> decode_probe_compute_reply(std::span<const uint8_t> payload);
Result<ProbeLink> decode_probe_link(std::span<const uint8_t> payload);
Result<ProbeLinkReply> decode_probe_link_reply(std::span<const uint8_t> payload);
// Version 8: decode_probe_sync checks rows, n_embd (rows x n_embd <= kMaxProbeSyncFloats), the reduce type,
// split <= the matrices, and the limits probe_compute's matrices have.
void encode(const ProbeSync &m, std::vector<uint8_t> &out);
void encode(const ProbeSyncReply &m, std::vector<uint8_t> &out);
Result<ProbeSync> decode_probe_sync(std::span<const uint8_t> payload);
Result<ProbeSyncReply> decode_probe_sync_reply(std::span<const uint8_t> payload);
// stats_request and shutdown carry no payload in this version; anything else is invalid_input.
Status decode_empty(MsgType type, std::span<const uint8_t> payload);

// WeightsChunk: encode appends the 16 fixed bytes; send the chunk's bytes as a second part (no copy).
// decode checks the chunk size (<= kMaxWeightsChunk), total in 1..kMaxStageFileBytes and
// offset + size <= total.
struct WeightsChunkView {
    WeightsChunk header;
    std::span<const uint8_t> bytes;  // points into the payload
};
void encode(const WeightsChunk &m, std::vector<uint8_t> &out);
Result<WeightsChunkView> decode_weights_chunk(std::span<const uint8_t> payload);

// Data path: views into a received payload, no copies. The spans point into `payload`, which must be 4-byte
// aligned (a std::vector's data always is; asserted). decode_forward also checks n_rows in 1..kMaxBatchRows,
// n_embd <= kMaxEmbd (and > 0, a multiple of 32 for q8_0, with hidden rows), known wire type and flags,
// want in 0..4, zero padding, pos/seq/token >= 0, targets (>= 0 on score rows, -1 elsewhere; required by a
// score row), and the exact payload size.
struct ForwardView {
    ForwardHeader header;
    std::span<const int32_t> pos, seq, token;  // token empty unless kForwardTokens or kForwardRowTokens
    std::span<const int32_t> target;           // empty unless kForwardTargets (a step with score rows)
    std::span<const uint8_t> want;
    std::span<const uint8_t> hidden;  // n_rows * wire_row_bytes(wire, n_embd), empty with kForwardTokens
};
Result<ForwardView> decode_forward(std::span<const uint8_t> payload);
// Writes a Forward payload into `out` (resized, capacity reused: no allocation in steady state).
// hidden: [n_rows, n_embd] f32 converted to `wire`; pass nullptr with kForwardTokens and tokens.
// Non-empty tokens (one per row) set kForwardTokens, or with hidden rows too kForwardRowTokens (a step with
// draft rows). Non-empty targets (one per row: a score row's token, -1 for the others) set kForwardTargets.
// Sizes that break the limits are a caller bug (asserted). f16 rounds to nearest even; q8_0 is ggml's
// quantizer (error <= d/2 per element, d = absmax/127 per 32).
void encode_forward(std::span<const int32_t> pos, std::span<const int32_t> seq, std::span<const uint8_t> want,
                    std::span<const int32_t> tokens, const float *hidden, uint32_t n_embd, WireType wire,
                    std::vector<uint8_t> &out, std::span<const int32_t> targets = {});
// Bytes of a Forward payload of n_rows hidden rows (tokens: with kForwardTokens, 4 bytes a row instead).
size_t forward_payload_bytes(uint32_t n_rows, uint32_t n_embd, WireType wire, bool tokens = false);
// Converts received hidden rows to f32. out: [n_rows, n_embd].
void wire_to_f32(const ForwardView &v, float *out);

struct ResultView {
    uint32_t n_outputs = 0;
    uint32_t flags = 0;
    std::span<const uint8_t> rows;    // n_outputs ResultRow records (16 bytes each, little-endian)
    // With kResultTop: per row that is not an embedding row, how many alternatives it has (each checked <=
    // kMaxResultTop), and the alternatives, in row order (ids checked in [0, n_vocab), logprobs not NaN).
    std::span<const uint8_t> top_counts;  // 4 bytes each: read with top_count(i)
    std::span<const uint8_t> top_pairs;   // 8 bytes each: read with top_pair(k)
    std::span<const uint8_t> logits;  // (n_outputs - n_embedding_rows) * n_vocab f32, with kResultLogits
    uint32_t n_embedding_rows = 0;    // rows whose token is kEmbeddingRowToken
    uint32_t n_embd = 0;              // with kResultEmbeddings
    std::span<const uint8_t> embeddings;  // n_embedding_rows * n_embd f32, with kResultEmbeddings
    ResultRow row(uint32_t i) const;
    uint32_t top_count(uint32_t i) const;
    ResultTop top_pair(uint64_t k) const;
};
// n_vocab: the logits row width the receiver expects (its model's); a payload with kResultLogits and
// n_vocab 0 is invalid_input. n_embd: the embedding width it expects. Row contents (seq, token) are not
// range-checked here: check them where used.
Result<ResultView> decode_result(std::span<const uint8_t> payload, uint32_t n_vocab, uint32_t n_embd);
// logits: [rows that are not embedding rows, n_vocab] or null; embeddings: [embedding rows, n_embd], required
// when a row's token is kEmbeddingRowToken. top_counts: empty, or one per row that is not an embedding row
// (kResultTop), with top_pairs their alternatives in row order.
void encode_result(std::span<const ResultRow> rows, const float *logits, uint32_t n_vocab,
                   const float *embeddings, uint32_t n_embd, std::vector<uint8_t> &out,
                   std::span<const uint32_t> top_counts = {}, std::span<const ResultTop> top_pairs = {});

}  // namespace td::net
