// The Jinja interpreter against the reference: python3-jinja2 set up as Hugging Face's apply_chat_template
// (tests/jinja/reference.py) renders the same templates with the same variables, and the texts must be equal
// byte for byte; where Python fails, tandem must fail too (with the same message for raise_exception).
#include <gtest/gtest.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "test-util.h"
#include "text/jinja.h"

namespace td {
namespace {

using nlohmann::json;

std::string read_file(const std::filesystem::path &p) {
    std::ifstream f(p, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

// The reference clock of reference.py: 2026-07-26 12:00:00.
jinja::RenderOptions fixed_clock() {
    jinja::RenderOptions o;
    o.now = [] {
        std::tm tm{};
        tm.tm_year = 2026 - 1900;
        tm.tm_mon = 6;
        tm.tm_mday = 26;
        tm.tm_hour = 12;
        tm.tm_wday = 0;  // a Sunday
        tm.tm_yday = 206;
        return tm;
    };
    return o;
}

struct Case {
    std::string id;
    std::string source;
    json variables;
};

// Renders every case with python3-jinja2; an empty object when python3 or jinja2 is missing.
json python_reference(const std::vector<Case> &cases) {
    test::TempDir dir;
    json in = json::array();
    for (const Case &c : cases)
        in.push_back({{"id", c.id}, {"source", c.source}, {"variables", c.variables}});
    const std::string in_path = dir.path() + "/cases.json", out_path = dir.path() + "/out.json";
    std::ofstream(in_path) << in.dump();
    const std::string cmd = "python3 " + std::string(TD_SOURCE_DIR) + "/tests/jinja/reference.py " + in_path +
                            " " + out_path + " 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    if (!p) return json::object();
    char buf[4096];
    std::string log;
    while (size_t n = fread(buf, 1, sizeof buf, p)) log.append(buf, n);
    if (pclose(p) != 0) {
        std::fprintf(stderr, "reference.py failed (python3-jinja2 missing?):\n%s\n", log.c_str());
        return json::object();
    }
    return json::parse(read_file(out_path));
}

// "" when tandem agrees with the reference, else what differs.
std::string compare(const Case &c, const json &ref) {
    auto tmpl = jinja::Template::parse(c.source);
    Result<std::string> got =
        tmpl.ok() ? tmpl->render(c.variables, fixed_clock()) : Result<std::string>(tmpl.status());
    if (ref.contains("text")) {
        if (!got.ok()) return "tandem failed: " + got.status().message();
        if (*got != ref["text"].get<std::string>()) {
            const std::string want = ref["text"];
            size_t k = 0;
            while (k < want.size() && k < got->size() && want[k] == (*got)[k]) ++k;
            const size_t from = k > 40 ? k - 40 : 0;
            return "differs at byte " + std::to_string(k) +
                   "\n  want: " + json(want.substr(from, 120)).dump() +
                   "\n  got:  " + json(got->substr(from, 120)).dump();
        }
        return "";
    }
    if (got.ok()) return "python failed (" + ref["error"].get<std::string>() + "), tandem rendered";
    if (ref.value("raised", false) && got.status().message() != ref["error"].get<std::string>())
        return "raise_exception message: want " + ref["error"].dump() + ", got " +
               json(got.status().message()).dump();
    return "";
}

// Templates tandem is allowed to render differently from python3-jinja2 (none today; a template added to
// ../shared that uses what the subset lacks goes here, with why).
const std::set<std::string> kKnownDifferences = {};

TEST(JinjaRealTemplates, RenderEveryConversationAsPythonJinja2Does) {
    const std::filesystem::path dir = test::shared_path("templates");
    if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no ../shared/templates";
    const json spec = json::parse(read_file(std::string(TD_SOURCE_DIR) + "/tests/jinja/scenarios.json"));
    std::vector<Case> cases;
    std::set<std::string> names;
    for (const auto &entry : std::filesystem::directory_iterator(dir)) {
        if (entry.path().extension() != ".jinja") continue;
        const std::string name = entry.path().filename().string();
        names.insert(name);
        const std::string source = read_file(entry.path());
        for (const auto &[sname, sc] : spec["scenarios"].items()) {
            json vars = {{"messages", sc["messages"]},
                         {"add_generation_prompt", sc["add_generation_prompt"]},
                         {"bos_token", "<s>"},
                         {"eos_token", "</s>"}};
            if (sc.value("with_tools", false)) vars["tools"] = spec["tools"];
            cases.push_back({name + "/" + sname, source, vars});
        }
    }
    ASSERT_GE(names.size(), 65u);
    const json ref = python_reference(cases);
    if (ref.empty()) GTEST_SKIP() << "python3-jinja2 is not installed (scripts/install-deps installs it)";
    std::map<std::string, std::string> failures;  // template -> first difference
    size_t rendered = 0;
    for (const Case &c : cases) {
        ASSERT_TRUE(ref.contains(c.id)) << c.id;
        rendered += ref[c.id].contains("text");
        const std::string diff = compare(c, ref[c.id]);
        const std::string name = c.id.substr(0, c.id.find('/'));
        if (!diff.empty() && !failures.count(name)) failures[name] = c.id + ": " + diff;
    }
    const size_t same = names.size() - failures.size();
    std::printf(
        "%zu of %zu templates render all %zu conversations as python3-jinja2 does (%zu renders, %zu errors "
        "in both)\n",
        same, names.size(), spec["scenarios"].size(), rendered, cases.size() - rendered);
    for (const auto &[name, diff] : failures) {
        if (kKnownDifferences.count(name)) continue;
        ADD_FAILURE() << diff;
    }
    EXPECT_GE(same, 55u);
}

// Small templates for each construct, against the same reference.
TEST(JinjaConstructs, MatchPythonJinja2) {
    const json vars = {{"messages", json::array({{{"role", "user"}, {"content", "  hi there \n"}},
                                                 {{"role", "assistant"}, {"content", nullptr}}})},
                       {"n", 3},
                       {"x", 2.5},
                       {"s", "a,b,,c"},
                       {"d", {{"b", 2}, {"a", 1}, {"items", "key"}}},
                       {"u", "héllo 猫"}};
    const std::vector<std::pair<std::string, std::string>> snippets = {
        {"ws_trim_lstrip", "a\n  {% if true %}\n    b\n  {% endif %}\nc\n"},
        {"ws_minus_plus", "a  {%- if true -%}  b  {%+ endif %}  c {{- ' d ' -}} e\n  {#- c -#}  f"},
        {"ws_comment_line", "x\n    {# a comment #}\ny"},
        {"ws_var_not_lstripped", "a\n  {{ 'v' }}\n  {% set q = 1 %}\nb"},
        {"loop_vars",
         "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.first }}/{{ "
         "loop.last "
         "}}/{{ loop.length }}/{{ loop.previtem is defined }}/{{ loop.cycle('o', 'e') }};{% endfor %}"},
        {"loop_filter_else",
         "{% for i in range(n) if i > 0 %}{{ i }}{% else %}none{% endfor %}|{% for i in [] %}x{% else "
         "%}empty{% endfor %}"},
        {"loop_break_continue",
         "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif "
         "%}{{ i }}{% endfor %}"},
        {"loop_scope",
         "{% set c = 0 %}{% for i in range(3) %}{% set c = c + i %}{{ c }}{% endfor %}|{{ c }}"},
        {"namespace",
         "{% set ns = namespace(c=0, found=false) %}{% for i in range(4) %}{% set ns.c = ns.c + i %}{% "
         "endfor %}{{ ns.c }} {{ ns.found }}"},
        {"unpack",
         "{% for k, v in d.items() %}{{ k }}={{ v }} {% endfor %}{% set a, b = [1, 2] %}{{ a + b }}"},
        {"dict_attr_vs_item",
         "{{ d['items'] }} {{ d.a }} {{ d.get('zz', 'def') }} {{ d.get('b') }} {{ d.missing is defined }}"},
        {"macro",
         "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ "
         "greet('Al', punct='?') }} {{ greet(name='Cy') }}"},
        {"macro_sees_later_globals",
         "{% set c = 1 %}{% macro m() %}{{ c }}{% endmacro %}{% set c = 2 %}{{ m() }}"},
        {"set_block",
         "{% set t %}  inner {{ n }}  {% endset %}[{{ t }}]{% set t2 | trim %}  x  {% endset %}[{{ t2 }}]"},
        {"filter_block", "{% filter upper %}abc {{ n }}{% endfilter %}"},
        {"printing",
         "{{ none }} {{ true }} {{ [1, 'a', none, 1.5] }} {{ {'k': 'v', 'n': none} }} {{ (1, 2) }} {{ (1,) "
         "}} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ x * 2 }} {{ "
         "\"it's\" }}"},
        {"print_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"'] }}"},
        {"tojson",
         "{{ d | tojson }} {{ messages | tojson }} {{ u | tojson }} {{ u | tojson(ensure_ascii=True) }} {{ d "
         "| tojson(indent=2) }} {{ d | tojson(sort_keys=true) }} {{ x | tojson }} {{ 'a\"b\\\\c\\n' | tojson "
         "}}"},
        {"string_methods",
         "{{ messages[0].content.strip() }}|{{ s.split(',') }}|{{ '  a  b '.split() }}|{{ s.rsplit(',', 1) "
         "}}|{{ 'abc'.upper() }}|{{ 'x.y'.startswith(('a', 'x')) }}|{{ 'hello'.endswith('lo') }}|{{ "
         "'aXbX'.replace('X', '-') }}|{{ '<{}|{}>'.format(1, 'b') }}|{{ 'xxhixx'.strip('x') }}|{{ "
         "'-'.join(['a', 'b']) }}|{{ 'Hello World'.title() }}|{{ 'a\\nb'.splitlines() }}"},
        {"filters",
         "{{ messages | length }} {{ u | length }} {{ messages[1].content | default('dflt') }} {{ "
         "undefined_var | default('dflt') }} {{ '' | default('e', true) }} {{ ['b', 'a', 'B'] | sort }} {{ "
         "[3, 1, 2] | sort(reverse=true) }} {{ ['a', 'b'] | join(', ') }} {{ d | dictsort }} {{ messages | "
         "selectattr('role', 'equalto', 'user') | list | length }} {{ messages | rejectattr('content') | "
         "map(attribute='role') | list }} {{ ['a', 'b'] | map('upper') | join }} {{ '  x ' | trim }} {{ "
         "'AbC' | lower }} {{ 'abc' | capitalize }} {{ [1, 2, 2, 1] | unique | list }} {{ [4, 2, 8] | min }} "
         "{{ [4, 2, 8] | max }} {{ [1, 2] | first }} {{ [1, 2] | last }} {{ '42' | int + 1 }} {{ 'x' | int "
         "}} {{ 3 | float }} {{ [1, 2, 3] | sum }} {{ 'a&b<c>' | e }} {{ 'l1\\nl2\\n\\nl3' | indent(2) }} {{ "
         "'l1\\nl2' | indent(4, first=true) }} {{ d | items | list }} {{ 'abc' | list }} {{ 5 | string + '!' "
         "}}"},
        {"tests",
         "{{ n is number }} {{ n is integer }} {{ x is float }} {{ s is string }} {{ d is mapping }} {{ "
         "messages is iterable }} {{ s is sequence }} {{ none is none }} {{ true is boolean }} {{ false is "
         "false }} {{ n is odd }} {{ n is even }} {{ 6 is divisibleby 3 }} {{ n is equalto 3 }} {{ 'a' is in "
         "'abc' }} {{ nothing is undefined }} {{ n is not none }} {{ 'abc' is lower }}"},
        {"operators",
         "{{ 'a' ~ 1 ~ none }} {{ 'b' in 'abc' }} {{ 'z' not in ['a'] }} {{ 'a' in d }} {{ 1 < 2 < 3 }} {{ 3 "
         "> 2 > 5 }} {{ not n }} {{ n and 'yes' }} {{ 0 or 'fallback' }} {{ 'y' if n > 2 else 'n' }} {{ "
         "'only' if false }} {{ [1] + [2] }} {{ 'ab' * 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ -n }}"},
        {"slices",
         "{{ u[1:4] }} {{ u[-1] }} {{ u[::-1] }} {{ [1, 2, 3, 4][1:] }} {{ [1, 2, 3, 4][:-1] }} {{ [1, 2, 3, "
         "4][::2] }} {{ messages[-1].role }} {{ s[0] }}"},
        {"strftime", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%Y-%m-%d') }}"},
        {"raise", "{% if n > 2 %}{{ raise_exception('n is too big: ' ~ n) }}{% endif %}"},
        {"error_undefined_attr", "{{ nothing.attr }}"},
        {"error_concat", "{{ 'a' + 1 }}"},
        {"error_none_iter", "{% for m in none %}{% endfor %}"},
        {"error_append", "{% set l = [] %}{{ l.append(1) }}"},
        {"none_attr_is_undefined",
         "{{ none.foo is defined }}|{{ (messages[1].content.x is defined) if messages[1].content else 'no' "
         "}}"},
        {"whitespace_in_tags", "{%-\n  if\n  true\n-%}\n  ok\n{%- endif %}"},
        {"int_keys",
         "{% set t = {0: 'zero', 512: 'half', 'k': 1} %}{{ t[512] }} {{ t }} {{ t | tojson }} {% for k, v in "
         "t | dictsort(by='value') %}{{ k }}{% endfor %} {{ 0 in t }}"},
        {"generators",
         "{{ messages | selectattr('role', 'equalto', 'x') | list }} {{ 'yes' if messages | "
         "selectattr('role', 'equalto', 'x') else 'no' }} {{ none | selectattr('a') | list }} {{ messages | "
         "map(attribute='role') | join(',') }}"},
        {"error_generator_length", "{{ messages | selectattr('role') | length }}"},
        {"error_test_if", "{{ x is defined if true else 1 }}"},
        {"markup",
         R"({{ '<a>'|safe + '<b>' }} {{ 'x' + '"q"'|safe }} {{ ('<'|safe + '&') ~ '<' }} {{ '<p>'|e }})"},
        {"generation", "{% generation %}gen {{ n }}{% endgeneration %}"},
        {"string_escapes", "{{ 'tab\\there' }}|{{ \"q\\\"q\" }}|{{ '\\u00e9' }}|{{ 'keep\\d' }}"},
        {"crlf_and_trailing_newline", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n"},
    };
    std::vector<Case> cases;
    for (const auto &[id, src] : snippets) cases.push_back({id, src, vars});
    const json ref = python_reference(cases);
    if (ref.empty()) GTEST_SKIP() << "python3-jinja2 is not installed (scripts/install-deps installs it)";
    for (const Case &c : cases) {
        ASSERT_TRUE(ref.contains(c.id)) << c.id;
        EXPECT_EQ(compare(c, ref[c.id]), "") << c.id << "\n  source: " << c.source;
    }
}

// Python's integers never overflow and ours are 64-bit: a result past them is the nearest double, never
// undefined behaviour (the chat-template fuzzer found 2^63 - 1 times 1079853572); inside them, exact integers
// as before.
TEST(JinjaLimits, IntegerArithmeticPastSixtyFourBitsBecomesADouble) {
    struct Case {
        const char *source, *want;
    };
    const Case cases[] = {
        {"{{ 9223372036854775807 + 1 }}", "9.223372036854776e+18"},
        {"{{ -9223372036854775807 - 10 }}", "-9.223372036854776e+18"},
        {"{{ 9223372036854775807 * 1079853572 }}", "9.959891239882545e+27"},
        {"{{ -(-9223372036854775807 - 1) }}", "9.223372036854776e+18"},
        {"{{ (-9223372036854775807 - 1) // -1 }}", "9.223372036854776e+18"},
        {"{{ (-9223372036854775807 - 1) % -1 }}", "0.0"},
        {"{{ 3 ** 40 }}", "1.2157665459056929e+19"},
        {"{{ 3 ** 39 }} {{ 2 ** 62 }} {{ (-1) ** 65 }} {{ 1 ** 100 }} {{ 0 ** 0 }} {{ 0 ** 5 }}",
         "4052555153018976267 4611686018427387904 -1 1 1 0"},
        {"{{ 9223372036854775806 + 1 }} {{ 3037000499 * 3037000499 }}",
         "9223372036854775807 9223372030926249001"},
    };
    for (const Case &c : cases) {
        auto t = jinja::Template::parse(c.source);
        ASSERT_TRUE(t.ok()) << c.source << ": " << t.status().message();
        auto r = t->render(json::object(), jinja::RenderOptions{});
        ASSERT_TRUE(r.ok()) << c.source << ": " << r.status().message();
        EXPECT_EQ(*r, c.want) << c.source;
    }
}

TEST(JinjaLimits, HostileTemplatesEndWithAnError) {
    struct Bad {
        const char *source;
        const char *what;
    };
    const Bad bad[] = {
        {"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "nested"},
        {"{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}", "over"},
        {"{{ range(100000000) }}", "range"},
        {"{{ 'x' * 100000000 }}", "16 MB"},
        {"{% for i in range(1000000) %}{{ 'abcdefghijklmnopqrstuvwxyz' * 1000 }}{% endfor %}", "over"},
        {"{% for i in range(1000000) %}{% set s = 'x' * 10000000 %}{% endfor %}", "over"},
        {"{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l "
         "}}",
         "nested"},
        {"{% set ns = namespace(a=1) %}{% set ns.me = ns %}", "namespace"},

    };
    jinja::RenderOptions o;
    o.max_steps = 2'000'000;
    for (const Bad &b : bad) {
        auto t = jinja::Template::parse(b.source);
        ASSERT_TRUE(t.ok()) << b.source << ": " << t.status().message();
        auto r = t->render(json::object(), o);
        ASSERT_FALSE(r.ok()) << b.source;
        EXPECT_NE(r.status().message().find(b.what), std::string::npos) << r.status().message();
    }
    const char *unparsable[] = {"{% if x %}", "{{ 'unterminated }}", "{% for %}",
                                "{{ (((( }}", "{% bogus %}",         "{# open",
                                "{{ a | }}",  "{% endfor %}"};
    for (const char *src : unparsable) {
        auto t = jinja::Template::parse(src);
        EXPECT_FALSE(t.ok()) << src;
        if (!t.ok()) {
            EXPECT_NE(t.status().message().find("line 1"), std::string::npos) << t.status().message();
        }
    }
    // Deep nesting is refused, not a stack overflow.
    std::string deep = "{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}";
    EXPECT_FALSE(jinja::Template::parse(deep).ok());
    std::string chain = "{{ x";
    for (int i = 0; i < 100000; ++i) chain += "|trim";
    EXPECT_FALSE(jinja::Template::parse(chain + " }}").ok());
    std::string sum = "{{ 1";
    for (int i = 0; i < 100000; ++i) sum += " + 1";
    EXPECT_FALSE(jinja::Template::parse(sum + " }}").ok());
}

}  // namespace
}  // namespace td
