// Structured output's cost per decode step: the allowed-token mask of a JSON schema (text/json-schema.h) over
// a real vocabulary, at every byte of a document the schema accepts. Prints the median, mean and worst time
// of one mask, for bench/json-mask.sh to set against a decode step of the same run.
//
//   json-mask VOCAB.gguf [ROUNDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "text/json-schema.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

using namespace td;

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: json-mask VOCAB.gguf [ROUNDS]\n");
        return 2;
    }
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 3;
    auto file = gguf::File::open(argv[1]);
    if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().message().c_str()), 1;
    auto vocab = Vocab::from_gguf(*file);
    if (!vocab.ok()) return std::fprintf(stderr, "%s\n", vocab.status().message().c_str()), 1;
    auto tok = Tokenizer::create(std::make_shared<const Vocab>(std::move(*vocab)));
    if (!tok.ok()) return std::fprintf(stderr, "%s\n", tok.status().message().c_str()), 1;
    const int32_t n_vocab = (*tok)->vocab().n_tokens();
    std::vector<std::string> pieces(static_cast<size_t>(n_vocab));
    for (int32_t id = 0; id < n_vocab; ++id)
        if (!(*tok)->vocab().is_control(id)) pieces[static_cast<size_t>(id)] = (*tok)->token_to_piece(id);
    auto schema = JsonSchema::compile(R"({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
        "mood": {"enum": ["happy", "sad", "curious"]}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "mood", "tags"]})");
    if (!schema.ok()) return std::fprintf(stderr, "%s\n", schema.status().message().c_str()), 1;
    const std::string doc =
        R"({"name": "Lily the little girl", "age": 7, "mood": "curious", "tags": ["park", "sun", "ball"]})";
    const auto t_build = std::chrono::steady_clock::now();
    JsonTokenFilter filter(pieces);
    const double build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_build).count();
    std::vector<double> us;
    std::vector<uint8_t> allowed;
    size_t n_allowed = 0;
    for (int r = 0; r < rounds; ++r) {
        JsonMatcher m(*schema);
        for (char c : doc) {
            const auto t0 = std::chrono::steady_clock::now();
            n_allowed += filter.allowed(m, allowed);
            us.push_back(
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            if (!m.feed(static_cast<uint8_t>(c)))
                return std::fprintf(stderr, "the document does not match\n"), 1;
        }
    }
    std::sort(us.begin(), us.end());
    double sum = 0;
    for (double u : us) sum += u;
    std::printf(
        "{\"n_vocab\": %d, \"masks\": %zu, \"median_us\": %.1f, \"mean_us\": %.1f, \"max_us\": %.1f, "
        "\"mean_allowed\": %.1f, \"build_ms\": %.1f}\n",
        n_vocab, us.size(), us[us.size() / 2], sum / static_cast<double>(us.size()), us.back(),
        static_cast<double>(n_allowed) / static_cast<double>(us.size()), build_ms);
    return 0;
}
