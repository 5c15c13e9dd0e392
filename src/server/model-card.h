// What the APIs say about the served model (Ollama's /api/tags, /api/show, /api/ps): read once from the
// GGUF when the model loads.
#pragma once

#include <cstdint>
#include <string>

#include "model/model.h"
#include "text/chat-formatter.h"

namespace td::server {

struct ModelCard {
    std::string path;           // the GGUF file
    uint64_t size_bytes = 0;    // its size
    int64_t modified_unix = 0;  // its modification time (seconds since 1970)
    std::string digest;         // "xxh3:<hex>" of its header and tensor table (not of every byte)
    std::string arch;           // general.architecture
    std::string name;           // general.name ("" when absent)
    uint64_t n_params = 0;      // elements of every tensor
    std::string quantization;   // the tensor type holding most bytes, upper case: "Q4_K", "F32"
    int32_t n_ctx_train = 0, n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_vocab = 0;
    std::string chat_template;    // tokenizer.chat_template as the file has it ("" when absent)
    std::string template_family;  // how tandem renders chats: "jinja" (the model's template) or a family
    bool has_template = false;    // false: no usable template of its own (chats fall back to chatml)
    bool fill_in_middle = false;  // its vocabulary has FIM prefix, suffix and middle tokens (server/infill.h)
};

ModelCard model_card(const Model &model, const Vocab &vocab, const ChatFormatter &chat_template);

// "7.2B", "260K", "1.2M": a parameter count as Ollama shows it.
std::string parameter_size(uint64_t n_params);

}  // namespace td::server
