// Vocabulary loading and validation. The special-token rules mirror llama.cpp's llama_vocab::impl::load so
// that the same file tokenizes to the same ids here and there.
#include "text/vocab.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "core/printable.h"
#include "gguf/gguf.h"
#include "text/pre-tokenizer.h"

namespace td {

const char *token_type_name(TokenType type) {
    switch (type) {
        case TokenType::undefined:
            return "undefined";
        case TokenType::normal:
            return "normal";
        case TokenType::unknown:
            return "unknown";
        case TokenType::control:
            return "control";
        case TokenType::user_defined:
            return "user_defined";
        case TokenType::unused:
            return "unused";
        case TokenType::byte:
            return "byte";
    }
    return "invalid";
}

namespace {

constexpr std::string_view kKeyPrefix = "tokenizer.ggml.";

uint32_t attr_of_type(TokenType type) {
    switch (type) {
        case TokenType::undefined:
            return token_attr::undefined;
        case TokenType::normal:
            return token_attr::normal;
        case TokenType::unknown:
            return token_attr::unknown;
        case TokenType::control:
            return token_attr::control;
        case TokenType::user_defined:
            return token_attr::user_defined;
        case TokenType::unused:
            return token_attr::unused;
        case TokenType::byte:
            return token_attr::byte;
    }
    return token_attr::undefined;
}

// Text markers llama.cpp uses to find tokens the converters did not name by key (llama-vocab.cpp).
constexpr std::array<std::string_view, 11> kEotTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",         "<|endoftext|>",      "<|end_of_text|>",
    "<EOT>",      "_<EOT>",     "[EOT]",   "<｜end▁of▁sentence｜>", "<end_of_utterance>",
};
constexpr std::array<std::string_view, 1> kEomTexts = {"<|eom_id|>"};
constexpr std::array<std::string_view, 8> kFimPreTexts = {
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>",    "<｜fim▁begin｜>",
    "<PRE>",          "▁<PRE>",       "<|code_prefix|>", "<|prefix|>",
};
constexpr std::array<std::string_view, 8> kFimSufTexts = {
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>",    "<｜fim▁hole｜>",
    "<SUF>",          "▁<SUF>",       "<|code_suffix|>", "<|suffix|>",
};
constexpr std::array<std::string_view, 8> kFimMidTexts = {
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>",    "<｜fim▁end｜>",
    "<MID>",          "▁<MID>",       "<|code_middle|>", "<|middle|>",
};
constexpr std::array<std::string_view, 5> kFimPadTexts = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>",
                                                          "[PAD]"};
constexpr std::array<std::string_view, 5> kFimRepTexts = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                                          "<REPO>", "<reponame>"};
constexpr std::array<std::string_view, 1> kFimSepTexts = {"<|file_sep|>"};
constexpr std::array<std::string_view, 22> kEogTexts = {
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
};

// --- reading the GGUF keys into a VocabSpec ---

bool is_integer_type(gguf::ValueType t) {
    return t != gguf::ValueType::boolean && t != gguf::ValueType::string && t != gguf::ValueType::array &&
           t != gguf::ValueType::f32 && t != gguf::ValueType::f64;
}

// "<0xNN>" -> NN.
bool parse_byte_text(std::string_view text, uint8_t *byte) {
    if (text.size() != 6 || !text.starts_with("<0x") || text.back() != '>') return false;
    auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
    };
    int hi = hex(text[3]), lo = hex(text[4]);
    if (hi < 0 || lo < 0) return false;
    *byte = static_cast<uint8_t>(hi * 16 + lo);
    return true;
}

std::string key_of(std::string_view name) {
    return std::string(kKeyPrefix) + std::string(name);
}

Status wrong_type(const gguf::File &file, std::string_view key, const gguf::Value &v, std::string_view want) {
    std::string got = gguf::value_type_name(v.type);
    if (v.type == gguf::ValueType::array)
        got = fmt::format("array of {}", gguf::value_type_name(v.elem_type));
    return invalid_input("{}: key '{}' is {}, expected {}", file.path(), key, got, want);
}

Result<std::optional<int64_t>> read_int(const gguf::File &file, std::string_view key) {
    const gguf::Value *v = file.find(key);
    if (!v) return std::optional<int64_t>();
    if (!v->is_integer() || v->type == gguf::ValueType::boolean)
        return wrong_type(file, key, *v, "an integer");
    return std::optional<int64_t>(v->i);
}

Result<std::optional<bool>> read_bool(const gguf::File &file, std::string_view key) {
    const gguf::Value *v = file.find(key);
    if (!v) return std::optional<bool>();
    if (!v->is_integer()) return wrong_type(file, key, *v, "a bool");
    return std::optional<bool>(v->i != 0);
}

Result<std::optional<std::string>> read_string(const gguf::File &file, std::string_view key) {
    const gguf::Value *v = file.find(key);
    if (!v) return std::optional<std::string>();
    if (v->type != gguf::ValueType::string) return wrong_type(file, key, *v, "a string");
    return std::optional<std::string>(v->str);
}

Result<std::vector<std::string>> read_strings(const gguf::File &file, std::string_view key, bool required) {
    const gguf::Value *v = file.find(key);
    if (!v) {
        if (!required) return std::vector<std::string>();
        return make_error(ErrorKind::not_found, "{}: missing required key '{}'", file.path(), key);
    }
    if (v->type != gguf::ValueType::array || v->elem_type != gguf::ValueType::string) {
        return wrong_type(file, key, *v, "an array of strings");
    }
    return v->strings;
}

}  // namespace

Result<Vocab> Vocab::from_gguf(const gguf::File &file) {
    VocabSpec spec;
    const std::string model_key = key_of("model");
    TD_ASSIGN_OR_RETURN(auto model, read_string(file, model_key));
    if (!model)
        return make_error(ErrorKind::not_found, "{}: missing required key '{}'", file.path(), model_key);
    spec.model = *model;
    TD_ASSIGN_OR_RETURN(auto pre, read_string(file, key_of("pre")));
    spec.pre = pre.value_or("");
    TD_ASSIGN_OR_RETURN(auto name, read_string(file, "general.name"));
    spec.name = name.value_or("");

    TD_ASSIGN_OR_RETURN(spec.tokens, read_strings(file, key_of("tokens"), /*required=*/true));

    const std::string scores_key = key_of("scores");
    if (const gguf::Value *v = file.find(scores_key)) {
        if (v->type != gguf::ValueType::array) return wrong_type(file, scores_key, *v, "an array of f32");
        if (v->elem_type == gguf::ValueType::f32 || v->elem_type == gguf::ValueType::f64) {
            spec.scores.assign(v->floats.begin(), v->floats.end());
        } else if (is_integer_type(v->elem_type)) {
            spec.scores.assign(v->ints.begin(), v->ints.end());  // llama.cpp also accepts i32 scores
        } else {
            return wrong_type(file, scores_key, *v, "an array of f32");
        }
        if (spec.scores.empty() && !spec.tokens.empty()) {
            return invalid_input("{}: {} has 0 entries but {} has {}", file.path(), scores_key,
                                 key_of("tokens"), spec.tokens.size());
        }
    }

    const std::string types_key = key_of("token_type");
    if (const gguf::Value *v = file.find(types_key)) {
        if (v->type != gguf::ValueType::array || !is_integer_type(v->elem_type))
            return wrong_type(file, types_key, *v, "an array of i32");
        spec.types.reserve(v->ints.size());
        for (size_t i = 0; i < v->ints.size(); ++i) {
            int64_t t = v->ints[i];
            if (t < std::numeric_limits<int32_t>::min() || t > std::numeric_limits<int32_t>::max()) {
                return invalid_input("{}: {}[{}] = {} is not a token type (0..6)", file.path(), types_key, i,
                                     t);
            }
            spec.types.push_back(static_cast<int32_t>(t));
        }
        if (spec.types.empty() && !spec.tokens.empty()) {
            return invalid_input("{}: {} has 0 entries but {} has {}", file.path(), types_key,
                                 key_of("tokens"), spec.tokens.size());
        }
    }

    if (spec.model == "gpt2") {
        TD_ASSIGN_OR_RETURN(spec.merges, read_strings(file, key_of("merges"), /*required=*/true));
    }

    struct IdKey {
        const char *name;
        std::optional<int64_t> *dst;
    };
    const IdKey id_keys[] = {
        {"bos_token_id", &spec.bos},         {"eos_token_id", &spec.eos},
        {"eot_token_id", &spec.eot},         {"eom_token_id", &spec.eom},
        {"unknown_token_id", &spec.unk},     {"seperator_token_id", &spec.sep},
        {"padding_token_id", &spec.pad},     {"mask_token_id", &spec.mask},
        {"fim_pre_token_id", &spec.fim_pre}, {"fim_suf_token_id", &spec.fim_suf},
        {"fim_mid_token_id", &spec.fim_mid}, {"fim_pad_token_id", &spec.fim_pad},
        {"fim_rep_token_id", &spec.fim_rep}, {"fim_sep_token_id", &spec.fim_sep},
    };
    for (const IdKey &k : id_keys) {
        TD_ASSIGN_OR_RETURN(*k.dst, read_int(file, key_of(k.name)));
    }
    // Deprecated spellings of the FIM ids, read when the new ones are absent (as llama.cpp does).
    const IdKey old_fim_keys[] = {{"prefix_token_id", &spec.fim_pre},
                                  {"suffix_token_id", &spec.fim_suf},
                                  {"middle_token_id", &spec.fim_mid}};
    for (const IdKey &k : old_fim_keys) {
        if (k.dst->has_value()) continue;
        TD_ASSIGN_OR_RETURN(*k.dst, read_int(file, key_of(k.name)));
    }

    TD_ASSIGN_OR_RETURN(spec.add_bos, read_bool(file, key_of("add_bos_token")));
    TD_ASSIGN_OR_RETURN(spec.add_eos, read_bool(file, key_of("add_eos_token")));
    TD_ASSIGN_OR_RETURN(spec.add_space_prefix, read_bool(file, key_of("add_space_prefix")));

    return from_spec(std::move(spec), file.path());
}

Result<Vocab> Vocab::from_spec(VocabSpec spec, std::string_view source) {
    Vocab vocab;
    if (spec.model == "llama") {
        vocab.kind_ = VocabKind::spm;
    } else if (spec.model == "gpt2") {
        vocab.kind_ = VocabKind::bpe;
    } else {
        return make_error(ErrorKind::unimplemented,
                          "{}: tokenizer model '{}' is not supported (tandem reads 'llama' (SentencePiece) "
                          "and 'gpt2' (BPE) vocabularies)",
                          source, printable(spec.model));
    }
    vocab.model_ = spec.model;
    vocab.pre_ = std::move(spec.pre);
    vocab.merges_ = std::move(spec.merges);

    const std::string tokens_key = key_of("tokens");
    const size_t n = spec.tokens.size();
    if (n == 0) return invalid_input("{}: {} is empty", source, tokens_key);
    if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
        return invalid_input("{}: {} has {} entries, more than token ids can hold", source, tokens_key, n);
    }
    if (!spec.scores.empty() && spec.scores.size() != n) {
        return invalid_input("{}: {} has {} entries but {} has {}", source, key_of("scores"),
                             spec.scores.size(), tokens_key, n);
    }
    if (!spec.types.empty() && spec.types.size() != n) {
        return invalid_input("{}: {} has {} entries but {} has {}", source, key_of("token_type"),
                             spec.types.size(), tokens_key, n);
    }

    vocab.tokens_.resize(n);
    vocab.text_to_id_.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        TokenData &t = vocab.tokens_[i];
        t.text = std::move(spec.tokens[i]);
        // llama.cpp renames empty tokens so that each text stays unique and searchable.
        if (t.text.empty()) t.text = fmt::format("[EMPTY_{}]", i);
        t.score = spec.scores.empty() ? 0.0f : spec.scores[i];
        if (!spec.types.empty()) {
            int32_t type = spec.types[i];
            if (type < 0 || type > static_cast<int32_t>(TokenType::byte)) {
                return invalid_input("{}: {}[{}] = {} is not a token type (0..6)", source,
                                     key_of("token_type"), i, type);
            }
            t.type = static_cast<TokenType>(type);
        }
        uint8_t byte = 0;
        if (t.type == TokenType::byte && !parse_byte_text(t.text, &byte)) {
            return invalid_input("{}: {}[{}] = '{}' has type byte but is not of the form <0xNN>", source,
                                 tokens_key, i, printable(t.text));
        }
        t.attr = attr_of_type(t.type);
        auto [it, inserted] = vocab.text_to_id_.emplace(t.text, static_cast<int32_t>(i));
        if (!inserted) {
            return invalid_input("{}: {} holds '{}' twice (ids {} and {})", source, tokens_key,
                                 printable(t.text), it->second, i);
        }
        vocab.max_token_bytes_ = std::max(vocab.max_token_bytes_, t.text.size());
    }
    const auto n_tok = static_cast<int64_t>(n);

    // Defaults of the model kind, dropped when outside the table.
    int32_t bos = -1, eos = -1, unk = -1;
    if (vocab.kind_ == VocabKind::spm) {
        bos = 1, eos = 2, unk = 0;
        vocab.add_bos_ = true;
        vocab.add_eos_ = false;
        vocab.add_space_prefix_ = true;
    } else {
        // llama.cpp: some pre-tokenizers (llama3 family) add BOS by default, glm4 has no default BOS.
        const BpePreDefaults pre = bpe_pre_defaults(vocab.pre_);
        bos = pre.no_bos ? -1 : 11, eos = 11;
        vocab.add_bos_ = pre.add_bos;
        vocab.add_eos_ = false;
        vocab.add_space_prefix_ = false;
    }
    auto default_id = [&](int32_t id) { return id < n_tok ? id : -1; };
    vocab.bos_ = default_id(bos);
    vocab.eos_ = default_id(eos);
    vocab.unk_ = default_id(unk);

    // Ids from the file: "not set" keeps the default; anything else must name a token.
    struct IdField {
        const char *key;
        const std::optional<int64_t> &value;
        int32_t &dst;
    };
    const IdField id_fields[] = {
        {"bos_token_id", spec.bos, vocab.bos_},
        {"eos_token_id", spec.eos, vocab.eos_},
        {"eot_token_id", spec.eot, vocab.eot_},
        {"eom_token_id", spec.eom, vocab.eom_},
        {"unknown_token_id", spec.unk, vocab.unk_},
        {"seperator_token_id", spec.sep, vocab.sep_},
        {"padding_token_id", spec.pad, vocab.pad_},
        {"mask_token_id", spec.mask, vocab.mask_},
        {"fim_pre_token_id", spec.fim_pre, vocab.fim_pre_},
        {"fim_suf_token_id", spec.fim_suf, vocab.fim_suf_},
        {"fim_mid_token_id", spec.fim_mid, vocab.fim_mid_},
        {"fim_pad_token_id", spec.fim_pad, vocab.fim_pad_},
        {"fim_rep_token_id", spec.fim_rep, vocab.fim_rep_},
        {"fim_sep_token_id", spec.fim_sep, vocab.fim_sep_},
    };
    for (const IdField &f : id_fields) {
        if (!f.value) continue;
        int64_t id = *f.value;
        if (id == -1 || id == 0xFFFFFFFFll) continue;  // written as u32(-1) by converters: not set
        if (id < 0 || id >= n_tok) {
            return invalid_input("{}: {} = {} is out of range (the vocabulary has {} tokens)", source,
                                 key_of(f.key), id, n);
        }
        f.dst = static_cast<int32_t>(id);
    }

    if (spec.add_bos) vocab.add_bos_ = *spec.add_bos;
    if (spec.add_eos) vocab.add_eos_ = *spec.add_eos;
    if (spec.add_space_prefix) vocab.add_space_prefix_ = *spec.add_space_prefix;
    if (vocab.add_bos_ && vocab.bos_ < 0) {
        return invalid_input("{}: {} is true but the vocabulary has no BOS token ({})", source,
                             key_of("add_bos_token"), key_of("bos_token_id"));
    }
    if (vocab.add_eos_ && vocab.eos_ < 0) {
        return invalid_input("{}: {} is true but the vocabulary has no EOS token ({})", source,
                             key_of("add_eos_token"), key_of("eos_token_id"));
    }

    // Byte fallback table: "<0xNN>" (upper-case hex, as SentencePiece writes it), else the one-byte token.
    for (int b = 0; b < 256; ++b) {
        int32_t id = vocab.find(fmt::format("<0x{:02X}>", b));
        if (id < 0) id = vocab.find(std::string(1, static_cast<char>(b)));
        vocab.byte_to_token_[b] = id;
    }

    // Tokens named by text only. llama.cpp takes whichever match its hash map yields first; we take the
    // first text of the list that the vocabulary has (Phi-3 has both <|end|> and <|endoftext|>: eot is
    // <|end|>), so that the choice is reproducible.
    auto mark_control = [&](int32_t id) { vocab.tokens_[id].attr |= token_attr::control; };
    auto detect = [&](int32_t &id, auto texts) {
        if (id >= 0) return;
        for (std::string_view text : texts) {
            id = vocab.find(text);
            if (id >= 0) break;
        }
        if (id >= 0) mark_control(id);
    };
    detect(vocab.eot_, kEotTexts);
    detect(vocab.eom_, kEomTexts);
    detect(vocab.fim_pre_, kFimPreTexts);
    detect(vocab.fim_suf_, kFimSufTexts);
    detect(vocab.fim_mid_, kFimMidTexts);
    detect(vocab.fim_pad_, kFimPadTexts);
    detect(vocab.fim_rep_, kFimRepTexts);
    detect(vocab.fim_sep_, kFimSepTexts);

    // Control tokens named "unused" are unused.
    for (TokenData &t : vocab.tokens_) {
        if ((t.attr & token_attr::control) && t.text.find("unused") != std::string::npos) {
            t.attr |= token_attr::unused;
        }
    }

    // End of generation.
    std::vector<int32_t> eog = {vocab.fim_pad_, vocab.fim_rep_, vocab.fim_sep_,
                                vocab.eos_,     vocab.eot_,     vocab.eom_};
    for (std::string_view text : kEogTexts) {
        int32_t id = vocab.find(text);
        if (id < 0) continue;
        eog.push_back(id);
        mark_control(id);
    }
    std::erase(eog, -1);
    std::sort(eog.begin(), eog.end());
    eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
    vocab.eog_ids_ = std::move(eog);

    // Tokens that encode() matches in the text before running the algorithm, longest first.
    constexpr uint32_t special_mask = token_attr::control | token_attr::user_defined | token_attr::unknown;
    for (int32_t id = 0; id < static_cast<int32_t>(n); ++id) {
        if (vocab.tokens_[id].attr & special_mask) vocab.special_tokens_.push_back(id);
    }
    std::stable_sort(vocab.special_tokens_.begin(), vocab.special_tokens_.end(), [&](int32_t a, int32_t b) {
        return vocab.tokens_[a].text.size() > vocab.tokens_[b].text.size();
    });

    // llama.cpp: for Phi-3 (found by general.name) special tokens swallow the whitespace after them,
    // except <unk>, <s> and <|endoftext|>; </s> does too.
    std::string name = spec.name;
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (int32_t id : vocab.special_tokens_) vocab.tokens_[id].attr |= token_attr::rstrip;
        if (int32_t id = vocab.find("</s>"); id >= 0) vocab.tokens_[id].attr |= token_attr::rstrip;
        for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
            if (int32_t id = vocab.find(text); id >= 0) vocab.tokens_[id].attr &= ~token_attr::rstrip;
        }
    }
    return vocab;
}

const TokenData &Vocab::token(int32_t id) const {
    TD_ASSERT(is_valid(id), "token id {} outside the vocabulary of {}", id, n_tokens());
    return tokens_[id];
}

bool Vocab::is_eog(int32_t id) const {
    return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id);
}

int32_t Vocab::find(std::string_view text) const {
    auto it = text_to_id_.find(text);
    return it == text_to_id_.end() ? -1 : it->second;
}

uint8_t Vocab::token_byte(int32_t id) const {
    const TokenData &t = token(id);
    uint8_t byte = 0;
    TD_ASSERT((t.attr & token_attr::byte) && parse_byte_text(t.text, &byte), "token {} is not a byte token",
              id);
    return byte;
}

}  // namespace td
