// The HTTP request head parser and the OpenAI JSON layer behind it. Input: a request as a client would send
// it; the head goes through http_parse_head, the body (and the whole input) through the chat and completion
// request parsers.
#include <string>
#include <string_view>

#include "fuzz-util.h"
#include "server/http-core.h"
#include "server/openai.h"

using namespace td;
using namespace td::server;

TD_FUZZ_INIT(http) {
    std::vector<fuzz::Bytes> seeds;
    const std::string chat = R"({"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"stream":true,"stream_options":{"include_usage":true},"stop":["\n"],"seed":42})";
    const std::string completion = R"({"prompt":"Once upon a time","max_tokens":8,"logprobs":2,"n":1,"presence_penalty":0.5,"frequency_penalty":0.1,"stop":"."})";
    const std::string tokens = R"({"prompt":[1,2,3],"max_tokens":4,"top_k":40,"min_p":0.05,"repeat_penalty":1.1})";
    for (const auto &[path, body] : {std::pair{std::string("/v1/chat/completions"), chat},
                                     std::pair{std::string("/v1/completions"), completion},
                                     std::pair{std::string("/v1/completions"), tokens}})
        seeds.push_back(fuzz::bytes_of("POST " + path + " HTTP/1.1\r\nHost: localhost:8080\r\nAuthorization: Bearer k\r\n"
                                       "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                                       "\r\n\r\n" + body));
    seeds.push_back(fuzz::bytes_of("GET /v1/models?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
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
        (void)parse_chat_request(body);
        (void)parse_completion_request(body);
    }
    (void)parse_chat_request(in);
    (void)parse_completion_request(in);
    return 0;
}
