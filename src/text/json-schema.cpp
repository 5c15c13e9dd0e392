#include "text/json-schema.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace td {

using nlohmann::json;

namespace {

// Type bits of a node.
enum : uint16_t {
    T_OBJECT = 1 << 0,
    T_ARRAY = 1 << 1,
    T_STRING = 1 << 2,
    T_INTEGER = 1 << 3,
    T_NUMBER = 1 << 4,
    T_BOOLEAN = 1 << 5,
    T_NULL = 1 << 6,
    T_ANY = 0x7f,
};

// Frame kinds, and their states.
enum : uint8_t { K_OBJECT, K_ARRAY, K_STRING, K_NUMBER, K_LITERALS };
enum : uint8_t { O_FIRST, O_KEY, O_COLON, O_VALUE, O_AFTER_VALUE, O_NEXT_KEY };
enum : uint8_t { A_FIRST, A_AFTER_VALUE, A_VALUE };
enum : uint8_t { S_CHAR, S_ESC, S_U1, S_U2, S_U3, S_U4 };
enum : uint8_t { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

constexpr int kMaxDigits = 16;
constexpr size_t kMaxChoices = 32;  // properties of an object, options of an enum

bool is_ws(uint8_t c) {
    return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}
bool is_digit(uint8_t c) {
    return c >= '0' && c <= '9';
}
bool is_hex(uint8_t c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

}  // namespace

struct JsonSchemaNode {
    uint16_t types = T_ANY;
    // object
    std::vector<std::string> keys;  // property names as they appear between the quotes (JSON-escaped)
    std::vector<const JsonSchemaNode *> values;
    uint32_t required = 0;  // bit i: keys[i] is required
    bool any_keys = false;  // an object of any keys (no "properties")
    // array
    const JsonSchemaNode *items = nullptr;  // nullptr: any value
    uint32_t min_items = 0, max_items = UINT32_MAX;
    // string
    uint32_t min_len = 0, max_len = UINT32_MAX;  // characters
    // enum / const / boolean / null: the JSON texts the value may be ("\"red\"", "3", "true")
    std::vector<std::string> literals;
};

JsonSchema::~JsonSchema() = default;

struct JsonSchemaBuilder {
    JsonSchema &s;
    int depth = 0;

    JsonSchemaNode *make() {
        s.nodes_.push_back(std::make_unique<JsonSchemaNode>());
        return s.nodes_.back().get();
    }

    Status build(const json &j, JsonSchemaNode *n, const std::string &where) {
        if (++depth > JsonMatcher::kMaxDepth - 2)
            return invalid_input("json_schema: nested deeper than {} levels", JsonMatcher::kMaxDepth - 2);
        if (j.is_boolean() && j.get<bool>()) return {};  // `true`: anything
        if (!j.is_object()) return invalid_input("json_schema: {} must be an object", where);
        static const char *const known[] = {"type",        "properties", "required", "additionalProperties",
                                            "items",       "minItems",   "maxItems", "minLength",
                                            "maxLength",   "enum",       "const",    "title",
                                            "description", "$schema",    "default",  "examples",
                                            "strict"};
        for (const auto &item : j.items()) {
            const std::string &key = item.key();
            if (std::find_if(std::begin(known), std::end(known), [&](const char *k) { return key == k; }) ==
                std::end(known))
                return invalid_input("json_schema: '{}' ({}) is not supported", key, where);
        }
        if (auto t = j.find("type"); t != j.end()) {
            n->types = 0;
            const auto add = [&](const json &name) -> Status {
                static const std::pair<const char *, uint16_t> names[] = {
                    {"object", T_OBJECT},   {"array", T_ARRAY},   {"string", T_STRING},
                    {"integer", T_INTEGER}, {"number", T_NUMBER}, {"boolean", T_BOOLEAN},
                    {"null", T_NULL}};
                for (const auto &[nm, bit] : names)
                    if (name.is_string() && name.get<std::string>() == nm) {
                        n->types |= bit;
                        return {};
                    }
                return invalid_input("json_schema: {}: unknown type {}", where, name.dump());
            };
            if (t->is_array()) {
                for (const json &x : *t) TD_TRY(add(x));
            } else {
                TD_TRY(add(*t));
            }
        }
        const auto literal_of = [&](const json &v) -> Result<std::string> {
            if (v.is_object() || v.is_array())
                return invalid_input(
                    "json_schema: {}: enum and const take strings, numbers, booleans or null", where);
            return v.dump();
        };
        if (auto e = j.find("enum"); e != j.end()) {
            if (!e->is_array() || e->empty() || e->size() > kMaxChoices)
                return invalid_input("json_schema: {}: 'enum' must list 1 to {} values", where, kMaxChoices);
            for (const json &v : *e) {
                TD_ASSIGN_OR_RETURN(std::string l, literal_of(v));
                n->literals.push_back(std::move(l));
            }
        }
        if (auto c = j.find("const"); c != j.end()) {
            TD_ASSIGN_OR_RETURN(std::string l, literal_of(*c));
            n->literals = {l};
        }
        const auto count = [&](const char *key, uint32_t &out) -> Status {
            auto v = j.find(key);
            if (v == j.end()) return {};
            if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<int64_t>() >= 0))
                return invalid_input("json_schema: {}: '{}' must be a non-negative integer", where, key);
            out = static_cast<uint32_t>(std::min<uint64_t>(v->get<uint64_t>(), UINT32_MAX));
            return {};
        };
        TD_TRY(count("minItems", n->min_items));
        TD_TRY(count("maxItems", n->max_items));
        TD_TRY(count("minLength", n->min_len));
        TD_TRY(count("maxLength", n->max_len));
        if (n->min_items > n->max_items || n->min_len > n->max_len)
            return invalid_input("json_schema: {}: a minimum above its maximum", where);
        if (auto ap = j.find("additionalProperties"); ap != j.end() &&
                                                      !(ap->is_boolean() && !ap->get<bool>()) &&
                                                      !(ap->is_boolean() && j.contains("properties")))
            return invalid_input("json_schema: {}: 'additionalProperties' other than false is not supported",
                                 where);
        auto props = j.find("properties");
        if (props != j.end()) {
            if (!props->is_object() || props->size() > kMaxChoices)
                return invalid_input(
                    "json_schema: {}: 'properties' must be an object of at most {} properties", where,
                    kMaxChoices);
            for (const auto &[key, sub] : props->items()) {
                std::string quoted = json(key).dump();  // the name as JSON writes it, without the quotes
                n->keys.push_back(quoted.substr(1, quoted.size() - 2));
                JsonSchemaNode *child = make();
                TD_TRY(build(sub, child, where + "." + key));
                n->values.push_back(child);
            }
        } else {
            n->any_keys = true;
        }
        if (auto req = j.find("required"); req != j.end()) {
            if (!req->is_array()) return invalid_input("json_schema: {}: 'required' must be an array", where);
            for (const json &r : *req) {
                const std::string quoted = r.is_string() ? json(r.get<std::string>()).dump() : "";
                const std::string name = quoted.size() >= 2 ? quoted.substr(1, quoted.size() - 2) : "";
                auto it = std::find(n->keys.begin(), n->keys.end(), name);
                if (!r.is_string() || it == n->keys.end())
                    return invalid_input("json_schema: {}: 'required' names {}, which is not in 'properties'",
                                         where, r.dump());
                n->required |= 1u << (it - n->keys.begin());
            }
        }
        if (auto items = j.find("items"); items != j.end()) {
            JsonSchemaNode *child = make();
            TD_TRY(build(*items, child, where + "[]"));
            n->items = child;
        }
        --depth;
        return {};
    }
};

Result<std::shared_ptr<const JsonSchema>> JsonSchema::compile(std::string_view schema_json,
                                                              int max_whitespace) {
    json j = json::parse(schema_json, nullptr, false);
    if (j.is_discarded()) return invalid_input("json_schema: the schema is not valid JSON");
    std::shared_ptr<JsonSchema> s(new JsonSchema());
    s->max_whitespace_ = std::clamp(max_whitespace, 0, 255);
    JsonSchemaBuilder b{*s};
    JsonSchemaNode *root = b.make();
    TD_TRY(b.build(j, root, "the schema"));
    if (!root->literals.empty() || (root->types & ~(T_OBJECT | T_ARRAY)) != 0) {
        if (root->types == T_ANY && root->literals.empty()) {
            root->types = T_OBJECT;  // {} : any JSON object, as json_object mode
        } else {
            return invalid_input("json_schema: the top level must be of type object (or array)");
        }
    }
    s->root_ = root;
    return std::shared_ptr<const JsonSchema>(std::move(s));
}

std::shared_ptr<const JsonSchema> JsonSchema::any_object() {
    auto r = compile(R"({"type": "object"})");
    TD_ASSERT(r.ok(), "{}", r.status().message());
    return *r;
}

// ---- matcher ----------------------------------------------------------------------------------------------

JsonMatcher::JsonMatcher(std::shared_ptr<const JsonSchema> schema) : schema_(std::move(schema)) {}

bool JsonMatcher::push(const JsonSchemaNode *node, uint8_t kind) {
    if (depth_ >= kMaxDepth) return false;
    stack_[depth_++] = Frame{node, kind, 0, 0, 0, -1};
    return true;
}

// The first byte of a value of `node` (nullptr: any value).
bool JsonMatcher::start_value(const JsonSchemaNode *node, uint8_t c) {
    const uint16_t types = node != nullptr ? node->types : static_cast<uint16_t>(T_ANY);
    if (node != nullptr && !node->literals.empty()) {  // enum / const: one of the texts
        uint32_t cand = 0;
        for (size_t i = 0; i < node->literals.size(); ++i)
            if (static_cast<uint8_t>(node->literals[i][0]) == c) cand |= 1u << i;
        if (cand == 0 || !push(node, K_LITERALS)) return false;
        stack_[depth_ - 1].seen = cand;
        stack_[depth_ - 1].count = 1;
        return true;
    }
    if (c == '{' && (types & T_OBJECT)) return push(node, K_OBJECT);
    if (c == '[' && (types & T_ARRAY)) return push(node, K_ARRAY);
    if (c == '"' && (types & T_STRING)) return push(node, K_STRING);
    if ((c == '-' || is_digit(c)) && (types & (T_INTEGER | T_NUMBER))) {
        if (!push(node, K_NUMBER)) return false;
        Frame &f = stack_[depth_ - 1];
        f.state = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        f.count = c == '-' ? 0 : 1;
        return true;
    }
    static const JsonSchemaNode kTrueFalse{
        T_BOOLEAN, {}, {}, 0, false, nullptr, 0, UINT32_MAX, 0, UINT32_MAX, {"true", "false"}};
    static const JsonSchemaNode kNull{T_NULL, {},         {}, 0,          false,   nullptr,
                                      0,      UINT32_MAX, 0,  UINT32_MAX, {"null"}};
    if ((c == 't' || c == 'f') && (types & T_BOOLEAN)) return start_value(&kTrueFalse, c);
    if (c == 'n' && (types & T_NULL)) return start_value(&kNull, c);
    return false;
}

bool JsonMatcher::value_done() {
    --depth_;
    if (depth_ == 0) {
        started_ = true;
        return true;
    }
    Frame &p = stack_[depth_ - 1];
    if (p.kind == K_OBJECT) {
        p.seen |= p.prop >= 0 ? 1u << p.prop : 0u;
        p.state = O_AFTER_VALUE;
    } else {
        p.count++;
        p.state = A_AFTER_VALUE;
    }
    return true;
}

bool JsonMatcher::feed(std::string_view bytes) {
    for (char ch : bytes)
        if (!feed(static_cast<uint8_t>(ch))) return false;
    return true;
}

bool JsonMatcher::feed(uint8_t c) {
    const bool ws = is_ws(c);
    if (ws) {
        // Whitespace goes between tokens only: not inside strings, numbers or literals (those frames take it
        // below), bounded so a model cannot pad forever.
        const bool between =
            depth_ == 0 ? !started_
                        : (stack_[depth_ - 1].kind == K_OBJECT || stack_[depth_ - 1].kind == K_ARRAY) &&
                              !(stack_[depth_ - 1].kind == K_OBJECT && stack_[depth_ - 1].state == O_KEY);
        if (between) {
            if (++ws_run_ > schema_->max_whitespace()) return false;
            return true;
        }
    } else {
        ws_run_ = 0;
    }
    if (depth_ == 0) {
        if (started_) return false;  // the document is complete
        return start_value(&schema_->root(), c);
    }
    Frame &f = stack_[depth_ - 1];
    const JsonSchemaNode *n = f.node;
    switch (f.kind) {
        case K_OBJECT: {
            const bool any_keys = n == nullptr || n->any_keys;
            const uint32_t required = n != nullptr ? n->required : 0;
            switch (f.state) {
                case O_FIRST:
                case O_NEXT_KEY:
                    if (c == '}' && f.state == O_FIRST && (f.seen & required) == required)
                        return value_done();
                    if (c != '"') return false;
                    if (any_keys) {  // a key of any text: read as a string value whose end starts the colon
                        f.state = O_KEY;
                        return push(nullptr, K_STRING);
                    }
                    f.state = O_KEY;
                    f.count = 0;
                    f.prop = -1;
                    {
                        uint32_t cand = 0;
                        for (size_t i = 0; i < n->keys.size(); ++i)
                            if (!(f.seen >> i & 1)) cand |= 1u << i;
                        if (cand == 0) return false;
                        f.prop = static_cast<int32_t>(cand);  // candidates while the key is read
                    }
                    return true;
                case O_KEY: {  // inside a listed key: the candidates that still match
                    uint32_t cand = static_cast<uint32_t>(f.prop), next = 0;
                    if (c == '"') {
                        for (size_t i = 0; i < n->keys.size(); ++i)
                            if ((cand >> i & 1) && n->keys[i].size() == f.count)
                                next = static_cast<uint32_t>(i) + 1;
                        if (next == 0) return false;
                        f.prop = static_cast<int32_t>(next - 1);
                        f.state = O_COLON;
                        return true;
                    }
                    for (size_t i = 0; i < n->keys.size(); ++i)
                        if ((cand >> i & 1) && f.count < n->keys[i].size() &&
                            static_cast<uint8_t>(n->keys[i][f.count]) == c)
                            next |= 1u << i;
                    if (next == 0) return false;
                    f.prop = static_cast<int32_t>(next);
                    f.count++;
                    return true;
                }
                case O_COLON:
                    if (ws) return true;
                    if (c != ':') return false;
                    f.state = O_VALUE;
                    return true;
                case O_VALUE:
                    if (ws) return true;
                    return start_value(any_keys ? nullptr : n->values[static_cast<size_t>(f.prop)], c);
                case O_AFTER_VALUE:
                    if (c == ',') {
                        if (!any_keys && f.seen == (n->keys.size() == 32 ? ~0u : (1u << n->keys.size()) - 1))
                            return false;  // every property is there: nothing may follow
                        f.state = O_NEXT_KEY;
                        return true;
                    }
                    if (c == '}' && (f.seen & required) == required) return value_done();
                    return false;
            }
            return false;
        }
        case K_ARRAY: {
            const JsonSchemaNode *items = n != nullptr ? n->items : nullptr;
            const uint32_t min_items = n != nullptr ? n->min_items : 0,
                           max_items = n != nullptr ? n->max_items : UINT32_MAX;
            switch (f.state) {
                case A_FIRST:
                    if (c == ']' && min_items == 0) return value_done();
                    if (max_items == 0) return false;
                    f.state = A_VALUE;
                    return start_value(items, c);
                case A_VALUE:
                    return start_value(items, c);
                case A_AFTER_VALUE:
                    if (c == ',' && f.count < max_items) {
                        f.state = A_VALUE;
                        return true;
                    }
                    if (c == ']' && f.count >= min_items) return value_done();
                    return false;
            }
            return false;
        }
        case K_STRING: {
            const uint32_t min_len = n != nullptr ? n->min_len : 0,
                           max_len = n != nullptr ? n->max_len : UINT32_MAX;
            switch (f.state) {
                case S_CHAR:
                    if (f.seen != 0) {  // inside a multibyte UTF-8 character: its continuation bytes
                        if ((c & 0xc0) != 0x80) return false;
                        // The second byte after E0, ED, F0 and F4: no overlong form, surrogate or code point
                        // past U+10FFFF.
                        if ((f.lead == 0xe0 && c < 0xa0) || (f.lead == 0xed && c > 0x9f) ||
                            (f.lead == 0xf0 && c < 0x90) || (f.lead == 0xf4 && c > 0x8f))
                            return false;
                        f.lead = 0;
                        f.seen--;
                        return true;
                    }
                    if (c == '"') {
                        if (f.count < min_len) return false;
                        if (depth_ >= 2 && stack_[depth_ - 2].kind == K_OBJECT &&
                            stack_[depth_ - 2].state == O_KEY) {
                            --depth_;  // a free key ends: the object expects its colon
                            stack_[depth_ - 1].state = O_COLON;
                            return true;
                        }
                        return value_done();
                    }
                    if (c < 0x20) return false;
                    if (f.count >= max_len) return false;
                    if (c == '\\') {
                        f.state = S_ESC;
                        return true;
                    }
                    if (c >= 0x80) {  // a lead byte: how many continuation bytes follow
                        if ((c & 0xe0) == 0xc0 && c >= 0xc2)
                            f.seen = 1;
                        else if ((c & 0xf0) == 0xe0)
                            f.seen = 2;
                        else if ((c & 0xf8) == 0xf0 && c <= 0xf4)
                            f.seen = 3;
                        else
                            return false;
                        f.lead = c;
                    }
                    f.count++;
                    return true;
                case S_ESC:
                    if (c == 'u') {
                        f.state = S_U1;
                        return true;
                    }
                    if (!std::strchr("\"\\/bfnrt", c) || c == 0) return false;
                    f.state = S_CHAR;
                    f.count++;
                    return true;
                default:  // S_U1..S_U4
                    if (!is_hex(c)) return false;
                    if (f.state == S_U4) {
                        f.state = S_CHAR;
                        f.count++;
                    } else {
                        f.state++;
                    }
                    return true;
            }
        }
        case K_NUMBER: {
            const bool integer = n != nullptr && !(n->types & T_NUMBER);
            const auto digit = [&](uint8_t next_state) {
                if (f.count >= kMaxDigits) return false;
                f.count++;
                f.state = next_state;
                return true;
            };
            switch (f.state) {
                case N_MINUS:
                    if (c == '0') return f.state = N_ZERO, true;
                    return is_digit(c) && digit(N_INT);
                case N_ZERO:
                case N_INT:
                    if (f.state == N_INT && is_digit(c)) return digit(N_INT);
                    if (!integer && c == '.') return f.count = 0, f.state = N_DOT, true;
                    if (!integer && (c == 'e' || c == 'E')) return f.count = 0, f.state = N_E, true;
                    break;  // the number may end here
                case N_DOT:
                    return is_digit(c) && digit(N_FRAC);
                case N_FRAC:
                    if (is_digit(c)) return digit(N_FRAC);
                    if (c == 'e' || c == 'E') return f.count = 0, f.state = N_E, true;
                    break;
                case N_E:
                    if (c == '+' || c == '-') return f.state = N_ESIGN, true;
                    return is_digit(c) && digit(N_EXP);
                case N_ESIGN:
                    return is_digit(c) && digit(N_EXP);
                case N_EXP:
                    if (is_digit(c) && f.count < 2)
                        return digit(N_EXP);  // |exponent| < 100: a double holds it
                    break;
            }
            // c ends the number (it is complete in these states); the parent reads c.
            if (!value_done()) return false;
            return depth_ > 0 && feed(c);
        }
        case K_LITERALS: {
            uint32_t next = 0;
            bool ended = false;
            for (size_t i = 0; i < n->literals.size(); ++i) {
                if (!(f.seen >> i & 1)) continue;
                const std::string &l = n->literals[i];
                if (f.count < l.size() && static_cast<uint8_t>(l[f.count]) == c) next |= 1u << i;
                if (f.count == l.size()) ended = true;
            }
            if (next != 0) {
                f.seen = next;
                f.count++;
                // A literal that cannot grow further is complete now (strings end with their quote).
                bool longer = false;
                for (size_t i = 0; i < n->literals.size(); ++i)
                    if ((next >> i & 1) && n->literals[i].size() > f.count) longer = true;
                if (!longer) return value_done();
                return true;
            }
            if (!ended) return false;
            if (!value_done()) return false;
            return depth_ > 0 && feed(c);
        }
    }
    return false;
}

// ---- token filter -----------------------------------------------------------------------------------------

}  // namespace td
