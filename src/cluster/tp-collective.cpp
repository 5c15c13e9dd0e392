#include "cluster/tp-collective.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "core/check.h"
#include "core/log.h"
#include "net/protocol.h"
#include "tensor/fp16.h"

namespace td::cluster {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kAnyBytes = SIZE_MAX;
constexpr uint32_t kPhaseWhole = 0, kPhaseScatter = 1, kPhaseGather = 2;

// dst[i] += src[i], in that order for every i.
void add_into(float *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

PeerCollective::PeerCollective(int rank, int size, std::vector<std::string> peer_names, net::ReduceType reduce,
                               int timeout_ms)
    : rank_(rank), size_(size), names_(std::move(peer_names)), reduce_(reduce), timeout_ms_(timeout_ms),
      peers_(size), parts_(size), ptrs_(size) {
    TD_ASSERT(size >= 1 && rank >= 0 && rank < size && names_.size() == static_cast<size_t>(size),
              "rank {} of {} with {} names", rank, size, names_.size());
}

PeerCollective::~PeerCollective() {
    close();
    for (Peer &p : peers_) p.sender.reset();  // before the connections they write to
}

void PeerCollective::close() {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (Peer &p : peers_)
        if (p.conn) p.conn->close();
    attached_cv_.notify_all();
}

Status PeerCollective::attach(int peer, std::unique_ptr<net::Connection> conn) {
    std::lock_guard lock(mu_);
    if (closed_) return make_error(ErrorKind::failed, "the tensor-parallel stage is closing");
    if (peer < 0 || peer >= size_ || peer == rank_)
        return invalid_input("peer rank {} is not another rank of this group of {}", peer, size_);
    Peer &p = peers_[peer];
    if (p.conn) return invalid_input("rank {} ({}) is already linked", peer, names_[peer]);
    p.sender = std::make_unique<net::AsyncSender>(*conn, 2, timeout_ms_);
    p.conn = std::move(conn);
    attached_cv_.notify_all();
    return {};
}

std::unique_ptr<net::Connection> PeerCollective::detach(int peer) {
    if (peer < 0 || peer >= size_ || peer == rank_) return nullptr;
    Peer &p = peers_[peer];
    if (p.sender) (void)p.sender->flush();
    release(peer);
    std::unique_ptr<net::Connection> out;
    {
        std::lock_guard lock(mu_);
        p.sender.reset();  // before the connection it writes to leaves
        p.sender_used = false;
        out = std::move(p.conn);
    }
    close();
    return out;
}

PeerCollective::Peer *PeerCollective::linked(int peer, Status *error) {
    std::unique_lock lock(mu_);
    attached_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms_),
                          [&] { return closed_ || peers_[peer].conn != nullptr; });
    if (closed_) {
        *error = make_error(ErrorKind::disconnected, "the tensor-parallel stage was stopped");
        return nullptr;
    }
    if (!peers_[peer].conn) {
        *error = make_error(ErrorKind::failed, "tensor-parallel peer {} (rank {}) never linked up in {:.0f} s",
                            names_[peer], peer, timeout_ms_ / 1000.0);
        return nullptr;
    }
    return &peers_[peer];  // conn is never replaced once set
}

Status PeerCollective::peer_failed(int peer, const Status &why) {
    {
        std::lock_guard lock(mu_);
        if (closed_) return make_error(ErrorKind::disconnected, "the tensor-parallel stage was stopped");
    }
    const ErrorKind kind = why.kind() == ErrorKind::failed ? ErrorKind::failed : ErrorKind::disconnected;
    return Status(kind, fmt::format("tensor-parallel peer {} (rank {}): {}", names_[peer], peer, why.message()));
}

Status PeerCollective::send_to(int peer, net::MsgType type, uint64_t id, uint32_t flags, const void *data,
                               size_t bytes) {
    Status error;
    Peer *p = linked(peer, &error);
    if (p == nullptr) return error;
    const std::span<const uint8_t> payload{static_cast<const uint8_t *>(data), bytes};
    Status s;
    if (bytes > kInlineSendMaxBytes) {
        s = p->sender->enqueue(type, id, flags, payload);  // copied; we go on to receive
        p->sender_used = true;
    } else {
        if (p->sender_used) {  // frames of a link stay in order
            s = p->sender->flush();
            p->sender_used = false;
        }
        const std::span<const uint8_t> parts[1] = {payload};
        if (s.ok()) s = p->conn->send(type, id, flags, parts, timeout_ms_);
    }
    if (!s.ok()) return peer_failed(peer, s);
    bytes_out_ += net::kHeaderBytes + bytes;
    return {};
}

Status PeerCollective::flush_senders() {
    for (int r = 0; r < size_; ++r) {
        Peer &p = peers_[r];
        if (!p.sender_used) continue;
        p.sender_used = false;
        if (Status s = p.sender->flush(); !s.ok()) return peer_failed(r, s);
    }
    return {};
}

Result<std::span<const uint8_t>> PeerCollective::take(int peer, net::MsgType type, uint64_t id,
                                                      uint32_t flags, size_t bytes) {
    Status error;
    Peer *p = linked(peer, &error);
    if (p == nullptr) return error;
    Frame &f = p->frame;
    const bool spin = p->spin_rest == 0;
    if (!spin) --p->spin_rest;
    p->conn->set_recv_spin_us(spin ? kSpinUs : 0);
    const auto t0 = Clock::now();
    auto got = p->conn->recv_view(f.header, f.payload, timeout_ms_);
    if (!got.ok()) return peer_failed(peer, got.status());
    p->got = *got;
    if (spin) {
        const bool missed = Clock::now() - t0 > std::chrono::microseconds(kSpinUs);
        p->spin_misses = missed ? p->spin_misses + 1 : 0;
        if (p->spin_misses >= kSpinMisses) {
            p->spin_misses = 0;
            p->spin_rest = kSpinRest;
        }
    }
    bytes_in_ += net::kHeaderBytes + p->got.size();
    const net::FrameHeader &h = f.header;
    if (h.type != static_cast<uint16_t>(type) || h.request_id != id || h.flags != flags ||
        (bytes != kAnyBytes && p->got.size() != bytes)) {
        const size_t size = p->got.size();
        release(peer);
        return make_error(
            ErrorKind::failed,
            "tensor-parallel peer {} (rank {}) sent {} #{} phase {} of {} bytes, expected {} #{} "
            "phase {}",
            names_[peer], peer, net::msg_type_name(static_cast<net::MsgType>(h.type)), h.request_id, h.flags,
            size, net::msg_type_name(type), id, flags);
    }
    return p->got;
}

void PeerCollective::release(int peer) {
    Peer &p = peers_[peer];
    if (p.got.data() == nullptr) return;
    p.got = {};
    p.conn->release_view();
}

void PeerCollective::release_all() {
    for (int r = 0; r < size_; ++r)
        if (r != rank_) release(r);
}

std::span<const uint8_t> PeerCollective::encode(float *data, size_t n) {
    if (reduce_ == net::ReduceType::f32) return {reinterpret_cast<const uint8_t *>(data), n * sizeof(float)};
    wire_.resize(n);
    const bool half = reduce_ == net::ReduceType::f16;
    for (size_t i = 0; i < n; ++i) {
        wire_[i] = half ? fp32_to_fp16(data[i]) : fp32_to_bf16(data[i]);
        data[i] = half ? fp16_to_fp32(wire_[i]) : bf16_to_fp32(wire_[i]);
    }
    return {reinterpret_cast<const uint8_t *>(wire_.data()), n * sizeof(uint16_t)};
}

Status PeerCollective::receive_floats(int peer, uint64_t id, uint32_t phase, float *dst, size_t n) {
    const size_t elem = net::reduce_type_bytes(reduce_);
    TD_ASSIGN_OR_RETURN(const std::span<const uint8_t> got,
                        take(peer, net::MsgType::tp_partial, id, phase, n * elem));
    const uint8_t *src = got.data();
    if (reduce_ == net::ReduceType::f32) {
        std::memcpy(dst, src, n * sizeof(float));
    } else {
        const bool half = reduce_ == net::ReduceType::f16;
        for (size_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, src + 2 * i, 2);
            dst[i] = half ? fp16_to_fp32(h) : bf16_to_fp32(h);
        }
    }
    release(peer);
    return {};
}

Result<const float *> PeerCollective::receive_part(int peer, uint64_t id, uint32_t phase, size_t n) {
    if (reduce_ != net::ReduceType::f32) {
        parts_[peer].resize(n);
        TD_TRY(receive_floats(peer, id, phase, parts_[peer].data(), n));
        return parts_[peer].data();
    }
    TD_ASSIGN_OR_RETURN(const std::span<const uint8_t> got,
                        take(peer, net::MsgType::tp_partial, id, phase, n * sizeof(float)));
    if (reinterpret_cast<uintptr_t>(got.data()) % alignof(float) == 0)
        return reinterpret_cast<const float *>(got.data());  // read where it landed; released after the sum
    parts_[peer].resize(n);
    std::memcpy(parts_[peer].data(), got.data(), n * sizeof(float));
    release(peer);
    return parts_[peer].data();
}

void PeerCollective::sum_in_rank_order(float *out, size_t count) {
    if (size_ == 2) {  // p0 + p1 == p1 + p0 bit for bit (IEEE addition commutes): add the other's part
        add_into(out, ptrs_[1 - rank_], count);
        return;
    }
    if (rank_ != 0) {  // out becomes p0, then (p0 + p1), ...: keep our own part aside first
        parts_[rank_].assign(out, out + count);
        ptrs_[rank_] = parts_[rank_].data();
        std::memcpy(out, ptrs_[0], count * sizeof(float));
    }
    for (int r = 1; r < size_; ++r) add_into(out, ptrs_[r], count);
}

Status PeerCollective::all_reduce_sum(float *data, size_t n) {
    const uint64_t id = next_id_++;
    if (size_ == 1) return {};
    // Counted as it begins: the step's result can reach the head (which may then ask for stats) before a rank
    // returns from its last collective.
    n_all_reduce_ += 1;
    const auto t0 = Clock::now();
    const size_t bytes = n * net::reduce_type_bytes(reduce_);
    // Receives every peer's part of `count` floats into ptrs_ and sums them into out in rank order.
    auto receive_and_sum = [&](uint32_t phase, float *out, size_t count) -> Status {
        Status st;
        for (int p = 0; p < size_ && st.ok(); ++p) {
            if (p == rank_) continue;
            auto part = receive_part(p, id, phase, count);
            if (part.ok())
                ptrs_[p] = *part;
            else
                st = part.status();
        }
        if (st.ok()) sum_in_rank_order(out, count);
        release_all();
        return st;
    };
    Status s;
    if (size_ == 2 || bytes <= kDirectMaxBytes) {
        const std::span<const uint8_t> mine = encode(data, n);
        for (int p = 0; p < size_ && s.ok(); ++p)
            if (p != rank_) s = send_to(p, net::MsgType::tp_partial, id, kPhaseWhole, mine.data(), mine.size());
        if (s.ok()) s = receive_and_sum(kPhaseWhole, data, n);
    } else {
        auto chunk = [&](int r) { return n * static_cast<size_t>(r) / static_cast<size_t>(size_); };
        const size_t mine = chunk(rank_), mine_n = chunk(rank_ + 1) - mine;
        for (int p = 0; p < size_ && s.ok(); ++p) {
            if (p == rank_) continue;
            const std::span<const uint8_t> part = encode(data + chunk(p), chunk(p + 1) - chunk(p));
            s = send_to(p, net::MsgType::tp_partial, id, kPhaseScatter, part.data(), part.size());
        }
        (void)encode(data + mine, mine_n);  // our own part of our chunk, rounded as the others' are
        if (s.ok()) s = receive_and_sum(kPhaseScatter, data + mine, mine_n);
        const std::span<const uint8_t> reduced = s.ok() ? encode(data + mine, mine_n) : std::span<const uint8_t>{};
        for (int p = 0; p < size_ && s.ok(); ++p)
            if (p != rank_) s = send_to(p, net::MsgType::tp_partial, id, kPhaseGather, reduced.data(), reduced.size());
        for (int p = 0; p < size_ && s.ok(); ++p)
            if (p != rank_) s = receive_floats(p, id, kPhaseGather, data + chunk(p), chunk(p + 1) - chunk(p));
    }
    if (s.ok()) s = flush_senders();
    wait_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    return s;
}

Status PeerCollective::gather(std::span<const uint8_t> mine, std::vector<std::vector<uint8_t>> &out) {
    const uint64_t id = next_id_++;
    n_gather_ += 1;  // as it begins (see all_reduce_sum)
    const auto t0 = Clock::now();
    Status s;
    if (rank_ != 0) {
        s = send_to(0, net::MsgType::tp_gather, id, 0, mine.data(), mine.size());
    } else {
        out.resize(size_);
        out[0].assign(mine.begin(), mine.end());
        for (int p = 1; p < size_ && s.ok(); ++p) {
            auto got = take(p, net::MsgType::tp_gather, id, 0, kAnyBytes);
            if (!got.ok()) {
                s = got.status();
                break;
            }
            out[p].assign(got->begin(), got->end());
            release(p);
        }
    }
    wait_ns_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
    return s;
}

std::string PeerCollective::links() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        if (!out.empty()) out += ' ';
        out += peers_[p].conn ? net::transport_name(peers_[p].conn->transport()) : "-";
    }
    return out;
}

PeerCollective::Stats PeerCollective::stats() const {
    Stats st;
    st.all_reduces = n_all_reduce_;
    st.gathers = n_gather_;
    st.bytes_out = bytes_out_;
    st.bytes_in = bytes_in_;
    st.wait_seconds = static_cast<double>(wait_ns_) * 1e-9;
    return st;
}

}  // namespace td::cluster
