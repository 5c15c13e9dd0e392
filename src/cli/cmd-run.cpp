// tandem run: generate text from a prompt on this machine, streaming it to stdout.
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <thread>

#include "cli/chat-repl.h"
#include "cli/cluster-flags.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "core/log.h"
#include "core/thread-pool.h"
#include "model/context.h"
#include "model/drafter.h"
#include "model/engine.h"
#include "model/generate.h"
#include "model/model.h"
#include "model/sampler.h"
#include "server/constrained.h"
#include "server/dry-breakers.h"
#include "text/detokenizer.h"
#include "text/json-schema-grammar.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace td::cli {
namespace {

struct RunOptions {
    std::string model;
    std::string prompt;
    std::string prompt_file;
    int32_t n_predict = -1;
    int32_t n_ctx = 0;
    int32_t n_threads = 0;
    int32_t n_batch = 512;
    bool no_bos = false;
    KvTypeFlags kv_type;  // --kv-type, --cache-type-k, --cache-type-v
    SamplerParams sampling;
    std::vector<std::string> logit_bias;  // --logit-bias TOKEN_ID+BIAS, repeatable
    std::vector<std::string>
        dry_breakers;  // --dry-sequence-breaker, repeatable ("none": none); none: defaults
    bool ignore_eos = false;
    int64_t seed = -1;
    bool chat = false;
    ChatReplParams chat_params;  // system prompt, template name
    ClusterFlags cluster;        // --workers etc.: run as a pipeline
    DraftParams draft;           // --draft, --model-draft: speculative decoding
    std::string grammar;         // --grammar GBNF
    std::string grammar_file;    // --grammar-file FILE
    std::string json_schema;     // -j, --json-schema SCHEMA
};

std::string read_file(const std::string &path, Status &status) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        status = make_error(ErrorKind::not_found, "{}: cannot read the file", path);
        return {};
    }
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

int run_main(const RunOptions &opt) {
    auto path = resolve_model(opt.model);
    if (!path.ok()) return fail(path.status());
    ModelLoadOptions mo;
    if (opt.cluster.workers.empty()) mo.pack_dir = pack_dir(opt.cluster.no_repack);
    auto model = Model::load(*path, mo);
    if (!model.ok()) return fail(model.status());
    auto vocab_r = Vocab::from_gguf((*model)->file());
    if (!vocab_r.ok()) return fail(vocab_r.status());
    auto vocab = std::make_shared<const Vocab>(std::move(vocab_r).value());
    auto tokenizer = Tokenizer::create(vocab);
    if (!tokenizer.ok()) return fail(tokenizer.status());

    std::string prompt = opt.prompt;
    if (!opt.prompt_file.empty()) {
        Status s;
        prompt = read_file(opt.prompt_file, s);
        if (!s.ok()) return fail(s.with_context("the prompt file"));
    }
    // Constrained output, as llama-cli's --grammar, --grammar-file and --json-schema.
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const JsonSchema> schema;
    if ((!opt.grammar.empty()) + (!opt.grammar_file.empty()) + (!opt.json_schema.empty()) > 1)
        return fail(invalid_input("give one of --grammar, --grammar-file and --json-schema"));
    std::string grammar_text = opt.grammar;
    if (!opt.grammar_file.empty()) {
        Status s;
        grammar_text = read_file(opt.grammar_file, s);
        if (!s.ok()) return fail(s);
    }
    if (!grammar_text.empty()) {
        auto g = Grammar::compile(grammar_text);
        if (!g.ok()) return fail(g.status());
        grammar = *g;
    }
    if (!opt.json_schema.empty()) {
        auto js = compile_json_constraint(opt.json_schema);
        if (!js.ok()) return fail(js.status());
        schema = js->schema;
        grammar = js->grammar;
    }
    if ((grammar || schema) && opt.chat)
        return fail(invalid_input("--grammar and --json-schema constrain one reply to -p, not a --chat"));
    const bool add_bos = vocab->add_bos() && !opt.no_bos;
    std::vector<int32_t> tokens = (*tokenizer)->encode(prompt, add_bos, /*parse_special=*/true);
    if (tokens.empty()) return fail(invalid_input("the prompt is empty; pass one with -p"));

    SamplerParams sp = opt.sampling;
    sp.seed = opt.seed < 0 ? SamplerParams::seed_random : static_cast<uint64_t>(opt.seed);
    for (const std::string &text : opt.logit_bias) {
        auto b = parse_logit_bias(text);
        if (!b.ok()) return fail(b.status());
        sp.logit_bias.push_back(*b);
    }
    // llama.cpp's --ignore-eos: every end-of-generation token the model can draw biased to -inf.
    if (opt.ignore_eos)
        for (int32_t id : vocab->eog_ids())
            if (id < (*model)->hparams().n_vocab)
                sp.logit_bias.push_back({id, -std::numeric_limits<float>::infinity()});
    if (sp.dry_multiplier > 0.0f && sp.dry_penalty_last_n != 0) {
        std::vector<std::string> strings =
            opt.dry_breakers.empty() ? server::dry_default_breakers() : opt.dry_breakers;
        std::erase(strings, std::string("none"));  // llama.cpp's word for no breakers
        auto breakers = server::dry_breakers_for(**tokenizer, strings);
        if (!breakers.ok()) return fail(breakers.status());
        sp.dry_breakers = std::move(*breakers);
    }
    if (Status s = sampler_params_validate(sp); !s.ok()) return fail(s);
    if (Status s = logit_bias_validate(sp, (*model)->hparams().n_vocab); !s.ok()) return fail(s);

    ContextParams cp;
    cp.n_ctx = opt.n_ctx;
    if (Status s = parse_kv_type_flags(opt.kv_type, cp.type_k, cp.type_v); !s.ok()) return fail(s);
    // A cluster head computes nothing but a draft model's guesses.
    ThreadPool pool(opt.cluster.workers.empty() || !opt.draft.model.empty() ? opt.n_threads : 1);
    auto engine = make_engine(opt.cluster, *model, cp, pool, opt.n_threads);
    if (!engine.ok()) return fail(engine.status());
    std::unique_ptr<ModelDrafter> drafter;  // --model-draft
    if (!opt.draft.model.empty() && opt.draft.n_max > 0 && !opt.chat) {
        ModelLoadOptions dmo;  // the draft runs here, pipeline or not
        dmo.pack_dir = pack_dir(opt.cluster.no_repack);
        auto draft_model = Model::load(opt.draft.model, dmo);
        if (!draft_model.ok()) return fail(draft_model.status().with_context("--model-draft"));
        ContextParams dcp = cp;
        dcp.n_ctx = (*engine)->n_ctx();
        auto d = ModelDrafter::create(std::move(draft_model).value(), **model, dcp, opt.draft.p_min, pool);
        if (!d.ok()) return fail(d.status().with_context("--model-draft"));
        drafter = std::move(d).value();
    }
    if (opt.chat)
        return chat_repl(**engine, (*model)->file(), **tokenizer, sp,
                         {opt.chat_params.system_prompt, opt.chat_params.template_name, opt.n_predict,
                          opt.n_batch},
                         stdin, stdout);
    // The prompt is not echoed; generated text streams as soon as it is valid UTF-8. It continues the
    // prompt, so the first piece keeps its leading space.
    Detokenizer detok(**tokenizer, Detokenizer::Start::continuation);
    GenerateParams gp;
    gp.n_predict = opt.n_predict;
    gp.n_batch = opt.n_batch;
    gp.draft = opt.draft;
    gp.drafter = drafter.get();
    std::unique_ptr<server::ConstraintVocab> constraint_vocab;
    std::unique_ptr<server::ConstrainedSampler> constrained;
    if (grammar || schema) {
        constraint_vocab = std::make_unique<server::ConstraintVocab>(**tokenizer, (*engine)->n_vocab());
        constrained =
            std::make_unique<server::ConstrainedSampler>(*constraint_vocab, schema, grammar, sp, tokens);
        gp.pick = [&](const float *logits) { return constrained->sample(logits); };
    }
    auto stats = generate(
        **engine, sp, tokens, gp, [&](int32_t t) { return vocab->is_eog(t); },
        [&](int32_t token, const float *) {
            std::string text = detok.push(token);
            if (!text.empty()) {
                std::fwrite(text.data(), 1, text.size(), stdout);
                std::fflush(stdout);
            }
            return !(constrained && constrained->must_end());  // the document or sentence is complete
        });
    std::string rest = detok.flush();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
    if (!stats.ok()) return fail(stats.status());
    const GenerateStats &st = *stats;
    if (st.stop == StopReason::context_full)
        std::fprintf(stderr, "tandem: stopped: the context of %d tokens is full (raise -c)\n",
                     (*engine)->n_ctx());
    std::fprintf(
        stderr,
        "tandem: prompt %d tokens, %.2f tokens/s | generation %d tokens, %.2f tokens/s | %d threads\n",
        st.n_prompt, st.prompt_seconds > 0 ? st.n_prompt / st.prompt_seconds : 0.0, st.n_generated,
        st.gen_seconds > 0 ? st.n_generated / st.gen_seconds : 0.0, pool.n_threads());
    if (opt.draft.n_max > 0)
        std::fprintf(stderr, "tandem: draft: %d of %d guessed tokens accepted | %.2f tokens per step\n",
                     st.n_accepted, st.n_drafted,
                     st.n_steps > 0 ? static_cast<double>(st.n_generated - 1) / st.n_steps : 0.0);
    print_cluster_stats(opt.cluster, **engine);
    return 0;
}

}  // namespace

void register_run(CLI::App &app, Runners &runners) {
    auto opt = std::make_shared<RunOptions>();
    CLI::App *cmd =
        app.add_subcommand("run", "Generate text from a prompt (streams to stdout, speed to stderr)");
    cmd->add_option("-m,--model", opt->model, "GGUF model (default: stories260K, downloaded once if needed)");
    cmd->add_option("-p,--prompt", opt->prompt, "Prompt text")->default_val("Once upon a time");
    cmd->add_option("-f,--file", opt->prompt_file, "Read the prompt from a file");
    cmd->add_option("-n,--n-predict", opt->n_predict,
                    "Tokens to generate (-1: until end of text or context full)")
        ->default_val(-1);
    cmd->add_option("-c,--ctx-size", opt->n_ctx, "Context size in tokens (0: the model's)")->default_val(0);
    cmd->add_option("-t,--threads", opt->n_threads, "Threads (0: all cores)")->default_val(0);
    cmd->add_option("-b,--batch-size", opt->n_batch, "Prompt tokens per forward pass")
        ->default_val(512)
        ->check(CLI::Range(1, 1 << 16));
    cmd->add_flag("--no-bos", opt->no_bos, "Do not add the BOS token");
    cmd->add_flag("--chat,--cnv,--conversation", opt->chat,
                  "Interactive chat on stdin (-n: tokens per reply)");
    cmd->add_option("--system", opt->chat_params.system_prompt, "System prompt for --chat");
    cmd->add_option("--chat-template", opt->chat_params.template_name,
                    "Chat template name (default: the model's)");
    add_kv_type_flags(cmd, opt->kv_type);
    cmd->add_option("--temp", opt->sampling.temperature, "Temperature (0: greedy)")->default_val(0.8f);
    cmd->add_option("--top-k", opt->sampling.top_k, "Top-k (0: off)")->default_val(40);
    cmd->add_option("--top-p", opt->sampling.top_p, "Top-p (1: off)")->default_val(0.95f);
    cmd->add_option("--min-p", opt->sampling.min_p, "Min-p (0: off)")->default_val(0.05f);
    cmd->add_option("--typical,--typical-p", opt->sampling.typical_p,
                    "Locally typical sampling's mass (1: off)")
        ->default_val(1.0f);
    cmd->add_option("--top-nsigma,--top-n-sigma", opt->sampling.top_n_sigma,
                    "Keep logits within N standard deviations of the best (<= 0: off)")
        ->default_val(-1.0f);
    cmd->add_option("--xtc-probability", opt->sampling.xtc_probability,
                    "XTC: chance per token of dropping the top choices (0: off)")
        ->default_val(0.0f);
    cmd->add_option("--xtc-threshold", opt->sampling.xtc_threshold,
                    "XTC: the probability a top choice must reach to be dropped (> 0.5: off)")
        ->default_val(0.1f);
    cmd->add_option(
           "--dynatemp-range", opt->sampling.dynatemp_range,
           "Dynamic temperature: the temperature moves within --temp +- this with the entropy (0: off)")
        ->default_val(0.0f);
    cmd->add_option("--dynatemp-exp", opt->sampling.dynatemp_exponent,
                    "Dynamic temperature: the exponent on the normalised entropy")
        ->default_val(1.0f);
    cmd->add_option(
           "--mirostat", opt->sampling.mirostat,
           "Mirostat in place of top-k, top-p and the other filters: 1 Mirostat, 2 Mirostat 2.0 (0: off)")
        ->default_val(0);
    cmd->add_option("--mirostat-ent", opt->sampling.mirostat_tau,
                    "Mirostat: the surprise it aims at (tau, bits per token)")
        ->default_val(5.0f);
    cmd->add_option("--mirostat-lr", opt->sampling.mirostat_eta, "Mirostat: its learning rate (eta)")
        ->default_val(0.1f);
    cmd->add_option("--dry-multiplier", opt->sampling.dry_multiplier,
                    "DRY: the penalty of a token that extends a repeat (0: off)")
        ->default_val(0.0f);
    cmd->add_option("--dry-base", opt->sampling.dry_base, "DRY: the penalty grows by this per repeated token")
        ->default_val(1.75f);
    cmd->add_option("--dry-allowed-length", opt->sampling.dry_allowed_length,
                    "DRY: repeats this long go unpenalized")
        ->default_val(2);
    cmd->add_option("--dry-penalty-last-n", opt->sampling.dry_penalty_last_n,
                    "DRY: tokens it looks back (-1: all, 0: off)")
        ->default_val(-1);
    cmd->add_option("--dry-sequence-breaker", opt->dry_breakers,
                    "DRY: text a repeat does not reach across; repeatable, replaces the defaults "
                    "(newline, ':', '\"', '*'); 'none' for none");
    cmd->add_option("--repeat-penalty", opt->sampling.repeat_penalty, "Repetition penalty (1: off)")
        ->default_val(1.0f);
    cmd->add_option("--repeat-last-n", opt->sampling.repeat_last_n, "Tokens the penalty looks back")
        ->default_val(64);
    cmd->add_option("--presence-penalty", opt->sampling.presence_penalty, "Presence penalty")
        ->default_val(0.0f);
    cmd->add_option("--frequency-penalty", opt->sampling.frequency_penalty, "Frequency penalty")
        ->default_val(0.0f);
    cmd->add_option("-s,--seed", opt->seed, "Random seed (-1: random)")->default_val(-1);
    cmd->add_option(
        "-l,--logit-bias", opt->logit_bias,
        "Add BIAS to a token's logit, TOKEN_ID+BIAS or TOKEN_ID-BIAS (2-inf bans token 2); repeatable");
    cmd->add_flag(
        "--ignore-eos", opt->ignore_eos,
        "Never end at an end-of-generation token: generate -n tokens (bans them, as llama.cpp does)");
    cmd->add_option("--grammar", opt->grammar,
                    "The reply is a sentence of this GBNF grammar (llama.cpp's notation)");
    cmd->add_option("--grammar-file", opt->grammar_file, "Read the --grammar from a file");
    cmd->add_option("-j,--json-schema", opt->json_schema, "The reply is a JSON document this schema accepts");
    add_draft_flags(cmd, opt->draft);
    add_cluster_flags(cmd, opt->cluster);
    runners.push_back([cmd, opt] {
        if (!cmd->parsed()) return -1;
        if (Status s = apply_discovery(opt->cluster.discover, opt->cluster.workers); !s.ok()) return fail(s);
        if (Status s = check_draft_flags(opt->draft); !s.ok()) return fail(s);
        return run_main(*opt);
    });
}

}  // namespace td::cli
