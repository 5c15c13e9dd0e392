// Constrained output's cost per decode step: the allowed-token mask of a JSON schema (text/json-schema.h), of
// the same schema as the grammar a schema beyond that matcher's subset becomes (text/json-schema-grammar.h),
// and of a JSON grammar in GBNF (text/grammar.h), over a real vocabulary, at every byte of a document all
// accept.
// Prints, for each, the median, mean and worst time of one mask, to set against a decode step of the same
// minutes.
//
//   json-mask VOCAB.gguf [ROUNDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "text/grammar.h"
#include "text/json-schema-grammar.h"
#include "text/json-schema.h"
#include "text/token-trie.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

using namespace td;

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: json-mask VOCAB.gguf [ROUNDS]\n");
        return 2;
    }
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
    auto file = gguf::File::open(argv[1]);
    if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().message().c_str()), 1;
    auto vocab = Vocab::from_gguf(*file);
    if (!vocab.ok()) return std::fprintf(stderr, "%s\n", vocab.status().message().c_str()), 1;
    auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(*vocab)));
    if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.status().message().c_str()), 1;
    const int32_t n_vocab = (*tok)->vocab().n_tokens();
    std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
    for (int32_t id = 0; id < n_vocab; ++id)
        if (!(*tok)->vocab().is_control(id)) pieces[static_cast<size_t>(id)] = (*tok)->token_to_piece(id);
    const char *schema_text = R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "mood": {"enum": ["happy", "sad", "curious"]}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "mood", "tags"]})";
    auto schema = JsonSchema::compile(schema_text);
    if (!schema.ok()) return std::fprintf(stderr, "%s\n", schema.status().message().c_str()), 1;
    auto schema_gbnf = json_schema_to_gbnf(schema_text);
    if (!schema_gbnf.ok()) return std::fprintf(stderr, "%s\n", schema_gbnf.status().message().c_str()), 1;
    auto schema_grammar = Grammar::compile(*schema_gbnf);
    if (!schema_grammar.ok())
        return std::fprintf(stderr, "%s\n", schema_grammar.status().message().c_str()), 1;
    const std::string doc =
        R"({"name": "Lily the little girl", "age": 7, "mood": "curious", "tags": ["park", "sun", "ball"]})";
    const auto t_build = std::chrono::steady_clock::now();
    TokenTrie filter(pieces);
    const double build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_build).count();
    // What a client passes as llama-server's "grammar" for JSON: any object, any value inside.
    auto grammar = Grammar::compile(R"G(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws
object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
array  ::= "[" ws ( value ("," ws value)* )? "]" ws
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [0-9]{0,15})? ws
ws     ::= | " " | "\n" [ \t]{0,20}
)G");
    if (!grammar.ok()) return std::fprintf(stderr, "%s\n", grammar.status().message().c_str()), 1;
    // make(): a matcher at the document's start; mask(m, allowed): the tokens it allows (a new request each
    // round).
    auto report = [&](const char *what, auto make, auto mask) -> int {
        std::vector<double> us;
        std::vector<uint8_t> allowed;
        size_t n_allowed = 0;
        for (int r = 0; r < rounds; ++r) {
            auto m = make();
            GrammarMasks masks;
            for (char c : doc) {
                const auto t0 = std::chrono::steady_clock::now();
                n_allowed += mask(m, allowed, masks);
                us.push_back(
                    std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
                if (!m.feed(static_cast<uint8_t>(c)))
                    return std::fprintf(stderr, "%s: the document does not match\n", what), 1;
            }
        }
        std::sort(us.begin(), us.end());
        double sum = 0;
        for (double u : us) sum += u;
        std::printf(
            "{\"mask\": \"%s\", \"n_vocab\": %d, \"masks\": %zu, \"median_us\": %.1f, \"mean_us\": %.1f, "
            "\"max_us\": %.1f, \"mean_allowed\": %.1f, \"build_ms\": %.1f}\n",
            what, n_vocab, us.size(), us[us.size() / 2], sum / static_cast<double>(us.size()), us.back(),
            static_cast<double>(n_allowed) / static_cast<double>(us.size()), build_ms);
        return 0;
    };
    auto walk = [&](const auto &m, std::vector<uint8_t> &allowed, GrammarMasks &) {
        return filter.allowed(m, allowed);
    };
    auto schema_start = [&] { return JsonMatcher(*schema); };
    auto grammar_start = [&] { return GrammarMatcher(*grammar); };
    auto schema_grammar_start = [&] { return GrammarMatcher(*schema_grammar); };
    // As the server does it: the masks of a request's 8 most recent states are kept.
    auto kept = [&](const GrammarMatcher &m, std::vector<uint8_t> &allowed, GrammarMasks &masks) {
        size_t n = 0;
        allowed = masks.allowed(filter, m, n);
        return n;
    };
    if (report("json_schema", schema_start, walk) != 0) return 1;
    if (report("grammar, every mask walked", grammar_start, walk) != 0) return 1;
    if (report("grammar", grammar_start, kept) != 0) return 1;
    if (report("json_schema as a grammar", schema_grammar_start, kept) != 0) return 1;
    return 0;
}
