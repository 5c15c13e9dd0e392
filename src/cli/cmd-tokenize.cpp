// tandem tokenize: print the token ids of a text, space-separated, one line.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace td::cli {
namespace {

struct TokenizeOptions {
    std::string model;
    std::string text;
    bool no_bos = false;
    bool parse_special = false;
    bool show_pieces = false;
};

int tokenize_main(const TokenizeOptions &opt) {
    auto path = resolve_model(opt.model);
    if (!path.ok()) return fail(path.status());
    auto file = gguf::File::open(*path);
    if (!file.ok()) return fail(file.status());
    auto vocab_r = Vocab::from_gguf(*file);
    if (!vocab_r.ok()) return fail(vocab_r.status());
    auto vocab = std::make_shared<const Vocab>(std::move(vocab_r).value());
    auto tokenizer = Tokenizer::create(vocab);
    if (!tokenizer.ok()) return fail(tokenizer.status());
    std::vector<int32_t> ids =
        (*tokenizer)->encode(opt.text, vocab->add_bos() && !opt.no_bos, opt.parse_special);
    std::string line;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (i) line += ' ';
        line += std::to_string(ids[i]);
        if (opt.show_pieces) line += "(" + vocab->token_text(ids[i]) + ")";
    }
    std::printf("%s\n", line.c_str());
    return 0;
}

}  // namespace

void register_tokenize(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<TokenizeOptions>();
    CLI::App *cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
    cmd->add_option("-m,--model", opt->model, "GGUF model or vocabulary file");
    cmd->add_option("-p,--prompt", opt->text, "Text to tokenize")->required();
    cmd->add_flag("--no-bos", opt->no_bos, "Do not add the BOS token");
    cmd->add_flag("--parse-special", opt->parse_special, "Turn special-token text (e.g. <s>) into their ids");
    cmd->add_flag("--pieces", opt->show_pieces, "Show each token's text next to its id");
    runners.push_back([cmd, opt] { return cmd->parsed() ? tokenize_main(*opt) : -1; });
}

}  // namespace td::cli
