// Fill in the middle: the prompt of llama-server's POST /infill (and of Ollama's `suffix`), laid out as
// llama.cpp's server lays it out for a code model with FIM tokens (Qwen2.5-Coder, StarCoder, DeepSeek-Coder,
// CodeLlama, ...), so a model answers tandem what it answers llama-server:
//
//   [extra] [BOS] <FIM_PRE> prefix prompt <FIM_SUF> suffix <FIM_MID>
//
// extra: the repository-level context, when the vocabulary has the tokens for it (Qwen2.5-Coder's):
//   <FIM_REP>myproject\n <FIM_SEP>filename\n text ... <FIM_SEP>filename\n
// and otherwise each chunk after "\n\n--- snippet ---\n\n". With spm (llama-server's --spm-infill) the suffix
// part comes first: [extra] [BOS] <FIM_SUF> suffix <FIM_PRE> prefix prompt <FIM_MID>.
//
// What is kept when it is long, as llama-server keeps it: the last 3/4 n_batch tokens of the prefix, the
// first n_batch/4 - 2 - (prompt tokens) of the suffix, and of the extra context its last
// n_ctx - n_batch - 2 n_predict tokens (with n_predict -1: n_ctx - n_batch + 2).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace td::server {

struct InfillChunk {
    std::string filename = "tmp";
    std::string text;
};

struct InfillInput {
    std::string prefix;              // the text before the cursor
    std::string suffix;              // the text after it
    std::vector<InfillChunk> extra;  // other files of the project, most relevant last
};

struct InfillLimits {
    int32_t n_batch = 2048;  // llama-server's default
    int32_t n_predict = -1;  // the request's; -1: not given
    int32_t n_ctx = 0;       // a slot's context
    bool spm = false;        // suffix before prefix
};

// OK when the vocabulary has FIM prefix, suffix and middle tokens; otherwise unimplemented, naming what is
// missing as llama-server does: "Infill is not supported by this model: prefix token is missing. ..."
Status infill_supported(const Vocab &vocab);

// The prompt's tokens (infill_supported must hold: asserted). prompt: the request's own prompt, tokenized
// with special tokens parsed and nothing added; it continues the prefix.
std::vector<int32_t> infill_prompt(const Tokenizer &tokenizer, const InfillInput &in,
                                   std::span<const int32_t> prompt, const InfillLimits &limits);

}  // namespace td::server
