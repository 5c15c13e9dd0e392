// Jinja templates, the subset real chat templates use: a GGUF's tokenizer.chat_template rendered exactly as
// Hugging Face's apply_chat_template renders it (python3-jinja2 with trim_blocks, lstrip_blocks, the loop
// controls, raise_exception, strftime_now and its tojson; an immutable sandbox).
//
// Understood: {{ }}, {% %} and {# #} with - and + whitespace control; if/elif/else, for (else, an if filter,
// loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem/cycle, tuple targets, break and
// continue), set (names, tuples, namespace attributes, {% set x %}...{% endset %}), macro (defaults, keyword
// arguments), filter blocks and {% generation %}; expressions with Python's literals, operators, slices,
// conditional expressions, the common filters, tests and str/dict methods. Rendering follows Python: None
// prints "None", lists print as Python's repr, tojson as json.dumps. What the subset lacks is an error that
// names it, never a guess.
//
// Untrusted input: a template may come from any GGUF. Parsing and rendering return errors for bad or
// unsupported input, and rendering is bounded (output size, loop iterations, call depth).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/status.h"

namespace td::jinja {

struct Program;

struct RenderOptions {
    // strftime_now(): the time to format; nullptr = the current local time.
    std::function<std::tm()> now;
    size_t max_output_bytes = 16u << 20;
    // Work: loop iterations, calls, output pieces, and a step per 256 bytes of each string or list built.
    size_t max_steps = 10'000'000;
};

class Template {
public:
    // A parse error names the line: "line 12: unexpected 'endfor'".
    static Result<Template> parse(std::string_view source);

    // Renders with `variables` (a JSON object: messages, tools, add_generation_prompt, bos_token, ...).
    // Errors (invalid_input): raise_exception(msg) gives exactly msg, the template author's words for the
    // user; anything else (an undefined attribute, a type error, a limit) "chat template line N: what".
    Result<std::string> render(const nlohmann::json &variables, const RenderOptions &options = {}) const;

private:
    std::shared_ptr<const Program> program_;
};

}  // namespace td::jinja
