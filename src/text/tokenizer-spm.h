// SentencePiece tokenizer (tokenizer.ggml.model = "llama"). Internal to src/model: callers use
// Tokenizer::create().
#pragma once

#include "text/tokenizer.h"

namespace td {

class SpmTokenizer final : public Tokenizer {
public:
    explicit SpmTokenizer(std::shared_ptr<const Vocab> vocab) : Tokenizer(std::move(vocab)) {}

protected:
    void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t> &out) const override;
    std::string normal_piece(std::string_view text) const override;
};

}  // namespace td
