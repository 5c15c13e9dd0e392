#include "server/json-fields.h"

#include <algorithm>
#include <cctype>
#include <cmath>

namespace td::server {

using nlohmann::json;

namespace {

const char *type_name_of(json::value_t type) {
    switch (type) {
        case json::value_t::null:
            return "null";
        case json::value_t::object:
            return "an object";
        case json::value_t::array:
            return "an array";
        case json::value_t::string:
            return "a string";
        case json::value_t::boolean:
            return "a boolean";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
            return "an integer";
        case json::value_t::number_float:
            return "a number";
        default:
            return "a value of another type";
    }
}

}  // namespace

const char *type_name(const json &v) {
    return type_name_of(v.type());
}

const char *type_name(const nlohmann::ordered_json &v) {
    return type_name_of(v.type());
}

const json *field(const json &obj, const char *key) {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return nullptr;
    return &*it;
}

Status get_number(const json &obj, const char *key, float &out) {
    const json *v = field(obj, key);
    if (v == nullptr) return {};
    if (!v->is_number()) return invalid_input("'{}' must be a number, got {}", key, type_name(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d)) return invalid_input("'{}' must be finite", key);
    out = static_cast<float>(d);
    return {};
}

Status get_int(const json &obj, const char *key, int64_t &out, bool &present) {
    present = false;
    const json *v = field(obj, key);
    if (v == nullptr) return {};
    if (v->is_number_integer() || v->is_number_unsigned()) {
        if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
            return invalid_input("'{}' is out of range", key);
        out = v->get<int64_t>();
    } else if (v->is_number_float() && std::trunc(v->get<double>()) == v->get<double>() &&
               std::fabs(v->get<double>()) < 9e18) {
        out = static_cast<int64_t>(v->get<double>());
    } else {
        return invalid_input("'{}' must be an integer, got {}", key, type_name(*v));
    }
    present = true;
    return {};
}

Status get_bool(const json &obj, const char *key, bool &out) {
    const json *v = field(obj, key);
    if (v == nullptr) return {};
    if (!v->is_boolean()) return invalid_input("'{}' must be a boolean, got {}", key, type_name(*v));
    out = v->get<bool>();
    return {};
}

Status get_strings(const json &obj, const char *key, size_t max, std::vector<std::string> &out) {
    const json *v = field(obj, key);
    if (v == nullptr) return {};
    if (v->is_string()) {
        out.push_back(v->get<std::string>());
        return {};
    }
    if (!v->is_array())
        return invalid_input("'{}' must be a string or an array of strings, got {}", key, type_name(*v));
    if (v->size() > max)
        return invalid_input("'{}' has {} strings; at most {} are allowed", key, v->size(), max);
    for (const json &s : *v) {
        if (!s.is_string()) return invalid_input("'{}' must hold strings, got {}", key, type_name(s));
        out.push_back(s.get<std::string>());
    }
    return {};
}

Status get_messages(const json &obj, std::vector<ChatMessage> &out,
                    const std::function<Status(const json &, size_t, ChatMessage &)> &content) {
    const json *msgs = field(obj, "messages");
    if (msgs == nullptr) return invalid_input("'messages' is required");
    if (!msgs->is_array()) return invalid_input("'messages' must be an array, got {}", type_name(*msgs));
    if (msgs->empty()) return invalid_input("'messages' must hold at least one message");
    for (size_t i = 0; i < msgs->size(); ++i) {
        const json &m = (*msgs)[i];
        if (!m.is_object()) return invalid_input("'messages[{}]' must be an object, got {}", i, type_name(m));
        const json *role = field(m, "role");
        if (role == nullptr || !role->is_string()) return invalid_input("'messages[{}].role' must be a string", i);
        ChatMessage cm;
        cm.role = role->get<std::string>();
        TD_TRY(content(m, i, cm));
        out.push_back(std::move(cm));
    }
    return {};
}

Status get_tools(const json &obj, json &out) {
    const json *tools = field(obj, "tools");
    if (tools == nullptr) return {};
    if (!tools->is_array()) return invalid_input("'tools' must be an array, got {}", type_name(*tools));
    if (tools->size() > 128) return invalid_input("'tools' holds {} tools; at most 128", tools->size());
    std::vector<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
        const json &t = (*tools)[i];
        if (!t.is_object()) return invalid_input("'tools[{}]' must be an object, got {}", i, type_name(t));
        const json *type = field(t, "type");
        if (type != nullptr && (!type->is_string() || type->get<std::string>() != "function"))
            return invalid_input("'tools[{}].type' must be \"function\"", i);
        const json *fn = field(t, "function");
        if (fn == nullptr || !fn->is_object())
            return invalid_input("'tools[{}].function' must be an object", i);
        const json *name = field(*fn, "name");
        if (name == nullptr || !name->is_string())
            return invalid_input("'tools[{}].function.name' must be a string", i);
        const std::string n = name->get<std::string>();
        const bool ok = !n.empty() && n.size() <= 64 && std::all_of(n.begin(), n.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
        });
        if (!ok)
            return invalid_input(
                "'tools[{}].function.name' must be 1 to 64 letters, digits, '_' or '-', got '{}'", i, n);
        if (std::find(names.begin(), names.end(), n) != names.end())
            return invalid_input("'tools' names the function '{}' twice", n);
        names.push_back(n);
        if (const json *d = field(*fn, "description"); d != nullptr && !d->is_string())
            return invalid_input("'tools[{}].function.description' must be a string", i);
        if (const json *p = field(*fn, "parameters"); p != nullptr && !p->is_object())
            return invalid_input("'tools[{}].function.parameters' must be a JSON schema object", i);
    }
    out = json::array();
    for (const json &t : *tools) out.push_back({{"type", "function"}, {"function", t["function"]}});
    return {};
}

Status get_tool_calls(const json &m, size_t index, std::vector<ToolCall> &out) {
    const json *calls = field(m, "tool_calls");
    if (calls == nullptr) return {};
    if (!calls->is_array())
        return invalid_input("'messages[{}].tool_calls' must be an array, got {}", index, type_name(*calls));
    for (size_t k = 0; k < calls->size(); ++k) {
        const json &c = (*calls)[k];
        const json *fn = c.is_object() ? field(c, "function") : nullptr;
        const json *name = fn != nullptr && fn->is_object() ? field(*fn, "name") : nullptr;
        if (name == nullptr || !name->is_string())
            return invalid_input(
                "'messages[{}].tool_calls[{}]' must be {{\"function\": {{\"name\", \"arguments\"}}}}", index,
                k);
        ToolCall tc;
        tc.name = name->get<std::string>();
        if (const json *id = field(c, "id"); id != nullptr && id->is_string()) tc.id = id->get<std::string>();
        const json *args = field(*fn, "arguments");
        if (args == nullptr)
            tc.arguments = "{}";
        else if (args->is_string())
            tc.arguments = args->get<std::string>();
        else if (args->is_object())
            tc.arguments = args->dump();
        else
            return invalid_input(
                "'messages[{}].tool_calls[{}].function.arguments' must be a JSON string or an object", index,
                k);
        out.push_back(std::move(tc));
    }
    return {};
}

std::string text_in_order(std::string_view body, std::initializer_list<const char *> path,
                          const json &fallback) {
    const auto ordered = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    const nlohmann::ordered_json *at = &ordered;
    for (const char *key : path) {
        if (!at->is_object()) return fallback.dump();
        auto it = at->find(key);
        if (it == at->end()) return fallback.dump();
        at = &*it;
    }
    return at->dump();
}

Result<json> parse_object(std::string_view body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_input("the request body is not valid JSON");
    if (!j.is_object()) return invalid_input("the request body must be a JSON object, got {}", type_name(j));
    return j;
}

Result<nlohmann::ordered_json> parse_object_in_order(std::string_view body) {
    nlohmann::ordered_json j = nlohmann::ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_input("the request body is not valid JSON");
    if (!j.is_object()) return invalid_input("the request body must be a JSON object, got {}", type_name(j));
    return j;
}

const nlohmann::ordered_json *field(const nlohmann::ordered_json &obj, const char *key) {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
}

Status get_required_string(const nlohmann::ordered_json &obj, const char *key, std::string_view where,
                           std::string &out) {
    const nlohmann::ordered_json *v = field(obj, key);
    if (v == nullptr) return invalid_input("'{}.{}' is required", where, key);
    if (!v->is_string()) return invalid_input("'{}.{}' must be a string, got {}", where, key, type_name(*v));
    out = v->get<std::string>();
    return {};
}

}  // namespace td::server
