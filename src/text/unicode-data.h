// Generated tables behind unicode.h (definitions in unicode-data.cpp, written by
// scripts/gen-unicode-data.py).
#pragma once

#include <cstddef>
#include <cstdint>

#include "text/unicode.h"

namespace td::unicode::data {

// A run of code points of one category: [first, next run's first). Sorted, kCategoryRuns[0].first == 0; the
// last run reaches U+10FFFF.
struct CategoryRun {
    uint32_t first;
    Category category;
};

extern const CategoryRun kCategoryRuns[];
extern const size_t kNumCategoryRuns;

extern const uint32_t kWhiteSpace[];  // sorted
extern const size_t kNumWhiteSpace;

}  // namespace td::unicode::data
