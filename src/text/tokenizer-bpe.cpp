// Byte-level BPE, as llama.cpp's llm_tokenizer_bpe_session:
//   1. the text is decoded to code points (invalid UTF-8 -> U+FFFD) and cut into words by the pre-tokenizer;
//   2. each word is re-encoded as UTF-8 and every byte replaced by its GPT-2 character (unicode.h), so the
//      vocabulary and the merges only ever see printable characters ("Ġthe" for " the");
//   3. within a word, the adjacent pair of symbols with the lowest merge rank is merged, leftmost first on
//      ties, until no adjacent pair has a rank (with ignore_merges, a word that is a token is taken whole);
//   4. each final symbol is its token; a symbol that is not a token (possible only with merges whose result
//      is not in the vocabulary) falls back to the tokens of its single bytes, and bytes without one are
//      dropped, as llama.cpp does.
#include "text/tokenizer-bpe.h"

#include <queue>

#include "core/check.h"
#include "core/printable.h"
#include "text/unicode.h"

namespace td {

namespace {

struct Symbol {
    int32_t prev;   // live symbol to the left, -1 at the start
    int32_t next;   // ... to the right, -1 at the end
    size_t offset;  // into the word
    size_t n;       // bytes; 0 once merged into its left neighbour
};

struct Bigram {
    int32_t rank;
    int32_t left;
    int32_t right;
    size_t size;  // bytes of left + right when queued: symbols only grow, so a stale entry no longer matches
};

// std::priority_queue pops the largest: lowest rank first, then the leftmost.
struct BigramLess {
    bool operator()(const Bigram &a, const Bigram &b) const {
        return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
    }
};

}  // namespace

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::create(std::shared_ptr<const Vocab> vocab) {
    TD_ASSERT(vocab != nullptr && vocab->kind() == VocabKind::bpe);
    TD_ASSIGN_OR_RETURN(PreTokenizer pre, PreTokenizer::create(vocab->pre()));
    std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer(vocab, std::move(pre)));
    tok->ignore_merges_ = bpe_pre_defaults(vocab->pre()).ignore_merges;

    const std::vector<std::string> &merges = vocab->merges();
    tok->ranks_.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
        const std::string &m = merges[i];
        // llama.cpp splits at the first space after the first byte (a part may itself start with a space).
        const size_t space = m.size() < 2 ? std::string::npos : m.find(' ', 1);
        if (space == std::string::npos || space + 1 == m.size()) {
            return invalid_input("tokenizer.ggml.merges[{}] = '{}' is not two tokens separated by a space", i,
                                 printable(m));
        }
        if (i > static_cast<size_t>(INT32_MAX))
            return invalid_input("tokenizer.ggml.merges has too many entries");
        tok->ranks_.emplace(m, static_cast<int32_t>(i));  // a repeated merge keeps its first (lowest) rank
    }
    return tok;
}

int32_t BpeTokenizer::rank(std::string_view left, std::string_view right, std::string &scratch) const {
    scratch.assign(left);
    scratch += ' ';
    scratch += right;
    auto it = ranks_.find(scratch);
    return it == ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_fragment(std::string_view text, bool /*after_special*/,
                                   std::vector<int32_t> &out) const {
    std::vector<uint32_t> cpts;  // [n_cpts]
    unicode::decode_utf8(text, cpts);
    std::vector<size_t> lengths;  // [n_words] code points per word
    pre_.split(cpts, lengths);

    std::string word, utf8;
    size_t begin = 0;
    for (size_t len : lengths) {
        word.clear();
        for (size_t i = begin; i < begin + len; ++i) {
            utf8.clear();
            unicode::append_utf8(cpts[i], utf8);
            for (char b : utf8) word += unicode::byte_to_utf8(static_cast<uint8_t>(b));
        }
        begin += len;
        encode_word(word, out);
    }
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t> &out) const {
    const Vocab &v = vocab();
    if (word.empty()) return;
    if (ignore_merges_) {
        if (int32_t id = v.find(word); id >= 0) {
            out.push_back(id);
            return;
        }
    }

    std::vector<Symbol> symbols;  // [n_chars] of the word
    for (size_t off = 0; off < word.size();) {
        size_t n = std::min(unicode::utf8_len(word[off]), word.size() - off);
        auto index = static_cast<int32_t>(symbols.size());
        symbols.push_back({index - 1, off + n == word.size() ? -1 : index + 1, off, n});
        off += n;
    }

    std::string scratch;
    std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
    auto try_add = [&](int32_t left, int32_t right) {
        if (left < 0 || right < 0) return;
        const Symbol &l = symbols[left], &r = symbols[right];
        int32_t rk = rank(word.substr(l.offset, l.n), word.substr(r.offset, r.n), scratch);
        if (rk >= 0) queue.push({rk, left, right, l.n + r.n});
    };
    for (int32_t i = 1; i < static_cast<int32_t>(symbols.size()); ++i) try_add(i - 1, i);

    while (!queue.empty()) {
        const Bigram b = queue.top();
        queue.pop();
        Symbol &l = symbols[b.left];
        Symbol &r = symbols[b.right];
        if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
        l.n += r.n;
        r.n = 0;
        l.next = r.next;
        if (r.next >= 0) symbols[r.next].prev = b.left;
        try_add(l.prev, b.left);
        try_add(b.left, l.next);
    }

    for (int32_t i = 0; i != -1; i = symbols[i].next) {
        const std::string_view piece = word.substr(symbols[i].offset, symbols[i].n);
        if (int32_t id = v.find(piece); id >= 0) {
            out.push_back(id);
            continue;
        }
        for (char b : piece) {
            if (int32_t id = v.find(std::string_view(&b, 1)); id >= 0) out.push_back(id);
        }
    }
}

std::string BpeTokenizer::normal_piece(std::string_view text) const {
    std::vector<uint32_t> cpts;
    unicode::decode_utf8(text, cpts);
    std::string out;
    out.reserve(cpts.size());
    for (uint32_t c : cpts) {
        int b = unicode::utf8_to_byte(c);
        if (b >= 0) {
            out += static_cast<char>(b);
            continue;
        }
        // Not one of GPT-2's 256 byte characters: llama.cpp renders it visibly rather than dropping it.
        std::string utf8;
        unicode::append_utf8(c, utf8);
        out += "[UNK_BYTE_0x";
        for (char u : utf8) out += fmt::format("{:02x}", static_cast<uint8_t>(u));
        out += text;
        out += "]";
    }
    return out;
}

}  // namespace td
