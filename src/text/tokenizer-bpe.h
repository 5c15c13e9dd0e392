// Byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2"). Internal to src/model: callers use
// Tokenizer::create().
#pragma once

#include <unordered_map>

#include "text/pre-tokenizer.h"
#include "text/tokenizer.h"

namespace td {

class BpeTokenizer final : public Tokenizer {
public:
    // Reads the merges ("left right", rank = position in tokenizer.ggml.merges) and picks the pre-tokenizer.
    // Errors: a merge that is not two non-empty parts separated by a space (ErrorKind::invalid_input), a
    // pre-tokenizer not implemented (ErrorKind::unimplemented).
    static Result<std::unique_ptr<BpeTokenizer>> create(std::shared_ptr<const Vocab> vocab);

protected:
    void encode_fragment(std::string_view text, bool after_special, std::vector<int32_t> &out) const override;
    std::string normal_piece(std::string_view text) const override;

private:
    BpeTokenizer(std::shared_ptr<const Vocab> vocab, PreTokenizer pre)
        : Tokenizer(std::move(vocab)), pre_(std::move(pre)) {}

    // Merges one byte-encoded word and appends its ids.
    void encode_word(std::string_view word, std::vector<int32_t> &out) const;
    int32_t rank(std::string_view left, std::string_view right, std::string &scratch) const;

    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    PreTokenizer pre_;
    bool ignore_merges_ = false;
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;  // "left right" -> rank
};

}  // namespace td
