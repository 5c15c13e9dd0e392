// Detokenizer: token ids -> UTF-8 text, one id at a time, for streaming generated text.
//
// A token's piece may end inside a multibyte character (byte tokens <0xF0> <0x9F> <0x98> <0x80> spell one
// emoji). push() returns only text that is complete, valid UTF-8 and holds back a character that has begun
// but not ended; flush() returns what is left. Bytes that can never form a character (a stray continuation
// byte, an overlong form, a surrogate, a sequence cut off by another character or by flush()) become one
// U+FFFD per maximal ill-formed subpart, as Unicode recommends, and are emitted as soon as they are known
// to be bad. So the concatenation of every push() and the final flush() is always valid UTF-8.
//
// Leading space: SentencePiece vocabularies add a space in front of the text when encoding. When the
// detokenizer starts at the beginning of a text (Start::text, the default) and the vocabulary adds a space
// prefix, the first token that renders any text loses one leading space, so that decoding what
// encode(text) gave returns `text`. llama.cpp's llama_detokenize strips it from the first token too; it
// differs only when the first token is BOS: llama.cpp then lets the empty BOS take the strip and keeps the
// space, we skip BOS and strip (" Once" after <s> gives "Once", like SentencePiece's own decoder).
// Start::continuation is for ids that continue an earlier text (tokens generated after a prompt): nothing
// is stripped.
//
// Control and unknown tokens (BOS, EOS, ...) render as "" unless render_special.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "text/tokenizer.h"

namespace td {

class Detokenizer {
public:
    enum class Start {
        text,          // the first token starts the text
        continuation,  // the tokens continue text that was already shown
    };

    // `tokenizer` must outlive the detokenizer.
    explicit Detokenizer(const Tokenizer &tokenizer, Start start = Start::text, bool render_special = false);

    // Adds one token; returns the text that is now complete (possibly ""). id must be valid (asserted).
    std::string push(int32_t id);

    // Returns the held-back bytes (an unfinished character becomes U+FFFD) and starts over: the next push()
    // continues the same text (no leading space is stripped again).
    std::string flush();

    // Bytes held back waiting for the rest of a character (0..3).
    size_t n_pending() const { return pending_.size(); }

private:
    const Tokenizer &tokenizer_;
    bool render_special_;
    bool strip_space_;     // the next text-bearing piece loses one leading space
    std::string pending_;  // [0..3 bytes] the start of a character not yet complete
};

// Decodes a whole sequence: Detokenizer(tokenizer, start, render_special), every push(), then flush().
std::string detokenize(const Tokenizer &tokenizer, std::span<const int32_t> ids,
                       Detokenizer::Start start = Detokenizer::Start::text, bool render_special = false);

// Appends `bytes` to `out` as valid UTF-8: well-formed characters are copied, each maximal ill-formed
// subpart becomes U+FFFD. Returns how many trailing bytes were held back as the valid start of a character
// that `bytes` ends in the middle of (always 0 when final).
size_t utf8_append_valid(std::string_view bytes, bool final, std::string &out);

}  // namespace td
