// Connections between nodes: TCP, or shared memory between processes of one host (net/shm.h) after a TCP
// handshake chose it. Callers see one interface whatever carries the frames. Only this layer touches the OS
// network, so tests can run whole clusters over loopback.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/protocol.h"

namespace td::net {

struct ConnStats {
    std::atomic<uint64_t> msgs_sent{0}, msgs_recv{0};
    std::atomic<uint64_t> bytes_sent{0}, bytes_recv{0};
    std::atomic<uint64_t> send_ns{0};  // time blocked in send
};

// One framed, bidirectional byte stream. One thread may send while another receives.
// Errors carry a kind: disconnected (peer closed / reset), failed (timeout: message says how long),
// invalid_input (malformed frame: the connection is then unusable and should be closed, reason logged).
class Connection {
public:
    virtual ~Connection() = default;

    // Sends header + the concatenation of `parts` as one frame (scatter-gather, no copy). Blocks until
    // written or timeout_ms passes (< 0: no timeout). Thread-safe against concurrent send() calls.
    virtual Status send(MsgType type, uint64_t request_id, uint32_t flags,
                        std::span<const std::span<const uint8_t>> parts, int timeout_ms = -1) = 0;
    // Receives one whole frame; payload is resized (capacity reused). Validates the header (codec.h)
    // before reading or allocating the payload. timeout_ms < 0: wait forever.
    virtual Status recv(FrameHeader &header, std::vector<uint8_t> &payload, int timeout_ms = -1) = 0;
    // Receives one whole frame as recv() does and returns its payload in place where the transport can (shm:
    // a frame of at most a quarter of its ring that lies unwrapped in the ring, read where the peer wrote
    // it), else received into `scratch`. The view is valid until release_view(), the next recv()/recv_view()
    // or close(); until then the frame keeps its room in the sender's ring, so release it as soon as it is
    // read. Another process may write the bytes: read them as untrusted as any received payload.
    virtual Result<std::span<const uint8_t>> recv_view(FrameHeader &header, std::vector<uint8_t> &scratch,
                                                       int timeout_ms = -1) {
        TD_TRY(recv(header, scratch, timeout_ms));
        return std::span<const uint8_t>(scratch);
    }
    // Gives back the frame recv_view() lent (nothing when it lent none, or only `scratch`).
    virtual void release_view() {}
    // Closes both directions; a recv()/send() blocked in another thread returns disconnected.
    virtual void close() = 0;
    virtual bool is_open() const = 0;
    // True when bytes (or the peer's close) wait to be read, without reading them or waiting.
    virtual bool readable() const = 0;
    virtual std::string peer() const = 0;   // "127.0.0.1:9000"
    virtual std::string local() const = 0;  // our side's address as the peer sees it
    virtual Transport transport() const { return Transport::tcp; }
    const ConnStats &stats() const { return stats_; }
    // Caps the payload recv() accepts below max_payload(type) (e.g. a node that knows its largest step).
    // A larger announced payload is invalid_input before anything is read or allocated. Set before use.
    void set_recv_limit(uint64_t bytes) { recv_limit_ = bytes; }
    // recv() busy-polls for up to this long before it sleeps waiting for data (0: it sleeps at once). For a
    // caller that has nothing else to do until the frame arrives and cannot afford a wake-up from sleep (an
    // all-reduce); the spin is bounded, so a peer that is slow costs at most this much CPU per frame.
    void set_recv_spin_us(int us) { recv_spin_ns_ = int64_t{us} * 1000; }

    // Convenience: send one control payload.
    Status send_msg(MsgType type, uint64_t request_id, std::span<const uint8_t> payload,
                    int timeout_ms = -1) {
        std::span<const uint8_t> parts[1] = {payload};
        return send(type, request_id, 0, parts, timeout_ms);
    }

protected:
    // A received header checked as every transport checks it: codec.h's decode_header, then the recv limit.
    // Errors name `peer`; the stream can no longer be framed after one.
    Result<FrameHeader> checked_header(const uint8_t raw[kHeaderBytes], const std::string &peer) const;
    // Sizes `payload` for an n-byte frame before its bytes arrive: all of it when the capacity already holds
    // it, else `first` bytes, which the receiver doubles as bytes come (a peer that announces 1 GiB and sends
    // nothing costs `first`, not 1 GiB).
    static void size_payload(std::vector<uint8_t> &payload, size_t n, size_t first);
    // The header of a frame to send, written to `raw`; returns the payload's bytes (the parts' sum), or
    // invalid_input when that exceeds max_payload(type).
    static Result<uint64_t> encode_frame_header(MsgType type, uint64_t request_id, uint32_t flags,
                                                std::span<const std::span<const uint8_t>> parts,
                                                uint8_t raw[kHeaderBytes]);

    ConnStats stats_;
    uint64_t recv_limit_ = UINT64_MAX;
    int64_t recv_spin_ns_ = 0;
};

class Listener {
public:
    virtual ~Listener() = default;
    virtual uint16_t port() const = 0;
    virtual std::string address() const = 0;  // "host:port" as bound
    // Waits for one connection (timeout_ms < 0: forever). Returns failed on timeout, disconnected after
    // close().
    virtual Result<std::unique_ptr<Connection>> accept(int timeout_ms = -1) = 0;
    virtual void close() = 0;  // unblocks accept()
};

// What TCP connections ask for as SO_SNDBUF / SO_RCVBUF: a few activation frames in flight per direction. The
// kernel caps it at net.core.wmem_max / rmem_max (`tandem doctor` checks them).
inline constexpr int kTcpSocketBufferBytes = 4 << 20;

// TCP: TCP_NODELAY, socket buffers sized for activation messages, keepalive. Port 0 picks a free port.
Result<std::unique_ptr<Listener>> tcp_listen(const std::string &host, uint16_t port);
Result<std::unique_ptr<Connection>> tcp_connect(const std::string &host, uint16_t port, int timeout_ms);
// Wraps an already connected stream socket (TCP, or a UNIX socketpair in tests); takes ownership of fd.
Result<std::unique_ptr<Connection>> connection_from_fd(int fd);
// "host:port" or "[v6addr]:port" -> parts; port 0..65535; errors name the bad string.
Status parse_host_port(const std::string &s, std::string *host, uint16_t *port);

// Sends from a dedicated thread so the compute thread never blocks on the network: enqueue() copies the
// frame into one of a few reusable buffers (no allocation in steady state) and returns; a full queue
// applies backpressure (enqueue blocks). A send error is reported by the next enqueue()/flush() and by every
// call after it (queued frames are dropped). The destructor sends what is still queued, then joins the
// thread; close the connection first to abandon a peer that no longer reads. Frames go out in enqueue order.
// enqueue/flush may be called from several threads; frames of one thread stay in order.
class AsyncSender {
public:
    // send_timeout_ms bounds each frame's send (< 0: none); a timeout is reported like any send error.
    explicit AsyncSender(Connection &conn, size_t max_queued = 4, int send_timeout_ms = -1);
    ~AsyncSender();
    Status enqueue(MsgType type, uint64_t request_id, uint32_t flags, std::span<const uint8_t> payload);
    Status flush();  // waits until everything queued is written
private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace td::net
