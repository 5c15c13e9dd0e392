// Chat templates: a conversation (role, content messages) -> the prompt text a chat model was trained on.
//
// GGUF files carry the template as a Jinja program (tokenizer.chat_template). We do not run Jinja: like
// llama.cpp's llm_chat_detect_template, chat_template_match() recognises the common families by
// distinctive substrings of the template source, and chat_apply() writes each family's format in code.
// The formats equal llama.cpp's llm_chat_apply_template byte for byte (tests/test-chat-template.cpp holds
// the expected strings of llama.cpp's own tests).
//
// BOS contract (as llama.cpp's common_chat_templates_apply, which strips a leading bos_token from the
// rendered template): the text chat_apply() returns never starts with the BOS token's text. The caller
// adds BOS once, at the start of the conversation, when the vocabulary asks for it (Vocab::add_bos()),
// and tokenizes the text with parse_special = true so that markers such as <|im_start|>, <|eot_id|> or
// an inner "</s><s>" (llama2-sys-bos) become their control tokens. No EOS is added after the prompt.
//
// Roles: "system", "user" and "assistant" are understood by every format. Other roles ("tool", ...) are
// written as llama.cpp writes them: formats that print the role name print it, formats that branch on the
// role treat any other role as the assistant's (or drop it, where llama.cpp does).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/tool-calls.h"

namespace td {

namespace gguf {
class File;
}

struct ChatMessage {
    ChatMessage() = default;
    ChatMessage(std::string r, std::string c) : role(std::move(r)), content(std::move(c)) {}

    std::string role;  // "system", "user", "assistant", "tool"
    std::string content;
    std::vector<ToolCall> tool_calls;  // assistant: the calls it made
    std::string tool_call_id;          // tool: the call this result answers
    std::string name;                  // tool: the function's name (optional)
};

// The formats we write. The names (chat_template_name) are llama.cpp's, so `--chat-template llama3`
// means the same in both.
enum class ChatTemplateKind {
    chatml,             // <|im_start|>role\n...<|im_end|>\n (Qwen, OpenHermes, Yi, ...)
    llama2,             // [INST] ... [/INST]; a system message is folded into the first turn as text
    llama2_sys,         // [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]
    llama2_sys_bos,     // llama2_sys with "<s>" before each later [INST]
    llama2_sys_strip,   // llama2_sys with every message trimmed
    mistral_v1,         // " [INST] ... [/INST] reply</s>"
    mistral_v3,         // "[INST] ...[/INST] reply</s>" (assistant trimmed)
    mistral_v3_tekken,  // "[INST]...[/INST]reply</s>"
    mistral_v7,         // [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST] reply</s>
    mistral_v7_tekken,  // as v7 without the spaces after the markers
    phi3,               // <|role|>\n...<|end|>\n
    phi4,               // <|im_start|>role<|im_sep|>...<|im_end|>
    falcon3,            // <|role|>\n...\n
    zephyr,             // <|role|>\n...<|endoftext|>\n
    monarch,            // role\n...</s>\n with <s> before each later message
    gemma,        // <start_of_turn>user|model\n...<end_of_turn>\n; system folded into the first user turn
    orion,        // Human: ...\n\nAssistant: </s>...</s>
    openchat,     // GPT4 Correct User: ...<|end_of_turn|>
    vicuna,       // USER: ...\nASSISTANT: ...</s>\n
    vicuna_orca,  // vicuna with "SYSTEM: " before the system message
    deepseek,     // deepseek-coder / deepseek llm: ### Instruction:\n...\n### Response:\n...\n<|EOT|>\n
    deepseek2,    // User: ...\n\nAssistant: ...<｜end▁of▁sentence｜>
    deepseek3,    // <｜User｜>...<｜Assistant｜>...<｜end▁of▁sentence｜>
    command_r,    // <|START_OF_TURN_TOKEN|><|USER_TOKEN|>...<|END_OF_TURN_TOKEN|>
    llama3,       // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
    granite,      // <|start_of_role|>role<|end_of_role|>...<|end_of_text|>\n (granite 3.x)
};

// Every kind, in declaration order.
std::span<const ChatTemplateKind> chat_template_all();

// llama.cpp's name for a kind: "chatml", "llama2-sys-bos", "mistral-v7-tekken", "deepseek3", ...
std::string_view chat_template_name(ChatTemplateKind kind);

// The kind named `name` (as chat_template_name writes it). invalid_input listing the names otherwise:
// "unknown chat template 'foo'; known: chatml, llama2, ...".
Result<ChatTemplateKind> chat_template_from_name(std::string_view name);

// Recognises a Jinja template (or a bare name, as llama.cpp accepts) by its distinctive substrings, in
// llama.cpp's order. nullopt when unrecognised, including families llama.cpp knows but we do not write
// (chatglm, minicpm, exaone, ...): those are not guessed as a different family.
std::optional<ChatTemplateKind> chat_template_match(std::string_view jinja_source);

// chat_template_match, or chatml when unrecognised. Use chat_template_for_model to learn whether it fell
// back.
ChatTemplateKind chat_template_detect(std::string_view jinja_source);

struct ChatTemplateChoice {
    ChatTemplateKind kind = ChatTemplateKind::chatml;
    bool fallback = false;  // true: no usable template; `kind` is chatml
    std::string
        reason;  // for the log: "from tokenizer.chat_template", "--chat-template", or why it fell back
};

// The template for a model: `override_name` when not empty (an error if it names no kind); else detected
// from tokenizer.chat_template; else chatml with fallback = true ("the model has no tokenizer.chat_template"
// or "tokenizer.chat_template is not a format we recognise"). A key of the wrong type is an error.
Result<ChatTemplateChoice> chat_template_for_model(const gguf::File &file,
                                                   std::string_view override_name = {});

// The prompt text for `messages` in format `kind` (see the BOS contract at the top of this file).
// add_assistant_prompt: end with the header that opens the assistant's reply ("<|im_start|>assistant\n").
// Formats whose user turn already ends with the opening (llama2, mistral, orion) ignore it.
std::string chat_apply(ChatTemplateKind kind, std::span<const ChatMessage> messages,
                       bool add_assistant_prompt);

// Texts that end the assistant's turn in this format ("<|im_end|>", "<|eot_id|>", "</s>", ...), plus the
// opening of a new turn where it is unmistakable ("<|im_start|>"). A server or REPL cuts the reply before
// the first of them; most are also end-of-generation tokens (Vocab::is_eog), this catches models whose
// vocabulary spells them as plain text.
std::span<const std::string_view> chat_template_stop_strings(ChatTemplateKind kind);

// Streams generated text through a set of stop strings: push() returns the text that can be shown now;
// text that could be the start of a stop string is held back until it is known not to be one. When a stop
// string appears, stopped() becomes true, push() returns the text before it and drops everything after.
// The held-back text begins where a stop string begins, so splitting never cuts a UTF-8 character when
// the input is valid UTF-8. Empty stop strings are ignored.
class StopStringMatcher {
public:
    explicit StopStringMatcher(std::vector<std::string> stops);

    std::string push(std::string_view text);
    // Releases the held-back text (a partial match that never completed); "" once stopped.
    std::string flush();

    bool stopped() const { return stopped_; }
    const std::string &matched() const { return matched_; }  // the stop string found, "" if none

private:
    std::vector<std::string> stops_;
    std::string pending_;  // held back: a suffix of the text that is a prefix of some stop string
    bool stopped_ = false;
    std::string matched_;
};

}  // namespace td
