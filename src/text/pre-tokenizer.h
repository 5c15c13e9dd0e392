// Pre-tokenizers of byte-level BPE vocabularies: the rules that cut text into words before merging, chosen by
// tokenizer.ggml.pre, reproducing llama.cpp (llama-vocab.cpp's list of regexes per pre-tokenizer type and
// unicode.cpp's unicode_regex_split) split for split.
//
// llama.cpp runs a list of regexes one after the other; each cuts every piece of the previous stage into its
// matches and the text between them. The GPT-2 and llama3/qwen2 regexes run as hand-written splitters driven
// by Unicode categories; the others through std::regex on a copy of the text where every non-ASCII code point
// is replaced by one byte standing for its category (so \p{L} there means A-Za-z or "some non-ASCII letter",
// and \p{P} has a fixed ASCII set). We implement each regex the same way: hand-written splitters for the
// first kind, and a small matcher for the shapes the second kind uses (C, C+, C{3}, \s?C+, \s+$ over a
// character class C), with classes that see code points exactly as llama.cpp's std::regex would.
//
// Names implemented (others are ErrorKind::unimplemented, as llama.cpp fails on names it does not know):
//   "" / "default"  (gpt-neox and other old conversions)   "gpt-2" "mpt" "phi-2" "olmo" "jais" ... (GPT-2)
//   "llama3" "llama-bpe" "llama-v3" "dbrx" "smaug-bpe" "glm4" ...   "qwen2" "stablelm2" "grok-2" ...
//   "deepseek-llm" "deepseek-coder" "falcon" "starcoder" "refact" "command-r" "smollm" ...
//   "bloom" "poro-chat" "gpt3-finnish" "viking"
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace td {

// What llama.cpp's vocabulary loader derives from the pre-tokenizer name besides the split rules.
struct BpePreDefaults {
    bool known = false;          // the name is one PreTokenizer::create accepts
    bool add_bos = false;        // BOS is added unless the file says otherwise (llama3 family)
    bool no_bos = false;         // there is no default BOS id (glm4)
    bool ignore_merges = false;  // a word that is itself a token is emitted whole, merges skipped (llama3)
    bool clean_spaces = true;    // llama.cpp's llama_detokenize removes " ." style spaces (not applied here)
};

BpePreDefaults bpe_pre_defaults(std::string_view pre);

class PreTokenizer {
public:
    // The rules for tokenizer.ggml.pre = `pre`; "" means llama.cpp's default rules.
    // ErrorKind::unimplemented for a name not implemented here.
    static Result<PreTokenizer> create(std::string_view pre);

    // Cuts `cpts` (code points, as unicode::decode_utf8 gives them) into words: appends the length in code
    // points of each word, in order, to `lengths`; the lengths are > 0 and add up to cpts.size().
    void split(std::span<const uint32_t> cpts, std::vector<size_t> &lengths) const;

    // A character class as llama.cpp's std::regex sees it. Non-ASCII white space is replaced by \v before
    // matching (llama.cpp does that so that \s matches it); for other non-ASCII code points the class holds
    // either whole categories (a \p{..} in a collapsed regex) or explicit ranges (a plain wide regex).
    struct CharClass {
        uint64_t ascii[2] = {0, 0};                         // bit c: ASCII code point c is in the class
        uint8_t categories = 0;                             // bit k: non-ASCII code points of Category k
        std::vector<std::pair<uint32_t, uint32_t>> ranges;  // non-ASCII [first, last] ranges
        bool negate = false;                                // [^...]

        bool contains(uint32_t cpt) const;
    };

    // One stage of the pipeline.
    struct Stage {
        enum class Kind {
            gpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
            llama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|
                     //   \s*[\r\n]+|\s+(?!\S)|\s+
            match,   // prefix? body{min,max}
            trailing_space,  // \s+$
        };
        Kind kind = Kind::match;
        size_t max_digits = 3;  // llama3: 3; qwen2: 1
        bool has_prefix = false;
        CharClass prefix;  // one optional code point in front of the body
        CharClass body;
        size_t min = 1, max = SIZE_MAX;
    };

private:
    std::vector<Stage> stages_;
};

}  // namespace td
