#include "server/json-fields.h"

#include <cmath>

namespace td::server {

using nlohmann::json;

const char *type_name(const json &v) {
    switch (v.type()) {
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

Result<json> parse_object(std::string_view body) {
    json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_input("the request body is not valid JSON");
    if (!j.is_object()) return invalid_input("the request body must be a JSON object, got {}", type_name(j));
    return j;
}

}  // namespace td::server
