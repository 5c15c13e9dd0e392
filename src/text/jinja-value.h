// The values a Jinja program computes with, as Python has them: None, bool, int, float, str, list (and
// tuple), dict (insertion-ordered, string keys), callables, and Jinja's Undefined. Internal to text/jinja-*.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace td::jinja {

// What a template did wrong, thrown inside the interpreter and turned into a Status at Template::render.
struct Error {
    std::string message;
    bool raised = false;  // from raise_exception()
};
[[noreturn]] void fail(std::string message);

struct Value;
using List = std::vector<Value>;

// Dict keys are strings; other hashable keys (ints, as in {0: 0, 512: 128}) are stored encoded by dict_key.
struct Dict {
    std::vector<std::pair<std::string, Value>> items;  // (dict_key(key), value)
    bool is_namespace = false;                         // namespace(): attributes may be assigned
    const Value *find(std::string_view key) const;
    void set(std::string key, Value v);
};

struct CallArgs {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value *kwarg(std::string_view name) const;
    // Positional i, else keyword `name`, else nullptr.
    const Value *get(size_t i, std::string_view name) const;
};
using Function = std::function<Value(CallArgs &)>;

constexpr int kMaxValueDepth = 256;

struct Value {
    enum class Kind : uint8_t { undefined, none, boolean, integer, number, string, list, dict, function };
    Kind kind = Kind::undefined;
    bool b = false;
    bool is_tuple = false;  // a list written (a, b): printed as a tuple
    bool is_safe = false;  // a string marked safe (|safe, |escape): Markup, which escapes what is added to it
    bool is_generator = false;
    uint16_t depth = 0;  // list/dict nesting (bounded: kMaxValueDepth)  // what select/map return in jinja2:
                         // iterable, but no len(), no JSON, always true
    int64_t i = 0;
    double d = 0;
    std::string s;  // string; for undefined, what was looked up (for the error message)
    std::shared_ptr<List> list;
    std::shared_ptr<Dict> dict;
    std::shared_ptr<const Function> fn;

    Value() = default;
    static Value undefined(std::string what = {});
    static Value none();
    static Value boolean(bool v);
    static Value integer(int64_t v);
    static Value number(double v);
    static Value string(std::string v);
    static Value make_list(List v = {});
    static Value make_dict(Dict v = {});
    static Value function(Function f);
    static Value from_json(const nlohmann::json &j);

    bool is_undefined() const { return kind == Kind::undefined; }
    bool is_none() const { return kind == Kind::none; }
    bool is_string() const { return kind == Kind::string; }
    bool is_list() const { return kind == Kind::list; }
    bool is_dict() const { return kind == Kind::dict; }
    bool is_numeric() const { return kind == Kind::integer || kind == Kind::number || kind == Kind::boolean; }
    double as_double() const;

    bool truthy() const;
    // A namespace object is inside (namespaces are the only mutable values: one must not hold another).
    bool holds_namespace() const;
    std::string type_name() const;  // Python's: 'str', 'int', 'dict', 'NoneType', ...
    // str(v) as Python prints it; Undefined prints "".
    std::string str() const;
    // repr(v): strings quoted, as inside a printed list.
    std::string repr() const;
};

// A dict key for a value: a string as itself (unless it starts with \x01), anything else hashable encoded
// ("\x01i512"); an Error for lists and dicts. dict_key_value decodes it.
std::string dict_key(const Value &k);
Value dict_key_value(const std::string &k);

bool values_equal(const Value &a, const Value &b);
// a < b for numbers, strings and lists; an Error for anything else.
bool value_less(const Value &a, const Value &b);

struct JsonDumpOptions {
    bool ensure_ascii = false;
    int indent = -1;  // < 0: one line
    std::string item_sep = ", ";
    std::string key_sep = ": ";
    bool sort_keys = false;
};
// Python's json.dumps.
std::string json_dumps(const Value &v, const JsonDumpOptions &o);

// HTML escaping as markupsafe does it (& < > " ').
std::string html_escape(const std::string &s);

// Python's repr of a float: the shortest text that reads back the same, "1.0", "1e-05", "inf".
std::string float_repr(double d);

// UTF-8 code points, for len(), indexing and slicing strings as Python does.
std::u32string utf8_decode(std::string_view s);
std::string utf8_encode(std::u32string_view s);

}  // namespace td::jinja
