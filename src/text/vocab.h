// Vocabulary: the token table of a model and the facts about it that tokenizing and detokenizing need,
// read from GGUF metadata (tokenizer.ggml.*). Knows no algorithm: Tokenizer (tokenizer.h) encodes text,
// Detokenizer (detokenizer.h) turns ids back into text.
//
// Keys read (all under tokenizer.ggml.):
//   model            required: "llama" (SentencePiece) or "gpt2" (byte-level BPE); others are unimplemented
//   pre              optional pre-tokenizer name, stored for the BPE tokenizer
//   tokens           required string array, n_tokens >= 1 entries, no duplicates; an empty text is
//                    renamed "[EMPTY_<id>]" (as llama.cpp); a byte-type token must read "<0xNN>"
//   scores           optional f32 (or integer) array, exactly n_tokens entries; absent = all 0
//   token_type       optional i32 array, exactly n_tokens entries, values 0..6 (TokenType); absent = normal
//   merges           string array, required for "gpt2" (stored for the BPE tokenizer)
//   bos_token_id eos_token_id eot_token_id eom_token_id unknown_token_id seperator_token_id (sic)
//   padding_token_id mask_token_id fim_{pre,suf,mid,pad,rep,sep}_token_id
//                    optional ids; 0xFFFFFFFF (or -1) means "not set"; any other id >= n_tokens is an error
//   add_bos_token add_eos_token add_space_prefix   optional bools
// and general.name (llama.cpp sets token attributes for Phi-3 by name; we do the same).
//
// Defaults follow llama.cpp (llama-vocab.cpp): SentencePiece has bos 1, eos 2, unk 0, adds BOS, adds a space
// prefix; BPE has bos = eos = 11, no BOS, no space prefix. A default id outside the table is dropped (-1).
// End-of-generation tokens (is_eog) are eos, eot, eom, fim pad/rep/sep and tokens whose text is a known
// end marker ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", ...); such
// tokens are treated as control tokens even when the file types them otherwise, as llama.cpp does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace td {

namespace gguf {
class File;
}

// tokenizer.ggml.token_type values (pinned: they are stored in files).
enum class TokenType : int32_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,
    user_defined = 4,
    unused = 5,
    byte = 6,
};

const char *token_type_name(TokenType type);

// Which algorithm the vocabulary was made for.
enum class VocabKind {
    spm,  // tokenizer.ggml.model = "llama": SentencePiece with byte fallback
    bpe,  // tokenizer.ggml.model = "gpt2": byte-level BPE with merges
};

// Per-token attribute bits, derived from the type and then adjusted like llama.cpp does (end-of-generation
// tokens become control, control tokens named "unused" become unused, Phi-3 special tokens strip spaces).
namespace token_attr {
inline constexpr uint32_t undefined = 0;
inline constexpr uint32_t unknown = 1u << 0;
inline constexpr uint32_t unused = 1u << 1;
inline constexpr uint32_t normal = 1u << 2;
inline constexpr uint32_t control = 1u << 3;
inline constexpr uint32_t user_defined = 1u << 4;
inline constexpr uint32_t byte = 1u << 5;
inline constexpr uint32_t lstrip = 1u << 7;  // when matched as a special token: eat whitespace on its left
inline constexpr uint32_t rstrip = 1u << 8;  // ... and on its right
}  // namespace token_attr

struct TokenData {
    std::string text;  // as stored: SentencePiece pieces use U+2581 for a space, byte tokens read "<0xNN>"
    float score = 0.0f;
    TokenType type = TokenType::normal;
    uint32_t attr = token_attr::normal;
};

// Everything a Vocab is built from. Vocab::from_gguf fills one from a file; tests build one by hand.
// Optional fields left empty take the defaults of the model kind.
struct VocabSpec {
    std::string model = "llama";  // tokenizer.ggml.model
    std::string pre;              // tokenizer.ggml.pre
    std::string name;             // general.name
    std::vector<std::string> tokens;
    std::vector<float> scores;   // empty, or one per token
    std::vector<int32_t> types;  // empty, or one per token (TokenType values)
    std::vector<std::string> merges;
    // Special ids as found in the file; nullopt = key absent. -1 and 0xFFFFFFFF mean "not set".
    std::optional<int64_t> bos, eos, eot, eom, unk, sep, pad, mask;
    std::optional<int64_t> fim_pre, fim_suf, fim_mid, fim_pad, fim_rep, fim_sep;
    std::optional<bool> add_bos, add_eos, add_space_prefix;
};

class Vocab {
public:
    // Reads the tokenizer.ggml.* keys of `file`. Errors name the file and the key:
    //   "m.gguf: missing required key 'tokenizer.ggml.tokens'",
    //   "m.gguf: tokenizer.ggml.scores has 10 entries but tokenizer.ggml.tokens has 12",
    //   "m.gguf: tokenizer.ggml.eos_token_id = 700 is out of range (the vocabulary has 512 tokens)".
    // A model other than "llama"/"gpt2" is ErrorKind::unimplemented.
    static Result<Vocab> from_gguf(const gguf::File &file);

    // Validates and builds from parts. `source` prefixes error messages (a file name, or "vocab").
    static Result<Vocab> from_spec(VocabSpec spec, std::string_view source = "vocab");

    VocabKind kind() const { return kind_; }
    const std::string &model_name() const { return model_; }  // tokenizer.ggml.model as read
    const std::string &pre() const { return pre_; }           // tokenizer.ggml.pre ("" when absent)
    const std::vector<std::string> &merges() const { return merges_; }

    int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
    bool is_valid(int32_t id) const { return id >= 0 && id < n_tokens(); }

    // Token accessors: id must be valid (asserted; check ids from outside with is_valid()).
    const TokenData &token(int32_t id) const;
    const std::string &token_text(int32_t id) const { return token(id).text; }
    float token_score(int32_t id) const { return token(id).score; }
    TokenType token_type(int32_t id) const { return token(id).type; }
    uint32_t token_attr(int32_t id) const { return token(id).attr; }
    bool is_control(int32_t id) const { return (token(id).attr & token_attr::control) != 0; }
    bool is_byte(int32_t id) const { return (token(id).attr & token_attr::byte) != 0; }
    bool is_eog(int32_t id) const;  // end of generation: stop when sampled

    // The id whose text is exactly `text`, or -1.
    int32_t find(std::string_view text) const;
    // SentencePiece byte fallback: the id of "<0xNN>" (or of the one-byte token), or -1 when absent.
    int32_t byte_token(uint8_t byte) const { return byte_to_token_[byte]; }
    // The byte a byte token stands for; id must be a byte token (asserted).
    uint8_t token_byte(int32_t id) const;

    // Special ids; -1 when the vocabulary has none.
    int32_t bos() const { return bos_; }
    int32_t eos() const { return eos_; }
    int32_t eot() const { return eot_; }
    int32_t eom() const { return eom_; }
    int32_t unk() const { return unk_; }
    int32_t sep() const { return sep_; }
    int32_t pad() const { return pad_; }
    int32_t mask() const { return mask_; }
    // Fill-in-the-middle: prefix, suffix, middle, and the repository-level pad, repo and file separator.
    int32_t fim_pre() const { return fim_pre_; }
    int32_t fim_suf() const { return fim_suf_; }
    int32_t fim_mid() const { return fim_mid_; }
    int32_t fim_pad() const { return fim_pad_; }
    int32_t fim_rep() const { return fim_rep_; }
    int32_t fim_sep() const { return fim_sep_; }
    const std::vector<int32_t> &eog_ids() const { return eog_ids_; }  // sorted

    bool add_bos() const { return add_bos_; }  // encode(add_special = true) prepends bos()
    bool add_eos() const { return add_eos_; }  // ... and appends eos()
    bool add_space_prefix() const { return add_space_prefix_; }

    // Control, user-defined and unknown tokens, longest text first (ties: lower id first): the order in
    // which encode() looks for them in the text (llama.cpp's cache_special_tokens).
    const std::vector<int32_t> &special_tokens() const { return special_tokens_; }
    size_t max_token_bytes() const { return max_token_bytes_; }

private:
    struct StringHash {
        using is_transparent = void;
        size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
    };

    VocabKind kind_ = VocabKind::spm;
    std::string model_;
    std::string pre_;
    std::vector<std::string> merges_;
    std::vector<TokenData> tokens_;  // [n_tokens]
    std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> text_to_id_;
    int32_t byte_to_token_[256] = {};
    int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1, sep_ = -1, pad_ = -1, mask_ = -1;
    int32_t fim_pre_ = -1, fim_suf_ = -1, fim_mid_ = -1, fim_pad_ = -1, fim_rep_ = -1, fim_sep_ = -1;
    std::vector<int32_t> eog_ids_;
    std::vector<int32_t> special_tokens_;
    bool add_bos_ = false;
    bool add_eos_ = false;
    bool add_space_prefix_ = false;
    size_t max_token_bytes_ = 0;
};

}  // namespace td
