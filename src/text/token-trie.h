// The vocabulary's token pieces as a byte trie, for constrained sampling: which tokens may come next is
// found by walking the trie with a copy of a byte matcher (a JSON-schema matcher, a grammar matcher), so
// tokens that share a prefix feed it once and a refused prefix rules out every token below it.
// Knows nothing about what the matcher checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace td {

class TokenTrie {
public:
    // pieces[id]: token id's bytes; "" = the token is never allowed (control tokens, end of generation).
    explicit TokenTrie(const std::vector<std::string> &pieces);

    size_t n_tokens() const { return n_tokens_; }

    // allowed[id] = 1 when the matcher accepts all of token id's bytes (allowed is resized to n_tokens);
    // returns how many are allowed. M is copyable and has `bool feed(uint8_t)`, which returns false when
    // no text the matcher accepts continues with that byte.
    template <class M>
    size_t allowed(const M &m, std::vector<uint8_t> &allowed) const {
        allowed.assign(n_tokens_, 0);
        std::vector<M> levels(max_depth_ + 1, m);
        return visit(0, levels, 0, allowed);
    }

private:
    struct Node {
        uint32_t first_child = 0;  // index into nodes_ of the first child; children are contiguous
        uint32_t n_children = 0;
        uint32_t first_token = 0;  // index into tokens_ of the ids whose piece ends here
        uint32_t n_tokens = 0;
        uint8_t byte = 0;  // the edge from the parent
    };

    // levels[d]: the matcher after node's prefix. Every child but the last continues on a copy assigned into
    // levels[d + 1] (reusing its memory), the last on levels[d] itself: a chain of single children (most of a
    // long token) copies nothing. A node at depth k uses levels up to k + 1.
    template <class M>
    size_t visit(uint32_t node, std::vector<M> &levels, size_t d, std::vector<uint8_t> &allowed) const {
        size_t n = 0;
        const Node &nd = nodes_[node];
        for (uint32_t c = nd.first_child; c < nd.first_child + nd.n_children; ++c) {
            const Node &child = nodes_[c];
            size_t s = d;
            if (c + 1 < nd.first_child + nd.n_children) {
                levels[d + 1] = levels[d];
                s = d + 1;
            }
            if (!levels[s].feed(child.byte)) continue;
            for (uint32_t t = child.first_token; t < child.first_token + child.n_tokens; ++t) {
                allowed[tokens_[t]] = 1;
                ++n;
            }
            if (child.n_children > 0) n += visit(c, levels, s, allowed);
        }
        return n;
    }

    std::vector<Node> nodes_;       // [0] is the root (the empty prefix); a node's children sorted by byte
    std::vector<uint32_t> tokens_;  // token ids, grouped by the node their piece ends at
    size_t n_tokens_ = 0;
    size_t max_depth_ = 0;  // the longest piece
};

}  // namespace td
