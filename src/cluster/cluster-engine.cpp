// ClusterEngine: the Engine operations and the background threads (control links, heartbeats, results).
#include "cluster/cluster-engine.h"

#include <fmt/format.h>

#include <algorithm>

#include "cluster/wire.h"
#include "core/log.h"
#include "net/codec.h"

namespace td::cluster {

using Clock = std::chrono::steady_clock;

Status ClusterEngine::broken() const {
    std::lock_guard lock(mu_);
    return broken_;
}

void ClusterEngine::fail(const Status &status) {
    {
        std::lock_guard lock(mu_);
        if (stopping_ || !broken_.ok()) return;
        broken_ = status;
        cv_.notify_all();
    }
    log_warn("{}", status.message());
    // Wake everything that waits on the pipeline; the objects stay alive until disconnect() joins.
    for (auto &c : control_)
        if (c) c->close();
    for (auto &c : data_outs_) c->close();
    if (result_in_) result_in_->close();
    if (results_) results_->close();
}

Status ClusterEngine::ensure_connected(bool new_request) {
    Status b = broken();
    if (connected_ && b.ok()) return {};
    // Steps queued before the failure are lost. A step submitted after them fails with the failure (its
    // request already saw errors); a new request (seq_start) or any call with nothing queued reconnects.
    if (!pending_.empty()) {
        pending_.clear();
        if (!new_request && !b.ok()) return b;
    }
    // Whatever the workers held is lost with the connection: remember which sequences had state.
    for (size_t s = 0; s < started_.size(); ++s)
        if (started_[s]) {
            lost_[s] = true;
            lost_reason_ = b.ok() ? Status(ErrorKind::disconnected, "the cluster was reconnected") : b;
        }
    if (connected_) disconnect();
    return connect();
}

Status ClusterEngine::enqueue_data(net::MsgType type, uint64_t request_id, std::span<const uint8_t> payload) {
    // Every rank of the first stage gets every message, in the same order.
    for (size_t r = 0; r < senders_.size(); ++r) {
        Status s = senders_[r]->enqueue(type, request_id, 0, payload);
        if (!s.ok()) {
            fail(Status(ErrorKind::disconnected,
                        fmt::format("worker {} disconnected ({})", addresses_[groups_[0][r]], s.message())));
            return broken();
        }
    }
    return {};
}

int32_t ClusterEngine::seq_cached(int32_t seq) const {
    if (seq < 0 || seq >= n_seq() || !connected_ || !broken().ok() || lost_[seq]) return 0;
    return cached_[seq];
}

Status ClusterEngine::seq_start(int32_t seq, const SamplerParams &params, bool want_logits,
                                const SamplerHistory &history, int32_t keep, int32_t keep_from) {
    if (seq < 0 || seq >= n_seq())
        return invalid_input("sequence {} is out of range (0..{})", seq, n_seq() - 1);
    TD_TRY(sampler_params_validate(params));
    TD_TRY(logit_bias_validate(params, n_vocab()));
    TD_TRY(seq_keep_validate(seq, keep, keep_from, n_seq(), [&](int32_t s) { return seq_cached(s); }));
    const int32_t from = keep_from < 0 ? seq : keep_from;
    TD_TRY(ensure_connected(/*new_request=*/true));
    if (keep > cached_[from]) keep = 0;  // the reconnect cleared it
    net::SeqStart m;
    m.keep = static_cast<uint32_t>(keep);
    m.keep_from = from;
    m.seq = seq;
    m.want_logits = want_logits ? 1 : 0;
    put_sampling(params, m);
    TD_TRY(sampler_history_validate(history, n_vocab()));
    m.n_sampled = history.n_drawn;
    if (history.mirostat_mu) m.mirostat_mu = *history.mirostat_mu;
    const auto tail = sampler_history_tail(params, history.tokens, net::kMaxSeqHistory);
    m.history.assign(tail.begin(), tail.end());
    buf_.clear();
    net::encode(m, buf_);
    TD_TRY(enqueue_data(net::MsgType::seq_start, 0, buf_));
    if (head_ctx_) head_ctx_->seq_copy(from, seq, keep);
    cached_[seq] = keep;
    started_[seq] = true;
    lost_[seq] = false;
    want_logits_[seq] = want_logits;
    return {};
}

Status ClusterEngine::seq_clear(int32_t seq) {
    if (seq < 0 || seq >= n_seq())
        return invalid_input("sequence {} is out of range (0..{})", seq, n_seq() - 1);
    if (head_ctx_) head_ctx_->seq_clear(seq);
    lost_[seq] = false;
    cached_[seq] = 0;
    if (!connected_ || !broken().ok()) {  // the cluster lost every sequence already
        pending_.clear();
        started_[seq] = false;
        return {};
    }
    net::SeqClear m;
    m.seq = seq;
    buf_.clear();
    net::encode(m, buf_);
    TD_TRY(enqueue_data(net::MsgType::seq_clear, 0, buf_));
    started_[seq] = false;
    return {};
}

int32_t auto_chunk_rows(int32_t n_rows, int32_t n_stages) {
    const int32_t max_rows = static_cast<int32_t>(net::kMaxBatchRows);
    const int32_t at_least = (n_rows + kMaxPartsPerStep - 1) / kMaxPartsPerStep;
    if (n_stages <= 1) return std::max(std::min(n_rows, max_rows), at_least);
    const int32_t parts = kChunksPerStage * n_stages;
    const int32_t rows = std::max((n_rows + parts - 1) / parts, kMinChunkRows);
    return std::max(std::min(rows, max_rows), at_least);
}

Status ClusterEngine::lost_error(int32_t seq) const {
    return Status(ErrorKind::disconnected,
                  fmt::format("sequence {} lost its state when the cluster failed ({}); start it again", seq,
                              lost_reason_.message()));
}

Status ClusterEngine::submit(const Batch &batch) {
    const int32_t n = batch.size();
    if (n == 0) return invalid_input("empty batch");
    if (batch.token.size() != batch.pos.size() || batch.seq.size() != batch.pos.size() ||
        batch.want_logits.size() != batch.pos.size() ||
        (batch.has_targets() && batch.target.size() != batch.pos.size()))
        return invalid_input("batch arrays have different lengths");
    if (static_cast<size_t>(n) > net::kMaxBatchRows * kMaxPartsPerStep)
        return invalid_input("a batch of {} rows exceeds the cluster limit of {}", n,
                             net::kMaxBatchRows * kMaxPartsPerStep);
    for (int32_t i = 0; i < n; ++i) {
        const int32_t s = batch.seq[i];
        if (s < 0 || s >= n_seq())
            return invalid_input("sequence {} is out of range (0..{})", s, n_seq() - 1);
        if (batch.token[i] < 0 || batch.token[i] >= n_vocab())
            return invalid_input("token id {} is out of range (vocabulary has {} tokens)", batch.token[i],
                                 n_vocab());
        if (batch.pos[i] < 0 || batch.pos[i] >= n_ctx_)
            return invalid_input("position {} is beyond the context size {}", batch.pos[i], n_ctx_);
        if (lost_[s]) return lost_error(s);  // a reconnect (a probe's, or another call's) cleared it
        if (out_has_logits(batch.want_logits[i]) && !started_[s])
            return invalid_input("sequence {} wants logits but was not started (seq_start)", s);
        if (batch.want_logits[i] > kOutLast)
            return invalid_input("row {}: output kind {} is unknown", i, batch.want_logits[i]);
        // What the wire carries for a target: >= 0 on a score row (in the vocabulary), -1 elsewhere.
        const int32_t target = batch.has_targets() ? batch.target[i] : -1;
        if (batch.want_logits[i] == kOutScore ? target < 0 || target >= n_vocab() : target != -1)
            return invalid_input("row {}: target token {} ({})", i, target,
                                 batch.want_logits[i] == kOutScore ? "a score row's must be in the vocabulary"
                                                                   : "only score rows have one");
    }
    if (static_cast<int>(pending_.size()) >= options_.max_in_flight)
        return make_error(ErrorKind::failed, "{} steps are already queued; call wait() first",
                          pending_.size());
    TD_TRY(ensure_connected(/*new_request=*/false));
    for (int32_t i = 0; i < n; ++i)
        if (lost_[batch.seq[i]]) return lost_error(batch.seq[i]);
    const int32_t at_least = (n + kMaxPartsPerStep - 1) / kMaxPartsPerStep;
    const int32_t rows =
        options_.chunk_rows > 0
            ? std::max({std::min(options_.chunk_rows, static_cast<int32_t>(net::kMaxBatchRows)), at_least})
            : auto_chunk_rows(n, n_stages());
    Pending step;
    step.first_id = next_step_;
    for (int32_t begin = 0, end = 0; begin < n; begin = end) {
        // A part never starts with a draft row: each stage checks it against the row before. The part grows
        // over the run, or, where that would pass the frame's limit, ends before the row the run follows.
        end = std::min(n, begin + rows);
        int32_t grown = end;
        while (grown < n && batch.want_logits[grown] == kOutDraft) ++grown;
        if (grown - begin <= static_cast<int32_t>(net::kMaxBatchRows)) {
            end = grown;
        } else {
            while (end > begin + 1 && batch.want_logits[end] == kOutDraft)
                --end;  // ends at the row they follow
        }
        Status s = send_part(batch, begin, end, next_step_);
        if (!s.ok()) {
            // Nothing of this step left: a clean error. Parts already on their way: the pipeline and the
            // caller disagree on what was sent, so the cluster starts over on the next request.
            if (step.n_parts > 0) {
                fail(s.with_context("a step was sent only in part"));
                pending_.push_back(step);
            }
            return s;
        }
        ++next_step_;
        ++step.n_parts;
    }
    pending_.push_back(step);
    for (int32_t i = 0; i < n; ++i) cached_[batch.seq[i]] = batch.pos[i] + 1;
    return {};
}

Status ClusterEngine::send_part(const Batch &batch, int32_t begin, int32_t end, uint64_t id) {
    const uint32_t n_embd = static_cast<uint32_t>(model_->hparams().n_embd);
    const bool whole = begin == 0 && end == batch.size();
    if (!whole) {
        part_.token.assign(batch.token.begin() + begin, batch.token.begin() + end);
        part_.pos.assign(batch.pos.begin() + begin, batch.pos.begin() + end);
        part_.seq.assign(batch.seq.begin() + begin, batch.seq.begin() + end);
        part_.want_logits.assign(batch.want_logits.begin() + begin, batch.want_logits.begin() + end);
        part_.target.clear();
        // A part without score rows sends no targets.
        if (batch.has_targets() && std::any_of(part_.want_logits.begin(), part_.want_logits.end(),
                                               [](uint8_t w) { return w == kOutScore; }))
            part_.target.assign(batch.target.begin() + begin, batch.target.begin() + end);
    }
    const Batch &b = whole ? batch : part_;
    const std::span<const int32_t> targets =
        b.count(kOutScore) > 0 ? std::span<const int32_t>(b.target) : std::span<const int32_t>();
    if (head_ctx_) {
        TD_TRY(head_ctx_->decode(b));  // validates the rows (positions, slots) before anything is sent
        // With draft rows the guesses go along: the last stage checks them.
        net::encode_forward(
            b.pos, b.seq, b.want_logits,
            b.count(kOutDraft) > 0 ? std::span<const int32_t>(b.token) : std::span<const int32_t>(),
            head_ctx_->hidden(), n_embd, options_.wire, buf_, targets);
    } else {
        net::encode_forward(b.pos, b.seq, b.want_logits, b.token, nullptr, n_embd, options_.wire, buf_,
                            targets);
    }
    return enqueue_data(net::MsgType::forward, id, buf_);
}

Status ClusterEngine::take_result(Frame *f, uint64_t id, std::vector<StepOutput> &out) {
    const auto type = static_cast<net::MsgType>(f->header.type);
    if (type == net::MsgType::error) {  // a stage failed this step; the pipeline goes on
        auto e = net::decode_error(f->payload);
        if (!e.ok()) return e.status();
        return Status(e->kind >= 1 && e->kind <= 7 ? static_cast<ErrorKind>(e->kind) : ErrorKind::failed,
                      e->message);
    }
    Status s;
    if (type != net::MsgType::result || f->header.request_id != id) {
        s = make_error(ErrorKind::failed, "worker {} sent {} for step {} while step {} was expected",
                       result_address(), net::msg_type_name(type), f->header.request_id, id);
    } else if (auto r = net::decode_result(f->payload, static_cast<uint32_t>(n_vocab()),
                                           static_cast<uint32_t>(model_->hparams().n_embd));
               !r.ok()) {
        s = r.status().with_context(fmt::format("worker {}", result_address()));
    } else {
        const bool has_logits = (r->flags & net::kResultLogits) != 0;
        const bool has_top = (r->flags & net::kResultTop) != 0;
        uint64_t next_pair = 0;
        const size_t base = out.size();
        out.resize(base + r->n_outputs);
        uint32_t n_logit_rows = 0, n_embd_rows = 0;
        for (uint32_t i = 0; i < r->n_outputs; ++i) {
            const net::ResultRow row = r->row(i);
            if (row.seq < 0 || row.seq >= n_seq()) {
                s = invalid_input("worker {}: result for sequence {} out of range", result_address(),
                                  row.seq);
                break;
            }
            StepOutput &o = out[base + i];
            o.seq = row.seq;
            o.token = row.token;
            o.logprob = row.logprob;
            o.mirostat_mu = row.mirostat_mu;
            if (row.token == net::kEmbeddingRowToken) {
                const float *p =
                    reinterpret_cast<const float *>(r->embeddings.data()) + size_t{n_embd_rows++} * r->n_embd;
                o.embedding.assign(p, p + r->n_embd);
                continue;
            }
            const uint32_t li = n_logit_rows++;
            if (has_top) {
                const uint32_t n_top = r->top_count(li);
                o.top.resize(n_top);
                for (uint32_t k = 0; k < n_top; ++k) {
                    const net::ResultTop t = r->top_pair(next_pair++);
                    o.top[k] = {t.id, t.logprob};
                }
            }
            if (has_logits && want_logits_[row.seq]) {
                const float *p =
                    reinterpret_cast<const float *>(r->logits.data()) + static_cast<size_t>(li) * n_vocab();
                o.logits.assign(p, p + n_vocab());
            }
        }
    }
    if (!s.ok()) fail(s);  // a confused pipeline: reconnect on the next request
    return s;
}

Result<std::vector<StepOutput>> ClusterEngine::wait() {
    if (pending_.empty()) return make_error(ErrorKind::failed, "no step is queued");
    if (Status b = broken(); !b.ok() || !connected_) {
        pending_.clear();
        return b.ok() ? make_error(ErrorKind::disconnected, "the cluster is not connected") : b;
    }
    const Pending step = pending_.front();
    pending_.pop_front();
    std::vector<StepOutput> out;
    Status first_error;
    // Every part is consumed even after one failed, so the next step's results stay aligned.
    for (uint32_t part = 0; part < step.n_parts; ++part) {
        bool timed_out = false;
        Frame *f = results_->pop_for(options_.step_timeout_ms, &timed_out);
        if (f == nullptr) {
            if (timed_out)
                fail(make_error(ErrorKind::failed,
                                "no result from the last stage ({}) for {:.0f} s; the pipeline is stalled",
                                result_address(), options_.step_timeout_ms / 1000.0));
            pending_.clear();
            return broken();
        }
        Status s = take_result(f, step.first_id + part, out);
        results_->release(f);
        if (!s.ok() && first_error.ok()) first_error = s;
    }
    if (!first_error.ok()) return first_error;
    tokens_done_ += out.size();
    return out;
}

Result<ClusterStats> ClusterEngine::stats() {
    if (!connected_) return make_error(ErrorKind::disconnected, "the cluster is not connected");
    TD_TRY(broken());
    const uint64_t id = next_stats_id_++;
    for (size_t i = 0; i < control_.size(); ++i) {
        Status s = send_empty(*control_[i], net::MsgType::stats_request, id);
        if (!s.ok()) {
            fail(Status(ErrorKind::disconnected, fmt::format("worker {} disconnected", addresses_[i])));
            return broken();
        }
    }
    ClusterStats st;
    {
        std::unique_lock lock(mu_);
        const bool done = cv_.wait_for(lock, std::chrono::milliseconds(options_.dead_after_ms + 1000), [&] {
            if (!broken_.ok() || stopping_) return true;
            for (uint64_t seen : stats_seen_)
                if (seen != id) return false;
            return true;
        });
        if (!broken_.ok()) return broken_;
        if (!done) return make_error(ErrorKind::failed, "workers did not answer the stats request in time");
        st.nodes = stats_replies_;
    }
    for (const auto &c : data_outs_) {
        const net::ConnStats &out = c->stats();
        st.head_msgs_sent += out.msgs_sent;
        st.head_bytes_sent += out.bytes_sent;
        st.head_send_seconds += static_cast<double>(out.send_ns) * 1e-9;
    }
    st.head_links = fmt::format("in {}, out", net::transport_name(result_in_->transport()));
    for (const auto &c : data_outs_) st.head_links.append(" ").append(net::transport_name(c->transport()));
    const net::ConnStats &in = result_in_->stats();
    st.tokens = tokens_done_;
    st.head_msgs_recv = in.msgs_recv;
    st.head_bytes_recv = in.bytes_recv;
    return st;
}

void ClusterEngine::control_loop(size_t i) {
    net::FrameHeader h;
    std::vector<uint8_t> payload;
    net::Connection &c = *control_[i];
    for (;;) {
        Status s = c.recv(h, payload, -1);
        if (!s.ok()) {
            fail(Status(ErrorKind::disconnected, fmt::format("worker {} disconnected", addresses_[i])));
            return;
        }
        const auto type = static_cast<net::MsgType>(h.type);
        if (type == net::MsgType::pong) {
            std::lock_guard lock(mu_);
            last_pong_[i] = Clock::now();
        } else if (type == net::MsgType::stats_reply) {
            auto r = net::decode_stats_reply(payload);
            if (!r.ok()) {
                fail(r.status().with_context(fmt::format("worker {}", addresses_[i])));
                return;
            }
            std::lock_guard lock(mu_);
            stats_replies_[i] = *r;
            stats_seen_[i] = h.request_id;
            last_pong_[i] = Clock::now();
            cv_.notify_all();
        } else if (type == net::MsgType::error) {
            auto e = net::decode_error(payload);
            fail(make_error(ErrorKind::failed, "worker {}: {}", addresses_[i],
                            e.ok() ? e->message : "malformed error"));
            return;
        } else {
            log_warn("worker {}: ignoring unexpected {} on the control link", addresses_[i],
                     net::msg_type_name(type));
        }
    }
}

void ClusterEngine::heartbeat_loop() {
    std::unique_lock lock(mu_);
    for (;;) {
        cv_.wait_for(lock, std::chrono::milliseconds(options_.heartbeat_ms));
        if (stopping_ || !broken_.ok()) return;
        const auto now = Clock::now();
        for (size_t i = 0; i < last_pong_.size(); ++i) {
            const double silent = std::chrono::duration<double>(now - last_pong_[i]).count();
            if (silent * 1000.0 > options_.dead_after_ms) {
                lock.unlock();
                fail(make_error(ErrorKind::disconnected,
                                "worker {} stopped responding (no heartbeat for {:.1f} s)", addresses_[i],
                                silent));
                return;
            }
        }
        lock.unlock();
        for (size_t i = 0; i < control_.size(); ++i) {
            if (!send_empty(*control_[i], net::MsgType::ping, 0, options_.heartbeat_ms).ok()) {
                fail(Status(ErrorKind::disconnected, fmt::format("worker {} disconnected", addresses_[i])));
                return;
            }
        }
        lock.lock();
    }
}

void ClusterEngine::result_loop() {
    for (;;) {
        Frame *f = results_->acquire();
        if (f == nullptr) return;
        Status s = result_in_->recv(f->header, f->payload, -1);
        if (!s.ok()) {
            results_->release(f);
            fail(Status(ErrorKind::disconnected, fmt::format("worker {} disconnected (result link: {})",
                                                             result_address(), s.message())));
            return;
        }
        results_->push(f);
    }
}

}  // namespace td::cluster
