// Structured output: a JSON Schema (a subset) compiled into a matcher that says, byte by byte, whether a text
// can still become a JSON document the schema accepts; walked over a TokenTrie (text/token-trie.h), it says
// which tokens of a vocabulary may come next (the allowed-token mask of constrained sampling). Knows nothing
// about the server or sampling.
//
// The subset (what structured-output clients send): type object (properties, required, additionalProperties
// false or absent: only the listed properties are generated), array (items, minItems, maxItems), string
// (enum, minLength, maxLength), integer, number, boolean, null, enum and const of strings, numbers, booleans
// or null, a list of types ("type": ["string", "null"]), and the annotations that change nothing (title,
// description, $schema, default, examples). Anything else (pattern, format, anyOf, $ref, ...) is refused by
// compile with the keyword named, never silently ignored; text/json-schema-grammar.h writes such schemas as
// grammars (compile_json_constraint chooses). An empty schema or "json_object" is any JSON object.
//
// What the matcher lets through is valid JSON for the schema: properties in any order, each at most once, the
// required ones before the object closes; up to 4 whitespace characters between tokens (compile's
// max_whitespace); numbers of at most 16 digits before and after the point. A document is complete once its
// top-level value is closed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace td {

struct JsonSchemaNode;

class JsonSchema {
public:
    // schema_json: the schema as JSON text. Errors (invalid_input) name the keyword: "json_schema: 'pattern'
    // is not supported", "json_schema: 'required' names 'x', which is not in 'properties'".
    // max_whitespace: whitespace characters allowed in a row between tokens.
    static Result<std::shared_ptr<const JsonSchema>> compile(std::string_view schema_json,
                                                             int max_whitespace = 4);
    // Any JSON object (OpenAI's response_format json_object).
    static std::shared_ptr<const JsonSchema> any_object();
    ~JsonSchema();
    const JsonSchemaNode &root() const { return *root_; }
    int max_whitespace() const { return max_whitespace_; }

private:
    JsonSchema() = default;
    std::vector<std::unique_ptr<JsonSchemaNode>> nodes_;
    const JsonSchemaNode *root_ = nullptr;
    int max_whitespace_ = 4;
    friend struct JsonSchemaBuilder;
};

// The incremental matcher. Copyable and small (a fixed stack): the mask tries each token on a copy.
class JsonMatcher {
public:
    explicit JsonMatcher(std::shared_ptr<const JsonSchema> schema);
    // Feeds one byte; false (and the matcher unchanged in meaning: do not use it further) when no document
    // the schema accepts continues this way.
    bool feed(uint8_t c);
    bool feed(std::string_view bytes);
    // The top-level value is closed: nothing more may follow (the generation ends).
    bool complete() const { return depth_ == 0 && started_; }

    static constexpr int kMaxDepth = 24;

private:
    struct Frame {
        const JsonSchemaNode *node = nullptr;  // nullptr: any JSON value
        uint8_t kind = 0;                      // what this frame parses (Kind in the .cpp)
        uint8_t state = 0;                     // where it is in it
        uint16_t count = 0;                    // array items, string bytes, number digits, literal position
        uint32_t seen = 0;  // object: properties emitted (bit i: property i); key/enum: candidates left
        int32_t prop = -1;  // object: the property whose value is being read
        uint8_t lead = 0;   // string: the lead byte of a character whose second byte is still to come
    };
    bool push(const JsonSchemaNode *node, uint8_t kind);
    bool start_value(const JsonSchemaNode *node, uint8_t c);
    bool value_done();  // the top frame's value is complete: pop it and tell the parent

    std::shared_ptr<const JsonSchema> schema_;
    Frame stack_[kMaxDepth];
    int depth_ = 0;
    bool started_ = false;
    uint8_t ws_run_ = 0;  // whitespace bytes in a row
};

}  // namespace td
