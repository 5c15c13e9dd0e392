// Grammars (text/grammar.*), which come from HTTP requests: any GBNF text compiled, and when it compiles, any
// text fed to its matcher byte by byte, with the token mask (a trie of pieces, the masks of recent states)
// taken at each step. The first part is also read as a regular expression (text/regex-grammar.*: vLLM's
// guided_regex) and as a JSON schema (text/json-schema-grammar.*: response_format, guided_json, Ollama's
// format), and their grammars run the same way. Input: the grammar, regex or schema, a NUL, then the text.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz-util.h"
#include "text/grammar.h"
#include "text/json-schema-grammar.h"
#include "text/regex-grammar.h"
#include "text/token-trie.h"

using namespace td;

namespace {

const std::vector<std::string> kPieces = {
    "a", "ab", "abc", "b", " ", "\n", "\"",   "{",    "}",  "[", "]",   ",",  ":",        "0",
    "1", "12", "-",   ".", "e", "é",  "\xC3", "\xA9", "\\", "x", "yes", "no", "\xE2\x82", "\xAC"};

}  // namespace

TD_FUZZ_INIT(grammar) {
    std::vector<fuzz::Bytes> seeds;
    const std::string nul(1, '\0');
    seeds.push_back(
        fuzz::bytes_of("root ::= (\"yes\" | \"no\") \", \" [a-z ]{3,30} \".\"" + nul + "yes, abc."));
    seeds.push_back(
        fuzz::bytes_of("root ::= object\nvalue ::= object | array | string | [0-9]+ ws\nobject ::= \"{\" ws "
                       "( string \":\" ws value "
                       "(\",\" ws string \":\" ws value)* )? \"}\" ws\narray ::= \"[\" ws ( value (\",\" ws "
                       "value)* )? \"]\" "
                       "ws\nstring ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" [\"\\\\nt] )* "
                       "\"\\\"\" ws\nws ::= | \" \" | "
                       "\"\\n\" [ \\t]{0,4}" +
                       nul + "{\"a\": [1, {\"b\": \"x\\n\"}]}"));
    seeds.push_back(
        fuzz::bytes_of("root ::= expr\nexpr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+ | \"(\" "
                       "expr \")\"  # comment\n" +
                       nul + "(1+(2-3))"));
    seeds.push_back(fuzz::bytes_of("root ::= [^\\n]{2,} \"\\u20AC\" .? [à-ÿ]*" + nul + "ab€xéü"));
    seeds.push_back(fuzz::bytes_of("^(yes|no)(, (?:please|thanks))?\\.$" + nul + "yes, please."));
    seeds.push_back(fuzz::bytes_of("\\d{3}-[a-z\\]]{2,5}\\w*[^\\s,]+?" + nul + "123-ab]x"));
    seeds.push_back(fuzz::bytes_of(
        R"({"$defs": {"P": {"type": "object", "properties": {"n": {"type": "string", "pattern": "^[A-Z]\\w+"},)"
        R"( "age": {"anyOf": [{"type": "integer", "minimum": -3, "maximum": 120}, {"type": "null"}]}},)"
        R"( "required": ["n"], "additionalProperties": {"type": "number", "exclusiveMinimum": 0}}},)"
        R"( "type": "array", "items": {"$ref": "#/$defs/P"}, "maxItems": 3})" +
        nul + R"([{"n": "Ann", "age": 7, "x": 0.5}, {"n": "Bo"}])"));
    seeds.push_back(fuzz::bytes_of(
        R"({"type": "object", "properties": {"d": {"type": "string", "format": "date-time"}, "t": )"
        R"({"type": "array", "prefixItems": [{"const": 1}, {"enum": ["a", null]}]}}, "allOf": [{"required": ["d"]}]})" +
        nul + R"({"d": "2024-01-02T03:04:05Z", "t": [1, "a"]})"));
    seeds.push_back(fuzz::bytes_of(
        R"({"type": "object", "properties": {"p": {"type": "number", "minimum": -1.25, "exclusiveMaximum": 0.105},)"
        R"( "q": {"type": "number", "exclusiveMinimum": 2.5e-3, "maximum": 7}}, "required": ["p"]})" +
        nul + R"({"p": -0.5, "q": 2.75})"));
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

namespace {

void run(const std::shared_ptr<const Grammar> &g, std::string_view text) {
    static const TokenTrie trie(kPieces);
    GrammarMatcher m(g);
    GrammarMasks masks(2);
    std::vector<uint8_t> allowed;
    size_t n = 0;
    for (size_t i = 0; i < text.size() && i < 256; ++i) {
        (void)masks.allowed(trie, m, n);
        if (i % 8 == 0) (void)trie.allowed(m, allowed);
        (void)m.can_end();
        (void)m.must_end();
        if (!m.feed(static_cast<uint8_t>(text[i]))) break;
    }
}

}  // namespace

TD_FUZZ_TARGET(grammar) {
    const std::string_view in(reinterpret_cast<const char *>(data), size);
    const size_t nul = in.find('\0');
    const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
    const std::string_view head = in.substr(0, nul);
    if (auto g = Grammar::compile(head); g.ok()) run(*g, text);
    if (auto gbnf = regex_to_gbnf(head); gbnf.ok()) {
        auto g = Grammar::compile(*gbnf);
        if (g.ok()) run(*g, text);
    }
    if (auto gbnf = json_schema_to_gbnf(head); gbnf.ok()) {
        auto g = Grammar::compile(*gbnf);
        if (g.ok()) run(*g, text);
    }
    return 0;
}
