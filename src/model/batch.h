// A batch: the rows one forward call computes. Each row is a token (or, for a stage that does not start at
// layer 0, a row of the incoming hidden state) at a position of a sequence, and says whether its logits are
// wanted. A long prompt and many decoding sequences go through the same call.
#pragma once

#include <cstdint>
#include <vector>

namespace td {

struct Batch {
    std::vector<int32_t> token;        // [n] token ids (read only when the range starts at layer 0)
    std::vector<int32_t> pos;          // [n] position in its sequence
    std::vector<int32_t> seq;          // [n] sequence slot (KV cache slot)
    std::vector<uint8_t> want_logits;  // [n] 1 = compute logits for this row (last stage only)

    int32_t size() const { return static_cast<int32_t>(pos.size()); }
    bool empty() const { return pos.empty(); }
    void clear() {
        token.clear();
        pos.clear();
        seq.clear();
        want_logits.clear();
    }
    void add(int32_t tok, int32_t p, int32_t s, bool logits) {
        token.push_back(tok);
        pos.push_back(p);
        seq.push_back(s);
        want_logits.push_back(logits ? 1 : 0);
    }
    int32_t n_outputs() const {
        int32_t n = 0;
        for (uint8_t w : want_logits) n += w;
        return n;
    }
};

}  // namespace td
