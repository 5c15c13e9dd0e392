// Untrusted text shown in an error message: short, and safe to print.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace td {

// `s` with control bytes written as \x.. and, when longer than max_bytes, cut on a UTF-8 character boundary
// with "..." added: printable("a\nb") is "a\x0ab".
std::string printable(std::string_view s, size_t max_bytes = 60);

}  // namespace td
