// Which worker runs which layers. Stages are contiguous layer ranges in worker order, covering
// [first, n_layer); layers [0, first) run on the head (--head-layers).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace td::cluster {

using LayerRange = std::pair<int32_t, int32_t>;  // [first, last)

// "h1:p1,h2:p2" -> addresses. Errors name the bad entry.
Result<std::vector<std::string>> parse_worker_list(const std::string &workers);

// "0-7,8-15": inclusive ranges, one per worker, in order, contiguous from layer `first` to n_layer - 1.
Result<std::vector<LayerRange>> parse_layer_ranges(const std::string &layers, size_t n_workers,
                                                   int32_t n_layer, int32_t first = 0);

// Nodes per pipeline stage: from `layout` ("2,2": two stages of two nodes, in worker order; sizes add up to
// n_workers), else stages of `tp` nodes (n_workers a multiple of tp), else one node per stage. Errors name
// the problem ("--tp 2 needs an even number of workers, got 3").
Result<std::vector<size_t>> parse_layout(const std::string &layout, int32_t tp, size_t n_workers);

// "1,1" or "3,1": positive relative shares, one per worker.
Result<std::vector<double>> parse_split(const std::string &split, size_t n_workers);

// Layers [first, n_layer) in proportion to `weights` (largest remainder), at least one layer each, in
// worker order. The last worker also runs the output head, which costs `tail_extra` layers: the work (its
// layers plus the head) is what goes in proportion. Error: fewer layers than workers.
Result<std::vector<LayerRange>> split_layers(const std::vector<double> &weights, int32_t n_layer,
                                             int32_t first = 0, double tail_extra = 0.0);

// The shares that would even out a tensor-parallel group whose ranks computed work[i] (their weight bytes: a
// decode step streams them) in busy[i] seconds (their compute time less their waits in the collectives):
// each rank's share in proportion to what it computed per second, the smallest 1. Empty where the ranks were
// busy within `tolerance` of each other, or where a rank was busy less than min_busy_s (too short to tell).
std::vector<double> tp_rebalance(const std::vector<double> &work, const std::vector<double> &busy,
                                 double tolerance = 0.10, double min_busy_s = 0.05);

}  // namespace td::cluster
