// How a served model's chats become prompt text: the model's own Jinja template (tokenizer.chat_template,
// rendered by text/jinja exactly as Hugging Face renders it, tools and tool results included) or, when the
// model has none that renders or one is named with --chat-template, a family written in code
// (text/chat-template: chat_apply). Also what ends a reply (stop strings) and the tool-call ids the template
// accepts.
//
// Tools with a family: the family has no notion of tools, so they are described in the system message
// (their JSON schemas and the <tool_call>{"name": ..., "arguments": ...}</tool_call> form to answer in),
// assistant calls are written in that form and tool results go back as user turns in <tool_response> tags.
//
// BOS contract as chat_apply's: the text never starts with the BOS token's text when the vocabulary adds BOS
// itself (a template that prints bos_token has it removed), and is tokenized with parse_special = true.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/chat-template.h"

namespace td {

namespace jinja {
class Template;
}
class Vocab;

class ChatFormatter {
public:
    // The model's: `override_name` when given (a family name, or a path to a .jinja file); else its
    // tokenizer.chat_template when it parses and renders a probe conversation; else the family it is
    // recognised as; else chatml (fallback). Errors: a bad override (unknown name, unreadable or invalid
    // file). `vocab` gives bos_token / eos_token.
    static Result<ChatFormatter> for_model(const gguf::File &file, const Vocab &vocab,
                                           std::string_view override_name = {});
    static ChatFormatter from_family(ChatTemplateKind kind);
    // A Jinja template. Errors: it does not parse.
    static Result<ChatFormatter> from_jinja(std::string_view source, std::string bos_token,
                                            std::string eos_token, bool strip_bos);

    // The prompt for `messages` (and `tools`, an array of OpenAI tool objects; empty or null: none), ending
    // with the assistant's opening when add_generation_prompt. Errors (invalid_input): what the template
    // raised ("Conversation roles must alternate user/assistant/user/assistant/...") or why it failed.
    Result<std::string> apply(std::span<const ChatMessage> messages, const nlohmann::json &tools,
                              bool add_generation_prompt) const;

    // Texts that end the reply (chat_template_stop_strings of the family, the eos text for a template).
    const std::vector<std::string> &stop_strings() const { return stops_; }
    // A new id for a tool call the model made: 9 letters and digits for templates that insist on it
    // (Mistral's), "call_" and 24 otherwise.
    std::string new_tool_call_id() const;

    bool is_jinja() const { return jinja_ != nullptr; }
    // The family: the one rendered, or the one a Jinja template resembles (chatml when none).
    ChatTemplateKind family() const { return family_; }
    // For logs and /v1/models: "jinja" or the family's name.
    std::string name() const;
    // Why this one: "tokenizer.chat_template", "--chat-template", "fallback: ...".
    const std::string &reason() const { return reason_; }
    bool fallback() const { return fallback_; }

private:
    std::shared_ptr<const jinja::Template> jinja_;
    ChatTemplateKind family_ = ChatTemplateKind::chatml;
    std::string bos_, eos_;
    bool strip_bos_ = false;
    bool short_ids_ = false;
    bool fallback_ = false;
    std::string reason_;
    std::vector<std::string> stops_;
};

// The chat as Hugging Face's templates take it: [{role, content, tool_calls: [{id, type, function: {name,
// arguments (an object when it parses)}}], tool_call_id, name}].
nlohmann::json chat_messages_json(std::span<const ChatMessage> messages);

}  // namespace td
