// Sizes as people write them on a command line.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace td {

// "20G", "512M", "64K", "1T" (binary units; "GB", "GiB" alike), "1.5G", or plain bytes -> bytes.
// Error (invalid_input): "'5X' is not a size (bytes, or a number with K, M, G or T)".
Result<uint64_t> parse_byte_size(const std::string &text);

}  // namespace td
