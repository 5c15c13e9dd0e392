// Shared-memory transport (net/shm.h): a memfd holding a header page and two byte rings.
//
// Each ring has one producer and one consumer. The producer copies bytes in and publishes its `head` (bytes
// written, release); the consumer copies them out and publishes its `tail` (bytes read). A side that must
// wait spins, then sleeps on a futex word with a Dekker-style handshake: it sets its `sleeping` flag, fences,
// re-checks, and sleeps unless the other side's publish came in between; a publisher fences after publishing
// and calls FUTEX_WAKE only when the flag is set, so a busy pipeline makes no system calls at all. Sleeps
// last at most kSleepSliceMs: between them the sleeper looks at the peer's closed flag and at the TCP
// connection kept beside the rings, which a dead peer's kernel closes.
//
// The peer is another process: nothing read from the mapping is trusted. Ring positions that break
// 0 <= head - tail <= capacity make the connection fail (invalid_input), never index out of the ring.
#include "net/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include <openssl/crypto.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <thread>

#include "net/auth.h"
#include "net/codec.h"
#include "net/spin.h"

namespace td::net {

struct ShmAccess {
    static std::unique_ptr<ShmRegion> make(uint8_t *base, size_t bytes, size_t ring_bytes, int fd) {
        std::unique_ptr<ShmRegion> r(new ShmRegion());
        r->base_ = base;
        r->bytes_ = bytes;
        r->ring_bytes_ = ring_bytes;
        r->fd_ = fd;
        return r;
    }
};

ShmRegion::~ShmRegion() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
    close_fd();
}

void ShmRegion::close_fd() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
}

namespace {

constexpr uint64_t kShmMagic = 0x0031'4d48'534d'4454ULL;  // "TDMSHM1"
constexpr uint32_t kShmLayoutVersion = 1;
constexpr size_t kHeaderRegion = 4096;
constexpr size_t kMinRing = 4096;
constexpr size_t kMaxRing = size_t{1} << 30;
constexpr int kSleepSliceMs = 20;       // a sleeping side looks at its peer at least this often
constexpr int64_t kSendSpinNs = 20000;  // a sender waiting for room spins this long before it sleeps
constexpr uint64_t kPublishEvery = 64u
                                   << 10;  // a long frame goes out in pieces the receiver copies meanwhile

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "ring positions and futex words must be lock-free to be shared between processes");

struct RingCtl {
    alignas(64) std::atomic<uint64_t> head{0};      // bytes written, by the producer
    alignas(64) std::atomic<uint64_t> tail{0};      // bytes read, by the consumer
    alignas(64) std::atomic<uint32_t> data_seq{0};  // the consumer sleeps on it waiting for bytes
    std::atomic<uint32_t> consumer_sleeping{0};
    alignas(64) std::atomic<uint32_t> space_seq{0};  // the producer sleeps on it waiting for room
    std::atomic<uint32_t> producer_sleeping{0};
};

struct SharedHeader {
    uint64_t magic = 0;
    uint32_t version = 0;
    uint32_t reserved = 0;
    uint64_t ring_bytes = 0;
    uint8_t token[16] = {};
    std::atomic<uint32_t> closed[2] = {0, 0};  // [0] the server closed, [1] the client
    RingCtl ring[2];                           // [0] server -> client, [1] client -> server
};
static_assert(sizeof(SharedHeader) <= kHeaderRegion, "the header fits its page");

class Deadline {
public:
    explicit Deadline(int timeout_ms)
        : forever_(timeout_ms < 0), end_ns_(now_ns() + int64_t{timeout_ms} * 1000000) {}
    bool passed() const { return !forever_ && now_ns() >= end_ns_; }
    // How long the next sleep may last: a slice, less when the deadline is nearer (at least 1 ms).
    int sleep_ms() const {
        if (forever_) return kSleepSliceMs;
        const int64_t left = (end_ns_ - now_ns() + 999999) / 1000000;
        return static_cast<int>(std::clamp<int64_t>(left, 1, kSleepSliceMs));
    }

private:
    bool forever_;
    int64_t end_ns_;
};

void futex_wait(std::atomic<uint32_t> &word, uint32_t expected, int ms) {
#ifdef __linux__
    timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1000000};
    (void)syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
    (void)word;
    (void)expected;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(ms, 1)));
#endif
}

void futex_wake(std::atomic<uint32_t> &word) {
#ifdef __linux__
    (void)syscall(SYS_futex, reinterpret_cast<uint32_t *>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
#else
    (void)word;
#endif
}

// After publishing: wakes the other side if it sleeps (or is about to) on `seq`.
void notify(std::atomic<uint32_t> &seq, std::atomic<uint32_t> &sleeping) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_relaxed) != 0) {
        seq.fetch_add(1, std::memory_order_release);
        futex_wake(seq);
    }
}

std::string errno_text(int err) {
    char buf[128];
    return strerror_r(err, buf, sizeof buf);
}

class ShmConnection final : public Connection {
public:
    ShmConnection(std::unique_ptr<ShmRegion> region, std::unique_ptr<Connection> control, bool server)
        : region_(std::move(region)),
          control_(std::move(control)),
          side_(server ? 0 : 1),
          hdr_(reinterpret_cast<SharedHeader *>(region_->base())),
          out_(hdr_->ring[side_]),
          in_(hdr_->ring[1 - side_]),
          cap_(region_->ring_bytes()),
          mask_(cap_ - 1),
          out_data_(region_->base() + kHeaderRegion + static_cast<size_t>(side_) * cap_),
          in_data_(region_->base() + kHeaderRegion + static_cast<size_t>(1 - side_) * cap_),
          peer_(control_->peer()),
          local_(control_->local()) {}
    ~ShmConnection() override { close(); }

    Status send(MsgType type, uint64_t request_id, uint32_t flags,
                std::span<const std::span<const uint8_t>> parts, int timeout_ms) override;
    Status recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms) override;
    Result<std::span<const uint8_t>> recv_view(FrameHeader &header, std::vector<uint8_t> &scratch,
                                               int timeout_ms) override;
    void release_view() override {
        std::lock_guard lock(recv_mu_);
        release_locked();
    }

    void close() override {
        if (closed_.exchange(true)) return;
        hdr_->closed[side_].store(1, std::memory_order_release);
        // Wake every sleeper on both rings: our own threads (to see closed_) and the peer's (to see the
        // flag).
        for (RingCtl *r : {&out_, &in_}) {
            r->data_seq.fetch_add(1, std::memory_order_release);
            futex_wake(r->data_seq);
            r->space_seq.fetch_add(1, std::memory_order_release);
            futex_wake(r->space_seq);
        }
        control_->close();
    }
    bool is_open() const override { return !closed_ && !peer_gone_; }
    bool readable() const override {
        const uint64_t lent = view_end_.load(std::memory_order_relaxed);  // a lent frame is read already
        const uint64_t read = lent != 0 ? lent : in_.tail.load(std::memory_order_relaxed);
        return in_.head.load(std::memory_order_acquire) != read ||
               hdr_->closed[1 - side_].load(std::memory_order_acquire) != 0 || control_->readable();
    }
    std::string peer() const override { return peer_; }
    std::string local() const override { return local_; }
    Transport transport() const override { return Transport::shm; }

private:
    Status closed_status() const {
        return make_error(ErrorKind::disconnected, "connection to {} was closed", peer_);
    }
    // The peer closed its end or its process is gone (its TCP connection closed, or it wrote on it).
    Status check_peer() {
        if (hdr_->closed[1 - side_].load(std::memory_order_acquire) != 0) {
            peer_gone_ = true;
            return make_error(ErrorKind::disconnected, "peer {} closed the connection", peer_);
        }
        if (control_->readable()) {
            peer_gone_ = true;
            return make_error(ErrorKind::disconnected, "peer {} has gone (its connection closed)", peer_);
        }
        return {};
    }
    Status corrupt(const char *which, uint64_t head, uint64_t tail) {
        broken_ =
            invalid_input("shared ring from {}: {} positions head {} tail {} break the ring of {} bytes",
                          peer_, which, head, tail, cap_);
        close();
        return broken_;
    }
    // Waits until ready() holds: spins for spin_ns, then sleeps on `seq` in slices, looking at the peer
    // between them. ok (ready, or *timed_out at the deadline), or disconnected.
    template <typename Ready>
    Status wait_until(Ready ready, std::atomic<uint32_t> &seq, std::atomic<uint32_t> &sleeping,
                      const Deadline &deadline, int64_t spin_ns, bool *timed_out);
    Status write_bytes(const uint8_t *src, size_t n, const Deadline &deadline, bool *timed_out);
    void publish() {
        out_.head.store(write_head_, std::memory_order_release);
        notify(out_.data_seq, out_.consumer_sleeping);
    }
    Status read_bytes(uint8_t *dst, size_t n, const Deadline &deadline, bool *timed_out, int64_t *spin_ns);
    // recv()'s first half: a lent frame given back, then the next frame's header read and checked (recv_mu_).
    Status read_header(FrameHeader &header, const Deadline &deadline, int timeout_ms, int64_t *spin_ns);
    // A frame's bytes stopped coming: the stream can no longer be framed, so the link closes.
    Status timed_out_inside(size_t n, int timeout_ms);
    // recv()'s second half: the n-byte payload copied out into `payload` (recv_mu_).
    Status read_payload(std::vector<uint8_t> &payload, size_t n, const Deadline &deadline, int timeout_ms,
                        int64_t *spin_ns);
    void count_received(size_t n) {
        stats_.msgs_recv.fetch_add(1, std::memory_order_relaxed);
        stats_.bytes_recv.fetch_add(kHeaderBytes + n, std::memory_order_relaxed);
    }
    // Moves the tail past the frame recv_view() lent, giving its room back to the sender (recv_mu_).
    void release_locked() {
        const uint64_t end = view_end_.load(std::memory_order_relaxed);
        if (end == 0) return;
        view_end_.store(0, std::memory_order_relaxed);
        in_.tail.store(end, std::memory_order_release);
        notify(in_.space_seq, in_.producer_sleeping);
    }

    std::unique_ptr<ShmRegion> region_;
    std::unique_ptr<Connection> control_;
    const int side_;
    SharedHeader *hdr_;
    RingCtl &out_, &in_;
    const size_t cap_, mask_;
    uint8_t *out_data_, *in_data_;
    std::string peer_, local_;
    std::atomic<bool> closed_{false};
    std::atomic<bool> peer_gone_{false};
    std::mutex send_mu_, recv_mu_;
    uint64_t write_head_ = 0;  // bytes written into the out ring, published or not (send_mu_)
    // Where the tail goes when the frame recv_view() lent in place is given back; 0 while none is lent (a
    // lent frame ends past the first header, so never at 0). Written under recv_mu_, read by readable().
    std::atomic<uint64_t> view_end_{0};
    Status broken_;            // a corrupt ring or a header that cannot be framed: every later call fails
};

template <typename Ready>
Status ShmConnection::wait_until(Ready ready, std::atomic<uint32_t> &seq, std::atomic<uint32_t> &sleeping,
                                 const Deadline &deadline, int64_t spin_ns, bool *timed_out) {
    if (spin_ns > 0) {
        const int64_t end = now_ns() + spin_ns;
        SpinYield yield;
        for (uint32_t i = 1;; ++i) {
            cpu_relax();
            if (ready()) return {};
            if ((i & 63) == 0) {
                if (closed_) return closed_status();
                const int64_t now = now_ns();
                if (now >= end) break;
                yield(now);
            }
        }
    }
    for (;;) {
        if (closed_) return closed_status();
        if (ready()) return {};
        TD_TRY(check_peer());
        if (deadline.passed()) {
            *timed_out = true;
            return {};
        }
        const uint32_t s = seq.load(std::memory_order_acquire);
        sleeping.store(1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_seq_cst);
        if (ready()) {
            sleeping.store(0, std::memory_order_relaxed);
            return {};
        }
        futex_wait(seq, s, deadline.sleep_ms());
        sleeping.store(0, std::memory_order_relaxed);
    }
}

Status ShmConnection::write_bytes(const uint8_t *src, size_t n, const Deadline &deadline, bool *timed_out) {
    while (n > 0) {
        uint64_t tail = out_.tail.load(std::memory_order_acquire);
        if (write_head_ - tail > cap_) return corrupt("out", write_head_, tail);
        if (write_head_ - tail == cap_) {
            publish();  // the consumer must see what is there before it can make room
            auto has_room = [&] {
                tail = out_.tail.load(std::memory_order_acquire);
                return write_head_ - tail != cap_;
            };
            TD_TRY(wait_until(has_room, out_.space_seq, out_.producer_sleeping, deadline, kSendSpinNs,
                              timed_out));
            if (*timed_out) return {};
            if (write_head_ - tail > cap_) return corrupt("out", write_head_, tail);
        }
        const size_t room = cap_ - static_cast<size_t>(write_head_ - tail);
        const size_t k = std::min(room, n);
        const size_t at = static_cast<size_t>(write_head_) & mask_;
        const size_t first = std::min(k, cap_ - at);
        std::memcpy(out_data_ + at, src, first);
        if (k > first) std::memcpy(out_data_, src + first, k - first);
        write_head_ += k;
        src += k;
        n -= k;
        if (write_head_ - out_.head.load(std::memory_order_relaxed) >= kPublishEvery) publish();
    }
    return {};
}

Status ShmConnection::read_bytes(uint8_t *dst, size_t n, const Deadline &deadline, bool *timed_out,
                                 int64_t *spin_ns) {
    while (n > 0) {
        const uint64_t tail = in_.tail.load(std::memory_order_relaxed);
        uint64_t head = in_.head.load(std::memory_order_acquire);
        if (head == tail) {
            auto has_bytes = [&] {
                head = in_.head.load(std::memory_order_acquire);
                return head != tail;
            };
            TD_TRY(wait_until(has_bytes, in_.data_seq, in_.consumer_sleeping, deadline, *spin_ns, timed_out));
            *spin_ns = 0;  // one spin per frame
            if (*timed_out) return {};
        }
        if (head - tail > cap_) return corrupt("in", head, tail);
        const size_t k = std::min(static_cast<size_t>(head - tail), n);
        const size_t at = static_cast<size_t>(tail) & mask_;
        const size_t first = std::min(k, cap_ - at);
        std::memcpy(dst, in_data_ + at, first);
        if (k > first) std::memcpy(dst + first, in_data_, k - first);
        in_.tail.store(tail + k, std::memory_order_release);
        notify(in_.space_seq, in_.producer_sleeping);
        dst += k;
        n -= k;
    }
    return {};
}

Status ShmConnection::send(MsgType type, uint64_t request_id, uint32_t flags,
                           std::span<const std::span<const uint8_t>> parts, int timeout_ms) {
    std::lock_guard lock(send_mu_);
    const int64_t t0 = now_ns();
    if (!broken_.ok()) return broken_;
    if (closed_) return closed_status();
    if (peer_gone_ || hdr_->closed[1 - side_].load(std::memory_order_acquire) != 0) {
        peer_gone_ = true;
        return make_error(ErrorKind::disconnected, "peer {} closed the connection", peer_);
    }
    uint8_t raw[kHeaderBytes];
    TD_ASSIGN_OR_RETURN(const uint64_t total, encode_frame_header(type, request_id, flags, parts, raw));

    const Deadline deadline(timeout_ms);
    const uint64_t start = write_head_;
    bool timed_out = false;
    Status s = write_bytes(raw, kHeaderBytes, deadline, &timed_out);
    for (size_t i = 0; s.ok() && !timed_out && i < parts.size(); ++i)
        s = write_bytes(parts[i].data(), parts[i].size(), deadline, &timed_out);
    if (s.ok() && timed_out) {
        const uint64_t sent = write_head_ - start;
        if (sent > 0) {
            publish();
            close();  // part of a frame is in the ring: the stream is lost
        }
        return make_error(ErrorKind::failed, "send of {} to {} timed out after {} ms ({} of {} bytes sent){}",
                          msg_type_name(type), peer_, timeout_ms, sent, kHeaderBytes + total,
                          sent > 0 ? "; closed" : "");
    }
    TD_TRY(s);
    publish();
    stats_.msgs_sent.fetch_add(1, std::memory_order_relaxed);
    stats_.bytes_sent.fetch_add(kHeaderBytes + total, std::memory_order_relaxed);
    stats_.send_ns.fetch_add(static_cast<uint64_t>(now_ns() - t0), std::memory_order_relaxed);
    return {};
}

Status ShmConnection::read_header(FrameHeader &header, const Deadline &deadline, int timeout_ms,
                                  int64_t *spin_ns) {
    release_locked();
    if (!broken_.ok()) return broken_;
    if (closed_) return closed_status();
    bool timed_out = false;
    const uint64_t start = in_.tail.load(std::memory_order_relaxed);
    uint8_t raw[kHeaderBytes];
    TD_TRY(read_bytes(raw, kHeaderBytes, deadline, &timed_out, spin_ns));
    if (timed_out) {
        if (in_.tail.load(std::memory_order_relaxed) == start)
            return make_error(ErrorKind::failed, "no frame from {} within {} ms", peer_, timeout_ms);
        close();
        return make_error(ErrorKind::failed,
                          "recv from {} timed out after {} ms inside a frame header; closed", peer_,
                          timeout_ms);
    }
    Result<FrameHeader> h = checked_header(raw, peer_);
    if (!h.ok()) {
        broken_ = h.status();
        return broken_;
    }
    header = *h;
    return {};
}

Status ShmConnection::timed_out_inside(size_t n, int timeout_ms) {
    close();
    return make_error(ErrorKind::failed, "recv from {} timed out after {} ms inside a {}-byte frame; closed",
                      peer_, timeout_ms, n);
}

Status ShmConnection::read_payload(std::vector<uint8_t> &payload, size_t n, const Deadline &deadline,
                                   int timeout_ms, int64_t *spin_ns) {
    size_payload(payload, n, cap_);  // grows from one ring's worth as the bytes come
    bool timed_out = false;
    size_t got = 0;
    while (got < n) {
        if (got == payload.size()) payload.resize(std::min(n, 2 * payload.size()));
        const size_t want = payload.size() - got;
        TD_TRY(read_bytes(payload.data() + got, want, deadline, &timed_out, spin_ns));
        if (timed_out) return timed_out_inside(n, timeout_ms);
        got += want;
    }
    count_received(n);
    return {};
}

Status ShmConnection::recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms) {
    std::lock_guard lock(recv_mu_);
    const Deadline deadline(timeout_ms);
    int64_t spin_ns = recv_spin_ns_;
    TD_TRY(read_header(header, deadline, timeout_ms, &spin_ns));
    return read_payload(payload, header.payload_bytes, deadline, timeout_ms, &spin_ns);
}

Result<std::span<const uint8_t>> ShmConnection::recv_view(FrameHeader &header, std::vector<uint8_t> &scratch,
                                                          int timeout_ms) {
    std::lock_guard lock(recv_mu_);
    const Deadline deadline(timeout_ms);
    int64_t spin_ns = recv_spin_ns_;
    TD_TRY(read_header(header, deadline, timeout_ms, &spin_ns));
    const size_t n = header.payload_bytes;
    const uint64_t tail = in_.tail.load(std::memory_order_relaxed);
    const size_t at = static_cast<size_t>(tail) & mask_;
    // Lent in place: a frame small enough that, held, it leaves the sender room for the frames the protocol
    // lets it send before we read again (the all-reduce's: two parts a link), and not wrapped at the ring's
    // end. Anything else is copied out as recv() does.
    if (n == 0 || n > cap_ / 4 || at + n > cap_) {
        TD_TRY(read_payload(scratch, n, deadline, timeout_ms, &spin_ns));
        return std::span<const uint8_t>(scratch);
    }
    uint64_t head = in_.head.load(std::memory_order_acquire);
    if (head - tail < n) {
        bool timed_out = false;
        auto whole = [&] {
            head = in_.head.load(std::memory_order_acquire);
            return head - tail >= n;
        };
        TD_TRY(wait_until(whole, in_.data_seq, in_.consumer_sleeping, deadline, spin_ns, &timed_out));
        if (timed_out) return timed_out_inside(n, timeout_ms);
    }
    if (head - tail > cap_) return corrupt("in", head, tail);
    view_end_.store(tail + n, std::memory_order_relaxed);
    count_received(n);
    return std::span<const uint8_t>(in_data_ + at, n);
}

}  // namespace

bool shm_supported() {
#ifdef __linux__
    return true;
#else
    return false;
#endif
}

std::string host_identity() {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    std::getline(in, id);
    while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
    return id;
}

Result<ShmPending> shm_create(size_t ring_bytes) {
#ifdef __linux__
    if (ring_bytes < kMinRing || ring_bytes > kMaxRing || (ring_bytes & (ring_bytes - 1)) != 0)
        return invalid_input("shared ring of {} bytes: must be a power of two in {}..{}", ring_bytes,
                             kMinRing, kMaxRing);
    const int fd = ::memfd_create("tandem-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return make_error(ErrorKind::io, "memfd_create: {}", errno_text(errno));
    const size_t total = kHeaderRegion + 2 * ring_bytes;
    (void)::fchmod(fd, 0600);
    if (::ftruncate(fd, static_cast<off_t>(total)) != 0) {
        const int err = errno;
        ::close(fd);
        return make_error(ErrorKind::io, "sizing the shared rings ({} bytes): {}", total, errno_text(err));
    }
    // Neither side may resize it under the other's mapping (a shrink would fault the other process).
    (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    void *p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        return make_error(ErrorKind::io, "mapping the shared rings: {}", errno_text(err));
    }
    ShmPending out;
    out.region = ShmAccess::make(static_cast<uint8_t *>(p), total, ring_bytes, fd);
    auto *h = new (p) SharedHeader();
    h->magic = kShmMagic;
    h->version = kShmLayoutVersion;
    h->ring_bytes = ring_bytes;
    const auto nonce = make_nonce();
    std::memcpy(out.offer.token.data(), nonce.data(), out.offer.token.size());
    std::memcpy(h->token, out.offer.token.data(), sizeof h->token);
    out.offer.pid = static_cast<uint32_t>(::getpid());
    out.offer.fd = fd;
    out.offer.bytes = total;
    return out;
#else
    (void)ring_bytes;
    return make_error(ErrorKind::unimplemented, "shared-memory connections need Linux (memfd, futex)");
#endif
}

Result<std::unique_ptr<ShmRegion>> shm_attach(const ShmOffer &offer) {
#ifdef __linux__
    const size_t rings = offer.bytes > kHeaderRegion ? (offer.bytes - kHeaderRegion) / 2 : 0;
    if (rings < kMinRing || rings > kMaxRing || (rings & (rings - 1)) != 0 ||
        kHeaderRegion + 2 * rings != offer.bytes)
        return invalid_input("shared rings of {} bytes: not a layout this build maps", offer.bytes);
    const std::string path = fmt::format("/proc/{}/fd/{}", offer.pid, offer.fd);
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return make_error(ErrorKind::io, "opening the peer's shared rings ({}): {}", path, errno_text(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) != offer.bytes) {
        ::close(fd);
        return invalid_input("{} is not the peer's shared rings (another process or file)", path);
    }
    void *p = ::mmap(nullptr, offer.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int err = errno;
    ::close(fd);
    if (p == MAP_FAILED)
        return make_error(ErrorKind::io, "mapping the peer's shared rings: {}", errno_text(err));
    auto region = ShmAccess::make(static_cast<uint8_t *>(p), offer.bytes, rings, -1);
    const auto *h = reinterpret_cast<const SharedHeader *>(p);
    if (h->magic != kShmMagic || h->version != kShmLayoutVersion || h->ring_bytes != rings ||
        CRYPTO_memcmp(h->token, offer.token.data(), sizeof h->token) != 0)
        return invalid_input("{} is not the peer's shared rings (its token does not match)", path);
    return region;
#else
    (void)offer;
    return make_error(ErrorKind::unimplemented, "shared-memory connections need Linux (memfd, futex)");
#endif
}

std::unique_ptr<Connection> shm_connection(std::unique_ptr<ShmRegion> region,
                                           std::unique_ptr<Connection> control, bool server) {
    return std::make_unique<ShmConnection>(std::move(region), std::move(control), server);
}

}  // namespace td::net
