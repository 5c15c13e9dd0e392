// ClusterEngine: connecting, placing, loading and linking the pipeline; tearing it down.
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <random>
#include <tuple>

#include "cluster/cluster-engine.h"
#include "cluster/fingerprint.h"
#include "cluster/handshake.h"
#include "cluster/node-info.h"
#include "cluster/stage-cache.h"
#include "cluster/wire.h"
#include "cluster/worker.h"
#include "core/check.h"
#include "core/log.h"
#include "model/tp-slice.h"
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
    if (e->options_.stage_dir.empty())
        e->options_.stage_dir = (std::filesystem::temp_directory_path() / "tandem-stages").string();
    if (options.head_node && options.head_layers > 0)
        return invalid_input(
            "--head-node makes the head a node of the layout and --head-layers gives it layers before the "
            "workers; give one of them");
    if (options.workers.empty() && !options.head_node) return invalid_input("no workers");
    if (!options.workers.empty()) {
        TD_ASSIGN_OR_RETURN(e->addresses_, parse_worker_list(options.workers));
    }
    if (options.head_node) {  // the head's own node, first in the layout
        WorkerOptions wo;
        wo.host = "127.0.0.1";  // only the head dials it: rank 0 dials its group's higher ranks itself
        wo.n_threads = options.head_threads;
        wo.model_path = e->model_->file().path();
        wo.cache_dir = e->options_.stage_dir;
        wo.pack_dir = options.pack_dir;
        wo.secret = options.secret;
        wo.transports = options.transports;
        TD_ASSIGN_OR_RETURN(e->head_worker_, LocalWorker::start(wo));
        e->addresses_.insert(e->addresses_.begin(), e->head_worker_->address());
    }
    if (!options.split.empty()) {
        TD_ASSIGN_OR_RETURN(e->split_, parse_split(options.split, e->addresses_.size()));
    }
    if (!options.spares.empty()) {
        TD_ASSIGN_OR_RETURN(e->spares_, parse_worker_list(options.spares));
        for (const std::string &sp : e->spares_)
            if (std::find(e->addresses_.begin(), e->addresses_.end(), sp) != e->addresses_.end())
                return invalid_input("spare {} is also in --workers", sp);
    }
    auto sizes_or = parse_layout(options.layout, options.tp, e->addresses_.size());
    if (!sizes_or.ok() && options.head_node)
        return invalid_input("{} (--head-node: the head is the first of them)", sizes_or.status().message());
    TD_ASSIGN_OR_RETURN(std::vector<size_t> sizes, std::move(sizes_or));
    for (size_t s = 0, next = 0; s < sizes.size(); ++s) {
        e->groups_.emplace_back();
        for (size_t r = 0; r < sizes[s]; ++r) e->groups_.back().push_back(next++);
    }
    // --layers places the layers; --split then only shares each tensor-parallel stage's heads and FFN rows.
    if (!options.layers.empty() && !e->split_.empty() &&
        std::all_of(e->groups_.begin(), e->groups_.end(), [](const auto &g) { return g.size() < 2; }))
        return invalid_input(
            "give either --layers or --split for a pipeline: with --layers, --split only "
            "shares the heads and FFN rows of tensor-parallel stages, and this layout has none");
    if (options.context.n_seq < 1 || options.context.n_seq > 4096)
        return invalid_input("n_seq {} must be in 1..4096", options.context.n_seq);
    if (options.max_in_flight < 1) return invalid_input("max_in_flight must be at least 1");
    if (options.wire == net::WireType::q8_0 && hp.n_embd % 32 != 0)
        return invalid_input("--wire q8_0 needs a hidden size divisible by 32, the model's is {}", hp.n_embd);
    e->n_ctx_ = options.context.n_ctx > 0 ? options.context.n_ctx : hp.n_ctx_train;
    if (e->n_ctx_ <= 0 || e->n_ctx_ > (1 << 20))
        return invalid_input("context size {} must be in 1..1048576", e->n_ctx_);
    e->started_.assign(options.context.n_seq, false);
    e->lost_.assign(options.context.n_seq, false);
    e->want_logits_.assign(options.context.n_seq, false);
    e->cached_.assign(options.context.n_seq, 0);
    const int32_t n_stages = static_cast<int32_t>(e->groups_.size());
    if (options.head_layers < 0 || options.head_layers > hp.n_layer - n_stages)
        return invalid_input(
            "--head-layers {} leaves fewer layers than the {} stages need; the model has {} "
            "layers, so use 0..{}",
            options.head_layers, n_stages, hp.n_layer, std::max(0, hp.n_layer - n_stages));
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
    head_worker_.reset();
}

std::string ClusterEngine::node_label(size_t i) const {
    return head_worker_ && i == 0 ? "head node" : addresses_[i];
}

Result<std::vector<double>> ClusterEngine::node_shares() const {
    if (!split_.empty()) return split_;
    std::vector<double> w;  // default: in proportion to measured speed
    for (const NodeStatus &n : nodes_) w.push_back(n.hello.gflops > 0 ? n.hello.gflops : 1.0);
    return w;
}

Result<std::vector<LayerRange>> ClusterEngine::place() const {
    const int32_t n_layer = model_->hparams().n_layer;
    const int32_t first = options_.head_layers;
    if (!options_.layers.empty()) return parse_layer_ranges(options_.layers, groups_.size(), n_layer, first);
    TD_ASSIGN_OR_RETURN(const std::vector<double> node_weights, node_shares());
    // A stage's speed is its nodes' together (a tensor-parallel group shares each layer's work).
    std::vector<double> weights;
    for (const auto &g : groups_) {
        double w = 0;
        for (size_t i : g) w += node_weights[i];
        weights.push_back(w);
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
        for (size_t s = 0; s < ranges.size(); ++s) {  // the speed split must still fit in memory
            const double stage_bytes = static_cast<double>(
                stage_weight_bytes(model_->file(), ranges[s].first, ranges[s].second, n_layer));
            for (size_t i : groups_[s]) {
                const auto need = static_cast<uint64_t>(stage_bytes * node_weights[i] / weights[s]);
                const uint64_t avail = nodes_[i].hello.mem_available;
                if (avail > 0 && need > avail)
                    return invalid_input(
                        "worker {} has {} of memory available, its share of layers {}-{} needs {}; give it "
                        "less with --layers or --split",
                        addresses_[i], fmt_bytes(avail), ranges[s].first, ranges[s].second - 1,
                        fmt_bytes(static_cast<double>(need)));
            }
        }
    }
    return ranges;
}

Status ClusterEngine::handshake(size_t i) {
    const std::string &addr = addresses_[i];
    net::Hello hello;
    hello.role = net::ConnRole::control;
    hello.build_id = build_id();
    hello.node_name = "head";
    hello.transports = options_.transports;
    TD_ASSIGN_OR_RETURN(Dialed d, dial_node(addr, hello, options_.secret, options_.connect_timeout_ms));
    control_[i] = std::move(d.conn);
    if (d.reply.build_id != build_id())
        log_warn("worker {} runs build {}, the head runs {}", addr, d.reply.build_id, build_id());
    nodes_[i].address = node_label(i);
    nodes_[i].hello = d.reply;
    return {};
}

Status ClusterEngine::stream_stage_file(size_t i, const net::LoadStage &ls) {
    const std::string path = options_.stage_dir + "/" + fingerprint_hex(ls.fingerprint) + ".gguf";
    // A slice file left by another version may carry other slice keys: check them.
    auto usable = [&](const std::string &p) {
        if (ls.tp_size <= 1) return true;
        auto f = gguf::File::open(p);
        auto sl = f.ok() ? tp_slice_read(*f, model_->hparams()) : Result<TpSlice>(f.status());
        return sl.ok() && *sl == slices_[i];
    };
    auto make = [&]() -> Status {
        std::error_code ec;
        std::filesystem::create_directories(options_.stage_dir, ec);
        if (ec) return make_error(ErrorKind::io, "{}: cannot create: {}", options_.stage_dir, ec.message());
        // stage_dir is a cache of cuts of the model file: before another is written, the least recently used
        // go, so it holds at most twice the model beside the files this engine streams (this layout's and the
        // one before), and when that cannot be, no more than leaves the disk 1 GiB free. The workers' caches
        // on this host need the disk too.
        const uint64_t bytes = stage_weight_bytes(model_->file(), ls.layer_first, ls.layer_last, ls.n_layer);
        StageCacheOptions capped;
        capped.max_bytes = 2 * static_cast<uint64_t>(model_->file().file_size());
        if (!StageCache(options_.stage_dir, capped).make_room(bytes, stage_files_).ok())
            TD_TRY(StageCache(options_.stage_dir, {}).make_room(bytes, stage_files_));
        if (ls.tp_size > 1)
            return tp_write_slice_file(model_->file(), model_->hparams(), ls.layer_first, ls.layer_last,
                                       slices_[i], path);
        return write_stage_file(model_->file(), ls.layer_first, ls.layer_last, ls.n_layer, path);
    };
    // Other heads on this host share stage_dir and evict from it: the file is read through the handle opened
    // here, never by its name again.
    TD_ASSIGN_OR_RETURN(const OpenFile file, open_or_make(path, usable, make));
    std::FILE *const in = file.get();
    StageCache::touch(path);
    stage_files_.insert(path);
    struct stat st {};
    if (::fstat(::fileno(in), &st) != 0 || st.st_size <= 0)
        return make_error(ErrorKind::io, "{}: cannot read the stage file", path);
    const uint64_t total = static_cast<uint64_t>(st.st_size);
    std::vector<uint8_t> chunk(kChunkBytes);
    std::vector<uint8_t> header;  // the WeightsChunk fields; the chunk's bytes go as a second part
    uint64_t sent = 0;
    Status s;
    const bool progress = options_.print_placement;
    while (sent < total && s.ok()) {
        // The worker speaks during the stream only to refuse it (no room for the file): stop, and let the
        // wait for stage_ready read its error.
        if (control_[i]->readable()) break;
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
    return s;
}

uint64_t ClusterEngine::fingerprint_of(size_t i, uint64_t *stage_fp) {
    const HParams &hp = model_->hparams();
    const LayerRange range = nodes_[i].layers;
    const std::string stage_key = fmt::format("{}-{}", range.first, range.second);
    auto fp = fingerprints_.find(stage_key);
    if (fp == fingerprints_.end())  // (stage_fingerprint unmaps what it hashed as it goes)
        fp = fingerprints_
                 .emplace(stage_key, stage_fingerprint(model_->file(), range.first, range.second, hp.n_layer))
                 .first;
    *stage_fp = fp->second;
    if (nodes_[i].tp_size <= 1) return fp->second;
    const std::string key = stage_key + " " + tp_slice_str(slices_[i]);
    auto sfp = fingerprints_.find(key);
    if (sfp == fingerprints_.end()) {
        auto plan = tp_slice_plan(model_->file(), hp, range.first, range.second, slices_[i]);
        TD_ASSERT(plan.ok(), "slice plan: {}", plan.status().message());  // tp_split made it from the model
        sfp = fingerprints_.emplace(key, slice_fingerprint(model_->file(), *plan)).first;
    }
    return sfp->second;
}

Status ClusterEngine::load_stage(size_t i, const std::vector<std::string> &next, uint64_t group) {
    const HParams &hp = model_->hparams();
    const NodeStatus &node = nodes_[i];
    const LayerRange range = node.layers;
    net::LoadStage ls;
    ls.fingerprint = fingerprint_of(i, &ls.stage_fingerprint);
    ls.stage_file_bytes = 0;  // not known until a worker asks for the file (it is written on demand)
    ls.layer_first = range.first;
    ls.layer_last = range.second;
    ls.n_layer = hp.n_layer;
    ls.n_ctx = n_ctx_;
    ls.n_seq = options_.context.n_seq;
    ls.kv_type_k = static_cast<uint16_t>(options_.context.type_k);
    ls.kv_type_v = static_cast<uint16_t>(options_.context.type_v);
    ls.wire = static_cast<uint32_t>(options_.wire);
    ls.n_threads = static_cast<uint32_t>(std::max(0, options_.n_threads));
    ls.model_name = std::filesystem::path(model_->file().path()).filename().string();
    ls.next = next;
    ls.transports = options_.transports;
    ls.is_last = node.stage + 1 == static_cast<int32_t>(groups_.size());
    if (node.tp_size > 1) {
        const TpSlice &sl = slices_[i];
        ls.tp_rank = static_cast<uint32_t>(node.rank);
        ls.tp_size = static_cast<uint32_t>(node.tp_size);
        const int32_t v[6] = {sl.kv_first, sl.kv_last, sl.ff_first, sl.ff_last, sl.vocab_first, sl.vocab_last};
        std::copy(v, v + 6, ls.slice);
        ls.group = group;
        ls.tp_reduce = static_cast<uint32_t>(options_.tp_reduce);
        for (size_t w : groups_[node.stage]) ls.peers.push_back(addresses_[w]);
    }
    const std::string &addr = addresses_[i];
    net::Connection &c = *control_[i];
    TD_TRY(name_worker(send_control(c, net::MsgType::load_stage, ls), addr));
    std::vector<uint8_t> payload;
    TD_TRY(name_worker(recv_expect(c, net::MsgType::load_reply, payload, kLoadReplyTimeoutMs, ""), addr));
    TD_ASSIGN_OR_RETURN(net::LoadReply reply, net::decode_load_reply(payload));
    nodes_[i].source = reply.source;
    if (reply.need_weights) TD_TRY(stream_stage_file(i, ls));
    TD_TRY(name_worker(recv_expect(c, net::MsgType::stage_ready, payload, kStageReadyTimeoutMs, ""), addr));
    TD_ASSIGN_OR_RETURN(nodes_[i].ready, net::decode_stage_ready(payload));
    return {};
}

Status ClusterEngine::accept_result_link() {
    // Anyone may connect to this port: keep accepting until the last stage proves itself, or time runs out.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStageReadyTimeoutMs);
    for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline -
                                                                                std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return make_error(ErrorKind::failed, "waiting for the last stage's data connection: no authenticated "
                                                 "connection within {} ms",
                              kStageReadyTimeoutMs);
        auto conn = result_listener_->accept(static_cast<int>(left.count()));
        if (!conn.ok()) return conn.status().with_context("waiting for the last stage's data connection");
        auto hello = handshake_accept(**conn, options_.secret, "head");
        if (hello.ok() && hello->role != net::ConnRole::data) {
            send_error(**conn, invalid_input("the head's data port takes only data connections"));
            hello = invalid_input("{}: role {} on the head's data port", (*conn)->peer(),
                                  static_cast<uint32_t>(hello->role));
        }
        if (!hello.ok()) {
            log_warn("data connection refused: {}", hello.status().message());
            (*conn)->close();
            continue;
        }
        net::HelloReply reply;
        reply.build_id = build_id();
        reply.node_name = "head";
        TD_ASSIGN_OR_RETURN(result_in_,
                            answer_hello(std::move(conn).value(), *hello, reply, options_.transports));
        return {};
    }
}

Status ClusterEngine::connect() {
    // What a failed recovery puts back: the layout the reconnect started from.
    const auto saved = std::make_tuple(addresses_, groups_, split_, spares_, placement_, slices_);
    std::vector<std::string> tried, events;
    Status first;
    for (;;) {
        unreachable_ = -1;
        Status s = connect_once();
        if (s.ok()) {
            for (const std::string &e : events) {
                log_warn("{}", e);
                recoveries_.push_back(e);
            }
            if (!events.empty() && options_.print_placement) std::fputs(placement_table().c_str(), stderr);
            ever_connected_ = true;
            return s;
        }
        if (first.ok()) first = s;
        const bool lost = ever_connected_ && unreachable_ >= 0;
        if (lost) tried.push_back(addresses_[static_cast<size_t>(unreachable_)]);
        if (!lost || !recover(static_cast<size_t>(unreachable_), s, tried, events)) {
            std::tie(addresses_, groups_, split_, spares_, placement_, slices_) = saved;
            if (events.empty()) return s;
            return Status(first.kind(), fmt::format("{}; without it: {}", first.message(), s.message()));
        }
    }
}

bool ClusterEngine::recover(size_t i, const Status &cause, const std::vector<std::string> &tried,
                            std::vector<std::string> &events) {
    const std::string lost = addresses_[i];
    // The lost worker stands by from now on: once it is back it can take the place of the next one lost.
    const auto keep_as_spare = [&] {
        if (std::find(spares_.begin(), spares_.end(), lost) == spares_.end()) spares_.push_back(lost);
    };
    for (auto it = spares_.begin(); it != spares_.end(); ++it) {
        if (std::find(tried.begin(), tried.end(), *it) != tried.end()) continue;
        const std::string spare = *it;
        spares_.erase(it);
        addresses_[i] = spare;  // same stage, rank, layers and slice: the spare loads what the lost one held
        keep_as_spare();
        events.push_back(
            fmt::format("worker {} lost ({}): spare {} took its place", lost, cause.message(), spare));
        return true;
    }
    if (!options_.replan || !options_.layers.empty() || addresses_.size() < 2) return false;
    addresses_.erase(addresses_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!split_.empty()) split_.erase(split_.begin() + static_cast<std::ptrdiff_t>(i));
    for (auto &g : groups_) {
        std::erase(g, i);
        for (size_t &w : g)
            if (w > i) --w;
    }
    std::erase_if(groups_, [](const std::vector<size_t> &g) { return g.empty(); });
    placement_.clear();  // placed again over the workers left, by speed and memory
    slices_.clear();
    keep_as_spare();
    events.push_back(fmt::format("worker {} lost ({}): re-planned onto {} worker{}", lost, cause.message(),
                                 addresses_.size(), addresses_.size() == 1 ? "" : "s"));
    return true;
}

Status ClusterEngine::connect_once() {
    const size_t n = addresses_.size();
    nodes_.assign(n, NodeStatus{});
    control_.clear();
    control_.resize(n);
    Status s;
    for (size_t i = 0; i < n && s.ok(); ++i) {
        s = handshake(i);
        // Refused or silent (not a wrong secret or version): the worker is gone, or stalled.
        if (!s.ok() && s.kind() != ErrorKind::invalid_input) unreachable_ = static_cast<int64_t>(i);
    }
    if (s.ok() && placement_.empty()) {
        auto p = place();
        if (p.ok()) placement_ = *p;
        s = p.status();
        // Each tensor-parallel group splits its layers' heads and FFN rows by its nodes' speed (or --split).
        slices_.assign(n, TpSlice{});
        std::vector<double> node_weights;
        if (s.ok()) {
            auto w = node_shares();
            s = w.status();
            if (w.ok()) node_weights = *w;
        }
        for (size_t st = 0; st < groups_.size() && s.ok(); ++st) {
            if (groups_[st].size() < 2) continue;
            std::vector<double> shares;
            for (size_t i : groups_[st]) shares.push_back(node_weights[i]);
            // Measured speeds of equal machines differ by a few percent from run to run; an uneven split of
            // equal nodes would make the faster one wait at every all-reduce. Within 15%, split evenly.
            const auto [lo, hi] = std::minmax_element(shares.begin(), shares.end());
            if (options_.split.empty() && *hi < 1.15 * *lo) shares.assign(shares.size(), 1.0);
            auto sl = tp_split(model_->hparams(), shares,
                               tp_ff_unit(model_->file(), placement_[st].first, placement_[st].second));
            if (!sl.ok()) {
                s = sl.status().with_context(fmt::format("stage {} ({} nodes)", st + 1, groups_[st].size()));
                break;
            }
            for (size_t r = 0; r < groups_[st].size(); ++r) {
                TpSlice &slice = slices_[groups_[st][r]] = (*sl)[r];
                if (placement_[st].second != model_->hparams().n_layer) {  // no output head here
                    slice.vocab_first = 0;
                    slice.vocab_last = model_->hparams().n_vocab;
                }
            }
        }
        if (!s.ok()) placement_.clear();
    }
    for (size_t st = 0; st < groups_.size() && s.ok(); ++st)
        for (size_t r = 0; r < groups_[st].size(); ++r) {
            NodeStatus &node = nodes_[groups_[st][r]];
            node.layers = placement_[st];
            node.stage = static_cast<int32_t>(st);
            node.rank = static_cast<int32_t>(r);
            node.tp_size = static_cast<int32_t>(groups_[st].size());
            node.slice = slices_[groups_[st][r]];
        }
    const size_t result_worker = groups_.back()[0];
    if (s.ok()) {
        auto l = net::tcp_listen(host_of(control_[result_worker]->local()), 0);
        if (l.ok()) result_listener_ = std::move(l).value();
        s = l.status();
    }
    // Load from the last stage back to the first (each stage dials its next hops when it loads), and in a
    // group from the last rank down (each rank dials the higher ranks of its group).
    if (s.ok()) {
        Status acc;
        std::thread acceptor([&] { acc = accept_result_link(); });
        std::random_device rd;
        for (size_t st = groups_.size(); st-- > 0 && s.ok();) {
            const std::vector<size_t> &g = groups_[st];
            const uint64_t group = (static_cast<uint64_t>(rd()) << 32 | rd()) | 1;  // never 0
            for (size_t r = g.size(); r-- > 0 && s.ok();) {
                std::vector<std::string> next;
                if (st + 1 == groups_.size()) {
                    if (r == 0)
                        next.push_back(fmt::format("{}:{}", host_of(control_[result_worker]->local()),
                                                   result_listener_->port()));
                } else {  // rank r feeds the next group's ranks q with q % size == r
                    const std::vector<size_t> &ng = groups_[st + 1];
                    for (size_t q = r; q < ng.size(); q += g.size()) next.push_back(addresses_[ng[q]]);
                }
                s = load_stage(g[r], next, group);
                nodes_[g[r]].next = next;
                if (st + 1 == groups_.size() && r == 0) nodes_[g[r]].next = {"head"};
            }
        }
        if (!s.ok()) result_listener_->close();
        acceptor.join();
        if (s.ok()) s = acc;
    }
    for (size_t r = 0; r < groups_[0].size() && s.ok(); ++r) {  // our links to the first stage's ranks
        net::Hello hello;
        hello.role = net::ConnRole::data;
        hello.build_id = build_id();
        hello.node_name = "head";
        hello.transports = options_.transports;
        auto d = dial_node(addresses_[groups_[0][r]], hello, options_.secret, options_.connect_timeout_ms);
        s = d.status();
        if (d.ok()) data_outs_.push_back(std::move(d->conn));
    }
    if (!s.ok()) {
        disconnect();
        return s;
    }
    for (auto &c : data_outs_) senders_.push_back(std::make_unique<net::AsyncSender>(*c));
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
    tokens_done_ = 0;
    started_.assign(started_.size(), false);
    cached_.assign(cached_.size(), 0);
    if (head_ctx_) head_ctx_->kv().clear();  // the workers start empty: so does the head's part
    if (options_.print_placement) std::fputs(placement_table().c_str(), stderr);
    return {};
}

std::string ClusterEngine::layout() const {
    std::string out;
    if (options_.head_layers > 0) out = fmt::format("head [0-{}] -> ", options_.head_layers - 1);
    for (size_t st = 0; st < groups_.size(); ++st) {
        if (st > 0) out += " -> ";
        for (size_t r = 0; r < groups_[st].size(); ++r)
            out += (r > 0 ? " + " : "") + node_label(groups_[st][r]);
        if (st < placement_.size())
            out += fmt::format(" [{}-{}]", placement_[st].first, placement_[st].second - 1);
    }
    return out;
}

std::vector<size_t> ClusterEngine::stage_sizes() const {
    std::vector<size_t> out;
    for (const auto &g : groups_) out.push_back(g.size());
    return out;
}

void ClusterEngine::disconnect() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
        cv_.notify_all();
    }
    for (auto &c : control_)
        if (c) c->close();
    for (auto &c : data_outs_) c->close();
    if (result_in_) result_in_->close();
    if (result_listener_) result_listener_->close();
    if (results_) results_->close();
    for (std::thread &t : threads_) t.join();
    threads_.clear();
    senders_.clear();
    data_outs_.clear();
    result_in_.reset();
    result_listener_.reset();
    results_.reset();
    control_.clear();
    pending_.clear();
    connected_ = false;
}

std::string ClusterEngine::placement_table() const {
    bool tp = false;
    for (const auto &g : groups_) tp = tp || g.size() > 1;
    std::string out = fmt::format(
        "tandem: placement ({} workers in {} stages, head layers {}, wire {}{}, n_ctx {}, {} seq):\n", nodes_.size(),
        groups_.size(), options_.head_layers, net::wire_type_name(options_.wire),
        tp ? fmt::format(", all-reduce {}", net::reduce_type_name(options_.tp_reduce)) : "", n_ctx_,
        options_.context.n_seq);
    out += fmt::format("  {:<22} {:<8} {:>11} {:>11} {:>8}  {}{}\n", "node", "layers", "weights", "KV", "GFLOP/s",
                       tp ? "slice (rank: KV heads, FFN rows, vocab rows)      " : "", "weights from");
    if (head_ctx_) {
        const HParams &hp = model_->hparams();
        out += fmt::format(
            "  {:<22} {:<8} {:>11} {:>11} {:>8}  {}\n", "head", fmt::format("0-{}", options_.head_layers - 1),
            fmt_bytes(
                static_cast<double>(stage_weight_bytes(model_->file(), 0, options_.head_layers, hp.n_layer))),
            fmt_bytes(static_cast<double>(head_ctx_->kv().bytes())), "-", "the head's model file");
    }
    for (const NodeStatus &n : nodes_) {
        const std::string slice =
            !tp ? ""
            : n.tp_size > 1 ? fmt::format("{:<50}", fmt::format("{}/{}: {}", n.rank, n.tp_size, tp_slice_str(n.slice)))
                            : fmt::format("{:<50}", "whole layers");
        out += fmt::format("  {:<22} {:<8} {:>11} {:>11} {:>8.1f}  {}{}\n", n.address,
                           fmt::format("{}-{}", n.layers.first, n.layers.second - 1),
                           fmt_bytes(static_cast<double>(n.ready.weight_bytes)),
                           fmt_bytes(static_cast<double>(n.ready.kv_bytes)), n.hello.gflops, slice, n.source);
    }
    return out;
}

std::string ClusterEngine::format_stats(const ClusterStats &st) const {
    bool tp = false;
    for (const auto &g : groups_) tp = tp || g.size() > 1;
    std::string out = "tandem: cluster stats (per node since load; data-ring messages):\n";
    out += fmt::format("  {:<22} {:<8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>10} {:>9} {:>9}", "node", "layers",
                       "msgs in", "msgs out", "bytes in", "bytes out", "steps", "compute s", "wait s", "send s");
    if (tp)
        out += fmt::format(" {:>9} {:>8} {:>12} {:>10} {:>12}", "all-red", "per step", "peer out/tok", "coll. s",
                           "us/coll.");
    out += "\n";
    for (size_t i = 0; i < st.nodes.size() && i < nodes_.size(); ++i) {
        const net::StatsReply &r = st.nodes[i];
        out += fmt::format(
            "  {:<22} {:<8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>10.3f} {:>9.3f} {:>9.3f}", nodes_[i].address,
            fmt::format("{}-{}", nodes_[i].layers.first, nodes_[i].layers.second - 1), r.msgs_in, r.msgs_out,
            fmt_bytes(static_cast<double>(r.bytes_in)), fmt_bytes(static_cast<double>(r.bytes_out)),
            r.forward_steps, r.compute_seconds, r.wait_seconds, r.send_seconds);
        if (tp && nodes_[i].tp_size > 1) {
            // Per step: all-reduces per forward message; per token: peer bytes over the tokens sampled.
            const double steps = static_cast<double>(std::max<uint64_t>(r.forward_steps, 1));
            const double tokens = static_cast<double>(std::max<uint64_t>(st.tokens, 1));
            const double colls = static_cast<double>(std::max<uint64_t>(r.tp_all_reduces + r.tp_gathers, 1));
            out += fmt::format(" {:>9} {:>8.1f} {:>12} {:>10.3f} {:>12.1f}", r.tp_all_reduces,
                               static_cast<double>(r.tp_all_reduces) / steps,
                               fmt_bytes(static_cast<double>(r.tp_bytes_out) / tokens), r.tp_wait_seconds,
                               r.tp_wait_seconds * 1e6 / colls);
        }
        out += "\n";
    }
    out +=
        fmt::format("  {:<22} {:<8} {:>8} {:>8} {:>11} {:>11} {:>8} {:>10} {:>9} {:>9.3f}\n", "head", "-",
                    st.head_msgs_recv, st.head_msgs_sent, fmt_bytes(static_cast<double>(st.head_bytes_recv)),
                    fmt_bytes(static_cast<double>(st.head_bytes_sent)), "-", "-", "-", st.head_send_seconds);
    out += "  links (transport of each node's input, outputs and tensor-parallel peers):\n";
    for (size_t i = 0; i < st.nodes.size() && i < nodes_.size(); ++i)
        out += fmt::format("    {:<22} {}\n", nodes_[i].address, st.nodes[i].links);
    out += fmt::format("    {:<22} {}\n", "head", st.head_links);
    // A tensor-parallel group is as fast as its slowest rank: the others wait for it at every all-reduce.
    // Where the ranks were busy for times more than 10% apart, say so, with the shares that would even them
    // out (as a --split where the layout is this one group).
    for (const auto &g : groups_) {
        if (g.size() < 2) continue;
        std::vector<double> work, busy;
        for (size_t i : g) {
            if (i >= st.nodes.size()) break;
            // Work: the bytes its slice streams per step (not the embedding, which a step only looks up).
            const NodeStatus &n = nodes_[i];
            auto plan =
                tp_slice_plan(model_->file(), model_->hparams(), n.layers.first, n.layers.second, n.slice);
            work.push_back(static_cast<double>(plan.ok() ? tp_streamed_bytes(*plan) : n.ready.weight_bytes));
            busy.push_back(st.nodes[i].compute_seconds - st.nodes[i].tp_wait_seconds);
        }
        const std::vector<double> shares = tp_rebalance(work, busy);
        if (shares.size() != g.size()) continue;
        std::string ranks, split;
        for (size_t k = 0; k < g.size(); ++k) {
            ranks += fmt::format("{}{} {} in {:.2f} s", k == 0 ? "" : ", ", nodes_[g[k]].address,
                                 fmt_bytes(work[k]), busy[k]);
            split += fmt::format("{}{:.2f}", k == 0 ? "" : ",", shares[k]);
        }
        out += fmt::format(
            "  tensor-parallel ranks ran at different speeds ({}, less their waits for each "
            "other); shares in proportion to their speeds: {}{}\n",
            ranks, groups_.size() == 1 ? "--split " : "", split);
    }
    return out;
}

}  // namespace td::cluster
