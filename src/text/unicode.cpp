#include "text/unicode.h"

#include <algorithm>
#include <array>

#include "core/check.h"
#include "text/unicode-data.h"

namespace td::unicode {

namespace {

// Category by code point below 0x10000 (the planes almost all text lives in), built once from the runs:
// one byte per code point, so the hot path of the pre-tokenizers is a load.
struct CategoryTable {
    std::vector<Category> bmp;  // [0x10000]

    CategoryTable() : bmp(0x10000) {
        for (size_t i = 0; i < data::kNumCategoryRuns; ++i) {
            const uint32_t first = data::kCategoryRuns[i].first;
            if (first >= 0x10000) break;
            const uint32_t end = i + 1 < data::kNumCategoryRuns
                                     ? std::min<uint32_t>(data::kCategoryRuns[i + 1].first, 0x10000)
                                     : 0x10000;
            std::fill(bmp.begin() + first, bmp.begin() + end, data::kCategoryRuns[i].category);
        }
    }
};

const CategoryTable &category_table() {
    static const CategoryTable table;
    return table;
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes map to themselves, the rest to U+0100 + n in order.
struct ByteMap {
    std::array<std::string, 256> to_utf8;
    std::array<int16_t, 0x144> from_cpt;  // [U+0000 .. U+0143] -> byte or -1

    ByteMap() {
        from_cpt.fill(-1);
        uint32_t n = 0;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            const uint32_t cpt = printable ? static_cast<uint32_t>(b) : 0x100 + n++;
            append_utf8(cpt, to_utf8[b]);
            from_cpt[cpt] = static_cast<int16_t>(b);
        }
        TD_ASSERT(n == 68);
    }
};

const ByteMap &byte_map() {
    static const ByteMap map;
    return map;
}

}  // namespace

Category category(uint32_t cpt) {
    if (cpt < 0x10000) return category_table().bmp[cpt];
    if (cpt >= 0x110000) return Category::undefined;
    const data::CategoryRun *begin = data::kCategoryRuns, *end = begin + data::kNumCategoryRuns;
    const auto *it = std::upper_bound(begin, end, cpt,
                                      [](uint32_t c, const data::CategoryRun &run) { return c < run.first; });
    return (it - 1)->category;  // kCategoryRuns[0].first == 0, so it > begin
}

bool is_whitespace(uint32_t cpt) {
    if (cpt < 0x80) return cpt == ' ' || (cpt >= '\t' && cpt <= '\r');
    return std::binary_search(data::kWhiteSpace, data::kWhiteSpace + data::kNumWhiteSpace, cpt);
}

void decode_utf8(std::string_view text, std::vector<uint32_t> &out) {
    out.reserve(out.size() + text.size());
    auto cont = [&](size_t i) { return i < text.size() && (static_cast<uint8_t>(text[i]) & 0xC0) == 0x80; };
    for (size_t i = 0; i < text.size();) {
        const auto b0 = static_cast<uint8_t>(text[i]);
        auto bits = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(text[i + k]) & 0x3F); };
        if (b0 < 0x80) {
            out.push_back(b0);
            i += 1;
        } else if ((b0 & 0xE0) == 0xC0 && cont(i + 1)) {
            out.push_back(((b0 & 0x1Fu) << 6) | bits(1));
            i += 2;
        } else if ((b0 & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
            out.push_back(((b0 & 0x0Fu) << 12) | (bits(1) << 6) | bits(2));
            i += 3;
        } else if ((b0 & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3) &&
                   (((b0 & 0x07u) << 18) | (bits(1) << 12)) < 0x110000) {
            out.push_back(((b0 & 0x07u) << 18) | (bits(1) << 12) | (bits(2) << 6) | bits(3));
            i += 4;
        } else {
            out.push_back(kReplacement);
            i += 1;
        }
    }
}

void append_utf8(uint32_t cpt, std::string &out) {
    TD_ASSERT(cpt < 0x110000, "code point 0x{:X} is outside Unicode", cpt);
    if (cpt < 0x80) {
        out += static_cast<char>(cpt);
    } else if (cpt < 0x800) {
        out += static_cast<char>(0xC0 | (cpt >> 6));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    } else if (cpt < 0x10000) {
        out += static_cast<char>(0xE0 | (cpt >> 12));
        out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cpt >> 18));
        out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cpt & 0x3F));
    }
}

std::string_view byte_to_utf8(uint8_t byte) {
    return byte_map().to_utf8[byte];
}

int utf8_to_byte(uint32_t cpt) {
    const auto &from = byte_map().from_cpt;
    return cpt < from.size() ? from[cpt] : -1;
}

}  // namespace td::unicode
