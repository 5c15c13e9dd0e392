// The chat template layer: recognising a model's Jinja source, interpreting it (text/jinja: parse and render,
// bounded), and rendering any messages (roles and contents of any bytes) in every format. Input: the template
// source, then NUL-separated role / content pairs.
#include <string>
#include <string_view>
#include <vector>

#include "fuzz-util.h"
#include "text/chat-formatter.h"
#include "text/chat-template.h"

using namespace td;

TD_FUZZ_INIT(chat_template) {
    std::vector<fuzz::Bytes> seeds;
    const std::string nul(1, '\0');
    seeds.push_back(fuzz::bytes_of("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}" +
                                   nul + "system" + nul + "Be brief." + nul + "user" + nul + "Hi" + nul + "assistant" + nul + "Hello"));
    seeds.push_back(fuzz::bytes_of("<|start_header_id|>{{ role }}<|end_header_id|>\n\n{{ content }}<|eot_id|>" + nul + "user" +
                                   nul + "\xf0\x9f\x98\x80 emoji"));
    seeds.push_back(fuzz::bytes_of("[INST] {{ messages[0]['content'] }} [/INST]" + nul + "user" + nul + "x"));
    seeds.push_back(fuzz::bytes_of(
        "{%- set ns = namespace(n=0) -%}{% macro m(x, y='d') %}{{ x ~ y }}{% endmacro %}"
        "{%- for m2 in messages if m2.role != 'x' -%}{% set ns.n = ns.n + 1 %}{{ loop.index0 }}{{ m2.content "
        "| trim | "
        "tojson }}{{ m(m2.role) }}{% if tools is defined %}{{ tools | length }}{% endif %}{%- endfor -%}"
        "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}{{ ns.n }}{{ "
        "'a,b'.split(',')[::-1] }}" +
        nul + "user" + nul + "Hi" + nul + "assistant" + nul + "Hello"));
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

TD_FUZZ_TARGET(chat_template) {
    const std::string_view in(reinterpret_cast<const char *>(data), size);
    std::vector<std::string_view> parts;
    for (size_t at = 0;;) {
        const size_t nul = in.find('\0', at);
        parts.push_back(in.substr(at, nul == std::string_view::npos ? std::string_view::npos : nul - at));
        if (nul == std::string_view::npos) break;
        at = nul + 1;
    }
    (void)chat_template_match(parts[0]);
    const ChatTemplateKind detected = chat_template_detect(parts[0]);
    (void)chat_template_from_name(parts[0]);
    std::vector<ChatMessage> messages;
    for (size_t i = 1; i + 1 < parts.size() && messages.size() < 64; i += 2)
        messages.push_back({std::string(parts[i]), std::string(parts[i + 1])});
    (void)chat_apply(detected, messages, true);
    if (auto f = ChatFormatter::from_jinja(parts[0], "<s>", "</s>", true); f.ok()) {
        const nlohmann::json tools = nlohmann::json::parse(
            R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
        (void)f->apply(messages, tools, true);
        (void)f->apply(messages, nlohmann::json(), false);
    }
    for (ChatTemplateKind k : chat_template_all()) {
        (void)chat_apply(k, messages, false);
        (void)chat_template_stop_strings(k);
    }
    return 0;
}
