// ClusterEngine: connecting, placing, loading and linking the pipeline; tearing it down.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>

#include "cluster/cluster-engine.h"
#include "cluster/fingerprint.h"
#include "cluster/node-info.h"
#include "cluster/wire.h"
#include "core/log.h"
#include "net/codec.h"

namespace td::cluster {
namespace {

constexpr int kLoadReplyTimeoutMs = 120000;   // the worker hashes its own copy first
constexpr int kStageReadyTimeoutMs = 600000;  // loading and allocating the KV cache
constexpr size_t kChunkBytes = 4u << 20;

std::string host_of(const std::string &address) {
    std::string host;
    uint16_t port = 0;
    if (!net::parse_host_port(address, &host, &port).ok()) return "127.0.0.1";
    return host;
}

std::string fmt_bytes(double b) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024.0 && u < 4) {
        b /= 1024.0;
        ++u;
    }
    return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, units[u]);
}

// A worker's own error message already starts with "worker <address>"; anything else gets that prefix.
Status name_worker(const Status &s, const std::string &address) {
    if (s.ok() || s.message().rfind("worker ", 0) == 0) return s;
    return s.with_context(fmt::format("worker {}", address));
}

}  // namespace

Result<std::unique_ptr<ClusterEngine>> ClusterEngine::create(std::shared_ptr<const Model> model,
                                                             const ClusterOptions &options) {
    std::unique_ptr<ClusterEngine> e(new ClusterEngine());
    e->model_ = std::move(model);
    e->options_ = options;
    const HParams &hp = e->model_->hparams();
    if (e->model_->layer_first() != 0 || e->model_->layer_last() != hp.n_layer)
        return invalid_input("the head needs the whole model file (it was opened for a layer range)");
    TD_ASSIGN_OR_RETURN(e->addresses_, parse_worker_list(options.workers));
    if (options.context.n_seq < 1 || options.context.n_seq > 4096)
        return invalid_input("n_seq {} must be in 1..4096", options.context.n_seq);
    if (options.max_in_flight < 1) return invalid_input("max_in_flight must be at least 1");
    if (options.wire == net::WireType::q8_0 && hp.n_embd % 32 != 0)
        return invalid_input("--wire q8_0 needs a hidden size divisible by 32, the model's is {}", hp.n_embd);
    e->n_ctx_ = options.context.n_ctx > 0 ? options.context.n_ctx : hp.n_ctx_train;
    if (e->n_ctx_ <= 0 || e->n_ctx_ > (1 << 20))
        return invalid_input("context size {} must be in 1..1048576", e->n_ctx_);
    if (e->options_.stage_dir.empty())
        e->options_.stage_dir = (std::filesystem::temp_directory_path() / "tandem-stages").string();
    e->started_.assign(options.context.n_seq, false);
    e->lost_.assign(options.context.n_seq, false);
    e->want_logits_.assign(options.context.n_seq, false);
    const int32_t n_workers = static_cast<int32_t>(e->addresses_.size());
    if (options.head_layers < 0 || options.head_layers > hp.n_layer - n_workers)
        return invalid_input(
            "--head-layers {} leaves fewer layers than the {} workers need; the model has {} "
            "layers, so use 0..{}",
            options.head_layers, n_workers, hp.n_layer, std::max(0, hp.n_layer - n_workers));
    if (options.chunk_rows < 0)
        return invalid_input("chunk rows {} must not be negative", options.chunk_rows);
    if (options.head_layers > 0) {
        TD_ASSIGN_OR_RETURN(e->head_model_,
                            Model::load(e->model_->file(), {0, options.head_layers, options.pack_dir}));
        e->head_pool_ = std::make_unique<ThreadPool>(options.head_threads);
        ContextParams cp = options.context;
        cp.n_ctx = e->n_ctx_;
        TD_ASSIGN_OR_RETURN(e->head_ctx_, Context::create(e->head_model_, cp, *e->head_pool_));
    }
    TD_TRY(e->connect());
    return e;
}

ClusterEngine::~ClusterEngine() {
    disconnect();
}

Result<std::vector<LayerRange>> ClusterEngine::place() const {
    const int32_t n_layer = model_->hparams().n_layer;
    const int32_t first = options_.head_layers;
    if (!options_.layers.empty())
        return parse_layer_ranges(options_.layers, addresses_.size(), n_layer, first);
    std::vector<double> weights;
    if (!options_.split.empty()) {
        TD_ASSIGN_OR_RETURN(weights, parse_split(options_.split, addresses_.size()));
    } else {  // default: in proportion to measured speed
        for (const NodeStatus &n : nodes_) weights.push_back(n.hello.gflops > 0 ? n.hello.gflops : 1.0);
    }
    // Placed by speed, the last stage's output head (a matrix-vector product per generated token) counts as
    // layers of the average size, so equal nodes get equal decoding work. An explicit --split shares layers.
    double layers_bytes = 0;
    for (int32_t il = 0; il < n_layer; ++il)
        layers_bytes += static_cast<double>(model_->layer_weight_bytes(il));
    const gguf::TensorInfo *out = model_->file().find_tensor("output.weight");
    if (out == nullptr) out = model_->file().find_tensor("token_embd.weight");  // tied
    const double head_layers = out != nullptr && layers_bytes > 0
                                   ? static_cast<double>(out->n_bytes) / (layers_bytes / n_layer)
                                   : 0.0;
    TD_ASSIGN_OR_RETURN(auto ranges,
                        split_layers(weights, n_layer, first, options_.split.empty() ? head_layers : 0.0));
    if (options_.layers.empty() && options_.split.empty()) {
        for (size_t i = 0; i < ranges.size(); ++i) {  // the speed split must still fit in memory
            const uint64_t need =
                stage_weight_bytes(model_->file(), ranges[i].first, ranges[i].second, n_layer);
            const uint64_t avail = nodes_[i].hello.mem_available;
            if (avail > 0 && need > avail)
                return invalid_input(
                    "worker {} has {} of memory available, its layers {}-{} need {}; give it fewer "
                    "layers with --layers or --split",
                    addresses_[i], fmt_bytes(avail), ranges[i].first, ranges[i].second - 1, fmt_bytes(need));
        }
    }
    return ranges;
}

Status ClusterEngine::handshake(size_t i) {
    const std::string &addr = addresses_[i];
    std::string host;
    uint16_t port = 0;
    TD_TRY(net::parse_host_port(addr, &host, &port));
    auto conn = net::tcp_connect(host, port, options_.connect_timeout_ms);
    if (!conn.ok())
        return Status(ErrorKind::disconnected,
                      fmt::format("cannot reach worker {}: {}", addr, conn.status().message()));
    control_[i] = std::move(conn).value();
    net::Hello hello;
    hello.role = net::ConnRole::control;
    hello.build_id = build_id();
    hello.node_name = "head";
    TD_TRY(name_worker(send_control(*control_[i], net::MsgType::hello, hello), addr));
    std::vector<uint8_t> payload;
    TD_TRY(name_worker(recv_expect(*control_[i], net::MsgType::hello_reply, payload, kControlTimeoutMs, ""),
                       addr));
    TD_ASSIGN_OR_RETURN(net::HelloReply reply, net::decode_hello_reply(payload));
    if (reply.protocol_version != net::kProtocolVersion)
        return invalid_input("worker {} speaks protocol {}, head speaks {}", addr, reply.protocol_version,
                             net::kProtocolVersion);
    if (reply.build_id != build_id())
        log_warn("worker {} runs build {}, the head runs {}", addr, reply.build_id, build_id());
    nodes_[i].address = addr;
    nodes_[i].hello = reply;
    return {};
}

Status ClusterEngine::stream_stage_file(size_t i, const net::LoadStage &ls) {
    const std::string path = options_.stage_dir + "/" + fingerprint_hex(ls.fingerprint) + ".gguf";
    std::error_code ec;
    if (!std::filesystem::exists(path)) {
        std::filesystem::create_directories(options_.stage_dir, ec);
        if (ec) return make_error(ErrorKind::io, "{}: cannot create: {}", options_.stage_dir, ec.message());
        TD_TRY(write_stage_file(model_->file(), ls.layer_first, ls.layer_last, ls.n_layer, path));
    }
    const uint64_t total = std::filesystem::file_size(path, ec);
    if (ec || total == 0) return make_error(ErrorKind::io, "{}: cannot read the stage file", path);
    std::FILE *in = std::fopen(path.c_str(), "rb");
    if (in == nullptr) return make_error(ErrorKind::io, "{}: cannot open", path);
    std::vector<uint8_t> chunk(kChunkBytes);
    std::vector<uint8_t> header;  // the WeightsChunk fields; the chunk's bytes go as a second part
    uint64_t sent = 0;
    Status s;
    const bool progress = options_.print_placement;
    while (sent < total && s.ok()) {
        const size_t n = std::fread(chunk.data(), 1, std::min<uint64_t>(kChunkBytes, total - sent), in);
        if (n == 0) {
            s = make_error(ErrorKind::io, "{}: short read at byte {}", path, sent);
            break;
        }
        header.clear();
        net::encode(net::WeightsChunk{sent, total}, header);
        const std::span<const uint8_t> parts[2] = {header, {chunk.data(), n}};
        s = name_worker(control_[i]->send(net::MsgType::weights_chunk, 0, 0, parts, 60000), addresses_[i]);
        sent += n;
        if (progress)
            std::fprintf(stderr, "\rtandem: streaming layers %d-%d to %s: %3.0f%% of %s", ls.layer_first,
                         ls.layer_last - 1, addresses_[i].c_str(), 100.0 * static_cast<double>(sent) / total,
                         fmt_bytes(static_cast<double>(total)).c_str());
    }
    if (progress) std::fprintf(stderr, "\n");
    std::fclose(in);
    return s;
}

Status ClusterEngine::load_stage(size_t i, const std::string &next_host, uint16_t next_port) {
    const HParams &hp = model_->hparams();
    const LayerRange range = placement_[i];
    auto fp = fingerprints_.find(range);
    if (fp == fingerprints_.end())
        fp = fingerprints_
                 .emplace(range, stage_fingerprint(model_->file(), range.first, range.second, hp.n_layer))
                 .first;
    net::LoadStage ls;
    ls.fingerprint = fp->second;
    ls.stage_file_bytes = 0;  // not known until a worker asks for the file (it is written on demand)
    ls.layer_first = range.first;
    ls.layer_last = range.second;
    ls.n_layer = hp.n_layer;
    ls.n_ctx = n_ctx_;
    ls.n_seq = options_.context.n_seq;
    ls.kv_type = static_cast<uint32_t>(options_.context.kv_type);
    ls.wire = static_cast<uint32_t>(options_.wire);
    ls.n_threads = static_cast<uint32_t>(std::max(0, options_.n_threads));
    ls.model_name = std::filesystem::path(model_->file().path()).filename().string();
    ls.next_host = next_host;
    ls.next_port = next_port;
    ls.is_last = i + 1 == addresses_.size();
    const std::string &addr = addresses_[i];
    net::Connection &c = *control_[i];
    TD_TRY(name_worker(send_control(c, net::MsgType::load_stage, ls), addr));
    std::vector<uint8_t> payload;
    TD_TRY(name_worker(recv_expect(c, net::MsgType::load_reply, payload, kLoadReplyTimeoutMs, ""), addr));
    TD_ASSIGN_OR_RETURN(net::LoadReply reply, net::decode_load_reply(payload));
    nodes_[i].layers = range;
    nodes_[i].source = reply.source;
    if (reply.need_weights) TD_TRY(stream_stage_file(i, ls));
    TD_TRY(name_worker(recv_expect(c, net::MsgType::stage_ready, payload, kStageReadyTimeoutMs, ""), addr));
    TD_ASSIGN_OR_RETURN(nodes_[i].ready, net::decode_stage_ready(payload));
    return {};
}

Status ClusterEngine::accept_result_link() {
    auto conn = result_listener_->accept(kStageReadyTimeoutMs);
    if (!conn.ok()) return conn.status().with_context("waiting for the last stage's data connection");
    std::vector<uint8_t> payload;
    TD_TRY(recv_expect(**conn, net::MsgType::hello, payload, kControlTimeoutMs, (*conn)->peer()));
    TD_ASSIGN_OR_RETURN(net::Hello hello, net::decode_hello(payload));
    if (hello.role != net::ConnRole::data)
        return invalid_input("{}: expected a data connection", (*conn)->peer());
    net::HelloReply reply;
    reply.build_id = build_id();
    reply.node_name = "head";
    TD_TRY(send_control(**conn, net::MsgType::hello_reply, reply));
    result_in_ = std::move(conn).value();
    return {};
}

Status ClusterEngine::connect() {
    const size_t n = addresses_.size();
    nodes_.assign(n, NodeStatus{});
    control_.clear();
    control_.resize(n);
    Status s;
    for (size_t i = 0; i < n && s.ok(); ++i) s = handshake(i);
    if (s.ok() && placement_.empty()) {
        auto p = place();
        if (p.ok()) placement_ = *p;
        s = p.status();
    }
    // Load from the last stage back to the first: each stage dials its next hop when it loads.
    if (s.ok()) {
        auto l = net::tcp_listen(host_of(control_[n - 1]->local()), 0);
        if (l.ok()) result_listener_ = std::move(l).value();
        s = l.status();
    }
    if (s.ok()) {
        Status acc;
        std::thread acceptor([&] { acc = accept_result_link(); });
        s = load_stage(n - 1, host_of(control_[n - 1]->local()), result_listener_->port());
        if (!s.ok()) result_listener_->close();
        acceptor.join();
        if (s.ok()) s = acc;
    }
    for (size_t i = n - 1; i-- > 0 && s.ok();) {
        std::string host;
        uint16_t port = 0;
        (void)net::parse_host_port(addresses_[i + 1], &host, &port);
        s = load_stage(i, host, port);
    }
    if (s.ok()) {  // our link to the first stage
        std::string host;
        uint16_t port = 0;
        (void)net::parse_host_port(addresses_[0], &host, &port);
        auto c = net::tcp_connect(host, port, options_.connect_timeout_ms);
        if (c.ok()) {
            data_out_ = std::move(c).value();
            net::Hello hello;
            hello.role = net::ConnRole::data;
            hello.build_id = build_id();
            hello.node_name = "head";
            std::vector<uint8_t> payload;
            s = send_control(*data_out_, net::MsgType::hello, hello);
            if (s.ok())
                s = recv_expect(*data_out_, net::MsgType::hello_reply, payload, kControlTimeoutMs, "");
            s = name_worker(s, addresses_[0]);
        } else {
            s = Status(ErrorKind::disconnected,
                       fmt::format("cannot reach worker {}: {}", addresses_[0], c.status().message()));
        }
    }
    if (!s.ok()) {
        disconnect();
        return s;
    }
    sender_ = std::make_unique<net::AsyncSender>(*data_out_);
    // Every message of every step in flight has a frame, so the result reader never blocks on the driver.
    results_ =
        std::make_unique<FrameQueue>(static_cast<size_t>(options_.max_in_flight) * kMaxPartsPerStep + 2);
    {
        std::lock_guard lock(mu_);
        broken_ = {};
        stopping_ = false;
        last_pong_.assign(n, std::chrono::steady_clock::now());
        stats_replies_.assign(n, net::StatsReply{});
        stats_seen_.assign(n, 0);
    }
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { control_loop(i); });
    threads_.emplace_back([this] { heartbeat_loop(); });
    threads_.emplace_back([this] { result_loop(); });
    connected_ = true;
    pending_.clear();
    started_.assign(started_.size(), false);
    if (head_ctx_) head_ctx_->kv().clear();  // the workers start empty: so does the head's part
    if (options_.print_placement) std::fputs(placement_table().c_str(), stderr);
    return {};
}

void ClusterEngine::disconnect() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        cv_.notify_all();
    }
    for (auto &c : control_)
        if (c) c->close();
    if (data_out_) data_out_->close();
    if (result_in_) result_in_->close();
    if (result_listener_) result_listener_->close();
    if (results_) results_->close();
    for (std::thread &t : threads_) t.join();
    threads_.clear();
    sender_.reset();
    data_out_.reset();
    result_in_.reset();
    result_listener_.reset();
    results_.reset();
    control_.clear();
    pending_.clear();
    connected_ = false;
}

std::string ClusterEngine::placement_table() const {
    std::string out = fmt::format(
        "tandem: placement ({} workers, head layers {}, wire {}, n_ctx {}, {} seq):\n", nodes_.size(),
        options_.head_layers, net::wire_type_name(options_.wire), n_ctx_, options_.context.n_seq);
    out += fmt::format("  {:<22} {:<8} {:>11} {:>11} {:>8}  {}\n", "node", "layers", "weights", "KV",
                       "GFLOP/s", "weights from");
    if (head_ctx_) {
        const HParams &hp = model_->hparams();
        out += fmt::format(
            "  {:<22} {:<8} {:>11} {:>11} {:>8}  {}\n", "head", fmt::format("0-{}", options_.head_layers - 1),
            fmt_bytes(
                static_cast<double>(stage_weight_bytes(model_->file(), 0, options_.head_layers, hp.n_layer))),
            fmt_bytes(static_cast<double>(head_ctx_->kv().bytes())), "-", "the head's model file");
    }
    for (const NodeStatus &n : nodes_)
        out += fmt::format("  {:<22} {:<8} {:>11} {:>11} {:>8.1f}  {}\n", n.address,
                           fmt::format("{}-{}", n.layers.first, n.layers.second - 1),
                           fmt_bytes(static_cast<double>(n.ready.weight_bytes)),
                           fmt_bytes(static_cast<double>(n.ready.kv_bytes)), n.hello.gflops, n.source);
    return out;
}

std::string ClusterEngine::format_stats(const ClusterStats &st) const {
    std::string out = "tandem: cluster stats (per node since load; data-ring messages):\n";
    out +=
        fmt::format("  {:<22} {:<8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>10} {:>9} {:>9}\n", "node", "layers",
                    "msgs in", "msgs out", "bytes in", "bytes out", "steps", "compute s", "wait s", "send s");
    for (size_t i = 0; i < st.nodes.size() && i < nodes_.size(); ++i) {
        const net::StatsReply &r = st.nodes[i];
        out += fmt::format(
            "  {:<22} {:<8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>10.3f} {:>9.3f} {:>9.3f}\n", nodes_[i].address,
            fmt::format("{}-{}", nodes_[i].layers.first, nodes_[i].layers.second - 1), r.msgs_in, r.msgs_out,
            fmt_bytes(static_cast<double>(r.bytes_in)), fmt_bytes(static_cast<double>(r.bytes_out)),
            r.forward_steps, r.compute_seconds, r.wait_seconds, r.send_seconds);
    }
    out +=
        fmt::format("  {:<22} {:<8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>10} {:>9} {:>9.3f}\n", "head", "-",
                    st.head_msgs_recv, st.head_msgs_sent, fmt_bytes(static_cast<double>(st.head_bytes_recv)),
                    fmt_bytes(static_cast<double>(st.head_bytes_sent)), "-", "-", "-", st.head_send_seconds);
    return out;
}

}  // namespace td::cluster
