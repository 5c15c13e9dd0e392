// Grammar-constrained generation: a GBNF grammar (llama.cpp's notation) compiled into rules, and a matcher
// that says, byte by byte, whether a text can still become a sentence of the grammar. Walked over a TokenTrie
// (text/token-trie.h) it gives the tokens that may come next. Knows nothing about the server or sampling.
//
// The notation:
//   root  ::= greeting " " name "."       # a rule per line; `root` is where a sentence starts
//   greeting ::= "hello" | "hi"           # alternatives
//   name  ::= [A-Z] [a-z]* ("-" [A-Z] [a-z]+)?
//   digits ::= [0-9]{1,3} [^\n]+ .        # repetition: * + ? {m} {m,} {m,n}; [^...] a negated class;
//                                         # . any character
// Literals "..." and classes [...] are UTF-8 text with the escapes \n \r \t \\ \" \[ \] \- \xHH \uHHHH
// \UHHHHHHHH; a rule may continue on the next line after `::=`, after `|` and inside ( ). Rules that refer to
// themselves are fine unless a rule can reach itself before reading a character (left recursion), which
// compile refuses, as it refuses a rule used but not defined and a grammar without root.
//
// The matcher keeps every way the text read so far can continue (a set of stacks of grammar positions, as
// llama.cpp's grammar does); a token that splits a multi-byte character is accepted when some character
// with those first bytes could follow.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/token-trie.h"

namespace td {

struct GrammarElem {
    enum class Type : uint8_t {
        end,       // the end of an alternative
        rule_ref,  // rule `rule`
        chars,     // one character in `ranges`
        not_chars  // one character not in `ranges`
    };
    Type type = Type::end;
    uint32_t rule = 0;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive code point ranges

    bool matches(uint32_t cp) const;
    bool matches_any_in(uint32_t lo, uint32_t hi) const;  // some code point of [lo, hi]
};

class Grammar {
public:
    // Errors (invalid_input) say where: "grammar: line 2, column 9: expected '::='",
    // "grammar: rule 'name' is used but not defined", "grammar: left recursion in rule 'expr'".
    static Result<std::shared_ptr<const Grammar>> compile(std::string_view text);

    using Alternative = std::vector<GrammarElem>;  // ends with a Type::end element
    const std::vector<std::vector<Alternative>> &rules() const { return rules_; }
    uint32_t root() const { return root_; }
    const std::string &rule_name(uint32_t rule) const { return names_[rule]; }

private:
    std::vector<std::vector<Alternative>> rules_;  // [rule][alternative]
    std::vector<std::string> names_;               // [rule]; a group or repetition: "rule/id"
    uint32_t root_ = 0;
    friend struct GrammarParser;
};

// The incremental matcher. Copyable, and a copy assigned over another reuses its memory: the token mask tries
// each token on a copy, so a step allocates nothing once the copies have grown.
class GrammarMatcher {
public:
    explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
    GrammarMatcher(const GrammarMatcher &o) { *this = o; }
    GrammarMatcher &operator=(const GrammarMatcher &o);  // the state only, not the scratch
    GrammarMatcher(GrammarMatcher &&) = default;
    GrammarMatcher &operator=(GrammarMatcher &&) = default;

    // Feeds one byte of UTF-8; false (and the matcher not to be used further) when no sentence of the grammar
    // continues this way, or when more than kMaxStacks readings of the text stay open.
    bool feed(uint8_t c);
    bool feed(std::string_view bytes);
    // The text so far is a whole sentence: the generation may end here.
    bool can_end() const { return partial_left_ == 0 && can_end_; }
    // ... and nothing may follow it.
    bool must_end() const { return can_end() && ends_.size() == 1; }

    static constexpr size_t kMaxStacks = 1024;

    // The state as a value: the same set of stacks (in any order) and the same partial character.
    uint64_t state_hash() const;
    bool same_state(const GrammarMatcher &o) const;

private:
    static constexpr size_t kLinearDedupe = 32;
    // Expands work_ (a stack whose top may be a rule reference) into stacks whose tops are characters, each
    // appended to next_ once.
    void expand();
    void emit();
    void dedupe_next();  // next_: each stack once, when there are more than kLinearDedupe
    bool accept(uint32_t cp);
    bool can_take_in(uint32_t lo, uint32_t hi) const;

    std::shared_ptr<const Grammar> grammar_;
    // The stacks of grammar positions, one after another, each bottom to top (the top is the element to match
    // next); ends_[i] is where stack i ends. An empty stack: the sentence is complete.
    std::vector<const GrammarElem *> elems_;
    std::vector<uint32_t> ends_;
    std::vector<uint64_t> hashes_;  // [stack]: to find duplicates
    bool can_end_ = false;          // some stack is empty
    uint32_t partial_ = 0;          // a multi-byte character's bits so far
    uint8_t partial_left_ = 0;      // its continuation bytes still to come
    uint8_t partial_len_ = 0;       // its length in bytes
    // Scratch of accept (not copied): the next stacks, and the stack being expanded.
    std::vector<const GrammarElem *> next_elems_, work_;
    std::vector<uint32_t> next_ends_;
    std::vector<uint64_t> next_hashes_;
    std::vector<const GrammarElem *> tmp_elems_;  // dedupe_next
    std::vector<uint32_t> tmp_ends_, order_;
    std::vector<uint64_t> tmp_hashes_;
    bool next_can_end_ = false;
    bool overflow_ = false;  // too many stacks, or references too deep
    int expand_depth_ = 0;
    bool start_overflowed_ = false;  // compile refuses such a grammar
    friend class Grammar;
};

// The allowed-token masks of a matcher's recent states: text often returns to a state (every character inside
// a string, every item of a list), and then the mask is a copy instead of a walk of the trie.
class GrammarMasks {
public:
    explicit GrammarMasks(size_t capacity = 8) : capacity_(capacity) {}
    // The tokens m allows next ([n_tokens] 1 = allowed) and how many.
    const std::vector<uint8_t> &allowed(const TokenTrie &trie, const GrammarMatcher &m, size_t &n_allowed);
    void clear() { entries_.clear(); }
    size_t n_hits() const { return n_hits_; }
    size_t n_walks() const { return n_walks_; }

private:
    struct Entry {
        GrammarMatcher state;
        uint64_t hash = 0;
        std::vector<uint8_t> allowed;
        size_t n_allowed = 0;
        uint64_t last_used = 0;
    };
    size_t capacity_;
    std::vector<Entry> entries_;
    uint64_t clock_ = 0;
    size_t n_hits_ = 0, n_walks_ = 0;
};

}  // namespace td
