// Embeddings as llama-server, OpenAI and Ollama answer them: the inputs of a request, the normalizations, the
// base64 form. The vectors come from the scheduler (an embedding job's done event); the routes are in
// http-embeddings.cpp.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "text/tokenizer.h"

namespace td::server {

// An embeddings request's input: a string, a list of token ids, or a list whose items are strings or lists of
// token ids (OpenAI's `input`, llama-server's `content`, Ollama's `input`). Each item becomes one prompt;
// text is tokenized with the model's special tokens (BOS) and control tokens parsed, as a completion's prompt
// is. Errors (invalid_input): another shape, an empty list, an item that tokenizes to nothing, a token id
// outside the vocabulary.
Result<std::vector<std::vector<int32_t>>> embedding_inputs(const nlohmann::json &input, const Tokenizer &tok,
                                                           const char *field);

// llama.cpp's embd_normalize: -1 none, 0 scaled so the largest magnitude is 32760 (an int16 range), 1
// taxicab, 2 euclidean (the default), p > 2 the p-norm. A zero vector stays zero.
void normalize_embedding(std::vector<float> &v, int norm);

// The little-endian bytes of the floats, base64 (OpenAI's encoding_format "base64").
std::string base64_floats(const std::vector<float> &v);

}  // namespace td::server
