#include "text/grammar.h"

#include <algorithm>
#include <limits>
#include <map>

#include "core/check.h"

namespace td {

namespace {

constexpr uint32_t kUnbounded = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kMaxRepeat = 1000;     // {m,n}: m and n at most this
constexpr size_t kMaxElements = 1 << 20;  // every alternative's elements together
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr int kMaxGroupDepth = 64;     // ( ) inside ( )
constexpr int kMaxExpandDepth = 2048;  // rule references the matcher follows before a character

bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

GrammarElem char_elem(uint32_t lo, uint32_t hi) {
    GrammarElem e;
    e.type = GrammarElem::Type::chars;
    e.ranges.push_back({lo, hi});
    return e;
}

GrammarElem ref_elem(uint32_t rule) {
    GrammarElem e;
    e.type = GrammarElem::Type::rule_ref;
    e.rule = rule;
    return e;
}

}  // namespace

bool GrammarElem::matches(uint32_t cp) const {
    bool in = false;
    for (const auto &[lo, hi] : ranges) in = in || (cp >= lo && cp <= hi);
    return type == Type::chars ? in : type == Type::not_chars && !in;
}

bool GrammarElem::matches_any_in(uint32_t lo, uint32_t hi) const {
    if (type == Type::chars) {
        for (const auto &[a, b] : ranges)
            if (a <= hi && b >= lo) return true;
        return false;
    }
    if (type != Type::not_chars) return false;
    // Some code point of [lo, hi] outside every range: walk up from lo past the ranges covering it.
    uint64_t cur = lo;
    for (bool moved = true; moved && cur <= hi;) {
        moved = false;
        for (const auto &[a, b] : ranges)
            if (cur >= a && cur <= b) {
                cur = uint64_t{b} + 1;
                moved = true;
            }
    }
    return cur <= hi;
}

struct GrammarParser {
    std::string_view text;
    size_t pos = 0;
    Grammar g;
    std::map<std::string, uint32_t, std::less<>> ids;
    std::vector<bool> defined;
    std::vector<uint32_t> named_;  // [rule]: the rule a grammar names that it is part of
    size_t n_elements = 0;
    int group_depth = 0;

    Status error_at(size_t at, std::string_view what) const {
        size_t line = 1, col = 1;
        for (size_t i = 0; i < at && i < text.size(); ++i) {
            if (text[i] == '\n') {
                ++line;
                col = 1;
            } else {
                ++col;
            }
        }
        return invalid_input("grammar: line {}, column {}: {}", line, col, what);
    }
    bool eof() const { return pos >= text.size(); }
    char peek(size_t ahead = 0) const { return pos + ahead < text.size() ? text[pos + ahead] : '\0'; }

    void skip_space(bool newline_ok) {
        while (!eof()) {
            const char c = peek();
            if (c == ' ' || c == '\t') {
                ++pos;
            } else if (c == '#') {
                while (!eof() && peek() != '\n' && peek() != '\r') ++pos;
            } else if ((c == '\n' || c == '\r') && newline_ok) {
                ++pos;
            } else {
                break;
            }
        }
    }

    uint32_t rule_id(std::string_view name) {
        if (auto it = ids.find(name); it != ids.end()) return it->second;
        const auto id = static_cast<uint32_t>(g.rules_.size());
        ids.emplace(std::string(name), id);
        g.rules_.emplace_back();
        g.names_.emplace_back(name);
        named_.push_back(id);
        defined.push_back(false);
        return id;
    }
    // A rule for a group or a repetition: named after the rule it is in, and not a name a grammar can use.
    uint32_t new_rule(uint32_t parent) {
        const auto id = static_cast<uint32_t>(g.rules_.size());
        g.rules_.emplace_back();
        const uint32_t named = named_[parent];
        g.names_.push_back(g.names_[named] + "/" + std::to_string(id));
        named_.push_back(named);
        defined.push_back(true);
        return id;
    }
    Status add_alternative(uint32_t rule, Grammar::Alternative alt) {
        n_elements += alt.size() + 1;
        if (n_elements > kMaxElements) return error_at(pos, "the grammar is too large");
        alt.push_back(GrammarElem{});
        g.rules_[rule].push_back(std::move(alt));
        return {};
    }

    Result<uint32_t> parse_hex(size_t n_digits) {
        uint32_t v = 0;
        for (size_t i = 0; i < n_digits; ++i) {
            const char c = peek();
            uint32_t d = 0;
            if (c >= '0' && c <= '9')
                d = static_cast<uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                d = static_cast<uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                d = static_cast<uint32_t>(c - 'A' + 10);
            else
                return error_at(pos, fmt::format("expected {} hex digits", n_digits));
            v = v * 16 + d;
            ++pos;
        }
        if (v > kMaxCodePoint) return error_at(pos, "the escape is past U+10FFFF");
        return v;
    }

    // One character of a literal or a class: an escape or a UTF-8 sequence.
    Result<uint32_t> parse_char() {
        if (eof()) return error_at(pos, "unexpected end of the grammar");
        const auto c = static_cast<uint8_t>(peek());
        if (c == '\\') {
            ++pos;
            const char e = peek();
            ++pos;
            switch (e) {
                case 'n':
                    return uint32_t{'\n'};
                case 'r':
                    return uint32_t{'\r'};
                case 't':
                    return uint32_t{'\t'};
                case '\\':
                case '"':
                case '[':
                case ']':
                case '-':
                case '^':
                    return static_cast<uint32_t>(e);
                case 'x':
                    return parse_hex(2);
                case 'u':
                    return parse_hex(4);
                case 'U':
                    return parse_hex(8);
                default:
                    return error_at(pos - 2, fmt::format("unknown escape '\\{}'", e));
            }
        }
        int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
        if (len == 0 || pos + static_cast<size_t>(len) > text.size()) return error_at(pos, "invalid UTF-8");
        uint32_t cp = len == 1 ? c : c & (0x7F >> len);
        for (int i = 1; i < len; ++i) {
            const auto b = static_cast<uint8_t>(text[pos + static_cast<size_t>(i)]);
            if ((b & 0xC0) != 0x80) return error_at(pos, "invalid UTF-8");
            cp = (cp << 6) | (b & 0x3F);
        }
        pos += static_cast<size_t>(len);
        return cp;
    }

    Result<uint32_t> parse_int() {
        const size_t start = pos;
        uint64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
            v = v * 10 + static_cast<uint64_t>(peek() - '0');
            if (v > kMaxRepeat)
                return error_at(start, fmt::format("repetition counts go up to {}", kMaxRepeat));
            ++pos;
        }
        if (pos == start) return error_at(pos, "expected a number");
        return static_cast<uint32_t>(v);
    }

    // seq[from, end) repeated min..max times (max kUnbounded: no limit).
    Status repeat(uint32_t rule, Grammar::Alternative &seq, size_t from, uint32_t min, uint32_t max) {
        const Grammar::Alternative x(seq.begin() + static_cast<std::ptrdiff_t>(from), seq.end());
        seq.resize(from);
        for (uint32_t i = 0; i < min; ++i) seq.insert(seq.end(), x.begin(), x.end());
        if (max == kUnbounded) {
            // r ::= x r | ε
            const uint32_t r = new_rule(rule);
            Grammar::Alternative more = x;
            more.push_back(ref_elem(r));
            TD_TRY(add_alternative(r, std::move(more)));
            TD_TRY(add_alternative(r, {}));
            seq.push_back(ref_elem(r));
        } else if (max > min) {
            // up to max - min more, nested so that there is one way to read them: r_k ::= x r_(k-1) | ε
            uint32_t prev = 0;
            for (uint32_t k = 0; k < max - min; ++k) {
                const uint32_t r = new_rule(rule);
                Grammar::Alternative more = x;
                if (k > 0) more.push_back(ref_elem(prev));
                TD_TRY(add_alternative(r, std::move(more)));
                TD_TRY(add_alternative(r, {}));
                prev = r;
            }
            seq.push_back(ref_elem(prev));
        }
        n_elements += seq.size();
        if (n_elements > kMaxElements) return error_at(pos, "the grammar is too large");
        return {};
    }

    Status parse_sequence(uint32_t rule, bool nested, Grammar::Alternative &seq) {
        size_t last_start = seq.size();
        bool has_last = false;
        while (!eof()) {
            const char c = peek();
            const size_t start = seq.size();
            if (c == '"') {
                ++pos;
                while (peek() != '"') {
                    if (eof()) return error_at(pos, "unterminated literal");
                    TD_ASSIGN_OR_RETURN(uint32_t cp, parse_char());
                    seq.push_back(char_elem(cp, cp));
                }
                ++pos;
            } else if (c == '[') {
                ++pos;
                GrammarElem e;
                e.type = GrammarElem::Type::chars;
                if (peek() == '^') {
                    ++pos;
                    e.type = GrammarElem::Type::not_chars;
                }
                while (peek() != ']') {
                    if (eof()) return error_at(pos, "unterminated character class");
                    TD_ASSIGN_OR_RETURN(uint32_t lo, parse_char());
                    uint32_t hi = lo;
                    if (peek() == '-' && peek(1) != ']' && pos + 1 < text.size()) {
                        ++pos;
                        const size_t at = pos;
                        TD_ASSIGN_OR_RETURN(hi, parse_char());
                        if (hi < lo) return error_at(at, "the range's end is before its start");
                    }
                    e.ranges.push_back({lo, hi});
                }
                ++pos;
                seq.push_back(std::move(e));
            } else if (c == '.') {
                ++pos;
                GrammarElem e;
                e.type = GrammarElem::Type::not_chars;  // nothing excluded: any character
                seq.push_back(std::move(e));
            } else if (is_word_char(c)) {
                const size_t name_start = pos;
                while (is_word_char(peek())) ++pos;
                seq.push_back(ref_elem(rule_id(text.substr(name_start, pos - name_start))));
            } else if (c == '(') {
                if (++group_depth > kMaxGroupDepth)
                    return error_at(pos, fmt::format("groups nest deeper than {}", kMaxGroupDepth));
                ++pos;
                skip_space(true);
                const uint32_t sub = new_rule(rule);
                TD_TRY(parse_alternates(sub, true));
                --group_depth;
                if (peek() != ')') return error_at(pos, "expected ')'");
                ++pos;
                seq.push_back(ref_elem(sub));
            } else if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (!has_last) return error_at(pos, fmt::format("'{}' follows nothing to repeat", c));
                ++pos;
                uint32_t min = c == '+' ? 1 : 0, max = c == '?' ? 1 : kUnbounded;
                if (c == '{') {
                    skip_space(nested);
                    if (peek() != ',') {
                        TD_ASSIGN_OR_RETURN(min, parse_int());
                    }
                    skip_space(nested);
                    max = min;
                    if (peek() == ',') {
                        ++pos;
                        skip_space(nested);
                        max = kUnbounded;
                        if (peek() != '}') {
                            TD_ASSIGN_OR_RETURN(max, parse_int());
                            skip_space(nested);
                        }
                    }
                    if (peek() != '}') return error_at(pos, "expected '}'");
                    ++pos;
                    if (max < min) return error_at(pos, "the repetition's maximum is below its minimum");
                }
                TD_TRY(repeat(rule, seq, last_start, min, max));
                has_last = false;  // "x**" is an error, as in llama.cpp
                skip_space(nested);
                continue;
            } else {
                break;
            }
            last_start = start;
            has_last = true;
            skip_space(nested);
        }
        return {};
    }

    Status parse_alternates(uint32_t rule, bool nested) {
        Grammar::Alternative seq;
        TD_TRY(parse_sequence(rule, nested, seq));
        TD_TRY(add_alternative(rule, std::move(seq)));
        while (peek() == '|') {
            ++pos;
            skip_space(true);
            seq.clear();
            TD_TRY(parse_sequence(rule, nested, seq));
            TD_TRY(add_alternative(rule, std::move(seq)));
        }
        return {};
    }

    Status parse() {
        skip_space(true);
        while (!eof()) {
            const size_t name_start = pos;
            while (is_word_char(peek())) ++pos;
            if (pos == name_start) return error_at(pos, "expected a rule name");
            const std::string_view name = text.substr(name_start, pos - name_start);
            skip_space(false);
            if (text.substr(pos, 3) != "::=") return error_at(pos, "expected '::='");
            pos += 3;
            skip_space(true);
            const uint32_t id = rule_id(name);
            if (defined[id]) return error_at(name_start, fmt::format("rule '{}' is defined twice", name));
            defined[id] = true;
            TD_TRY(parse_alternates(id, false));
            if (!eof() && peek() != '\n' && peek() != '\r')
                return error_at(pos, fmt::format("expected the end of the line, got '{}'", peek()));
            skip_space(true);
        }
        for (size_t r = 0; r < g.rules_.size(); ++r)
            if (!defined[r]) return invalid_input("grammar: rule '{}' is used but not defined", g.names_[r]);
        auto root = ids.find(std::string_view("root"));
        if (root == ids.end()) return invalid_input("grammar: there is no rule 'root'");
        g.root_ = root->second;
        return check_left_recursion();
    }

    // A rule that can reach itself before reading a character would make the matcher expand forever.
    Status check_left_recursion() const {
        const size_t n = g.rules_.size();
        std::vector<bool> nullable(n, false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < n; ++r) {
                if (nullable[r]) continue;
                for (const Grammar::Alternative &alt : g.rules_[r]) {
                    bool all = true;
                    for (const GrammarElem &e : alt)
                        if (e.type != GrammarElem::Type::end)
                            all = all && e.type == GrammarElem::Type::rule_ref && nullable[e.rule];
                    if (all) {
                        nullable[r] = true;
                        changed = true;
                        break;
                    }
                }
            }
        }
        // The rules each rule may start with.
        std::vector<std::vector<uint32_t>> first(n);
        for (size_t r = 0; r < n; ++r)
            for (const Grammar::Alternative &alt : g.rules_[r])
                for (const GrammarElem &e : alt) {
                    if (e.type != GrammarElem::Type::rule_ref) break;
                    first[r].push_back(e.rule);
                    if (!nullable[e.rule]) break;
                }
        std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
        for (size_t start = 0; start < n; ++start) {
            if (color[start] != 0) continue;
            std::vector<std::pair<uint32_t, size_t>> path = {{static_cast<uint32_t>(start), 0}};
            color[start] = 1;
            while (!path.empty()) {
                auto &[r, next] = path.back();
                if (next == first[r].size()) {
                    color[r] = 2;
                    path.pop_back();
                    continue;
                }
                const uint32_t to = first[r][next++];
                if (color[to] == 1)
                    return invalid_input(
                        "grammar: left recursion in rule '{}'{}: it can reach itself before reading a "
                        "character",
                        g.names_[named_[to]], named_[to] == to ? "" : " (in a group or repetition)");
                if (color[to] == 0) {
                    color[to] = 1;
                    path.push_back({to, 0});
                }
            }
        }
        return {};
    }
};

Result<std::shared_ptr<const Grammar>> Grammar::compile(std::string_view text) {
    GrammarParser p;
    p.text = text;
    TD_TRY(p.parse());
    auto g = std::make_shared<const Grammar>(std::move(p.g));
    if (GrammarMatcher(g).start_overflowed_)
        return invalid_input(
            "grammar: too many ways to begin, or rules that nest too deeply before the first "
            "character (at most {} readings, {} levels)",
            GrammarMatcher::kMaxStacks, kMaxExpandDepth);
    return g;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) {
    TD_ASSERT(grammar_ != nullptr, "a grammar matcher needs a grammar");
    // One stack per alternative of root, expanded.
    for (const Grammar::Alternative &alt : grammar_->rules()[grammar_->root()]) {
        work_.clear();
        if (alt[0].type != GrammarElem::Type::end) work_.push_back(&alt[0]);
        expand();
    }
    dedupe_next();
    elems_.swap(next_elems_);
    ends_.swap(next_ends_);
    hashes_.swap(next_hashes_);
    can_end_ = next_can_end_;
    start_overflowed_ = overflow_;
}

GrammarMatcher &GrammarMatcher::operator=(const GrammarMatcher &o) {
    if (this == &o) return *this;
    if (grammar_ != o.grammar_) grammar_ = o.grammar_;
    elems_ = o.elems_;
    ends_ = o.ends_;
    hashes_ = o.hashes_;
    can_end_ = o.can_end_;
    partial_ = o.partial_;
    partial_left_ = o.partial_left_;
    partial_len_ = o.partial_len_;
    return *this;
}

void GrammarMatcher::emit() {
    uint64_t h = 1469598103934665603ull;
    for (const GrammarElem *e : work_) h = (h ^ reinterpret_cast<uintptr_t>(e)) * 1099511628211ull;
    const size_t n = work_.size();
    // Few stacks (nearly always): a duplicate is found here; many: dedupe_next() sorts them once at the end.
    if (next_ends_.size() <= kLinearDedupe) {
        for (size_t i = 0; i < next_ends_.size(); ++i) {
            const uint32_t begin = i == 0 ? 0 : next_ends_[i - 1];
            if (next_hashes_[i] == h && next_ends_[i] - begin == n &&
                std::equal(work_.begin(), work_.end(), next_elems_.begin() + begin))
                return;  // already there
        }
    }
    if (next_ends_.size() >= 4 * kMaxStacks) {
        overflow_ = true;
        return;
    }
    next_elems_.insert(next_elems_.end(), work_.begin(), work_.end());
    next_ends_.push_back(static_cast<uint32_t>(next_elems_.size()));
    next_hashes_.push_back(h);
    next_can_end_ = next_can_end_ || n == 0;
}

void GrammarMatcher::dedupe_next() {
    const size_t n = next_ends_.size();
    if (n <= kLinearDedupe) return;
    auto span = [&](uint32_t i) {
        const uint32_t begin = i == 0 ? 0 : next_ends_[i - 1];
        return std::pair(next_elems_.begin() + begin, next_elems_.begin() + next_ends_[i]);
    };
    order_.resize(n);
    for (uint32_t i = 0; i < n; ++i) order_[i] = i;
    std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
        if (next_hashes_[a] != next_hashes_[b]) return next_hashes_[a] < next_hashes_[b];
        const auto [a0, a1] = span(a);
        const auto [b0, b1] = span(b);
        return std::lexicographical_compare(a0, a1, b0, b1);
    });
    tmp_elems_.clear();
    tmp_ends_.clear();
    tmp_hashes_.clear();
    for (size_t k = 0; k < n; ++k) {
        const uint32_t i = order_[k];
        const auto [i0, i1] = span(i);
        if (k > 0 && next_hashes_[order_[k - 1]] == next_hashes_[i]) {
            const auto [p0, p1] = span(order_[k - 1]);
            if (std::equal(p0, p1, i0, i1)) continue;
        }
        tmp_elems_.insert(tmp_elems_.end(), i0, i1);
        tmp_ends_.push_back(static_cast<uint32_t>(tmp_elems_.size()));
        tmp_hashes_.push_back(next_hashes_[i]);
    }
    next_elems_.swap(tmp_elems_);
    next_ends_.swap(tmp_ends_);
    next_hashes_.swap(tmp_hashes_);
    if (next_ends_.size() > kMaxStacks) overflow_ = true;
}

void GrammarMatcher::expand() {
    if (work_.empty() || work_.back()->type != GrammarElem::Type::rule_ref) {
        emit();
        return;
    }
    // Each reference followed is a level of recursion: a grammar whose references nest deeper than this
    // before a character (long runs of optional rules) is refused here rather than overflowing the stack.
    if (expand_depth_ >= kMaxExpandDepth || overflow_) {
        overflow_ = true;
        return;
    }
    ++expand_depth_;
    // The reference becomes what follows it, with each of its rule's alternatives on top.
    const GrammarElem *ref = work_.back();
    work_.pop_back();
    const bool more = (ref + 1)->type != GrammarElem::Type::end;
    if (more) work_.push_back(ref + 1);
    for (const Grammar::Alternative &alt : grammar_->rules()[ref->rule]) {
        const bool nonempty = alt[0].type != GrammarElem::Type::end;
        if (nonempty) work_.push_back(&alt[0]);
        expand();
        if (nonempty) work_.pop_back();
    }
    if (more) work_.pop_back();
    work_.push_back(ref);
    --expand_depth_;
}

bool GrammarMatcher::accept(uint32_t cp) {
    next_elems_.clear();
    next_ends_.clear();
    next_hashes_.clear();
    next_can_end_ = false;
    overflow_ = false;
    for (size_t i = 0; i < ends_.size(); ++i) {
        const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
        if (ends_[i] == begin || !elems_[ends_[i] - 1]->matches(cp)) continue;
        // The character is read: the top moves past it (an alternative's end pops it).
        work_.assign(elems_.begin() + begin, elems_.begin() + ends_[i]);
        const GrammarElem *after = work_.back() + 1;
        work_.pop_back();
        if (after->type != GrammarElem::Type::end) work_.push_back(after);
        expand();
    }
    dedupe_next();
    if (next_ends_.empty() || overflow_) return false;
    elems_.swap(next_elems_);
    ends_.swap(next_ends_);
    hashes_.swap(next_hashes_);
    can_end_ = next_can_end_;
    return true;
}

bool GrammarMatcher::can_take_in(uint32_t lo, uint32_t hi) const {
    for (size_t i = 0; i < ends_.size(); ++i) {
        const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
        if (ends_[i] > begin && elems_[ends_[i] - 1]->matches_any_in(lo, hi)) return true;
    }
    return false;
}

bool GrammarMatcher::feed(uint8_t c) {
    if (partial_left_ == 0) {
        if (c < 0x80) return accept(c);
        if (c >= 0xC2 && c <= 0xDF) {
            partial_len_ = 2;
            partial_ = c & 0x1Fu;
        } else if (c >= 0xE0 && c <= 0xEF) {
            partial_len_ = 3;
            partial_ = c & 0x0Fu;
        } else if (c >= 0xF0 && c <= 0xF4) {
            partial_len_ = 4;
            partial_ = c & 0x07u;
        } else {
            return false;
        }
        partial_left_ = static_cast<uint8_t>(partial_len_ - 1);
    } else {
        if ((c & 0xC0) != 0x80) return false;
        partial_ = (partial_ << 6) | (c & 0x3Fu);
        if (--partial_left_ == 0) {
            const uint32_t cp = partial_;
            const uint32_t min = partial_len_ == 3 ? 0x800 : partial_len_ == 4 ? 0x10000 : 0x80;
            if (cp < min || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
            return accept(cp);
        }
    }
    // The characters these first bytes may still become: not the overlong forms of shorter ones (E0 80..9F),
    // not past U+10FFFF, not a surrogate.
    const uint32_t shift = 6u * partial_left_;
    const uint32_t min = partial_len_ == 3 ? 0x800 : partial_len_ == 4 ? 0x10000 : 0x80;
    const uint32_t lo = std::max(partial_ << shift, min);
    const uint32_t hi = std::min((partial_ << shift) | ((1u << shift) - 1), kMaxCodePoint);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return false;
    return can_take_in(lo, hi);
}

bool GrammarMatcher::feed(std::string_view bytes) {
    for (char c : bytes)
        if (!feed(static_cast<uint8_t>(c))) return false;
    return true;
}

uint64_t GrammarMatcher::state_hash() const {
    uint64_t h = (uint64_t{partial_} << 8) | partial_left_;
    for (uint64_t s : hashes_) h += s * 0x9E3779B97F4A7C15ull;  // a sum: the stacks' order does not count
    return h;
}

bool GrammarMatcher::same_state(const GrammarMatcher &o) const {
    if (grammar_ != o.grammar_ || partial_ != o.partial_ || partial_left_ != o.partial_left_ ||
        ends_.size() != o.ends_.size())
        return false;
    // Each stack of this one is in o (the stacks of each are distinct, so equal counts make the sets equal).
    for (size_t i = 0; i < ends_.size(); ++i) {
        const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
        bool found = false;
        for (size_t k = 0; k < o.ends_.size() && !found; ++k) {
            const uint32_t obegin = k == 0 ? 0 : o.ends_[k - 1];
            found = o.hashes_[k] == hashes_[i] && o.ends_[k] - obegin == ends_[i] - begin &&
                    std::equal(elems_.begin() + begin, elems_.begin() + ends_[i], o.elems_.begin() + obegin);
        }
        if (!found) return false;
    }
    return true;
}

const std::vector<uint8_t> &GrammarMasks::allowed(const TokenTrie &trie, const GrammarMatcher &m,
                                                  size_t &n_allowed) {
    ++clock_;
    const uint64_t h = m.state_hash();
    for (Entry &e : entries_)
        if (e.hash == h && e.state.same_state(m)) {
            e.last_used = clock_;
            n_allowed = e.n_allowed;
            ++n_hits_;
            return e.allowed;
        }
    ++n_walks_;
    Entry *e = nullptr;
    if (entries_.size() < capacity_) {
        e = &entries_.emplace_back(Entry{m, h, {}, 0, 0});
    } else {
        e = &*std::min_element(entries_.begin(), entries_.end(),
                               [](const Entry &a, const Entry &b) { return a.last_used < b.last_used; });
        e->state = m;
        e->hash = h;
    }
    e->n_allowed = trie.allowed(m, e->allowed);
    e->last_used = clock_;
    n_allowed = e->n_allowed;
    return e->allowed;
}

}  // namespace td
