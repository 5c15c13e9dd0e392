// Tokenizer: text -> token ids, and one id -> its piece of text. One class per algorithm behind one
// interface: SentencePiece (tokenizer-spm.cpp) now, byte-level BPE (a tokenizer-bpe.cpp) next.
//
// encode(), for every algorithm, as llama.cpp's llama_tokenize:
//   1. Special-token partition. The text is cut at occurrences of special tokens' texts, taken longest
//      text first (Vocab::special_tokens()); each occurrence becomes that token's id directly. Control and
//      unknown tokens are matched only when parse_special is true; user-defined tokens always are (as
//      Hugging Face tokenizers do). A token with the rstrip/lstrip attribute also swallows the whitespace
//      after/before it.
//   2. Each remaining piece of text goes through the algorithm (encode_fragment below). SentencePiece puts
//      its space prefix before a piece that starts the text or follows a special token.
//   3. add_special: BOS first when vocab.add_bos(), EOS last when vocab.add_eos().
// Text is bytes; invalid UTF-8 is not an error (SentencePiece encodes such bytes with byte tokens).
//
// A Tokenizer is immutable after create() and may be shared by threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/vocab.h"

namespace td {

class Tokenizer {
public:
    // The tokenizer for vocab->kind(). ErrorKind::unimplemented for a kind this build cannot encode yet
    // ("tokenizer model 'gpt2' (BPE) is not implemented yet").
    static Result<std::unique_ptr<Tokenizer>> create(std::shared_ptr<const Vocab> vocab);

    virtual ~Tokenizer() = default;
    Tokenizer(const Tokenizer &) = delete;
    Tokenizer &operator=(const Tokenizer &) = delete;

    const Vocab &vocab() const { return *vocab_; }
    const std::shared_ptr<const Vocab> &vocab_ptr() const { return vocab_; }

    // Token ids for `text` (see the top of this file). Never fails.
    //   add_special:   add BOS / EOS as the vocabulary asks (add_bos_token / add_eos_token).
    //   parse_special: text such as "<s>" or "<|im_end|>" becomes that control token; when false it is
    //                  ordinary text.
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

    // The bytes token `id` stands for: a byte token <0xNN> gives that byte; a SentencePiece piece has its
    // U+2581 turned back into spaces; user-defined tokens give their text. Control and unknown tokens give
    // "" unless `special`, then their text ("<s>"). The piece may be part of a multibyte UTF-8 character.
    // id must be valid (asserted).
    const std::string &token_to_piece(int32_t id, bool special = false) const;

protected:
    explicit Tokenizer(std::shared_ptr<const Vocab> vocab);

    // Appends the ids of one piece of plain text (no special tokens left in it). `after_special`: the piece
    // starts the text or follows a special token (SentencePiece adds its space prefix then).
    virtual void encode_fragment(std::string_view text, bool after_special,
                                 std::vector<int32_t> &out) const = 0;

    // The piece of a normal token from its stored text (SentencePiece: U+2581 -> ' ').
    virtual std::string normal_piece(std::string_view text) const = 0;

    // Fills the piece cache; create() calls it once the object is complete.
    void build_pieces();

private:
    std::shared_ptr<const Vocab> vocab_;
    std::vector<std::string> pieces_;  // [n_tokens] token_to_piece(id, special = false)
};

}  // namespace td
