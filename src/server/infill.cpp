#include "server/infill.h"

#include <algorithm>

#include "core/check.h"

namespace td::server {

Status infill_supported(const Vocab &vocab) {
    std::string missing;
    if (vocab.fim_pre() < 0) missing += "prefix token is missing. ";
    if (vocab.fim_suf() < 0) missing += "suffix token is missing. ";
    if (vocab.fim_mid() < 0) missing += "middle token is missing. ";
    if (missing.empty()) return {};
    missing.pop_back();
    return make_error(ErrorKind::unimplemented, "Infill is not supported by this model: {}", missing);
}

std::vector<int32_t> infill_prompt(const Tokenizer &tokenizer, const InfillInput &in,
                                   std::span<const int32_t> prompt, const InfillLimits &limits) {
    const Vocab &vocab = tokenizer.vocab();
    TD_ASSERT(infill_supported(vocab).ok(), "infill_prompt without FIM tokens");
    auto encode = [&](const std::string &text) {
        return tokenizer.encode(text, /*add_special=*/false, /*parse_special=*/false);
    };
    auto append = [](std::vector<int32_t> &to, const std::vector<int32_t> &from) {
        to.insert(to.end(), from.begin(), from.end());
    };

    // The repository-level context (https://arxiv.org/pdf/2409.12186) where the vocabulary has its tokens.
    std::vector<int32_t> extra;
    if (vocab.fim_rep() >= 0) {
        extra.push_back(vocab.fim_rep());
        append(extra, encode("myproject\n"));
    }
    for (const InfillChunk &chunk : in.extra) {
        if (vocab.fim_sep() >= 0) {
            extra.push_back(vocab.fim_sep());
            append(extra, encode(chunk.filename + "\n"));
        } else {
            append(extra, encode("\n\n--- snippet ---\n\n"));
        }
        append(extra, encode(chunk.text));
    }
    if (vocab.fim_sep() >= 0) {
        extra.push_back(vocab.fim_sep());
        append(extra, encode("filename\n"));
    }

    std::vector<int32_t> prefix = encode(in.prefix), suffix = encode(in.suffix);
    const int64_t n_batch = limits.n_batch, n_prompt = static_cast<int64_t>(prompt.size());
    const size_t prefix_take =
        static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(prefix.size()), 3 * (n_batch / 4)));
    const size_t suffix_take = static_cast<size_t>(std::min<int64_t>(
        static_cast<int64_t>(suffix.size()), std::max<int64_t>(0, n_batch / 4 - (2 + n_prompt))));
    const size_t extra_take = static_cast<size_t>(std::min<int64_t>(
        std::max<int64_t>(0, int64_t{limits.n_ctx} - n_batch - 2 * int64_t{limits.n_predict}),
        static_cast<int64_t>(extra.size())));
    prefix.erase(prefix.begin(), prefix.end() - static_cast<std::ptrdiff_t>(prefix_take));  // its end
    suffix.resize(suffix_take);                                                             // its start
    prefix.insert(prefix.begin(), vocab.fim_pre());
    prefix.insert(prefix.end(), prompt.begin(), prompt.end());
    suffix.insert(suffix.begin(), vocab.fim_suf());

    std::vector<int32_t> out(extra.end() - static_cast<std::ptrdiff_t>(extra_take), extra.end());
    if (vocab.add_bos() && vocab.bos() >= 0) out.push_back(vocab.bos());
    append(out, limits.spm ? suffix : prefix);
    append(out, limits.spm ? prefix : suffix);
    out.push_back(vocab.fim_mid());
    return out;
}

}  // namespace td::server
