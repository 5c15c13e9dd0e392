#include "core/size.h"

#include <string>

namespace td {

Result<uint64_t> parse_byte_size(const std::string &text) {
    size_t used = 0;
    double v = 0.0;
    try {
        v = std::stod(text, &used);
    } catch (...) {
        used = 0;
    }
    std::string unit = text.substr(used);
    if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();  // "20GB", "20GiB"
    if (unit.size() == 2 && (unit[1] == 'i' || unit[1] == 'I')) unit.pop_back();
    double scale = 0.0;
    if (unit.empty()) scale = 1.0;
    else if (unit.size() == 1) {
        switch (unit[0]) {
            case 'k': case 'K': scale = 1024.0; break;
            case 'm': case 'M': scale = 1024.0 * 1024; break;
            case 'g': case 'G': scale = 1024.0 * 1024 * 1024; break;
            case 't': case 'T': scale = 1024.0 * 1024 * 1024 * 1024; break;
        }
    }
    if (used == 0 || scale == 0.0 || !(v >= 0) || v * scale > 1.8e19)
        return invalid_input("'{}' is not a size (bytes, or a number with K, M, G or T)", text);
    return static_cast<uint64_t>(v * scale + 0.5);
}

}  // namespace td
