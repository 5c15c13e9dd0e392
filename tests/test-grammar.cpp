// Grammars (text/grammar.*): GBNF compiles, or is refused saying where; the matcher accepts exactly the
// sentences of the grammar, byte by byte, split characters included; walked over a TokenTrie it allows
// exactly the tokens a brute-force check allows.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "gguf/gguf.h"
#include "test-util.h"
#include "text/grammar.h"
#include "text/regex-grammar.h"
#include "text/token-trie.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace td {
namespace {

std::shared_ptr<const Grammar> compile(std::string_view text) {
    auto g = Grammar::compile(text);
    EXPECT_TRUE(g.ok()) << g.status().message();
    return g.ok() ? *g : nullptr;
}

// Fed whole: accepted, and a sentence.
bool accepts(const std::shared_ptr<const Grammar> &g, std::string_view text) {
    GrammarMatcher m(g);
    return m.feed(text) && m.can_end();
}

// A JSON grammar in GBNF, with the spacing rules a model may use.
const char *k_json = R"(
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [0-9]{0,15})? ws

# up to one newline and some indentation
ws ::= | " " | "\n" [ \t]{0,20}
)";

TEST(Grammar, AcceptsTheSentencesOfTheGrammar) {
    const auto g = compile(R"(root ::= greeting " " name "."
greeting ::= "hello" | "hi"
name ::= [A-Z] [a-z]* ("-" [A-Z] [a-z]+)?)");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(accepts(g, "hello Ann."));
    EXPECT_TRUE(accepts(g, "hi Z."));
    EXPECT_TRUE(accepts(g, "hi Mary-Jane."));
    EXPECT_FALSE(accepts(g, "hi mary."));
    EXPECT_FALSE(accepts(g, "hi Mary-."));
    EXPECT_FALSE(accepts(g, "hey Ann."));
    EXPECT_FALSE(accepts(g, "hello Ann"));  // a prefix, not a sentence
    GrammarMatcher m(g);
    EXPECT_TRUE(m.feed("hello Ann"));
    EXPECT_FALSE(m.can_end());
    EXPECT_TRUE(m.feed("."));
    EXPECT_TRUE(m.can_end());
    EXPECT_TRUE(m.must_end());  // nothing may follow the full stop
    EXPECT_FALSE(m.feed("x"));
}

TEST(Grammar, RepetitionsClassesAndAnyCharacter) {
    const auto g = compile("root ::= [0-9]{2,3} \"-\" [^\\n]+ \"|\" .? \"!\"{2}");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(accepts(g, "12-ab c|x!!"));
    EXPECT_TRUE(accepts(g, "123-é|!!"));
    EXPECT_FALSE(accepts(g, "1-ab|!!"));     // one digit
    EXPECT_FALSE(accepts(g, "1234-ab|!!"));  // four
    EXPECT_FALSE(accepts(g, "12-|!!"));      // [^\n]+ needs one
    EXPECT_FALSE(accepts(g, "12-a\nb|!!"));
    EXPECT_FALSE(accepts(g, "12-ab|xy!!"));  // .? is one at most
    EXPECT_FALSE(accepts(g, "12-ab|!"));
    // {m,} and {,n}
    const auto h = compile("root ::= \"a\"{2,} \"b\"{,1}");
    EXPECT_TRUE(accepts(h, "aa"));
    EXPECT_TRUE(accepts(h, "aaaaab"));
    EXPECT_FALSE(accepts(h, "ab"));
    EXPECT_FALSE(accepts(h, "aabb"));
    GrammarMatcher m(h);
    EXPECT_TRUE(m.feed("aaa"));
    EXPECT_TRUE(m.can_end());
    EXPECT_FALSE(m.must_end());  // more a's or one b may follow
}

TEST(Grammar, RecursionThatReadsFirstIsFine) {
    const auto g = compile(R"G(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor)G");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(accepts(g, "1+2*(3-4)/-5"));
    EXPECT_TRUE(accepts(g, "((((7))))"));
    EXPECT_FALSE(accepts(g, "(1+2"));
    EXPECT_FALSE(accepts(g, "1+*2"));
    GrammarMatcher m(g);
    EXPECT_TRUE(m.feed("((1"));
    EXPECT_FALSE(m.can_end());
}

TEST(Grammar, JsonInGbnf) {
    const auto g = compile(k_json);
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(accepts(g, R"({"name": "Lily", "age": 7, "tags": ["a", {"b": null}], "x": -1.5e3})"));
    EXPECT_TRUE(accepts(g, "{\n  \"a\": [true, false],\n  \"b\": \"\\u00e9\\n\"\n}"));
    EXPECT_TRUE(accepts(g, "{}"));
    EXPECT_FALSE(accepts(g, R"({"a": 01})"));
    EXPECT_FALSE(accepts(g, R"({"a": 1,})"));
    EXPECT_FALSE(accepts(g, R"({"a" 1})"));
    EXPECT_FALSE(accepts(g, R"(["a"])"));           // root is an object
    EXPECT_FALSE(accepts(g, "{\"a\": \"x\ty\"}"));  // a raw tab inside a string
}

// A token may end inside a multi-byte character: its first bytes are taken when some character the grammar
// allows starts with them.
TEST(Grammar, CharactersSplitAcrossTokens) {
    const auto g = compile("root ::= [à-ÿ]+ \"€\"");
    ASSERT_NE(g, nullptr);
    EXPECT_TRUE(accepts(g, "éü€"));
    GrammarMatcher m(g);
    const std::string e = "é";  // C3 A9
    EXPECT_TRUE(m.feed(static_cast<uint8_t>(e[0])));
    EXPECT_FALSE(m.can_end());  // half a character is never a sentence
    EXPECT_TRUE(m.feed(static_cast<uint8_t>(e[1])));
    GrammarMatcher n(g);
    EXPECT_FALSE(n.feed(static_cast<uint8_t>(0xD0)));  // U+0400..U+043F: none allowed
    GrammarMatcher o(g);
    EXPECT_FALSE(o.feed(static_cast<uint8_t>(0xE2)));  // "€" (E2 82 AC) cannot come first
    EXPECT_TRUE(o.feed("")) << "feeding nothing changes nothing";
    GrammarMatcher p(g);
    EXPECT_TRUE(p.feed("é"));
    EXPECT_TRUE(p.feed(static_cast<uint8_t>(0xE2)));
    EXPECT_TRUE(p.feed(static_cast<uint8_t>(0x82)));
    EXPECT_FALSE(GrammarMatcher(p).feed(static_cast<uint8_t>(0xAD)));  // U+20AD, not €
    EXPECT_TRUE(p.feed(static_cast<uint8_t>(0xAC)));
    EXPECT_TRUE(p.must_end());
    // A first byte is taken only when a character the grammar allows starts with it: E0 and F0 begin only
    // characters past U+07FF and U+FFFF (the shorter forms would be overlong), so ASCII cannot follow them.
    const auto ascii = compile("root ::= [\\x00-\\x7F]+");
    for (int lead : {0xC2, 0xE0, 0xF0}) {
        EXPECT_FALSE(GrammarMatcher(ascii).feed(static_cast<uint8_t>(lead))) << lead;
    }
    const auto bmp = compile("root ::= [\\u0800-\\uFFFF]");
    EXPECT_TRUE(GrammarMatcher(bmp).feed(static_cast<uint8_t>(0xE0)));
    EXPECT_FALSE(GrammarMatcher(bmp).feed("\xED\xA0"));  // only surrogates begin so
    EXPECT_TRUE(GrammarMatcher(bmp).feed("\xED\x9F"));
    GrammarMatcher q(compile("root ::= .*"));
    EXPECT_FALSE(q.feed(static_cast<uint8_t>(0xFF)));  // never UTF-8
    GrammarMatcher r(compile("root ::= .*"));
    EXPECT_FALSE(r.feed("\xED\xA0\x80"));  // a surrogate
}

// Two matchers are in the same state when they hold the same readings, whatever text brought them there.
TEST(Grammar, SameStateIsTheSetOfReadings) {
    const auto g = compile(R"(root ::= ("a" | "b") [a-z]* "!" | "ab" [0-9])");
    ASSERT_NE(g, nullptr);
    GrammarMatcher a(g), b(g), c(g);
    ASSERT_TRUE(a.feed("bxy"));
    ASSERT_TRUE(b.feed("bx"));
    EXPECT_TRUE(a.same_state(b));  // inside [a-z]* either way
    EXPECT_EQ(a.state_hash(), b.state_hash());
    ASSERT_TRUE(c.feed("ab"));  // inside [a-z]*, or before [0-9]
    EXPECT_FALSE(a.same_state(c));
    GrammarMatcher d(g);
    ASSERT_TRUE(d.feed("a"));
    EXPECT_FALSE(d.feed("\xC3"));  // the first half of é..ÿ: [a-z] takes none of them
}

TEST(Grammar, ErrorsSayWhere) {
    struct Case {
        const char *text;
        const char *message;
    };
    const Case cases[] = {
        {"root ::= \"a\"\nname ::= other", "rule 'other' is used but not defined"},
        {"start ::= \"a\"", "there is no rule 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
        {"root = \"a\"", "line 1, column 6: expected '::='"},
        {"root ::= \"a", "unterminated literal"},
        {"root ::= [a-", "unterminated character class"},
        {"root ::= [z-a]", "the range's end is before its start"},
        {"root ::= (\"a\" | \"b\"", "expected ')'"},
        {"root ::= * \"a\"", "'*' follows nothing to repeat"},
        {"root ::= \"a\"{3,2}", "maximum is below its minimum"},
        {"root ::= \"a\"{5000}", "repetition counts go up to 1000"},
        {"root ::= \"a\" )", "expected the end of the line, got ')'"},
        {"root ::= \"\\q\"", "unknown escape '\\q'"},
        {"root ::= expr\nexpr ::= expr \"+\" [0-9] | [0-9]", "left recursion in rule 'expr'"},
        {"root ::= a\na ::= b? a \"x\"\nb ::= \"y\"", "left recursion in rule 'a'"},
        {"root ::= (\"a\"?)*", "left recursion in rule 'root' (in a group or repetition)"},
        {"root ::= \"\\uD800\\U00110000\"", "past U+10FFFF"},
    };
    // Nesting that would take the parser or the matcher too deep.
    const std::string groups = "root ::= " + std::string(70, '(') + "\"a\"" + std::string(70, ')');
    std::string chain = "root ::= r0\n";
    for (int i = 0; i < 3000; ++i) chain += fmt::format("r{} ::= r{}\n", i, i + 1);
    chain += "r3000 ::= \"x\"\n";
    std::vector<Case> all(std::begin(cases), std::end(cases));
    all.push_back({groups.c_str(), "groups nest deeper than 64"});
    all.push_back({chain.c_str(), "nest too deeply before the first character"});
    for (const Case &c : all) {
        auto g = Grammar::compile(c.text);
        ASSERT_FALSE(g.ok()) << c.text;
        EXPECT_EQ(g.status().kind(), ErrorKind::invalid_input);
        EXPECT_NE(g.status().message().find(c.message), std::string::npos)
            << c.text << "\n  said: " << g.status().message();
    }
    // Many ways to begin are fine: 500 words, each its own reading until its first character.
    std::string words = "root ::= w0";
    for (int i = 1; i < 500; ++i) words += fmt::format(" | \"{}{}\"", static_cast<char>('a' + i % 26), i);
    words += "\nw0 ::= \"zero\"";
    const auto w = compile(words);
    ASSERT_NE(w, nullptr);
    EXPECT_TRUE(accepts(w, "b1"));
    EXPECT_TRUE(accepts(w, "f499"));
    EXPECT_TRUE(accepts(w, "zero"));
    EXPECT_FALSE(accepts(w, "b2"));
    // 30 ways to the same 40 readings: each is kept once (1,200 would be more than a matcher keeps).
    std::string same = "root ::= s";
    for (int i = 1; i < 30; ++i) same += " | s";
    same += "\ns ::= \"a0\"";
    for (int i = 1; i < 40; ++i) same += fmt::format(" | \"a{}\"", i);
    const auto t = compile(same);
    ASSERT_NE(t, nullptr);
    EXPECT_TRUE(accepts(t, "a39"));
    // Comments, blank lines and rules broken across lines are not errors.
    EXPECT_NE(compile("# a comment\n\nroot ::= # the start\n  \"a\" |\n  \"b\" # or b\n\n"), nullptr);
}

// The trie walk allows exactly the tokens whose bytes a copy of the matcher takes, on a real vocabulary, at
// every byte of JSON documents and an arithmetic expression.
TEST(Grammar, TheTokenTrieAgreesWithTheMatcher) {
    auto file = gguf::File::open(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(file.ok()) << file.status().message();
    auto vocab = Vocab::from_gguf(*file);
    ASSERT_TRUE(vocab.ok()) << vocab.status().message();
    auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(*vocab)));
    ASSERT_TRUE(tok.ok());
    const int32_t n_vocab = (*tok)->vocab().n_tokens();
    std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
    for (int32_t id = 0; id < n_vocab; ++id)
        if (!(*tok)->vocab().is_control(id)) pieces[static_cast<size_t>(id)] = (*tok)->token_to_piece(id);
    // Multi-byte pieces, and one that is a prefix of another, to exercise split characters and the trie.
    pieces.push_back("\xC3");
    pieces.push_back("\xC3\xA9");
    pieces.push_back("\xA9");
    pieces.push_back("\"x\": ");
    const TokenTrie trie(pieces);
    const std::pair<const char *, const char *> walks[] = {
        {k_json, "{\"name\": \"Lily é\", \"age\": 7, \"t\": [true, {\"b\": null}]}"},
        {"root ::= expr\nexpr ::= [0-9]+ | \"(\" expr (\"+\" expr)* \")\"", "(1+(22+3)+4)"},
    };
    std::vector<uint8_t> allowed;
    size_t n_checked = 0, n_allowed = 0, n_hits = 0;
    for (const auto &[grammar, text] : walks) {
        const auto g = compile(grammar);
        ASSERT_NE(g, nullptr);
        GrammarMatcher walk(g);
        GrammarMasks masks(4);  // the masks of recent states, as the server keeps them
        const std::string s = text;
        for (size_t i = 0; i <= s.size(); ++i) {
            n_allowed += trie.allowed(walk, allowed);
            size_t n_kept = 0;
            ASSERT_EQ(masks.allowed(trie, walk, n_kept), allowed) << "at " << i;
            EXPECT_EQ(n_kept, static_cast<size_t>(std::count(allowed.begin(), allowed.end(), 1)));
            for (size_t id = 0; id < pieces.size(); ++id) {
                GrammarMatcher t = walk;
                const bool ok = !pieces[id].empty() && t.feed(pieces[id]);
                ASSERT_EQ(allowed[id] != 0, ok) << "at " << i << ", token '" << pieces[id] << "'";
                ++n_checked;
            }
            if (i < s.size()) {
                ASSERT_TRUE(walk.feed(static_cast<uint8_t>(s[i]))) << "at " << i;
            }
        }
        EXPECT_TRUE(walk.can_end());
        n_hits += masks.n_hits();
        EXPECT_EQ(masks.n_hits() + masks.n_walks(), s.size() + 1);
    }
    EXPECT_GT(n_hits, 10u);       // inside strings and numbers the state repeats
    EXPECT_GT(n_allowed, 1000u);  // the check saw tokens allowed, not only refused
    EXPECT_GT(n_checked, 10000u);
}

// Random walks over the allowed tokens always give a sentence prefix; a walk that ends where it may is a
// sentence the grammar accepts from the start.
TEST(Grammar, RandomWalksGiveSentences) {
    const auto g = compile(k_json);
    ASSERT_NE(g, nullptr);
    std::vector<std::string> pieces;
    for (const char *p : {"{", "}",   "[",       "]", "\"", ",", ":",  " ",    "\n",   "  ",      "a",
                          "é", "\\n", "\\u00e9", "1", "-",  ".", "5e", "true", "null", "\"k\": ", "0"})
        pieces.push_back(p);
    const TokenTrie trie(pieces);
    std::mt19937 rng(7);
    std::vector<uint8_t> allowed;
    int n_done = 0;
    for (int walk = 0; walk < 200; ++walk) {
        GrammarMatcher m(g);
        std::string text;
        for (int step = 0; step < 60 && !m.must_end(); ++step) {
            if (m.can_end() && rng() % 4 == 0) break;
            const size_t n = trie.allowed(m, allowed);
            ASSERT_GT(n, 0u) << text;
            size_t pick = rng() % n;
            for (size_t id = 0; id < allowed.size(); ++id)
                if (allowed[id] && pick-- == 0) {
                    ASSERT_TRUE(m.feed(pieces[id]));
                    text += pieces[id];
                    break;
                }
        }
        if (m.can_end()) {
            ++n_done;
            EXPECT_TRUE(accepts(g, text)) << text;
        }
    }
    EXPECT_GT(n_done, 5);
}

// A regular expression becomes a grammar whose sentences are the texts it matches whole.
TEST(RegexGrammar, SentencesAreTheTextsTheRegexMatches) {
    struct Case {
        const char *regex;
        std::vector<std::pair<std::string, bool>> texts;  // and whether the regex matches it whole (Python's
                                                          // re.fullmatch said so)
    };
    const Case cases[] = {
        {"\\d{3}-[a-z]{2,5}",
         {{"123-ab", true},
          {"123-abcde", true},
          {"12-ab", false},
          {"123-abcdef", false},
          {"123-", false},
          {"abc-de", false},
          {"999-zz", true}}},
        {"^(yes|no)(, (please|thanks))?\\.$",
         {{"yes.", true},
          {"no, thanks.", true},
          {"yes, please.", true},
          {"yes", false},
          {"no, hi.", false},
          {"maybe.", false}}},
        {"[A-Z][a-z]+( [A-Z][a-z]+)*",
         {{"Ann", true},
          {"Mary Jane", true},
          {"mary", false},
          {"Mary jane", false},
          {"Mary  Jane", false},
          {"A", false}}},
        {"(?:ab|cd)+e?",
         {{"ab", true}, {"abcd", true}, {"cdabe", true}, {"e", false}, {"abc", false}, {"abee", false}}},
        {"\\w+@\\w+\\.(com|org)",
         {{"me@x.com", true},
          {"a_b@c9.org", true},
          {"me@x.net", false},
          {"@x.com", false},
          {"me@x..com", false}}},
        {"[^\\s,]+(,[^\\s,]+){0,2}",
         {{"a", true}, {"a,b,c", true}, {"a,b,c,d", false}, {"a, b", false}, {"a,,b", false}}},
        {"-?(0|[1-9]\\d*)(\\.\\d+)?",
         {{"0", true}, {"-12.5", true}, {"007", false}, {"1.", false}, {"3.14159", true}, {"-0", true}}},
        {"\\x41\\.\\*[\\]\\-]+", {{"A.*]-", true}, {"A.*", false}, {"a.*]", false}, {"A.*-]-", true}}},
        {"a.c", {{"abc", true}, {"a c", true}, {"a\nc", false}, {"ac", false}}},
        {"[\\d\\s]+x{2}", {{"1 2xx", true}, {"xx", false}, {" 9xx", true}, {"1x", false}}},
        {"", {{"", true}, {"a", false}}},
    };
    for (const Case &c : cases) {
        auto gbnf = regex_to_gbnf(c.regex);
        ASSERT_TRUE(gbnf.ok()) << c.regex << ": " << gbnf.status().message();
        const auto g = compile(*gbnf);
        ASSERT_NE(g, nullptr) << c.regex << " -> " << *gbnf;
        for (const auto &[t, matches] : c.texts)
            EXPECT_EQ(accepts(g, t), matches) << c.regex << " on '" << t << "' via " << *gbnf;
    }
    const std::pair<const char *, const char *> bad[] = {
        {"(a", "unbalanced '('"},
        {"a)", "unbalanced ')'"},
        {"(?=a)b", "lookarounds"},
        {"(a)\\1", "backreferences"},
        {"\\bword", "word boundaries"},
        {"a^b", "'^' is supported only at the start"},
        {"a$b", "'$' is supported only at the end"},
        {"*a", "'*' follows nothing to repeat"},
        {"a**", "a quantifier follows a quantifier"},
        {"[a-", "unterminated character class"},
        {"[\\W]", "inside a class are not supported"},
        {"\\q", "unknown escape"},
        {"a[\xF6\x9E\x8D\x8A]", "invalid UTF-8"},  // past U+10FFFF (a fuzzer's find: it was an abort)
        {"a\xC0\xAF", "invalid UTF-8"},            // overlong
        {"a\xED\xA0\x80", "invalid UTF-8"},        // a surrogate
    };
    for (const auto &[regex, message] : bad) {
        auto gbnf = regex_to_gbnf(regex);
        ASSERT_FALSE(gbnf.ok()) << regex << " -> " << *gbnf;
        EXPECT_NE(gbnf.status().message().find(message), std::string::npos) << gbnf.status().message();
    }
    // Characters past ASCII are UTF-8 text.
    auto accented = regex_to_gbnf("\\u00e9+[à-ü]");
    ASSERT_TRUE(accented.ok());
    EXPECT_TRUE(accepts(compile(*accented), "ééü"));
    EXPECT_FALSE(accepts(compile(*accented), "é"));  // [à-ü] needs a character of its own
    // Choices: exactly the texts, quotes and backslashes and control characters included.
    auto choices = choices_to_gbnf({"yes", "no", "say \"hi\"\\", "tab\there", ""});
    ASSERT_TRUE(choices.ok());
    const auto g = compile(*choices);
    ASSERT_NE(g, nullptr) << *choices;
    for (const char *t : {"yes", "no", "say \"hi\"\\", "tab\there", ""}) EXPECT_TRUE(accepts(g, t)) << t;
    for (const char *t : {"ye", "yes!", "say hi", "No"}) EXPECT_FALSE(accepts(g, t)) << t;
    EXPECT_FALSE(choices_to_gbnf({}).ok());
}

}  // namespace
}  // namespace td
