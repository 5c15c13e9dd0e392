// Tool calls in a model's reply: found in the text and turned into (name, arguments) pairs, for the reply
// written the way the model's family writes them:
//   Hermes, Qwen2.5/Qwen3, SmolLM3 ...  <tool_call>{"name": ..., "arguments": {...}}</tool_call> (one or
//   more) Llama 3.x                          [<|python_tag|>]{"name": ..., "parameters": {...}} (";" between
//   calls) Mistral                            [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]
//                                      or [TOOL_CALLS]name[ARGS]{...} (newer templates)
//   any model (and tool_choice "required": the constrained reply)
//                                      a bare {"name": ..., "arguments": {...}} or a list of them
// All syntaxes are accepted whatever the family: a model may drift from its template's, and a parser that
// knows them all costs nothing. Text that does not parse as a call stays content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace td {

struct ToolCall {
    std::string id;  // "call_..." (set by the server; the model does not write ids)
    std::string name;
    std::string arguments;  // a JSON text (an object, as the model wrote it, compact)
};

struct ToolCallParse {
    std::string content;          // the reply without its calls (trimmed)
    std::vector<ToolCall> calls;  // in the order written
};

// Parses a finished reply.
ToolCallParse parse_tool_calls(std::string_view text);

// For streaming: where the tool calls of a reply may begin. Returns the offset in `text` (the reply so far)
// from which text must be held back, because it is, or may become, a tool call: a marker ("<tool_call>",
// "[TOOL_CALLS]", "<|python_tag|>") or the start of one at the end of the text, or a reply that begins
// (after whitespace) with "{" or "[". text.size() when all of it can be shown as content now.
size_t tool_call_holdback(std::string_view text);

// A streamed reply split into content that can be shown now and, at the end, the calls (what OpenAI's SSE
// and Ollama's NDJSON streams both do with tool calls).
class ToolCallStream {
public:
    // The reply's next text; returns the part that is content for sure (may be empty).
    std::string push(std::string_view text);
    // The reply ended: the held-back text, parsed. No calls: `content` is that text as it was (untrimmed).
    ToolCallParse finish();

private:
    std::string reply_;
    size_t sent_ = 0;  // bytes of reply_ returned as content
};

}  // namespace td
