#include "model/draft.h"

#include <algorithm>

namespace td {

void lookup_draft(std::span<const int32_t> history, int32_t n, const DraftParams &params,
                  std::vector<int32_t> &out) {
    out.clear();
    const int64_t len = static_cast<int64_t>(history.size());
    if (n <= 0 || len < 2) return;
    const int32_t lo = std::max(params.ngram_min, 1);
    for (int32_t g = std::min<int64_t>(params.ngram_max, len - 1); g >= lo; --g) {
        const int32_t *suffix = history.data() + (len - g);
        // Latest first: an occurrence starting at j, ending before the suffix's own start would be too
        // strict (a run like "a a a" overlaps itself), so only the suffix itself is excluded.
        for (int64_t j = len - g - 1; j >= 0; --j) {
            if (!std::equal(suffix, suffix + g, history.data() + j)) continue;
            const int64_t from = j + g;  // < len: j < len - g
            const int64_t to = std::min<int64_t>(len, from + n);
            out.assign(history.begin() + from, history.begin() + to);
            return;
        }
    }
}

}  // namespace td
