// JSON Schema beyond JsonSchema's subset (text/json-schema.h), written as a GBNF grammar (text/grammar.h)
// whose sentences are JSON documents the schema accepts: what OpenAI's SDK sends for a Pydantic model
// ($defs and $ref, anyOf for Optional fields), what llama.cpp's json-schema-to-grammar and vLLM's structured
// outputs take. Knows nothing about the server or sampling.
//
// What it takes:
// - type (one or a list), enum and const of any JSON values (written compactly), anyOf and oneOf (oneOf as
//   anyOf: a value that matches two members is not refused), allOf (object members merged), $ref to any
//   JSON pointer into the same document ("#", "#/$defs/x", "#/definitions/x"), recursion included,
//   OpenAPI's nullable, and the annotations (title, description, default, examples, $schema, $id,
//   $comment, discriminator, readOnly, writeOnly, deprecated, strict).
// - object: properties in the schema's order, the required ones always, each optional one present or not;
//   additionalProperties false (or absent, where there are properties): no other key; true, {} or a schema:
//   more members after them, with keys that are none of the properties'. An object with neither: any
//   object.
// - array: items, prefixItems (and items as a list, draft 4's tuples), minItems, maxItems.
// - string: minLength, maxLength, pattern (a regular expression as text/regex-grammar.h takes it, searched
//   as JSON Schema says: ^ and $ anchor it), format date, time, date-time, uuid, ipv4 and email; other
//   formats are annotations, as JSON Schema has them (any string).
// - integer: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers, or draft 4's booleans).
// - number: the same bounds, exact to the bound's decimal digits (16 after the point at most); a bounded
//   number is written without an exponent.
// Anything else (not, if, patternProperties, uniqueItems, multipleOf, ...) is refused with the keyword
// named, never ignored. Numbers have at most 16 digits before and after the point, as JsonSchema's.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/status.h"
#include "text/grammar.h"
#include "text/json-schema.h"

namespace td {

// The grammar as GBNF text. max_whitespace: whitespace characters allowed in a row between tokens. Errors
// (invalid_input) name the keyword and where: "json_schema: 'not' (the schema.a) is not supported".
Result<std::string> json_schema_to_gbnf(std::string_view schema_json, int max_whitespace = 4);

// What a JSON schema constrains a reply with: the JsonSchema matcher when the schema is within its subset
// (properties in any order, the cheaper mask), else the grammar json_schema_to_gbnf writes (properties in
// the schema's order). Exactly one is set.
struct JsonConstraint {
    std::shared_ptr<const JsonSchema> schema;
    std::shared_ptr<const Grammar> grammar;
};
Result<JsonConstraint> compile_json_constraint(std::string_view schema_json, int max_whitespace = 4);

}  // namespace td
