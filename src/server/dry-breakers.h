// DRY's sequence breakers, from the strings a user gives (llama-server's dry_sequence_breakers, run's
// --dry-sequence-breaker) to the token sequences the sampler matches against its history.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/sampler.h"
#include "text/tokenizer.h"

namespace td::server {

inline constexpr size_t kMaxDryBreakerStrings = 64;  // strings per request
inline constexpr size_t kMaxDryBreakerBytes = 40;    // a longer breaker is cut to this (llama.cpp's cap)

// llama.cpp's defaults: a new line, a colon, a double quote, an asterisk.
const std::vector<std::string> &dry_default_breakers();

// For each breaker (as llama.cpp's DRY sampler builds them): every token whose text holds the whole breaker
// is a breaker by itself (an empty tail); every token whose text ends with a proper start of it heads a
// sequence whose tail is the rest of the breaker, tokenized (at most kMaxDryTail tokens). Breakers over
// kMaxDryBreakerBytes are cut to it. invalid_input for an empty breaker, more than kMaxDryBreakerStrings,
// or breakers that more than kMaxDryBreakers sequences spell (a single letter matches most of a
// vocabulary).
Result<std::vector<DryBreaker>> dry_breakers_for(const Tokenizer &tok, std::span<const std::string> breakers);

}  // namespace td::server
