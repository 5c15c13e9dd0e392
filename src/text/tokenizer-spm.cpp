// SentencePiece (BPE-style merging by score), as llama.cpp's llm_tokenizer_spm:
//   1. spaces become U+2581 "▁"; a "▁" is put in front when the vocabulary adds a space prefix and the
//      text starts the input or follows a special token;
//   2. the text is split into UTF-8 characters (a lead byte says how long; a stray continuation byte is a
//      character of its own; a truncated sequence at the end is cut short);
//   3. repeatedly merge the adjacent pair whose concatenation is a vocabulary token with the highest
//      score; equal scores merge the leftmost pair first;
//   4. each final symbol is its token, or, when the symbol is not in the vocabulary (only unmerged single
//      characters can be: every merge result is a token), one byte token <0xNN> per byte.
#include "text/tokenizer-spm.h"

#include <queue>

namespace td {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// Bytes of the UTF-8 sequence a byte starts, from its high nibble (continuation bytes count as 1).
size_t utf8_len(char c) {
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLen[static_cast<uint8_t>(c) >> 4];
}

struct Symbol {
    int32_t prev;   // index of the live symbol to the left, -1 at the start
    int32_t next;   // ... to the right, -1 at the end
    size_t offset;  // into the escaped text
    size_t n;       // bytes; 0 once merged into its left neighbour
};

struct Bigram {
    float score;
    int32_t left;
    int32_t right;
    size_t size;  // bytes of left + right when queued: a stale entry no longer matches
};

// std::priority_queue pops the largest: highest score first, then the leftmost.
struct BigramLess {
    bool operator()(const Bigram &a, const Bigram &b) const {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
};

}  // namespace

void SpmTokenizer::encode_fragment(std::string_view raw, bool after_special,
                                   std::vector<int32_t> &out) const {
    const Vocab &v = vocab();

    std::string text;  // escaped text: [bytes]
    text.reserve(raw.size() + 3 * 4);
    if (v.add_space_prefix() && after_special) text += kSpace;
    for (char c : raw) {
        if (c == ' ') {
            text += kSpace;
        } else {
            text += c;
        }
    }
    if (text.empty()) return;

    std::vector<Symbol> symbols;  // [n_chars]
    symbols.reserve(text.size());
    for (size_t off = 0; off < text.size();) {
        size_t n = std::min(utf8_len(text[off]), text.size() - off);
        auto index = static_cast<int32_t>(symbols.size());
        symbols.push_back({index - 1, off + n == text.size() ? -1 : index + 1, off, n});
        off += n;
    }

    std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
    auto try_add_bigram = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const size_t size = symbols[left].n + symbols[right].n;
        int32_t id = v.find(std::string_view(text).substr(symbols[left].offset, size));
        if (id < 0) return;
        queue.push({v.token_score(id), left, right, size});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add_bigram(i - 1, i);

    while (!queue.empty()) {
        Bigram b = queue.top();
        queue.pop();
        Symbol &left = symbols[b.left];
        Symbol &right = symbols[b.right];
        // Sizes only grow while a symbol lives, so an unchanged total means neither side has merged since.
        if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
        left.n += right.n;
        right.n = 0;
        left.next = right.next;
        if (right.next >= 0) symbols[right.next].prev = b.left;
        try_add_bigram(left.prev, b.left);
        try_add_bigram(b.left, left.next);
    }

    for (int32_t i = 0; i != -1; i = symbols[i].next) {
        const Symbol &s = symbols[i];
        std::string_view piece = std::string_view(text).substr(s.offset, s.n);
        int32_t id = v.find(piece);
        if (id >= 0) {
            out.push_back(id);
            continue;
        }
        for (char c : piece) {
            int32_t byte_id = v.byte_token(static_cast<uint8_t>(c));
            // A vocabulary without byte fallback: llama.cpp would abort here; we emit <unk>, or drop the
            // byte when there is no unknown token either.
            if (byte_id < 0) byte_id = v.unk();
            if (byte_id >= 0) out.push_back(byte_id);
        }
    }
}

std::string SpmTokenizer::normal_piece(std::string_view text) const {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        if (text.substr(i, kSpace.size()) == kSpace) {
            out += ' ';
            i += kSpace.size();
        } else {
            out += text[i++];
        }
    }
    return out;
}

}  // namespace td
