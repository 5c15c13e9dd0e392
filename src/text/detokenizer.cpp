#include "text/detokenizer.h"

#include "core/check.h"

namespace td {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Well-formed UTF-8 (Unicode table 3-7): how many bytes a lead byte starts (0: never a lead byte) and the
// range its first continuation byte must lie in (the rest are always 80..BF).
struct LeadInfo {
    int len;
    uint8_t lo, hi;
};

LeadInfo lead_info(uint8_t b) {
    if (b < 0x80) return {1, 0, 0};
    if (b < 0xC2) return {0, 0, 0};  // continuation byte, or C0/C1 (overlong)
    if (b < 0xE0) return {2, 0x80, 0xBF};
    if (b == 0xE0) return {3, 0xA0, 0xBF};  // no overlong 3-byte forms
    if (b == 0xED) return {3, 0x80, 0x9F};  // no surrogates
    if (b < 0xF0) return {3, 0x80, 0xBF};
    if (b == 0xF0) return {4, 0x90, 0xBF};  // no overlong 4-byte forms
    if (b < 0xF4) return {4, 0x80, 0xBF};
    if (b == 0xF4) return {4, 0x80, 0x8F};  // nothing above U+10FFFF
    return {0, 0, 0};                       // F5..FF
}

}  // namespace

size_t utf8_append_valid(std::string_view bytes, bool final, std::string &out) {
    size_t i = 0;
    while (i < bytes.size()) {
        const auto b = static_cast<uint8_t>(bytes[i]);
        const LeadInfo info = lead_info(b);
        if (info.len == 1) {
            out += bytes[i++];
            continue;
        }
        if (info.len == 0) {
            out += kReplacement;
            ++i;
            continue;
        }
        // Count the continuation bytes that fit; stop at the first that does not.
        size_t k = 1;
        bool bad = false;
        for (; k < static_cast<size_t>(info.len); ++k) {
            if (i + k >= bytes.size()) break;  // ran out: maybe more bytes will come
            const auto c = static_cast<uint8_t>(bytes[i + k]);
            const uint8_t lo = k == 1 ? info.lo : 0x80, hi = k == 1 ? info.hi : 0xBF;
            if (c < lo || c > hi) {
                bad = true;
                break;
            }
        }
        if (k == static_cast<size_t>(info.len)) {
            out.append(bytes.substr(i, k));
            i += k;
        } else if (bad || final) {
            out += kReplacement;  // lead + the continuation bytes that fitted: one maximal subpart
            i += k;
        } else {
            return bytes.size() - i;  // a valid start of a character: hold it back
        }
    }
    return 0;
}

Detokenizer::Detokenizer(const Tokenizer &tokenizer, Start start, bool render_special)
    : tokenizer_(tokenizer),
      render_special_(render_special),
      strip_space_(start == Start::text && tokenizer.vocab().add_space_prefix()) {}

std::string Detokenizer::push(int32_t id) {
    std::string_view piece = tokenizer_.token_to_piece(id, render_special_);
    if (piece.empty()) return {};
    if (strip_space_) {
        strip_space_ = false;
        if (piece.front() == ' ') piece.remove_prefix(1);
    }
    std::string bytes = std::move(pending_);
    bytes.append(piece);
    std::string out;
    const size_t held = utf8_append_valid(bytes, /*final=*/false, out);
    TD_ASSERT(held <= 3, "held {} bytes", held);
    pending_.assign(bytes, bytes.size() - held, held);
    return out;
}

std::string Detokenizer::flush() {
    std::string out;
    utf8_append_valid(pending_, /*final=*/true, out);
    pending_.clear();
    return out;
}

std::string detokenize(const Tokenizer &tokenizer, std::span<const int32_t> ids, Detokenizer::Start start,
                       bool render_special) {
    Detokenizer detok(tokenizer, start, render_special);
    std::string out;
    for (int32_t id : ids) out += detok.push(id);
    out += detok.flush();
    return out;
}

}  // namespace td
