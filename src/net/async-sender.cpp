// AsyncSender: a ring of max_queued reusable frame buffers between the compute thread and one writer thread.
//
// Slot states follow the ring indices: [head, head + count) hold frames in order; the slot at head is the one
// the writer is sending (it stays counted until the send returns, so enqueue never overwrites it). enqueue()
// copies into the slot at head + count, which keeps its capacity from earlier frames: once every slot has
// seen the largest frame, nothing is allocated.
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "net/transport.h"

namespace td::net {

struct AsyncSender::Impl {
    struct Slot {
        MsgType type = MsgType::ping;
        uint64_t request_id = 0;
        uint32_t flags = 0;
        std::vector<uint8_t> payload;
    };

    Connection &conn;
    int send_timeout_ms;
    std::vector<Slot> ring;
    std::mutex mu;
    std::condition_variable cv_work;   // writer waits for frames or stop
    std::condition_variable cv_space;  // enqueue/flush wait for space / an empty queue
    size_t head = 0, count = 0;
    bool stop = false;
    Status error;  // first send error; sticky
    std::thread writer;

    Impl(Connection &c, size_t max_queued, int timeout_ms)
        : conn(c), send_timeout_ms(timeout_ms), ring(max_queued) {
        writer = std::thread([this] { run(); });
    }

    void run() {
        std::unique_lock lock(mu);
        for (;;) {
            cv_work.wait(lock, [&] { return count > 0 || stop; });
            if (count == 0) return;  // stop, and everything queued has been sent
            Slot &s = ring[head];
            lock.unlock();
            std::span<const uint8_t> parts[1] = {s.payload};
            Status st = conn.send(s.type, s.request_id, s.flags, parts, send_timeout_ms);
            lock.lock();
            if (!st.ok()) {
                error = st.with_context(fmt::format("async send of {} #{} to {}", msg_type_name(s.type),
                                                    s.request_id, conn.peer()));
                count = 0;  // drop the rest: the stream is broken
            } else {
                head = (head + 1) % ring.size();
                --count;
            }
            cv_space.notify_all();
        }
    }
};

AsyncSender::AsyncSender(Connection &conn, size_t max_queued, int send_timeout_ms)
    : impl_(std::make_unique<Impl>(conn, max_queued, send_timeout_ms)) {
    TD_ASSERT(max_queued > 0, "AsyncSender needs at least one buffer");
}

AsyncSender::~AsyncSender() {
    {
        std::lock_guard lock(impl_->mu);
        impl_->stop = true;
    }
    impl_->cv_work.notify_all();
    impl_->writer.join();
}

Status AsyncSender::enqueue(MsgType type, uint64_t request_id, uint32_t flags,
                            std::span<const uint8_t> payload) {
    Impl &m = *impl_;
    std::unique_lock lock(m.mu);
    m.cv_space.wait(lock, [&] { return m.count < m.ring.size() || !m.error.ok(); });
    if (!m.error.ok()) return m.error;
    Impl::Slot &s = m.ring[(m.head + m.count) % m.ring.size()];
    s.type = type;
    s.request_id = request_id;
    s.flags = flags;
    s.payload.assign(payload.begin(), payload.end());  // reuses the slot's capacity
    ++m.count;
    m.cv_work.notify_one();
    return {};
}

Status AsyncSender::flush() {
    Impl &m = *impl_;
    std::unique_lock lock(m.mu);
    m.cv_space.wait(lock, [&] { return m.count == 0 || !m.error.ok(); });
    return m.error;
}

}  // namespace td::net
