#include "model/generate.h"

#include <algorithm>
#include <chrono>

namespace td {

const char *stop_reason_name(StopReason reason) {
    switch (reason) {
        case StopReason::length: return "length";
        case StopReason::eog: return "stop";
        case StopReason::context_full: return "context full";
        case StopReason::callback: return "stopped";
    }
    return "?";
}

Result<GenerateStats> generate(Engine &engine, const SamplerParams &sampling, const std::vector<int32_t> &prompt,
                               const GenerateParams &params, const std::function<bool(int32_t)> &is_eog,
                               const TokenCallback &on_token) {
    using clock = std::chrono::steady_clock;
    GenerateStats stats;
    const int32_t n_prompt = static_cast<int32_t>(prompt.size());
    if (n_prompt == 0) return invalid_input("the prompt is empty (no tokens)");
    if (n_prompt >= engine.n_ctx())
        return invalid_input("prompt has {} tokens but the context holds {}; raise -c or shorten the prompt", n_prompt,
                             engine.n_ctx());
    const int32_t n_batch = std::max(1, params.n_batch);
    const int32_t seq = params.seq;
    // The sampler sees the prompt first, as llama.cpp's does (repeat penalties and DRY read it). With
    // `pick`, the caller's sampler draws and has seen it (its own accept()).
    TD_TRY(engine.seq_start(seq, params.pick ? SamplerParams::plain_greedy() : sampling,
                            params.want_logits || params.pick != nullptr,
                            SamplerHistory{params.pick ? std::span<const int32_t>() : prompt, 0}));
    stats.n_prompt = n_prompt;

    // Prompt chunks go out back to back, up to the engine's depth, so pipeline stages overlap them.
    Batch batch;
    std::vector<StepOutput> last;
    int in_flight = 0;
    const auto t0 = clock::now();
    for (int32_t start = 0; start < n_prompt; start += n_batch) {
        batch.clear();
        const int32_t end = std::min(n_prompt, start + n_batch);
        for (int32_t i = start; i < end; ++i) batch.add(prompt[i], i, seq, i == n_prompt - 1);
        if (in_flight == engine.max_in_flight()) {
            TD_ASSIGN_OR_RETURN(last, engine.wait());
            --in_flight;
        }
        TD_TRY(engine.submit(batch));
        ++in_flight;
    }
    while (in_flight > 0) {
        TD_ASSIGN_OR_RETURN(last, engine.wait());
        --in_flight;
    }
    if (last.size() != 1) return make_error(ErrorKind::failed, "the engine returned {} outputs for the prompt", last.size());
    const auto t1 = clock::now();
    stats.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

    int32_t pos = n_prompt;
    if (params.n_predict == 0) return stats;
    // The history the drafts are looked up in: the prompt and every token sampled so far.
    std::vector<int32_t> history(prompt);
    std::vector<int32_t> draft;
    LookupDrafter lookup(params.draft);
    Drafter &drafter = params.drafter != nullptr ? *params.drafter : lookup;
    int32_t budget = params.pick ? 0 : params.draft.n_max;  // next_draft_budget
    for (;;) {
        int32_t token = -1;
        bool stop = false;
        int32_t n_rejected = 0;
        for (const StepOutput &out : last) {
            if (stop) break;
            if (out.token == StepOutput::kRejectedToken) {
                ++n_rejected;
                continue;
            }
            if (token >= 0) ++stats.n_accepted;  // an output after the first: its row's guess held
            token = out.token;
            if (params.pick) {
                if (static_cast<int32_t>(out.logits.size()) != engine.n_vocab())
                    return make_error(ErrorKind::failed, "the engine returned no logits to sample from");
                TD_ASSIGN_OR_RETURN(token, params.pick(out.logits.data()));
            }
            history.push_back(token);
            ++stats.n_generated;
            const bool keep_going = on_token(token, out.logits.empty() ? nullptr : out.logits.data());
            if (is_eog(token)) {
                stats.stop = StopReason::eog;
                stop = true;
            } else if (!keep_going) {
                stats.stop = StopReason::callback;
                stop = true;
            } else if (params.n_predict >= 0 && stats.n_generated >= params.n_predict) {
                stats.stop = StopReason::length;
                stop = true;
            }
        }
        if (stop) break;
        budget = next_draft_budget(budget, static_cast<int32_t>(draft.size()),
                                   static_cast<int32_t>(draft.size()) - n_rejected, params.draft.n_max);
        pos -= n_rejected;  // the rejected guesses' positions are written again
        if (pos >= engine.n_ctx()) {
            stats.stop = StopReason::context_full;
            break;
        }
        batch.clear();
        batch.add(token, pos++, seq, true);
        int32_t n = budget;
        if (params.n_predict >= 0) n = std::min(n, params.n_predict - stats.n_generated - 1);
        n = std::min(n, engine.n_ctx() - pos);
        draft.clear();
        if (n > 0) TD_TRY(drafter.draft(seq, history, n, draft));
        for (int32_t d : draft) batch.add_out(d, pos++, seq, kOutDraft);
        stats.n_drafted += static_cast<int32_t>(draft.size());
        ++stats.n_steps;
        TD_TRY(engine.submit(batch));
        TD_ASSIGN_OR_RETURN(last, engine.wait());
        if (last.size() != static_cast<size_t>(batch.size()))
            return make_error(ErrorKind::failed, "the engine returned {} outputs for {} rows", last.size(),
                              batch.size());
    }
    stats.gen_seconds = std::chrono::duration<double>(clock::now() - t1).count();
    return stats;
}

}  // namespace td
