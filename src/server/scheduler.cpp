#include "server/scheduler.h"

#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "model/chat-template.h"
#include "model/detokenizer.h"

namespace td::server {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto rate_window = std::chrono::seconds(5);  // tokens_per_second looks back this far
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

void RequestStream::push(StreamEvent event) {
    {
        std::lock_guard lock(mu_);
        events_.push_back(std::move(event));
    }
    cv_.notify_all();
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
    int32_t n_past = 0;       // positions in the cache (after the step in flight)
    int32_t limit = 0;        // tokens to generate at most
    int32_t n_generated = 0;
    int32_t last_token = -1;  // sampled, not yet decoded
    bool generating = false;  // the prompt is in; one decode row per step
    bool in_step = false;     // has rows in the step being computed
    std::unique_ptr<Detokenizer> detok;
    std::unique_ptr<StopStringMatcher> stop;
    std::vector<TokenLogprob> pending_lp;

    bool active() const { return stream != nullptr; }
};

Scheduler::Scheduler(Engine &engine, const Tokenizer &tokenizer, const SchedulerParams &params)
    : engine_(engine),
      tokenizer_(tokenizer),
      params_(params),
      n_ctx_(engine.n_ctx()),
      n_slots_(engine.n_seq()),
      lp_sampler_(SamplerParams{}, engine.n_vocab()) {
    params_.n_batch = std::max(params_.n_batch, n_slots_ + 1);
    params_.max_queue = std::max(params_.max_queue, 0);
    stats_.n_slots = n_slots_;
    thread_ = std::thread([this] { engine_main(); });
}

Scheduler::~Scheduler() {
    stop();
}

Result<std::shared_ptr<RequestStream>> Scheduler::submit(GenerationJob job) {
    const int32_t n_prompt = static_cast<int32_t>(job.prompt.size());
    if (n_prompt == 0) return invalid_input("the prompt is empty");
    TD_TRY(sampler_params_validate(job.sampling));
    if (job.max_tokens == 0 || job.max_tokens < -1)
        return invalid_input("max_tokens must be at least 1, got {}", job.max_tokens);
    for (int32_t t : job.prompt)
        if (!tokenizer_.vocab().is_valid(t))
            return invalid_input("token id {} is out of range (the vocabulary has {} tokens)", t,
                                 tokenizer_.vocab().n_tokens());
    if (job.max_tokens > 0 && static_cast<int64_t>(n_prompt) + job.max_tokens > n_ctx_)
        return invalid_input("prompt ({} tokens) plus max_tokens ({}) exceeds the context size {}", n_prompt,
                             job.max_tokens, n_ctx_);
    if (n_prompt >= n_ctx_)
        return invalid_input("prompt ({} tokens) leaves no room to generate in the context size {}", n_prompt,
                             n_ctx_);

    auto stream = std::make_shared<RequestStream>();
    stream->on_cancel_ = [this] {
        std::lock_guard lock(mu_);
        cv_.notify_all();
    };
    {
        std::lock_guard lock(mu_);
        if (stopping_) return make_error(ErrorKind::failed, "the server is shutting down");
        const int32_t n_free = n_slots_ - stats_.n_active;
        if (static_cast<int32_t>(queue_.size()) >= n_free + params_.max_queue)
            return make_error(ErrorKind::overloaded,
                              "the server is busy: {} requests are waiting for {} slots", queue_.size(),
                              n_slots_);
        queue_.push_back({std::move(job), stream, Clock::now()});
        stats_.n_queued = static_cast<int32_t>(queue_.size());
    }
    cv_.notify_all();
    return stream;
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

// Moves queued requests into free slots (engine thread, under mu_).
void Scheduler::admit(std::vector<Slot> &slots) {
    for (Slot &slot : slots) {
        if (queue_.empty()) break;
        if (slot.active()) continue;
        Pending p = std::move(queue_.front());
        queue_.pop_front();
        if (p.stream->cancelled()) {
            stats_.n_finished[static_cast<int>(FinishReason::cancelled)]++;
            continue;
        }
        const bool want_logits = p.job.n_logprobs >= 0;
        if (Status s = engine_.seq_start(slot.seq, p.job.sampling, want_logits); !s.ok()) {
            StreamEvent ev;
            ev.kind = StreamEvent::Kind::error;
            ev.error = s;
            p.stream->push(std::move(ev));
            stats_.n_finished[static_cast<int>(FinishReason::error)]++;
            continue;
        }
        const int32_t n_prompt = static_cast<int32_t>(p.job.prompt.size());
        slot.stream = std::move(p.stream);
        slot.job = std::move(p.job);
        slot.t_submit = p.t_submit;
        slot.order = admit_counter_++;
        slot.n_prefilled = 0;
        slot.n_past = 0;
        slot.n_generated = 0;
        slot.limit = slot.job.max_tokens > 0 ? slot.job.max_tokens : n_ctx_ - n_prompt;
        slot.last_token = -1;
        slot.generating = false;
        slot.in_step = false;
        slot.detok = std::make_unique<Detokenizer>(tokenizer_, Detokenizer::Start::continuation);
        slot.stop = std::make_unique<StopStringMatcher>(slot.job.stop);
        slot.pending_lp.clear();
        stats_.n_active++;
    }
    // Requests cancelled while waiting leave the queue now, not when they reach its head.
    const size_t before = queue_.size();
    std::erase_if(queue_, [](const Pending &p) { return p.stream->cancelled(); });
    stats_.n_finished[static_cast<int>(FinishReason::cancelled)] +=
        static_cast<int64_t>(before - queue_.size());
    stats_.n_queued = static_cast<int32_t>(queue_.size());
}

void Scheduler::engine_main() {
    std::vector<Slot> slots(n_slots_);
    for (int32_t i = 0; i < n_slots_; ++i) slots[i].seq = i;
    for (;;) {
        {
            std::unique_lock lock(mu_);
            for (Slot &slot : slots)
                if (slot.active() && slot.stream->cancelled()) {
                    stats_.n_finished[static_cast<int>(FinishReason::cancelled)]++;
                    release(slot);
                }
            if (!stopping_) admit(slots);
            const auto any_active = [&] {
                return std::any_of(slots.begin(), slots.end(), [](const Slot &s) { return s.active(); });
            };
            if (!stopping_ && !any_active()) {
                cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
                continue;  // admit (or stop) on the next turn
            }
            if (stopping_) {
                const Status bye = make_error(ErrorKind::failed, "the server is shutting down");
                for (Slot &slot : slots)
                    if (slot.active()) fail(slot, bye);
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
        }
        run_step(slots);
    }
}

// Builds, computes and dispatches one step. Returns false when the step failed.
bool Scheduler::run_step(std::vector<Slot> &slots) {
    Batch batch;
    for (Slot &slot : slots) {
        slot.in_step = false;
        if (!slot.active() || !slot.generating) continue;
        batch.add(slot.last_token, slot.n_past, slot.seq, true);
        slot.n_past++;
        slot.in_step = true;
    }
    // Prompt chunks fill the rest of the step, oldest request first.
    std::vector<Slot *> prefilling;
    for (Slot &slot : slots)
        if (slot.active() && !slot.generating) prefilling.push_back(&slot);
    std::sort(prefilling.begin(), prefilling.end(),
              [](const Slot *a, const Slot *b) { return a->order < b->order; });
    int64_t n_prompt_rows = 0;
    for (Slot *slot : prefilling) {
        const int32_t budget = params_.n_batch - batch.size();
        if (budget <= 0) break;
        const int32_t n_prompt = static_cast<int32_t>(slot->job.prompt.size());
        const int32_t n = std::min(budget, n_prompt - slot->n_prefilled);
        for (int32_t i = 0; i < n; ++i) {
            const int32_t p = slot->n_prefilled + i;
            batch.add(slot->job.prompt[p], p, slot->seq, p == n_prompt - 1);
        }
        slot->n_prefilled += n;
        slot->n_past += n;
        slot->in_step = true;
        n_prompt_rows += n;
    }
    if (batch.empty()) return true;

    // TODO(perf): with a pipelined engine (max_in_flight() > 1) queue the next step before waiting.
    const auto t0 = Clock::now();
    Status status = engine_.submit(batch);
    std::vector<StepOutput> outputs;
    if (status.ok()) {
        auto r = engine_.wait();
        if (r.ok()) {
            outputs = std::move(r).value();
        } else {
            status = r.status();
        }
    }
    const auto t1 = Clock::now();

    std::lock_guard lock(mu_);
    stats_.n_steps++;
    stats_.step_seconds += std::chrono::duration<double>(t1 - t0).count();
    if (!status.ok()) {
        log_warn("server: step of {} rows failed: {}", batch.size(), status.message());
        for (Slot &slot : slots)
            if (slot.active() && slot.in_step) fail(slot, status);
        return false;
    }
    stats_.n_prompt_tokens += n_prompt_rows;
    for (Slot *slot : prefilling)
        if (slot->n_prefilled == static_cast<int32_t>(slot->job.prompt.size())) slot->generating = true;
    int32_t n_sampled = 0;
    for (const StepOutput &out : outputs) {
        if (out.seq < 0 || out.seq >= n_slots_ || !slots[out.seq].active()) continue;
        on_token(slots[out.seq], out);
        n_sampled++;
    }
    stats_.n_generated_tokens += n_sampled;
    recent_.emplace_back(t1, n_sampled);
    while (!recent_.empty() && t1 - recent_.front().first > rate_window) recent_.pop_front();
    return true;
}

// One sampled token for a slot (engine thread, under mu_).
void Scheduler::on_token(Slot &slot, const StepOutput &out) {
    if (slot.n_generated == 0) {
        stats_.ttft_seconds_sum += std::chrono::duration<double>(Clock::now() - slot.t_submit).count();
        stats_.ttft_count++;
    }
    slot.n_generated++;
    const int32_t token = out.token;
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
    if (slot.job.n_logprobs >= 0 && static_cast<int32_t>(out.logits.size()) == engine_.n_vocab()) {
        TokenLogprob lp;
        lp.id = token;
        lp.piece = tokenizer_.token_to_piece(token);
        lp.logprob = lp_sampler_.token_logprob(out.logits.data(), token);
        for (const TokenProb &tp : lp_sampler_.top_logprobs(out.logits.data(), slot.job.n_logprobs))
            lp.top.push_back({tokenizer_.token_to_piece(tp.id), tp.logprob});
        slot.pending_lp.push_back(std::move(lp));
    }
    std::string text = slot.stop->push(slot.detok->push(token));
    const bool stopped = slot.stop->stopped();
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

void Scheduler::finish(Slot &slot, FinishReason reason) {
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::done;
    ev.finish = reason;
    ev.n_prompt = static_cast<int32_t>(slot.job.prompt.size());
    ev.n_generated = slot.n_generated;
    if (reason == FinishReason::stop && !slot.stop->stopped()) {
        // An end-of-generation token: release what the detokenizer held back (an unfinished character).
        ev.text = slot.stop->push(slot.detok->flush());
        ev.text += slot.stop->flush();
    }
    ev.logprobs = std::move(slot.pending_lp);
    slot.stream->push(std::move(ev));
    stats_.n_finished[static_cast<int>(reason)]++;
    release(slot);
}

void Scheduler::fail(Slot &slot, const Status &status) {
    StreamEvent ev;
    ev.kind = StreamEvent::Kind::error;
    ev.error = status;
    slot.stream->push(std::move(ev));
    stats_.n_finished[static_cast<int>(FinishReason::error)]++;
    release(slot);
}

void Scheduler::release(Slot &slot) {
    // The cache is cleared again by the next seq_start; clearing now returns the memory's meaning at once.
    if (Status s = engine_.seq_clear(slot.seq); !s.ok())
        log_warn("server: clearing slot {} failed: {}", slot.seq, s.message());
    slot.stream.reset();
    slot.detok.reset();
    slot.stop.reset();
    slot.pending_lp.clear();
    slot.generating = false;
    slot.in_step = false;
    stats_.n_active--;
}

}  // namespace td::server
