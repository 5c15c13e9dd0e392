#include "text/chat-formatter.h"

#include <fstream>
#include <random>
#include <sstream>

#include "gguf/gguf.h"
#include "text/jinja.h"
#include "text/vocab.h"

namespace td {

using nlohmann::json;

json chat_messages_json(std::span<const ChatMessage> messages) {
    json out = json::array();
    for (const ChatMessage &m : messages) {
        json j = {{"role", m.role}, {"content", m.content}};
        if (!m.tool_calls.empty()) {
            json calls = json::array();
            for (const ToolCall &c : m.tool_calls) {
                json args = json::parse(c.arguments, nullptr, false);
                if (args.is_discarded()) args = c.arguments;
                calls.push_back({{"id", c.id},
                                 {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", args}}}});
            }
            j["tool_calls"] = std::move(calls);
        }
        if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
        if (!m.name.empty()) j["name"] = m.name;
        out.push_back(std::move(j));
    }
    return out;
}

ChatFormatter ChatFormatter::from_family(ChatTemplateKind kind) {
    ChatFormatter f;
    f.family_ = kind;
    for (std::string_view s : chat_template_stop_strings(kind)) f.stops_.emplace_back(s);
    return f;
}

Result<ChatFormatter> ChatFormatter::from_jinja(std::string_view source, std::string bos_token,
                                                std::string eos_token, bool strip_bos) {
    TD_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(source));
    ChatFormatter f = from_family(chat_template_detect(source));
    f.jinja_ = std::make_shared<const jinja::Template>(std::move(t));
    f.bos_ = std::move(bos_token);
    f.eos_ = std::move(eos_token);
    f.strip_bos_ = strip_bos;
    f.short_ids_ = source.find("[TOOL_CALLS]") != std::string_view::npos;
    if (!chat_template_match(source)) {
        f.stops_.clear();
        if (!f.eos_.empty()) f.stops_.push_back(f.eos_);
    }
    return f;
}

namespace {

std::string read_text_file(const std::string &path, bool &ok) {
    std::ifstream in(path, std::ios::binary);
    ok = static_cast<bool>(in);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string token_text_or_empty(const Vocab &v, int32_t id) {
    return id >= 0 && id < v.n_tokens() ? v.token_text(id) : std::string();
}

}  // namespace

Result<ChatFormatter> ChatFormatter::for_model(const gguf::File &file, const Vocab &vocab,
                                               std::string_view override_name) {
    const std::string bos = token_text_or_empty(vocab, vocab.bos()),
                      eos = token_text_or_empty(vocab, vocab.eos());
    if (!override_name.empty()) {
        const std::string name(override_name);
        if (name.size() > 6 && name.compare(name.size() - 6, 6, ".jinja") == 0) {
            bool ok = false;
            const std::string source = read_text_file(name, ok);
            if (!ok)
                return make_error(ErrorKind::not_found, "--chat-template {}: cannot read the file", name);
            auto f = from_jinja(source, bos, eos, vocab.add_bos());
            if (!f.ok()) return f.status().with_context("--chat-template " + name);
            f->reason_ = "--chat-template " + name;
            return f;
        }
        TD_ASSIGN_OR_RETURN(ChatTemplateKind kind, chat_template_from_name(name));
        ChatFormatter f = from_family(kind);
        f.reason_ = "--chat-template";
        return f;
    }
    TD_ASSIGN_OR_RETURN(std::optional<std::string> source, file.get_string_opt("tokenizer.chat_template"));
    if (source) {
        auto f = from_jinja(*source, bos, eos, vocab.add_bos());
        if (f.ok()) {
            // A probe: a template that fails on a plain chat is one the interpreter does not cover.
            const ChatMessage probe[] = {{"user", "Hello"}};
            auto r = f->apply(probe, json(), true);
            if (r.ok()) {
                f->reason_ = "tokenizer.chat_template";
                return f;
            }
            f = r.status();
        }
        const std::optional<ChatTemplateKind> kind = chat_template_match(*source);
        ChatFormatter fam = from_family(kind.value_or(ChatTemplateKind::chatml));
        fam.fallback_ = !kind.has_value();
        fam.reason_ = "tokenizer.chat_template does not render here (" + f.status().message() + "); " +
                      (kind ? "using the family it resembles" : "fallback");
        return fam;
    }
    ChatFormatter f = from_family(ChatTemplateKind::chatml);
    f.fallback_ = true;
    f.reason_ = "fallback: the model has no tokenizer.chat_template";
    return f;
}

namespace {

std::string tools_preamble(const json &tools) {
    // Short: it is paid for in every prompt.
    std::string s = "Tools you may call:\n<tools>\n";
    for (const json &t : tools) s += t.dump() + "\n";
    s += "</tools>\nTo call one, answer <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>";
    return s;
}

// A family's view of a chat with tools: tools in the system message, calls and results as text.
std::vector<ChatMessage> family_messages(std::span<const ChatMessage> messages, const json &tools) {
    std::vector<ChatMessage> out;
    const bool has_tools = tools.is_array() && !tools.empty();
    if (has_tools) {
        if (!messages.empty() && messages[0].role == "system") {
            out.push_back({"system", messages[0].content + "\n\n" + tools_preamble(tools)});
            messages = messages.subspan(1);
        } else {
            out.push_back({"system", tools_preamble(tools)});
        }
    }
    for (const ChatMessage &m : messages) {
        if (m.role == "tool") {
            std::string text = "<tool_response>\n" + m.content + "\n</tool_response>";
            // Consecutive results share one user turn.
            if (!out.empty() && out.back().role == "user" &&
                out.back().content.rfind("<tool_response>", 0) == 0)
                out.back().content += "\n" + text;
            else
                out.push_back({"user", std::move(text)});
            continue;
        }
        ChatMessage c{m.role, m.content};
        for (const ToolCall &call : m.tool_calls) {
            json args = json::parse(call.arguments, nullptr, false);
            if (args.is_discarded()) args = call.arguments;
            if (!c.content.empty()) c.content += "\n";
            c.content +=
                "<tool_call>\n" + json{{"name", call.name}, {"arguments", args}}.dump() + "\n</tool_call>";
        }
        out.push_back(std::move(c));
    }
    return out;
}

}  // namespace

Result<std::string> ChatFormatter::apply(std::span<const ChatMessage> messages, const json &tools,
                                         bool add_generation_prompt) const {
    if (!jinja_) {
        const std::vector<ChatMessage> msgs = family_messages(messages, tools);
        return chat_apply(family_, msgs, add_generation_prompt);
    }
    json vars = {{"messages", chat_messages_json(messages)},
                 {"add_generation_prompt", add_generation_prompt},
                 {"bos_token", bos_},
                 {"eos_token", eos_}};
    if (tools.is_array() && !tools.empty()) vars["tools"] = tools;
    TD_ASSIGN_OR_RETURN(std::string text, jinja_->render(vars));
    if (strip_bos_ && !bos_.empty() && text.rfind(bos_, 0) == 0) text.erase(0, bos_.size());
    return text;
}

std::string ChatFormatter::new_tool_call_id() const {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    std::string id = short_ids_ ? "" : "call_";
    for (int k = 0; k < (short_ids_ ? 9 : 24); ++k) id += alnum[rng() % 62];
    return id;
}

std::string ChatFormatter::name() const {
    return jinja_ ? "jinja" : std::string(chat_template_name(family_));
}

}  // namespace td
