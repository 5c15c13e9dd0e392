#include "text/regex-grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "text/unicode.h"

namespace td {

namespace {

constexpr int kMaxDepth = 60;  // groups inside groups (the grammar allows 64)

// One character for a GBNF literal ("...") or class ([...]): raw UTF-8 unless it must be escaped. Not
// inlined: GCC 12 then sees string copies of impossible sizes and warns (-Wrestrict).
[[gnu::noinline]] void append_char(std::string &out, uint32_t cp, bool in_class) {
    const bool special =
        cp == '"' || cp == '\\' || (in_class && (cp == ']' || cp == '[' || cp == '-' || cp == '^'));
    if (special) {
        out += '\\';
        out += static_cast<char>(cp);
    } else if (cp < 0x20 || cp == 0x7F) {
        out += fmt::format("\\x{:02X}", cp);
    } else {
        unicode::append_utf8(cp, out);
    }
}

std::string literal(uint32_t cp) {
    std::string out(1, '"');
    append_char(out, cp, false);
    out.push_back('"');
    return out;
}

// Bytes as one GBNF literal.
std::string literal_of(std::string_view bytes) {
    std::string out(1, '"');
    for (unsigned char c : bytes) append_char(out, c, false);
    out.push_back('"');
    return out;
}

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive code point ranges

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'_', '_'}};
const Ranges kSpace = {{' ', ' '}, {'\t', '\r'}};  // \t \n \v \f \r

// The characters a JSON string cannot hold as they are, with the escapes a class lets them in by. Other
// control characters are written \u00XX as literals and not taken by classes.
const std::pair<uint32_t, const char *> kJsonEscapes[] = {
    {'"', "\\\""}, {'\\', "\\\\"}, {'\b', "\\b"}, {'\f', "\\f"}, {'\n', "\\n"}, {'\r', "\\r"}, {'\t', "\\t"}};

bool in_ranges(const Ranges &ranges, uint32_t cp) {
    for (const auto &[lo, hi] : ranges)
        if (cp >= lo && cp <= hi) return true;
    return false;
}

void append_ranges(std::string &out, const Ranges &ranges) {
    for (const auto &[lo, hi] : ranges) {
        append_char(out, lo, true);
        if (hi != lo) {
            out += '-';
            append_char(out, hi, true);
        }
    }
}

struct RegexParser {
    std::string_view re;
    bool json = false;  // the texts are the insides of JSON strings
    size_t pos = 0;
    int depth = 0;

    Status error(std::string_view what) const { return invalid_input("regex: at offset {}: {}", pos, what); }
    bool eof() const { return pos >= re.size(); }
    char peek(size_t ahead = 0) const { return pos + ahead < re.size() ? re[pos + ahead] : '\0'; }

    // One UTF-8 character of the pattern as a code point.
    Result<uint32_t> next_char() {
        const auto c = static_cast<uint8_t>(re[pos]);
        const int len = c < 0x80             ? 1
                        : (c & 0xE0) == 0xC0 ? 2
                        : (c & 0xF0) == 0xE0 ? 3
                        : (c & 0xF8) == 0xF0 ? 4
                                             : 0;
        if (len == 0 || pos + static_cast<size_t>(len) > re.size()) return error("invalid UTF-8");
        uint32_t cp = len == 1 ? c : c & (0x7Fu >> len);
        for (int i = 1; i < len; ++i) {
            const auto b = static_cast<uint8_t>(re[pos + static_cast<size_t>(i)]);
            if ((b & 0xC0) != 0x80) return error("invalid UTF-8");
            cp = (cp << 6) | (b & 0x3Fu);
        }
        // Overlong forms, surrogates and code points past U+10FFFF are not characters either.
        static constexpr uint32_t kMinOfLength[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMinOfLength[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return error("invalid UTF-8");
        pos += static_cast<size_t>(len);
        return cp;
    }

    Result<uint32_t> hex(size_t n) {
        uint32_t v = 0;
        for (size_t i = 0; i < n; ++i, ++pos) {
            const char c = peek();
            if (c >= '0' && c <= '9')
                v = v * 16 + static_cast<uint32_t>(c - '0');
            else if (c >= 'a' && c <= 'f')
                v = v * 16 + static_cast<uint32_t>(c - 'a' + 10);
            else if (c >= 'A' && c <= 'F')
                v = v * 16 + static_cast<uint32_t>(c - 'A' + 10);
            else
                return error(fmt::format("expected {} hex digits", n));
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return error("the escape is not a character");
        return v;
    }

    // After a backslash: a class shorthand's ranges (set, negated) or one character (cp).
    struct Escape {
        const Ranges *ranges = nullptr;
        bool negated = false;
        uint32_t cp = 0;
    };
    Result<Escape> escape() {
        if (eof()) return error("the pattern ends with a backslash");
        const char c = peek();
        ++pos;
        Escape e;
        switch (c) {
            case 'd':
                e.ranges = &kDigit;
                return e;
            case 'w':
                e.ranges = &kWord;
                return e;
            case 's':
                e.ranges = &kSpace;
                return e;
            case 'D':
                e.ranges = &kDigit, e.negated = true;
                return e;
            case 'W':
                e.ranges = &kWord, e.negated = true;
                return e;
            case 'S':
                e.ranges = &kSpace, e.negated = true;
                return e;
            case 'n':
                e.cp = '\n';
                return e;
            case 't':
                e.cp = '\t';
                return e;
            case 'r':
                e.cp = '\r';
                return e;
            case 'f':
                e.cp = '\f';
                return e;
            case 'v':
                e.cp = '\v';
                return e;
            case '0':
                e.cp = 0;
                return e;
            case 'x': {
                TD_ASSIGN_OR_RETURN(e.cp, hex(2));
                return e;
            }
            case 'u': {
                TD_ASSIGN_OR_RETURN(e.cp, hex(4));
                return e;
            }
            case 'b':
            case 'B':
                return error("word boundaries (\\b, \\B) are not supported");
            case 'A':
            case 'z':
            case 'Z':
                return error("anchors inside the pattern are not supported");
            default:
                break;
        }
        if (c >= '1' && c <= '9') return error("backreferences are not supported");
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return error(fmt::format("unknown escape '\\{}'", c));
        --pos;
        TD_ASSIGN_OR_RETURN(e.cp, next_char());  // escaped punctuation: itself
        return e;
    }

    // One character in (or, negated, not in) the ranges. In JSON mode the raw characters leave out what a
    // JSON string must escape, and the escapes of those the class holds are alternatives.
    Result<std::string> char_set(const Ranges &ranges, bool negated) const {
        std::string raw = negated ? "[^" : "[";
        if (!json || negated) {
            append_ranges(raw, ranges);
            if (json) append_ranges(raw, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
        } else {
            for (auto [lo, hi] : ranges) {  // cut the control characters, '"' and '\\' out
                lo = std::max<uint32_t>(lo, 0x20);
                for (uint32_t cut : {uint32_t{'"'}, uint32_t{'\\'}}) {
                    if (lo > hi) break;
                    if (cut < lo || cut > hi) continue;
                    if (cut > lo) append_ranges(raw, {{lo, cut - 1}});
                    lo = cut + 1;
                }
                if (lo <= hi) append_ranges(raw, {{lo, hi}});
            }
        }
        raw += ']';
        if (!json) return raw;
        std::vector<std::string> alts;
        if (raw != "[]") alts.push_back(std::move(raw));
        for (const auto &[cp, escape] : kJsonEscapes)
            if (in_ranges(ranges, cp) != negated) alts.push_back(literal_of(escape));
        if (alts.empty()) return error("the class holds no character a JSON string can");
        if (alts.size() == 1) return alts[0];
        std::string out = "(";
        for (size_t i = 0; i < alts.size(); ++i) {
            if (i > 0) out += " | ";
            out += alts[i];
        }
        out += ')';
        return out;
    }

    // One character as a literal; in JSON mode as a JSON string writes it.
    std::string char_literal(uint32_t cp) const {
        if (!json || (cp >= 0x20 && cp != '"' && cp != '\\')) return literal(cp);
        for (const auto &[c, escape] : kJsonEscapes)
            if (c == cp) return literal_of(escape);
        return literal_of(fmt::format("\\u{:04x}", cp));
    }

    // One member of a class at pos: an escape (a character or a shorthand's ranges) or a character.
    Result<Escape> class_char() {
        if (peek() == '\\') {
            ++pos;
            return escape();
        }
        Escape e;
        TD_ASSIGN_OR_RETURN(e.cp, next_char());
        return e;
    }

    Result<std::string> char_class() {
        ++pos;  // [
        bool negated = false;
        if (peek() == '^') {
            negated = true;
            ++pos;
        }
        Ranges ranges;
        bool first = true;
        while (eof() || peek() != ']' || first) {
            if (eof()) return error("unterminated character class");
            first = false;
            TD_ASSIGN_OR_RETURN(const Escape lo, class_char());
            if (lo.ranges != nullptr) {
                if (lo.negated) return error("\\D, \\W and \\S inside a class are not supported");
                ranges.insert(ranges.end(), lo.ranges->begin(), lo.ranges->end());
                continue;
            }
            uint32_t hi = lo.cp;
            if (peek() == '-' && peek(1) != ']' && pos + 1 < re.size()) {
                ++pos;
                TD_ASSIGN_OR_RETURN(const Escape end, class_char());
                if (end.ranges != nullptr) return error("a range cannot end with a class shorthand");
                hi = end.cp;
                if (hi < lo.cp) return error("the range's end is before its start");
            }
            ranges.emplace_back(lo.cp, hi);
        }
        ++pos;  // ]
        return char_set(ranges, negated);
    }

    // {m}, {m,}, {m,n} at pos; false (pos unchanged) when what follows { is not one: then it is a literal.
    bool quantifier_braces(std::string &out) {
        size_t p = pos + 1;
        auto digits = [&] {
            const size_t start = p;
            while (p < re.size() && re[p] >= '0' && re[p] <= '9' && p - start < 5) ++p;
            return re.substr(start, p - start);
        };
        const std::string_view m = digits();
        if (m.empty()) return false;
        std::string_view n = m;
        bool comma = false;
        if (p < re.size() && re[p] == ',') {
            comma = true;
            ++p;
            n = digits();
        }
        if (p >= re.size() || re[p] != '}') return false;
        out += fmt::format("{{{}{}{}}}", m, comma ? "," : "", comma ? n : std::string_view());
        pos = p + 1;
        return true;
    }

    Result<std::string> alternation() {
        TD_ASSIGN_OR_RETURN(std::string out, sequence());
        while (peek() == '|' && !eof()) {
            ++pos;
            TD_ASSIGN_OR_RETURN(std::string more, sequence());
            out += " | ";
            out += more;
        }
        return out;
    }

    Result<std::string> sequence() {
        std::string out;
        while (!eof() && peek() != '|' && peek() != ')') {
            TD_ASSIGN_OR_RETURN(std::string atom_text, atom());
            if (atom_text.empty()) continue;  // an anchor at an end
            // Quantifiers; a lazy or possessive mark after one matches the same texts.
            while (!eof()) {
                const char q = peek();
                if (q == '*' || q == '+' || q == '?') {
                    atom_text += q;
                    ++pos;
                } else if (q == '{' && quantifier_braces(atom_text)) {
                } else {
                    break;
                }
                if (peek() == '?' || peek() == '+') ++pos;
                if (peek() == '*' || peek() == '+' || peek() == '?' ||
                    (peek() == '{' && std::isdigit(static_cast<unsigned char>(peek(1)))))
                    return error("a quantifier follows a quantifier");
            }
            if (!out.empty()) out += ' ';
            out += atom_text;
        }
        return out;
    }

    Result<std::string> atom() {
        const char c = peek();
        if (c == '(') {
            if (++depth > kMaxDepth) return error(fmt::format("groups nest deeper than {}", kMaxDepth));
            ++pos;
            if (peek() == '?') {
                if (peek(1) == ':') {
                    pos += 2;
                } else if (peek(1) == '<' && peek(2) != '=' && peek(2) != '!') {
                    while (!eof() && peek() != '>') ++pos;  // a named group: the name does not matter
                    ++pos;
                } else if (peek(1) == 'P' && peek(2) == '<') {
                    while (!eof() && peek() != '>') ++pos;
                    ++pos;
                } else {
                    return error("lookarounds and group flags are not supported");
                }
            }
            TD_ASSIGN_OR_RETURN(std::string inner, alternation());
            if (peek() != ')' || eof()) return error("unbalanced '('");
            ++pos;
            --depth;
            return fmt::format("({})", inner);
        }
        if (c == '[') return char_class();
        if (c == '.') {
            ++pos;
            return char_set({{'\n', '\n'}}, true);
        }
        if (c == '^') {
            if (pos != 0) return error("'^' is supported only at the start");
            ++pos;
            return std::string();
        }
        if (c == '$') {
            ++pos;
            if (!eof()) return error("'$' is supported only at the end");
            return std::string();
        }
        if (c == '*' || c == '+' || c == '?') return error(fmt::format("'{}' follows nothing to repeat", c));
        if (c == '\\') {
            ++pos;
            TD_ASSIGN_OR_RETURN(Escape e, escape());
            if (e.ranges != nullptr) return char_set(*e.ranges, e.negated);
            return char_literal(e.cp);
        }
        TD_ASSIGN_OR_RETURN(uint32_t cp, next_char());
        return char_literal(cp);
    }
};

}  // namespace

Result<std::string> regex_to_gbnf_expression(std::string_view regex, bool json_string) {
    RegexParser p{regex, json_string};
    TD_ASSIGN_OR_RETURN(std::string body, p.alternation());
    if (!p.eof()) return p.error("unbalanced ')'");
    if (body.empty()) return std::string("\"\"");  // only the empty text
    return body;
}

Result<std::string> regex_to_gbnf(std::string_view regex) {
    TD_ASSIGN_OR_RETURN(std::string body, regex_to_gbnf_expression(regex, false));
    return fmt::format("root ::= {}\n", body);
}

Result<std::string> choices_to_gbnf(const std::vector<std::string> &choices) {
    if (choices.empty()) return invalid_input("the list of choices is empty");
    std::string out = "root ::= ";
    for (size_t i = 0; i < choices.size(); ++i) {
        if (i > 0) out += " | ";
        out += '"';
        for (unsigned char c : choices[i]) {
            if (c == '"' || c == '\\') out += '\\';
            if (c < 0x20 || c == 0x7F)
                out += fmt::format("\\x{:02X}", c);
            else
                out += static_cast<char>(c);
        }
        out += '"';
    }
    out += '\n';
    return out;
}

}  // namespace td
