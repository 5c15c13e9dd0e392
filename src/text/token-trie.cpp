#include "text/token-trie.h"

#include <algorithm>
#include <string_view>

namespace td {

namespace {

struct Builder {
    const std::vector<std::string> &pieces;
    const std::vector<uint32_t> &order;  // token ids with a piece, sorted by piece
    std::vector<uint32_t> &tokens;

    // Fills node `node` from the ids order[lo, hi), which all share their first `depth` bytes.
    template <class Nodes>
    void build(Nodes &nodes, uint32_t node, size_t lo, size_t hi, size_t depth) {
        // Pieces that end here sort before the longer ones that continue.
        nodes[node].first_token = static_cast<uint32_t>(tokens.size());
        while (lo < hi && pieces[order[lo]].size() == depth) tokens.push_back(order[lo++]);
        nodes[node].n_tokens = static_cast<uint32_t>(tokens.size()) - nodes[node].first_token;
        // One child per distinct next byte, allocated as one block.
        std::vector<size_t> starts;
        for (size_t i = lo; i < hi; ++i)
            if (i == lo || pieces[order[i]][depth] != pieces[order[i - 1]][depth]) starts.push_back(i);
        if (starts.empty()) return;
        const auto first = static_cast<uint32_t>(nodes.size());
        nodes[node].first_child = first;
        nodes[node].n_children = static_cast<uint32_t>(starts.size());
        nodes.resize(nodes.size() + starts.size());
        for (size_t k = 0; k < starts.size(); ++k) {
            const size_t end = k + 1 < starts.size() ? starts[k + 1] : hi;
            const auto child = static_cast<uint32_t>(first + k);
            nodes[child].byte = static_cast<uint8_t>(pieces[order[starts[k]]][depth]);
            build(nodes, child, starts[k], end, depth + 1);
        }
    }
};

}  // namespace

TokenTrie::TokenTrie(const std::vector<std::string> &pieces) : n_tokens_(pieces.size()) {
    std::vector<uint32_t> order;
    for (size_t id = 0; id < pieces.size(); ++id)
        if (!pieces[id].empty()) {
            order.push_back(static_cast<uint32_t>(id));
            max_depth_ = std::max(max_depth_, pieces[id].size());
        }
    std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        return std::string_view(pieces[a]) < std::string_view(pieces[b]);
    });
    nodes_.resize(1);
    Builder b{pieces, order, tokens_};
    b.build(nodes_, 0, 0, order.size(), 0);
}

}  // namespace td
