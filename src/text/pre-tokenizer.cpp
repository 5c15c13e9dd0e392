// Pre-tokenizer stages. The hand-written splitters follow llama.cpp's unicode_regex_split_custom_gpt2 /
// _llama3 decisions step by step (including where they differ from the regex they stand for), because the
// goal is the same words, not a better regex engine. The `match` stages emulate ECMAScript std::regex
// leftmost-first search for the few regex shapes the other pre-tokenizers use.
#include "text/pre-tokenizer.h"

#include <array>

#include "core/check.h"
#include "core/log.h"
#include "text/unicode.h"

namespace td {

namespace {

using Stage = PreTokenizer::Stage;
using CharClass = PreTokenizer::CharClass;
using unicode::Category;

// --- character classes ---

void add_ascii(CharClass &c, uint32_t first, uint32_t last) {
    for (uint32_t x = first; x <= last; ++x) c.ascii[x >> 6] |= uint64_t{1} << (x & 63);
}

void add_ascii(CharClass &c, std::string_view chars) {
    for (char x : chars) add_ascii(c, static_cast<uint8_t>(x), static_cast<uint8_t>(x));
}

void add_category(CharClass &c, Category cat) {
    c.categories |= static_cast<uint8_t>(1u << static_cast<unsigned>(cat));
}

// "A-Za-zµÀ-Ö...": single code points and first-last ranges, as written inside a regex [...] (UTF-8).
void add_ranges(CharClass &c, std::string_view spec) {
    std::vector<uint32_t> cpts;
    unicode::decode_utf8(spec, cpts);
    for (size_t i = 0; i < cpts.size();) {
        uint32_t first = cpts[i], last = first;
        if (i + 2 < cpts.size() && cpts[i + 1] == '-') {
            last = cpts[i + 2];
            i += 3;
        } else {
            i += 1;
        }
        TD_ASSERT(first <= last, "bad range U+{:04X}-U+{:04X}", first, last);
        if (first < 0x80) add_ascii(c, first, std::min<uint32_t>(last, 0x7F));
        if (last >= 0x80) c.ranges.emplace_back(std::max<uint32_t>(first, 0x80), last);
    }
}

// \s of std::regex in the "C" locale: \t \n \v \f \r and space (non-ASCII white space arrives as \v).
CharClass regex_space() {
    CharClass c;
    add_ascii(c, '\t', '\r');
    add_ascii(c, ' ', ' ');
    return c;
}

// \p{N} in a collapsed regex: 0-9 or any non-ASCII number.
CharClass collapsed_number() {
    CharClass c;
    add_ascii(c, '0', '9');
    add_category(c, Category::number);
    return c;
}

// \p{P} in a collapsed regex: llama.cpp's fixed ASCII set (which lacks '~' and the symbols $+<=>^`|) or any
// non-ASCII punctuation.
CharClass collapsed_punctuation() {
    CharClass c;
    add_ascii(c, "!\"#%&'()*,-./:;?@[\\]_{}");
    add_category(c, Category::punctuation);
    return c;
}

CharClass collapsed_letter() {
    CharClass c;
    add_ascii(c, 'A', 'Z');
    add_ascii(c, 'a', 'z');
    add_category(c, Category::letter);
    return c;
}

CharClass literal(std::string_view spec) {
    CharClass c;
    add_ranges(c, spec);
    return c;
}

// --- stages ---

Stage custom(Stage::Kind kind, size_t max_digits = 3) {
    Stage s;
    s.kind = kind;
    s.max_digits = max_digits;
    return s;
}

Stage match(CharClass body, size_t min = 1, size_t max = SIZE_MAX) {
    Stage s;
    s.body = std::move(body);
    s.min = min;
    s.max = max;
    return s;
}

Stage match_prefixed(CharClass prefix, CharClass body) {
    Stage s = match(std::move(body));
    s.has_prefix = true;
    s.prefix = std::move(prefix);
    return s;
}

Stage trailing_space() {
    Stage s;
    s.kind = Stage::Kind::trailing_space;
    return s;
}

enum class Rules {
    default_,
    gpt2,
    llama3,
    qwen2,
    deepseek_llm,
    deepseek_coder,
    falcon,
    starcoder,
    bloom,
    viking
};

std::vector<Stage> stages_of(Rules rules) {
    // [\p{P}\$\+<=>\^~\|]+ (collapsed); falcon's also has '`'
    auto punct_run = [](std::string_view extra) {
        CharClass c = collapsed_punctuation();
        add_ascii(c, "$+<=>^~|");
        add_ascii(c, extra);
        return match(std::move(c));
    };
    auto bloom_word = [] {
        // " ?[^(\s|.,!?…。，、।۔،)]+" (wide regex: no categories)
        CharClass body = literal("(|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)");
        add_ascii(body, '\t', '\r');
        add_ascii(body, ' ', ' ');
        body.negate = true;
        return match_prefixed(literal(" "), std::move(body));
    };
    // [一-龥ࠀ-一가-퟿] (escaped: the text must not go through Unicode normalization)
    const CharClass cjk_hangul = literal("\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF");
    switch (rules) {
        case Rules::default_:
            return {punct_run(""), custom(Stage::Kind::gpt2), match(collapsed_number()),
                    match(literal("0-9"), 3, 3)};
        case Rules::gpt2:
            return {custom(Stage::Kind::gpt2)};
        case Rules::llama3:
            return {custom(Stage::Kind::llama3, 3)};
        case Rules::qwen2:
            return {custom(Stage::Kind::llama3, 1)};
        case Rules::deepseek_llm:
            return {
                match(literal("\r\n"), 1, 1),
                match_prefixed(
                    regex_space(),
                    literal(
                        "A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295-"
                        "\u02AF"
                        "\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-\u03A1"
                        "\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5"
                        "\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A"
                        "\u1E00-\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D"
                        "\u1F5F-\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3"
                        "\u1FD6-\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115"
                        "\u2119-\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F"
                        "\u2145-\u2149\u214E\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3"
                        "\uA640-\uA66D\uA680-\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF"
                        "\uFB00-\uFB06\uFB13-\uFB17\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F"
                        "\U000104B0-\U000104D3\U000104D8-\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2"
                        "\U000118A0-\U000118DF\U0001E900-\U0001E943")),
                match_prefixed(regex_space(),
                               literal("!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002")),
                trailing_space(),
                match(cjk_hangul),
                match(collapsed_number()),
            };
        case Rules::deepseek_coder:
            return {
                match(literal("\r\n"), 1, 1),
                match_prefixed(regex_space(), collapsed_letter()),
                match_prefixed(regex_space(), collapsed_punctuation()),
                match(cjk_hangul),
                match(collapsed_number(), 1, 1),
            };
        case Rules::falcon:
            return {punct_run("`"), custom(Stage::Kind::gpt2), match(literal("0-9"), 3, 3)};
        case Rules::starcoder:
            return {match(collapsed_number(), 1, 1), custom(Stage::Kind::gpt2)};
        case Rules::bloom:
            return {bloom_word()};
        case Rules::viking:
            return {bloom_word(), match(collapsed_number(), 1, 1)};
    }
    TD_ASSERT(false, "unhandled rules");
    return {};
}

struct PreEntry {
    std::string_view name;
    Rules rules;
    bool add_bos = false;
    bool no_bos = false;
    bool ignore_merges = false;
    bool clean_spaces = true;
};

// llama.cpp's llama_vocab::impl::load: name -> pre-tokenizer type and the flags it sets.
constexpr PreEntry kPreEntries[] = {
    {"default", Rules::default_},
    {"llama3", Rules::llama3, true, false, true},
    {"llama-v3", Rules::llama3, true, false, true},
    {"llama-bpe", Rules::llama3, true, false, true},
    {"falcon3", Rules::llama3, true, false, true},
    {"falcon-h1", Rules::llama3, true, false, true},
    {"pixtral", Rules::llama3, true, false, true},
    {"midm-2.0", Rules::llama3, true, false, true},
    {"lfm2", Rules::llama3, true, false, true},
    {"jina-v5-nano", Rules::llama3, true, false, true},
    {"dbrx", Rules::llama3},
    {"smaug-bpe", Rules::llama3},
    {"glm4", Rules::llama3, false, true},
    {"chatglm-bpe", Rules::llama3, false, true},
    {"deepseek-llm", Rules::deepseek_llm, false, false, false, false},
    {"deepseek-coder", Rules::deepseek_coder, false, false, false, false},
    {"falcon", Rules::falcon},
    {"mpt", Rules::gpt2},
    {"starcoder", Rules::starcoder},
    {"gpt-2", Rules::gpt2},
    {"phi-2", Rules::gpt2},
    {"jina-es", Rules::gpt2},
    {"jina-de", Rules::gpt2},
    {"gigachat", Rules::gpt2},
    {"jina-v2-es", Rules::gpt2},
    {"jina-v2-de", Rules::gpt2},
    {"a.x-4.0", Rules::gpt2},
    {"mellum", Rules::gpt2},
    {"modern-bert", Rules::gpt2},
    {"exaone4", Rules::gpt2},
    {"olmo", Rules::gpt2},
    {"jais", Rules::gpt2},
    {"trillion", Rules::gpt2, false, false, false, false},
    {"granite-docling", Rules::gpt2, false, false, false, false},
    {"refact", Rules::starcoder},
    {"command-r", Rules::starcoder, false, false, false, false},
    {"smollm", Rules::starcoder, false, false, false, false},
    {"codeshell", Rules::starcoder},
    {"exaone", Rules::starcoder},
    {"minerva-7b", Rules::starcoder},
    {"mellum2", Rules::starcoder},
    {"qwen2", Rules::qwen2, false, false, false, false},
    {"deepseek-r1-qwen", Rules::qwen2, false, false, false, false},
    {"kormo", Rules::qwen2, false, false, false, false},
    {"f2llmv2", Rules::qwen2, false, false, false, false},
    {"megrez", Rules::qwen2},
    {"stablelm2", Rules::qwen2},
    {"hunyuan", Rules::qwen2, false, false, false, false},
    {"solar-open", Rules::qwen2, false, false, false, false},
    {"grok-2", Rules::qwen2, false, false, false, false},
    {"bloom", Rules::bloom},
    {"gpt3-finnish", Rules::bloom},
    {"poro-chat", Rules::bloom, false, false, false, false},
    {"viking", Rules::viking, false, false, false, false},
};

const PreEntry *find_entry(std::string_view pre) {
    if (pre.empty()) pre = "default";
    for (const PreEntry &e : kPreEntries) {
        if (e.name == pre) return &e;
    }
    return nullptr;
}

// --- splitting ---

bool is_newline(uint32_t c) {
    return c == '\r' || c == '\n';
}

uint32_t ascii_lower(uint32_t c) {
    return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

// Collects the words of one piece [begin, end) of the code points.
class Cutter {
public:
    Cutter(std::vector<size_t> &out, size_t begin) : out_(out), last_(begin) {}
    // Ends a word at `end` (nothing when empty); returns its length.
    size_t cut(size_t end) {
        TD_ASSERT(end >= last_);
        size_t n = end - last_;
        if (n > 0) out_.push_back(n);
        last_ = end;
        return n;
    }

private:
    std::vector<size_t> &out_;
    size_t last_;
};

enum class Kind { letter, number, space, other };

struct View {
    std::span<const uint32_t> cpts;
    size_t end;
    bool in(size_t i) const { return i < end; }
    uint32_t at(size_t i) const { return cpts[i]; }
    Kind kind(size_t i) const {
        uint32_t c = cpts[i];
        if (unicode::is_whitespace(c)) return Kind::space;
        switch (unicode::category(c)) {
            case Category::letter:
                return Kind::letter;
            case Category::number:
                return Kind::number;
            default:
                return Kind::other;
        }
    }
    bool is(size_t i, Kind k) const { return in(i) && kind(i) == k; }
    // Length of 's 't 're 've 'm 'll 'd at i, or 0.
    size_t contraction(size_t i, bool fold_case) const {
        if (at(i) != '\'' || !in(i + 1)) return 0;
        auto low = [&](size_t j) { return fold_case ? ascii_lower(at(j)) : at(j); };
        uint32_t a = low(i + 1);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (!in(i + 2)) return 0;
        uint32_t b = low(i + 2);
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        return 0;
    }
    // Number of white-space code points from i.
    size_t spaces(size_t i) const {
        size_t n = 0;
        while (is(i + n, Kind::space)) ++n;
        return n;
    }
};

void split_gpt2(const View &v, size_t begin, std::vector<size_t> &out) {
    Cutter cut(out, begin);
    for (size_t pos = begin; pos < v.end;) {
        if (size_t n = v.contraction(pos, /*fold_case=*/false)) {
            pos += cut.cut(pos + n);
            continue;
        }
        // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': the run kind is that of the code point after the
        // space.
        const size_t q = v.at(pos) == ' ' ? pos + 1 : pos;
        if (v.in(q) && v.kind(q) != Kind::space) {
            const Kind k = v.kind(q);
            size_t e = q;
            while (v.is(e, k)) ++e;
            pos = e;
            cut.cut(pos);
            continue;
        }
        const size_t n = v.spaces(pos);
        if (n > 1 && v.in(pos + n)) {
            pos += n - 1;  // \s+(?!\S): leave the last space to the word that follows
        } else if (n > 0) {
            pos += n;
        } else {
            pos += 1;
        }
        cut.cut(pos);
    }
}

void split_llama3(const View &v, size_t begin, size_t max_digits, std::vector<size_t> &out) {
    Cutter cut(out, begin);
    for (size_t pos = begin; pos < v.end;) {
        const uint32_t c = v.at(pos);
        const Kind k = v.kind(pos);
        if (size_t n = v.contraction(pos, /*fold_case=*/true)) {
            pos += cut.cut(pos + n);
            continue;
        }
        // [^\r\n\p{L}\p{N}]?\p{L}+
        if (!is_newline(c) && k != Kind::number && (k == Kind::letter || v.is(pos + 1, Kind::letter))) {
            ++pos;
            while (v.is(pos, Kind::letter)) ++pos;
            cut.cut(pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if (k == Kind::number) {
            size_t group = pos;
            while (v.is(pos, Kind::number)) {
                if (++pos - group >= max_digits) {
                    cut.cut(pos);
                    group = pos;
                }
            }
            cut.cut(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'. As in llama.cpp, a space that ends the piece is taken here too.
        const size_t q = c == ' ' ? pos + 1 : pos;
        if (!v.in(q) || v.kind(q) == Kind::other) {
            pos = q;
            while (v.is(pos, Kind::other)) ++pos;
            while (v.in(pos) && is_newline(v.at(pos))) ++pos;
            cut.cut(pos);
            continue;
        }
        // \s*[\r\n]+ | \s+(?!\S) | \s+
        size_t n = 0, after_newline = 0;
        while (v.is(pos + n, Kind::space)) {
            if (is_newline(v.at(pos + n))) after_newline = pos + n + 1;
            ++n;
        }
        if (after_newline > 0) {
            pos = after_newline;
        } else if (n > 1 && v.in(pos + n)) {
            pos += n - 1;
        } else if (n > 0) {
            pos += n;
        } else {
            pos += 1;
        }
        cut.cut(pos);
    }
}

// Leftmost-first matching of prefix? body{min,max} at each position, matches and the text between them
// becoming words (llama.cpp's unicode_regex_split_stl).
void split_match(const Stage &s, std::span<const uint32_t> cpts, size_t begin, size_t end,
                 std::vector<size_t> &out) {
    auto run = [&](size_t i) {
        size_t n = 0;
        while (i + n < end && n < s.max && s.body.contains(cpts[i + n])) ++n;
        return n;
    };
    auto match_at = [&](size_t i) -> size_t {
        if (s.has_prefix && s.prefix.contains(cpts[i])) {
            size_t n = run(i + 1);
            if (n >= s.min) return n + 1;
        }
        size_t n = run(i);
        return n >= s.min ? n : 0;
    };
    Cutter cut(out, begin);
    for (size_t pos = begin; pos < end;) {
        size_t n = match_at(pos);
        if (n == 0) {
            ++pos;
            continue;
        }
        cut.cut(pos);
        pos += n;
        cut.cut(pos);
    }
    cut.cut(end);
}

// \s+$ : the white space that ends the piece.
void split_trailing_space(std::span<const uint32_t> cpts, size_t begin, size_t end,
                          std::vector<size_t> &out) {
    const CharClass space = regex_space();
    size_t t = end;
    while (t > begin && space.contains(cpts[t - 1])) --t;
    Cutter cut(out, begin);
    cut.cut(t);
    cut.cut(end);
}

}  // namespace

bool PreTokenizer::CharClass::contains(uint32_t cpt) const {
    bool in = false;
    if (cpt >= 0x80 && unicode::is_whitespace(cpt)) cpt = '\v';  // as llama.cpp rewrites the text
    if (cpt < 0x80) {
        in = (ascii[cpt >> 6] >> (cpt & 63)) & 1;
    } else {
        in = (categories >> static_cast<unsigned>(unicode::category(cpt))) & 1;
        for (size_t i = 0; !in && i < ranges.size(); ++i)
            in = ranges[i].first <= cpt && cpt <= ranges[i].second;
    }
    return in != negate;
}

BpePreDefaults bpe_pre_defaults(std::string_view pre) {
    BpePreDefaults d;
    if (const PreEntry *e = find_entry(pre)) {
        d.known = true;
        d.add_bos = e->add_bos;
        d.no_bos = e->no_bos;
        d.ignore_merges = e->ignore_merges;
        d.clean_spaces = e->clean_spaces;
    }
    return d;
}

Result<PreTokenizer> PreTokenizer::create(std::string_view pre) {
    const PreEntry *e = find_entry(pre);
    if (!e) {
        return make_error(
            ErrorKind::unimplemented,
            "BPE pre-tokenizer '{}' (tokenizer.ggml.pre) is not implemented; known: gpt-2, llama-bpe, "
            "qwen2, deepseek-llm, deepseek-coder, falcon, starcoder, refact, mpt, default and others",
            pre);
    }
    if (pre.empty()) {
        log_warn(
            "vocabulary has no tokenizer.ggml.pre: using the default BPE pre-tokenizer (as llama.cpp); "
            "tokens may differ from the model's training");
    }
    PreTokenizer p;
    p.stages_ = stages_of(e->rules);
    return p;
}

void PreTokenizer::split(std::span<const uint32_t> cpts, std::vector<size_t> &lengths) const {
    std::vector<size_t> pieces = {cpts.size()}, next;
    if (cpts.empty()) return;
    for (const Stage &s : stages_) {
        next.clear();
        size_t begin = 0;
        for (size_t len : pieces) {
            const size_t end = begin + len;
            const View v{cpts, end};
            switch (s.kind) {
                case Stage::Kind::gpt2:
                    split_gpt2(v, begin, next);
                    break;
                case Stage::Kind::llama3:
                    split_llama3(v, begin, s.max_digits, next);
                    break;
                case Stage::Kind::match:
                    split_match(s, cpts, begin, end, next);
                    break;
                case Stage::Kind::trailing_space:
                    split_trailing_space(cpts, begin, end, next);
                    break;
            }
            begin = end;
        }
        pieces.swap(next);
    }
    lengths.insert(lengths.end(), pieces.begin(), pieces.end());
}

}  // namespace td
