// Tokenizer front end shared by all algorithms: the special-token partition, BOS/EOS and the piece cache.
#include "text/tokenizer.h"

#include "core/check.h"
#include "text/tokenizer-bpe.h"
#include "text/tokenizer-spm.h"

namespace td {

namespace {

// C isspace() in the "C" locale, which llama.cpp uses when stripping around special tokens.
bool is_ascii_space(char c) {
    return c == ' ' || (c >= '\t' && c <= '\r');
}

// A piece of the text being encoded: a special token already found, or a range of text still to encode.
struct Fragment {
    int32_t token = -1;  // >= 0: this special token; -1: text[offset, offset + length)
    size_t offset = 0;
    size_t length = 0;
};

// Cuts `text` at every occurrence of every special token's text, longest token first; a token found
// earlier in that order wins over shorter ones inside it. Same result as llama.cpp's
// tokenizer_st_partition.
std::vector<Fragment> partition_special(const Vocab &vocab, std::string_view text, bool parse_special) {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({-1, 0, text.size()});
    std::vector<Fragment> next;
    for (int32_t id : vocab.special_tokens()) {
        const TokenData &tok = vocab.token(id);
        if (!parse_special && (tok.attr & (token_attr::control | token_attr::unknown))) continue;
        const std::string_view needle = tok.text;
        TD_ASSERT(!needle.empty(), "special token {} has no text", id);

        next.clear();
        bool changed = false;
        for (const Fragment &f : frags) {
            if (f.token >= 0 || f.length < needle.size()) {
                next.push_back(f);
                continue;
            }
            size_t off = f.offset, len = f.length;
            while (len > 0) {
                size_t match = text.substr(0, off + len).find(needle, off);
                if (match == std::string_view::npos) {
                    next.push_back({-1, off, len});
                    break;
                }
                changed = true;
                size_t left_len = match - off;
                if (tok.attr & token_attr::lstrip) {
                    while (left_len > 0 && is_ascii_space(text[off + left_len - 1])) --left_len;
                }
                if (left_len > 0) next.push_back({-1, off, left_len});
                next.push_back({id, 0, 0});
                size_t right_off = match + needle.size();
                size_t right_len = off + len - right_off;
                if (tok.attr & token_attr::rstrip) {
                    while (right_len > 0 && is_ascii_space(text[right_off])) ++right_off, --right_len;
                }
                off = right_off;
                len = right_len;
            }
        }
        if (changed) frags.swap(next);
    }
    return frags;
}

}  // namespace

Tokenizer::Tokenizer(std::shared_ptr<const Vocab> vocab) : vocab_(std::move(vocab)) {
    TD_ASSERT(vocab_ != nullptr);
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::create(std::shared_ptr<const Vocab> vocab) {
    TD_ASSERT(vocab != nullptr);
    std::unique_ptr<Tokenizer> tok;
    switch (vocab->kind()) {
        case VocabKind::spm:
            tok = std::make_unique<SpmTokenizer>(std::move(vocab));
            break;
        case VocabKind::bpe: {
            TD_ASSIGN_OR_RETURN(tok, BpeTokenizer::create(std::move(vocab)));
            break;
        }
    }
    TD_ASSERT(tok != nullptr);
    tok->build_pieces();
    return tok;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
    const Vocab &v = *vocab_;
    std::vector<int32_t> out;
    out.reserve(text.size() / 3 + 4);
    if (add_special && v.add_bos()) out.push_back(v.bos());  // from_spec guarantees bos() >= 0 then

    bool after_special = true;  // the text start counts as "after a special token"
    for (const Fragment &f : partition_special(v, text, parse_special)) {
        if (f.token >= 0) {
            out.push_back(f.token);
            after_special = true;
        } else {
            encode_fragment(text.substr(f.offset, f.length), after_special, out);
            after_special = false;
        }
    }

    if (add_special && v.add_eos()) out.push_back(v.eos());
    return out;
}

const std::string &Tokenizer::token_to_piece(int32_t id, bool special) const {
    static const std::string empty;
    const TokenData &t = vocab_->token(id);  // asserts the id
    if (t.attr & (token_attr::control | token_attr::unknown)) return special ? t.text : empty;
    return pieces_[id];
}

void Tokenizer::build_pieces() {
    const Vocab &v = *vocab_;
    pieces_.assign(v.n_tokens(), std::string());
    for (int32_t id = 0; id < v.n_tokens(); ++id) {
        const TokenData &t = v.token(id);
        // Same precedence as llama.cpp's token_to_piece; control/unknown are handled at lookup time.
        if (t.attr & (token_attr::control | token_attr::unknown)) continue;
        if (t.attr & token_attr::user_defined) {
            pieces_[id] = t.text;
        } else if (t.attr & token_attr::normal) {
            pieces_[id] = normal_piece(t.text);
        } else if (t.attr & token_attr::byte) {
            pieces_[id] = std::string(1, static_cast<char>(v.token_byte(id)));
        }
        // unused and undefined tokens render as nothing
    }
}

}  // namespace td
