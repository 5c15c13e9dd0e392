#include "cluster/stage.h"

#include <chrono>
#include <cmath>
#include <optional>

#include "cluster/handshake.h"
#include "cluster/node-info.h"
#include "cluster/wire.h"
#include "core/log.h"
#include "net/codec.h"

namespace td::cluster {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t ns_since(Clock::time_point t0) {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
}

// Connects to a worker (a next hop or a peer rank): Hello, proofs of the secret, HelloReply.
Result<std::unique_ptr<net::Connection>> dial(const std::string &address, net::ConnRole role,
                                              const std::string &node_name, uint64_t group, uint32_t rank,
                                              uint32_t transports, const net::ClusterSecret &secret) {
    net::Hello hello;
    hello.transports = transports;
    hello.role = role;
    hello.build_id = build_id();
    hello.node_name = node_name;
    hello.group = group;
    hello.rank = rank;
    TD_ASSIGN_OR_RETURN(Dialed d, dial_node(address, hello, secret, kControlTimeoutMs));
    return std::move(d.conn);
}

}  // namespace

Result<std::unique_ptr<Stage>> Stage::create(std::shared_ptr<const Model> model, const net::LoadStage &load,
                                             ThreadPool &pool, const std::string &node_name,
                                             const net::ClusterSecret &secret) {
    std::unique_ptr<Stage> st(new Stage());
    st->model_ = model;
    st->load_ = load;
    st->node_name_ = node_name;
    st->is_first_ = load.layer_first == 0;
    st->is_last_ = load.is_last;
    st->wire_ = static_cast<net::WireType>(load.wire);
    if (load.kv_type_k >= kKvTypeCount || load.kv_type_v >= kKvTypeCount)
        return invalid_input("load_stage: unknown KV cache types {}, {}", load.kv_type_k, load.kv_type_v);
    ContextParams cp;
    cp.n_ctx = load.n_ctx;
    cp.n_seq = load.n_seq;
    cp.type_k = static_cast<KvType>(load.kv_type_k);
    cp.type_v = static_cast<KvType>(load.kv_type_v);
    if (cp.n_seq < 1 || cp.n_seq > 4096)
        return invalid_input("load_stage: n_seq {} must be in 1..4096", cp.n_seq);
    if (load.tp_size > 1) {
        st->collective_ = std::make_unique<PeerCollective>(static_cast<int>(load.tp_rank),
                                                           static_cast<int>(load.tp_size), load.peers,
                                                           static_cast<net::ReduceType>(load.tp_reduce));
        // Our links to the higher ranks (already loaded: the head loads a group from its last rank down);
        // the lower ranks dial us when they load.
        for (uint32_t r = load.tp_rank + 1; r < load.tp_size; ++r) {
            TD_ASSIGN_OR_RETURN(auto conn, dial(load.peers[r], net::ConnRole::peer, node_name, load.group,
                                                load.tp_rank, load.transports, secret));
            TD_TRY(st->collective_->attach(static_cast<int>(r), std::move(conn)));
        }
    }
    TD_ASSIGN_OR_RETURN(st->ctx_, Context::create(model, cp, pool, st->collective_.get()));
    const int32_t n_seq = st->ctx_->n_seq();
    st->samplers_.resize(n_seq);
    st->sampler_ptrs_.assign(n_seq, nullptr);
    st->want_logits_.assign(n_seq, false);

    // Our output links: the next stage's ranks we feed, or the head's data port for the last stage.
    for (const std::string &next : load.next) {
        TD_ASSIGN_OR_RETURN(auto conn,
                            dial(next, net::ConnRole::data, node_name, 0, 0, load.transports, secret));
        st->senders_.push_back(std::make_unique<net::AsyncSender>(*conn));
        st->outs_.push_back(std::move(conn));
    }
    return st;
}

Status Stage::attach_peer(uint32_t rank, std::unique_ptr<net::Connection> conn) {
    if (collective_ == nullptr) return invalid_input("this stage is not tensor-parallel");
    return collective_->attach(static_cast<int>(rank), std::move(conn));
}

Stage::~Stage() {
    stop();
}

Status Stage::attach_input(std::unique_ptr<net::Connection> &conn) {
    if (in_ != nullptr) return make_error(ErrorKind::failed, "stage already has an input connection");
    in_ = std::move(conn);
    recv_thread_ = std::thread([this] { recv_loop(); });
    compute_thread_ = std::thread([this] { compute_loop(); });
    return {};
}

void Stage::stop() {
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    queue_.close();
    if (collective_) collective_->close();
    if (in_) in_->close();
    for (auto &o : outs_) o->close();
    if (recv_thread_.joinable()) recv_thread_.join();
    if (compute_thread_.joinable()) compute_thread_.join();
    senders_.clear();  // before the connections they write to
}

net::StatsReply Stage::stats() const {
    net::StatsReply r;
    r.msgs_in = msgs_in_;
    r.msgs_out = msgs_out_;
    r.bytes_in = bytes_in_;
    r.bytes_out = bytes_out_;
    r.forward_steps = forward_steps_;
    r.compute_seconds = static_cast<double>(compute_ns_) * 1e-9;
    r.wait_seconds = static_cast<double>(wait_ns_) * 1e-9;
    r.send_seconds = static_cast<double>(send_ns_) * 1e-9;
    if (collective_) {
        const PeerCollective::Stats c = collective_->stats();
        r.tp_all_reduces = c.all_reduces;
        r.tp_gathers = c.gathers;
        r.tp_bytes_out = c.bytes_out;
        r.tp_bytes_in = c.bytes_in;
        r.tp_wait_seconds = c.wait_seconds;
    }
    r.links = fmt::format("in {}", in_ ? net::transport_name(in_->transport()) : "none");
    if (!outs_.empty()) {
        r.links += ", out";
        for (const auto &o : outs_) r.links.append(" ").append(net::transport_name(o->transport()));
    }
    if (collective_) r.links += ", peers " + collective_->links();
    return r;
}

void Stage::recv_loop() {
    for (;;) {
        Frame *f = queue_.acquire();
        if (f == nullptr) return;
        Status s = in_->recv(f->header, f->payload, -1);
        if (!s.ok()) {
            if (!stopping_)
                log_warn("{}: input link from {} closed: {}", node_name_, in_->peer(), s.message());
            in_->close();
            queue_.release(f);
            return;
        }
        msgs_in_ += 1;
        bytes_in_ += net::kHeaderBytes + f->payload.size();
        queue_.push(f);
    }
}

void Stage::compute_loop() {
    for (;;) {
        const auto t0 = Clock::now();
        Frame *f = queue_.pop();
        wait_ns_ += ns_since(t0);
        if (f == nullptr) return;
        Status s = handle(*f);
        const uint64_t id = f->header.request_id;
        queue_.release(f);
        if (!s.ok()) {
            if (stopping_) return;
            bool out_closed = false;
            for (const auto &o : outs_) out_closed = out_closed || !o->is_open();
            if (s.kind() == ErrorKind::disconnected || out_closed) {
                log_warn("{}: {}", node_name_, s.message());
                return;
            }
            // A bad step: report it downstream for that step; the stage keeps serving.
            log_warn("{}: step {}: {}", node_name_, id, s.message());
            net::ErrorMsg e;
            e.kind = static_cast<uint32_t>(s.kind());
            e.message = fmt::format("{}: {}", node_name_, s.message()).substr(0, net::kMaxString);
            std::vector<uint8_t> payload;
            net::encode(e, payload);
            if (!send_down(net::MsgType::error, id, payload).ok()) return;
        }
    }
}

Status Stage::send_down(net::MsgType type, uint64_t request_id, std::span<const uint8_t> payload) {
    const auto t0 = Clock::now();
    Status s;
    for (auto &sender : senders_) {
        // Counted before the frame can reach anyone: the head may ask for stats as soon as it has a result.
        msgs_out_ += 1;
        bytes_out_ += net::kHeaderBytes + payload.size();
        if (s = sender->enqueue(type, request_id, 0, payload); !s.ok()) break;
    }
    send_ns_ += ns_since(t0);
    return s;
}

Status Stage::handle(Frame &f) {
    const auto type = static_cast<net::MsgType>(f.header.type);
    switch (type) {
        case net::MsgType::forward:
            return handle_forward(f);
        case net::MsgType::seq_start:
            return handle_seq_start(f);
        case net::MsgType::seq_clear: {
            TD_ASSIGN_OR_RETURN(net::SeqClear m, net::decode_seq_clear(f.payload));
            if (m.seq < 0 || m.seq >= ctx_->n_seq())
                return invalid_input("seq_clear: sequence {} is out of range (0..{})", m.seq,
                                     ctx_->n_seq() - 1);
            ctx_->seq_clear(m.seq);
            if (is_last_) return {};
            return send_down(type, f.header.request_id, f.payload);
        }
        case net::MsgType::error:  // an upstream stage failed a step: pass it on to the head
            return send_down(type, f.header.request_id, f.payload);
        default:
            return invalid_input("unexpected {} message on the data link", net::msg_type_name(type));
    }
}

Status Stage::handle_seq_start(Frame &f) {
    TD_ASSIGN_OR_RETURN(net::SeqStart m, net::decode_seq_start(f.payload));
    if (m.seq < 0 || m.seq >= ctx_->n_seq())
        return invalid_input("seq_start: sequence {} is out of range (0..{})", m.seq, ctx_->n_seq() - 1);
    if (m.keep_from >= ctx_->n_seq())
        return invalid_input("seq_start: keep_from {} is out of range (0..{})", m.keep_from,
                             ctx_->n_seq() - 1);
    // A keep beyond what this stage holds keeps what it holds: the step after it then fails the position
    // check, naming both, rather than computing on missing rows.
    ctx_->seq_copy(m.keep_from, m.seq, static_cast<int32_t>(std::min<uint32_t>(m.keep, INT32_MAX)));
    if (!is_last_) return send_down(net::MsgType::seq_start, f.header.request_id, f.payload);
    const SamplerParams sp = take_sampling(m);
    TD_TRY(sampler_params_validate(sp));
    const int32_t n_vocab = model_->hparams().n_vocab;
    TD_TRY(logit_bias_validate(sp, n_vocab));
    for (int32_t t : m.history)
        if (t >= n_vocab)
            return invalid_input("seq_start: history token {} is outside the vocabulary of {}", t, n_vocab);
    samplers_[m.seq] = std::make_unique<Sampler>(sp, n_vocab);
    std::optional<float> mu;  // NaN: the start value
    if (!std::isnan(m.mirostat_mu)) mu = m.mirostat_mu;
    if (m.n_sampled > 0 || !m.history.empty() || mu) samplers_[m.seq]->restore(m.n_sampled, m.history, mu);
    sampler_ptrs_[m.seq] = samplers_[m.seq].get();
    want_logits_[m.seq] = m.want_logits != 0;
    return {};
}

Status Stage::handle_forward(Frame &f) {
    TD_ASSIGN_OR_RETURN(net::ForwardView v, net::decode_forward(f.payload));
    const HParams &hp = model_->hparams();
    const uint32_t n = v.header.n_rows;
    const bool tokens = (v.header.flags & net::kForwardTokens) != 0;
    batch_.pos.assign(v.pos.begin(), v.pos.end());
    batch_.seq.assign(v.seq.begin(), v.seq.end());
    batch_.want_logits.assign(v.want.begin(), v.want.end());
    batch_.target.assign(v.target.begin(), v.target.end());
    const float *hidden = nullptr;
    if (is_first_) {
        if (!tokens) return invalid_input("forward: the first stage needs token ids, got hidden rows");
        batch_.token.assign(v.token.begin(), v.token.end());
    } else {
        if (tokens)
            return invalid_input("forward: stage at layer {} needs hidden rows, got token ids",
                                 load_.layer_first);
        if (v.header.n_embd != static_cast<uint32_t>(hp.n_embd))
            return invalid_input("forward: rows of {} values, the model's hidden size is {}", v.header.n_embd,
                                 hp.n_embd);
        // Only a step with draft rows carries its tokens past the first stage (the guesses).
        if (v.token.empty())
            batch_.token.assign(n, 0);
        else
            batch_.token.assign(v.token.begin(), v.token.end());
        hidden_in_.resize(static_cast<size_t>(n) * hp.n_embd);
        net::wire_to_f32(v, hidden_in_.data());
        hidden = hidden_in_.data();
    }
    const auto t0 = Clock::now();
    Status s = ctx_->decode(batch_, hidden);
    compute_ns_ += ns_since(t0);
    TD_TRY(s);
    forward_steps_ += 1;
    if (!is_last_) {
        const bool drafts = batch_.count(kOutDraft) > 0;
        net::encode_forward(batch_.pos, batch_.seq, batch_.want_logits,
                            drafts ? std::span<const int32_t>(batch_.token) : std::span<const int32_t>(),
                            ctx_->hidden(), static_cast<uint32_t>(hp.n_embd), wire_, out_buf_, batch_.target);
        return send_down(net::MsgType::forward, f.header.request_id, out_buf_);
    }
    static_assert(net::kWantEmbedding == kOutEmbedding && net::kWantDraft == kOutDraft &&
                  net::kWantScore == kOutScore && net::kEmbeddingRowToken == StepOutput::kEmbeddingToken &&
                  net::kRejectedRowToken == StepOutput::kRejectedToken);
    const float *logits = ctx_->logits();  // [n_outputs, n_vocab]
    if (collective_) {
        // Every rank of the last group takes part in the merge; rank 0 samples and answers.
        const auto t1 = Clock::now();
        s = merger_.sample(batch_, ctx_->logits(), model_->slice(), hp.n_vocab, sampler_ptrs_, want_logits_,
                           *collective_, outputs_);
        compute_ns_ += ns_since(t1);
        TD_TRY(s);
        if (load_.tp_rank != 0) return {};
        logits = merger_.logits();
        // Embedding rows need no merge: every rank holds them whole.
        add_embedding_outputs(batch_, ctx_->embeddings(), hp.n_embd, outputs_);
    } else {
        sample_outputs(batch_, logits, hp.n_vocab, sampler_ptrs_, want_logits_, ctx_->embeddings(), hp.n_embd,
                       outputs_);
    }
    rows_.resize(outputs_.size());
    bool any_logits = false, any_top = false;
    for (size_t i = 0; i < outputs_.size(); ++i) {
        rows_[i] = {outputs_[i].seq, outputs_[i].token, outputs_[i].logprob, outputs_[i].mirostat_mu};
        any_logits = any_logits || !outputs_[i].logits.empty();
        any_top = any_top || !outputs_[i].top.empty();
    }
    // A row's most likely tokens go as (id, logprob) pairs: n_probs of them instead of n_vocab logits.
    top_counts_.clear();
    top_pairs_.clear();
    if (any_top) {
        for (const StepOutput &o : outputs_) {
            if (o.token == StepOutput::kEmbeddingToken) continue;
            top_counts_.push_back(static_cast<uint32_t>(o.top.size()));
            for (const TokenProb &t : o.top) top_pairs_.push_back({t.id, t.logprob});
        }
    }
    // With logits, every sampled row's logits go (ctx's [n_outputs, n_vocab] as is); the head keeps the rows
    // of the sequences that asked. Embedding rows go as the context left them ([n_embeddings, n_embd]).
    net::encode_result(rows_, any_logits ? logits : nullptr, static_cast<uint32_t>(hp.n_vocab),
                       ctx_->embeddings(), static_cast<uint32_t>(hp.n_embd), out_buf_, top_counts_,
                       top_pairs_);
    return send_down(net::MsgType::result, f.header.request_id, out_buf_);
}

}  // namespace td::cluster
