#include "text/chat-template.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "gguf/gguf.h"

namespace td {
namespace {

using K = ChatTemplateKind;

struct KindName {
    K kind;
    std::string_view name;
};

// Declaration order; the names are llama.cpp's (LLM_CHAT_TEMPLATES in src/llama-chat.cpp).
constexpr std::array kKindNames = {
    KindName{K::chatml, "chatml"},
    KindName{K::llama2, "llama2"},
    KindName{K::llama2_sys, "llama2-sys"},
    KindName{K::llama2_sys_bos, "llama2-sys-bos"},
    KindName{K::llama2_sys_strip, "llama2-sys-strip"},
    KindName{K::mistral_v1, "mistral-v1"},
    KindName{K::mistral_v3, "mistral-v3"},
    KindName{K::mistral_v3_tekken, "mistral-v3-tekken"},
    KindName{K::mistral_v7, "mistral-v7"},
    KindName{K::mistral_v7_tekken, "mistral-v7-tekken"},
    KindName{K::phi3, "phi3"},
    KindName{K::phi4, "phi4"},
    KindName{K::falcon3, "falcon3"},
    KindName{K::zephyr, "zephyr"},
    KindName{K::monarch, "monarch"},
    KindName{K::gemma, "gemma"},
    KindName{K::orion, "orion"},
    KindName{K::openchat, "openchat"},
    KindName{K::vicuna, "vicuna"},
    KindName{K::vicuna_orca, "vicuna-orca"},
    KindName{K::deepseek, "deepseek"},
    KindName{K::deepseek2, "deepseek2"},
    KindName{K::deepseek3, "deepseek3"},
    KindName{K::command_r, "command-r"},
    KindName{K::llama3, "llama3"},
    KindName{K::granite, "granite"},
};

constexpr std::array<K, kKindNames.size()> make_all_kinds() {
    std::array<K, kKindNames.size()> out{};
    for (size_t i = 0; i < kKindNames.size(); ++i) out[i] = kKindNames[i].kind;
    return out;
}
constexpr std::array kAllKinds = make_all_kinds();

// DeepSeek's full-width markers, spelled in bytes so the source stays ASCII.
constexpr std::string_view kDsEos =
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
constexpr std::string_view kDsUser = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
constexpr std::string_view kDsAssistant =
    "<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>";
// Markers of families we recognise but do not write (so they are not mistaken for another family).
constexpr std::string_view kMiniCpmUser = "<\xE7\x94\xA8\xE6\x88\xB7>";  // <用户>

std::string_view trim(std::string_view s) {
    auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// The detection chain of llama.cpp's llm_chat_detect_template, in its order. Families we do not write
// return nullopt at the same point, so a later, looser test cannot claim them.
std::optional<K> detect(std::string_view t) {
    auto has = [t](std::string_view needle) { return t.find(needle) != std::string_view::npos; };
    if (has("<|im_start|>")) {
        if (has("<|im_sep|>")) return K::phi4;
        if (has("<end_of_utterance>")) return std::nullopt;  // SmolVLM: <|im_start|> is its BOS
        return K::chatml;
    }
    if (t.starts_with("mistral") || has("[INST]")) {
        if (has("[SYSTEM_PROMPT]")) return K::mistral_v7;
        if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
            if (has(" [INST]")) return K::mistral_v1;
            if (has("\"[INST]\"")) return K::mistral_v3_tekken;
            return K::mistral_v3;
        }
        if (has("content.strip()")) return K::llama2_sys_strip;
        if (has("bos_token + '[INST]")) return K::llama2_sys_bos;
        if (has("<<SYS>>")) return K::llama2_sys;
        return K::llama2;
    }
    if (has("<|assistant|>") && has("<|end|>")) return K::phi3;
    if (has("[gMASK]<sop>")) return std::nullopt;  // chatglm4
    if (has("<|assistant|>") && has("<|user|>")) {
        if (has("<|tool_declare|>")) return std::nullopt;                  // exaone-moe
        return has("</s>") ? std::optional<K>(K::falcon3) : std::nullopt;  // else glmedge
    }
    if (has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>")) return std::nullopt;  // glmedge
    if (has("<|user|>") && has("<|endoftext|>")) return K::zephyr;
    if (has("bos_token + message['role']")) return K::monarch;
    if (has("<start_of_turn>")) return K::gemma;
    if (has("'\\n\\nAssistant: ' + eos_token")) return K::orion;
    if (has("GPT4 Correct ")) return K::openchat;
    if (has("USER: ") && has("ASSISTANT: ")) return has("SYSTEM: ") ? K::vicuna_orca : K::vicuna;
    if (has("### Instruction:") && has("<|EOT|>")) return K::deepseek;
    if (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>")) return K::command_r;
    if (has("<|start_header_id|>") && has("<|end_header_id|>")) return K::llama3;
    if (has("[gMASK]sop")) return std::nullopt;  // chatglm3
    if (has(kMiniCpmUser)) return std::nullopt;  // minicpm
    if (has("'Assistant: ' + message['content'] + eos_token")) return K::deepseek2;
    if (has(kDsAssistant) && has(kDsUser) && has(kDsEos)) return K::deepseek3;
    if (has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]")) return std::nullopt;  // exaone
    if (has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}"))
        return std::nullopt;  // rwkv-world
    if (has("<|start_of_role|>")) {
        if (has("<tool_call>") || has("<tools>")) return std::nullopt;  // granite 4.x
        return K::granite;
    }
    return std::nullopt;  // the families llama.cpp tests after granite, we do not write
}

}  // namespace

std::span<const ChatTemplateKind> chat_template_all() {
    return kAllKinds;
}

std::string_view chat_template_name(ChatTemplateKind kind) {
    for (const KindName &kn : kKindNames)
        if (kn.kind == kind) return kn.name;
    return "?";
}

Result<ChatTemplateKind> chat_template_from_name(std::string_view name) {
    for (const KindName &kn : kKindNames)
        if (kn.name == name) return kn.kind;
    std::string known;
    for (const KindName &kn : kKindNames) {
        if (!known.empty()) known += ", ";
        known += kn.name;
    }
    return invalid_input("unknown chat template '{}'; known: {}", name, known);
}

std::optional<ChatTemplateKind> chat_template_match(std::string_view jinja_source) {
    for (const KindName &kn : kKindNames)
        if (kn.name == jinja_source) return kn.kind;
    return detect(jinja_source);
}

ChatTemplateKind chat_template_detect(std::string_view jinja_source) {
    return chat_template_match(jinja_source).value_or(ChatTemplateKind::chatml);
}

Result<ChatTemplateChoice> chat_template_for_model(const gguf::File &file, std::string_view override_name) {
    ChatTemplateChoice choice;
    if (!override_name.empty()) {
        TD_ASSIGN_OR_RETURN(choice.kind, chat_template_from_name(override_name));
        choice.reason = "--chat-template";
        return choice;
    }
    TD_ASSIGN_OR_RETURN(std::optional<std::string> source, file.get_string_opt("tokenizer.chat_template"));
    if (!source) {
        choice.fallback = true;
        choice.reason = "fallback: the model has no tokenizer.chat_template";
        return choice;
    }
    if (std::optional<K> kind = chat_template_match(*source)) {
        choice.kind = *kind;
        choice.reason = "from tokenizer.chat_template";
        return choice;
    }
    choice.fallback = true;
    choice.reason = "fallback: tokenizer.chat_template is not a format tandem recognises";
    return choice;
}

std::string chat_apply(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                       bool add_assistant_prompt) {
    std::string out;
    auto add = [&out](auto &&...parts) { (out.append(parts), ...); };
    const bool add_ass = add_assistant_prompt;
    switch (kind) {
        case K::chatml:
            for (const ChatMessage &m : messages)
                add("<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
            if (add_ass) add("<|im_start|>assistant\n");
            break;

        case K::mistral_v7:
        case K::mistral_v7_tekken: {
            const std::string_view sp = kind == K::mistral_v7 ? " " : "";
            for (const ChatMessage &m : messages) {
                if (m.role == "system")
                    add("[SYSTEM_PROMPT]", sp, m.content, "[/SYSTEM_PROMPT]");
                else if (m.role == "user")
                    add("[INST]", sp, m.content, "[/INST]");
                else
                    add(sp, m.content, "</s>");
            }
            break;
        }

        case K::mistral_v1:
        case K::mistral_v3:
        case K::mistral_v3_tekken: {
            // The system message opens the first [INST] block; an assistant reply closes a block.
            const std::string_view lead = kind == K::mistral_v1 ? " " : "";
            const std::string_view trail = kind == K::mistral_v3_tekken ? "" : " ";
            bool in_turn = false;
            for (const ChatMessage &m : messages) {
                if (!in_turn) {
                    add(lead, "[INST]", trail);
                    in_turn = true;
                }
                if (m.role == "system") {
                    add(m.content, "\n\n");
                } else if (m.role == "user") {
                    add(m.content, lead, "[/INST]");
                } else {
                    add(trail, kind == K::mistral_v3 ? trim(m.content) : std::string_view(m.content), "</s>");
                    in_turn = false;
                }
            }
            break;
        }

        case K::llama2:
        case K::llama2_sys:
        case K::llama2_sys_bos:
        case K::llama2_sys_strip: {
            // The first "[INST] " has no <s> before it: that BOS is the tokenizer's (see the header).
            const bool sys_block = kind != K::llama2;
            const bool strip = kind == K::llama2_sys_strip;
            bool in_turn = true;
            add("[INST] ");
            for (const ChatMessage &m : messages) {
                const std::string_view content = strip ? trim(m.content) : std::string_view(m.content);
                if (!in_turn) {
                    in_turn = true;
                    add(kind == K::llama2_sys_bos ? "<s>[INST] " : "[INST] ");
                }
                if (m.role == "system") {
                    if (sys_block)
                        add("<<SYS>>\n", content, "\n<</SYS>>\n\n");
                    else
                        add(content, "\n");
                } else if (m.role == "user") {
                    add(content, " [/INST]");
                } else {
                    add(content, "</s>");
                    in_turn = false;
                }
            }
            break;
        }

        case K::phi3:
            for (const ChatMessage &m : messages) add("<|", m.role, "|>\n", m.content, "<|end|>\n");
            if (add_ass) add("<|assistant|>\n");
            break;

        case K::phi4:
            for (const ChatMessage &m : messages)
                add("<|im_start|>", m.role, "<|im_sep|>", m.content, "<|im_end|>");
            if (add_ass) add("<|im_start|>assistant<|im_sep|>");
            break;

        case K::falcon3:
            for (const ChatMessage &m : messages) add("<|", m.role, "|>\n", m.content, "\n");
            if (add_ass) add("<|assistant|>\n");
            break;

        case K::zephyr:
            for (const ChatMessage &m : messages) add("<|", m.role, "|>\n", m.content, "<|endoftext|>\n");
            if (add_ass) add("<|assistant|>\n");
            break;

        case K::monarch:
            for (size_t i = 0; i < messages.size(); ++i)
                add(i == 0 ? "" : "<s>", messages[i].role, "\n", messages[i].content, "</s>\n");
            if (add_ass) add("<s>assistant\n");
            break;

        case K::gemma: {
            // No system role: the system text opens the next user turn.
            std::string system;
            for (const ChatMessage &m : messages) {
                if (m.role == "system") {
                    system += trim(m.content);
                    continue;
                }
                const std::string_view role = m.role == "assistant" ? std::string_view("model") : m.role;
                add("<start_of_turn>", role, "\n");
                if (!system.empty() && role != "model") {
                    add(system, "\n\n");
                    system.clear();
                }
                add(trim(m.content), "<end_of_turn>\n");
            }
            if (add_ass) add("<start_of_turn>model\n");
            break;
        }

        case K::orion: {
            std::string system;
            for (const ChatMessage &m : messages) {
                if (m.role == "system") {
                    system += m.content;
                } else if (m.role == "user") {
                    add("Human: ");
                    if (!system.empty()) {
                        add(system, "\n\n");
                        system.clear();
                    }
                    add(m.content, "\n\nAssistant: </s>");
                } else {
                    add(m.content, "</s>");
                }
            }
            break;
        }

        case K::openchat:
            for (const ChatMessage &m : messages) {
                if (m.role == "system") {
                    add(m.content, "<|end_of_turn|>");
                } else {
                    std::string role = m.role;
                    if (!role.empty())
                        role[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(role[0])));
                    add("GPT4 Correct ", role, ": ", m.content, "<|end_of_turn|>");
                }
            }
            if (add_ass) add("GPT4 Correct Assistant:");
            break;

        case K::vicuna:
        case K::vicuna_orca:
            for (const ChatMessage &m : messages) {
                if (m.role == "system") {
                    if (kind == K::vicuna_orca)
                        add("SYSTEM: ", m.content, "\n");
                    else
                        add(m.content, "\n\n");
                } else if (m.role == "user") {
                    add("USER: ", m.content, "\n");
                } else if (m.role == "assistant") {
                    add("ASSISTANT: ", m.content, "</s>\n");
                }
            }
            if (add_ass) add("ASSISTANT:");
            break;

        case K::deepseek:
            for (const ChatMessage &m : messages) {
                if (m.role == "system")
                    add(m.content);
                else if (m.role == "user")
                    add("### Instruction:\n", m.content, "\n");
                else if (m.role == "assistant")
                    add("### Response:\n", m.content, "\n<|EOT|>\n");
            }
            if (add_ass) add("### Response:\n");
            break;

        case K::deepseek2:
            for (const ChatMessage &m : messages) {
                if (m.role == "system")
                    add(m.content, "\n\n");
                else if (m.role == "user")
                    add("User: ", m.content, "\n\n");
                else if (m.role == "assistant")
                    add("Assistant: ", m.content, kDsEos);
            }
            if (add_ass) add("Assistant:");
            break;

        case K::deepseek3:
            for (const ChatMessage &m : messages) {
                if (m.role == "system")
                    add(m.content, "\n\n");
                else if (m.role == "user")
                    add(kDsUser, m.content);
                else if (m.role == "assistant")
                    add(kDsAssistant, m.content, kDsEos);
            }
            if (add_ass) add(kDsAssistant);
            break;

        case K::command_r:
            for (const ChatMessage &m : messages) {
                std::string_view token;
                if (m.role == "system")
                    token = "<|SYSTEM_TOKEN|>";
                else if (m.role == "user")
                    token = "<|USER_TOKEN|>";
                else if (m.role == "assistant")
                    token = "<|CHATBOT_TOKEN|>";
                else
                    continue;
                add("<|START_OF_TURN_TOKEN|>", token, trim(m.content), "<|END_OF_TURN_TOKEN|>");
            }
            if (add_ass) add("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
            break;

        case K::llama3:
            for (const ChatMessage &m : messages)
                add("<|start_header_id|>", m.role, "<|end_header_id|>\n\n", trim(m.content), "<|eot_id|>");
            if (add_ass) add("<|start_header_id|>assistant<|end_header_id|>\n\n");
            break;

        case K::granite:
            for (const ChatMessage &m : messages) {
                if (m.role == "assistant_tool_call")
                    add("<|start_of_role|>assistant<|end_of_role|><|tool_call|>");
                else
                    add("<|start_of_role|>", m.role, "<|end_of_role|>");
                add(m.content, "<|end_of_text|>\n");
            }
            if (add_ass) add("<|start_of_role|>assistant<|end_of_role|>");
            break;
    }
    return out;
}

std::span<const std::string_view> chat_template_stop_strings(ChatTemplateKind kind) {
    static constexpr std::string_view chatml[] = {"<|im_end|>", "<|im_start|>"};
    static constexpr std::string_view inst[] = {"</s>", "[INST]"};
    static constexpr std::string_view phi3[] = {"<|end|>", "<|user|>", "<|endoftext|>"};
    static constexpr std::string_view falcon3[] = {"<|user|>", "<|endoftext|>"};
    static constexpr std::string_view zephyr[] = {"<|endoftext|>", "</s>", "<|user|>"};
    static constexpr std::string_view eos[] = {"</s>"};
    static constexpr std::string_view gemma[] = {"<end_of_turn>", "<start_of_turn>"};
    static constexpr std::string_view openchat[] = {"<|end_of_turn|>", "GPT4 Correct User:"};
    static constexpr std::string_view vicuna[] = {"</s>", "\nUSER:"};
    static constexpr std::string_view deepseek[] = {"<|EOT|>", "### Instruction:"};
    static constexpr std::string_view deepseek2[] = {kDsEos, "\n\nUser:"};
    static constexpr std::string_view deepseek3[] = {kDsEos, kDsUser};
    static constexpr std::string_view command_r[] = {"<|END_OF_TURN_TOKEN|>", "<|START_OF_TURN_TOKEN|>"};
    static constexpr std::string_view llama3[] = {"<|eot_id|>", "<|start_header_id|>"};
    static constexpr std::string_view granite[] = {"<|end_of_text|>", "<|start_of_role|>"};
    switch (kind) {
        case K::chatml:
        case K::phi4:
            return chatml;
        case K::llama2:
        case K::llama2_sys:
        case K::llama2_sys_bos:
        case K::llama2_sys_strip:
        case K::mistral_v1:
        case K::mistral_v3:
        case K::mistral_v3_tekken:
        case K::mistral_v7:
        case K::mistral_v7_tekken:
            return inst;
        case K::phi3:
            return phi3;
        case K::falcon3:
            return falcon3;
        case K::zephyr:
            return zephyr;
        case K::monarch:
        case K::orion:
            return eos;
        case K::gemma:
            return gemma;
        case K::openchat:
            return openchat;
        case K::vicuna:
        case K::vicuna_orca:
            return vicuna;
        case K::deepseek:
            return deepseek;
        case K::deepseek2:
            return deepseek2;
        case K::deepseek3:
            return deepseek3;
        case K::command_r:
            return command_r;
        case K::llama3:
            return llama3;
        case K::granite:
            return granite;
    }
    return {};
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) {
    for (std::string &s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringMatcher::push(std::string_view text) {
    if (stopped_) return {};
    pending_.append(text);
    // The earliest stop string in the text so far (ties: the longer one).
    size_t best = std::string::npos;
    for (const std::string &s : stops_) {
        const size_t at = pending_.find(s);
        if (at == std::string::npos) continue;
        if (at < best || (at == best && s.size() > matched_.size())) {
            best = at;
            matched_ = s;
        }
    }
    if (best != std::string::npos) {
        stopped_ = true;
        std::string out = pending_.substr(0, best);
        pending_.clear();
        return out;
    }
    // Hold back the longest suffix that is a proper prefix of some stop string.
    size_t keep = 0;
    for (const std::string &s : stops_) {
        const size_t max_len = std::min(s.size() - 1, pending_.size());
        for (size_t len = max_len; len > keep; --len) {
            if (std::string_view(pending_).substr(pending_.size() - len) ==
                std::string_view(s).substr(0, len)) {
                keep = len;
                break;
            }
        }
    }
    std::string out = pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return out;
}

std::string StopStringMatcher::flush() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace td
