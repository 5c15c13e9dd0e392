// The collective a tensor-parallel group's forward pass calls: the model's only view of being distributed.
//
// Every node of a group (a "rank") holds a slice of every layer (model/tp-slice.h). Twice per layer (after the
// attention output projection and after the FFN down projection) each rank holds a partial sum of the hidden
// state; all_reduce_sum turns the partials into their sum on every rank. At the output head each rank holds
// logits for its part of the vocabulary; gather brings what sampling needs to rank 0 (model/tp-sample.h).
//
// Order: the sum is taken in rank order, ((p0 + p1) + p2) + ..., element by element, whatever the transport
// or the algorithm, so every rank ends with bit-identical hidden states and the result does not depend on
// which partial arrived first.
//
// model/ never implements this over a network: cluster/ does (over net/), and one machine is a group of one
// whose collective does nothing (pass nullptr to Context).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace td {

class Collective {
public:
    virtual ~Collective() = default;

    virtual int rank() const = 0;
    virtual int size() const = 0;

    // data: [n] this rank's partial sum in, the group's sum out. Every rank calls it with the same n, in the
    // same sequence of calls. Errors: a rank disconnected or stalled (kind disconnected / failed, naming it);
    // the group is unusable after an error.
    virtual Status all_reduce_sum(float *data, size_t n) = 0;

    // Rank 0: out[r] receives rank r's bytes (out[0] = mine), in rank order. Other ranks send theirs and leave
    // out untouched. Sizes may differ per rank (each at most kMaxGatherBytes).
    virtual Status gather(std::span<const uint8_t> mine, std::vector<std::vector<uint8_t>> &out) = 0;

    static constexpr size_t kMaxGatherBytes = size_t{1} << 30;
};

}  // namespace td
