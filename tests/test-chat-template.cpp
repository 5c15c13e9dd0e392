// Chat templates: detection from Jinja sources, the exact text of every format, stop strings, and the
// `tandem run --chat` REPL driven through stdin.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "gguf/gguf.h"
#include "text/chat-template.h"
#include "test-util.h"

namespace td {
namespace {

using K = ChatTemplateKind;

// llama.cpp's test conversation (tests/test-chat-template.cpp): system, then alternating user/assistant,
// ending with a user turn; one reply has spaces around it to show which formats trim.
const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
    {"assistant", "   I am an assistant   "},
    {"user", "Another question"},
};

#define DS_EOS      \
    "<\xEF\xBD\x9C" \
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>"
#define DS_USER "<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
#define DS_ASSISTANT \
    "<\xEF\xBD\x9C"  \
    "Assistant\xEF\xBD\x9C>"

struct Case {
    K kind;
    std::string jinja;     // a short template with the family's distinguishing text
    std::string expected;  // chat_apply(kind, kConversation, add_assistant_prompt = true)
};

// Expected strings: llama.cpp's test expectations where it has one (llama2 through granite below), else
// written from the format (llama2-sys, mistral-v7-tekken, falcon3, zephyr, deepseek3).
const std::vector<Case> &cases() {
    static const std::vector<Case> c = {
        {K::chatml,
         "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
         "'<|im_end|>' + '\\n'}}{% endfor %}",
         "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
         "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
         "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother "
         "question<|im_end|>\n"
         "<|im_start|>assistant\n"},
        {K::llama2,
         "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
         "message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token}}{% endif %}{% "
         "endfor %}",
         "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an "
         "assistant   </s>[INST] Another question [/INST]"},
        {K::llama2_sys,
         "{% if message['role'] == 'system' %}{{ '[INST] <<SYS>>\\n' + message['content'] + "
         "'\\n<</SYS>>\\n\\n' }}"
         "{% elif message['role'] == 'user' %}{{ message['content'] + ' [/INST]' }}{% endif %}",
         "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are "
         "you "
         "[/INST]   I am an assistant   </s>[INST] Another question [/INST]"},
        {K::llama2_sys_bos,
         "{%- if idx > 1 -%}{{- bos_token + '[INST] ' + messages[idx]['content'] + ' [/INST]' -}}{%- endif "
         "-%}"
         "{{- '[INST] <<SYS>>\\n' + messages[idx]['content'] + '\\n<</SYS>>\\n\\n' -}}",
         "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who "
         "are "
         "you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]"},
        {K::llama2_sys_strip,
         "{% if message['role'] == 'user' %}{{ '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
         "message['role'] == 'system' %}{{ '<<SYS>>\\n' + content.strip() + '\\n<</SYS>>\\n\\n' }}{% endif "
         "%}",
         "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are "
         "you "
         "[/INST]I am an assistant</s>[INST] Another question [/INST]"},
        {K::mistral_v1,
         "{%- if loop.first and system_message is defined %}{{- ' [INST] ' + system_message + '\\n\\n' + "
         "message['content'] + ' [/INST]' }}{%- else %}{{- ' [INST] ' + message['content'] + ' [/INST]' }}",
         " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I "
         "am "
         "an assistant   </s> [INST] Another question [/INST]"},
        {K::mistral_v3,
         "{%- if tools is not none and (message == user_messages[-1]) %}{{- '[AVAILABLE_TOOLS] [' }}{%- "
         "endif %}"
         "{{- '[INST] ' + message['content'] + '[/INST]' }}",
         "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an "
         "assistant</s>[INST] Another question[/INST]"},
        {K::mistral_v3_tekken,
         "{%- if tools is not none %}{{- \"[AVAILABLE_TOOLS][\" }}{%- endif %}{{- \"[INST]\" + "
         "message[\"content\"] + \"[/INST]\" }}",
         "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an "
         "assistant   </s>[INST]Another question[/INST]"},
        {K::mistral_v7,
         "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + '[/INST]' }}{% elif "
         "message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + message['content'] + '[/SYSTEM_PROMPT]' }}",
         "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] "
         "Who "
         "are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]"},
        {K::mistral_v7_tekken, "mistral-v7-tekken",
         "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>[INST]Who "
         "are "
         "you[/INST]   I am an assistant   </s>[INST]Another question[/INST]"},
        {K::phi3,
         "{{ bos_token }}{% for message in messages %}{{'<|' + message['role'] + '|>' + '\\n' + "
         "message['content'] + '<|end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ "
         "'<|assistant|>\\n' }}",
         "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi "
         "there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   "
         "<|end|>\n<|user|>\n"
         "Another question<|end|>\n<|assistant|>\n"},
        {K::phi4, "{{'<|im_start|>system<|im_sep|>' + message['content'] + '<|im_end|>'}}",
         "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello"
         "<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you"
         "<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   "
         "<|im_end|><|im_start|>user<|im_sep|>"
         "Another question<|im_end|><|im_start|>assistant<|im_sep|>"},
        {K::falcon3,
         "{{ '<|user|>\\n' + message['content'] + '\\n' }}{{ '<|assistant|>\\n' + message['content'] + "
         "eos_token }}{# </s> #}",
         "<|system|>\nYou are a helpful assistant\n<|user|>\nHello\n<|assistant|>\nHi there\n<|user|>\nWho "
         "are "
         "you\n<|assistant|>\n   I am an assistant   \n<|user|>\nAnother question\n<|assistant|>\n"},
        {K::zephyr,
         "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + "
         "'<|endoftext|>\\n' }}{% endfor %}{# <|user|> #}",
         "<|system|>\nYou are a helpful "
         "assistant<|endoftext|>\n<|user|>\nHello<|endoftext|>\n<|assistant|>\nHi "
         "there<|endoftext|>\n<|user|>\nWho are you<|endoftext|>\n<|assistant|>\n   I am an assistant   "
         "<|endoftext|>\n<|user|>\nAnother question<|endoftext|>\n<|assistant|>\n"},
        {K::monarch,
         "{% for message in messages %}{{bos_token + message['role'] + '\\n' + message['content'] + "
         "eos_token + "
         "'\\n'}}{% endfor %}",
         "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi "
         "there</s>\n<s>user\nWho "
         "are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother "
         "question</s>\n<s>assistant\n"},
        {K::gemma, "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}",
         "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi "
         "there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an "
         "assistant<end_of_turn>\n<start_of_turn>user\nAnother "
         "question<end_of_turn>\n<start_of_turn>model\n"},
        {K::orion,
         "{% if message['role'] == 'user' %}{{ 'Human: ' + message['content'] + '\\n\\nAssistant: ' + "
         "eos_token }}{% endif %}",
         "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\n"
         "Assistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>"},
        {K::openchat,
         "{{ 'GPT4 Correct ' + message['role'].title() + ': ' + message['content'] + '<|end_of_turn|>'}}",
         "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct "
         "Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct "
         "Assistant: "
         "   I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 "
         "Correct "
         "Assistant:"},
        {K::vicuna,
         "{{-'USER: ' + message['content'] + '\\n'-}}{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}",
         "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT: "
         "   "
         "I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
        {K::vicuna_orca,
         "{{-'SYSTEM: ' + message['content'] + '\\n' -}}{{-'USER: ' + message['content'] + '\\n'-}}"
         "{{-'ASSISTANT: ' + message['content'] + '</s>\\n' -}}",
         "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\n"
         "ASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:"},
        {K::deepseek,
         "{{'### Instruction:\\n' + message['content'] + '\\n'}}{{'### Response:\\n' + message['content'] + "
         "'\\n<|EOT|>\\n'}}",
         "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### "
         "Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### "
         "Instruction:\nAnother "
         "question\n### Response:\n"},
        {K::deepseek2,
         "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}{% elif "
         "message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}{% endif %}",
         "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there" DS_EOS "User: Who are you\n\n"
         "Assistant:    I am an assistant   " DS_EOS "User: Another question\n\nAssistant:"},
        {K::deepseek3,
         "{{'" DS_USER "' + message['content']}}{{'" DS_ASSISTANT "' + message['content'] + '" DS_EOS "'}}",
         "You are a helpful assistant\n\n" DS_USER "Hello" DS_ASSISTANT "Hi there" DS_EOS DS_USER
         "Who are you" DS_ASSISTANT "   I am an assistant   " DS_EOS DS_USER "Another question" DS_ASSISTANT},
        {K::command_r,
         "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + content.strip() + '<|END_OF_TURN_TOKEN|>' }}",
         "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|>"
         "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_"
         "TOKEN|>"
         "Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|>"
         "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an "
         "assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|>"
         "<|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"},
        {K::llama3,
         "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
         "message['content'] | trim + '<|eot_id|>' %}",
         "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
         "assistant<|eot_id|><|start_header_id|>"
         "user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi "
         "there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>"
         "assistant<|end_header_id|>\n\nI am an "
         "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
         "Another question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
        {K::granite,
         "{{- '<|start_of_role|>user<|end_of_role|>' + message['content'] + '<|end_of_text|>\\n' }}",
         "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>"
         "user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there"
         "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>"
         "assistant<|end_of_role|>   I am an assistant   "
         "<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>"
         "Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"},
    };
    return c;
}

TEST(ChatTemplate, EveryKindHasATestCase) {
    std::set<K> covered;
    for (const Case &c : cases()) covered.insert(c.kind);
    for (K k : chat_template_all()) EXPECT_TRUE(covered.count(k)) << chat_template_name(k);
}

TEST(ChatTemplate, FormatsTheConversationExactly) {
    for (const Case &c : cases())
        EXPECT_EQ(chat_apply(c.kind, kConversation, true), c.expected) << chat_template_name(c.kind);
}

TEST(ChatTemplate, DetectsEachFamilyFromItsJinja) {
    for (const Case &c : cases()) {
        std::optional<K> got = chat_template_match(c.jinja);
        ASSERT_TRUE(got.has_value()) << chat_template_name(c.kind) << ": " << c.jinja;
        EXPECT_EQ(*got, c.kind) << "expected " << chat_template_name(c.kind) << ", got "
                                << chat_template_name(*got);
    }
}

TEST(ChatTemplate, NamesRoundTripAndUnknownNamesAreErrors) {
    for (K k : chat_template_all()) {
        auto r = chat_template_from_name(chat_template_name(k));
        ASSERT_TRUE(r.ok()) << chat_template_name(k);
        EXPECT_EQ(*r, k);
        EXPECT_EQ(chat_template_match(chat_template_name(k)), k);  // a bare name is accepted as a template
    }
    auto bad = chat_template_from_name("llama9");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find("unknown chat template 'llama9'"), std::string::npos);
    EXPECT_NE(bad.status().message().find("chatml"), std::string::npos);  // lists what is known
}

TEST(ChatTemplate, UnknownTemplatesFallBackToChatml) {
    EXPECT_FALSE(chat_template_match("").has_value());
    EXPECT_FALSE(chat_template_match("{{ messages[0]['content'] }}").has_value());
    EXPECT_EQ(chat_template_detect("{{ messages[0]['content'] }}"), K::chatml);
    // Families llama.cpp knows but we do not write are not mistaken for a looser match further down.
    EXPECT_FALSE(
        chat_template_match("[gMASK]<sop>{{ '<|user|>' }}{{ '<|assistant|>' }}").has_value());  // glm4
    EXPECT_FALSE(chat_template_match("<|user|>{{ x }}<|assistant|>").has_value());  // glmedge, not zephyr
    EXPECT_FALSE(chat_template_match("{{ '<|im_start|>' }}<end_of_utterance>").has_value());  // smolvlm
    EXPECT_FALSE(chat_template_match("<|start_of_role|>{# <tool_call> #}").has_value());      // granite 4
}

TEST(ChatTemplate, AssistantPromptIsOptional) {
    const std::vector<ChatMessage> one = {{"user", "Hi"}};
    EXPECT_EQ(chat_apply(K::chatml, one, false), "<|im_start|>user\nHi<|im_end|>\n");
    EXPECT_EQ(chat_apply(K::chatml, one, true), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    EXPECT_EQ(chat_apply(K::llama3, one, false), "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
    EXPECT_EQ(chat_apply(K::gemma, one, false), "<start_of_turn>user\nHi<end_of_turn>\n");
    // llama2's user turn already opens the reply.
    EXPECT_EQ(chat_apply(K::llama2_sys, one, false), "[INST] Hi [/INST]");
    EXPECT_EQ(chat_apply(K::llama2_sys, one, true), "[INST] Hi [/INST]");
}

TEST(ChatTemplate, NoFormatStartsWithBos) {
    // The BOS contract: the tokenizer adds BOS, the text never carries a leading one.
    for (K k : chat_template_all()) {
        const std::string text = chat_apply(k, kConversation, true);
        EXPECT_FALSE(text.starts_with("<s>")) << chat_template_name(k);
        EXPECT_FALSE(text.starts_with("<|begin_of_text|>")) << chat_template_name(k);
    }
}

TEST(ChatTemplate, StopStringsEndTheTurnsTheFormatWrites) {
    // The first stop string is what the format writes after (or between) turns, so a model that learned the
    // format produces it at the end of its reply.
    for (K k : chat_template_all()) {
        auto stops = chat_template_stop_strings(k);
        ASSERT_FALSE(stops.empty()) << chat_template_name(k);
        const std::string text = chat_apply(k, kConversation, true);
        EXPECT_NE(text.find(stops[0]), std::string::npos) << chat_template_name(k) << ": " << stops[0];
    }
    EXPECT_EQ(chat_template_stop_strings(K::chatml)[0], "<|im_end|>");
    EXPECT_EQ(chat_template_stop_strings(K::llama3)[0], "<|eot_id|>");
}

TEST(ChatTemplate, ForModelReadsTheGgufKeyOrFallsBack) {
    if (!test::shared_exists("vocab/ggml-vocab-phi-3.gguf") ||
        !test::shared_exists("models/stories260K.gguf"))
        GTEST_SKIP() << "no ../shared test data";
    auto phi = gguf::File::open(test::shared_path("vocab/ggml-vocab-phi-3.gguf"));
    ASSERT_TRUE(phi.ok()) << phi.status().message();
    auto c = chat_template_for_model(*phi);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_EQ(c->kind, K::phi3);
    EXPECT_FALSE(c->fallback);

    auto stories = gguf::File::open(test::shared_path("models/stories260K.gguf"));
    ASSERT_TRUE(stories.ok());
    c = chat_template_for_model(*stories);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->kind, K::chatml);
    EXPECT_TRUE(c->fallback);
    EXPECT_NE(c->reason.find("no tokenizer.chat_template"), std::string::npos) << c->reason;

    c = chat_template_for_model(*stories, "llama3");
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(c->kind, K::llama3);
    EXPECT_FALSE(c->fallback);
    EXPECT_FALSE(chat_template_for_model(*stories, "nope").ok());
}

TEST(StopStringMatcher, HoldsBackPartialMatchesAndCutsAtTheStop) {
    StopStringMatcher m({"<|im_end|>", "\nUSER:"});
    EXPECT_EQ(m.push("Hello"), "Hello");
    EXPECT_EQ(m.push(" wor<|im"), " wor");  // "<|im" may start a stop string
    EXPECT_FALSE(m.stopped());
    EXPECT_EQ(m.push("_e"), "");
    EXPECT_EQ(m.push("nd|> tail"), "");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.matched(), "<|im_end|>");
    EXPECT_EQ(m.push("more"), "");
    EXPECT_EQ(m.flush(), "");
}

TEST(StopStringMatcher, ReleasesFalseStartsAndFlushes) {
    StopStringMatcher m({"<|im_end|>"});
    EXPECT_EQ(m.push("a <"), "a ");
    EXPECT_EQ(m.push("b"), "<b");  // not a stop string after all
    EXPECT_EQ(m.push("<|"), "");
    EXPECT_EQ(m.flush(), "<|");  // end of text: what was held back is text
    EXPECT_FALSE(m.stopped());

    StopStringMatcher earliest({"END", "ND!"});
    EXPECT_EQ(earliest.push("xxEND!"), "xx");
    EXPECT_EQ(earliest.matched(), "END");

    StopStringMatcher none({""});  // empty stop strings are ignored
    EXPECT_EQ(none.push("abc"), "abc");
    EXPECT_FALSE(none.stopped());
}

TEST(StopStringMatcher, NeverSplitsAUtf8Character) {
    // "é" is C3 A9; a stop string starting with C3 must not cut the text between a lead byte it shares.
    StopStringMatcher m({"\xC3\xA9STOP"});
    const std::string out = m.push("caf\xC3\xA9");
    EXPECT_EQ(out, "caf");  // the whole "é" is held back, not half of it
    EXPECT_EQ(m.push("!"), "\xC3\xA9!");
}

// ---- the REPL, as a user runs it ----

const char *kStories = "models/stories260K.gguf";

// Replies on stdout: each read prints "> " (commands and empty lines print no reply), each reply ends with
// a newline; the session ends with "> \n".
std::vector<std::string> replies(const std::string &out) {
    std::vector<std::string> r;
    size_t at = 0;
    while (out.compare(at, 2, "> ") == 0) {
        while (out.compare(at, 2, "> ") == 0) at += 2;
        const size_t end = out.find("\n> ", at);
        if (end == std::string::npos) break;
        r.push_back(out.substr(at, end - at));
        at = end + 1;
    }
    return r;
}

class ChatRepl : public ::testing::Test {
protected:
    void SetUp() override {
        if (!test::shared_exists(kStories)) GTEST_SKIP() << "no ../shared/" << kStories;
        stories = test::shared_path(kStories);
    }
    std::vector<std::string> args(std::vector<std::string> extra = {}) const {
        std::vector<std::string> a = {"run", "-m", stories, "--chat", "--temp", "0", "-n", "16", "-t", "1"};
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    }
    std::string stories;
};

TEST_F(ChatRepl, TwoTurnsThenEndOfInput) {
    test::ProcessResult r = test::run_tandem_stdin(args(), "Hello there\nTell me a story\n");
    ASSERT_FALSE(r.signaled) << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("chat template chatml (fallback"), std::string::npos) << r.err;
    const std::vector<std::string> got = replies(r.out);
    ASSERT_EQ(got.size(), 2u) << r.out;
    EXPECT_FALSE(got[0].empty());
    EXPECT_FALSE(got[1].empty());
    EXPECT_TRUE(r.out.ends_with("> \n")) << r.out;
    // The second turn reused the cache: only the new turn was decoded.
    EXPECT_NE(r.err.find("turn 1: prompt "), std::string::npos) << r.err;
    const size_t t2 = r.err.find("turn 2: prompt ");
    ASSERT_NE(t2, std::string::npos) << r.err;
    int n_new = 0, n_cached = 0;
    ASSERT_EQ(std::sscanf(r.err.c_str() + t2, "turn 2: prompt %d new tokens (%d cached)", &n_new, &n_cached),
              2);
    EXPECT_GT(n_cached, 16) << r.err;  // the first prompt and reply stayed in the cache
    EXPECT_GT(n_new, 0);
    EXPECT_LT(n_new, n_cached);
}

TEST_F(ChatRepl, FirstReplyEqualsRunOnTheFormattedPrompt) {
    // The REPL's first turn is `tandem run` on the chatml text of that turn; with penalties over the whole
    // history too (both samplers see the prompt, as llama.cpp's do).
    const std::vector<std::string> penalties = {"--repeat-penalty", "3", "--repeat-last-n", "-1"};
    std::vector<std::string> replies_seen;
    for (const auto &extra : {std::vector<std::string>{}, penalties}) {
        std::vector<std::string> chat_args = {"--system", "Be brief."};
        chat_args.insert(chat_args.end(), extra.begin(), extra.end());
        test::ProcessResult chat = test::run_tandem_stdin(args(chat_args), "Hi\n");
        ASSERT_EQ(chat.exit_code, 0) << chat.err;
        const std::vector<std::string> got = replies(chat.out);
        ASSERT_EQ(got.size(), 1u) << chat.out;
        const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hi"}};
        std::vector<std::string> run_args = {"run",    "-m", stories, "-p", chat_apply(K::chatml, msgs, true),
                                             "--temp", "0",  "-n",    "16", "-t",
                                             "1"};
        run_args.insert(run_args.end(), extra.begin(), extra.end());
        test::ProcessResult run = test::run_tandem(run_args);
        ASSERT_EQ(run.exit_code, 0) << run.err;
        EXPECT_EQ(got[0] + "\n", run.out);
        replies_seen.push_back(got[0]);
    }
    EXPECT_NE(replies_seen[0], replies_seen[1]);  // the penalties moved the reply
}

TEST_F(ChatRepl, ResetStartsOverAndExitEnds) {
    test::ProcessResult r =
        test::run_tandem_stdin(args(), "Once upon a time\n/reset\n\nOnce upon a time\n/exit\nnot read\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::vector<std::string> got = replies(r.out);
    ASSERT_EQ(got.size(), 2u) << r.out;
    EXPECT_EQ(got[0], got[1]);  // same conversation from an empty cache: same greedy reply
    EXPECT_NE(r.err.find("reset"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("turn 3"), std::string::npos) << r.err;  // nothing after /exit
}

TEST_F(ChatRepl, ContextOverflowIsAMessageNotACrash) {
    const std::string long_line(400, 'a');
    test::ProcessResult r = test::run_tandem_stdin(args({"-c", "64"}), long_line + "\nHi\n");
    ASSERT_FALSE(r.signaled) << r.err;
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("but the context holds 64"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("turn 1:"), std::string::npos) << r.err;  // the short message still got a reply
}

TEST_F(ChatRepl, ChatTemplateFlagOverridesAndRejectsUnknownNames) {
    test::ProcessResult r = test::run_tandem_stdin(args({"--chat-template", "llama3"}), "Hi\n");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("chat template llama3"), std::string::npos) << r.err;
    test::ProcessResult bad = test::run_tandem_stdin(args({"--chat-template", "nope"}), "Hi\n");
    EXPECT_EQ(bad.exit_code, 1);
    EXPECT_NE(bad.err.find("unknown chat template 'nope'"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace td
