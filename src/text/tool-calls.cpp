#include "text/tool-calls.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace td {
namespace {

using nlohmann::json;

constexpr std::string_view kMarkers[] = {"<tool_call>", "[TOOL_CALLS]", "<|python_tag|>"};

bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

// One JSON value at the start of `s` (after whitespace): its length, or 0 when none parses. Scans to the
// matching bracket, strings and escapes respected, then parses that span.
size_t json_prefix(std::string_view s, json &out) {
    size_t k = 0;
    while (k < s.size() && is_space(s[k])) ++k;
    if (k >= s.size() || (s[k] != '{' && s[k] != '[')) return 0;
    int depth = 0;
    bool in_str = false, esc = false;
    for (size_t i = k; i < s.size(); ++i) {
        const char c = s[i];
        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                in_str = false;
            continue;
        }
        if (c == '"')
            in_str = true;
        else if (c == '{' || c == '[')
            ++depth;
        else if (c == '}' || c == ']') {
            if (--depth == 0) {
                out = json::parse(s.substr(k, i + 1 - k), nullptr, false);
                return out.is_discarded() ? 0 : i + 1;
            }
        }
    }
    return 0;
}

// {"name": ..., "arguments"|"parameters": {...}} (or "function": {...} around it) -> a call.
bool call_from_json(const json &j, std::vector<ToolCall> &calls) {
    if (!j.is_object()) return false;
    const json *obj = &j;
    if (auto f = j.find("function"); f != j.end() && f->is_object()) obj = &*f;
    auto name = obj->find("name");
    if (name == obj->end() || !name->is_string() || name->get<std::string>().empty()) return false;
    ToolCall c;
    c.name = name->get<std::string>();
    auto args = obj->find("arguments");
    if (args == obj->end()) args = obj->find("parameters");
    if (args == obj->end() || args->is_null())
        c.arguments = "{}";
    else if (args->is_string())
        c.arguments = args->get<std::string>();
    else
        c.arguments = args->dump();
    calls.push_back(std::move(c));
    return true;
}

// A call or a list of calls.
bool calls_from_json(const json &j, std::vector<ToolCall> &calls) {
    if (j.is_array()) {
        std::vector<ToolCall> found;
        for (const json &e : j)
            if (!call_from_json(e, found)) return false;
        if (found.empty()) return false;
        calls.insert(calls.end(), found.begin(), found.end());
        return true;
    }
    if (auto tc = j.find("tool_calls"); j.is_object() && tc != j.end() && tc->is_array())
        return calls_from_json(*tc, calls);
    return call_from_json(j, calls);
}

// The calls written from `s` on, in any of the syntaxes; what does not parse is left for the content.
// Returns where the parsed calls end (0: none).
size_t parse_calls_at(std::string_view s, std::vector<ToolCall> &calls) {
    size_t pos = 0;
    size_t end = 0;
    while (true) {
        std::string_view rest = s.substr(pos);
        size_t ws = 0;
        while (ws < rest.size() && (is_space(rest[ws]) || rest[ws] == ';' || rest[ws] == ',')) ++ws;
        rest.remove_prefix(ws);
        const size_t at = pos + ws;
        json j;
        if (rest.rfind("<tool_call>", 0) == 0) {
            const size_t close = rest.find("</tool_call>");
            std::string_view body =
                rest.substr(11, close == std::string_view::npos ? std::string_view::npos : close - 11);
            const size_t n = json_prefix(body, j);
            if (n == 0 || !calls_from_json(j, calls)) break;
            pos = at + (close == std::string_view::npos ? 11 + n : close + 12);
        } else if (rest.rfind("[TOOL_CALLS]", 0) == 0) {
            std::string_view body = rest.substr(12);
            size_t n = json_prefix(body, j);
            if (n > 0 && calls_from_json(j, calls)) {
                pos = at + 12 + n;
            } else {
                // [TOOL_CALLS]name[ARGS]{...}
                const size_t args = body.find("[ARGS]");
                if (args == std::string_view::npos) break;
                const std::string_view name = trim(body.substr(0, args));
                n = json_prefix(body.substr(args + 6), j);
                if (name.empty() || n == 0) break;
                calls.push_back({"", std::string(name), j.dump()});
                pos = at + 12 + args + 6 + n;
            }
        } else if (rest.rfind("<|python_tag|>", 0) == 0) {
            const size_t n = json_prefix(rest.substr(14), j);
            if (n == 0 || !calls_from_json(j, calls)) break;
            pos = at + 14 + n;
        } else {
            const size_t n = json_prefix(rest, j);
            if (n == 0 || !calls_from_json(j, calls)) break;
            pos = at + n;
        }
        end = pos;
    }
    return end;
}

}  // namespace

ToolCallParse parse_tool_calls(std::string_view text) {
    ToolCallParse out;
    // The calls start at the first marker, or the reply is calls from its first character.
    size_t start = std::string_view::npos;
    for (std::string_view m : kMarkers) start = std::min(start, text.find(m));
    const std::string_view t = trim(text);
    if (start == std::string_view::npos && !t.empty() && (t[0] == '{' || t[0] == '['))
        start = size_t(t.data() - text.data());
    if (start == std::string_view::npos) {
        out.content = std::string(trim(text));
        return out;
    }
    std::vector<ToolCall> calls;
    const size_t end = parse_calls_at(text.substr(start), calls);
    if (end == 0) {
        out.content = std::string(trim(text));
        return out;
    }
    out.calls = std::move(calls);
    out.content = std::string(trim(text.substr(0, start)));
    const std::string_view after = trim(text.substr(start + end));
    // Closing text some templates add after the calls ("</tool_call>" leftovers) is dropped; anything else
    // is kept.
    if (!after.empty()) {
        if (!out.content.empty()) out.content += "\n";
        out.content += std::string(after);
    }
    return out;
}

size_t tool_call_holdback(std::string_view text) {
    size_t k = 0;
    while (k < text.size() && is_space(text[k])) ++k;
    if (k < text.size() && (text[k] == '{' || text[k] == '[')) return 0;
    size_t hold = text.size();
    for (std::string_view m : kMarkers) {
        const size_t f = text.find(m);
        if (f != std::string_view::npos) hold = std::min(hold, f);
        // A marker cut off at the end of the text so far.
        for (size_t n = std::min(m.size() - 1, text.size()); n > 0; --n)
            if (text.substr(text.size() - n) == m.substr(0, n)) {
                hold = std::min(hold, text.size() - n);
                break;
            }
    }
    // Leading whitespace may still be followed by "{": hold it until something else comes.
    if (k == text.size()) return 0;
    return hold;
}

std::string ToolCallStream::push(std::string_view text) {
    reply_ += text;
    const size_t hold = std::max(tool_call_holdback(reply_), sent_);
    std::string show = reply_.substr(sent_, hold - sent_);
    sent_ = hold;
    return show;
}

ToolCallParse ToolCallStream::finish() {
    const std::string rest = reply_.substr(sent_);
    sent_ = reply_.size();
    ToolCallParse p = parse_tool_calls(rest);
    if (p.calls.empty()) p.content = rest;
    return p;
}

}  // namespace td
