// Structured output (text/json-schema.*): the schema subset compiles or is refused naming the keyword; the
// matcher accepts exactly the documents the schema allows, byte by byte; the token filter agrees with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>

#include "text/json-schema.h"
#include "text/token-trie.h"

namespace td {
namespace {

const char *k_person = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer"},
    "mood": {"enum": ["happy", "sad", 3, null]},
    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
    "score": {"type": "number"},
    "ok": {"type": ["boolean", "null"]}},
  "required": ["name", "age", "mood", "tags"], "additionalProperties": false})";

std::shared_ptr<const JsonSchema> person() {
    auto s = JsonSchema::compile(k_person);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return *s;
}

// Fed whole: accepted and complete.
bool accepts(const std::shared_ptr<const JsonSchema> &s, std::string_view doc) {
    JsonMatcher m(s);
    return m.feed(doc) && m.complete();
}

TEST(JsonSchema, AcceptsWhatTheSchemaAllows) {
    const auto s = person();
    EXPECT_TRUE(accepts(s, R"({"name": "Lily", "age": 7, "mood": "happy", "tags": ["a"]})"));
    EXPECT_TRUE(accepts(s, R"({"tags":["x","y","z"],"mood":3,"age":-12,"name":"","score":1.5e3,"ok":null})"));
    EXPECT_TRUE(accepts(
        s,
        "{\n  \"name\": \"\\u00e9t\\u00e9\",\n  \"age\": 0, \"mood\": null, \"tags\": [\"\\\"q\\\"\"]\n}"));
    EXPECT_TRUE(accepts(s, R"({"name": "Zoë", "age": 1, "mood": "sad", "tags": ["été"], "ok": true})"));
}

TEST(JsonSchema, RefusesWhatItDoesNot) {
    const auto s = person();
    EXPECT_FALSE(accepts(s, R"({"name": "Lily", "age": 7, "mood": "happy"})"));  // tags required
    EXPECT_FALSE(accepts(s, R"({"name": "Lily", "age": 7.5, "mood": "sad", "tags": ["a"]})"));  // integer
    EXPECT_FALSE(accepts(s, R"({"name": "Lily", "age": 07, "mood": "sad", "tags": ["a"]})"));   // leading 0
    EXPECT_FALSE(accepts(s, R"({"name": "Lily", "age": 7, "mood": "angry", "tags": ["a"]})"));  // enum
    EXPECT_FALSE(accepts(s, R"({"name": "Lily", "age": 7, "mood": "sad", "tags": []})"));       // minItems
    EXPECT_FALSE(accepts(s, R"({"name": "Lily", "age": 7, "mood": "sad", "tags": ["a","b","c","d"]})"));
    EXPECT_FALSE(accepts(s, R"({"name": "Lily the very tall", "age": 7, "mood": "sad", "tags": ["a"]})"));
    EXPECT_FALSE(accepts(s, R"({"name": "L", "name": "M", "age": 7, "mood": "sad", "tags": ["a"]})"));
    EXPECT_FALSE(accepts(s, R"({"nick": "L", "age": 7, "mood": "sad", "tags": ["a"]})"));   // unknown key
    EXPECT_FALSE(accepts(s, R"({"name": "L", "age": 7, "mood": "sad", "tags": ["a"]} )"));  // after the end
    EXPECT_FALSE(
        accepts(s, "{\"name\": \"a\nb\", \"age\": 1, \"mood\": 3, \"tags\": [\"a\"]}"));  // raw newline
    EXPECT_FALSE(
        accepts(s, "{     \"name\": \"a\", \"age\": 1, \"mood\": 3, \"tags\": [\"a\"]}"));  // 5 spaces
    EXPECT_FALSE(
        accepts(s, "{\"name\": \"\xff\", \"age\": 1, \"mood\": 3, \"tags\": [\"a\"]}"));  // not UTF-8
    JsonMatcher m(s);
    EXPECT_TRUE(m.feed(R"({"name": "Lily")"));
    EXPECT_FALSE(m.complete());
    // Strings are UTF-8: no overlong form, surrogate or code point past U+10FFFF.
    const auto any = JsonSchema::any_object();
    EXPECT_TRUE(accepts(any, "{\"a\": \"\xE0\xA0\x80 \xED\x9F\xBF \xF4\x8F\xBF\xBF\"}"));
    for (const char *bad :
         {"\xE0\x9F\xBF", "\xED\xA0\x80", "\xF0\x8F\xBF\xBF", "\xF4\x90\x80\x80", "\xC1\xBF"})
        EXPECT_FALSE(accepts(any, std::string("{\"a\": \"") + bad + "\"}")) << bad;
}

TEST(JsonSchema, AnyObjectTakesAnyJsonObject) {
    const auto s = JsonSchema::any_object();
    EXPECT_TRUE(accepts(s, R"({"a": [1, {"b": null}, "x", -0.5e-3, true], "": {}})"));
    EXPECT_TRUE(accepts(s, "{}"));
    EXPECT_FALSE(accepts(s, "[1]"));
    EXPECT_FALSE(accepts(s, R"({"a": tru})"));
    EXPECT_FALSE(accepts(s, R"({"a" 1})"));
    auto empty = JsonSchema::compile("{}");
    ASSERT_TRUE(empty.ok());
    EXPECT_TRUE(accepts(*empty, R"({"k": [1, 2]})"));
}

TEST(JsonSchema, UnsupportedKeywordsAreNamed) {
    const auto error = [](const char *schema) {
        auto s = JsonSchema::compile(schema);
        return s.ok() ? std::string() : s.status().message();
    };
    EXPECT_NE(error(R"({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a"}}})")
                  .find("'pattern'"),
              std::string::npos);
    EXPECT_NE(error(R"({"anyOf": [{"type": "string"}]})").find("'anyOf'"), std::string::npos);
    EXPECT_NE(error(R"({"type": "object", "required": ["x"], "properties": {}})").find("\"x\""),
              std::string::npos);
    EXPECT_NE(error(R"({"type": "string"})").find("top level"), std::string::npos);
    EXPECT_NE(error(R"({"type": "object", "additionalProperties": {"type": "string"}})")
                  .find("additionalProperties"),
              std::string::npos);
    EXPECT_NE(error("not json").find("not valid JSON"), std::string::npos);
    EXPECT_EQ(
        error(
            R"({"type": "object", "title": "t", "description": "d", "properties": {"a": {"type": "integer", "default": 1}}})"),
        "");
}

// The filter allows a token exactly when the matcher takes all its bytes.
TEST(JsonSchema, TheTokenFilterAgreesWithTheMatcher) {
    const std::vector<std::string> pieces = {
        "",  "{", "{\"", "\"name", "\": \"", "Lily",        "\",", " \"age", "\":", " 7",
        "}", " ", "\n",  "x",      "\"",     "\"mood\": 3", "]",   "[",      "1"};
    TokenTrie filter(pieces);
    std::vector<uint8_t> allowed;
    JsonMatcher m(person());
    EXPECT_EQ(filter.allowed(m, allowed), 4u);  // "{", "{\"", " " and "\n" can start the document
    EXPECT_TRUE(allowed[1] && allowed[2] && allowed[11] && allowed[12]);
    EXPECT_FALSE(allowed[0] || allowed[13] || allowed[18]);
    // Against a brute-force check at every prefix of a valid document.
    const std::string doc = R"({"name": "Lily", "age": 7, "mood": 3, "tags": ["x"]})";
    JsonMatcher walk(person());
    for (size_t i = 0; i < doc.size(); ++i) {
        filter.allowed(walk, allowed);
        for (size_t id = 0; id < pieces.size(); ++id) {
            JsonMatcher t = walk;
            const bool ok = !pieces[id].empty() && t.feed(pieces[id]);
            EXPECT_EQ(allowed[id] != 0, ok) << "at " << i << ", token '" << pieces[id] << "'";
        }
        ASSERT_TRUE(walk.feed(static_cast<uint8_t>(doc[i])));
    }
    EXPECT_TRUE(walk.complete());
}

// Random walks through the matcher always produce a document that parses and that the schema's rules hold
// for.
TEST(JsonSchema, RandomWalksGiveValidDocuments) {
    const auto s = person();
    std::mt19937 rng(7);
    const std::string alphabet =
        "{}[]\":, \n0123456789-.eE+abcdefghijklmnopqrstuvwxyz\\ntruefalsenull\"mood\"name\"age\"tags";
    int complete = 0;
    for (int walk = 0; walk < 300; ++walk) {
        JsonMatcher m(s);
        std::string doc;
        for (int step = 0; step < 400 && !m.complete(); ++step) {
            std::vector<char> ok;
            for (char c : alphabet) {
                JsonMatcher t = m;
                if (t.feed(static_cast<uint8_t>(c))) ok.push_back(c);
            }
            if (ok.empty()) break;
            const char c = ok[rng() % ok.size()];
            ASSERT_TRUE(m.feed(static_cast<uint8_t>(c)));
            doc += c;
        }
        if (!m.complete()) continue;
        ++complete;
        auto j = nlohmann::json::parse(doc, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << doc;
        ASSERT_TRUE(j.is_object()) << doc;
        for (const char *k : {"name", "age", "mood", "tags"}) EXPECT_TRUE(j.contains(k)) << doc;
        EXPECT_TRUE(j["age"].is_number_integer()) << doc;
        EXPECT_TRUE(j["tags"].is_array() && !j["tags"].empty() && j["tags"].size() <= 3) << doc;
        const std::string name = j["name"];
        EXPECT_LE(std::count_if(name.begin(), name.end(), [](char ch) { return (ch & 0xc0) != 0x80; }), 12)
            << doc;
    }
    EXPECT_GT(complete, 10);
}

}  // namespace
}  // namespace td
