// UCX transport (net/ucx.h): one UCX worker and endpoint per connection, frames as tagged messages.
//
// Every UCX call on a worker is made under the connection's mutex (the worker runs in UCX's serialized thread
// mode), so one thread may send while another receives, as on every Connection. A waiting thread drives
// progress, and when it must sleep arms the worker and polls its event fd in slices of kSleepSliceMs, looking
// between them at the TCP connection kept beside it (a dead peer's kernel closes it). Two threads may sleep
// on the same fd while one of them arms it; a thread whose progress call did something therefore signals the
// worker when the other sleeps, so neither waits for an event the other consumed.
//
// The peer is another process: a message shorter than a header, or longer than this connection accepts, makes
// the connection fail (invalid_input) before its payload is allocated.
#include "net/ucx.h"

#include <filesystem>

#ifdef TD_HAVE_UCX
#include <poll.h>
#include <ucp/api/ucp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "net/codec.h"
#include "net/spin.h"
#endif

namespace td::net {

bool ucx_has_rdma() {
    std::error_code ec;
    std::filesystem::directory_iterator it("/sys/class/infiniband", ec);
    return !ec && it != std::filesystem::directory_iterator();
}

#ifndef TD_HAVE_UCX

bool ucx_supported() {
    return false;
}

Result<std::unique_ptr<UcxWorker>> ucx_prepare() {
    return make_error(ErrorKind::unimplemented, "this build has no UCX (install libucx-dev and rebuild)");
}

std::unique_ptr<Connection> ucx_connection(std::unique_ptr<UcxWorker>, std::unique_ptr<Connection> control) {
    return control;  // unreachable: ucx_prepare() never succeeds
}

#else

bool ucx_supported() {
    return true;
}

namespace {

constexpr ucp_tag_t kFrameTag = 0x7464'6d31;  // "tdm1": every frame; each connection has its own worker
constexpr int kSleepSliceMs = 20;
constexpr int64_t kCloseFlushNs = 200'000'000;  // how long close() waits for sent frames to reach a live peer
constexpr int64_t kDrainNs = 20'000'000;  // after the peer's TCP closed: how long its last frames may take

Status ucx_error(ErrorKind kind, const char *what, ucs_status_t s) {
    return make_error(kind, "UCX {}: {}", what, ucs_status_string(s));
}

// One UCX context per process, made on first use and kept to the end (workers come and go with connections).
Result<ucp_context_h> shared_context() {
    static std::mutex mu;
    static ucp_context_h ctx = nullptr;
    static Status failed;
    std::lock_guard lock(mu);
    if (ctx != nullptr) return ctx;
    if (!failed.ok()) return failed;
    ucp_config_t *config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) {
        failed = ucx_error(ErrorKind::io, "reading the configuration", s);
        return failed;
    }
    // Frames go eagerly, whatever their size: a send then completes once UCX has the bytes, as over TCP,
    // instead of waiting for the receiver to post its receive (rendezvous), which would deadlock two nodes
    // that each send before they receive (the all-reduce). UCX_RNDV_THRESH in the environment still wins.
    if (std::getenv("UCX_RNDV_THRESH") == nullptr) (void)ucp_config_modify(config, "RNDV_THRESH", "inf");
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;  // connections' workers are made and used from several threads
    params.name = "tandem";
    s = ucp_init(&params, config, &ctx);
    ucp_config_release(config);
    if (s != UCS_OK) {
        ctx = nullptr;
        failed = ucx_error(ErrorKind::io, "initialising", s);
        return failed;
    }
    return ctx;
}

class Worker final : public UcxWorker {
public:
    ~Worker() override {
        if (worker != nullptr) ucp_worker_destroy(worker);
    }
    const std::string &address() const override { return address_; }
    Status link(const std::string &peer_address) override {
        if (ep != nullptr) return invalid_input("UCX worker already linked");
        if (peer_address.empty()) return invalid_input("UCX: the peer sent no worker address");
        // The address is copied: UCX reads it while creating the endpoint only.
        std::vector<uint8_t> addr(peer_address.begin(), peer_address.end());
        ucp_ep_params_t params{};
        params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        params.address = reinterpret_cast<const ucp_address_t *>(addr.data());
        // No UCX error handling: its peer mode arms keepalive timers that keep the event fd from sleeping. A
        // dead peer is found through the TCP connection kept beside the endpoint instead.
        params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
        const ucs_status_t s = ucp_ep_create(worker, &params, &ep);
        if (s != UCS_OK) {
            ep = nullptr;
            return ucx_error(ErrorKind::io, "connecting to the peer's worker", s);
        }
        return {};
    }

    ucp_worker_h worker = nullptr;
    ucp_ep_h ep = nullptr;
    int efd = -1;
    std::string address_;
};

class UcxConnection final : public Connection {
public:
    UcxConnection(std::unique_ptr<Worker> w, std::unique_ptr<Connection> control)
        : w_(std::move(w)),
          control_(std::move(control)),
          peer_(control_->peer()),
          local_(control_->local()) {}
    ~UcxConnection() override { close(); }

    Status send(MsgType type, uint64_t request_id, uint32_t flags,
                std::span<const std::span<const uint8_t>> parts, int timeout_ms) override;
    Status recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms) override;
    void close() override;
    bool is_open() const override { return !closed_ && !peer_gone_; }
    bool readable() const override {
        std::lock_guard lock(mu_);
        if (closed_) return true;
        ucp_tag_recv_info_t info;
        while (ucp_worker_progress(w_->worker) != 0) {
        }
        return ucp_tag_probe_nb(w_->worker, kFrameTag, ~ucp_tag_t{0}, 0, &info) != nullptr ||
               control_->readable();
    }
    std::string peer() const override { return peer_; }
    std::string local() const override { return local_; }
    Transport transport() const override { return Transport::ucx; }

private:
    Status closed_status() const {
        return make_error(ErrorKind::disconnected, "connection to {} was closed", peer_);
    }
    // Under mu_: one round of progress; wakes a thread that sleeps on the event fd when it did something.
    void progress_locked() {
        if (ucp_worker_progress(w_->worker) != 0 && sleepers_.load(std::memory_order_acquire) > 0)
            (void)ucp_worker_signal(w_->worker);
    }
    // Calls done() (under mu_, after a round of progress) until it holds: spinning for spin_ns, then sleeping
    // on the event fd in slices. ok (done, or *timed_out at the deadline), or disconnected (closed, or the
    // peer's TCP connection closed and nothing more came within kDrainNs).
    template <typename Done>
    Status wait_until(Done done, int timeout_ms, int64_t spin_ns, bool *timed_out);
    // Waits for a send or receive request and frees it; *st is its final status. A wait that fails or times
    // out (*timed_out) abandons the request and closes the connection: part of a frame may have moved.
    Status complete(void *request, int timeout_ms, ucs_status_t *st, bool *timed_out);
    // An in-flight request that will not be waited for: cancelled, given a bounded chance to finish, freed.
    void abandon(void *request);
    // A probed message that will not be received: taken into a buffer too small for it (UCX truncates it and
    // releases what it held), never into memory sized by the peer.
    void discard(ucp_tag_message_h msg);

    std::unique_ptr<Worker> w_;
    std::unique_ptr<Connection> control_;
    std::string peer_, local_;
    mutable std::mutex mu_;  // every UCX call on the worker
    std::mutex send_mu_, recv_mu_;
    std::atomic<int> sleepers_{0};
    std::atomic<bool> closed_{false};
    std::atomic<bool> peer_gone_{false};
    Status broken_;  // a message that cannot be a frame: every later recv fails
    std::vector<ucp_dt_iov_t> send_iov_;  // send()'s scatter-gather list, reused (send_mu_)
};

template <typename Done>
Status UcxConnection::wait_until(Done done, int timeout_ms, int64_t spin_ns, bool *timed_out) {
    const int64_t start = now_ns();
    const bool forever = timeout_ms < 0;
    const int64_t end = start + int64_t{timeout_ms} * 1000000;
    auto step = [&] {
        std::lock_guard lock(mu_);
        progress_locked();
        return done();
    };
    if (step()) return {};
    SpinYield yield;
    for (int64_t now = start, spin_end = start + spin_ns; now < spin_end; now = now_ns()) {
        for (int i = 0; i < 16; ++i) cpu_relax();
        if (step()) return {};
        if (closed_) return closed_status();
        yield(now);
    }
    for (;;) {
        if (closed_) return closed_status();
        if (step()) return {};
        if (control_->readable()) {
            // The peer's process closed its TCP connection; frames it sent just before may still be arriving.
            for (const int64_t drain_end = now_ns() + kDrainNs; now_ns() < drain_end;) {
                if (step()) return {};
                std::this_thread::yield();
            }
            peer_gone_ = true;
            return make_error(ErrorKind::disconnected, "peer {} has gone (its connection closed)", peer_);
        }
        const int64_t now = now_ns();
        if (!forever && now >= end) {
            *timed_out = true;
            return {};
        }
        // Counted as a sleeper before arming: another thread's progress from here on signals the fd, so an
        // event it consumes after our arm still wakes us.
        ucs_status_t armed;
        {
            std::lock_guard lock(mu_);
            if (done()) return {};
            sleepers_.fetch_add(1, std::memory_order_acq_rel);
            armed = ucp_worker_arm(w_->worker);
        }
        int ms = kSleepSliceMs;
        if (!forever) ms = static_cast<int>(std::clamp<int64_t>((end - now + 999999) / 1000000, 1, ms));
        if (armed == UCS_OK) {
            pollfd p{w_->efd, POLLIN, 0};
            (void)::poll(&p, 1, ms);
        } else if (armed != UCS_ERR_BUSY) {  // busy: events came in meanwhile, progress them
            std::this_thread::sleep_for(std::chrono::milliseconds(1));  // no event fd to sleep on
        }
        sleepers_.fetch_sub(1, std::memory_order_acq_rel);
    }
}

Status UcxConnection::complete(void *request, int timeout_ms, ucs_status_t *st, bool *timed_out) {
    Status s = wait_until(
        [&] {
            *st = ucp_request_check_status(request);
            return *st != UCS_INPROGRESS;
        },
        timeout_ms, 0, timed_out);
    if (!s.ok() || *timed_out) {
        abandon(request);
        close();
        return s;
    }
    std::lock_guard lock(mu_);
    ucp_request_free(request);
    return {};
}

void UcxConnection::abandon(void *request) {
    std::lock_guard lock(mu_);
    if (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_request_cancel(w_->worker, request);
    for (const int64_t end = now_ns() + 100'000'000;
         ucp_request_check_status(request) == UCS_INPROGRESS && now_ns() < end;)
        (void)ucp_worker_progress(w_->worker);
    ucp_request_free(request);  // still in progress: UCX releases it when it completes
}

void UcxConnection::discard(ucp_tag_message_h msg) {
    uint8_t sink[kHeaderBytes];
    ucp_request_param_t param{};
    ucs_status_ptr_t req;
    {
        std::lock_guard lock(mu_);
        req = ucp_tag_msg_recv_nbx(w_->worker, sink, sizeof sink, msg, &param);
    }
    if (req != nullptr && !UCS_PTR_IS_ERR(req)) abandon(req);
}

Status UcxConnection::send(MsgType type, uint64_t request_id, uint32_t flags,
                           std::span<const std::span<const uint8_t>> parts, int timeout_ms) {
    std::lock_guard send_lock(send_mu_);
    const int64_t t0 = now_ns();
    if (closed_) return closed_status();
    if (peer_gone_) return make_error(ErrorKind::disconnected, "peer {} has gone", peer_);
    uint8_t raw[kHeaderBytes];
    TD_ASSIGN_OR_RETURN(const uint64_t total, encode_frame_header(type, request_id, flags, parts, raw));

    // The frame goes out from the caller's buffers: header, then each non-empty part.
    std::vector<ucp_dt_iov_t> &iov = send_iov_;
    iov.clear();
    iov.push_back({raw, kHeaderBytes});
    for (const auto &p : parts)
        if (!p.empty()) iov.push_back({const_cast<uint8_t *>(p.data()), p.size()});
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    ucs_status_ptr_t req;
    {
        std::lock_guard lock(mu_);
        if (w_->ep == nullptr) return closed_status();  // closed by another thread since the check above
        req = ucp_tag_send_nbx(w_->ep, iov.data(), iov.size(), kFrameTag, &param);
    }
    if (UCS_PTR_IS_ERR(req)) return ucx_error(ErrorKind::disconnected, "send", UCS_PTR_STATUS(req));
    if (req != nullptr) {
        ucs_status_t st = UCS_INPROGRESS;
        bool timed_out = false;
        TD_TRY(complete(req, timeout_ms, &st, &timed_out));
        if (timed_out)
            return make_error(ErrorKind::failed, "send of {} to {} timed out after {} ms; closed",
                              msg_type_name(type), peer_, timeout_ms);
        if (st != UCS_OK) {
            close();
            return ucx_error(ErrorKind::disconnected, "send", st);
        }
    }
    stats_.msgs_sent.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes_sent.fetch_add(kHeaderBytes + total, std::memory_order_relaxed);
    stats_.send_ns.fetch_add(static_cast<uint64_t>(now_ns() - t0), std::memory_order_relaxed);
    return {};
}

Status UcxConnection::recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms) {
    std::lock_guard recv_lock(recv_mu_);
    if (!broken_.ok()) return broken_;
    if (closed_) return closed_status();
    const int64_t start = now_ns();
    ucp_tag_message_h msg = nullptr;
    ucp_tag_recv_info_t info{};
    bool timed_out = false;
    TD_TRY(wait_until(
        [&] {
            msg = ucp_tag_probe_nb(w_->worker, kFrameTag, ~ucp_tag_t{0}, 1, &info);
            return msg != nullptr;
        },
        timeout_ms, recv_spin_ns_, &timed_out));
    if (timed_out) return make_error(ErrorKind::failed, "no frame from {} within {} ms", peer_, timeout_ms);

    // The message is taken off UCX's queue: from here on a failure loses the stream.
    const size_t len = info.length;
    const uint64_t limit = std::min<uint64_t>(recv_limit_, kMaxDataPayload);
    if (len < kHeaderBytes || len - kHeaderBytes > limit) {
        broken_ = invalid_input("message from {} of {} bytes: {}", peer_, len,
                                len < kHeaderBytes ? "shorter than a frame header"
                                                   : "its payload exceeds this connection's limit");
        discard(msg);
        close();
        return broken_;
    }
    uint8_t raw[kHeaderBytes];
    payload.resize(len - kHeaderBytes);
    ucp_dt_iov_t iov[2] = {{raw, kHeaderBytes}, {payload.data(), payload.size()}};
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_DATATYPE;
    param.datatype = ucp_dt_make_iov();
    ucs_status_ptr_t req;
    {
        std::lock_guard lock(mu_);
        req = ucp_tag_msg_recv_nbx(w_->worker, iov, payload.empty() ? 1 : 2, msg, &param);
    }
    if (UCS_PTR_IS_ERR(req)) {
        broken_ = ucx_error(ErrorKind::disconnected, "receive", UCS_PTR_STATUS(req));
        close();
        return broken_;
    }
    if (req != nullptr) {
        ucs_status_t st = UCS_INPROGRESS;
        const int left_ms =
            timeout_ms < 0
                ? -1
                : static_cast<int>(std::max<int64_t>(1, timeout_ms - (now_ns() - start) / 1000000));
        TD_TRY(complete(req, left_ms, &st, &timed_out));
        if (timed_out)
            return make_error(ErrorKind::failed,
                              "recv from {} timed out after {} ms inside a {}-byte frame; closed", peer_,
                              timeout_ms, len);
        if (st != UCS_OK) {
            broken_ = ucx_error(ErrorKind::disconnected, "receive", st);
            close();
            return broken_;
        }
    }
    Result<FrameHeader> h = checked_header(raw, peer_);
    if (h.ok() && h->payload_bytes != len - kHeaderBytes)
        h = invalid_input("frame from {}: its header announces {} payload bytes, the message holds {}", peer_,
                          h->payload_bytes, len - kHeaderBytes);
    if (!h.ok()) {
        broken_ = h.status();
        close();
        return broken_;
    }
    header = *h;
    stats_.msgs_recv.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes_recv.fetch_add(len, std::memory_order_relaxed);
    return {};
}

void UcxConnection::close() {
    if (closed_.exchange(true)) return;
    {
        std::lock_guard lock(mu_);
        if (w_->ep != nullptr) {
            // A live peer gets what was sent before the endpoint goes (bounded); a dead one is not waited
            // for.
            const bool gone = peer_gone_ || control_->readable();
            ucp_request_param_t param{};
            if (gone) {
                param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
                param.flags = UCP_EP_CLOSE_FLAG_FORCE;
            }
            ucs_status_ptr_t req = ucp_ep_close_nbx(w_->ep, &param);
            w_->ep = nullptr;
            if (req != nullptr && !UCS_PTR_IS_ERR(req)) {
                for (const int64_t end = now_ns() + kCloseFlushNs;
                     ucp_request_check_status(req) == UCS_INPROGRESS && now_ns() < end &&
                     !control_->readable();)
                    (void)ucp_worker_progress(w_->worker);
                ucp_request_free(req);
            }
        }
        (void)ucp_worker_signal(w_->worker);  // wakes a thread sleeping on the event fd
    }
    control_->close();
}

}  // namespace

Result<std::unique_ptr<UcxWorker>> ucx_prepare() {
    TD_ASSIGN_OR_RETURN(ucp_context_h ctx, shared_context());
    auto w = std::make_unique<Worker>();
    ucp_worker_params_t params{};
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    params.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // the connection's mutex serialises every call
    ucs_status_t s = ucp_worker_create(ctx, &params, &w->worker);
    if (s != UCS_OK) {
        w->worker = nullptr;
        return ucx_error(ErrorKind::io, "creating a worker", s);
    }
    s = ucp_worker_get_efd(w->worker, &w->efd);
    if (s != UCS_OK) return ucx_error(ErrorKind::io, "the worker's event fd", s);
    ucp_address_t *addr = nullptr;
    size_t addr_len = 0;
    s = ucp_worker_get_address(w->worker, &addr, &addr_len);
    if (s != UCS_OK) return ucx_error(ErrorKind::io, "the worker's address", s);
    w->address_.assign(reinterpret_cast<const char *>(addr), addr_len);
    ucp_worker_release_address(w->worker, addr);
    if (w->address_.size() > kMaxUcxAddress)
        return make_error(ErrorKind::io, "UCX worker address of {} bytes exceeds the protocol's {}",
                          w->address_.size(), kMaxUcxAddress);
    return std::unique_ptr<UcxWorker>(std::move(w));
}

std::unique_ptr<Connection> ucx_connection(std::unique_ptr<UcxWorker> worker,
                                           std::unique_ptr<Connection> control) {
    std::unique_ptr<Worker> w(static_cast<Worker *>(worker.release()));
    return std::make_unique<UcxConnection>(std::move(w), std::move(control));
}

#endif  // TD_HAVE_UCX

}  // namespace td::net
