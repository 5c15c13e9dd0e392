// Jinja's filters, tests, the methods templates call on strings and dicts, and the globals Hugging Face
// adds. Internal to text/jinja-*.
#pragma once

#include <ctime>
#include <functional>
#include <string_view>

#include "text/jinja-value.h"

namespace td::jinja {

// A filter by name applied to `v` (args.pos excludes v); throws Error for an unknown filter.
Value apply_filter(std::string_view name, const Value &v, CallArgs &args);
// A test by name ("defined", "string", "equalto", ...); throws Error for an unknown test.
bool apply_test(std::string_view name, const Value &v, CallArgs &args);
// obj.name as jinja2's sandboxed getattr finds it: a method of a str or dict first, then a key; Undefined
// when absent (an unsafe method, e.g. list.append, is an Undefined that fails when used).
Value get_attr(const Value &obj, std::string_view name);
// obj[key]: a key or index first, then an attribute.
Value get_item(const Value &obj, const Value &key);
// Python's slice obj[start:stop:step] of a list or string (null pointers: omitted).
Value get_slice(const Value &obj, const Value *start, const Value *stop, const Value *step);
// The iteration of a value: list items, dict keys, string characters; Undefined iterates nothing.
List iterate(const Value &v);

// range, namespace, dict, raise_exception, strftime_now.
Value make_global(std::string_view name, const std::function<std::tm()> &now);

}  // namespace td::jinja
