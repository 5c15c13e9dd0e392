#include "core/printable.h"

#include <fmt/format.h>

namespace td {

std::string printable(std::string_view s, size_t max_bytes) {
    const bool cut = s.size() > max_bytes;
    if (cut) {
        size_t n = max_bytes;
        while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // not inside a character
        s = s.substr(0, n);
    }
    std::string out;
    out.reserve(s.size() + 3);
    for (char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            out += fmt::format("\\x{:02x}", u);
        } else {
            out += c;
        }
    }
    if (cut) out += "...";
    return out;
}

}  // namespace td
