#include "cluster/worker.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>

#include "cluster/fingerprint.h"
#include "cluster/handshake.h"
#include "cluster/node-info.h"
#include "cluster/probe.h"
#include "cluster/stage.h"
#include "cluster/wire.h"
#include "core/log.h"
#include "model/model.h"
#include "net/codec.h"

namespace td::cluster {
namespace {

constexpr int kChunkTimeoutMs = 30000;
// Connections still in their handshake at once; more are closed unread (a stranger opening many).
constexpr int kMaxPendingHandshakes = 64;

}  // namespace

Result<std::unique_ptr<Worker>> Worker::create(const WorkerOptions &options) {
    if (options.secret.empty())
        return invalid_input("a worker needs a cluster secret (--secret-file) to authenticate its peers");
    std::unique_ptr<Worker> w(new Worker());
    w->opt_ = options;
    if (!options.model_path.empty()) {
        TD_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(options.model_path));
        w->local_model_ = std::make_unique<gguf::File>(std::move(f));
    }
    if (!options.cache_dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(options.cache_dir, ec);
        if (ec)
            return make_error(ErrorKind::io, "{}: cannot create the cache dir: {}", options.cache_dir,
                              ec.message());
        w->cache_ = std::make_unique<StageCache>(options.cache_dir, options.cache);
    }
    w->pool_ = std::make_unique<ThreadPool>(options.n_threads);
    w->gflops_ = measure_gflops(*w->pool_);
    w->cpu_ = cpu_description();
    TD_ASSIGN_OR_RETURN(w->listener_, net::tcp_listen(options.host, options.port));
    return w;
}

Worker::~Worker() {
    stop();
}

Result<std::unique_ptr<LocalWorker>> LocalWorker::start(const WorkerOptions &options) {
    std::unique_ptr<LocalWorker> lw(new LocalWorker());
    TD_ASSIGN_OR_RETURN(lw->worker_, Worker::create(options));
    lw->thread_ = std::thread([w = lw->worker_.get()] { w->serve(); });
    return lw;
}

LocalWorker::~LocalWorker() {
    worker_->stop();
    if (thread_.joinable()) thread_.join();
}

void Worker::stop() {
    if (stopping_.exchange(true)) return;
    listener_->close();
    {
        std::lock_guard lock(control_mu_);
        if (control_ != nullptr) control_->close();
    }
    {
        std::lock_guard lock(probes_mu_);
        for (net::Connection *c : probes_) c->close();
    }
    drop_stage();
    std::lock_guard lock(threads_mu_);
    for (Handler &h : handlers_)
        if (h.thread.joinable()) h.thread.join();
    handlers_.clear();
}

void Worker::serve() {
    while (!stopping_) {
        auto conn = listener_->accept(500);
        {
            std::lock_guard lock(threads_mu_);  // reap finished handlers
            for (auto it = handlers_.begin(); it != handlers_.end();) {
                if (*it->done) {
                    it->thread.join();
                    it = handlers_.erase(it);
                } else {
                    ++it;
                }
            }
        }
        if (!conn.ok()) {
            if (conn.status().kind() == ErrorKind::disconnected || stopping_) break;
            continue;  // timeout
        }
        if (pending_handshakes_.load() >= kMaxPendingHandshakes) {
            log_warn("connection from {} closed: {} connections are already authenticating", (*conn)->peer(),
                     kMaxPendingHandshakes);
            (*conn)->close();
            continue;
        }
        ++pending_handshakes_;
        auto done = std::make_shared<std::atomic<bool>>(false);
        std::lock_guard lock(threads_mu_);
        if (stopping_) break;
        const uint64_t seq = ++accept_seq_;
        handlers_.push_back({std::thread([this, c = std::move(conn).value(), done, seq]() mutable {
                                 handle_connection(std::move(c), seq);
                                 *done = true;
                             }),
                             done});
    }
}

net::HelloReply Worker::hello_reply() const {
    net::HelloReply r;
    // Test hook: pretend to speak another protocol version (the head must refuse with both numbers).
    if (const char *v = std::getenv("TANDEM_PROTOCOL_VERSION_OVERRIDE")) r.protocol_version = std::atoi(v);
    r.build_id = build_id();
    r.node_name = listener_->address();
    r.n_threads = static_cast<uint32_t>(pool_->n_threads());
    const MemInfo mem = read_meminfo();
    r.mem_total = mem.total;
    r.mem_available = mem.available;
    r.gflops = gflops_;
    r.cpu = cpu_;
    return r;
}

void Worker::handle_connection(std::unique_ptr<net::Connection> conn, uint64_t accept_seq) {
    const std::string peer = conn->peer();
    auto hello = handshake_accept(*conn, opt_.secret, listener_->address());
    --pending_handshakes_;
    if (!hello.ok()) {
        log_warn("connection from {} refused: {}", peer, hello.status().message());
        conn->close();
        return;
    }
    // The transport both ends allow: shared memory between processes of one host, else TCP.
    auto answered = answer_hello(std::move(conn), *hello, hello_reply(), opt_.transports);
    if (!answered.ok()) {
        log_warn("connection from {} closed: {}", peer, answered.status().message());
        return;
    }
    conn = std::move(answered).value();
    if (hello->build_id != build_id())
        log_warn("{} runs build {}, this worker runs {}", peer, hello->build_id, build_id());
    if (hello->role == net::ConnRole::control) {
        serve_control(std::move(conn), accept_seq);
        return;
    }
    if (hello->role == net::ConnRole::probe) {
        {
            std::lock_guard lock(probes_mu_);
            if (stopping_) return;
            probes_.push_back(conn.get());
        }
        serve_probe(conn, pool_->n_threads(), opt_.secret);
        std::lock_guard lock(probes_mu_);
        std::erase(probes_, conn.get());
        return;
    }
    std::lock_guard lock(stage_mu_);
    if (hello->role == net::ConnRole::peer) {
        Status a = stage_ == nullptr || stage_->group() == 0 || stage_->group() != hello->group
                       ? make_error(ErrorKind::failed, "{}: no tensor-parallel stage of group {:016x} is loaded",
                                    listener_->address(), hello->group)
                       : stage_->attach_peer(hello->rank, std::move(conn));
        if (!a.ok()) {
            log_warn("peer connection from {} refused: {}", peer, a.message());
            if (conn) {
                send_error(*conn, a);
                conn->close();
            }
            return;
        }
        log_info("tensor-parallel rank {} linked from {}", hello->rank, peer);
        return;
    }
    Status a = stage_ == nullptr
                   ? make_error(ErrorKind::failed, "{}: no stage is loaded", listener_->address())
                   : Status();
    if (a.ok()) a = stage_->attach_input(conn);
    if (!a.ok()) {
        log_warn("data connection from {} refused: {}", peer, a.message());
        send_error(*conn, a);
        conn->close();
        return;
    }
    log_info("stage input connected from {}", peer);
}

void Worker::drop_stage() {
    std::unique_ptr<Stage> old;
    {
        std::lock_guard lock(stage_mu_);
        old = std::move(stage_);
    }
    if (old) {
        old->stop();
        log_info("stage dropped");
    }
}

void Worker::serve_control(std::unique_ptr<net::Connection> conn, uint64_t accept_seq) {
    {
        std::lock_guard lock(control_mu_);
        if (control_ != nullptr && control_seq_ > accept_seq) {
            // Accepted before the active head's connection: that head has since gone and reconnected.
            log_info("closing a stale control connection from {}", conn->peer());
            conn->close();
            return;
        }
        if (control_ != nullptr) {
            log_info("a new head connected from {}; dropping the previous one", conn->peer());
            control_->close();
        }
        control_ = conn.get();
        control_seq_ = accept_seq;
    }
    const std::string peer = conn->peer();
    net::FrameHeader h;
    std::vector<uint8_t> payload;
    for (;;) {
        Status s = conn->recv(h, payload, -1);
        if (!s.ok()) {
            if (s.kind() != ErrorKind::disconnected)
                log_warn("control connection from {}: {}", peer, s.message());
            break;
        }
        const auto type = static_cast<net::MsgType>(h.type);
        Status rs;
        if (type == net::MsgType::load_stage) {
            auto ls = net::decode_load_stage(payload);
            rs = ls.ok() ? load_stage(*conn, *ls) : ls.status();
            if (!rs.ok()) {
                log_warn("loading the stage failed: {}", rs.message());
                send_error(*conn, rs);
                rs = {};  // the head decides; keep the connection
            }
        } else if (type == net::MsgType::ping) {
            rs = send_empty(*conn, net::MsgType::pong, h.request_id);
        } else if (type == net::MsgType::stats_request) {
            net::StatsReply r;
            {
                std::lock_guard lock(stage_mu_);
                if (stage_) r = stage_->stats();
            }
            rs = send_control(*conn, net::MsgType::stats_reply, r, h.request_id);
        } else if (type == net::MsgType::shutdown) {
            drop_stage();
        } else if (type == net::MsgType::weights_chunk) {
            // The rest of a stage file whose load failed at its first chunk (no room): the head stops
            // streaming once it reads our error.
        } else if (type == net::MsgType::error) {
            auto e = net::decode_error(payload);
            log_warn("head {} reported: {}", peer, e.ok() ? e->message : "(malformed error)");
            break;
        } else {
            rs = invalid_input("unexpected {} message on the control connection", net::msg_type_name(type));
            log_warn("control connection from {}: {}", peer, rs.message());
            send_error(*conn, rs);
            break;
        }
        if (!rs.ok()) {  // a head that went away while we answered it is no news
            if (rs.kind() != ErrorKind::disconnected)
                log_warn("control connection from {}: {}", peer, rs.message());
            break;
        }
    }
    conn->close();
    bool current = false;
    {
        std::lock_guard lock(control_mu_);
        current = control_ == conn.get();
        if (current) control_ = nullptr;
    }
    if (current) drop_stage();  // the head is gone: free the memory, keep listening
}

Status Worker::load_stage(net::Connection &conn, const net::LoadStage &ls) {
    drop_stage();
    if (ls.n_layer < 1 || ls.n_layer > 100000 || ls.layer_first < 0 || ls.layer_first >= ls.layer_last ||
        ls.layer_last > ls.n_layer)
        return invalid_input("load_stage: layer range {}-{} of {} layers is invalid", ls.layer_first,
                             ls.layer_last - 1, ls.n_layer);
    if (ls.wire != static_cast<uint32_t>(net::WireType::f32) &&
        ls.wire != static_cast<uint32_t>(net::WireType::f16) &&
        ls.wire != static_cast<uint32_t>(net::WireType::q8_0))
        return invalid_input("load_stage: unknown wire type {}", ls.wire);
    const auto t0 = std::chrono::steady_clock::now();
    std::string source;
    TD_ASSIGN_OR_RETURN(std::shared_ptr<Model> model, obtain_weights(conn, ls, &source));
    if (model->hparams().n_layer != ls.n_layer)
        return invalid_input("{}: the model has {} layers, the head's has {}", source,
                             model->hparams().n_layer, ls.n_layer);
    if (ls.n_threads > 0 && static_cast<int>(ls.n_threads) != pool_->n_threads())
        pool_ = std::make_unique<ThreadPool>(static_cast<int>(ls.n_threads));
    net::LoadStage own = ls;
    own.transports &= opt_.transports;  // the stage's links: what the head asks for and this worker allows
    TD_ASSIGN_OR_RETURN(std::unique_ptr<Stage> st,
                        Stage::create(model, own, *pool_, listener_->address(), opt_.secret));
    net::StageReady ready;
    ready.weight_bytes = stage_weight_bytes(model->file(), ls.layer_first, ls.layer_last, ls.n_layer);
    ready.kv_bytes = st->kv_bytes();
    ready.load_seconds = std::chrono::duration<float>(std::chrono::steady_clock::now() - t0).count();
    {
        std::lock_guard lock(stage_mu_);
        stage_ = std::move(st);
    }
    log_info("stage layers {}-{} of {} ready ({})", ls.layer_first, ls.layer_last - 1, ls.model_name, source);
    return send_control(conn, net::MsgType::stage_ready, ready);
}

Result<std::shared_ptr<Model>> Worker::obtain_weights(net::Connection &conn, const net::LoadStage &ls,
                                                      std::string *source) {
    if (ls.tp_size > 1) return obtain_slice(conn, ls, source);
    const ModelLoadOptions range{ls.layer_first, ls.layer_last, opt_.pack_dir};
    const std::string me = listener_->address();
    net::LoadReply reply;
    if (local_model_) {  // our own copy must hold exactly the head's weights
        const uint64_t fp = stage_fingerprint(*local_model_, ls.layer_first, ls.layer_last, ls.n_layer);
        if (fp != ls.fingerprint)
            return invalid_input(
                "worker {}: model {} has fingerprint {} for layers {}-{}, the head's {} has {}; point "
                "--model at the "
                "same file as the head or drop --model to have the weights streamed",
                me, local_model_->path(), fingerprint_hex(fp), ls.layer_first, ls.layer_last - 1,
                ls.model_name, fingerprint_hex(ls.fingerprint));
        reply.source = "local file " + local_model_->path();
        *source = reply.source;
        TD_TRY(send_control(conn, net::MsgType::load_reply, reply));
        return Model::load(*local_model_, range);
    }
    if (opt_.cache_dir.empty())
        return invalid_input("worker {} has neither --model nor --cache-dir; it cannot hold weights", me);
    const std::string path = opt_.cache_dir + "/" + fingerprint_hex(ls.fingerprint) + ".gguf";
    // A cached file stays open from its check to its load: workers of one host share a cache dir by default,
    // and another's make_room may evict the file in between (an open file outlives its name).
    std::optional<gguf::File> cached;
    if (std::filesystem::exists(path)) {
        auto f = gguf::File::open(path);
        if (f.ok() && stage_fingerprint(*f, ls.layer_first, ls.layer_last, ls.n_layer) == ls.fingerprint) {
            cached = std::move(*f);
        } else {
            log_warn("{}: cached stage file is damaged; fetching it again", path);
            std::error_code ec;
            std::filesystem::remove(path, ec);
        }
    }
    if (cached) {
        StageCache::touch(path);
        reply.source = "cache " + path;
    } else {
        reply.need_weights = 1;
        reply.source = "streamed from the head to " + path;
    }
    *source = reply.source;
    TD_TRY(send_control(conn, net::MsgType::load_reply, reply));
    if (!cached) TD_TRY(receive_stage_file(conn, ls, path));
    TD_ASSIGN_OR_RETURN(auto model,
                        cached ? Model::load(std::move(*cached), range) : Model::load(path, range));
    if (!model->pack().path.empty()) StageCache::touch(model->pack().path);
    return model;
}

Result<std::shared_ptr<Model>> Worker::obtain_slice(net::Connection &conn, const net::LoadStage &ls,
                                                    std::string *source) {
    const ModelLoadOptions range{ls.layer_first, ls.layer_last, opt_.pack_dir};
    const std::string me = listener_->address();
    const std::string dir = !opt_.cache_dir.empty()
                                ? opt_.cache_dir
                                : (std::filesystem::temp_directory_path() / "tandem-slices").string();
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) return make_error(ErrorKind::io, "worker {}: cannot create {}: {}", me, dir, ec.message());
    const std::string path = dir + "/" + fingerprint_hex(ls.fingerprint) + ".gguf";
    const TpSlice slice{ls.slice[0], ls.slice[1], ls.slice[2], ls.slice[3], ls.slice[4], ls.slice[5]};
    auto open_matching = [&](const std::string &p) -> std::optional<gguf::File> {
        auto f = gguf::File::open(p);
        if (f.ok() && stage_fingerprint(*f, ls.layer_first, ls.layer_last, ls.n_layer) == ls.fingerprint)
            return std::move(*f);
        return std::nullopt;
    };
    net::LoadReply reply;
    std::optional<gguf::File> cached;  // open from its check to its load (see obtain_weights)
    if (std::filesystem::exists(path)) {
        cached = open_matching(path);
        if (cached) {
            StageCache::touch(path);
            reply.source = "cache " + path;
        } else {
            log_warn("{}: cached slice file is damaged; making it again", path);
            std::filesystem::remove(path, ec);
        }
    }
    if (reply.source.empty() && local_model_) {  // cut the slice from our own copy
        // (stage_fingerprint unmaps the pages it hashed: a rank keeps only its slice resident)
        const uint64_t fp = stage_fingerprint(*local_model_, ls.layer_first, ls.layer_last, ls.n_layer);
        if (fp != ls.stage_fingerprint)
            return invalid_input(
                "worker {}: model {} has fingerprint {} for layers {}-{}, the head's {} has {}; point --model "
                "at the same file as the head or drop --model to have the weights streamed",
                me, local_model_->path(), fingerprint_hex(fp), ls.layer_first, ls.layer_last - 1, ls.model_name,
                fingerprint_hex(ls.stage_fingerprint));
        ModelLoadOptions plain;
        plain.layer_first = ls.layer_first;
        plain.layer_last = ls.layer_last;
        plain.huge_pages = false;
        TD_ASSIGN_OR_RETURN(auto whole, Model::load(*local_model_, plain));
        const std::string part = path + ".part";
        TD_TRY(tp_write_slice_file(*local_model_, whole->hparams(), ls.layer_first, ls.layer_last, slice, part));
        if (!open_matching(part)) {
            std::filesystem::remove(part, ec);
            return make_error(ErrorKind::failed, "worker {}: the slice cut from {} does not match the head's", me,
                              local_model_->path());
        }
        std::filesystem::rename(part, path, ec);
        if (ec) return make_error(ErrorKind::io, "{}: cannot rename to {}: {}", part, path, ec.message());
        reply.source = fmt::format("sliced from {} into {}", local_model_->path(), path);
    }
    if (reply.source.empty()) {
        reply.need_weights = 1;
        reply.source = "streamed from the head to " + path;
    }
    *source = reply.source;
    TD_TRY(send_control(conn, net::MsgType::load_reply, reply));
    if (reply.need_weights) TD_TRY(receive_stage_file(conn, ls, path));
    TD_ASSIGN_OR_RETURN(auto model,
                        cached ? Model::load(std::move(*cached), range) : Model::load(path, range));
    if (!model->pack().path.empty()) StageCache::touch(model->pack().path);
    if (model->slice() != slice)
        return invalid_input("{}: holds slice {}, the head asked for {}", path, tp_slice_str(model->slice()),
                             tp_slice_str(slice));
    return model;
}

Status Worker::receive_stage_file(net::Connection &conn, const net::LoadStage &ls, const std::string &path) {
    const std::string part = path + ".part";
    std::FILE *out = nullptr;
    std::vector<uint8_t> payload;
    uint64_t received = 0, total = 0;
    Status s;
    do {
        s = recv_expect(conn, net::MsgType::weights_chunk, payload, kChunkTimeoutMs, "head");
        if (!s.ok()) break;
        auto c = net::decode_weights_chunk(payload);
        if (!c.ok()) {
            s = c.status();
            break;
        }
        const std::span<const uint8_t> bytes = c->bytes;
        if (received == 0) {
            total = c->header.total;
            // The size is known now: make room (the file, and its packed copy where that is kept in the
            // cache) before the first byte is written, or refuse the stage.
            if (cache_ != nullptr) {
                const bool packs_here = !opt_.pack_dir.empty() &&
                                        opt_.pack_dir.rfind(opt_.cache_dir, 0) == 0;
                s = cache_->make_room(packs_here ? 2 * total : total, {});
                if (!s.ok()) break;
            }
            out = std::fopen(part.c_str(), "wb");
            if (out == nullptr) {
                s = make_error(ErrorKind::io, "{}: cannot create ({})", part, std::strerror(errno));
                break;
            }
        }
        if (c->header.total != total || c->header.offset != received) {
            s = invalid_input("weights_chunk: got offset {} of {}, expected offset {} of {}",
                              c->header.offset, c->header.total, received, total);
            break;
        }
        if (std::fwrite(bytes.data(), 1, bytes.size(), out) != bytes.size()) {
            s = make_error(ErrorKind::io, "{}: write failed (disk full?)", part);
            break;
        }
        received += bytes.size();
    } while (received < total);
    if (out != nullptr && std::fclose(out) != 0 && s.ok()) s = make_error(ErrorKind::io, "{}: write failed", part);
    if (s.ok()) {
        auto f = gguf::File::open(part);
        if (!f.ok()) {
            s = f.status();
        } else {
            const uint64_t fp = stage_fingerprint(*f, ls.layer_first, ls.layer_last, ls.n_layer);
            if (fp != ls.fingerprint)
                s = invalid_input("streamed stage file has fingerprint {}, expected {}", fingerprint_hex(fp),
                                  fingerprint_hex(ls.fingerprint));
        }
    }
    std::error_code ec;
    if (!s.ok()) {
        std::filesystem::remove(part, ec);
        return s;
    }
    std::filesystem::rename(part, path, ec);
    if (ec) return make_error(ErrorKind::io, "{}: cannot rename to {}: {}", part, path, ec.message());
    log_info("received stage file {} ({} bytes)", path, total);
    return {};
}

}  // namespace td::cluster
