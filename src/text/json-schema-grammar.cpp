#include "text/json-schema-grammar.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "text/regex-grammar.h"

namespace td {

using json = nlohmann::ordered_json;  // properties in the schema's order

namespace {

constexpr int kMaxDepth = 64;                             // schemas inside schemas ($ref aside: a rule)
constexpr int64_t kMaxMagnitude = 9'999'999'999'999'999;  // 16 digits, as JsonSchema's numbers
constexpr uint64_t kMaxRepeat = 1000;                     // the grammar's largest {m,n}
// A schema's work and grammar are bounded, so a request cannot keep the converter busy: subschemas visited
// (allOf and type lists copy theirs, so a schema can name more than it holds) and grammar text.
constexpr size_t kMaxVisits = 20000;
constexpr size_t kMaxGrammarBytes = 4 << 20;

// Bytes as a GBNF literal. Not inlined: GCC 12 then warns of impossible string copies (-Wrestrict).
[[gnu::noinline]] std::string lit(std::string_view bytes) {
    std::string out(1, '"');
    for (unsigned char c : bytes) {
        if (c == '"' || c == '\\') {
            out.push_back('\\');
            out.push_back(static_cast<char>(c));
        } else if (c < 0x20 || c == 0x7F) {
            out.append(fmt::format("\\x{:02X}", c));
        } else {
            out.push_back(static_cast<char>(c));
        }
    }
    out.push_back('"');
    return out;
}

std::string join(const std::vector<std::string> &parts, std::string_view sep) {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) out.append(sep);
        out.append(parts[i]);
    }
    return out;
}

// Alternatives as one expression.
std::string any_of(const std::vector<std::string> &alts) {
    return alts.size() == 1 ? alts[0] : fmt::format("({})", join(alts, " | "));
}

// e repeated min to max times (max < 0: no limit); "" when it may only be absent.
std::string repeat(const std::string &e, uint64_t min, int64_t max) {
    if (max == 0) return "";
    if (max > 0 && static_cast<uint64_t>(max) > kMaxRepeat) max = -1;
    if (min == 0 && max == 1) return e + "?";
    if (min == 0 && max < 0) return e + "*";
    if (min == 1 && max < 0) return e + "+";
    if (max < 0) return fmt::format("{}{{{},}}", e, min);
    if (min == static_cast<uint64_t>(max)) return min == 1 ? e : fmt::format("{}{{{}}}", e, min);
    return fmt::format("{}{{{},{}}}", e, min, max);
}

// ---- whole numbers in a range, as digits
// -------------------------------------------------------------------

std::string digit_class(char a, char b) {
    return a == b ? lit(std::string(1, a)) : fmt::format("[{}-{}]", a, b);
}

// The digit strings of lo's length from lo to hi (the same length, lo <= hi).
std::string digits_between(std::string_view lo, std::string_view hi) {
    if (lo.empty()) return "";
    const size_t rest = lo.size() - 1;
    const auto tail = [&](std::string e) {
        if (rest == 0) return e;
        return fmt::format("{} {}", e, rest == 1 ? "[0-9]" : fmt::format("[0-9]{{{}}}", rest));
    };
    if (lo[0] == hi[0]) {
        if (rest == 0) return lit(lo.substr(0, 1));
        return fmt::format("{} {}", lit(lo.substr(0, 1)), digits_between(lo.substr(1), hi.substr(1)));
    }
    const bool lo_rest_min = lo.find_first_not_of('0', 1) == std::string_view::npos;
    const bool hi_rest_max = hi.find_first_not_of('9', 1) == std::string_view::npos;
    std::vector<std::string> alts;
    char first = lo[0], last = hi[0];
    if (!lo_rest_min) {
        alts.push_back(fmt::format("{} {}", lit(lo.substr(0, 1)),
                                   any_of({digits_between(lo.substr(1), std::string(rest, '9'))})));
        ++first;
    }
    if (!hi_rest_max) --last;
    if (first <= last) alts.push_back(tail(digit_class(first, last)));
    if (!hi_rest_max)
        alts.push_back(fmt::format("{} {}", lit(hi.substr(0, 1)),
                                   any_of({digits_between(std::string(rest, '0'), hi.substr(1))})));
    return any_of(alts);
}

// Whole numbers from lo to hi (0 <= lo <= hi), written without leading zeros.
std::string naturals_between(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    int64_t low = 0;  // the smallest number of the length
    for (int len = 1; len <= 16 && low <= hi; ++len) {
        const int64_t high = len == 16 ? kMaxMagnitude : low == 0 ? 9 : low * 10 - 1;
        const int64_t a = std::max(lo, low);
        const int64_t b = std::min(hi, high);
        if (a <= b) alts.push_back(digits_between(std::to_string(a), std::to_string(b)));
        low = high + 1;
    }
    return any_of(alts);
}

// Integers from lo to hi (lo <= hi, both within 16 digits).
std::string integers_between(int64_t lo, int64_t hi) {
    std::vector<std::string> alts;
    if (lo < 0) alts.push_back(fmt::format("\"-\" {}", naturals_between(std::max<int64_t>(1, -hi), -lo)));
    if (hi >= 0) alts.push_back(naturals_between(std::max<int64_t>(0, lo), hi));
    return any_of(alts);
}

// ---- decimals between bounds, as digits
// -------------------------------------------------------------------------

constexpr int kMaxFractionDigits = 16;  // as the json-number rule

// A number's magnitude in decimal: its whole part, and its digits after the point without trailing zeros
// ("" for none), from the shortest text that reads back as the double: 0.1 is 0 and "1", as written.
struct Decimal {
    int64_t whole = 0;
    std::string fraction;
};

std::optional<Decimal> decimal_of(double magnitude) {
    magnitude = std::fabs(magnitude);  // (-0.0)
    if (magnitude >= static_cast<double>(kMaxMagnitude)) return Decimal{kMaxMagnitude, ""};
    const std::string text = fmt::format("{}", magnitude);  // "12.5", "1e-07", "1.5e-05"
    const size_t e = text.find_first_of("eE");
    const std::string mantissa = text.substr(0, e);
    const int exponent = e == std::string::npos ? 0 : std::atoi(text.c_str() + e + 1);
    const size_t dot = mantissa.find('.');
    std::string digits = mantissa;
    if (dot != std::string::npos) digits.erase(dot, 1);
    // The point sits `point` digits into `digits` (it may be before the first or past the last).
    const int64_t point = static_cast<int64_t>(dot == std::string::npos ? mantissa.size() : dot) + exponent;
    if (point > 16 || point < -kMaxFractionDigits) return std::nullopt;
    if (point <= 0) digits.insert(0, static_cast<size_t>(-point) + 1, '0');
    const size_t at = static_cast<size_t>(std::max<int64_t>(point, 1));
    if (digits.size() < at) digits.append(at - digits.size(), '0');
    Decimal d;
    d.whole = std::stoll(digits.substr(0, at));
    d.fraction = digits.substr(at);
    while (!d.fraction.empty() && d.fraction.back() == '0') d.fraction.pop_back();
    if (d.fraction.size() > static_cast<size_t>(kMaxFractionDigits)) return std::nullopt;
    return d;
}

// A bound on a fraction's digits: the bound's digits (trailing zeros dropped, "" is zero), strict when the
// bound itself is out.
struct FractionBound {
    std::string digits;
    bool strict = false;
};

// The digit strings of at most n digits whose value as a fraction (0.F) lies within lo and hi (either may be
// absent): whether the empty string (zero) is one, and an expression for the others ("" when there are none).
struct Fractions {
    bool zero = false;
    std::string digits;
};

Fractions fractions_between(std::optional<FractionBound> lo, std::optional<FractionBound> hi, int n) {
    if (lo && lo->digits.empty() && !lo->strict) lo.reset();  // at least zero: every fraction
    Fractions out;
    if (hi && hi->digits.empty() && hi->strict) return out;  // below zero: none
    out.zero = !lo && (!hi || !(hi->digits.empty() && hi->strict));
    if (n <= 0) return out;
    if (!lo && !hi) {
        out.digits = repeat("[0-9]", 1, n);
        return out;
    }
    if (!lo && hi->digits.empty()) {  // at most zero: zeros
        out.digits = repeat(R"("0")", 1, n);
        return out;
    }
    // The first digit e: between the bounds' first digits, any rest; equal to one of them, the rest within
    // that bound's rest.
    const auto first = [](const std::optional<FractionBound> &b) {
        return b->digits.empty() ? '0' : b->digits[0];
    };
    const auto rest = [](const std::optional<FractionBound> &b) -> std::optional<FractionBound> {
        if (!b) return std::nullopt;
        return FractionBound{b->digits.empty() ? "" : b->digits.substr(1), b->strict};
    };
    const int dl = lo ? first(lo) : '0' - 1;
    const int dh = hi ? first(hi) : '9' + 1;
    std::vector<std::string> alts;
    const auto then = [&](char e, const Fractions &tail) {
        if (tail.digits.empty()) {
            if (tail.zero) alts.push_back(lit(std::string(1, e)));
        } else {
            alts.push_back(
                fmt::format("{} ({}){}", lit(std::string(1, e)), tail.digits, tail.zero ? "?" : ""));
        }
    };
    if (dl > dh) return out;  // (lo above hi)
    if (lo)
        then(static_cast<char>(dl), fractions_between(rest(lo), dl == dh ? rest(hi) : std::nullopt, n - 1));
    if (dl + 1 <= dh - 1) {
        const std::string any_rest = repeat("[0-9]", 0, n - 1);
        const std::string cls = digit_class(static_cast<char>(dl + 1), static_cast<char>(dh - 1));
        alts.push_back(any_rest.empty() ? cls : fmt::format("{} {}", cls, any_rest));
    }
    if (hi && dh != dl) then(static_cast<char>(dh), fractions_between(std::nullopt, rest(hi), n - 1));
    out.digits = alts.empty() ? "" : any_of(alts);
    return out;
}

// ---- the converter
// ------------------------------------------------------------------------------------------

// The rules every grammar may use, each with the rules it needs.
struct Builtin {
    const char *name;
    const char *body;
    std::vector<const char *> needs;
};
const Builtin kBuiltins[] = {
    {"json-char", R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))", {}},
    {"json-string", R"("\"" json-char* "\"")", {"json-char"}},
    {"json-digits", R"("0" | [1-9] [0-9]{0,15})", {}},
    {"json-integer", R"("-"? json-digits)", {"json-digits"}},
    {"json-number", R"("-"? json-digits ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,2})?)", {"json-digits"}},
    {"json-boolean", R"("true" | "false")", {}},
    {"json-null", R"("null")", {}},
    {"json-value",
     "json-object | json-array | json-string | json-number | json-boolean | json-null",
     {"json-object", "json-array", "json-string", "json-number", "json-boolean", "json-null"}},
    {"json-member", R"(json-string ws ":" ws json-value)", {"json-string", "ws", "json-value"}},
    {"json-object", R"("{" ws (json-member (ws "," ws json-member)* ws)? "}")", {"json-member", "ws"}},
    {"json-array", R"("[" ws (json-value (ws "," ws json-value)* ws)? "]")", {"json-value", "ws"}},
    {"ws", nullptr, {}},  // [ \t\n\r]{0,max_whitespace}
    {"format-date", R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))", {}},
    {"format-time",
     R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ([Zz] | [+\-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))",
     {}},
    {"format-date-time", R"(format-date [Tt] format-time)", {"format-date", "format-time"}},
    {"format-uuid",
     R"([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12})",
     {}},
    {"format-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9])", {}},
    {"format-ipv4", R"(format-octet "." format-octet "." format-octet "." format-octet)", {"format-octet"}},
    {"format-email", R"([a-zA-Z0-9._%+\-]+ "@" [a-zA-Z0-9\-]+ ("." [a-zA-Z0-9\-]+)+)", {}},
};

const char *const kAnnotations[] = {"title",      "description",   "$schema", "$id",        "$comment",
                                    "default",    "examples",      "strict",  "readOnly",   "writeOnly",
                                    "deprecated", "discriminator", "$defs",   "definitions"};
const char *const kKeywords[] = {"type",
                                 "properties",
                                 "required",
                                 "additionalProperties",
                                 "items",
                                 "prefixItems",
                                 "additionalItems",
                                 "minItems",
                                 "maxItems",
                                 "minLength",
                                 "maxLength",
                                 "pattern",
                                 "format",
                                 "enum",
                                 "const",
                                 "anyOf",
                                 "oneOf",
                                 "allOf",
                                 "$ref",
                                 "nullable",
                                 "minimum",
                                 "maximum",
                                 "exclusiveMinimum",
                                 "exclusiveMaximum"};

bool one_of(std::string_view key, const auto &list) {
    return std::find_if(std::begin(list), std::end(list), [&](const char *k) { return key == k; }) !=
           std::end(list);
}

// A non-negative integer keyword's value, or `fallback` when absent.
Result<uint64_t> count_of(const json &s, const char *key, uint64_t fallback, const std::string &where) {
    auto v = s.find(key);
    if (v == s.end()) return fallback;
    if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
        return invalid_input("json_schema: {}: '{}' must be a non-negative integer", where, key);
    return v->get<uint64_t>();
}

struct Converter {
    const json &root;
    int max_ws;
    std::vector<std::pair<std::string, std::string>> rules;  // name, body; in the order written
    std::set<std::string> taken;
    std::map<std::string, std::string> ref_rules;  // a $ref's pointer -> its rule
    int depth = 0;
    size_t visits = 0;
    size_t grammar_bytes = 0;

    Converter(const json &r, int ws) : root(r), max_ws(ws) {
        for (const Builtin &b : kBuiltins) taken.insert(b.name);
        taken.insert("root");
    }

    // A builtin rule, written with what it needs the first time.
    std::string builtin(std::string_view name) {
        for (const Builtin &b : kBuiltins) {
            if (name != b.name) continue;
            if (std::none_of(rules.begin(), rules.end(), [&](const auto &r) { return r.first == name; })) {
                emit(b.name, b.body != nullptr ? b.body : fmt::format("[ \\t\\n\\r]{{0,{}}}", max_ws));
                for (const char *n : b.needs) builtin(n);
            }
            return b.name;
        }
        return std::string(name);
    }

    // A fresh rule name from a hint: letters, digits and '-'.
    std::string fresh(std::string_view hint) {
        std::string base;
        for (char c : hint) {
            const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
            if (ok)
                base.push_back(c);
            else if (!base.empty() && base.back() != '-')
                base.push_back('-');
        }
        while (!base.empty() && base.back() == '-') base.pop_back();
        if (base.size() > 40) base.resize(40);
        if (base.empty()) base = "r";
        std::string name = base;
        for (int i = 2; taken.count(name) != 0; ++i) name = fmt::format("{}-{}", base, i);
        taken.insert(name);
        return name;
    }

    void emit(std::string name, std::string body) {
        grammar_bytes += name.size() + body.size();
        rules.emplace_back(std::move(name), std::move(body));
    }

    std::string add(std::string_view hint, std::string body) {
        std::string name = fresh(hint);
        emit(name, std::move(body));
        return name;
    }

    Status unsupported(std::string_view key, const std::string &where) const {
        return invalid_input("json_schema: '{}' ({}) is not supported", key, where);
    }

    Status within_limits() const {
        if (visits > kMaxVisits)
            return invalid_input("json_schema: the schema is too large (over {} subschemas to write)",
                                 kMaxVisits);
        if (grammar_bytes > kMaxGrammarBytes)
            return invalid_input("json_schema: the schema's grammar is too large (over {} MiB)",
                                 kMaxGrammarBytes >> 20);
        return {};
    }

    Result<std::string> visit(const json &s, const std::string &hint, const std::string &where) {
        if (depth >= kMaxDepth) return invalid_input("json_schema: nested deeper than {} levels", kMaxDepth);
        ++visits;
        TD_TRY(within_limits());
        ++depth;
        auto r = visit_schema(s, hint, where);
        --depth;
        return r;
    }

    // The schema a "$ref" points to: a JSON pointer into this document.
    Result<const json *> resolve(const json &ref, const std::string &where) const {
        if (!ref.is_string()) return invalid_input("json_schema: {}: '$ref' must be a string", where);
        const std::string &text = ref.get_ref<const std::string &>();
        if (text.empty() || text[0] != '#')
            return invalid_input(
                "json_schema: {}: '$ref' {} is not in this schema (only '#...' is supported)", where,
                ref.dump());
        const json *at = &root;
        size_t pos = 1;
        if (pos < text.size() && text[pos] != '/')
            return invalid_input("json_schema: {}: '$ref' {} is not a JSON pointer", where, ref.dump());
        while (pos < text.size()) {
            const size_t end = std::min(text.find('/', pos + 1), text.size());
            std::string token = text.substr(pos + 1, end - pos - 1);
            for (size_t i = 0; (i = token.find('~', i)) != std::string::npos; ++i) {
                if (i + 1 < token.size() && (token[i + 1] == '0' || token[i + 1] == '1'))
                    token.replace(i, 2, token[i + 1] == '0' ? "~" : "/");
            }
            const json *next = nullptr;
            if (at->is_object()) {
                if (auto it = at->find(token); it != at->end()) next = &*it;
            } else if (at->is_array() && !token.empty() &&
                       token.find_first_not_of("0123456789") == std::string::npos && token.size() < 9) {
                const size_t i = std::stoul(token);
                if (i < at->size()) next = &(*at)[i];
            }
            if (next == nullptr)
                return invalid_input("json_schema: {}: '$ref' {} points to nothing", where, ref.dump());
            at = next;
            pos = end;
        }
        return at;
    }

    Result<std::string> reference(const json &ref, const std::string &where) {
        const std::string &text = ref.is_string() ? ref.get_ref<const std::string &>() : std::string();
        if (auto it = ref_rules.find(text); it != ref_rules.end()) return it->second;
        TD_ASSIGN_OR_RETURN(const json *target, resolve(ref, where));
        const size_t slash = text.rfind('/');
        const std::string name = fresh(slash == std::string::npos ? "root-ref" : text.substr(slash + 1));
        ref_rules[text] = name;  // before the visit: the target may refer to itself
        const size_t at = rules.size();
        rules.emplace_back(name, "");
        TD_ASSIGN_OR_RETURN(std::string body, visit(*target, name, text));
        grammar_bytes += body.size();
        rules[at].second = std::move(body);
        return name;
    }

    // The keywords beside a combinator ($ref, anyOf, oneOf) must be annotations.
    Status only_annotations_beside(const json &s, std::string_view combinator, const std::string &where) {
        for (const auto &item : s.items())
            if (item.key() != combinator && !one_of(item.key(), kAnnotations))
                return invalid_input("json_schema: '{}' beside '{}' ({}) is not supported", item.key(),
                                     combinator, where);
        return {};
    }

    // allOf: the members (refs followed, nested allOf merged) and the schema's own keywords as one schema.
    Status merge_into(json &out, const json &s, const std::string &where, int guard) {
        if (guard > kMaxDepth) return invalid_input("json_schema: {}: 'allOf' nests too deep", where);
        ++visits;
        TD_TRY(within_limits());
        const json *src = &s;
        if (s.is_object() && s.contains("$ref")) {
            TD_TRY(only_annotations_beside(s, "$ref", where));
            TD_ASSIGN_OR_RETURN(src, resolve(s["$ref"], where));
            return merge_into(out, *src, where, guard + 1);
        }
        if (src->is_boolean() && src->get<bool>()) return {};
        if (!src->is_object()) return invalid_input("json_schema: {}: 'allOf' takes schemas", where);
        for (const auto &item : src->items()) {
            const std::string &key = item.key();
            if (key == "allOf") {
                if (!item.value().is_array())
                    return invalid_input("json_schema: {}: 'allOf' must be a list of schemas", where);
                for (const json &m : item.value()) TD_TRY(merge_into(out, m, where, guard + 1));
            } else if ((key == "properties" && !item.value().is_object()) ||
                       (key == "required" && !item.value().is_array())) {
                return invalid_input("json_schema: {}: '{}' must be {}", where, key,
                                     key == "required" ? "an array" : "an object");
            } else if (key == "properties") {
                for (const auto &p : item.value().items()) {
                    if (out["properties"].contains(p.key()) && out["properties"][p.key()] != p.value())
                        return invalid_input(
                            "json_schema: {}: 'allOf' members give the property '{}' different schemas",
                            where, p.key());
                    out["properties"][p.key()] = p.value();
                }
            } else if (key == "required") {
                for (const json &r : item.value())
                    if (!out.contains("required") ||
                        std::find(out["required"].begin(), out["required"].end(), r) == out["required"].end())
                        out["required"].push_back(r);
            } else if (out.contains(key) && out[key] != item.value() && !one_of(key, kAnnotations)) {
                return invalid_input("json_schema: {}: 'allOf' members disagree on '{}'", where, key);
            } else {
                out[key] = item.value();
            }
        }
        return {};
    }

    Result<std::string> visit_schema(const json &s, const std::string &hint, const std::string &where) {
        if (s.is_boolean()) {
            if (s.get<bool>()) return builtin("json-value");
            return invalid_input("json_schema: {}: the schema false allows no value", where);
        }
        if (!s.is_object()) return invalid_input("json_schema: {} must be an object", where);
        for (const auto &item : s.items())
            if (!one_of(item.key(), kKeywords) && !one_of(item.key(), kAnnotations))
                return unsupported(item.key(), where);
        if (auto ref = s.find("$ref"); ref != s.end()) {
            TD_TRY(only_annotations_beside(s, "$ref", where));
            return reference(*ref, where);
        }
        if (auto n = s.find("nullable"); n != s.end()) {
            if (!n->is_boolean())
                return invalid_input("json_schema: {}: 'nullable' must be a boolean", where);
            json rest = s;
            rest.erase("nullable");
            TD_ASSIGN_OR_RETURN(std::string e, visit(rest, hint, where));
            if (!n->get<bool>()) return e;
            return any_of({e, builtin("json-null")});
        }
        if (auto all = s.find("allOf"); all != s.end()) {
            json merged = json::object();
            TD_TRY(merge_into(merged, s, where, 0));
            merged.erase("allOf");
            return visit(merged, hint, where);
        }
        for (const char *combinator : {"anyOf", "oneOf"}) {
            auto alts = s.find(combinator);
            if (alts == s.end()) continue;
            TD_TRY(only_annotations_beside(s, combinator, where));
            if (!alts->is_array() || alts->empty())
                return invalid_input("json_schema: {}: '{}' must be a non-empty list of schemas", where,
                                     combinator);
            std::vector<std::string> out;
            for (size_t i = 0; i < alts->size(); ++i) {
                TD_ASSIGN_OR_RETURN(std::string e, visit((*alts)[i], fmt::format("{}-{}", hint, i),
                                                         fmt::format("{}.{}[{}]", where, combinator, i)));
                out.push_back(std::move(e));
            }
            return add(hint, join(out, " | "));
        }
        if (auto c = s.find("const"); c != s.end()) return lit(c->dump());
        if (auto e = s.find("enum"); e != s.end()) {
            if (!e->is_array() || e->empty())
                return invalid_input("json_schema: {}: 'enum' must be a non-empty list", where);
            std::vector<std::string> out;
            for (const json &v : *e) out.push_back(lit(v.dump()));
            return add(hint, join(out, " | "));
        }
        std::string type;
        if (auto t = s.find("type"); t != s.end()) {
            if (t->is_array()) {
                if (t->empty()) return invalid_input("json_schema: {}: 'type' is an empty list", where);
                std::vector<std::string> out;
                for (size_t i = 0; i < t->size(); ++i) {
                    const json &one = (*t)[i];
                    if (std::find(t->begin(), t->begin() + static_cast<std::ptrdiff_t>(i), one) !=
                        t->begin() + static_cast<std::ptrdiff_t>(i))
                        continue;  // a type named twice
                    json single = s;
                    single["type"] = one;
                    TD_ASSIGN_OR_RETURN(std::string x, visit(single, hint, where));
                    out.push_back(std::move(x));
                }
                return any_of(out);
            }
            if (!t->is_string()) return invalid_input("json_schema: {}: unknown type {}", where, t->dump());
            type = t->get<std::string>();
        } else {  // as the keywords say
            const auto has = [&](std::initializer_list<const char *> keys) {
                return std::any_of(keys.begin(), keys.end(), [&](const char *k) { return s.contains(k); });
            };
            type = has({"properties", "additionalProperties", "required"})               ? "object"
                   : has({"items", "prefixItems", "minItems", "maxItems"})               ? "array"
                   : has({"minLength", "maxLength", "pattern", "format"})                ? "string"
                   : has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) ? "number"
                                                                                         : "";
            if (type.empty()) return builtin("json-value");
        }
        if (type == "object") return object(s, hint, where);
        if (type == "array") return array(s, hint, where);
        if (type == "string") return string(s, hint, where);
        if (type == "integer" || type == "number") return number(s, type == "integer", hint, where);
        if (type == "boolean") return builtin("json-boolean");
        if (type == "null") return builtin("json-null");
        return invalid_input("json_schema: {}: unknown type \"{}\"", where, type);
    }

    // A JSON string (quotes included) that is none of `names` (JSON-escaped, without their quotes): a
    // walk down the trie of the names' characters, where stepping off it, or stopping where no name
    // stops, is allowed. A name written with other escapes than JSON's own is not caught.
    std::string key_not_in(const std::vector<std::string> &names, const std::string &hint) {
        if (names.empty()) return builtin("json-string");
        builtin("json-char");
        struct Node {
            std::map<std::string, size_t> next;  // a character's UTF-8 -> node
            bool word = false;
        };
        std::vector<Node> trie(1);
        for (const std::string &n : names) {
            size_t at = 0;
            for (size_t i = 0; i < n.size();) {
                const auto lead = static_cast<unsigned char>(n[i]);
                const size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
                const std::string c = n.substr(i, len);
                i += len;
                auto it = trie[at].next.find(c);
                if (it == trie[at].next.end()) {
                    trie.emplace_back();
                    it = trie[at].next.emplace(c, trie.size() - 1).first;
                }
                at = it->second;
            }
            trie[at].word = true;
        }
        std::vector<std::string> node_rules;
        for (size_t i = 0; i < trie.size(); ++i) node_rules.push_back(fresh(hint + "-other-key"));
        for (size_t i = 0; i < trie.size(); ++i) {
            std::vector<std::string> alts;
            if (!trie[i].word) alts.push_back(R"("\"")");
            std::string others = R"([^"\\\x00-\x1F)";
            bool escape_free = true;
            for (const auto &[c, child] : trie[i].next) {
                alts.push_back(fmt::format("{} {}", lit(c), node_rules[child]));
                if (c == "\\") escape_free = false;
                if (c == "\\" || c == "\"") continue;  // not raw in a key anyway
                if (c == "]" || c == "[" || c == "-" || c == "^") others.push_back('\\');
                others.append(c);
            }
            others.push_back(']');
            alts.push_back(others + R"( json-char* "\"")");
            if (escape_free) alts.push_back(R"("\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) json-char* "\"")");
            emit(node_rules[i], join(alts, " | "));
        }
        return fmt::format(R"("\"" {})", node_rules[0]);
    }

    Result<std::string> object(const json &s, const std::string &hint, const std::string &where) {
        const json *props = nullptr;
        if (auto p = s.find("properties"); p != s.end()) {
            if (!p->is_object())
                return invalid_input("json_schema: {}: 'properties' must be an object", where);
            props = &*p;
        }
        std::set<std::string> required;
        if (auto r = s.find("required"); r != s.end()) {
            if (!r->is_array()) return invalid_input("json_schema: {}: 'required' must be an array", where);
            for (const json &name : *r) {
                if (!name.is_string())
                    return invalid_input("json_schema: {}: 'required' must list strings", where);
                required.insert(name.get<std::string>());
            }
        }
        const auto ap = s.find("additionalProperties");
        if (props == nullptr && ap == s.end() && required.empty()) return builtin("json-object");
        builtin("ws");
        // The members: (JSON-escaped name, the member's expression, required).
        struct Member {
            std::string key;
            std::string expr;
            bool required;
        };
        std::vector<Member> members;
        std::vector<std::string> names;
        const auto member = [&](const std::string &name, const json &schema) -> Status {
            const std::string quoted = json(name).dump();
            TD_ASSIGN_OR_RETURN(std::string value, visit(schema, hint + "-" + name, where + "." + name));
            members.push_back(
                {quoted, fmt::format(R"({} ws ":" ws {})", lit(quoted), value), required.count(name) != 0});
            names.push_back(quoted.substr(1, quoted.size() - 2));
            return {};
        };
        if (props != nullptr)
            for (const auto &[name, schema] : props->items()) TD_TRY(member(name, schema));
        for (const std::string &name : required)  // required without a schema: any value
            if (props == nullptr || !props->contains(name)) TD_TRY(member(name, json(true)));
        std::string extra;  // one more member, other keys
        if (ap != s.end() && !(ap->is_boolean() && !ap->get<bool>())) {
            TD_ASSIGN_OR_RETURN(std::string value,
                                visit(*ap, hint + "-additional", where + ".additionalProperties"));
            extra = add(hint + "-additional-member",
                        fmt::format(R"({} ws ":" ws {})", key_not_in(names, hint), value));
        } else if (props == nullptr && ap == s.end()) {
            extra = builtin("json-member");  // only "required" given: any other members too
        }
        // after(i): members i.. when one came before (each with its comma); first(i): when none did. Rules
        // where they are used twice, so the grammar grows with the members, not their square.
        std::vector<std::string> after(members.size() + 1);
        after[members.size()] = extra.empty() ? "" : fmt::format(R"(("," ws {} ws)*)", extra);
        for (size_t i = members.size(); i-- > 1;) {
            const std::string one = fmt::format(R"("," ws {} ws)", members[i].expr);
            std::string body = members[i].required ? one : fmt::format("({})?", one);
            if (!after[i + 1].empty()) body += " " + after[i + 1];
            after[i] = i + 1 < members.size() || !extra.empty() ? add(hint + "-rest", body) : body;
        }
        std::string first = extra.empty() ? "" : fmt::format(R"(({} ws {})?)", extra, after[members.size()]);
        for (size_t i = members.size(); i-- > 0;) {
            std::string take = fmt::format("{} ws", members[i].expr);
            if (!after[i + 1].empty()) take += " " + after[i + 1];
            if (members[i].required)
                first = take;
            else
                first = first.empty() ? fmt::format("({})?", take) : fmt::format("({} | {})", take, first);
            if (i > 0 && !members[i - 1].required) first = add(hint + "-from", first);
        }
        return add(hint, fmt::format(R"("{{" ws {} "}}")", first));
    }

    Result<std::string> array(const json &s, const std::string &hint, const std::string &where) {
        TD_ASSIGN_OR_RETURN(uint64_t min, count_of(s, "minItems", 0, where));
        TD_ASSIGN_OR_RETURN(uint64_t max_items, count_of(s, "maxItems", UINT64_MAX, where));
        if (min > max_items) return invalid_input("json_schema: {}: 'minItems' is above 'maxItems'", where);
        const json *prefix = nullptr;  // tuple members
        const json *rest = nullptr;    // what follows them; nullptr: any value
        bool rest_allowed = true;
        const auto items = s.find("items");
        if (auto p = s.find("prefixItems"); p != s.end()) {
            if (!p->is_array()) return invalid_input("json_schema: {}: 'prefixItems' must be a list", where);
            prefix = &*p;
            if (items != s.end()) rest = &*items;
        } else if (items != s.end() && items->is_array()) {  // draft 4's tuples
            prefix = &*items;
            if (auto a = s.find("additionalItems"); a != s.end()) rest = &*a;
        } else if (items != s.end()) {
            rest = &*items;
        }
        if (rest != nullptr && rest->is_boolean() && !rest->get<bool>()) rest_allowed = false;
        const uint64_t n_prefix = prefix != nullptr ? prefix->size() : 0;
        uint64_t max = max_items;
        if (!rest_allowed) max = std::min(max, n_prefix);
        if (min > max)
            return invalid_input("json_schema: {}: 'minItems' asks for more items than allowed", where);
        if (min > kMaxRepeat + n_prefix)
            return invalid_input("json_schema: {}: 'minItems' above {} is not supported", where, kMaxRepeat);
        builtin("ws");
        std::vector<std::string> elems;
        for (uint64_t i = 0; i < n_prefix; ++i) {
            TD_ASSIGN_OR_RETURN(std::string e, visit((*prefix)[i], fmt::format("{}-{}", hint, i),
                                                     fmt::format("{}[{}]", where, i)));
            elems.push_back(std::move(e));
        }
        std::string item;
        if (rest_allowed && max > n_prefix) {
            if (rest == nullptr) {
                item = builtin("json-value");
            } else {
                TD_ASSIGN_OR_RETURN(item, visit(*rest, hint + "-item", where + "[]"));
            }
        }
        // tail(i): items i.. (i > 0: each after a comma); optional from index min on.
        std::string tail;
        if (!item.empty()) {
            const uint64_t k_min = min > n_prefix ? min - n_prefix : 0;
            const int64_t k_max = max == UINT64_MAX ? -1 : static_cast<int64_t>(max - n_prefix);
            const std::string more = fmt::format(R"(("," ws {} ws))", item);
            if (n_prefix > 0) {
                tail = repeat(more, k_min, k_max);
            } else if (k_min >= 1) {
                tail = fmt::format("{} ws {}", item, repeat(more, k_min - 1, k_max < 0 ? -1 : k_max - 1));
            } else {
                const std::string rest_items = repeat(more, 0, k_max < 0 ? -1 : k_max - 1);
                tail = fmt::format("({} ws {})?", item, rest_items);
            }
        }
        for (uint64_t i = n_prefix; i-- > 0;) {
            std::string body = fmt::format("{}{} ws", i > 0 ? R"("," ws )" : "", elems[i]);
            if (!tail.empty()) body += " " + tail;
            tail = i >= min ? fmt::format("({})?", body) : body;
            if (i > 0 && n_prefix > 4) tail = add(hint + "-from", tail);
        }
        return add(hint, fmt::format(R"("[" ws {} "]")", tail));
    }

    Result<std::string> string(const json &s, const std::string &hint, const std::string &where) {
        TD_ASSIGN_OR_RETURN(uint64_t min, count_of(s, "minLength", 0, where));
        TD_ASSIGN_OR_RETURN(uint64_t max, count_of(s, "maxLength", UINT64_MAX, where));
        if (min > max) return invalid_input("json_schema: {}: 'minLength' is above 'maxLength'", where);
        const bool lengths = s.contains("minLength") || s.contains("maxLength");
        if (auto p = s.find("pattern"); p != s.end()) {
            if (lengths || s.contains("format"))
                return invalid_input(
                    "json_schema: {}: 'pattern' with 'minLength', 'maxLength' or 'format' "
                    "is not supported",
                    where);
            if (!p->is_string()) return invalid_input("json_schema: {}: 'pattern' must be a string", where);
            const std::string &re = p->get_ref<const std::string &>();
            auto expr = regex_to_gbnf_expression(re, true);
            if (!expr.ok())
                return expr.status().with_context(fmt::format("json_schema: {}: 'pattern'", where));
            // JSON Schema searches: text may come before an unanchored start and after an unanchored end.
            const bool start = !re.empty() && re[0] == '^';
            size_t backslashes = 0;
            for (size_t i = re.size() - 1; re.size() >= 2 && i > 0 && re[i - 1] == '\\'; --i) ++backslashes;
            const bool end = !re.empty() && re.back() == '$' && backslashes % 2 == 0;
            const std::string any = start && end ? "" : builtin("json-char") + "*";
            return add(hint, fmt::format(R"("\"" {}({}){} "\"")", start ? "" : any + " ", *expr,
                                         end ? "" : " " + any));
        }
        if (auto f = s.find("format"); f != s.end()) {
            if (!f->is_string()) return invalid_input("json_schema: {}: 'format' must be a string", where);
            const std::string rule = "format-" + f->get<std::string>();
            if (one_of(rule,
                       std::initializer_list<const char *>{"format-date", "format-time", "format-date-time",
                                                           "format-uuid", "format-ipv4", "format-email"})) {
                if (lengths)
                    return invalid_input(
                        "json_schema: {}: 'format' with 'minLength' or 'maxLength' is not "
                        "supported",
                        where);
                return fmt::format(R"("\"" {} "\"")", builtin(rule));
            }
            // any other format is an annotation
        }
        if (!lengths) return builtin("json-string");
        if (min > kMaxRepeat)
            return invalid_input("json_schema: {}: 'minLength' above {} is not supported", where, kMaxRepeat);
        const std::string chars =
            repeat(builtin("json-char"), min,
                   max == UINT64_MAX ? -1 : static_cast<int64_t>(std::min<uint64_t>(max, INT64_MAX)));
        return add(hint, fmt::format(R"("\"" {} "\"")", chars.empty() ? "" : chars));
    }

    // minimum / maximum with their exclusive forms (a number, or draft 4's boolean).
    struct Bound {
        bool set = false;
        bool exclusive = false;
        double value = 0;
    };
    Result<Bound> bound(const json &s, const char *key, const char *exclusive_key, bool lower,
                        const std::string &where) {
        Bound b;
        const auto take = [&](const json &v, bool exclusive) -> Status {
            if (!v.is_number())
                return invalid_input("json_schema: {}: '{}' must be a number", where,
                                     exclusive ? exclusive_key : key);
            const double x = v.get<double>();
            if (!std::isfinite(x)) return invalid_input("json_schema: {}: '{}' is not finite", where, key);
            const bool tighter = !b.set || (lower ? x > b.value || (x == b.value && exclusive)
                                                  : x < b.value || (x == b.value && exclusive));
            if (tighter) {
                b.set = true;
                b.value = x;
                b.exclusive = exclusive;
            }
            return {};
        };
        if (auto v = s.find(key); v != s.end()) TD_TRY(take(*v, false));
        if (auto e = s.find(exclusive_key); e != s.end()) {
            if (e->is_boolean()) {
                if (e->get<bool>()) {
                    if (!b.set)
                        return invalid_input("json_schema: {}: '{}' true needs '{}'", where, exclusive_key,
                                             key);
                    b.exclusive = true;
                }
            } else {
                TD_TRY(take(*e, true));
            }
        }
        return b;
    }

    Result<std::string> number(const json &s, bool integer, const std::string &hint,
                               const std::string &where) {
        TD_ASSIGN_OR_RETURN(Bound lo, bound(s, "minimum", "exclusiveMinimum", true, where));
        TD_ASSIGN_OR_RETURN(Bound hi, bound(s, "maximum", "exclusiveMaximum", false, where));
        if (!lo.set && !hi.set) return builtin(integer ? "json-integer" : "json-number");
        const auto clamp = [](double x) {
            return static_cast<int64_t>(
                std::clamp(x, -static_cast<double>(kMaxMagnitude), static_cast<double>(kMaxMagnitude)));
        };
        if (integer) {
            int64_t a = -kMaxMagnitude, b = kMaxMagnitude;
            if (lo.set) {
                const double c = std::ceil(lo.value);
                a = clamp(c) + (lo.exclusive && c == lo.value ? 1 : 0);
            }
            if (hi.set) {
                const double f = std::floor(hi.value);
                b = clamp(f) - (hi.exclusive && f == hi.value ? 1 : 0);
            }
            a = std::max(a, -kMaxMagnitude);
            b = std::min(b, kMaxMagnitude);
            if (a > b) return invalid_input("json_schema: {}: no integer is within the bounds", where);
            return add(hint, integers_between(a, b));
        }
        // v = I.F, written without an exponent: I decides, but where I is a bound's whole part, F is compared
        // with the bound's digits after the point.
        const double most = static_cast<double>(kMaxMagnitude);
        const double a = lo.set ? std::max(lo.value, -most) : -most;
        const double b = hi.set ? std::min(hi.value, most) : most;
        // (a bound past 16 digits is as far as a number goes, and that number is in)
        const bool a_in = a != lo.value || !lo.exclusive, b_in = b != hi.value || !hi.exclusive;
        if (a > b || (a == b && !(a_in && b_in)))
            return invalid_input("json_schema: {}: no number is within the bounds", where);
        std::vector<std::string> alts;
        const auto with_fractions = [&](const std::string &sign, const std::string &whole,
                                        const Fractions &f) {
            if (f.zero) alts.push_back(sign + whole);
            if (!f.digits.empty()) alts.push_back(fmt::format(R"({}{} "." {})", sign, whole, f.digits));
        };
        // Magnitudes m with p <= m <= q (0 <= p <= q), p and q themselves as allowed.
        const auto magnitudes = [&](double p, bool p_in, double q, bool q_in,
                                    const std::string &sign) -> Status {
            const std::optional<Decimal> dp = decimal_of(p), dq = decimal_of(q);
            if (!dp || !dq)
                return invalid_input("json_schema: {}: a number's bound has over {} digits after the point",
                                     where, kMaxFractionDigits);
            const FractionBound from{dp->fraction, !p_in}, to{dq->fraction, !q_in};
            if (dp->whole == dq->whole) {
                with_fractions(sign, lit(std::to_string(dp->whole)),
                               fractions_between(from, to, kMaxFractionDigits));
                return {};
            }
            with_fractions(sign, lit(std::to_string(dp->whole)),
                           fractions_between(from, std::nullopt, kMaxFractionDigits));
            if (dp->whole + 1 <= dq->whole - 1)
                with_fractions(sign, naturals_between(dp->whole + 1, dq->whole - 1),
                               fractions_between(std::nullopt, std::nullopt, kMaxFractionDigits));
            with_fractions(sign, lit(std::to_string(dq->whole)),
                           fractions_between(std::nullopt, to, kMaxFractionDigits));
            return {};
        };
        if (b >= 0) TD_TRY(magnitudes(std::max(a, 0.0), a < 0 || a_in, b, b_in, ""));          // v >= 0
        if (a < 0) TD_TRY(magnitudes(b >= 0 ? 0.0 : -b, b < 0 && b_in, -a, a_in, R"("-" )"));  // v < 0
        if (alts.empty()) return invalid_input("json_schema: {}: no number is within the bounds", where);
        return add(hint, join(alts, " | "));
    }
};

}  // namespace

Result<std::string> json_schema_to_gbnf(std::string_view schema_json, int max_whitespace) {
    const json schema = json::parse(schema_json, nullptr, false);
    if (schema.is_discarded()) return invalid_input("json_schema: the schema is not valid JSON");
    Converter c(schema, std::clamp(max_whitespace, 0, 64));
    TD_ASSIGN_OR_RETURN(std::string top, c.visit(schema, "root", "the schema"));
    std::string out = fmt::format("root ::= {}\n", top);
    for (const auto &[name, body] : c.rules) out.append(fmt::format("{} ::= {}\n", name, body));
    return out;
}

Result<JsonConstraint> compile_json_constraint(std::string_view schema_json, int max_whitespace) {
    JsonConstraint c;
    if (auto native = JsonSchema::compile(schema_json, max_whitespace); native.ok()) {
        c.schema = *native;
        return c;
    }
    TD_ASSIGN_OR_RETURN(std::string gbnf, json_schema_to_gbnf(schema_json, max_whitespace));
    auto g = Grammar::compile(gbnf);
    if (!g.ok()) return g.status().with_context("json_schema: the schema's grammar");
    c.grammar = *g;
    return c;
}

}  // namespace td
