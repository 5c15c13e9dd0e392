// Jinja's builtin filters and tests (jinja2 3.1's behaviour), Python's str and dict methods, and the globals
// of Hugging Face's chat template renderer.
#include "text/jinja-builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "text/unicode.h"

namespace td::jinja {
namespace {

using K = Value::Kind;

[[noreturn]] void undefined_error(const Value &v) {
    fail(v.s.empty() ? std::string("UndefinedError: value is undefined") : "UndefinedError: " + v.s);
}

const std::string &need_string(const Value &v, std::string_view what) {
    if (v.is_undefined()) undefined_error(v);
    if (!v.is_string()) fail(fmt::format("TypeError: {} expects a string, not '{}'", what, v.type_name()));
    return v.s;
}

int64_t need_int(const Value &v, std::string_view what) {
    if (v.kind == K::integer) return v.i;
    if (v.kind == K::boolean) return v.b;
    fail(fmt::format("TypeError: {} expects an integer, not '{}'", what, v.type_name()));
}

bool arg_bool(CallArgs &a, size_t i, std::string_view name, bool def) {
    const Value *v = a.get(i, name);
    return v ? v->truthy() : def;
}

// Python's str.isspace (what split() and strip() use): Unicode White_Space plus U+001C..U+001F.
bool is_ws(char32_t c) {
    return (c >= 0x1c && c <= 0x1f) || unicode::is_whitespace(uint32_t(c));
}

std::string strip(const std::string &s, const Value *chars, bool left, bool right) {
    const std::u32string u = utf8_decode(s);
    std::u32string set;
    const bool custom = chars && !chars->is_none() && !chars->is_undefined();
    if (custom) set = utf8_decode(need_string(*chars, "strip"));
    auto drop = [&](char32_t c) { return custom ? set.find(c) != std::u32string::npos : is_ws(c); };
    size_t b = 0, e = u.size();
    if (left)
        while (b < e && drop(u[b])) ++b;
    if (right)
        while (e > b && drop(u[e - 1])) --e;
    return utf8_encode(std::u32string_view(u).substr(b, e - b));
}

std::string lower(const std::string &s) {
    std::string r = s;
    for (char &c : r)
        if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
    return r;
}
std::string upper(const std::string &s) {
    std::string r = s;
    for (char &c : r)
        if (c >= 'a' && c <= 'z') c = char(c - 'a' + 'A');
    return r;
}
bool is_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string capitalize(const std::string &s) {
    std::string r = lower(s);
    if (!r.empty() && r[0] >= 'a' && r[0] <= 'z') r[0] = char(r[0] - 'a' + 'A');
    return r;
}

std::string title(const std::string &s) {
    std::string r = s;
    bool prev_alpha = false;
    for (char &c : r) {
        const bool a = is_alpha(c);
        if (a)
            c = prev_alpha ? (c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c)
                           : (c >= 'a' && c <= 'z' ? char(c - 'a' + 'A') : c);
        prev_alpha = a;
    }
    return r;
}

std::string replace_all(const std::string &s, const std::string &from, const std::string &to, int64_t count) {
    std::string out;
    if (from.empty()) {
        // Python inserts `to` between every character (and at both ends).
        const std::u32string u = utf8_decode(s);
        int64_t n = 0;
        for (char32_t c : u) {
            if (count < 0 || n < count) {
                out += to;
                ++n;
            }
            out += utf8_encode(std::u32string_view(&c, 1));
        }
        if (count < 0 || n < count) out += to;
        return out;
    }
    size_t pos = 0;
    int64_t n = 0;
    while (count < 0 || n < count) {
        const size_t f = s.find(from, pos);
        if (f == std::string::npos) break;
        out.append(s, pos, f - pos);
        out += to;
        pos = f + from.size();
        ++n;
    }
    out.append(s, pos, std::string::npos);
    return out;
}

List split(const std::string &s, const Value *sep, int64_t maxsplit, bool from_right) {
    List out;
    if (!sep || sep->is_none()) {
        // Runs of whitespace, leading and trailing ignored.
        const std::u32string u = utf8_decode(s);
        std::vector<std::pair<size_t, size_t>> words;
        size_t k = 0;
        while (k < u.size()) {
            while (k < u.size() && is_ws(u[k])) ++k;
            if (k >= u.size()) break;
            size_t e = k;
            while (e < u.size() && !is_ws(u[e])) ++e;
            words.emplace_back(k, e);
            k = e;
        }
        if (maxsplit >= 0 && int64_t(words.size()) > maxsplit + 1) {
            if (!from_right) {
                size_t start = words[size_t(maxsplit)].first;
                size_t end = u.size();
                while (end > start && is_ws(u[end - 1])) --end;
                words.resize(size_t(maxsplit));
                words.emplace_back(start, end);
            } else {
                const size_t keep = size_t(maxsplit);
                size_t end = words[words.size() - keep - 1].second;
                size_t start = 0;
                while (start < end && is_ws(u[start])) ++start;
                std::vector<std::pair<size_t, size_t>> w2{{start, end}};
                w2.insert(w2.end(), words.end() - long(keep), words.end());
                words = w2;
            }
        }
        for (auto [b, e] : words)
            out.push_back(Value::string(utf8_encode(std::u32string_view(u).substr(b, e - b))));
        return out;
    }
    const std::string &d = need_string(*sep, "split");
    if (d.empty()) fail("ValueError: empty separator");
    std::vector<std::string> parts;
    if (!from_right) {
        size_t pos = 0;
        int64_t n = 0;
        while (maxsplit < 0 || n < maxsplit) {
            const size_t f = s.find(d, pos);
            if (f == std::string::npos) break;
            parts.push_back(s.substr(pos, f - pos));
            pos = f + d.size();
            ++n;
        }
        parts.push_back(s.substr(pos));
    } else {
        size_t end = s.size();
        int64_t n = 0;
        while (maxsplit < 0 || n < maxsplit) {
            if (end < d.size()) break;
            const size_t f = s.rfind(d, end - d.size());
            if (f == std::string::npos) break;
            parts.insert(parts.begin(), s.substr(f + d.size(), end - f - d.size()));
            end = f;
            ++n;
        }
        parts.insert(parts.begin(), s.substr(0, end));
    }
    for (auto &p : parts) out.push_back(Value::string(std::move(p)));
    return out;
}

List splitlines(const std::string &s) {
    List out;
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
            out.push_back(Value::string(s.substr(b, k - b)));
            if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
            b = k + 1;
        }
    }
    if (b < s.size()) out.push_back(Value::string(s.substr(b)));
    return out;
}

bool starts_or_ends(const std::string &s, const Value &what, bool start) {
    auto one = [&](const Value &p) {
        const std::string &x = need_string(p, start ? "startswith" : "endswith");
        if (x.size() > s.size()) return false;
        return start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
    };
    if (what.is_list()) {
        for (const Value &p : *what.list)
            if (one(p)) return true;
        return false;
    }
    return one(what);
}

// str.format with {} / {0} / {name} fields (no format specs beyond the empty one).
std::string py_format(const std::string &f, CallArgs &a) {
    std::string out;
    size_t auto_idx = 0;
    for (size_t k = 0; k < f.size(); ++k) {
        const char c = f[k];
        if (c == '{' && k + 1 < f.size() && f[k + 1] == '{') {
            out += '{';
            ++k;
        } else if (c == '}' && k + 1 < f.size() && f[k + 1] == '}') {
            out += '}';
            ++k;
        } else if (c == '{') {
            const size_t e = f.find('}', k);
            if (e == std::string::npos) fail("ValueError: Single '{' encountered in format string");
            const std::string field = f.substr(k + 1, e - k - 1);
            if (field.find(':') != std::string::npos || field.find('!') != std::string::npos)
                fail("str.format: format specifications are not supported");
            const Value *v = nullptr;
            if (field.empty()) {
                v = auto_idx < a.pos.size() ? &a.pos[auto_idx] : nullptr;
                ++auto_idx;
            } else if (std::all_of(field.begin(), field.end(), [](char x) { return x >= '0' && x <= '9'; })) {
                const size_t i = size_t(std::atoi(field.c_str()));
                v = i < a.pos.size() ? &a.pos[i] : nullptr;
            } else {
                v = a.kwarg(field);
            }
            if (!v) fail(fmt::format("IndexError: str.format has no argument for '{{{}}}'", field));
            out += v->str();
            k = e;
        } else {
            out += c;
        }
    }
    return out;
}

Value bound(Function f) {
    return Value::function(std::move(f));
}

Value string_method(const Value &self, std::string_view name) {
    const std::string s = self.s;
    if (name == "upper") return bound([s](CallArgs &) { return Value::string(upper(s)); });
    if (name == "lower") return bound([s](CallArgs &) { return Value::string(lower(s)); });
    if (name == "title") return bound([s](CallArgs &) { return Value::string(title(s)); });
    if (name == "capitalize") return bound([s](CallArgs &) { return Value::string(capitalize(s)); });
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool l = name != "rstrip", r = name != "lstrip";
        return bound([s, l, r](CallArgs &a) { return Value::string(strip(s, a.get(0, "chars"), l, r)); });
    }
    if (name == "split" || name == "rsplit") {
        const bool right = name == "rsplit";
        return bound([s, right](CallArgs &a) {
            const Value *ms = a.get(1, "maxsplit");
            return Value::make_list(split(s, a.get(0, "sep"), ms ? need_int(*ms, "split") : -1, right));
        });
    }
    if (name == "splitlines") return bound([s](CallArgs &) { return Value::make_list(splitlines(s)); });
    if (name == "startswith" || name == "endswith") {
        const bool start = name == "startswith";
        return bound([s, start](CallArgs &a) {
            if (a.pos.empty()) fail("TypeError: startswith/endswith takes a prefix");
            return Value::boolean(starts_or_ends(s, a.pos[0], start));
        });
    }
    if (name == "replace")
        return bound([s](CallArgs &a) {
            if (a.pos.size() < 2) fail("TypeError: replace expects 2 arguments");
            const int64_t count = a.pos.size() > 2 ? need_int(a.pos[2], "replace") : -1;
            return Value::string(
                replace_all(s, need_string(a.pos[0], "replace"), need_string(a.pos[1], "replace"), count));
        });
    if (name == "format") return bound([s](CallArgs &a) { return Value::string(py_format(s, a)); });
    if (name == "find" || name == "rfind" || name == "index" || name == "count") {
        const std::string n(name);
        return bound([s, n](CallArgs &a) {
            if (a.pos.empty()) fail("TypeError: " + n + " expects an argument");
            const std::string &x = need_string(a.pos[0], n);
            if (n == "count") {
                if (x.empty()) return Value::integer(int64_t(utf8_decode(s).size()) + 1);
                int64_t c = 0;
                for (size_t p = s.find(x); p != std::string::npos; p = s.find(x, p + x.size())) ++c;
                return Value::integer(c);
            }
            const size_t p = n == "rfind" ? s.rfind(x) : s.find(x);
            if (p == std::string::npos) {
                if (n == "index") fail("ValueError: substring not found");
                return Value::integer(-1);
            }
            return Value::integer(int64_t(utf8_decode(s.substr(0, p)).size()));
        });
    }
    if (name == "join")
        return bound([s](CallArgs &a) {
            if (a.pos.empty()) fail("TypeError: join expects an iterable");
            std::string out;
            bool first = true;
            for (const Value &v : iterate(a.pos[0])) {
                if (!first) out += s;
                first = false;
                out += need_string(v, "join");
            }
            return Value::string(std::move(out));
        });
    if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
        name == "isupper" || name == "islower") {
        const std::string n(name);
        return bound([s, n](CallArgs &) {
            if (s.empty()) return Value::boolean(false);
            if (n == "isupper" || n == "islower") {
                bool cased = false;
                for (char c : s) {
                    if (n == "isupper" ? (c >= 'a' && c <= 'z') : (c >= 'A' && c <= 'Z'))
                        return Value::boolean(false);
                    cased |= is_alpha(c);
                }
                return Value::boolean(cased);
            }
            for (char c : s) {
                const bool d = c >= '0' && c <= '9';
                const bool ok = n == "isdigit"   ? d
                                : n == "isalpha" ? is_alpha(c)
                                : n == "isalnum" ? (d || is_alpha(c))
                                                 : is_ws(char32_t(c));
                if (!ok) return Value::boolean(false);
            }
            return Value::boolean(true);
        });
    }
    return Value::undefined(fmt::format("'str object' has no attribute '{}'", name));
}

Value dict_method(const Value &self, std::string_view name) {
    const auto d = self.dict;
    if (name == "get")
        return bound([d](CallArgs &a) {
            if (a.pos.empty()) fail("TypeError: get expected at least 1 argument");
            if (const Value *v = d->find(dict_key(a.pos[0]))) return *v;
            return a.pos.size() > 1 ? a.pos[1] : Value::none();
        });
    if (name == "items")
        return bound([d](CallArgs &) {
            List l;
            for (const auto &[k, v] : d->items) {
                Value t = Value::make_list({dict_key_value(k), v});
                t.is_tuple = true;
                l.push_back(std::move(t));
            }
            return Value::make_list(std::move(l));
        });
    if (name == "keys")
        return bound([d](CallArgs &) {
            List l;
            for (const auto &kv : d->items) l.push_back(dict_key_value(kv.first));
            return Value::make_list(std::move(l));
        });
    if (name == "values")
        return bound([d](CallArgs &) {
            List l;
            for (const auto &kv : d->items) l.push_back(kv.second);
            return Value::make_list(std::move(l));
        });
    return Value::undefined();
}

Value unsafe(std::string_view type, std::string_view name) {
    const std::string msg =
        fmt::format("SecurityError: access to attribute '{}' of '{}' object is unsafe.", name, type);
    return Value::function([msg](CallArgs &) -> Value { fail(msg); });
}

bool is_list_mutator(std::string_view n) {
    return n == "append" || n == "pop" || n == "extend" || n == "insert" || n == "remove" || n == "clear" ||
           n == "sort" || n == "reverse";
}
bool is_dict_mutator(std::string_view n) {
    return n == "pop" || n == "popitem" || n == "update" || n == "setdefault" || n == "clear";
}

// attribute=... of a filter: dotted path, integers index lists.
Value attr_path(const Value &v, const std::string &path) {
    Value cur = v;
    size_t b = 0;
    while (true) {
        const size_t e = path.find('.', b);
        const std::string part = path.substr(b, e == std::string::npos ? std::string::npos : e - b);
        if (!part.empty() &&
            std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; }))
            cur = get_item(cur, Value::integer(std::atoll(part.c_str())));
        else
            cur = get_item(cur, Value::string(part));
        if (e == std::string::npos) return cur;
        b = e + 1;
    }
}

Value sort_key(const Value &v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value::string(lower(v.s));
    return v;
}

Value filter_tojson(const Value &v, CallArgs &a) {
    JsonDumpOptions o;
    if (const Value *x = a.get(0, "ensure_ascii")) o.ensure_ascii = x->truthy();
    const Value *indent = a.get(1, "indent");
    if (indent && !indent->is_none()) {
        if (indent->is_string()) fail("tojson: a string indent is not supported");
        o.indent = int(std::clamp<int64_t>(need_int(*indent, "tojson indent"), 0, 64));
        o.item_sep = ",";
    }
    if (const Value *sep = a.get(2, "separators"); sep && !sep->is_none()) {
        if (!sep->is_list() || sep->list->size() != 2) fail("tojson: separators must be a pair of strings");
        o.item_sep = need_string((*sep->list)[0], "separators");
        o.key_sep = need_string((*sep->list)[1], "separators");
    }
    if (const Value *x = a.get(3, "sort_keys")) o.sort_keys = x->truthy();
    return Value::string(json_dumps(v, o));
}

Value filter_indent(const Value &v, CallArgs &a) {
    std::string s = v.str();
    std::string ind = "    ";
    if (const Value *w = a.get(0, "width"))
        ind = w->is_string() ? w->s
                             : std::string(size_t(std::clamp<int64_t>(need_int(*w, "indent"), 0, 1024)), ' ');
    const bool first = arg_bool(a, 1, "first", false), blank = arg_bool(a, 2, "blank", false);
    s += "\n";
    const List lines = splitlines(s);
    std::string rv;
    if (blank) {
        for (size_t k = 0; k < lines.size(); ++k) {
            if (k) rv += "\n" + ind;
            rv += lines[k].s;
        }
    } else {
        rv = lines.empty() ? "" : lines[0].s;
        for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].s.empty() ? "" : ind + lines[k].s);
    }
    if (first) rv = ind + rv;
    return Value::string(std::move(rv));
}

List sorted_items(const Value &v, CallArgs &a) {
    const bool reverse = arg_bool(a, 0, "reverse", false), cs = arg_bool(a, 1, "case_sensitive", false);
    const Value *attr = a.get(2, "attribute");
    List l = iterate(v);
    std::vector<std::pair<Value, Value>> keyed;
    for (Value &x : l) keyed.emplace_back(sort_key(attr ? attr_path(x, attr->str()) : x, cs), std::move(x));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto &p, const auto &q) {
        return reverse ? value_less(q.first, p.first) : value_less(p.first, q.first);
    });
    List out;
    for (auto &p : keyed) out.push_back(std::move(p.second));
    return out;
}

Value generator(List items) {
    Value g = Value::make_list(std::move(items));
    g.is_generator = true;
    return g;
}

// selectattr/rejectattr/select/reject: items whose (attribute) passes the test (truthiness without one).
Value filter_select(const Value &v, CallArgs &a, bool by_attr, bool keep) {
    size_t k = 0;
    std::string attr;
    if (by_attr) {
        if (a.pos.empty()) fail("TypeError: selectattr/rejectattr need an attribute");
        attr = a.pos[k++].str();
    }
    std::string test;
    if (k < a.pos.size()) test = need_string(a.pos[k++], "select test");
    CallArgs targs;
    targs.pos.assign(a.pos.begin() + long(k), a.pos.end());
    List out;
    if (v.truthy())  // jinja2 skips a false value (None) instead of failing to iterate it
        for (const Value &x : iterate(v)) {
            const Value item = by_attr ? attr_path(x, attr) : x;
            const bool pass = test.empty() ? item.truthy() : apply_test(test, item, targs);
            if (pass == keep) out.push_back(x);
        }
    return generator(std::move(out));
}

Value filter_map(const Value &v, CallArgs &a) {
    List out;
    if (!v.truthy()) return generator({});
    if (const Value *attr = a.kwarg("attribute")) {
        const Value *def = a.kwarg("default");
        for (const Value &x : iterate(v)) {
            Value r = attr_path(x, attr->str());
            out.push_back(r.is_undefined() && def ? *def : r);
        }
        return generator(std::move(out));
    }
    if (a.pos.empty()) fail("TypeError: map needs a filter name or attribute=");
    const std::string name = need_string(a.pos[0], "map");
    CallArgs fargs;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    for (const Value &x : iterate(v)) {
        CallArgs c = fargs;
        out.push_back(apply_filter(name, x, c));
    }
    return generator(std::move(out));
}

int64_t length(const Value &v) {
    switch (v.kind) {
        case K::undefined:
            return 0;
        case K::string:
            return int64_t(utf8_decode(v.s).size());
        case K::list:
            if (v.is_generator) break;
            return int64_t(v.list->size());
        case K::dict:
            return int64_t(v.dict->items.size());
        default:
            break;
    }
    fail(fmt::format("TypeError: object of type '{}' has no len()",
                     v.is_generator ? "generator" : v.type_name()));
}

}  // namespace

List iterate(const Value &v) {
    switch (v.kind) {
        case K::undefined:
            return {};
        case K::list:
            return *v.list;  // a generator too (jinja2's can be consumed once; templates do not rely on it)
        case K::dict: {
            List l;
            for (const auto &kv : v.dict->items) l.push_back(dict_key_value(kv.first));
            return l;
        }
        case K::string: {
            List l;
            for (char32_t c : utf8_decode(v.s))
                l.push_back(Value::string(utf8_encode(std::u32string_view(&c, 1))));
            return l;
        }
        default:
            fail(fmt::format("TypeError: '{}' object is not iterable", v.type_name()));
    }
}

Value get_attr(const Value &obj, std::string_view name) {
    if (obj.is_undefined()) undefined_error(obj);
    if (!name.empty() && name[0] == '_')
        return Value::undefined(fmt::format("'{}' has no attribute '{}'", obj.type_name(), name));
    switch (obj.kind) {
        case K::string:
            return string_method(obj, name);
        case K::dict: {
            if (obj.dict->is_namespace) {
                if (const Value *v = obj.dict->find(name)) return *v;
                break;
            }
            if (is_dict_mutator(name)) return unsafe("dict", name);
            Value m = dict_method(obj, name);
            if (!m.is_undefined()) return m;
            if (const Value *v = obj.dict->find(name)) return *v;
            return Value::undefined(fmt::format("'dict object' has no attribute '{}'", name));
        }
        case K::list:
            if (is_list_mutator(name)) return unsafe("list", name);
            break;
        default:
            break;
    }
    return Value::undefined(fmt::format("'{}' has no attribute '{}'",
                                        obj.is_none() ? "None" : obj.type_name() + " object", name));
}

Value get_item(const Value &obj, const Value &key) {
    if (obj.is_undefined()) undefined_error(obj);
    if (obj.is_dict() && !obj.dict->is_namespace) {
        if (const Value *v = obj.dict->find(dict_key(key))) return *v;
        if (key.is_string()) return get_attr(obj, key.s);
        return Value::undefined(fmt::format("'dict object' has no attribute {}", key.repr()));
    }
    if (obj.is_generator) return Value::undefined("'generator object' is not subscriptable");
    if ((obj.is_list() || obj.is_string()) && (key.kind == K::integer || key.kind == K::boolean)) {
        int64_t i = key.kind == K::integer ? key.i : key.b;
        if (obj.is_list()) {
            const int64_t n = int64_t(obj.list->size());
            if (i < 0) i += n;
            if (i < 0 || i >= n)
                return Value::undefined(
                    fmt::format("{} has no element {}", obj.repr().substr(0, 40), key.str()));
            return (*obj.list)[size_t(i)];
        }
        const std::u32string u = utf8_decode(obj.s);
        const int64_t n = int64_t(u.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("string index out of range");
        return Value::string(utf8_encode(std::u32string_view(u).substr(size_t(i), 1)));
    }
    if (key.is_string()) return get_attr(obj, key.s);
    if (obj.is_none()) return Value::undefined(fmt::format("None has no element {}", key.str()));
    return Value::undefined(fmt::format("'{}' object has no element {}", obj.type_name(), key.repr()));
}

Value get_slice(const Value &obj, const Value *start, const Value *stop, const Value *step) {
    if (obj.is_undefined()) undefined_error(obj);
    auto opt = [](const Value *v) -> std::optional<int64_t> {
        if (!v || v->is_none()) return std::nullopt;
        return need_int(*v, "a slice");
    };
    const int64_t st = opt(step).value_or(1);
    if (st == 0) fail("ValueError: slice step cannot be zero");
    std::u32string u;
    int64_t n = 0;
    if (obj.is_string()) {
        u = utf8_decode(obj.s);
        n = int64_t(u.size());
    } else if (obj.is_list()) {
        n = int64_t(obj.list->size());
    } else {
        fail(fmt::format("TypeError: '{}' object is not subscriptable", obj.type_name()));
    }
    auto clamp = [&](std::optional<int64_t> v, int64_t def) {
        if (!v) return def;
        int64_t x = *v;
        if (x < 0) x += n;
        if (st > 0) return std::clamp<int64_t>(x, 0, n);
        return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t b = clamp(opt(start), st > 0 ? 0 : n - 1), e = clamp(opt(stop), st > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t k = b; st > 0 ? k < e : k > e; k += st) idx.push_back(k);
    if (obj.is_string()) {
        std::u32string r;
        for (int64_t k : idx) r += u[size_t(k)];
        return Value::string(utf8_encode(r));
    }
    List l;
    for (int64_t k : idx) l.push_back((*obj.list)[size_t(k)]);
    Value r = Value::make_list(std::move(l));
    r.is_tuple = obj.is_tuple;
    return r;
}

Value apply_filter(std::string_view name, const Value &v, CallArgs &a) {
    if (name == "tojson") return filter_tojson(v, a);
    if (name == "length" || name == "count") return Value::integer(length(v));
    if (name == "default" || name == "d") {
        const bool boolean = arg_bool(a, 1, "boolean", false);
        if (v.is_undefined() || (boolean && !v.truthy())) {
            const Value *d = a.get(0, "default_value");
            return d ? *d : Value::string("");
        }
        return v;
    }
    if (name == "safe") {
        Value r = v.is_string() ? v : Value::string(v.str());
        r.is_safe = true;
        return r;
    }
    if (name == "string") return v.is_string() ? v : Value::string(v.str());
    if (name == "trim") return Value::string(strip(v.str(), a.get(0, "chars"), true, true));
    if (name == "upper") return Value::string(upper(v.str()));
    if (name == "lower") return Value::string(lower(v.str()));
    if (name == "capitalize") return Value::string(capitalize(v.str()));
    if (name == "title") return Value::string(title(v.str()));
    if (name == "escape" || name == "e") {
        if (v.is_safe) return v;
        Value r = Value::string(html_escape(v.str()));
        r.is_safe = true;
        return r;
    }
    if (name == "replace") {
        if (a.pos.size() < 2) fail("TypeError: replace expects 2 arguments");
        const Value *count = a.get(2, "count");
        return Value::string(replace_all(v.str(), a.pos[0].str(), a.pos[1].str(),
                                         count && !count->is_none() ? need_int(*count, "replace") : -1));
    }
    if (name == "join") {
        const Value *sep = a.get(0, "d");
        const Value *attr = a.get(1, "attribute");
        std::string out;
        bool first = true;
        for (const Value &x : iterate(v)) {
            if (!first && sep) out += sep->str();
            first = false;
            out += (attr ? attr_path(x, attr->str()) : x).str();
        }
        return Value::string(std::move(out));
    }
    if (name == "list") return Value::make_list(iterate(v));
    if (name == "items") {
        if (v.is_undefined()) return Value::make_list();
        if (!v.is_dict()) fail(fmt::format("TypeError: items expects a mapping, not '{}'", v.type_name()));
        CallArgs none;
        return (*get_attr(v, "items").fn)(none);
    }
    if (name == "dictsort") {
        if (!v.is_dict()) fail("TypeError: dictsort expects a mapping");
        const bool cs = arg_bool(a, 0, "case_sensitive", false);
        const Value *by = a.get(1, "by");
        const bool by_value = by && by->str() == "value";
        const bool reverse = arg_bool(a, 2, "reverse", false);
        std::vector<std::pair<std::string, Value>> items = v.dict->items;
        std::stable_sort(items.begin(), items.end(), [&](const auto &p, const auto &q) {
            const Value x = sort_key(by_value ? p.second : dict_key_value(p.first), cs);
            const Value y = sort_key(by_value ? q.second : dict_key_value(q.first), cs);
            return reverse ? value_less(y, x) : value_less(x, y);
        });
        List out;
        for (auto &[k, x] : items) {
            Value t = Value::make_list({dict_key_value(k), x});
            t.is_tuple = true;
            out.push_back(std::move(t));
        }
        return Value::make_list(std::move(out));
    }
    if (name == "selectattr") return filter_select(v, a, true, true);
    if (name == "rejectattr") return filter_select(v, a, true, false);
    if (name == "select") return filter_select(v, a, false, true);
    if (name == "reject") return filter_select(v, a, false, false);
    if (name == "map") return filter_map(v, a);
    if (name == "indent") return filter_indent(v, a);
    if (name == "first" || name == "last") {
        const List l = iterate(v);
        if (l.empty()) return Value::undefined("No first item, sequence was empty.");
        return name == "first" ? l.front() : l.back();
    }
    if (name == "reverse") {
        if (v.is_string()) {
            std::u32string u = utf8_decode(v.s);
            std::reverse(u.begin(), u.end());
            return Value::string(utf8_encode(u));
        }
        List l = iterate(v);
        std::reverse(l.begin(), l.end());
        return Value::make_list(std::move(l));
    }
    if (name == "sort") return Value::make_list(sorted_items(v, a));
    if (name == "unique") {
        const bool cs = arg_bool(a, 0, "case_sensitive", false);
        const Value *attr = a.get(1, "attribute");
        List out, seen;
        for (const Value &x : iterate(v)) {
            const Value key = sort_key(attr ? attr_path(x, attr->str()) : x, cs);
            if (std::none_of(seen.begin(), seen.end(),
                             [&](const Value &s) { return values_equal(s, key); })) {
                seen.push_back(key);
                out.push_back(x);
            }
        }
        return Value::make_list(std::move(out));
    }
    if (name == "min" || name == "max") {
        const bool cs = arg_bool(a, 0, "case_sensitive", false);
        const Value *attr = a.get(1, "attribute");
        const List l = iterate(v);
        if (l.empty()) return Value::undefined("No aggregated item, sequence was empty.");
        size_t best = 0;
        for (size_t k = 1; k < l.size(); ++k) {
            const Value x = sort_key(attr ? attr_path(l[k], attr->str()) : l[k], cs);
            const Value y = sort_key(attr ? attr_path(l[best], attr->str()) : l[best], cs);
            if (name == "min" ? value_less(x, y) : value_less(y, x)) best = k;
        }
        return l[best];
    }
    if (name == "sum") {
        const Value *attr = a.get(0, "attribute");
        const Value *start = a.get(1, "start");
        int64_t si = start ? need_int(*start, "sum") : 0;
        double sd = 0;
        bool is_float = false;
        for (const Value &x : iterate(v)) {
            const Value y = attr ? attr_path(x, attr->str()) : x;
            if (!y.is_numeric())
                fail(fmt::format("TypeError: unsupported operand type(s) for +: 'int' and '{}'",
                                 y.type_name()));
            if (y.kind == K::number) is_float = true;
            if (is_float)
                sd += y.as_double();
            else
                si += y.kind == K::integer ? y.i : y.b;
        }
        return is_float ? Value::number(sd + double(si)) : Value::integer(si);
    }
    if (name == "abs") {
        if (v.kind == K::integer) return Value::integer(v.i < 0 ? -v.i : v.i);
        if (v.kind == K::number) return Value::number(std::fabs(v.d));
        fail(fmt::format("TypeError: bad operand type for abs(): '{}'", v.type_name()));
    }
    if (name == "int") {
        const Value *def = a.get(0, "default");
        const Value d = def ? *def : Value::integer(0);
        if (v.kind == K::integer) return v;
        if (v.kind == K::boolean) return Value::integer(v.b);
        if (v.kind == K::number) return std::isfinite(v.d) ? Value::integer(int64_t(v.d)) : d;
        if (v.is_string()) {
            const std::string t = strip(v.s, nullptr, true, true);
            char *end = nullptr;
            const long long x = std::strtoll(t.c_str(), &end, 10);
            if (!t.empty() && end && *end == 0) return Value::integer(x);
            const double f = std::strtod(t.c_str(), &end);
            if (!t.empty() && end && *end == 0 && std::isfinite(f)) return Value::integer(int64_t(f));
        }
        return d;
    }
    if (name == "float") {
        const Value *def = a.get(0, "default");
        if (v.is_numeric()) return Value::number(v.as_double());
        if (v.is_string()) {
            const std::string t = strip(v.s, nullptr, true, true);
            char *end = nullptr;
            const double f = std::strtod(t.c_str(), &end);
            if (!t.empty() && end && *end == 0) return Value::number(f);
        }
        return def ? *def : Value::number(0);
    }
    if (name == "round") {
        const Value *p = a.get(0, "precision");
        const Value *m = a.get(1, "method");
        const int64_t prec = p ? need_int(*p, "round") : 0;
        const std::string method = m ? m->str() : "common";
        const double scale = std::pow(10.0, double(prec));
        const double x = v.as_double() * scale;
        const double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
        return Value::number(r / scale);
    }
    if (name == "wordcount") return Value::integer(int64_t(split(v.str(), nullptr, -1, false).size()));
    if (name == "center") {
        const int64_t w = a.pos.empty() ? 80 : need_int(a.pos[0], "center");
        std::string s = v.str();
        const int64_t n = int64_t(utf8_decode(s).size());
        if (w <= n) return Value::string(s);
        const int64_t left = (w - n) / 2;
        return Value::string(std::string(size_t(left), ' ') + s + std::string(size_t(w - n - left), ' '));
    }
    fail(fmt::format("TemplateAssertionError: no filter named '{}'", name));
}

bool apply_test(std::string_view name, const Value &v, CallArgs &a) {
    auto arg = [&]() -> const Value & {
        if (a.pos.empty()) fail(fmt::format("TypeError: test '{}' needs an argument", name));
        return a.pos[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict() && !v.dict->is_namespace;
    if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
    if (name == "sequence")
        return v.is_undefined() || v.is_string() || (v.is_list() && !v.is_generator) || v.is_dict();
    if (name == "number") return v.is_numeric();
    if (name == "integer") return v.kind == K::integer;
    if (name == "float") return v.kind == K::number;
    if (name == "boolean") return v.kind == K::boolean;
    if (name == "true") return v.kind == K::boolean && v.b;
    if (name == "false") return v.kind == K::boolean && !v.b;
    if (name == "callable") return v.kind == K::function;
    if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return values_equal(v, arg());
    if (name == "ne" || name == "!=") return !values_equal(v, arg());
    if (name == "lt" || name == "lessthan" || name == "<") return value_less(v, arg());
    if (name == "gt" || name == "greaterthan" || name == ">") return value_less(arg(), v);
    if (name == "le" || name == "<=") return !value_less(arg(), v);
    if (name == "ge" || name == ">=") return !value_less(v, arg());
    if (name == "in") {
        const Value &c = arg();
        if (c.is_string())
            return utf8_decode(c.s).find(utf8_decode(need_string(v, "in"))) != std::u32string::npos;
        for (const Value &x : iterate(c))
            if (values_equal(x, v)) return true;
        return false;
    }
    if (name == "odd") return need_int(v, "odd") % 2 != 0;
    if (name == "even") return need_int(v, "even") % 2 == 0;
    if (name == "divisibleby") {
        const int64_t d = need_int(arg(), "divisibleby");
        if (d == 0) fail("ZeroDivisionError: integer division or modulo by zero");
        return need_int(v, "divisibleby") % d == 0;
    }
    if (name == "lower") return v.is_string() && lower(v.s) == v.s;
    if (name == "upper") return v.is_string() && upper(v.s) == v.s;
    fail(fmt::format("TemplateAssertionError: no test named '{}'", name));
}

Value make_global(std::string_view name, const std::function<std::tm()> &now) {
    if (name == "range")
        return Value::function([](CallArgs &a) {
            if (a.pos.empty() || a.pos.size() > 3) fail("TypeError: range expects 1 to 3 arguments");
            int64_t start = 0, stop = 0, step = 1;
            if (a.pos.size() == 1) {
                stop = need_int(a.pos[0], "range");
            } else {
                start = need_int(a.pos[0], "range");
                stop = need_int(a.pos[1], "range");
                if (a.pos.size() == 3) step = need_int(a.pos[2], "range");
            }
            if (step == 0) fail("ValueError: range() arg 3 must not be zero");
            List l;
            for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
                if (l.size() >= 1'000'000) fail("range: more than 1,000,000 items");
                l.push_back(Value::integer(k));
            }
            return Value::make_list(std::move(l));
        });
    if (name == "namespace" || name == "dict") {
        const bool ns = name == "namespace";
        return Value::function([ns](CallArgs &a) {
            Dict d;
            d.is_namespace = ns;
            for (const Value &p : a.pos) {
                if (!p.is_dict()) fail("TypeError: namespace()/dict() take a mapping or keyword arguments");
                for (const auto &[k, x] : p.dict->items) d.set(k, x);
            }
            for (const auto &[k, x] : a.kw) d.set(k, x);
            return Value::make_dict(std::move(d));
        });
    }
    if (name == "raise_exception")
        return Value::function([](CallArgs &a) -> Value {
            throw Error{a.pos.empty() ? std::string() : a.pos[0].str(), true};
        });
    if (name == "strftime_now")
        return Value::function([now](CallArgs &a) {
            if (a.pos.empty()) fail("TypeError: strftime_now expects a format");
            const std::string &f = need_string(a.pos[0], "strftime_now");
            std::tm tm{};
            if (now) {
                tm = now();
            } else {
                const std::time_t t = std::time(nullptr);
                localtime_r(&t, &tm);
            }
            char buf[512];
            const size_t n = std::strftime(buf, sizeof buf, f.c_str(), &tm);
            return Value::string(std::string(buf, n));
        });
    return Value::undefined(fmt::format("'{}' is undefined", name));
}

}  // namespace td::jinja
