// Metadata values and the typed getters of File.
#include <cmath>
#include <limits>

#include "gguf/gguf.h"

namespace td::gguf {

const char *value_type_name(ValueType type) {
    switch (type) {
        case ValueType::u8:
            return "u8";
        case ValueType::i8:
            return "i8";
        case ValueType::u16:
            return "u16";
        case ValueType::i16:
            return "i16";
        case ValueType::u32:
            return "u32";
        case ValueType::i32:
            return "i32";
        case ValueType::f32:
            return "f32";
        case ValueType::boolean:
            return "bool";
        case ValueType::string:
            return "string";
        case ValueType::array:
            return "array";
        case ValueType::u64:
            return "u64";
        case ValueType::i64:
            return "i64";
        case ValueType::f64:
            return "f64";
    }
    return "unknown";
}

namespace {

bool type_is_integer(ValueType t) {
    return t != ValueType::f32 && t != ValueType::f64 && t != ValueType::string && t != ValueType::array;
}
bool type_is_float(ValueType t) {
    return t == ValueType::f32 || t == ValueType::f64;
}

// "u32", "array of string", "array of array".
std::string describe(const Value &v) {
    if (v.type != ValueType::array) return value_type_name(v.type);
    return fmt::format("array of {}", value_type_name(v.elem_type));
}

// An integer element as stored (u64 above INT64_MAX is bit-cast into int64), checked against [lo, hi].
bool int_fits(ValueType type, int64_t i, int64_t lo, int64_t hi) {
    if (type == ValueType::u64 && i < 0) return false;  // really >= 2^63
    return i >= lo && i <= hi;
}

std::string int_text(ValueType type, int64_t i) {
    return type == ValueType::u64 ? fmt::format("{}", static_cast<uint64_t>(i)) : fmt::format("{}", i);
}

double int_as_double(ValueType type, int64_t i) {
    return type == ValueType::u64 ? static_cast<double>(static_cast<uint64_t>(i)) : static_cast<double>(i);
}

}  // namespace

size_t Value::array_size() const {
    if (type != ValueType::array) return 0;
    if (elem_type == ValueType::string) return strings.size();
    if (elem_type == ValueType::array) return items.size();
    if (type_is_float(elem_type)) return floats.size();
    return ints.size();
}

bool Value::is_integer() const {
    return type_is_integer(type);
}
bool Value::is_float() const {
    return type_is_float(type);
}

TensorView TensorInfo::view() const {
    TensorView v;
    v.name = name;
    v.type = type;
    v.n_dims = n_dims;
    for (int d = 0; d < 4; ++d) v.ne[d] = ne[d];
    v.data = data;
    return v;
}

namespace {

Status missing(const File &f, std::string_view key) {
    return make_error(ErrorKind::not_found, "{}: missing required key '{}'", f.path(), key);
}

Status wrong_type(const File &f, std::string_view key, const Value &v, std::string_view expected) {
    return invalid_input("{}: key '{}' is {}, expected {}", f.path(), key, describe(v), expected);
}

Result<int64_t> int_in_range(const File &f, std::string_view key, int64_t lo, int64_t hi, const char *range) {
    const Value *v = f.find(key);
    if (v == nullptr) return missing(f, key);
    if (!v->is_integer()) return wrong_type(f, key, *v, "an integer");
    if (!int_fits(v->type, v->i, lo, hi))
        return invalid_input("{}: key '{}' is {}, which does not fit in {}", f.path(), key,
                             int_text(v->type, v->i), range);
    return v->i;
}

}  // namespace

Result<std::string> File::get_string(std::string_view key) const {
    const Value *v = find(key);
    if (v == nullptr) return missing(*this, key);
    if (v->type != ValueType::string) return wrong_type(*this, key, *v, "a string");
    return v->str;
}

Result<int64_t> File::get_int(std::string_view key) const {
    return int_in_range(*this, key, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                        "i64");
}

Result<uint32_t> File::get_u32(std::string_view key) const {
    TD_ASSIGN_OR_RETURN(int64_t i, int_in_range(*this, key, 0, std::numeric_limits<uint32_t>::max(), "u32"));
    return static_cast<uint32_t>(i);
}

Result<float> File::get_f32(std::string_view key) const {
    const Value *v = find(key);
    if (v == nullptr) return missing(*this, key);
    if (v->is_integer()) return static_cast<float>(int_as_double(v->type, v->i));
    if (!v->is_float()) return wrong_type(*this, key, *v, "a number");
    auto f = static_cast<float>(v->f);
    if (std::isinf(f) && !std::isinf(v->f))
        return invalid_input("{}: key '{}' is {}, which does not fit in f32", path(), key, v->f);
    return f;
}

Result<bool> File::get_bool(std::string_view key) const {
    const Value *v = find(key);
    if (v == nullptr) return missing(*this, key);
    if (v->type != ValueType::boolean) return wrong_type(*this, key, *v, "a bool");
    return v->i != 0;
}

Result<std::vector<std::string>> File::get_string_array(std::string_view key) const {
    const Value *v = find(key);
    if (v == nullptr) return missing(*this, key);
    if (v->type != ValueType::array || v->elem_type != ValueType::string)
        return wrong_type(*this, key, *v, "an array of string");
    return v->strings;
}

Result<std::vector<float>> File::get_f32_array(std::string_view key) const {
    const Value *v = find(key);
    if (v == nullptr) return missing(*this, key);
    if (v->type != ValueType::array || !(type_is_float(v->elem_type) || type_is_integer(v->elem_type)))
        return wrong_type(*this, key, *v, "an array of numbers");
    std::vector<float> out;  // [array_size]
    out.reserve(v->array_size());
    if (type_is_float(v->elem_type))
        for (double f : v->floats) out.push_back(static_cast<float>(f));
    else
        for (int64_t i : v->ints) out.push_back(static_cast<float>(int_as_double(v->elem_type, i)));
    return out;
}

Result<std::vector<int32_t>> File::get_i32_array(std::string_view key) const {
    const Value *v = find(key);
    if (v == nullptr) return missing(*this, key);
    if (v->type != ValueType::array || !type_is_integer(v->elem_type))
        return wrong_type(*this, key, *v, "an array of integers");
    std::vector<int32_t> out;  // [array_size]
    out.reserve(v->ints.size());
    for (size_t k = 0; k < v->ints.size(); ++k) {
        int64_t i = v->ints[k];
        if (!int_fits(v->elem_type, i, std::numeric_limits<int32_t>::min(),
                      std::numeric_limits<int32_t>::max()))
            return invalid_input("{}: key '{}' element {} is {}, which does not fit in i32", path(), key, k,
                                 int_text(v->elem_type, i));
        out.push_back(static_cast<int32_t>(i));
    }
    return out;
}

Result<std::optional<int64_t>> File::get_int_opt(std::string_view key) const {
    if (!has(key)) return std::optional<int64_t>();
    TD_ASSIGN_OR_RETURN(int64_t v, get_int(key));
    return std::optional<int64_t>(v);
}

Result<std::optional<float>> File::get_f32_opt(std::string_view key) const {
    if (!has(key)) return std::optional<float>();
    TD_ASSIGN_OR_RETURN(float v, get_f32(key));
    return std::optional<float>(v);
}

Result<std::optional<std::string>> File::get_string_opt(std::string_view key) const {
    if (!has(key)) return std::optional<std::string>();
    TD_ASSIGN_OR_RETURN(std::string v, get_string(key));
    return std::optional<std::string>(std::move(v));
}

Result<std::optional<bool>> File::get_bool_opt(std::string_view key) const {
    if (!has(key)) return std::optional<bool>();
    TD_ASSIGN_OR_RETURN(bool v, get_bool(key));
    return std::optional<bool>(v);
}

}  // namespace td::gguf
