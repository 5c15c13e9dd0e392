// Every tokenizer (the vocabularies in ../shared/vocab, SentencePiece and each BPE pre-tokenizer) on any
// bytes: encode with and without special-token parsing, then detokenize what came out. The first byte picks
// the vocabulary and the flags.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fuzz-util.h"
#include "gguf/gguf.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

using namespace td;

namespace {

std::vector<std::unique_ptr<Tokenizer>> &tokenizers() {
    static std::vector<std::unique_ptr<Tokenizer>> all;
    return all;
}

}  // namespace

TD_FUZZ_INIT(tokenizer) {
    const char *env = std::getenv("TANDEM_SHARED_DIR");
    const std::filesystem::path dir = std::filesystem::path(env != nullptr ? env : TD_SHARED_DIR) / "vocab";
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto &e : std::filesystem::directory_iterator(dir, ec))
        if (e.path().extension() == ".gguf") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (const std::string &f : files) {
        auto file = gguf::File::open(f);
        if (!file.ok()) continue;
        auto vocab = Vocab::from_gguf(*file);
        if (!vocab.ok()) continue;
        auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(vocab).value()));
        if (tok.ok()) tokenizers().push_back(std::move(tok).value());
    }
    if (tokenizers().empty()) {
        std::fprintf(stderr, "fuzz-tokenizer: no vocabularies in %s (set TANDEM_SHARED_DIR)\n", dir.c_str());
#ifndef TD_FUZZ_REPLAY
        std::exit(1);
#endif
        return 1;
    }
    std::vector<fuzz::Bytes> seeds;
    for (const char *s : {"Hello world", " leading space and  double", "<s>special</s> <|im_start|>user",
                          "\xe4\xbd\xa0\xe5\xa5\xbd 12345 don't", "\xff\xfe invalid utf-8 \xc3", "\n\n\t tabs\r\n"})
        for (uint8_t pick : {0, 1, 5, 9}) {
            fuzz::Bytes b = {pick};
            b.insert(b.end(), s, s + std::strlen(s));
            seeds.push_back(b);
        }
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

TD_FUZZ_TARGET(tokenizer) {
    if (size < 1 || size > 4096 || tokenizers().empty()) return 0;
    const Tokenizer &tok = *tokenizers()[(data[0] >> 2) % tokenizers().size()];
    const std::string_view text(reinterpret_cast<const char *>(data + 1), size - 1);
    const std::vector<int32_t> ids = tok.encode(text, (data[0] & 1) != 0, (data[0] & 2) != 0);
    (void)detokenize(tok, ids);
    return 0;
}
