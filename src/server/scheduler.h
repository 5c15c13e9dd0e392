// Continuous batching: one engine thread drives an Engine for many requests at once.
//
// Slots: the engine's n_seq sequence slots; each active request owns one. Every iteration of the engine
// thread builds a step (one Batch):
//
//   [ one decode row per generating slot | prompt chunk(s) of slots still prefilling, up to n_batch rows ]
//
// submits it, waits for its sampled tokens and hands each token to its request. So running streams get a
// token per step while new prompts are absorbed a chunk at a time between them. The Engine computes each
// row independently of the rows beside it (batch-invariant kernels), so a request's tokens do not depend on
// what else was running: with a fixed seed it gets the text it gets alone.
//
// Micro-batches (a pipelined engine, e.g. a ClusterEngine over 2 workers): with n_micro_batches = D > 1 the
// scheduler keeps up to D steps in flight. The generating slots are dealt into steps of about ceil(G / D)
// decode rows; a slot is in at most one step at a time (its next row needs the token the step returns), so
// the groups take turns: while stage 2 computes group A, stage 1 computes group B. Prompt chunks of one slot
// may travel back to back in consecutive steps (they do not depend on each other's output). D = 1 (one
// machine) is the plain loop: submit, wait, repeat.
//
// Requests beyond the slots wait in a bounded FIFO queue (max_queue); beyond that, submit() returns
// ErrorKind::overloaded at once (the HTTP layer answers 503 + Retry-After). A request whose client went away
// (RequestStream::cancel) takes no new rows and gives its slot back as soon as no step in flight holds it.
// A failing step (a worker failure) ends every request that had rows in it with an error event; steps still
// in flight are drained (they fail with the same cause when the engine broke) before anything new is
// submitted; the others keep running and new requests are served again once the engine works (a
// ClusterEngine reconnects on the next seq_start).
//
// Structured output: a request with a schema (or a grammar) asks the engine for its logits (the engine
// samples greedily and its token is not used); the engine thread masks the logits with the schema's
// (grammar's) allowed tokens and draws with the request's own sampler, so a seeded request gives the same
// document on any engine, and a resumed one continues it (the matcher and the sampler live in the slot, not
// in the engine).
//
// Prefix cache (llama-server's prompt cache): a slot keeps the KV of its last request when it is freed. A new
// request goes to the free slot whose cached tokens share the longest prefix with its prompt and computes
// only the rest (engine seq_start with keep); the least recently freed slot otherwise. Idle caches count in
// the KV pool and are the first thing given back when it runs out. Batch-invariant kernels make a hit change
// nothing in the output. A running request's positions are shared too (as vLLM's prefix caching shares
// blocks): a new request whose prompt starts with what a running one was fed gets those positions copied
// into its own slot (engine seq_start with keep_from; only positions whose steps came back). When a running
// request is still computing a prompt the new one shares at least kShareWait more tokens of (the other
// choices of an n > 1 request, a long common system prompt), the queue waits for that prompt rather than
// computing it twice.
//
// Health: after a failure health() returns it until a step succeeds again; while idle and unhealthy the
// engine thread tries seq_start/seq_clear on a free slot every probe_interval, which is how a ClusterEngine
// reconnects without traffic. The optional probe (a cluster's per-node stats) runs on the engine thread
// about every probe_interval too.
//
// Embeddings: an embedding job is a prompt whose rows ask the engine for their final-normed hidden states
// (kOutEmbedding: every row for mean or no pooling, the first for cls, the last for last pooling); the
// scheduler pools them as the steps come back and ends the job when its last chunk does. It shares slots,
// steps, the queue, the KV pool and the prefix cache with generations (last pooling reuses a cached prefix,
// the others need every row computed).
//
// Text: the engine thread detokenizes (valid UTF-8 only) and applies the stop strings, so a slot is freed
// the moment a stop string appears; text that could be the start of a stop string is held back.
//
// The scheduler only uses the Engine interface: a LocalEngine or a ClusterEngine.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "model/draft.h"
#include "model/drafter.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "server/constrained.h"
#include "text/grammar.h"
#include "text/json-schema.h"
#include "text/tokenizer.h"

namespace td::server {

// One generation, as the HTTP layer hands it over (already tokenized and validated).
struct GenerationJob {
    std::vector<int32_t> prompt;    // non-empty token ids
    SamplerParams sampling;         // must pass sampler_params_validate
    int32_t max_tokens = -1;        // > 0; -1: until the context is full; 0: nothing (the prompt is scored)
    std::vector<std::string> stop;  // the reply ends before the first of these texts (empty ones ignored)
    int32_t n_logprobs = -1;  // -1: no logprobs; 0..20: the sampled token's logprob + that many top ones
    // The prompt's log-probabilities (OpenAI's echo with logprobs, vLLM's prompt_logprobs): -1 none; 0..20:
    // each prompt token's under the model given the tokens before it, and that many top ones, in
    // StreamEvent::prompt_logprobs before anything is generated. The prompt is computed whole (no prefix
    // cache).
    int32_t n_prompt_logprobs = -1;
    bool cache_prompt = true;  // reuse a slot's cached prefix of this prompt (llama-server's cache_prompt)
    int32_t n_draft = -1;      // tokens guessed per step (SchedulerParams::draft); -1: the server's n_max
    // Structured output: the reply is a JSON document this schema accepts (constrained sampling: only tokens
    // that keep it possible are drawn, and the reply ends when the document closes). Null: free text.
    std::shared_ptr<const JsonSchema> schema;
    // Grammar-constrained output (llama.cpp's "grammar"): the reply is a sentence of this grammar, and an
    // end-of-generation token may be drawn only where the sentence may end (the reply also ends where nothing
    // may follow). Null: none. At most one of schema and grammar.
    std::shared_ptr<const Grammar> grammar;
    // Embedding (/v1/embeddings): the job computes its prompt and ends with the prompt's embedding in its
    // done event, pooled this way, instead of generating (sampling, max_tokens and stop are not used). unset:
    // a generation.
    Pooling embed = Pooling::unset;
};

enum class FinishReason { stop, length, cancelled, error };
const char *finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct TokenAlternative {
    std::string piece;  // raw bytes of the token (may be part of a UTF-8 character)
    float logprob = 0.0f;
    int32_t id = -1;
};

// OpenAI logprobs of one generated token: log-softmax of the raw logits (no sampling filters).
struct TokenLogprob {
    int32_t id = 0;
    std::string piece;
    float logprob = 0.0f;               // the prompt's first token, which nothing predicts: NaN (JSON null)
    std::vector<TokenAlternative> top;  // best first
};

struct StreamEvent {
    enum class Kind { delta, done, error };
    Kind kind = Kind::delta;
    std::string text;                          // delta: new text (valid UTF-8, may be empty with logprobs)
    std::vector<TokenLogprob> logprobs;        // delta: tokens produced since the last event (when asked)
    // delta: the next prompt tokens with their log-probabilities (GenerationJob::n_prompt_logprobs), the
    // first one's NaN; all of them come before the first generated token's event.
    std::vector<TokenLogprob> prompt_logprobs;
    FinishReason finish = FinishReason::stop;  // done
    int32_t n_prompt = 0;                      // done: usage
    int32_t n_generated = 0;
    int32_t n_cached = 0;   // done: prompt tokens taken from the prefix cache (not computed)
    std::string stop_word;  // done: the stop string that ended the reply ("" when none did)
    // done, an embedding job: [n_embd] pooled, or [n_prompt * n_embd] (each token's) with Pooling::none; the
    // final-normed hidden states, not normalized.
    std::vector<float> embedding;
    Status error;  // error: what failed
};

// Wakes whoever waits on several streams at once (StreamSet): every event pushed to a stream watched by it
// bumps `count`.
struct StreamSignal {
    std::mutex mu;
    std::condition_variable cv;
    uint64_t count = 0;
};

// The channel between the engine thread (producer) and one HTTP handler (consumer). Thread-safe.
class RequestStream {
public:
    // Waits up to `timeout` for the next event; false on timeout. After a done or error event nothing
    // else arrives.
    bool next(StreamEvent &event, std::chrono::milliseconds timeout);
    // Every later event also bumps `signal` (one signal may watch many streams).
    void watch(std::shared_ptr<StreamSignal> signal);
    // The client went away: the engine thread frees the request's slot (or drops it from the queue) before
    // it builds the next step. Idempotent.
    void cancel();
    bool cancelled() const { return cancelled_.load(); }

private:
    friend class Scheduler;
    void push(StreamEvent event);

    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<StreamEvent> events_;
    std::shared_ptr<StreamSignal> signal_;  // guarded by mu_; null: none
    std::atomic<bool> cancelled_{false};
    std::function<void()> on_cancel_;  // wakes the engine thread; set before the stream is shared
};

// The streams of one request's choices (OpenAI's n > 1), read as one: next() hands out the next event of
// any of them, taking the streams in turn so that none waits behind another. Used by one thread.
class StreamSet {
public:
    explicit StreamSet(std::vector<std::shared_ptr<RequestStream>> streams);
    // Waits up to `timeout` for an event of a stream that has not ended; false on timeout or when every
    // stream has ended. `which` is the stream's index.
    bool next(size_t &which, StreamEvent &event, std::chrono::milliseconds timeout);
    void cancel();  // every stream
    size_t size() const { return streams_.size(); }
    bool ended() const { return n_ended_ == streams_.size(); }  // each stream gave its done or error event

private:
    std::vector<std::shared_ptr<RequestStream>> streams_;
    std::vector<bool> ended_;
    size_t n_ended_ = 0;
    size_t turn_ = 0;  // the stream looked at first next time
    std::shared_ptr<StreamSignal> signal_ = std::make_shared<StreamSignal>();
};

// What the engine runs on, for /health (a ClusterEngine's layout and the lost nodes it recovered from).
struct EngineInfo {
    std::string layout;                   // "" for one machine
    std::vector<std::string> recoveries;  // oldest first
};

struct SchedulerParams {
    int32_t n_batch = 512;   // rows per step (decode rows + prompt chunk); raised to n_seq + 1 if smaller
    int32_t max_queue = 16;  // requests waiting for a slot; 0: none wait (busy slots -> overloaded)
    int32_t n_micro_batches = 1;  // steps kept in flight (pipeline stages); clipped to engine.max_in_flight()
    // Engine-specific metrics (Prometheus lines), called on the engine thread about every probe_interval.
    // An error of kind disconnected marks the engine unhealthy (a worker went away while idle). Optional.
    std::function<Result<std::string>(Engine &)> probe;
    std::chrono::milliseconds probe_interval{1000};
    // The engine's layout and recoveries, read on the engine thread at start, with each probe and after a
    // resume. Optional.
    std::function<EngineInfo(Engine &)> describe;
    // Resuming after a lost node: when a step fails with kind disconnected, its requests do not end. Once the
    // steps in flight are drained, each affected sequence is started again (a ClusterEngine reconnects
    // there, onto the nodes it can reach) and its prompt plus every token it has generated is replayed as
    // one prompt; the stream then goes on where it stopped, and a greedy stream gives exactly the text of an
    // undisturbed run. When the engine cannot start again, the requests end with the original error. A
    // request resumes at most max_resumes times (0: never; every failure ends its requests at once).
    int32_t max_resumes = 0;
    // The KV pool: positions all slots may hold together (--ctx-size); 0: no bound beyond the slots. A request
    // is admitted (first come, first served) while the pool has room for its prompt and one more token; a
    // prompt longer than the whole pool is refused at submit. When the pool runs out mid-generation the newest
    // request is preempted: its positions are freed and it waits, then its prompt and tokens so far are
    // replayed (as a resume, so its text is what it would have been) once there is room again. A request
    // that alone needs more than the pool ends with an error naming the pool: never a hang.
    int64_t kv_pool = 0;
    // Speculative decoding by prompt lookup (draft.n_max 0: off): a generating request's decode row is
    // followed by up to n_max tokens guessed from its own history, checked in the same step; every guess
    // that holds is a token without a step of its own. The text is what it would be without guesses. Not
    // for structured output (the scheduler samples those itself).
    DraftParams draft;
    // Where the guesses come from (a draft model, model/drafter.h), driven on the engine thread; it must
    // outlive the scheduler. Null: prompt lookup.
    Drafter *drafter = nullptr;
};

struct SchedulerStats {
    int32_t n_slots = 0;
    int32_t n_active = 0;  // slots holding a request
    int32_t n_queued = 0;
    int64_t n_prompt_tokens = 0;     // prompt tokens computed
    int64_t n_prompt_cached = 0;     // prompt tokens a request found in the prefix cache (not computed)
    int64_t n_prompt_copied = 0;     // of them, copied from another request's slot
    int64_t n_generated_tokens = 0;  // tokens sampled
    int64_t n_steps = 0;
    double step_seconds = 0.0;      // total time from each step's submit to its outputs (overlaps when D > 1)
    double busy_seconds = 0.0;      // wall time with at least one step in flight
    double overhead_seconds = 0.0;  // engine thread outside submit/wait while busy (building, dispatching)
    double tokens_per_second = 0.0;  // generated tokens/s over the last few seconds
    int64_t n_finished[4] = {};      // by FinishReason
    double ttft_seconds_sum = 0.0;   // time to first token (from submit), summed over requests
    int64_t ttft_count = 0;
    int64_t n_resumed = 0;  // requests replayed after a lost node (max_resumes)
    int64_t kv_pool = 0;       // positions in the KV pool (0: not bounded)
    int64_t kv_used = 0;       // positions the slots hold now (a prompt's whole length from admission)
    int64_t n_preempted = 0;   // requests preempted because the pool ran out
    int64_t n_drafted = 0;     // tokens guessed by prompt lookup (SchedulerParams::draft)
    int64_t n_draft_accepted = 0;  // of them, the ones sampled
};

// One slot as /slots shows it (llama-server's fields), taken after each step.
struct SlotInfo {
    int32_t id = 0;
    bool processing = false;  // holds a request
    uint64_t task = 0;        // the request's admission number (the last one's while idle)
    int32_t n_prompt = 0;     // the request's prompt tokens
    int32_t n_cached = 0;     // of them, taken from a cache (not computed)
    int32_t n_processed = 0;  // of them, computed so far
    int32_t n_decoded = 0;    // tokens generated so far
    int32_t n_remain = 0;     // tokens it may still generate
    int32_t n_held = 0;       // positions the slot holds (its prompt cache while idle)
    SamplerParams sampling;   // the request's (the last one's while idle)
    int32_t max_tokens = -1;
    int32_t n_draft = 0;  // guesses per step at most (speculative decoding; 0: none)
};

class Scheduler {
public:
    // `engine` and `tokenizer` must outlive the scheduler; the engine is used only by the engine thread,
    // which starts here. Generation ends at the vocabulary's end-of-generation tokens (Vocab::is_eog).
    // The queue waits for a running prompt that would spare its head this many more tokens.
    static constexpr int32_t kShareWait = 32;

    Scheduler(Engine &engine, const Tokenizer &tokenizer, const SchedulerParams &params);
    ~Scheduler();  // stop()
    Scheduler(const Scheduler &) = delete;
    Scheduler &operator=(const Scheduler &) = delete;

    // Queues a job; its events arrive on the returned stream. Errors:
    //   invalid_input  empty prompt, bad sampling parameters, or the prompt plus max_tokens does not fit a
    //                  slot: "prompt (600 tokens) plus max_tokens (100) exceeds the context size 512"
    //   overloaded     the queue is full ("the server is busy: 4 requests are waiting for 1 slots")
    //   failed         the scheduler is stopped
    Result<std::shared_ptr<RequestStream>> submit(GenerationJob job);
    // Queues several jobs (the choices of one request) together: all of them or, with the same errors as
    // submit, none. More jobs than the slots plus the queue could ever hold is invalid_input.
    Result<std::vector<std::shared_ptr<RequestStream>>> submit_all(std::vector<GenerationJob> jobs);

    // Ends every request (error event "the server is shutting down") and joins the engine thread.
    void stop();

    SchedulerStats stats() const;
    std::vector<SlotInfo> slots() const;      // every slot, by id, as of the last step
    int32_t n_ctx() const { return n_ctx_; }  // positions per slot
    int32_t n_vocab() const { return n_vocab_; }  // the model's output rows (ids a logit bias may name)
    int32_t n_micro_batches() const { return depth_; }
    // OK, or the last engine failure (naming the node) until a step or a reconnect attempt succeeds.
    Status health() const;
    // The probe's last answer ("" without a probe or before it ran).
    std::string engine_metrics() const;
    EngineInfo engine_info() const;  // the last describe() (empty without one)

private:
    // submit's checks of one job (invalid_input naming what is wrong).
    Status check_job(const GenerationJob &job) const;
    struct Pending {
        GenerationJob job;
        std::shared_ptr<RequestStream> stream;
        std::chrono::steady_clock::time_point t_submit;
    };
    struct Slot;
    // A step submitted to the engine whose outputs have not been collected yet.
    struct InFlight {
        std::vector<int32_t> seqs;         // slots with rows in the step
        std::vector<int32_t> past;         // [seqs.size()] each slot's positions once the step is done
        std::vector<int32_t> prompt_done;  // slots whose last prompt chunk is in the step
        std::vector<int32_t> n_scored;     // [seqs.size()] each slot's score rows (its first outputs)
        int64_t n_prompt_rows = 0;
        int32_t n_rows = 0;
        std::chrono::steady_clock::time_point t_submit;
    };

    void engine_main();
    void admit();
    bool build_step(InFlight &step);
    void fill_pipeline(double &engine_seconds);
    void complete_step(double &engine_seconds);
    void on_step_failed(InFlight &step, const Status &status);
    bool resume_slots();  // true when some slot was due (started again or ended)
    // Starts a slot's sequence again with its prompt and tokens so far as the new prompt (engine thread,
    // without mu_: the engine may reconnect).
    Status restart(Slot &slot);
    // Positions of a slot that another request may copy: fed by steps that came back, still held.
    int32_t shareable(const Slot &slot) const;
    int64_t pool_held(const Slot &slot) const;  // positions a slot holds in the KV pool
    int64_t pool_used() const;                  // positions all slots hold
    int64_t pool_free() const;                  // room left in the pool (INT64_MAX without one)
    // Makes room for one more position of `slot` by preempting the newest other request not in flight, or
    // `slot` itself when it is the newest; false when nothing could be freed now.
    bool make_room(Slot &slot);
    // Clears the least recently used idle slot's cached prompt (not `except`); false when none holds one.
    bool evict_idle(const Slot *except);
    void resume_preempted();  // engine thread, without mu_
    // What the engine samples with for a slot: the request's parameters, or greedy with logits for a request
    // that the scheduler samples itself (structured output).
    SamplerParams engine_sampling(const GenerationJob &job) const;
    // Guesses per step a job may make at most: its speculative.n_max, else the server's --draft.
    int32_t draft_max(const GenerationJob &job) const {
        return job.n_draft >= 0 ? job.n_draft : params_.draft.n_max;
    }
    // Structured output or a grammar: the scheduler samples the job itself, from masked logits.
    static bool constrained(const GenerationJob &job) {
        return job.schema != nullptr || job.grammar != nullptr;
    }
    // Whole logits rows only where the head draws itself; logprobs come from the engine (n_probs).
    bool engine_logits(const GenerationJob &job) const { return constrained(job); }
    // Structured output or a grammar: the token the request's own sampler draws from the masked logits; -1
    // (and the slot failed) when no token of the vocabulary continues the document or the sentence.
    int32_t sample_constrained(Slot &slot, const StepOutput &out);
    void run_probe(bool idle);
    void refresh_info();  // engine thread, without mu_
    void publish_slots();  // engine thread, under mu_: slot_info_ from slots_
    void on_token(Slot &slot, const StepOutput &out);
    void on_prompt_score(Slot &slot, const StepOutput &out);  // a prompt token's log-probability
    void flush_prompt_logprobs(Slot &slot);                   // sends those not sent yet
    void on_embedding(Slot &slot, const StepOutput &out);  // an embedding job's row: pooled into the slot
    void finish_embedding(Slot &slot);                     // its prompt is in: the done event
    void finish(Slot &slot, FinishReason reason);
    void fail(Slot &slot, const Status &status);
    void end(Slot &slot, FinishReason reason);
    void release_if_idle(Slot &slot);

    Engine &engine_;
    const Tokenizer &tokenizer_;
    SchedulerParams params_;
    int32_t n_ctx_ = 0;
    int32_t n_vocab_ = 0;
    int32_t n_slots_ = 0;
    int32_t depth_ = 1;   // steps kept in flight
    Sampler lp_sampler_;  // only for its const logprob helpers
    std::unique_ptr<ConstraintVocab> constraint_vocab_;  // built at the first constrained request
    std::vector<int32_t> draft_;                    // scratch of build_step: one slot's guesses
    LookupDrafter lookup_;                          // the guesses where SchedulerParams::drafter is null
    int64_t stats_drafted_ = 0;  // guesses built since the last step came back (engine thread; to stats_)

    // Engine-thread state.
    std::vector<Slot> slots_;         // [n_slots]
    std::deque<InFlight> in_flight_;  // oldest first, at most depth_
    std::vector<InFlight> spare_;     // finished step records, reused (no allocation per step)
    Batch batch_;                     // the step being built, reused
    std::vector<Slot *> prefilling_;  // reused
    Status drain_error_;              // set: a step failed; drain in_flight_ before building more
    std::chrono::steady_clock::time_point t_probe_{};  // last probe (or reconnect attempt)

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
    bool stopping_ = false;
    SchedulerStats stats_;
    std::deque<std::pair<std::chrono::steady_clock::time_point, int32_t>> recent_;  // (step end, tokens)
    uint64_t admit_counter_ = 0;
    Status health_;
    std::string engine_metrics_;
    EngineInfo engine_info_;
    std::vector<SlotInfo> slot_info_;  // [n_slots], published by the engine thread

    std::thread thread_;
};

}  // namespace td::server
