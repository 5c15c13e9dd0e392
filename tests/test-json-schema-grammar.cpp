// JSON schemas beyond the matcher's subset (text/json-schema-grammar.*): the grammar a schema becomes
// accepts the documents the schema allows and refuses the others; number ranges are exact against a
// brute-force check; random sentences of a schema's grammar are documents of the schema; what is not
// supported is refused with the keyword named.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "text/grammar.h"
#include "text/json-schema-grammar.h"

namespace td {
namespace {

using ordered_json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> grammar_of(std::string_view schema) {
    auto gbnf = json_schema_to_gbnf(schema);
    EXPECT_TRUE(gbnf.ok()) << schema << ": " << gbnf.status().message();
    if (!gbnf.ok()) return nullptr;
    auto g = Grammar::compile(*gbnf);
    EXPECT_TRUE(g.ok()) << *gbnf << ": " << g.status().message();
    return g.ok() ? *g : nullptr;
}

bool accepts(const std::shared_ptr<const Grammar> &g, std::string_view doc) {
    GrammarMatcher m(g);
    return m.feed(doc) && m.can_end();
}

std::string error_of(std::string_view schema) {
    auto c = compile_json_constraint(schema);
    return c.ok() ? std::string() : c.status().message();
}

// What OpenAI's SDK sends for a Pydantic model: $defs and $ref, anyOf with null for an Optional field,
// additionalProperties false, and its properties in an order that is not alphabetical.
const char *k_pydantic = R"({
  "$defs": {"Step": {"type": "object", "title": "Step",
                     "properties": {"explanation": {"type": "string"}, "output": {"type": "string"}},
                     "required": ["explanation", "output"], "additionalProperties": false}},
  "title": "MathReasoning", "type": "object",
  "properties": {"steps": {"type": "array", "items": {"$ref": "#/$defs/Step"}},
                 "final_answer": {"type": "string"},
                 "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": null}},
  "required": ["steps", "final_answer"], "additionalProperties": false})";

TEST(JsonSchemaGrammar, PydanticModelsWithRefsAndOptionals) {
    const auto g = grammar_of(k_pydantic);
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(accepts(g, R"({"steps": [{"explanation": "a", "output": "b"}], "final_answer": "x"})"));
    EXPECT_TRUE(accepts(g, R"({"steps":[],"final_answer":"x","note":null})"));
    EXPECT_TRUE(accepts(g, "{\n  \"steps\": [],\n  \"final_answer\": \"\\u00e9\", \"note\": \"hi\"\n}"));
    EXPECT_FALSE(accepts(g, R"({"final_answer": "x", "steps": []})"));  // the schema's order
    EXPECT_FALSE(accepts(g, R"({"steps": [{"output": "b", "explanation": "a"}], "final_answer": "x"})"));
    EXPECT_FALSE(accepts(g, R"({"steps": [], "final_answer": "x", "note": 3})"));
    EXPECT_FALSE(accepts(g, R"({"steps": [], "note": null})"));                     // required
    EXPECT_FALSE(accepts(g, R"({"steps": [], "final_answer": "x", "other": 1})"));  // not allowed
    EXPECT_FALSE(accepts(g, R"({"steps": [], "final_answer": "x"} )"));             // after the end
    EXPECT_FALSE(accepts(g, "{     \"steps\": [], \"final_answer\": \"x\"}"));      // 5 spaces
    // The subset's schemas keep the matcher (any order); the others become grammars.
    auto subset = compile_json_constraint(R"({"type": "object", "properties": {"a": {"type": "string"}}})");
    ASSERT_TRUE(subset.ok());
    EXPECT_TRUE(subset->schema && !subset->grammar);
    auto beyond = compile_json_constraint(k_pydantic);
    ASSERT_TRUE(beyond.ok()) << beyond.status().message();
    EXPECT_TRUE(beyond->grammar && !beyond->schema);
    auto top_string = compile_json_constraint(R"({"type": "string", "maxLength": 3})");
    ASSERT_TRUE(top_string.ok());
    EXPECT_TRUE(accepts(top_string->grammar, R"("abc")"));
    EXPECT_FALSE(accepts(top_string->grammar, R"("abcd")"));
}

// Every subset of optional members, in the schema's order; more members after them when
// additionalProperties allows, with keys that are none of the properties'.
TEST(JsonSchemaGrammar, ObjectsKeepOrderAndOptionalMembers) {
    const auto g = grammar_of(
        R"({"type": "object", "properties": {"c": {"type": "integer"}, "a": {"type": "integer"},
            "b": {"type": "integer"}}, "additionalProperties": false})");
    ASSERT_NE(g, nullptr);
    const char *names[] = {"c", "a", "b"};
    for (int mask = 0; mask < 8; ++mask) {
        std::string doc = "{";
        for (int i = 0; i < 3; ++i)
            if (mask >> i & 1) doc += fmt::format("{}\"{}\": {}", doc.size() > 1 ? ", " : "", names[i], i);
        doc += "}";
        EXPECT_TRUE(accepts(g, doc)) << doc;
    }
    EXPECT_FALSE(accepts(g, R"({"a": 1, "c": 0})"));
    EXPECT_FALSE(accepts(g, R"({, "a": 1})"));
    EXPECT_FALSE(accepts(g, R"({"a": 1,})"));
    EXPECT_FALSE(accepts(g, R"({"c": 1, "c": 1})"));
    const auto extra = grammar_of(
        R"({"type": "object", "properties": {"id": {"type": "integer"}, "é": {"type": "integer"}},
            "required": ["id"], "additionalProperties": {"type": "string"}})");
    ASSERT_NE(extra, nullptr);
    EXPECT_TRUE(accepts(extra, R"({"id": 1})"));
    EXPECT_TRUE(accepts(extra, R"({"id": 1, "é": 2, "name": "x", "i": "y", "idx": "z", "": "w"})"));
    EXPECT_TRUE(accepts(extra, R"({"id": 1, "\n": "x", "\"": "y"})"));
    EXPECT_TRUE(accepts(extra, R"({"id": 1, "ét": "x", "e": "y"})"));
    EXPECT_FALSE(accepts(extra, R"({"id": 1, "id": "x"})"));  // a property's key
    EXPECT_FALSE(accepts(extra, R"({"id": 1, "é": "x"})"));
    EXPECT_FALSE(accepts(extra, R"({"id": 1, "name": 2})"));  // the additional schema
    EXPECT_FALSE(accepts(extra, R"({"name": "x"})"));         // id is required
    // Only "required": those members, then any others.
    const auto req = grammar_of(R"({"type": "object", "required": ["k"]})");
    ASSERT_NE(req, nullptr);
    EXPECT_TRUE(accepts(req, R"({"k": [1, {"x": null}], "other": true})"));
    EXPECT_FALSE(accepts(req, R"({"other": true})"));
}

TEST(JsonSchemaGrammar, ArraysTuplesAndCounts) {
    const auto counted = grammar_of(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2,
                                        "maxItems": 3})");
    ASSERT_NE(counted, nullptr);
    EXPECT_TRUE(accepts(counted, "[1,2]"));
    EXPECT_TRUE(accepts(counted, "[ 1 , 2 , 3 ]"));
    EXPECT_FALSE(accepts(counted, "[1]"));
    EXPECT_FALSE(accepts(counted, "[1,2,3,4]"));
    EXPECT_FALSE(accepts(counted, R"([1,"2"])"));
    const auto tuple = grammar_of(
        R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})");
    ASSERT_NE(tuple, nullptr);
    for (const char *ok : {"[]", "[1]", R"([1, "a"])"}) EXPECT_TRUE(accepts(tuple, ok)) << ok;
    for (const char *bad : {R"([1, "a", 2])", R"(["a"])", "[1, 2]"}) EXPECT_FALSE(accepts(tuple, bad)) << bad;
    const auto open = grammar_of(
        R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 1,
            "items": {"type": "boolean"}})");
    ASSERT_NE(open, nullptr);
    EXPECT_TRUE(accepts(open, R"([1, "a", true, false])"));
    EXPECT_TRUE(accepts(open, "[1]"));
    EXPECT_FALSE(accepts(open, "[]"));
    EXPECT_FALSE(accepts(open, R"([1, "a", null])"));
    const auto draft4 =
        grammar_of(R"({"type": "array", "items": [{"const": "x"}], "additionalItems": false})");
    ASSERT_NE(draft4, nullptr);
    EXPECT_TRUE(accepts(draft4, R"(["x"])"));
    EXPECT_FALSE(accepts(draft4, R"(["x", "x"])"));
}

TEST(JsonSchemaGrammar, StringsPatternsAndFormats) {
    const auto anchored = grammar_of(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})");
    ASSERT_NE(anchored, nullptr);
    EXPECT_TRUE(accepts(anchored, R"("AB-123")"));
    EXPECT_FALSE(accepts(anchored, R"("xAB-123")"));
    EXPECT_FALSE(accepts(anchored, R"("AB-12")"));
    // JSON Schema searches: an unanchored pattern may have text around it.
    const auto searched = grammar_of(R"({"type": "string", "pattern": "ab"})");
    ASSERT_NE(searched, nullptr);
    EXPECT_TRUE(accepts(searched, R"("ab")"));
    EXPECT_TRUE(accepts(searched, R"("xxaby")"));
    EXPECT_FALSE(accepts(searched, R"("a")"));
    // The pattern matches the string's value: quotes, backslashes and control characters are escaped.
    const auto dot = grammar_of(R"({"type": "string", "pattern": "^a.c$"})");
    ASSERT_NE(dot, nullptr);
    for (const char *ok : {R"("abc")", R"("a\"c")", R"("a\\c")", R"("a\tc")", R"("aéc")"})
        EXPECT_TRUE(accepts(dot, ok)) << ok;
    for (const char *bad : {R"("a\nc")", R"("a\\nc")", "\"a\tc\"", R"("ac")", R"("a"c")"})
        EXPECT_FALSE(accepts(dot, bad)) << bad;
    const auto quote = grammar_of(R"({"type": "string", "pattern": "^\"q\\\\$"})");  // "q\ as its value
    ASSERT_NE(quote, nullptr);
    EXPECT_TRUE(accepts(quote, R"("\"q\\")"));
    EXPECT_FALSE(accepts(quote, R"("\"q\\\\")"));
    const auto lengths = grammar_of(R"({"type": "string", "minLength": 2, "maxLength": 3})");
    ASSERT_NE(lengths, nullptr);
    EXPECT_TRUE(accepts(lengths, R"("ab")"));
    EXPECT_TRUE(accepts(lengths, R"("a\u00e9c")"));
    EXPECT_FALSE(accepts(lengths, R"("a")"));
    EXPECT_FALSE(accepts(lengths, R"("abcd")"));
    const std::pair<const char *, std::vector<std::pair<const char *, bool>>> formats[] = {
        {"date", {{"2024-02-29", true}, {"2024-13-01", false}, {"2024-1-01", false}}},
        {"time", {{"23:59:60Z", false}, {"12:30:00Z", true}, {"12:30:00.5+02:00", true}, {"12:30", false}}},
        {"date-time", {{"2024-01-31T12:30:00Z", true}, {"2024-01-31 12:30:00Z", false}}},
        {"uuid", {{"123e4567-e89b-12d3-a456-426614174000", true}, {"123e4567-e89b", false}}},
        {"ipv4", {{"192.168.0.255", true}, {"256.1.1.1", false}, {"01.2.3.4", false}}},
        {"email", {{"me@example.org", true}, {"me@example", false}, {"@example.org", false}}},
        {"uri", {{"anything", true}}},  // other formats are annotations
    };
    for (const auto &[format, texts] : formats) {
        const auto g = grammar_of(fmt::format(R"({{"type": "string", "format": "{}"}})", format));
        ASSERT_NE(g, nullptr);
        for (const auto &[text, ok] : texts)
            EXPECT_EQ(accepts(g, fmt::format("\"{}\"", text)), ok) << format << ": " << text;
    }
}

// Integer ranges against every value near their ends and random ones between.
TEST(JsonSchemaGrammar, IntegerRangesAreExact) {
    std::mt19937_64 rng(7);
    const int64_t edges[] = {-1000001, -99999, -1000, -101, -100, -99, -10,  -9,   -1,    0,      1,        9,
                             10,       11,     99,    100,  101,  999, 1000, 5678, 99999, 100000, 123456789};
    std::vector<std::pair<int64_t, int64_t>> ranges;
    for (int i = 0; i < 60; ++i) {
        int64_t a = edges[rng() % std::size(edges)], b = edges[rng() % std::size(edges)];
        ranges.emplace_back(std::min(a, b), std::max(a, b));
    }
    ranges.emplace_back(-3, 1234567890123);
    for (const auto &[lo, hi] : ranges) {
        const auto g =
            grammar_of(fmt::format(R"({{"type": "integer", "minimum": {}, "maximum": {}}})", lo, hi));
        ASSERT_NE(g, nullptr);
        std::vector<int64_t> probes;
        for (int64_t d = -12; d <= 12; ++d) probes.insert(probes.end(), {lo + d, hi + d});
        for (int i = 0; i < 40; ++i)
            probes.push_back(lo - 5 + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 11)));
        for (int64_t v : probes)
            ASSERT_EQ(accepts(g, std::to_string(v)), v >= lo && v <= hi)
                << v << " in [" << lo << ", " << hi << "]";
        EXPECT_FALSE(accepts(g, "-0"));
        EXPECT_FALSE(accepts(g, fmt::format("0{}", std::max<int64_t>(lo, 1))));  // leading zero
    }
    // Exclusive bounds, draft 4's booleans, bounds that are not whole, one side only.
    const std::pair<const char *, std::pair<int64_t, int64_t>> forms[] = {
        {R"("exclusiveMinimum": 0)", {1, INT64_MAX}},
        {R"("minimum": -5, "exclusiveMinimum": true, "exclusiveMaximum": 5)", {-4, 4}},
        {R"("minimum": 3.5, "maximum": 7.2)", {4, 7}},
        {R"("maximum": -20)", {INT64_MIN, -20}},
        {R"("minimum": 7, "maximum": 7)", {7, 7}},
    };
    for (const auto &[bounds, range] : forms) {
        const auto g = grammar_of(fmt::format(R"({{"type": "integer", {}}})", bounds));
        ASSERT_NE(g, nullptr);
        for (int64_t v = -30; v <= 30; ++v)
            EXPECT_EQ(accepts(g, std::to_string(v)), v >= range.first && v <= range.second)
                << bounds << ": " << v;
    }
    // Numbers keep their 16 digits at most.
    const auto big = grammar_of(R"({"type": "integer", "minimum": 0})");
    EXPECT_TRUE(accepts(big, "9999999999999999"));
    EXPECT_FALSE(accepts(big, "10000000000000000"));
}

// Numbers between bounds, whole and not, against a comparison of the value.
TEST(JsonSchemaGrammar, NumberRangesAreExact) {
    std::mt19937_64 rng(11);
    struct Range {
        const char *bounds;
        double lo, hi;
        bool lo_in, hi_in;
        bool holds(double v) const {
            return (v > lo || (lo_in && v == lo)) && (v < hi || (hi_in && v == hi));
        }
    };
    const Range ranges[] = {
        {R"("minimum": 0, "maximum": 1)", 0, 1, true, true},
        {R"("exclusiveMinimum": -2, "exclusiveMaximum": 3)", -2, 3, false, false},
        {R"("minimum": -10, "exclusiveMaximum": -3)", -10, -3, true, false},
        {R"("exclusiveMinimum": 0)", 0, 1e300, false, true},
        {R"("maximum": 100)", -1e300, 100, true, true},
        {R"("minimum": 5, "maximum": 5)", 5, 5, true, true},
        {R"("minimum": 0.5, "maximum": 2.25)", 0.5, 2.25, true, true},
        {R"("exclusiveMinimum": -1.5, "exclusiveMaximum": -0.25)", -1.5, -0.25, false, false},
        {R"("minimum": 0.125, "exclusiveMaximum": 0.75)", 0.125, 0.75, true, false},
        {R"("exclusiveMinimum": 0.105, "maximum": 0.11)", 0.105, 0.11, false, true},
        {R"("minimum": -0.05, "exclusiveMaximum": 0.05)", -0.05, 0.05, true, false},
        {R"("minimum": -10.5, "maximum": -10.25)", -10.5, -10.25, true, true},
        {R"("exclusiveMinimum": 2.5)", 2.5, 1e300, false, true},
        {R"("maximum": 7.07)", -1e300, 7.07, true, true},
        {R"("minimum": 2.5, "maximum": 2.5)", 2.5, 2.5, true, true},
        {R"("minimum": 1.0, "maximum": 3.0)", 1, 3, true, true},
        {R"("minimum": 1e-3, "maximum": 1.5e1)", 0.001, 15, true, true},
    };
    // Each bound, written longer, and just either side of it.
    const char *const edges[] = {
        "0",         "0.0",      "0.5",     "0.50",     "0.4999",   "2.25",     "2.250",    "2.2501",
        "2.2499",    "-1.5",     "-1.4999", "-1.50001", "-0.25",    "-0.2500",  "-0.2499",  "-0.2501",
        "0.125",     "0.1249",   "0.75",    "0.7499",   "0.750",    "0.105",    "0.1050",   "0.1051",
        "0.11",      "0.1100",   "0.11001", "0.109999", "-0.05",    "-0.0501",  "-0.0499",  "0.05",
        "0.0499",    "0.049",    "-10.5",   "-10.25",   "-10.2501", "-10.2499", "-10.5001", "2.5",
        "2.5001",    "2.4999",   "7.07",    "7.0700",   "7.0701",   "7.069999", "1",        "3",
        "3.0",       "3.000001", "0.001",   "0.0009",   "0.000999", "0.0010",   "15",       "15.0",
        "15.000001", "14.999"};
    for (const Range &r : ranges) {
        const auto g = grammar_of(fmt::format(R"({{"type": "number", {}}})", r.bounds));
        ASSERT_NE(g, nullptr);
        for (const char *text : edges) {
            const double v = std::stod(text);
            const bool in = r.holds(v);
            EXPECT_EQ(accepts(g, text), in) << r.bounds << ": " << text;
        }
        for (int i = 0; i < 400; ++i) {
            // -?I(.F)? with I up to 3 digits and F up to 3, near the bounds more often than not.
            const int whole = static_cast<int>(rng() % 120);
            std::string text = rng() % 2 ? "-" : "";
            text += std::to_string(whole % 12 == 11 ? whole : whole % 12);
            const int frac_digits = static_cast<int>(rng() % 4);
            if (frac_digits > 0) {
                text += '.';
                for (int d = 0; d < frac_digits; ++d)
                    text += static_cast<char>('0' + (rng() % 3 == 0 ? 0 : rng() % 10));
            }
            const double v = std::stod(text);
            const bool in = r.holds(v);
            const bool negative_zero = text[0] == '-' && v == 0;  // "-0.0" is 0 but written with a sign
            if (negative_zero) continue;
            EXPECT_EQ(accepts(g, text), in) << r.bounds << ": " << text;
        }
        EXPECT_FALSE(accepts(g, "1e0"));  // a bounded number has no exponent
    }
}

TEST(JsonSchemaGrammar, CombinatorsAndReferences) {
    const auto all_of = grammar_of(R"({"allOf": [{"$ref": "#/definitions/A"},
        {"properties": {"b": {"type": "integer"}}, "required": ["b"]}],
        "definitions": {"A": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}}})");
    ASSERT_NE(all_of, nullptr);
    EXPECT_TRUE(accepts(all_of, R"({"a": "x", "b": 1})"));
    EXPECT_FALSE(accepts(all_of, R"({"b": 1})"));
    EXPECT_FALSE(accepts(all_of, R"({"a": "x"})"));
    // Recursion through $ref.
    const auto tree = grammar_of(R"({"$defs": {"Node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        "required": ["v"], "additionalProperties": false}}, "$ref": "#/$defs/Node"})");
    ASSERT_NE(tree, nullptr);
    EXPECT_TRUE(accepts(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4, "kids": []}]}]})"));
    EXPECT_FALSE(accepts(tree, R"({"v": 1, "kids": [{"x": 2}]})"));
    const auto choices = grammar_of(R"({"enum": [{"a": 1}, [1, 2], "x", null, 3.5]})");
    ASSERT_NE(choices, nullptr);
    for (const char *ok : {R"({"a":1})", "[1,2]", R"("x")", "null", "3.5"})
        EXPECT_TRUE(accepts(choices, ok)) << ok;
    EXPECT_FALSE(accepts(choices, R"({"a": 1})"));  // enum values are written compactly
    const auto one_of = grammar_of(R"({"oneOf": [{"type": "integer"}, {"type": "boolean"}], "title": "t"})");
    ASSERT_NE(one_of, nullptr);
    EXPECT_TRUE(accepts(one_of, "-4"));
    EXPECT_TRUE(accepts(one_of, "true"));
    EXPECT_FALSE(accepts(one_of, "1.5"));
    const auto types = grammar_of(R"({"type": ["string", "null", "string"], "maxLength": 2})");
    ASSERT_NE(types, nullptr);
    EXPECT_TRUE(accepts(types, R"("ab")"));
    EXPECT_TRUE(accepts(types, "null"));
    EXPECT_FALSE(accepts(types, R"("abc")"));
    const auto nullable = grammar_of(R"({"type": "integer", "nullable": true, "minimum": 1})");
    ASSERT_NE(nullable, nullptr);
    EXPECT_TRUE(accepts(nullable, "null"));
    EXPECT_TRUE(accepts(nullable, "3"));
    EXPECT_FALSE(accepts(nullable, "0"));
    const auto pointer = grammar_of(R"({"type": "object", "properties": {"a": {"type": "boolean"},
        "b": {"$ref": "#/properties/a"}}, "required": ["a", "b"]})");
    ASSERT_NE(pointer, nullptr);
    EXPECT_TRUE(accepts(pointer, R"({"a": true, "b": false})"));
    EXPECT_FALSE(accepts(pointer, R"({"a": true, "b": 1})"));
}

TEST(JsonSchemaGrammar, RefusedWithTheKeywordNamed) {
    const std::pair<const char *, const char *> bad[] = {
        {R"({"not": {"type": "string"}})", "json_schema: 'not' (the schema) is not supported"},
        {R"({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}})",
         "'uniqueItems' (the schema.a) is not supported"},
        {R"({"type": "object", "patternProperties": {"^x": {}}})", "'patternProperties'"},
        {R"({"type": "integer", "multipleOf": 3})", "'multipleOf'"},
        {R"({"$ref": "https://example.com/s.json"})", "is not in this schema"},
        {R"({"$ref": "#/$defs/Missing"})", "points to nothing"},
        {R"({"$ref": "#"})", "left recursion"},
        {R"({"$ref": "#/$defs/A", "type": "object", "$defs": {"A": {}}})", "'type' beside '$ref'"},
        {R"({"anyOf": [{"type": "string"}], "minLength": 1})", "'minLength' beside 'anyOf'"},
        {R"({"anyOf": []})", "'anyOf' must be a non-empty list"},
        {R"({"type": "number", "minimum": 1e-17})", "a number's bound has over 16 digits after the point"},
        {R"({"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.5})", "no number is within the bounds"},
        {R"({"type": "integer", "minimum": 3, "maximum": 2})", "no integer is within the bounds"},
        {R"({"type": "string", "pattern": "(a"})", "'pattern': regex: at offset 2: unbalanced '('"},
        {R"({"type": "string", "pattern": "a", "maxLength": 3})", "'pattern' with 'minLength'"},
        {R"({"type": "object", "properties": {"a": false}, "required": ["a"]})",
         "the schema false allows no value"},
        {R"({"type": "thing"})", "unknown type \"thing\""},
        {R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", "'allOf' members disagree on 'type'"},
        {R"({"type": "array", "minItems": 3, "items": false})", "asks for more items than allowed"},
        {"[1", "not valid JSON"},
    };
    for (const auto &[schema, message] : bad) {
        const std::string e = error_of(schema);
        EXPECT_NE(e.find(message), std::string::npos) << schema << " -> '" << e << "'";
    }
    EXPECT_NE(error_of(R"({"allOf": [{"properties": 5}]})").find("'properties' must be an object"),
              std::string::npos);
    // A schema that names far more than it holds (each allOf doubles the one below) is refused, quickly.
    std::string defs;
    for (int i = 0; i < 25; ++i)
        defs += fmt::format(R"("A{}": {{"allOf": [{{"$ref": "#/$defs/A{}"}}, {{"$ref": "#/$defs/A{}"}}]}}, )",
                            i, i + 1, i + 1);
    EXPECT_NE(
        error_of(fmt::format(R"({{"$defs": {{{}"A25": {{"type": "object"}}}}, "$ref": "#/$defs/A0"}})", defs))
            .find("the schema is too large"),
        std::string::npos);
    // Deep nesting is refused, not a stack overflow.
    std::string deep;
    for (int i = 0; i < 200; ++i) deep += R"({"type": "array", "items": )";
    deep += "{}";
    for (int i = 0; i < 200; ++i) deep += "}";
    EXPECT_NE(error_of(deep).find("nested deeper"), std::string::npos);
}

// Random walks of the Pydantic schema's grammar end in documents that parse, with the keys in order and
// the values of their types.
TEST(JsonSchemaGrammar, RandomSentencesAreDocumentsOfTheSchema) {
    const auto g = grammar_of(k_pydantic);
    ASSERT_NE(g, nullptr);
    std::mt19937_64 rng(3);
    int n_done = 0;
    for (int walk = 0; walk < 300; ++walk) {
        GrammarMatcher m(g);
        std::string text;
        while (text.size() < 3000 && !m.must_end()) {
            std::vector<uint8_t> next, closers;
            for (int c = 0; c < 256; ++c) {
                GrammarMatcher copy = m;
                if (!copy.feed(static_cast<uint8_t>(c))) continue;
                next.push_back(static_cast<uint8_t>(c));
                if (c == '"' || c == '}' || c == ']' || c == 'n') closers.push_back(static_cast<uint8_t>(c));
            }
            ASSERT_FALSE(next.empty()) << text;
            // Close things more often than a uniform pick would, so walks end; ASCII more often than not.
            std::vector<uint8_t> ascii;
            for (uint8_t c : next)
                if (c < 0x80) ascii.push_back(c);
            const std::vector<uint8_t> &from = !closers.empty() && rng() % 3 == 0 ? closers
                                               : !ascii.empty() && rng() % 8 != 0 ? ascii
                                                                                  : next;
            const uint8_t c = from[rng() % from.size()];
            ASSERT_TRUE(m.feed(c));
            text.push_back(static_cast<char>(c));
        }
        if (!m.must_end()) continue;
        ++n_done;
        const ordered_json doc = ordered_json::parse(text, nullptr, false);
        ASSERT_TRUE(doc.is_object()) << text;
        std::vector<std::string> keys;
        for (const auto &item : doc.items()) keys.push_back(item.key());
        EXPECT_TRUE(keys == std::vector<std::string>({"steps", "final_answer"}) ||
                    keys == std::vector<std::string>({"steps", "final_answer", "note"}))
            << text;
        EXPECT_TRUE(doc["final_answer"].is_string()) << text;
        if (doc.contains("note")) {
            EXPECT_TRUE(doc["note"].is_string() || doc["note"].is_null()) << text;
        }
        ASSERT_TRUE(doc["steps"].is_array()) << text;
        for (const auto &step : doc["steps"]) {
            ASSERT_TRUE(step.is_object()) << text;
            EXPECT_EQ(step.size(), 2u) << text;
            EXPECT_TRUE(step["explanation"].is_string() && step["output"].is_string()) << text;
        }
    }
    EXPECT_GT(n_done, 100);
}

}  // namespace
}  // namespace td
