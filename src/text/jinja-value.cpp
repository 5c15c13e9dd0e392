// Python's semantics for the values Jinja templates compute with: truth, equality, order, str, repr and
// json.dumps.
#include "text/jinja-value.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "text/unicode.h"

namespace td::jinja {

void fail(std::string message) {
    throw Error{std::move(message), false};
}

const Value *Dict::find(std::string_view key) const {
    for (const auto &[k, v] : items)
        if (k == key) return &v;
    return nullptr;
}

void Dict::set(std::string key, Value v) {
    for (auto &[k, old] : items)
        if (k == key) {
            old = std::move(v);
            return;
        }
    items.emplace_back(std::move(key), std::move(v));
}

const Value *CallArgs::kwarg(std::string_view name) const {
    for (const auto &[k, v] : kw)
        if (k == name) return &v;
    return nullptr;
}

const Value *CallArgs::get(size_t i, std::string_view name) const {
    if (i < pos.size()) return &pos[i];
    return kwarg(name);
}

std::string html_escape(const std::string &s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

static std::string encoded_key(char tag, const std::string &body) {
    std::string e(1, '\x01');
    e += tag;
    e.append(body);
    return e;
}

std::string dict_key(const Value &k) {
    switch (k.kind) {
        case Value::Kind::string: {
            if (k.s.empty() || k.s[0] != '\x01') return k.s;
            return encoded_key('s', k.s);
        }
        case Value::Kind::integer:
            return encoded_key('i', std::to_string(k.i));
        case Value::Kind::boolean:
            return encoded_key('i', std::to_string(int(k.b)));
        case Value::Kind::number:
            if (k.d == std::floor(k.d) && std::fabs(k.d) < 9e18)
                return encoded_key('i', std::to_string(int64_t(k.d)));
            return encoded_key('f', float_repr(k.d));
        case Value::Kind::none:
            return encoded_key('n', "");
        default:
            fail(fmt::format("TypeError: unhashable type: '{}'", k.type_name()));
    }
}

Value dict_key_value(const std::string &k) {
    if (k.empty() || k[0] != '\x01') return Value::string(k);
    switch (k.size() > 1 ? k[1] : 0) {
        case 's':
            return Value::string(k.substr(2));
        case 'i':
            return Value::integer(std::strtoll(k.c_str() + 2, nullptr, 10));
        case 'f':
            return Value::number(std::strtod(k.c_str() + 2, nullptr));
        case 'n':
            return Value::none();
        default:
            return Value::string(k);
    }
}

Value Value::undefined(std::string what) {
    Value v;
    v.s = std::move(what);
    return v;
}
Value Value::none() {
    Value v;
    v.kind = Kind::none;
    return v;
}
Value Value::boolean(bool x) {
    Value v;
    v.kind = Kind::boolean;
    v.b = x;
    return v;
}
Value Value::integer(int64_t x) {
    Value v;
    v.kind = Kind::integer;
    v.i = x;
    return v;
}
Value Value::number(double x) {
    Value v;
    v.kind = Kind::number;
    v.d = x;
    return v;
}
Value Value::string(std::string x) {
    Value v;
    v.kind = Kind::string;
    v.s = std::move(x);
    return v;
}
static uint16_t depth_of_children(const List &l) {
    int d = 0;
    for (const Value &c : l) d = std::max<int>(d, c.depth);
    if (d + 1 > kMaxValueDepth) fail(fmt::format("values nested over {} deep", kMaxValueDepth));
    return uint16_t(d + 1);
}

Value Value::make_list(List x) {
    Value v;
    v.depth = depth_of_children(x);
    v.kind = Kind::list;
    v.list = std::make_shared<List>(std::move(x));
    return v;
}
Value Value::make_dict(Dict x) {
    Value v;
    int d = 0;
    for (const auto &kv : x.items) d = std::max<int>(d, kv.second.depth);
    if (d + 1 > kMaxValueDepth) fail(fmt::format("values nested over {} deep", kMaxValueDepth));
    v.depth = uint16_t(d + 1);
    v.kind = Kind::dict;
    v.dict = std::make_shared<Dict>(std::move(x));
    return v;
}
Value Value::function(Function f) {
    Value v;
    v.kind = Kind::function;
    v.fn = std::make_shared<const Function>(std::move(f));
    return v;
}

Value Value::from_json(const nlohmann::json &j) {
    switch (j.type()) {
        case nlohmann::json::value_t::null:
            return none();
        case nlohmann::json::value_t::boolean:
            return boolean(j.get<bool>());
        case nlohmann::json::value_t::number_integer:
            return integer(j.get<int64_t>());
        case nlohmann::json::value_t::number_unsigned: {
            const uint64_t u = j.get<uint64_t>();
            return u > uint64_t(INT64_MAX) ? number(double(u)) : integer(int64_t(u));
        }
        case nlohmann::json::value_t::number_float:
            return number(j.get<double>());
        case nlohmann::json::value_t::string:
            return string(j.get<std::string>());
        case nlohmann::json::value_t::array: {
            List l;
            l.reserve(j.size());
            for (const auto &e : j) l.push_back(from_json(e));
            return make_list(std::move(l));
        }
        case nlohmann::json::value_t::object: {
            Dict d;
            for (auto it = j.begin(); it != j.end(); ++it)
                d.items.emplace_back(dict_key(string(it.key())), from_json(it.value()));
            return make_dict(std::move(d));
        }
        default:
            return none();
    }
}

bool Value::holds_namespace() const {
    if (kind == Kind::list) {
        for (const Value &c : *list)
            if (c.holds_namespace()) return true;
    } else if (kind == Kind::dict) {
        if (dict->is_namespace) return true;
        for (const auto &kv : dict->items)
            if (kv.second.holds_namespace()) return true;
    }
    return false;
}

double Value::as_double() const {
    switch (kind) {
        case Kind::integer:
            return double(i);
        case Kind::number:
            return d;
        case Kind::boolean:
            return b ? 1 : 0;
        default:
            return 0;
    }
}

bool Value::truthy() const {
    switch (kind) {
        case Kind::undefined:
        case Kind::none:
            return false;
        case Kind::boolean:
            return b;
        case Kind::integer:
            return i != 0;
        case Kind::number:
            return d != 0;
        case Kind::string:
            return !s.empty();
        case Kind::list:
            return is_generator || !list->empty();
        case Kind::dict:
            return !dict->items.empty();
        case Kind::function:
            return true;
    }
    return false;
}

std::string Value::type_name() const {
    switch (kind) {
        case Kind::undefined:
            return "Undefined";
        case Kind::none:
            return "NoneType";
        case Kind::boolean:
            return "bool";
        case Kind::integer:
            return "int";
        case Kind::number:
            return "float";
        case Kind::string:
            return "str";
        case Kind::list:
            return is_tuple ? "tuple" : "list";
        case Kind::dict:
            return dict->is_namespace ? "Namespace" : "dict";
        case Kind::function:
            return "function";
    }
    return "?";
}

std::string float_repr(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
    char buf[40];
    for (int prec = 1; prec <= 17; ++prec) {
        std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (std::strtod(buf, nullptr) == d) break;
    }
    // buf: "d.ddde[+-]XX"; Python writes positional notation for exponents in [-4, 16).
    std::string m(buf);
    const size_t e = m.find('e');
    const int exp = std::atoi(m.c_str() + e + 1);
    std::string digits;
    const bool neg = m[0] == '-';
    for (size_t k = neg ? 1 : 0; k < e; ++k)
        if (m[k] != '.') digits += m[k];
    std::string out = neg ? "-" : "";
    if (exp < -4 || exp >= 16) {
        out += digits.substr(0, 1);
        if (digits.size() > 1) {
            out += '.';
            out.append(digits, 1, std::string::npos);
        }
        out += fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
        return out;
    }
    if (exp < 0) {
        out += "0.";
        out.append(size_t(-exp - 1), '0');
        out += digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
        out += digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
        out += digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
    return out;
}

static std::string string_repr(const std::string &s) {
    // Python: single quotes unless the text has a single quote and no double quote.
    const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\')
            out += "\\\\";
        else if (c == q)
            out += std::string("\\") + char(c);
        else if (c == '\n')
            out += "\\n";
        else if (c == '\r')
            out += "\\r";
        else if (c == '\t')
            out += "\\t";
        else if (c < 0x20 || c == 0x7f)
            out += fmt::format("\\x{:02x}", c);
        else
            out += char(c);
    }
    out += q;
    return out;
}

std::string Value::repr() const {
    switch (kind) {
        case Kind::string:
            return string_repr(s);
        case Kind::list: {
            std::string out = is_tuple ? "(" : "[";
            for (size_t k = 0; k < list->size(); ++k) {
                if (k) out += ", ";
                out += (*list)[k].repr();
            }
            if (is_tuple && list->size() == 1) out += ",";
            out += is_tuple ? ")" : "]";
            return out;
        }
        case Kind::dict: {
            if (dict->is_namespace) return "<Namespace>";
            std::string out = "{";
            bool first = true;
            for (const auto &[k, v] : dict->items) {
                if (!first) out += ", ";
                first = false;
                out += dict_key_value(k).repr() + ": " + v.repr();
            }
            return out + "}";
        }
        default:
            return str();
    }
}

std::string Value::str() const {
    switch (kind) {
        case Kind::undefined:
            return "";
        case Kind::none:
            return "None";
        case Kind::boolean:
            return b ? "True" : "False";
        case Kind::integer:
            return std::to_string(i);
        case Kind::number:
            return float_repr(d);
        case Kind::string:
            return s;
        case Kind::function:
            return "<function>";
        case Kind::list:
            if (is_generator) return "<generator object>";
            return repr();
        default:
            return repr();
    }
}

bool values_equal(const Value &a, const Value &b) {
    using K = Value::Kind;
    if (a.is_numeric() && b.is_numeric()) {
        if (a.kind != K::number && b.kind != K::number) {
            const int64_t x = a.kind == K::boolean ? a.b : a.i, y = b.kind == K::boolean ? b.b : b.i;
            return x == y;
        }
        return a.as_double() == b.as_double();
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
        case K::undefined:
        case K::none:
            return true;
        case K::string:
            return a.s == b.s;
        case K::list:
            if (a.list->size() != b.list->size()) return false;
            for (size_t k = 0; k < a.list->size(); ++k)
                if (!values_equal((*a.list)[k], (*b.list)[k])) return false;
            return true;
        case K::dict:
            if (a.dict == b.dict) return true;
            if (a.dict->items.size() != b.dict->items.size()) return false;
            for (const auto &[k, v] : a.dict->items) {
                const Value *o = b.dict->find(k);
                if (!o || !values_equal(v, *o)) return false;
            }
            return true;
        case K::function:
            return a.fn == b.fn;
        default:
            return false;
    }
}

bool value_less(const Value &a, const Value &b) {
    if (a.is_numeric() && b.is_numeric()) {
        if (a.kind == Value::Kind::integer && b.kind == Value::Kind::integer) return a.i < b.i;
        return a.as_double() < b.as_double();
    }
    if (a.is_string() && b.is_string()) return a.s < b.s;  // UTF-8 byte order is code point order
    if (a.is_list() && b.is_list()) {
        const List &x = *a.list, &y = *b.list;
        for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
            if (value_less(x[k], y[k])) return true;
            if (value_less(y[k], x[k])) return false;
        }
        return x.size() < y.size();
    }
    fail(fmt::format("TypeError: '<' not supported between instances of '{}' and '{}'", a.type_name(),
                     b.type_name()));
}

std::u32string utf8_decode(std::string_view s) {
    std::vector<uint32_t> cpts;
    unicode::decode_utf8(s, cpts);
    return std::u32string(cpts.begin(), cpts.end());
}

std::string utf8_encode(std::u32string_view s) {
    std::string out;
    out.reserve(s.size());
    for (char32_t cp : s) unicode::append_utf8(cp < 0x110000 ? uint32_t(cp) : unicode::kReplacement, out);
    return out;
}

static void json_string(std::string &out, const std::string &s, bool ensure_ascii) {
    out += '"';
    const std::u32string cps = utf8_decode(s);
    for (char32_t c : cps) {
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            default:
                if (c < 0x20 || (ensure_ascii && c > 0x7e)) {
                    if (c >= 0x10000) {
                        const char32_t v = c - 0x10000;
                        out += fmt::format("\\u{:04x}\\u{:04x}", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
                    } else {
                        out += fmt::format("\\u{:04x}", uint32_t(c));
                    }
                } else {
                    out += utf8_encode(std::u32string_view(&c, 1));
                }
        }
    }
    out += '"';
}

static void json_dump(std::string &out, const Value &v, const JsonDumpOptions &o, int level) {
    using K = Value::Kind;
    auto newline = [&](int lvl) {
        if (o.indent < 0) return;
        out += '\n';
        out.append(size_t(o.indent * lvl), ' ');
    };
    switch (v.kind) {
        case K::none:
            out += "null";
            return;
        case K::boolean:
            out += v.b ? "true" : "false";
            return;
        case K::integer:
            out += std::to_string(v.i);
            return;
        case K::number:
            if (std::isnan(v.d))
                out += "NaN";
            else if (std::isinf(v.d))
                out += v.d < 0 ? "-Infinity" : "Infinity";
            else
                out += float_repr(v.d);
            return;
        case K::string:
            json_string(out, v.s, o.ensure_ascii);
            return;
        case K::list: {
            if (v.is_generator) break;
            if (v.list->empty()) {
                out += "[]";
                return;
            }
            out += '[';
            for (size_t k = 0; k < v.list->size(); ++k) {
                if (k) out += o.item_sep;
                newline(level + 1);
                json_dump(out, (*v.list)[k], o, level + 1);
            }
            newline(level);
            out += ']';
            return;
        }
        case K::dict: {
            if (v.dict->is_namespace) break;
            if (v.dict->items.empty()) {
                out += "{}";
                return;
            }
            std::vector<const std::pair<std::string, Value> *> items;
            for (const auto &kv : v.dict->items) items.push_back(&kv);
            if (o.sort_keys)
                std::stable_sort(items.begin(), items.end(),
                                 [](auto *a, auto *b) { return a->first < b->first; });
            out += '{';
            for (size_t k = 0; k < items.size(); ++k) {
                if (k) out += o.item_sep;
                newline(level + 1);
                const Value key = dict_key_value(items[k]->first);
                json_string(out,
                            key.is_string()       ? key.s
                            : key.kind == K::none ? "null"
                                                  : key.str(),
                            o.ensure_ascii);
                out += o.key_sep;
                json_dump(out, items[k]->second, o, level + 1);
            }
            newline(level);
            out += '}';
            return;
        }
        default:
            break;
    }
    fail(fmt::format("TypeError: Object of type {} is not JSON serializable",
                     v.is_generator ? "generator" : v.type_name()));
}

std::string json_dumps(const Value &v, const JsonDumpOptions &o) {
    std::string out;
    json_dump(out, v, o, 0);
    return out;
}

}  // namespace td::jinja
