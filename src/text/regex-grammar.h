// Other constraint notations as GBNF grammars (text/grammar.h), for the matcher that grammars already have:
// a regular expression (vLLM's guided_regex / structured_outputs.regex) and a list of choices
// (guided_choice).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace td {

// The regular expression as a grammar whose sentences are the texts the expression matches whole (as vLLM
// applies it: ^ at the start and $ at the end change nothing). Supported: literals and escapes (\n \t \r \f
// \v \xHH \uHHHH and escaped punctuation), . (any character but a newline), classes [...] and [^...] with
// ranges, \d \w \s and \D \W \S (the negated ones outside classes), groups (...) and (?:...), |, and the
// quantifiers * + ? {m} {m,} {m,n} (lazy or possessive marks are accepted: the set of texts is the same).
// Errors (invalid_input) name what is not supported: backreferences, lookarounds, anchors inside, \b.
Result<std::string> regex_to_gbnf(std::string_view regex);

// The same as one GBNF expression, with no rule of its own (a JSON schema's "pattern" inside a bigger
// grammar). json_string: the texts are the insides of JSON strings whose values the expression matches:
// '"', '\\' and control characters come as JSON escapes, and a class or '.' lets control characters in only
// through \b \f \n \r \t.
Result<std::string> regex_to_gbnf_expression(std::string_view regex, bool json_string);

// A grammar whose sentences are exactly the given texts. Error when the list is empty.
Result<std::string> choices_to_gbnf(const std::vector<std::string> &choices);

}  // namespace td
