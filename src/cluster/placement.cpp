#include "cluster/placement.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "net/transport.h"

namespace td::cluster {
namespace {

std::vector<std::string> split_commas(const std::string &s) {
    std::vector<std::string> out;
    size_t start = 0;
    for (;;) {
        const size_t comma = s.find(',', start);
        out.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return out;
}

bool parse_int(const std::string &s, int32_t *out) {
    const char *end = s.data() + s.size();
    auto [p, ec] = std::from_chars(s.data(), end, *out);
    return ec == std::errc() && p == end && !s.empty();
}

}  // namespace

Result<std::vector<std::string>> parse_worker_list(const std::string &workers) {
    std::vector<std::string> out;
    for (const std::string &w : split_commas(workers)) {
        std::string host;
        uint16_t port = 0;
        TD_TRY(net::parse_host_port(w, &host, &port).with_context("--workers"));
        if (port == 0) return invalid_input("--workers: '{}' needs a port other than 0", w);
        out.push_back(w);
    }
    return out;
}

Result<std::vector<LayerRange>> parse_layer_ranges(const std::string &layers, size_t n_workers,
                                                   int32_t n_layer, int32_t first) {
    const std::vector<std::string> parts = split_commas(layers);
    if (parts.size() != n_workers)
        return invalid_input("--layers '{}' has {} ranges for {} workers", layers, parts.size(), n_workers);
    std::vector<LayerRange> out;
    int32_t next = first;
    for (const std::string &p : parts) {
        const size_t dash = p.find('-');
        int32_t a = 0, b = 0;
        if (dash == std::string::npos || !parse_int(p.substr(0, dash), &a) ||
            !parse_int(p.substr(dash + 1), &b))
            return invalid_input("--layers: '{}' is not a range like 0-7", p);
        if (a != next || b < a)
            return invalid_input("--layers: range '{}' should start at layer {} and not end before it", p,
                                 next);
        out.emplace_back(a, b + 1);
        next = b + 1;
    }
    if (next != n_layer)
        return invalid_input("--layers '{}' covers layers {}-{}, the workers must run layers {}-{}", layers,
                             first, next - 1, first, n_layer - 1);
    return out;
}

Result<std::vector<size_t>> parse_layout(const std::string &layout, int32_t tp, size_t n_workers) {
    if (n_workers == 0) return invalid_input("no workers");
    if (!layout.empty()) {
        std::vector<size_t> sizes;
        size_t total = 0;
        for (const std::string &p : split_commas(layout)) {
            char *end = nullptr;
            const long v = std::strtol(p.c_str(), &end, 10);
            if (p.empty() || end != p.c_str() + p.size() || v < 1 || v > static_cast<long>(net::kMaxTpSize))
                return invalid_input("--layout: '{}' is not a node count in 1..{} (e.g. --layout 2,2)", p,
                                     net::kMaxTpSize);
            sizes.push_back(static_cast<size_t>(v));
            total += static_cast<size_t>(v);
        }
        if (total != n_workers)
            return invalid_input("--layout '{}' places {} nodes, --workers lists {}", layout, total, n_workers);
        if (tp > 1)
            for (size_t n : sizes)
                if (n != static_cast<size_t>(tp))
                    return invalid_input("--layout '{}' disagrees with --tp {}; give one of them", layout, tp);
        return sizes;
    }
    if (tp < 1 || tp > static_cast<int32_t>(net::kMaxTpSize))
        return invalid_input("--tp {} must be in 1..{}", tp, net::kMaxTpSize);
    if (n_workers % static_cast<size_t>(tp) != 0)
        return invalid_input("--tp {} needs a multiple of {} workers (stages of {} nodes), got {}", tp, tp, tp,
                             n_workers);
    return std::vector<size_t>(n_workers / static_cast<size_t>(tp), static_cast<size_t>(tp));
}

Result<std::vector<double>> parse_split(const std::string &split, size_t n_workers) {
    const std::vector<std::string> parts = split_commas(split);
    if (parts.size() != n_workers)
        return invalid_input("--split '{}' has {} shares for {} workers", split, parts.size(), n_workers);
    std::vector<double> out;
    for (const std::string &p : parts) {
        char *end = nullptr;
        const double v = std::strtod(p.c_str(), &end);
        if (p.empty() || end != p.c_str() + p.size() || !(v > 0.0) || !std::isfinite(v))
            return invalid_input("--split: '{}' is not a positive number", p);
        out.push_back(v);
    }
    return out;
}

Result<std::vector<LayerRange>> split_layers(const std::vector<double> &weights, int32_t n_layer,
                                             int32_t first_layer, double tail_extra) {
    const int32_t n = static_cast<int32_t>(weights.size());
    if (n == 0) return invalid_input("no workers to place layers on");
    if (first_layer < 0 || first_layer >= n_layer)
        return invalid_input("layer {} to start the workers at is outside the model's 0-{}", first_layer,
                             n_layer - 1);
    const int32_t n_total = n_layer;
    n_layer -= first_layer;  // the layers to place
    if (n_layer < n)
        return invalid_input("{} layers are left for the workers, fewer than the {} workers", n_layer, n);
    const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
    // Each worker's ideal load is its share of all the work (the layers plus the last stage's output head,
    // tail_extra layers' worth); the last worker's layers are its load less the head.
    const double units = n_layer + std::max(0.0, tail_extra);
    std::vector<double> want(n);  // layers beyond the first one each worker should get
    double want_sum = 0;
    for (int32_t i = 0; i < n; ++i) {
        double ideal = units * (sum > 0 ? weights[i] / sum : 1.0 / n);
        if (i == n - 1) ideal -= std::max(0.0, tail_extra);
        want[i] = std::max(0.0, ideal - 1.0);
        want_sum += want[i];
    }
    // Everyone gets one layer; the rest go by largest remainder of what each wants beyond it.
    std::vector<int32_t> count(n, 1);
    const int32_t rest = n_layer - n;
    std::vector<double> frac(n);
    int32_t given = 0;
    for (int32_t i = 0; i < n; ++i) {
        const double share = rest * (want_sum > 0 ? want[i] / want_sum : 1.0 / n);
        const int32_t whole = static_cast<int32_t>(std::floor(share));
        count[i] += whole;
        given += whole;
        frac[i] = share - whole;
    }
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return frac[a] > frac[b]; });
    for (int32_t k = 0; given < rest; ++k, ++given) count[order[k % n]] += 1;
    std::vector<LayerRange> out;
    int32_t first = first_layer;
    for (int32_t c : count) {
        out.emplace_back(first, first + c);
        first += c;
    }
    TD_ASSERT(first == n_total, "split_layers placed {} of {} layers", first, n_total);
    return out;
}

std::vector<double> tp_rebalance(const std::vector<double> &work, const std::vector<double> &busy,
                                 double tolerance, double min_busy_s) {
    if (work.size() < 2 || work.size() != busy.size()) return {};
    for (size_t i = 0; i < work.size(); ++i)
        if (!(work[i] > 0) || !(busy[i] >= min_busy_s)) return {};
    const auto [lo, hi] = std::minmax_element(busy.begin(), busy.end());
    if (*hi <= (1.0 + tolerance) * *lo) return {};
    std::vector<double> shares;
    for (size_t i = 0; i < work.size(); ++i) shares.push_back(work[i] / busy[i]);
    const double least = *std::min_element(shares.begin(), shares.end());
    for (double &s : shares) s /= least;
    return shares;
}

}  // namespace td::cluster
