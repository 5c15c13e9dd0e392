// The HTTP request head parser and the OpenAI and Ollama JSON layers behind it. Input: a request as a client
// would send it; the head goes through http_parse_head, the body (and the whole input) through every request
// parser.
#include <string>
#include <string_view>

#include "fuzz-util.h"
#include "server/anthropic.h"
#include "server/http-core.h"
#include "server/llamacpp.h"
#include "server/ollama.h"
#include "server/openai.h"
#include "server/responses.h"

using namespace td;
using namespace td::server;

TD_FUZZ_INIT(http) {
    std::vector<fuzz::Bytes> seeds;
    const std::string chat =
        R"({"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"stream":true,"stream_options":{"include_usage":true},"stop":["\n"],"seed":42,"n":3})";
    const std::string completion =
        R"({"prompt":["Once upon a time",[1,2,3]],"max_tokens":8,"logprobs":2,"n":2,"presence_penalty":0.5,"frequency_penalty":0.1,"stop":".","logit_bias":{"2":-100,"15":5.5},"ignore_eos":true})";
    const std::string tokens =
        R"({"prompt":[1,2,3],"max_tokens":4,"top_k":40,"min_p":0.05,"repeat_penalty":1.1,"logit_bias":[[1,false],[3,-1]]})";
    const std::string llama =
        R"({"prompt":"Once","n_predict":8,"n_probs":2,"repeat_last_n":-1,"json_schema":{"type":"object"},"stop":["\n"]})";
    const std::string ollama_chat =
        R"({"model":"m:latest","messages":[{"role":"user","content":"Hi","images":[]}],"stream":false,"options":{"temperature":0,"num_predict":8,"stop":["\n"],"seed":3,"repeat_last_n":-1,"mirostat":0},"keep_alive":"5m"})";
    const std::string ollama_generate =
        R"({"model":"m","prompt":"Why?","system":"Be brief.","raw":false,"options":{"top_k":20,"top_p":0.9,"num_predict":-2}})";
    for (const auto &[path, body] :
         {std::pair{std::string("/v1/chat/completions"), chat},
          std::pair{std::string("/v1/completions"), completion},
          std::pair{std::string("/v1/completions"), tokens}, std::pair{std::string("/completion"), llama},
          std::pair{std::string("/api/chat"), ollama_chat},
          std::pair{std::string("/api/generate"), ollama_generate}})
        seeds.push_back(fuzz::bytes_of("POST " + path + " HTTP/1.1\r\nHost: localhost:8080\r\nAuthorization: Bearer k\r\n"
                                       "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                       "\r\n\r\n" + body));
    seeds.push_back(fuzz::bytes_of("GET /v1/models?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    seeds.push_back(fuzz::bytes_of("GET /v1/models/llama3%3A8b HTTP/1.1\r\nHost: h\r\n\r\n"));
    const std::string infill =
        R"({"input_prefix":"def f(x):\n    ","input_suffix":"\n","input_extra":[{"filename":"a.py","text":"y = 1\n"},{"text":"z"}],"prompt":"return","n_predict":8})";
    seeds.push_back(fuzz::bytes_of("POST /infill HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type: application/json\r\n"
                                   "Content-Length: " + std::to_string(infill.size()) + "\r\n\r\n" + infill));
    const std::string responses =
        R"({"model":"m","instructions":"Be brief.","input":[{"role":"developer","content":"x"},{"type":"message","role":"user","content":[{"type":"input_text","text":"Hi"}]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}},"max_output_tokens":8,"store":false,"stream":true})";
    seeds.push_back(fuzz::bytes_of("POST /v1/responses HTTP/1.1\r\nHost: localhost:8080\r\nContent-Type: application/json\r\n"
                                   "Content-Length: " + std::to_string(responses.size()) + "\r\n\r\n" + responses));
    const std::string messages =
        R"({"model":"m","max_tokens":8,"system":[{"type":"text","text":"Be brief."}],"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"x"},{"type":"tool_use","id":"t1","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"ok"}]},{"type":"text","text":"go"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},"stop_sequences":["\n"],"stream":true})";
    seeds.push_back(fuzz::bytes_of("POST /v1/messages HTTP/1.1\r\nHost: localhost:8080\r\nx-api-key: k\r\nContent-Type: application/json\r\n"
                                   "Content-Length: " + std::to_string(messages.size()) + "\r\n\r\n" + messages));
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

static void parse_all(std::string_view body) {
    (void)parse_chat_request(body);
    (void)parse_completion_request(body);
    (void)parse_llama_completion(body);
    (void)parse_llama_infill(body);
    if (auto in = parse_responses_input(body); in.ok())
        (void)responses_chat_request(*in, nlohmann::ordered_json::array());
    (void)parse_messages_request(body);
    (void)parse_ollama_chat(body);
    (void)parse_ollama_generate(body, true);
    (void)parse_ollama_generate(body, false);
    (void)parse_ollama_show(body);
}

TD_FUZZ_TARGET(http) {
    const std::string_view in(reinterpret_cast<const char *>(data), size);
    const HttpLimits limits;
    const size_t blank = in.find("\r\n\r\n");
    if (blank != std::string_view::npos && blank + 4 <= limits.max_header_bytes) {
        HttpHead head;
        std::string why;
        (void)http_parse_head(in.substr(0, blank + 4), limits, head, why);
        const std::string_view body = in.substr(blank + 4);
        parse_all(body);
    }
    parse_all(in);
    return 0;
}
