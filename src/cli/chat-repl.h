// `tandem run --chat`: an interactive conversation with a chat model, like llama-cli's conversation mode.
//
// Reads one user message per line from `in` (a line ending in '\' continues on the next line), after a
// "> " prompt on `out`, and streams the assistant's reply to `out`, followed by a newline. Commands:
// "/reset" starts a new conversation (the system prompt stays), "/exit" or end of input (Ctrl-D) ends.
//
// The conversation grows in sequence slot 0 of the engine and its KV cache is kept between turns: each
// turn formats the whole conversation with the chat template, and when the text the cache already holds
// is a prefix of it (the usual case), only the new part is tokenized and decoded. Otherwise (templates
// that trim the reply, a reply cut by a stop string) the whole conversation is tokenized and decoded
// again from the start (an Engine cannot cut a sequence back to a common prefix).
//
// A reply ends at an end-of-generation token, at one of the template's end-of-turn texts, after n_predict
// tokens, or when the context is full. A turn that does not fit the context is refused with a message on
// stderr ("/reset to start over, or raise -c"); the conversation stays as it was.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "gguf/gguf.h"
#include "model/engine.h"
#include "model/sampler.h"
#include "text/tokenizer.h"

namespace td::cli {

struct ChatReplParams {
    std::string system_prompt;  // "" = no system message
    std::string template_name;  // "" = from the model's tokenizer.chat_template (chatml when absent)
    int32_t n_predict = -1;     // tokens per reply; -1 = until the end of the turn or a full context
    int32_t n_batch = 512;      // prompt tokens per forward call
};

// Runs the conversation until /exit or end of input. `file` is the model's GGUF (for
// tokenizer.chat_template); `sampling` must pass sampler_params_validate. Logs the chosen template and
// per-turn counts to stderr. Returns the process exit code: 0, or 1 (after printing the error) for an
// unknown template name or a failed step.
int chat_repl(Engine &engine, const gguf::File &file, const Tokenizer &tokenizer,
              const SamplerParams &sampling, const ChatReplParams &params, std::FILE *in, std::FILE *out);

}  // namespace td::cli
