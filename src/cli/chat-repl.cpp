#include "cli/chat-repl.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <vector>

#include "cli/common.h"
#include "text/chat-formatter.h"
#include "text/detokenizer.h"

namespace td::cli {
namespace {

// What one turn did, for the log line.
struct TurnStats {
    int32_t n_cached = 0;  // prompt tokens reused from the KV cache
    int32_t n_new = 0;     // prompt tokens decoded this turn
    int32_t n_generated = 0;
    double gen_seconds = 0.0;
    bool refused = false;  // the turn did not fit the context
};

class ChatSession {
public:
    ChatSession(Engine &engine, const Tokenizer &tokenizer, const SamplerParams &sampling,
                const ChatFormatter &chat, const ChatReplParams &params)
        : engine_(engine),
          tokenizer_(tokenizer),
          vocab_(tokenizer.vocab()),
          sampling_(sampling),
          chat_(chat),
          params_(params) {
        stops_ = chat.stop_strings();
    }

    // Starts a new conversation: empty cache, fresh sampler (the same seed repeats the same replies).
    Status reset() {
        messages_.clear();
        if (!params_.system_prompt.empty()) messages_.push_back({"system", params_.system_prompt});
        kv_tokens_.clear();
        kv_text_.clear();
        kv_text_known_ = true;
        n_drawn_ = 0;
        mirostat_mu_.reset();
        return engine_.seq_start(kSeq, sampling_);
    }

    // Adds the user's message and streams the reply to `out`.
    Result<TurnStats> turn(const std::string &user, std::FILE *out) {
        TurnStats st;
        messages_.push_back({"user", user});
        auto rendered = chat_.apply(messages_, nlohmann::json(), /*add_generation_prompt=*/true);
        if (!rendered.ok()) {
            messages_.pop_back();
            return rendered.status();
        }
        const std::string full = std::move(rendered).value();

        // The tokens to decode after the first n_keep tokens of the cache.
        std::vector<int32_t> fresh;
        const bool add_bos = vocab_.add_bos() && vocab_.bos() >= 0;
        size_t n_keep = 0;
        // A cache that lost its positions (a cluster that failed over) is decoded again from the start.
        const bool cached = engine_.seq_cached(kSeq) >= static_cast<int32_t>(kv_tokens_.size());
        if (kv_text_known_ && cached && full.starts_with(kv_text_)) {
            if (kv_tokens_.empty() && add_bos) fresh.push_back(vocab_.bos());
            const std::vector<int32_t> delta =
                tokenizer_.encode(std::string_view(full).substr(kv_text_.size()),
                                  /*add_special=*/false, /*parse_special=*/true);
            fresh.insert(fresh.end(), delta.begin(), delta.end());
            n_keep = kv_tokens_.size();
        } else {
            if (add_bos) fresh.push_back(vocab_.bos());
            const std::vector<int32_t> body = tokenizer_.encode(full, false, true);
            fresh.insert(fresh.end(), body.begin(), body.end());
        }
        const int32_t n_ctx = engine_.n_ctx();
        if (fresh.empty() || n_keep + fresh.size() >= static_cast<size_t>(n_ctx)) {
            std::fprintf(stderr,
                         "tandem: this turn needs %zu tokens but the context holds %d; /reset to start a new "
                         "conversation, or raise -c\n",
                         n_keep + fresh.size() + 1, n_ctx);
            messages_.pop_back();
            st.refused = true;
            return st;
        }

        // The sampler sees the conversation as the cache will hold it, this turn's new part included, as
        // llama-cli's sees every token it feeds (repeat penalties and DRY read them); a seeded conversation
        // goes on with the draws it would have made. The cache keeps its first n_keep positions.
        kv_tokens_.resize(n_keep);
        kv_tokens_.insert(kv_tokens_.end(), fresh.begin(), fresh.end());
        TD_TRY(engine_.seq_start(kSeq, sampling_, false, {kv_tokens_, n_drawn_, mirostat_mu_},
                                 static_cast<int32_t>(n_keep)));
        // Prefill the new part; only its last row wants an output (the reply's first token).
        Batch batch;
        std::vector<StepOutput> last;
        const size_t n_batch = static_cast<size_t>(std::max(1, params_.n_batch));
        for (size_t start = 0; start < fresh.size(); start += n_batch) {
            batch.clear();
            const size_t end = std::min(fresh.size(), start + n_batch);
            for (size_t i = start; i < end; ++i)
                batch.add(fresh[i], static_cast<int32_t>(n_keep + i), kSeq, i + 1 == fresh.size());
            TD_TRY(engine_.submit(batch));
            TD_ASSIGN_OR_RETURN(last, engine_.wait());
        }
        if (last.size() != 1)
            return make_error(ErrorKind::failed, "the engine returned {} outputs for the prompt",
                              last.size());
        ++n_drawn_;
        mirostat_mu_ = last.front().mirostat_mu;
        st.n_cached = static_cast<int32_t>(n_keep);
        st.n_new = static_cast<int32_t>(fresh.size());

        // Generate. The cache gets every reply token except an end-of-generation token, which the next
        // turn's text supplies (e.g. "<|im_end|>\n" in chatml). `raw` is the text of the tokens in the cache,
        // so that next turn the cache's text is known again when nothing disturbed it.
        const auto t0 = std::chrono::steady_clock::now();
        Detokenizer detok(tokenizer_, Detokenizer::Start::continuation);
        StopStringMatcher stop(stops_);
        std::string shown, raw;
        bool text_known = true;
        auto show = [&](const std::string &text) {
            if (text.empty()) return;
            std::fwrite(text.data(), 1, text.size(), out);
            std::fflush(out);
            shown += text;
        };
        while (params_.n_predict < 0 || st.n_generated < params_.n_predict) {
            const int32_t token = last.front().token;
            ++st.n_generated;
            if (vocab_.is_eog(token)) break;
            show(stop.push(detok.push(token)));
            if (stop.stopped()) {
                text_known = false;  // the cache lacks this token and the reply is cut inside it
                break;
            }
            const int32_t pos = static_cast<int32_t>(kv_tokens_.size());
            if (pos >= n_ctx) {
                std::fprintf(
                    stderr,
                    "\ntandem: the context of %d tokens is full; the reply was cut. /reset to start a "
                    "new conversation, or raise -c\n",
                    n_ctx);
                text_known = false;
                break;
            }
            // Decoded even when it is the last token we want, so the cache holds the whole reply.
            batch.clear();
            batch.add(token, pos, kSeq, true);
            TD_TRY(engine_.submit(batch));
            TD_ASSIGN_OR_RETURN(last, engine_.wait());
            if (last.size() != 1)
                return make_error(ErrorKind::failed, "the engine returned {} outputs for one token",
                                  last.size());
            ++n_drawn_;
            mirostat_mu_ = last.front().mirostat_mu;
            kv_tokens_.push_back(token);
            raw += tokenizer_.token_to_piece(token);
            if (vocab_.is_control(token)) text_known = false;  // renders as "" but sits in the cache
        }
        if (!stop.stopped()) {
            show(stop.push(detok.flush()));
            show(stop.flush());
        }
        st.gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

        messages_.push_back({"assistant", shown});
        kv_text_known_ = text_known && raw == shown;
        if (kv_text_known_) kv_text_ = full + raw;
        return st;
    }

private:
    static constexpr int32_t kSeq = 0;

    Engine &engine_;
    const Tokenizer &tokenizer_;
    const Vocab &vocab_;
    SamplerParams sampling_;
    const ChatFormatter &chat_;
    ChatReplParams params_;
    std::vector<std::string> stops_;

    std::vector<ChatMessage> messages_;
    std::vector<int32_t> kv_tokens_;  // [cached] the tokens in the cache of slot kSeq
    std::string kv_text_;             // the text kv_tokens_ came from, when kv_text_known_
    bool kv_text_known_ = true;
    uint64_t n_drawn_ = 0;  // tokens the conversation's sampler has drawn (SamplerHistory::n_drawn)
    std::optional<float> mirostat_mu_;  // its Mirostat threshold after the last draw
};

// One input line, without its end of line; false at end of input (a partial last line still counts).
bool read_line(std::FILE *in, std::string &line) {
    line.clear();
    int c = 0;
    bool any = false;
    while ((c = std::fgetc(in)) != EOF) {
        any = true;
        if (c == '\n') break;
        line.push_back(static_cast<char>(c));
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return any;
}

std::string_view trim_view(std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
}

}  // namespace

int chat_repl(Engine &engine, const gguf::File &file, const Tokenizer &tokenizer,
              const SamplerParams &sampling, const ChatReplParams &params, std::FILE *in, std::FILE *out) {
    auto chat = ChatFormatter::for_model(file, tokenizer.vocab(), params.template_name);
    if (!chat.ok()) return fail(chat.status());
    std::fprintf(stderr, "tandem: chat template %s (%s)\n", chat->name().c_str(), chat->reason().c_str());
    std::fprintf(stderr,
                 "tandem: type a message and Enter ('\\' at the end continues the line); /reset starts "
                 "over, /exit or Ctrl-D ends\n");

    ChatSession session(engine, tokenizer, sampling, *chat, params);
    if (Status s = session.reset(); !s.ok()) return fail(s);
    int32_t n_turn = 0;
    std::string line, message;
    for (;;) {
        std::fputs(message.empty() ? "> " : "", out);
        std::fflush(out);
        if (!read_line(in, line)) {
            if (!message.empty())
                line.clear();  // end of input after a '\': send what there is
            else
                break;
        } else if (!line.empty() && line.back() == '\\') {
            line.pop_back();
            message += line + "\n";
            continue;
        }
        message += line;
        const std::string_view text = trim_view(message);
        if (text == "/exit" || text == "/quit") break;
        if (text == "/reset") {
            if (Status s = session.reset(); !s.ok()) return fail(s);
            message.clear();
            std::fprintf(stderr, "tandem: the conversation was reset\n");
            continue;
        }
        if (text.empty()) {
            message.clear();
            continue;
        }
        auto st = session.turn(message, out);
        message.clear();
        if (!st.ok()) {
            std::fputc('\n', out);
            return fail(st.status());
        }
        if (st->refused) continue;
        std::fputc('\n', out);
        std::fflush(out);
        ++n_turn;
        std::fprintf(stderr,
                     "tandem: turn %d: prompt %d new tokens (%d cached) | reply %d tokens, %.2f tokens/s\n",
                     n_turn, st->n_new, st->n_cached, st->n_generated,
                     st->gen_seconds > 0 ? st->n_generated / st->gen_seconds : 0.0);
    }
    std::fputc('\n', out);
    std::fflush(out);
    return 0;
}

}  // namespace td::cli
