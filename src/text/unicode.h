// Unicode facts the byte-level BPE tokenizer needs: UTF-8 decoding the way llama.cpp does it, the major
// general category of a code point (what regex \p{L}, \p{N}, \p{P} ... test), the White_Space property, and
// GPT-2's byte <-> character mapping. The tables are generated from the Unicode Character Database by
// scripts/gen-unicode-data.py (unicode-data.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace td::unicode {

inline constexpr uint32_t kReplacement = 0xFFFD;  // U+FFFD REPLACEMENT CHARACTER

// Major general category; code points UnicodeData.txt does not list (Cn) are `undefined`.
enum class Category : uint8_t {
    undefined = 0,
    number,       // Nd Nl No
    letter,       // Lu Ll Lt Lm Lo
    separator,    // Zs Zl Zp
    mark,         // Mn Mc Me
    punctuation,  // Pc Pd Ps Pe Pi Pf Po
    symbol,       // Sm Sc Sk So
    control,      // Cc Cf Cs Co
};

// Category of `cpt`; `undefined` for anything above U+10FFFF.
Category category(uint32_t cpt);

// Unicode White_Space property (PropList.txt): \t..\r, space, U+0085, U+00A0, U+1680, U+2000..U+200A, ...
bool is_whitespace(uint32_t cpt);

// Bytes of the UTF-8 sequence that starts with `lead`, from its high nibble (a continuation byte counts 1).
inline size_t utf8_len(char lead) {
    static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return kLen[static_cast<uint8_t>(lead) >> 4];
}

// Code points of `text`. A byte that does not start a well-formed sequence (a stray continuation byte, a
// lead byte whose continuation bytes are missing, 0xF8..0xFF) becomes one U+FFFD and decoding resumes at the
// next byte, as llama.cpp's unicode_cpts_from_utf8 does. Overlong forms and surrogates are not checked; a
// 4-byte form above U+10FFFF is invalid too (llama.cpp throws on it).
void decode_utf8(std::string_view text, std::vector<uint32_t> &out);

// Appends the UTF-8 form of `cpt` (< 0x110000, asserted).
void append_utf8(uint32_t cpt, std::string &out);

// GPT-2's reversible byte -> character map: printable Latin-1 bytes (! .. ~, ¡ .. ¬, ® .. ÿ) stand for
// themselves, the other 68 bytes for U+0100.. in byte order (space -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
// Returns the UTF-8 of the character for `byte`.
std::string_view byte_to_utf8(uint8_t byte);

// The byte a GPT-2 character stands for, or -1 when `cpt` is not one of the 256.
int utf8_to_byte(uint32_t cpt);

}  // namespace td::unicode
