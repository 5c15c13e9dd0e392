// Continuous batching: one engine thread drives an Engine for many requests at once.
//
// Slots: the engine's n_seq sequence slots; each active request owns one. Every iteration of the engine
// thread builds ONE Batch:
//
//   [ one decode row per generating slot | prompt chunk(s) of slots still prefilling, up to n_batch rows ]
//
// submits it, waits for its sampled tokens and hands each token to its request. So running streams get a
// token per step while new prompts are absorbed a chunk at a time between them. The Engine computes each
// row independently of the rows beside it (LocalEngine is batch-invariant), so a request's tokens do not
// depend on what else was running: with a fixed seed it gets the text it gets alone.
//
// Requests beyond the slots wait in a bounded FIFO queue (max_queue); beyond that, submit() returns
// ErrorKind::overloaded at once (the HTTP layer answers 503 + Retry-After). A request whose client went away
// (RequestStream::cancel) gives its slot back before the next step is built. A failing step (a worker
// failure, later) ends every request that had rows in it with an error event; the others keep running.
//
// Text: the engine thread detokenizes (valid UTF-8 only) and applies the stop strings, so a slot is freed
// the moment a stop string appears; text that could be the start of a stop string is held back.
//
// The scheduler only uses the Engine interface: a LocalEngine or (later) a ClusterEngine.
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
#include "model/engine.h"
#include "model/sampler.h"
#include "model/tokenizer.h"

namespace td::server {

// One generation, as the HTTP layer hands it over (already tokenized and validated).
struct GenerationJob {
    std::vector<int32_t> prompt;    // non-empty token ids
    SamplerParams sampling;         // must pass sampler_params_validate
    int32_t max_tokens = -1;        // > 0; -1: until the context is full
    std::vector<std::string> stop;  // the reply ends before the first of these texts (empty ones ignored)
    int32_t n_logprobs = -1;  // -1: no logprobs; 0..20: the sampled token's logprob + that many top ones
};

enum class FinishReason { stop, length, cancelled, error };
const char *finish_reason_name(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct TokenAlternative {
    std::string piece;  // raw bytes of the token (may be part of a UTF-8 character)
    float logprob = 0.0f;
};

// OpenAI logprobs of one generated token: log-softmax of the raw logits (no sampling filters).
struct TokenLogprob {
    int32_t id = 0;
    std::string piece;
    float logprob = 0.0f;
    std::vector<TokenAlternative> top;  // best first
};

struct StreamEvent {
    enum class Kind { delta, done, error };
    Kind kind = Kind::delta;
    std::string text;                          // delta: new text (valid UTF-8, may be empty with logprobs)
    std::vector<TokenLogprob> logprobs;        // delta: tokens produced since the last event (when asked)
    FinishReason finish = FinishReason::stop;  // done
    int32_t n_prompt = 0;                      // done: usage
    int32_t n_generated = 0;
    Status error;  // error: what failed
};

// The channel between the engine thread (producer) and one HTTP handler (consumer). Thread-safe.
class RequestStream {
public:
    // Waits up to `timeout` for the next event; false on timeout. After a done or error event nothing
    // else arrives.
    bool next(StreamEvent &event, std::chrono::milliseconds timeout);
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
    std::atomic<bool> cancelled_{false};
    std::function<void()> on_cancel_;  // wakes the engine thread; set before the stream is shared
};

struct SchedulerParams {
    int32_t n_batch = 512;   // rows per step (decode rows + prompt chunk); raised to n_seq + 1 if smaller
    int32_t max_queue = 16;  // requests waiting for a slot; 0: none wait (busy slots -> overloaded)
};

struct SchedulerStats {
    int32_t n_slots = 0;
    int32_t n_active = 0;  // slots holding a request
    int32_t n_queued = 0;
    int64_t n_prompt_tokens = 0;     // prompt tokens computed
    int64_t n_generated_tokens = 0;  // tokens sampled
    int64_t n_steps = 0;
    double step_seconds = 0.0;       // total time in submit + wait
    double tokens_per_second = 0.0;  // generated tokens/s over the last few seconds
    int64_t n_finished[4] = {};      // by FinishReason
    double ttft_seconds_sum = 0.0;   // time to first token (from submit), summed over requests
    int64_t ttft_count = 0;
};

class Scheduler {
public:
    // `engine` and `tokenizer` must outlive the scheduler; the engine is used only by the engine thread,
    // which starts here. Generation ends at the vocabulary's end-of-generation tokens (Vocab::is_eog).
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

    // Ends every request (error event "the server is shutting down") and joins the engine thread.
    void stop();

    SchedulerStats stats() const;
    int32_t n_ctx() const { return n_ctx_; }  // positions per slot

private:
    struct Pending {
        GenerationJob job;
        std::shared_ptr<RequestStream> stream;
        std::chrono::steady_clock::time_point t_submit;
    };
    struct Slot;

    void engine_main();
    void admit(std::vector<Slot> &slots);
    bool run_step(std::vector<Slot> &slots);
    void on_token(Slot &slot, const StepOutput &out);
    void finish(Slot &slot, FinishReason reason);
    void fail(Slot &slot, const Status &status);
    void release(Slot &slot);

    Engine &engine_;
    const Tokenizer &tokenizer_;
    SchedulerParams params_;
    int32_t n_ctx_ = 0;
    int32_t n_slots_ = 0;
    Sampler lp_sampler_;  // only for its const logprob helpers

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Pending> queue_;
    bool stopping_ = false;
    SchedulerStats stats_;
    std::deque<std::pair<std::chrono::steady_clock::time_point, int32_t>> recent_;  // (step end, tokens)
    uint64_t admit_counter_ = 0;

    std::thread thread_;
};

}  // namespace td::server
