#include "server/scheduler.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "core/check.h"
#include "core/log.h"
#include "text/chat-template.h"
#include "text/detokenizer.h"

namespace td::server {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto rate_window = std::chrono::seconds(5);  // tokens_per_second looks back this far

// How many leading tokens a and b share, at most `cap`.
size_t common_prefix(const std::vector<int32_t> &a, const std::vector<int32_t> &b, size_t cap) {
    const size_t n = std::min({a.size(), b.size(), cap});
    size_t k = 0;
    while (k < n && a[k] == b[k]) ++k;
    return k;
}
}  // namespace

const char *finish_reason_name(FinishReason reason) {
    switch (reason) {
        case FinishReason::stop:
            return "stop";
        case FinishReason::length:
            return "length";
        case FinishReason::cancelled:
            return "cancelled";
        case FinishReason::error:
            return "error";
    }
    return "?";
}

// ---- RequestStream ----------------------------------------------------------------------------------

bool RequestStream::next(StreamEvent &event, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    event = std::move(events_.front());
    events_.pop_front();
    return true;
}

void RequestStream::cancel() {
    if (cancelled_.exchange(true)) return;
    if (on_cancel_) on_cancel_();
}

void RequestStream::watch(std::shared_ptr<StreamSignal> signal) {
    std::lock_guard lock(mu_);
    signal_ = std::move(signal);
}

void RequestStream::push(StreamEvent event) {
    std::shared_ptr<StreamSignal> signal;
    {
        std::lock_guard lock(mu_);
        events_.push_back(std::move(event));
        signal = signal_;
    }
    cv_.notify_all();
    if (signal) {
        {
            std::lock_guard lock(signal->mu);
            ++signal->count;
        }
        signal->cv.notify_all();
    }
}

// ---- StreamSet --------------------------------------------------------------------------------------

StreamSet::StreamSet(std::vector<std::shared_ptr<RequestStream>> streams)
    : streams_(std::move(streams)), ended_(streams_.size(), false) {
    for (const auto &s : streams_) s->watch(signal_);
}

bool StreamSet::next(size_t &which, StreamEvent &event, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
        if (ended()) return false;
        // The count before looking: an event pushed after the look changes it, so the wait below cannot miss
        // it.
        uint64_t seen = 0;
        {
            std::lock_guard lock(signal_->mu);
            seen = signal_->count;
        }
        for (size_t k = 0; k < streams_.size(); ++k) {
            const size_t i = (turn_ + k) % streams_.size();
            if (ended_[i] || !streams_[i]->next(event, std::chrono::milliseconds(0))) continue;
            turn_ = i + 1;
            if (event.kind != StreamEvent::Kind::delta) {
                ended_[i] = true;
                ++n_ended_;
            }
            which = i;
            return true;
        }
        std::unique_lock lock(signal_->mu);
        if (!signal_->cv.wait_until(lock, deadline, [&] { return signal_->count != seen; })) return false;
    }
}

void StreamSet::cancel() {
    for (const auto &s : streams_) s->cancel();
}

// ---- Scheduler --------------------------------------------------------------------------------------

// Engine-thread state of one sequence slot.
struct Scheduler::Slot {
    int32_t seq = 0;
    std::shared_ptr<RequestStream> stream;  // null: free
    GenerationJob job;
    Clock::time_point t_submit;
    uint64_t order = 0;       // admission order: prompts are prefilled first come, first served
    int32_t n_prefilled = 0;  // prompt tokens submitted
    int32_t n_past = 0;       // positions in the cache (after the steps in flight)
    int32_t n_done = 0;       // positions whose steps came back (<= n_past)
    int32_t limit = 0;        // tokens to generate at most
    int32_t n_generated = 0;
    int32_t last_token = -1;  // sampled, not yet decoded
    bool generating = false;  // the prompt is in; one decode row per step
    bool ended = false;       // its last event is sent (or it was cancelled): no new rows
    int32_t n_in_flight = 0;  // steps in flight with rows of this slot; the slot is freed at 0
    int32_t n_prompt = 0;     // the request's prompt (job.prompt grows by `tokens` when it is resumed)
    std::vector<int32_t> tokens;  // generated so far, replayed after the prompt on a resume
    std::optional<float> mirostat_mu;  // the engine's sampler's after its last draw (restored on a resume)
    bool resuming = false;        // its state was lost with a node: replay once the steps are drained
    bool preempted = false;       // its positions were given back to the KV pool: replay once there is room
    bool failed = false;          // ended with an error: what the engine holds for it is not trusted
    // Tokens whose KV the slot holds, by position: what it has been fed while active; its prompt cache while
    // idle (reused by the next request with the same prefix).
    std::vector<int32_t> fed;
    Clock::time_point t_idle{};  // when it was freed (the least recently freed cache goes first)
    int32_t n_cached = 0;        // prompt tokens this request took from the cache
    int32_t n_resumes = 0;
    Status resume_cause;          // the failure, reported if the engine cannot start again
    std::unique_ptr<Detokenizer> detok;
    std::unique_ptr<StopStringMatcher> stop;
    std::vector<TokenLogprob> pending_lp;
    int32_t n_scored = 0;  // prompt tokens whose log-probability came back (n_prompt_logprobs; the first too)
    int32_t n_score_left = 0;  // complete_step: score outputs of this slot still to come in the step's
    std::vector<TokenLogprob> pending_prompt_lp;
    // Structured output or a grammar: the request's sampler and where the reply is in its document.
    std::unique_ptr<ConstrainedSampler> constrained;
    std::vector<float> embd;             // an embedding job: what its rows pooled into so far
    int32_t draft_budget = 0;            // guesses its next decode row may take (next_draft_budget)
    int32_t n_guessed = 0, n_held = 0;   // its step in flight: guesses made, and those that held so far
    int32_t n_embd_rows = 0;             // rows pooled into embd

    bool active() const { return stream != nullptr; }
    bool live() const { return active() && !ended; }
};

Scheduler::Scheduler(Engine &engine, const Tokenizer &tokenizer, const SchedulerParams &params)
    : engine_(engine),
      tokenizer_(tokenizer),
      params_(params),
      n_ctx_(engine.n_ctx()),
      n_vocab_(engine.n_vocab()),
      n_slots_(engine.n_seq()),
      depth_(std::clamp(params.n_micro_batches, 1, std::max(engine.max_in_flight(), 1))),
      lp_sampler_(SamplerParams{}, engine.n_vocab()),
      lookup_(params.draft) {
    params_.n_batch = std::max(params_.n_batch, n_slots_ + 1);
    params_.max_queue = std::max(params_.max_queue, 0);
    if (params_.probe_interval.count() <= 0) params_.probe_interval = std::chrono::milliseconds(1000);
    stats_.n_slots = n_slots_;
    stats_.kv_pool = std::max<int64_t>(params_.kv_pool, 0);
    slots_.resize(n_slots_);
    for (int32_t i = 0; i < n_slots_; ++i) slots_[i].seq = i;
    thread_ = std::thread([this] { engine_main(); });
}

Scheduler::~Scheduler() {
    stop();
}

Result<std::shared_ptr<RequestStream>> Scheduler::submit(GenerationJob job) {
    std::vector<GenerationJob> jobs;
    jobs.push_back(std::move(job));
    TD_ASSIGN_OR_RETURN(auto streams, submit_all(std::move(jobs)));
    return std::move(streams.front());
}

Status Scheduler::check_job(const GenerationJob &job) const {
    const int32_t n_prompt = static_cast<int32_t>(job.prompt.size());
    if (n_prompt == 0) return invalid_input("the prompt is empty");
    for (int32_t t : job.prompt)
        if (!tokenizer_.vocab().is_valid(t))
            return invalid_input("token id {} is out of range (the vocabulary has {} tokens)", t,
                                 tokenizer_.vocab().n_tokens());
    if (job.embed != Pooling::unset) {
        if (n_prompt > n_ctx_)
            return invalid_input("input ({} tokens) exceeds the context size {}", n_prompt, n_ctx_);
        if (params_.kv_pool > 0 && n_prompt >= params_.kv_pool)
            return invalid_input("input ({} tokens) does not fit the KV pool of {} positions (--ctx-size)",
                                 n_prompt, params_.kv_pool);
        return {};
    }
    TD_TRY(sampler_params_validate(job.sampling));
    TD_TRY(logit_bias_validate(job.sampling, engine_.n_vocab()));
    if (job.max_tokens < -1 || (job.max_tokens == 0 && job.n_prompt_logprobs < 0))
        return invalid_input("max_tokens must be at least 1 (0 only to score the prompt), got {}",
                             job.max_tokens);
    if (job.n_logprobs > kMaxNProbs || job.n_prompt_logprobs > kMaxNProbs)
        return invalid_input("at most {} log-probabilities per token, got {}", kMaxNProbs,
                             std::max(job.n_logprobs, job.n_prompt_logprobs));
    if (job.max_tokens > 0 && static_cast<int64_t>(n_prompt) + job.max_tokens > n_ctx_)
        return invalid_input("prompt ({} tokens) plus max_tokens ({}) exceeds the context size {}", n_prompt,
                             job.max_tokens, n_ctx_);
    if (n_prompt >= n_ctx_)
        return invalid_input("prompt ({} tokens) leaves no room to generate in the context size {}", n_prompt,
                             n_ctx_);
    if (params_.kv_pool > 0 && n_prompt >= params_.kv_pool)
        return invalid_input("prompt ({} tokens) leaves no room to generate in the KV pool of {} positions "
                             "(--ctx-size)",
                             n_prompt, params_.kv_pool);
    return {};
}

Result<std::vector<std::shared_ptr<RequestStream>>> Scheduler::submit_all(std::vector<GenerationJob> jobs) {
    if (jobs.empty()) return invalid_input("no job to submit");
    for (const GenerationJob &job : jobs) TD_TRY(check_job(job));
    const int64_t n_jobs = static_cast<int64_t>(jobs.size());
    if (n_jobs > n_slots_ + params_.max_queue)
        return invalid_input(
            "{} choices are more than this server can hold at once: {} slots (--parallel) "
            "and {} queue places",
            n_jobs, n_slots_, params_.max_queue);

    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 0; i < jobs.size(); ++i) {
        auto stream = std::make_shared<RequestStream>();
        stream->on_cancel_ = [this] {
            std::lock_guard lock(mu_);
            cv_.notify_all();
        };
        streams.push_back(std::move(stream));
    }
    {
        std::lock_guard lock(mu_);
        if (stopping_) return make_error(ErrorKind::failed, "the server is shutting down");
        const int64_t n_free = n_slots_ - stats_.n_active;
        if (static_cast<int64_t>(queue_.size()) + n_jobs > n_free + params_.max_queue)
            return make_error(ErrorKind::overloaded,
                              "the server is busy: {} requests are waiting for {} slots", queue_.size(),
                              n_slots_);
        const auto now = Clock::now();
        for (size_t i = 0; i < jobs.size(); ++i) queue_.push_back({std::move(jobs[i]), streams[i], now});
        stats_.n_queued = static_cast<int32_t>(queue_.size());
    }
    cv_.notify_all();
    return streams;
}

void Scheduler::stop() {
    {
        std::lock_guard lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard lock(mu_);
    SchedulerStats s = stats_;
    const auto now = Clock::now();
    int64_t n = 0;
    for (const auto &[t, k] : recent_)
        if (now - t <= rate_window) n += k;
    if (!recent_.empty()) {
        const double span =
            std::chrono::duration<double>(std::min<Clock::duration>(now - recent_.front().first, rate_window))
                .count();
        s.tokens_per_second = span > 0.05 ? static_cast<double>(n) / span : 0.0;
    }
    return s;
}

Status Scheduler::health() const {
    std::lock_guard lock(mu_);
    return health_;
}

std::string Scheduler::engine_metrics() const {
    std::lock_guard lock(mu_);
    return engine_metrics_;
}

EngineInfo Scheduler::engine_info() const {
    std::lock_guard lock(mu_);
    return engine_info_;
}

void Scheduler::refresh_info() {
    if (!params_.describe) return;
    EngineInfo info = params_.describe(engine_);
    std::lock_guard lock(mu_);
    engine_info_ = std::move(info);
}

// Moves queued requests into free slots (engine thread, under mu_): each to the free slot whose cache holds
// the longest prefix of its prompt, first come first served while the KV pool has room.
void Scheduler::admit() {
    // Requests preempted for room go first: nothing new takes the pool while one waits.
    for (const Slot &slot : slots_)
        if (slot.live() && slot.preempted) return;
    while (!queue_.empty()) {
        Pending &p = queue_.front();
        if (p.stream->cancelled()) {
            stats_.n_finished[static_cast<int>(FinishReason::cancelled)]++;
            queue_.pop_front();
            continue;
        }
        // At least the last prompt token is computed: its row gives the first token (or the embedding with
        // last pooling; the other poolings need every row).
        // A scored prompt is computed whole: every row reports its next token's log-probability.
        const bool reuse = p.job.cache_prompt && p.job.n_prompt_logprobs < 0 &&
                           (p.job.embed == Pooling::unset || p.job.embed == Pooling::last);
        const size_t cap = reuse ? p.job.prompt.size() - 1 : 0;
        Slot *best = nullptr;
        size_t best_k = 0;
        for (Slot &slot : slots_) {
            if (slot.active()) continue;
            const size_t k = common_prefix(slot.fed, p.job.prompt,
                                           std::min<size_t>(cap, std::max(engine_.seq_cached(slot.seq), 0)));
            if (best == nullptr || k > best_k || (k == best_k && slot.t_idle < best->t_idle)) {
                best = &slot;
                best_k = k;
            }
        }
        if (best == nullptr) break;  // every slot is busy
        // The running requests' positions: what they hold now (copied), and what they will hold once the
        // prompt they are computing is in.
        Slot *from = nullptr;
        size_t from_k = best_k, later_k = 0;
        for (Slot &other : slots_) {
            if (!other.live() || other.stream->cancelled()) continue;
            const size_t k =
                common_prefix(other.fed, p.job.prompt, std::min<size_t>(cap, std::max(shareable(other), 0)));
            if (k > from_k) {
                from = &other;
                from_k = k;
            }
            if (!other.generating && !other.failed && !other.resuming && !other.preempted)
                later_k = std::max(later_k, common_prefix(other.job.prompt, p.job.prompt, cap));
        }
        if (later_k >= from_k + kShareWait)
            break;  // the queue waits for that prompt instead of computing it too
        if (from != nullptr) {
            // Copied into the free slot whose cache is worth least: an empty one, else the least recently
            // used.
            const auto worth_less = [](const Slot &a, const Slot &b) {
                return a.fed.empty() != b.fed.empty() ? a.fed.empty() : a.t_idle < b.t_idle;
            };
            best = nullptr;
            for (Slot &slot : slots_)
                if (!slot.active() && (best == nullptr || worth_less(slot, *best))) best = &slot;
            best_k = from_k;
        }
        // Room for the prompt and one more token; idle caches give theirs back first (least recent first).
        const int64_t need =
            static_cast<int64_t>(p.job.prompt.size()) + 1 - static_cast<int64_t>(best->fed.size());
        while (need > pool_free() && evict_idle(best)) {
        }
        if (need > pool_free()) break;  // the oldest request waits for room, and those behind it with it

        Pending job = std::move(queue_.front());
        queue_.pop_front();
        Slot &slot = *best;
        const int32_t keep = static_cast<int32_t>(best_k);
        const bool want_logits = engine_logits(job.job);
        // A random seed is drawn here, not by the engine's sampler, so a stream resumed after a lost node
        // continues with the same draws (seq_start with the tokens sampled so far).
        if (job.job.sampling.seed == SamplerParams::seed_random && job.job.sampling.temperature > 0.0f)
            job.job.sampling.seed = Sampler(job.job.sampling, 1).seed();
        // A ClusterEngine that failed reconnects here (seq_start), so the first request after a worker came
        // back pays for the reconnect.
        // The sampler sees the prompt first, as llama-server's does (repeat penalties and DRY read it).
        if (Status s = engine_.seq_start(slot.seq, engine_sampling(job.job), want_logits, {job.job.prompt},
                                         keep, from != nullptr ? from->seq : -1);
            !s.ok()) {
            StreamEvent ev;
            ev.kind = StreamEvent::Kind::error;
            ev.error = s;
            job.stream->push(std::move(ev));
            stats_.n_finished[static_cast<int>(FinishReason::error)]++;
            if (s.kind() != ErrorKind::invalid_input) health_ = s;
            slot.fed.clear();
            continue;
        }
        const int32_t n_prompt = static_cast<int32_t>(job.job.prompt.size());
        slot.stream = std::move(job.stream);
        slot.job = std::move(job.job);
        slot.t_submit = job.t_submit;
        slot.order = admit_counter_++;
        if (from != nullptr) {
            slot.fed.assign(from->fed.begin(), from->fed.begin() + keep);
            stats_.n_prompt_copied += keep;
        } else {
            slot.fed.resize(static_cast<size_t>(keep));
        }
        slot.n_cached = keep;
        slot.n_prefilled = keep;
        slot.n_past = keep;
        slot.n_done = keep;
        slot.n_generated = 0;
        slot.limit = slot.job.max_tokens >= 0 ? slot.job.max_tokens : n_ctx_ - n_prompt;
        slot.last_token = -1;
        slot.generating = false;
        slot.ended = false;
        slot.failed = false;
        slot.n_in_flight = 0;
        slot.n_prompt = n_prompt;
        slot.tokens.clear();
        slot.mirostat_mu.reset();
        slot.resuming = false;
        slot.preempted = false;
        slot.n_resumes = 0;
        slot.detok = std::make_unique<Detokenizer>(tokenizer_, Detokenizer::Start::continuation);
        slot.stop = std::make_unique<StopStringMatcher>(slot.job.stop);
        slot.pending_lp.clear();
        slot.n_scored = 0;
        slot.n_score_left = 0;
        slot.pending_prompt_lp.clear();
        if (slot.job.n_prompt_logprobs >= 0) {
            // Nothing predicts the first token: its entry has no log-probability.
            TokenLogprob first;
            first.id = slot.job.prompt[0];
            first.piece = tokenizer_.token_to_piece(first.id);
            first.logprob = std::numeric_limits<float>::quiet_NaN();
            slot.pending_prompt_lp.push_back(std::move(first));
            slot.n_scored = 1;
        }
        slot.constrained.reset();
        slot.embd.clear();
        slot.n_embd_rows = 0;
        slot.draft_budget = draft_max(slot.job);
        slot.n_guessed = 0;
        slot.n_held = 0;
        if (constrained(slot.job)) {
            if (!constraint_vocab_)
                constraint_vocab_ = std::make_unique<ConstraintVocab>(tokenizer_, engine_.n_vocab());
            slot.constrained = std::make_unique<ConstrainedSampler>(
                *constraint_vocab_, slot.job.schema, slot.job.grammar, slot.job.sampling, slot.job.prompt);
        }
        stats_.n_active++;
        stats_.n_prompt_cached += keep;
    }
    // Requests cancelled while waiting leave the queue now, not when they reach its head.
    const size_t before = queue_.size();
    std::erase_if(queue_, [](const Pending &p) { return p.stream->cancelled(); });
    stats_.n_finished[static_cast<int>(FinishReason::cancelled)] +=
        static_cast<int64_t>(before - queue_.size());
    stats_.n_queued = static_cast<int32_t>(queue_.size());
}

void Scheduler::engine_main() {
    refresh_info();
    for (;;) {
        const auto t_iter = Clock::now();
        {
            std::unique_lock lock(mu_);
            for (Slot &slot : slots_)
                if (slot.live() && slot.stream->cancelled()) end(slot, FinishReason::cancelled);
            if (!stopping_ && drain_error_.ok()) admit();
            if (stopping_) {
                // Steps still in flight are abandoned; the engine is destroyed after the scheduler.
                const Status bye = make_error(ErrorKind::failed, "the server is shutting down");
                for (Slot &slot : slots_)
                    if (slot.live()) fail(slot, bye);
                for (Pending &p : queue_) {
                    StreamEvent ev;
                    ev.kind = StreamEvent::Kind::error;
                    ev.error = bye;
                    p.stream->push(std::move(ev));
                }
                queue_.clear();
                stats_.n_queued = 0;
                return;
            }
            const bool any_live =
                std::any_of(slots_.begin(), slots_.end(), [](const Slot &s) { return s.live(); });
            if (!any_live && in_flight_.empty()) {
                publish_slots();  // the slots freed since the last step
                // Idle: wake for a request, or every probe_interval to probe (and retry a failed engine).
                const bool woken =
                    cv_.wait_for(lock, params_.probe_interval, [&] { return stopping_ || !queue_.empty(); });
                if (!woken) {
                    lock.unlock();
                    run_probe(/*idle=*/true);
                }
                continue;  // admit (or stop) on the next turn
            }
        }
        if (in_flight_.empty() && resume_slots()) refresh_info();
        resume_preempted();
        double engine_seconds = 0.0;
        fill_pipeline(engine_seconds);
        // Nothing to run: every live slot was cancelled after the check above (the next turn frees them), or
        // waits for room in the KV pool that a finishing request gives back.
        if (in_flight_.empty()) {
            std::unique_lock lock(mu_);
            cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stopping_; });
            continue;
        }
        complete_step(engine_seconds);
        const auto t_end = Clock::now();
        {
            std::lock_guard lock(mu_);
            const double iter = std::chrono::duration<double>(t_end - t_iter).count();
            stats_.busy_seconds += iter;
            stats_.kv_used = pool_used();
            stats_.overhead_seconds += std::max(0.0, iter - engine_seconds);
            publish_slots();
        }
        run_probe(/*idle=*/false);
    }
}

// Builds the next step into batch_ from the slots not in flight; false when there is nothing to compute.
bool Scheduler::build_step(InFlight &step) {
    batch_.clear();
    step.seqs.clear();
    step.past.clear();
    step.prompt_done.clear();
    step.n_scored.clear();
    step.n_prompt_rows = 0;
    // Decode rows: the generating slots are dealt into depth_ micro-batches of about equal size.
    int32_t n_generating = 0;
    for (const Slot &slot : slots_) n_generating += slot.live() && slot.generating;
    const int32_t quota = (n_generating + depth_ - 1) / depth_;
    int32_t n_decode = 0;
    for (Slot &slot : slots_) {
        if (n_decode >= quota) break;
        if (!slot.live() || !slot.generating || slot.resuming || slot.preempted || slot.n_in_flight > 0 ||
            slot.stream->cancelled())
            continue;
        if (pool_free() < 1 && !make_room(slot)) continue;  // waits for a step in flight to give room back
        if (slot.preempted || !slot.live()) continue;       // it was the newest: it waits (or it cannot fit)
        batch_.add(slot.last_token, slot.n_past, slot.seq, true);
        slot.fed.push_back(slot.last_token);
        slot.n_past++;
        slot.n_in_flight++;
        // Guesses follow the row: no more than the tokens it may still generate after this one, the context
        // and the pool hold, and the step's rows left once every other generating slot has its row.
        slot.n_guessed = 0;
        slot.n_held = 0;
        if (slot.draft_budget > 0 && !constrained(slot.job)) {
            int64_t n = std::min<int64_t>(slot.draft_budget, slot.limit - slot.n_generated - 1);
            n = std::min<int64_t>({n, n_ctx_ - slot.n_past, pool_free(),
                                   params_.n_batch - batch_.size() - (n_generating - n_decode - 1)});
            draft_.clear();
            if (n > 0) {
                Drafter &drafter = params_.drafter != nullptr ? *params_.drafter : lookup_;
                if (Status s = drafter.draft(slot.seq, slot.fed, static_cast<int32_t>(n), draft_); !s.ok())
                    log_warn("server: no guesses for slot {}: {}", slot.seq,
                             s.message());  // the step goes on
            }
            for (int32_t d : draft_) {
                batch_.add_out(d, slot.n_past, slot.seq, kOutDraft);
                slot.fed.push_back(d);
                slot.n_past++;
            }
            slot.n_guessed = static_cast<int32_t>(draft_.size());
            stats_drafted_ += slot.n_guessed;
        }
        step.seqs.push_back(slot.seq);
        step.past.push_back(slot.n_past);
        step.n_scored.push_back(0);
        n_decode++;
    }
    // Prompt chunks fill the rest of the step, oldest request first.
    prefilling_.clear();
    for (Slot &slot : slots_)
        if (slot.live() && !slot.generating && !slot.resuming && !slot.preempted && !slot.stream->cancelled() &&
            slot.n_prefilled < static_cast<int32_t>(slot.job.prompt.size()))
            prefilling_.push_back(&slot);
    std::sort(prefilling_.begin(), prefilling_.end(),
              [](const Slot *a, const Slot *b) { return a->order < b->order; });
    for (Slot *slot : prefilling_) {
        const int32_t budget = params_.n_batch - batch_.size();
        if (budget <= 0) break;
        const int32_t n_prompt = static_cast<int32_t>(slot->job.prompt.size());
        const int32_t n = std::min(budget, n_prompt - slot->n_prefilled);
        const Pooling embed = slot->job.embed;
        int32_t n_scored = 0;
        for (int32_t i = 0; i < n; ++i) {
            const int32_t p = slot->n_prefilled + i;
            // A scored prompt's rows rate the token after them, those of the request's own prompt not rated
            // yet (a resumed stream's replay skips what was sent).
            if (slot->job.n_prompt_logprobs >= 0 && p + 1 < slot->n_prompt && p + 1 >= slot->n_scored) {
                batch_.add_score(slot->job.prompt[p], p, slot->seq, slot->job.prompt[p + 1]);
                slot->fed.push_back(slot->job.prompt[p]);
                n_scored++;
                continue;
            }
            uint8_t out = p == n_prompt - 1 ? kOutLogits : kOutNone;
            if (embed != Pooling::unset)
                out = embed == Pooling::none || embed == Pooling::mean || (embed == Pooling::cls && p == 0) ||
                              (embed == Pooling::last && p == n_prompt - 1)
                          ? kOutEmbedding
                          : kOutNone;
            batch_.add_out(slot->job.prompt[p], p, slot->seq, out);
            slot->fed.push_back(slot->job.prompt[p]);
        }
        slot->n_prefilled += n;
        slot->n_past += n;
        slot->n_in_flight++;
        step.seqs.push_back(slot->seq);
        step.past.push_back(slot->n_past);
        step.n_scored.push_back(n_scored);
        if (slot->n_prefilled == n_prompt) step.prompt_done.push_back(slot->seq);
        step.n_prompt_rows += n;
    }
    step.n_rows = batch_.size();
    return !batch_.empty();
}

// Submits steps until depth_ are in flight or nothing is left to compute.
void Scheduler::fill_pipeline(double &engine_seconds) {
    while (static_cast<int32_t>(in_flight_.size()) < depth_ && drain_error_.ok()) {
        InFlight step;
        if (!spare_.empty()) {
            step = std::move(spare_.back());
            spare_.pop_back();
        }
        if (!build_step(step)) {
            spare_.push_back(std::move(step));
            return;
        }
        step.t_submit = Clock::now();
        Status s = engine_.submit(batch_);
        engine_seconds += std::chrono::duration<double>(Clock::now() - step.t_submit).count();
        if (!s.ok()) {
            std::lock_guard lock(mu_);
            on_step_failed(step, s);
            spare_.push_back(std::move(step));
            return;
        }
        in_flight_.push_back(std::move(step));
    }
}

// A step failed (submit or wait): its requests end with the error, and so do the steps still in flight
// (drained first, nothing new is submitted meanwhile). Engine thread, under mu_.
void Scheduler::on_step_failed(InFlight &step, const Status &status) {
    const Status cause = drain_error_.ok() ? status : drain_error_;
    if (drain_error_.ok()) {
        log_warn("server: step of {} rows failed: {}", step.n_rows, cause.message());
        if (!in_flight_.empty()) drain_error_ = cause;
    }
    if (cause.kind() != ErrorKind::invalid_input) health_ = cause;
    const bool resumable = cause.kind() == ErrorKind::disconnected;
    for (int32_t seq : step.seqs) {
        Slot &slot = slots_[seq];
        slot.n_in_flight--;
        if (slot.live() && resumable && slot.n_resumes < params_.max_resumes) {
            if (!slot.resuming) slot.resume_cause = cause;
            slot.resuming = true;
        } else if (slot.live()) {
            fail(slot, cause);
        } else {
            release_if_idle(slot);
        }
    }
}

// The slots whose state a lost node took: started again and replayed, or ended with their failure when the
// engine cannot start (engine thread, steps drained).
bool Scheduler::resume_slots() {
    Status down;  // set once a start failed: the others are not tried (each try may wait for a timeout)
    bool any = false;
    for (Slot &slot : slots_) {
        if (!slot.resuming) continue;
        any = true;
        slot.resuming = false;
        {
            std::lock_guard lock(mu_);
            if (!slot.live()) {
                release_if_idle(slot);
                continue;
            }
            if (slot.stream->cancelled()) {
                end(slot, FinishReason::cancelled);
                continue;
            }
        }
        // Not under mu_: the engine may reconnect here, replace or drop a worker and load its stage, and
        // /health and /metrics answer meanwhile.
        if (down.ok()) down = restart(slot);
        std::lock_guard lock(mu_);
        if (!down.ok()) {
            log_warn("server: cannot resume request {} ({}); ending it", slot.seq, down.message());
            health_ = down;
            fail(slot, slot.resume_cause);
            continue;
        }
        slot.n_resumes++;
        stats_.n_resumed++;
        log_info("server: resuming request in slot {} after {}: replaying {} prompt and {} generated tokens",
                 slot.seq, slot.resume_cause.message(), slot.n_prompt, slot.tokens.size());
    }
    return any;
}

SamplerParams Scheduler::engine_sampling(const GenerationJob &job) const {
    // A constrained job's draw is the head's, from whole logits: the engine's is not used.
    SamplerParams p = constrained(job) ? SamplerParams::plain_greedy() : job.sampling;
    // The engine reports log-probabilities where the logits are: only they cross a cluster.
    p.n_probs = std::max(job.n_logprobs, job.n_prompt_logprobs);
    return p;
}

int32_t Scheduler::sample_constrained(Slot &slot, const StepOutput &out) {
    if (static_cast<int32_t>(out.logits.size()) != engine_.n_vocab()) {
        fail(slot,
             make_error(ErrorKind::failed, "the engine returned no logits for a structured-output request"));
        return -1;
    }
    Result<int32_t> token = slot.constrained->sample(out.logits.data());
    if (!token.ok()) {
        fail(slot, token.status().with_context(fmt::format("after {} tokens", slot.n_generated - 1)));
        return -1;
    }
    return *token;
}

Status Scheduler::restart(Slot &slot) {
    // The prompt and every token generated so far, as one prompt: the token sampled after it is the stream's
    // next one. The detokenizer and stop matcher keep their state: nothing is sent twice.
    slot.job.prompt.resize(static_cast<size_t>(slot.n_prompt));
    slot.job.prompt.insert(slot.job.prompt.end(), slot.tokens.begin(), slot.tokens.end());
    // The sampler continues where the old one stopped: it has seen that prompt, and a seeded stream makes
    // the draws it would have, and Mirostat's threshold where it was. (A constrained stream's sampler is the
    // head's own and was not lost; the engine's then draws greedy and reads no history.)
    const bool own = !constrained(slot.job);
    TD_TRY(engine_.seq_start(
        slot.seq, engine_sampling(slot.job), engine_logits(slot.job),
        {slot.job.prompt, own ? slot.tokens.size() : 0, own ? slot.mirostat_mu : std::nullopt}));
    slot.n_prefilled = 0;
    slot.n_past = 0;
    slot.n_done = 0;
    slot.fed.clear();
    slot.generating = false;
    slot.embd.clear();
    slot.n_embd_rows = 0;
    return {};
}

void Scheduler::publish_slots() {
    slot_info_.resize(slots_.size());
    for (size_t i = 0; i < slots_.size(); ++i) {
        const Slot &slot = slots_[i];
        SlotInfo &info = slot_info_[i];
        info.id = slot.seq;
        const bool was = info.processing;
        info.processing = slot.active();
        info.n_held = static_cast<int32_t>(slot.fed.size());
        if (!slot.active()) continue;           // the last request's figures stay
        if (!was || info.task != slot.order) {  // a new request: its parameters (copied once, not per step)
            info.sampling = slot.job.sampling;
            info.max_tokens = slot.job.max_tokens;
            info.n_draft = draft_max(slot.job);
        }
        info.task = slot.order;
        info.n_prompt = slot.n_prompt;
        info.n_cached = slot.n_cached;
        info.n_processed = std::max(std::min(slot.n_prefilled, slot.n_prompt) - slot.n_cached, 0);
        info.n_decoded = slot.n_generated;
        info.n_remain = std::max(slot.limit - slot.n_generated, 0);
    }
}

std::vector<SlotInfo> Scheduler::slots() const {
    std::lock_guard lock(mu_);
    if (slot_info_.empty()) {  // before the first step
        std::vector<SlotInfo> idle(static_cast<size_t>(n_slots_));
        for (int32_t i = 0; i < n_slots_; ++i) idle[static_cast<size_t>(i)].id = i;
        return idle;
    }
    return slot_info_;
}

int32_t Scheduler::shareable(const Slot &slot) const {
    if (slot.failed || slot.resuming || slot.preempted) return 0;
    return std::min({slot.n_done, static_cast<int32_t>(slot.fed.size()), engine_.seq_cached(slot.seq)});
}

int64_t Scheduler::pool_held(const Slot &slot) const {
    if (!slot.active()) return static_cast<int64_t>(slot.fed.size());  // its prompt cache
    if (slot.preempted) return 0;
    return std::max<int64_t>(slot.n_past, static_cast<int64_t>(slot.job.prompt.size()));
}

bool Scheduler::evict_idle(const Slot *except) {
    Slot *lru = nullptr;
    for (Slot &slot : slots_)
        if (!slot.active() && !slot.fed.empty() && &slot != except &&
            (lru == nullptr || slot.t_idle < lru->t_idle))
            lru = &slot;
    if (lru == nullptr) return false;
    if (Status s = engine_.seq_clear(lru->seq); !s.ok())
        log_warn("server: clearing slot {} failed: {}", lru->seq, s.message());
    lru->fed.clear();
    return true;
}

int64_t Scheduler::pool_used() const {
    int64_t used = 0;
    for (const Slot &slot : slots_) used += pool_held(slot);
    return used;
}

int64_t Scheduler::pool_free() const {
    return params_.kv_pool <= 0 ? INT64_MAX : params_.kv_pool - pool_used();
}

bool Scheduler::make_room(Slot &slot) {
    std::lock_guard lock(mu_);
    while (pool_free() < 1 && evict_idle(nullptr)) {
    }
    if (pool_free() >= 1) return true;
    Slot *victim = nullptr;
    for (Slot &other : slots_)
        if (other.live() && !other.preempted && other.n_in_flight == 0 && other.order >= slot.order &&
            (victim == nullptr || other.order > victim->order))
            victim = &other;
    if (victim == nullptr) return false;  // the newer requests are in flight: their step gives room back
    if (victim == &slot) {
        bool others = false, newer_in_flight = false;
        for (const Slot &other : slots_) {
            others = others || (&other != &slot && pool_held(other) > 0);
            newer_in_flight = newer_in_flight || (other.live() && other.order > slot.order && other.n_in_flight > 0);
        }
        if (newer_in_flight) return false;  // a newer request is preempted once its step is back
        if (!others) {  // alone and still out of room: it can never fit
            fail(slot, make_error(ErrorKind::overloaded,
                                  "the KV pool is full: this request holds all {} positions (--ctx-size) and needs "
                                  "more; raise --ctx-size or lower max_tokens",
                                  params_.kv_pool));
            return false;
        }
    }
    log_info("server: the KV pool ({} positions) is full; preempting the request in slot {} ({} positions), to "
             "be replayed when there is room",
             params_.kv_pool, victim->seq, pool_held(*victim));
    if (Status s = engine_.seq_clear(victim->seq); !s.ok())
        log_warn("server: clearing slot {} failed: {}", victim->seq, s.message());
    victim->preempted = true;
    victim->fed.clear();
    stats_.n_preempted++;
    return pool_free() >= 1;
}

void Scheduler::resume_preempted() {
    for (;;) {
        Slot *next = nullptr;
        for (Slot &slot : slots_)
            if (slot.live() && slot.preempted && slot.n_in_flight == 0 && (next == nullptr || slot.order < next->order))
                next = &slot;
        if (next == nullptr) return;
        {
            std::lock_guard lock(mu_);
            if (next->stream->cancelled()) {
                next->preempted = false;
                end(*next, FinishReason::cancelled);
                continue;
            }
        }
        const int64_t need = next->n_prompt + static_cast<int64_t>(next->tokens.size()) + 1;
        if (need > params_.kv_pool) {
            std::lock_guard lock(mu_);
            next->preempted = false;
            fail(*next, make_error(ErrorKind::overloaded,
                                   "the KV pool is full: this request needs {} positions, the pool holds {} "
                                   "(--ctx-size); raise --ctx-size or lower max_tokens",
                                   need, params_.kv_pool));
            continue;
        }
        while (need > pool_free() && evict_idle(nullptr)) {
        }
        if (need > pool_free()) return;  // the oldest waits first
        next->preempted = false;
        Status s = restart(*next);
        std::lock_guard lock(mu_);
        if (!s.ok()) {
            fail(*next, s);
            continue;
        }
        log_info("server: replaying the preempted request in slot {} ({} positions)", next->seq, need - 1);
    }
}

// Collects the oldest step's tokens and hands them to their requests.
void Scheduler::complete_step(double &engine_seconds) {
    InFlight &step = in_flight_.front();
    const auto t0 = Clock::now();
    auto outputs = engine_.wait();
    const auto t1 = Clock::now();
    engine_seconds += std::chrono::duration<double>(t1 - t0).count();

    std::lock_guard lock(mu_);
    stats_.n_steps++;
    stats_.step_seconds += std::chrono::duration<double>(t1 - step.t_submit).count();
    if (!outputs.ok()) {
        // The record leaves the queue first: on_step_failed looks at the steps still in flight.
        InFlight failed = std::move(step);
        in_flight_.pop_front();
        on_step_failed(failed, outputs.status());
        spare_.push_back(std::move(failed));
    } else {
        if (drain_error_.ok()) health_ = {};
        stats_.n_prompt_tokens += step.n_prompt_rows;
        for (int32_t seq : step.prompt_done)
            if (slots_[seq].live() && slots_[seq].job.embed == Pooling::unset) slots_[seq].generating = true;
        for (size_t i = 0; i < step.seqs.size(); ++i) {
            Slot &slot = slots_[step.seqs[i]];
            slot.n_in_flight--;
            slot.n_done = std::max(slot.n_done, step.past[i]);
            slot.n_score_left = step.n_scored[i];
        }
        int32_t n_sampled = 0;
        int32_t prev_seq = -1;  // a slot's outputs come together, in row order
        for (const StepOutput &out : *outputs) {
            if (out.seq < 0 || out.seq >= n_slots_ || !slots_[out.seq].live()) continue;
            Slot &slot = slots_[out.seq];
            if (slot.job.embed != Pooling::unset) {
                on_embedding(slot, out);
                continue;
            }
            if (slot.n_score_left > 0) {  // a slot's score rows come first: its outputs are in row order
                slot.n_score_left--;
                on_prompt_score(slot, out);
                continue;
            }
            if (out.token == StepOutput::kRejectedToken) {
                // A guess that failed: its position is written again by the next step.
                slot.n_past--;
                slot.fed.pop_back();
                slot.n_done = std::min(slot.n_done, slot.n_past);
                continue;
            }
            if (out.seq == prev_seq) {  // its row's guess held
                stats_.n_draft_accepted++;
                slot.n_held++;
            }
            prev_seq = out.seq;
            n_sampled += slot.limit > 0;  // a prompt scored alone (max_tokens 0) keeps no token
            on_token(slot, out);
        }
        stats_.n_drafted += stats_drafted_;
        stats_drafted_ = 0;
        for (int32_t seq : step.seqs) {
            Slot &slot = slots_[seq];
            slot.draft_budget =
                next_draft_budget(slot.draft_budget, slot.n_guessed, slot.n_held, draft_max(slot.job));
            slot.n_guessed = 0;
        }
        for (int32_t seq : step.seqs)
            if (slots_[seq].live()) flush_prompt_logprobs(slots_[seq]);
        for (int32_t seq : step.prompt_done)
            if (slots_[seq].live() && slots_[seq].job.embed != Pooling::unset) finish_embedding(slots_[seq]);
        for (int32_t seq : step.seqs) release_if_idle(slots_[seq]);
        stats_.n_generated_tokens += n_sampled;
        recent_.emplace_back(t1, n_sampled);
        while (!recent_.empty() && t1 - recent_.front().first > rate_window) recent_.pop_front();
        spare_.push_back(std::move(step));
        in_flight_.pop_front();
    }
    if (in_flight_.empty()) drain_error_ = {};
}

// Engine probe and, while idle after a failure, a reconnect attempt. Engine thread, without mu_.
void Scheduler::run_probe(bool idle) {
    const auto now = Clock::now();
    if (now - t_probe_ < params_.probe_interval) return;
    t_probe_ = now;
    if (idle && !health().ok()) {
        // seq_start is where a failed ClusterEngine reconnects; slot 0 is free while idle.
        Status s = engine_.seq_start(0, SamplerParams{});
        if (s.ok()) s = engine_.seq_clear(0);
        std::lock_guard lock(mu_);
        health_ = s;
        if (s.ok()) log_info("server: the engine works again");
    }
    refresh_info();
    if (!params_.probe) return;
    auto r = params_.probe(engine_);
    std::lock_guard lock(mu_);
    if (r.ok()) {
        engine_metrics_ = std::move(r).value();
    } else if (r.status().kind() == ErrorKind::disconnected && health_.ok()) {
        health_ = r.status();
    }
}

// One prompt token's log-probability (engine thread, under mu_).
void Scheduler::on_prompt_score(Slot &slot, const StepOutput &out) {
    if (slot.n_scored >= slot.n_prompt || out.token != slot.job.prompt[slot.n_scored]) {
        fail(slot,
             make_error(ErrorKind::failed, "the engine rated token {} where the prompt's token {} is {}",
                        out.token, slot.n_scored,
                        slot.n_scored < slot.n_prompt ? slot.job.prompt[slot.n_scored] : -1));
        return;
    }
    slot.n_scored++;
    TokenLogprob lp;
    lp.id = out.token;
    lp.piece = tokenizer_.token_to_piece(out.token);
    lp.logprob = out.logprob;
    const size_t n_top =
        std::min(out.top.size(), static_cast<size_t>(std::max(slot.job.n_prompt_logprobs, 0)));
    for (size_t k = 0; k < n_top; ++k)
        lp.top.push_back({tokenizer_.token_to_piece(out.top[k].id), out.top[k].logprob, out.top[k].id});
    slot.pending_prompt_lp.push_back(std::move(lp));
}

void Scheduler::flush_prompt_logprobs(Slot &slot) {
    if (slot.pending_prompt_lp.empty()) return;
    StreamEvent ev;
    ev.prompt_logprobs = std::move(slot.pending_prompt_lp);
    slot.pending_prompt_lp.clear();
    slot.stream->push(std::move(ev));
}

// One sampled token for a slot (engine thread, under mu_).
void Scheduler::on_token(Slot &slot, const StepOutput &out) {
    flush_prompt_logprobs(slot);  // the prompt's come first
    if (slot.limit == 0) {        // only the prompt was asked for
        finish(slot, FinishReason::length);
        return;
    }
    if (slot.n_generated == 0) {
        stats_.ttft_seconds_sum += std::chrono::duration<double>(Clock::now() - slot.t_submit).count();
        stats_.ttft_count++;
    }
    slot.n_generated++;
    const int32_t token = constrained(slot.job) ? sample_constrained(slot, out) : out.token;
    if (token < 0) return;  // failed: no token continues the document
    slot.mirostat_mu = out.mirostat_mu;
    slot.tokens.push_back(token);
    const Vocab &vocab = tokenizer_.vocab();
    if (!vocab.is_valid(token)) {
        fail(slot, make_error(ErrorKind::failed, "the engine returned token id {} (vocabulary of {})", token,
                              vocab.n_tokens()));
        return;
    }
    if (vocab.is_eog(token)) {
        finish(slot, FinishReason::stop);
        return;
    }
    if (slot.job.n_logprobs >= 0) {
        // A constrained draw is the head's own, from the logits; the engine rated its own draw.
        const bool own = static_cast<int32_t>(out.logits.size()) == engine_.n_vocab();
        TokenLogprob lp;
        lp.id = token;
        lp.piece = tokenizer_.token_to_piece(token);
        lp.logprob = own ? lp_sampler_.token_logprob(out.logits.data(), token) : out.logprob;
        const std::vector<TokenProb> top =
            own ? lp_sampler_.top_logprobs(out.logits.data(), slot.job.n_logprobs) : out.top;
        for (size_t k = 0; k < top.size() && k < static_cast<size_t>(slot.job.n_logprobs); ++k)
            lp.top.push_back({tokenizer_.token_to_piece(top[k].id), top[k].logprob, top[k].id});
        slot.pending_lp.push_back(std::move(lp));
    }
    std::string text = slot.stop->push(slot.detok->push(token));
    // A structured reply ends when its document closes.
    const bool stopped = slot.stop->stopped() || (slot.constrained && slot.constrained->must_end());
    const bool at_limit = slot.n_generated >= slot.limit;
    if (at_limit && !stopped) text += slot.stop->push(slot.detok->flush()) + slot.stop->flush();
    if (!text.empty() || !slot.pending_lp.empty()) {
        StreamEvent ev;
        ev.text = std::move(text);
        ev.logprobs = std::move(slot.pending_lp);
        slot.pending_lp.clear();
        slot.stream->push(std::move(ev));
    }
    if (stopped || slot.stop->stopped()) {
        finish(slot, FinishReason::stop);
    } else if (at_limit) {
        finish(slot, FinishReason::length);
    } else {
        slot.last_token = token;
    }
}

// One row of an embedding job (engine thread, under mu_).
void Scheduler::on_embedding(Slot &slot, const StepOutput &out) {
    if (out.token != StepOutput::kEmbeddingToken || out.embedding.empty() ||
        (!slot.embd.empty() && slot.job.embed != Pooling::none && out.embedding.size() != slot.embd.size())) {
        fail(slot,
             make_error(ErrorKind::failed, "the engine returned no embedding for an embedding request"));
        return;
    }
    slot.n_embd_rows++;
    switch (slot.job.embed) {
        case Pooling::mean:
            if (slot.embd.empty()) slot.embd.assign(out.embedding.size(), 0.0f);
            for (size_t i = 0; i < out.embedding.size(); ++i) slot.embd[i] += out.embedding[i];
            break;
        case Pooling::none:
            slot.embd.insert(slot.embd.end(), out.embedding.begin(), out.embedding.end());
            break;
        default:
            slot.embd = out.embedding;
            break;
    }
}

void Scheduler::finish_embedding(Slot &slot) {
    const int32_t expected =
        slot.job.embed == Pooling::none || slot.job.embed == Pooling::mean ? slot.n_prompt : 1;
    if (slot.n_embd_rows != expected) {
        fail(slot,
             make_error(ErrorKind::failed, "the engine returned {} embedding rows for a prompt that needs {}",
                        slot.n_embd_rows, expected));
        return;
    }
    if (slot.job.embed == Pooling::mean)
        for (float &v : slot.embd) v /= static_cast<float>(slot.n_embd_rows);
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::done;
    ev.finish = FinishReason::stop;
    ev.n_prompt = slot.n_prompt;
    ev.n_cached = slot.n_cached;
    ev.embedding = std::move(slot.embd);
    slot.embd.clear();
    slot.stream->push(std::move(ev));
    end(slot, FinishReason::stop);
}

void Scheduler::finish(Slot &slot, FinishReason reason) {
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::done;
    ev.finish = reason;
    ev.n_prompt = slot.n_prompt;
    ev.n_generated = slot.n_generated;
    ev.n_cached = slot.n_cached;
    ev.stop_word = slot.stop->matched();
    if (reason == FinishReason::stop && !slot.stop->stopped()) {
        // An end-of-generation token: release what the detokenizer held back (an unfinished character).
        ev.text = slot.stop->push(slot.detok->flush());
        ev.text += slot.stop->flush();
    }
    ev.logprobs = std::move(slot.pending_lp);
    slot.stream->push(std::move(ev));
    end(slot, reason);
}

void Scheduler::fail(Slot &slot, const Status &status) {
    slot.failed = true;
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::error;
    ev.error = status;
    slot.stream->push(std::move(ev));
    end(slot, FinishReason::error);
}

// The request is over (its last event sent, or cancelled); the slot is freed once no step holds it.
void Scheduler::end(Slot &slot, FinishReason reason) {
    slot.ended = true;
    stats_.n_finished[static_cast<int>(reason)]++;
    release_if_idle(slot);
}

void Scheduler::release_if_idle(Slot &slot) {
    if (!slot.active() || !slot.ended || slot.n_in_flight > 0) return;
    // What the slot holds stays as its prompt cache, unless the request failed (the engine's state is then
    // not trusted) or did not want it cached.
    if (slot.failed || !slot.job.cache_prompt || slot.preempted ||
        static_cast<int32_t>(slot.fed.size()) != slot.n_past) {
        if (Status s = engine_.seq_clear(slot.seq); !s.ok())
            log_warn("server: clearing slot {} failed: {}", slot.seq, s.message());
        slot.fed.clear();
    }
    slot.t_idle = Clock::now();
    slot.preempted = false;
    slot.stream.reset();
    slot.detok.reset();
    slot.stop.reset();
    slot.pending_lp.clear();
    slot.generating = false;
    slot.ended = false;
    stats_.n_active--;
}

}  // namespace td::server
