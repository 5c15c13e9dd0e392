#include "server/dry-breakers.h"

#include <algorithm>

namespace td::server {

const std::vector<std::string> &dry_default_breakers() {
    static const std::vector<std::string> breakers = {"\n", ":", "\"", "*"};
    return breakers;
}

Result<std::vector<DryBreaker>> dry_breakers_for(const Tokenizer &tok,
                                                 std::span<const std::string> breakers) {
    if (breakers.size() > kMaxDryBreakerStrings)
        return invalid_input("dry_sequence_breakers has {} strings, at most {}", breakers.size(),
                             kMaxDryBreakerStrings);
    std::vector<DryBreaker> out;
    size_t tail_tokens = 0;
    const int32_t n_tokens = tok.vocab().n_tokens();
    for (const std::string &given : breakers) {
        if (given.empty()) return invalid_input("dry_sequence_breakers: a breaker is empty");
        const std::string_view breaker = std::string_view(given).substr(0, kMaxDryBreakerBytes);
        for (int32_t id = 0; id < n_tokens; ++id) {
            const std::string &text = tok.token_to_piece(id, /*special=*/true);
            if (text.find(breaker) != std::string::npos) {
                out.push_back({id, {}});
                continue;
            }
            // Each place the token's text ends with a start of the breaker: the rest, tokenized, follows.
            const size_t first = out.size();  // this token's sequences (the same tail twice is kept once)
            for (size_t pos = text.find(breaker[0]); pos != std::string::npos;
                 pos = text.find(breaker[0], pos + 1)) {
                const size_t have = text.size() - pos;  // < breaker.size(): the whole one was not found
                if (text.compare(pos, have, breaker, 0, have) != 0) continue;
                std::vector<int32_t> tail = tok.encode(breaker.substr(have), /*add_special=*/false,
                                                       /*parse_special=*/false);
                if (tail.size() > kMaxDryTail) tail.resize(kMaxDryTail);
                DryBreaker b{id, std::move(tail)};
                if (std::find(out.begin() + ptrdiff_t(first), out.end(), b) == out.end()) {
                    tail_tokens += b.tail.size();
                    out.push_back(std::move(b));
                }
            }
            if (out.size() > kMaxDryBreakers || tail_tokens > kMaxDryTailTokens)
                return invalid_input(
                    "dry_sequence_breakers: '{}' and the breakers before it are spelled by more than {} "
                    "token sequences; give breakers that fewer tokens contain",
                    breaker, kMaxDryBreakers);
        }
    }
    std::sort(out.begin(), out.end(), [](const DryBreaker &a, const DryBreaker &b) {
        return a.head < b.head || (a.head == b.head && a.tail < b.tail);
    });
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

}  // namespace td::server
