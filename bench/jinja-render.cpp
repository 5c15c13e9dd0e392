// The chat template's cost per request: renders every template of a folder (../shared/templates) with a long
// conversation (a system prompt, 20 turns, a tool round trip, two tools) through text/jinja, as the server
// does for each chat request, and prints each template's median and the median over all of them (set against
// the prefill of the prompt it renders in docs/benchmarks.md).
//
//   jinja-render TEMPLATES_DIR [ROUNDS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "text/jinja.h"

using namespace td;
using json = nlohmann::json;

int main(int argc, char **argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: jinja-render TEMPLATES_DIR [ROUNDS]\n");
        return 2;
    }
    const int rounds = argc > 2 ? std::max(1, std::atoi(argv[2])) : 20;
    json messages = json::array({{{"role", "system"}, {"content", "You are a helpful assistant."}}});
    for (int t = 0; t < 20; ++t) {
        messages.push_back(
            {{"role", "user"}, {"content", "Question number " + std::to_string(t) + ": tell me more."}});
        messages.push_back({{"role", "assistant"},
                            {"content", "Here is answer " + std::to_string(t) + ", in some detail."}});
    }
    messages.push_back({{"role", "user"}, {"content", "Weather in Paris?"}});
    messages.push_back({{"role", "assistant"},
                        {"content", ""},
                        {"tool_calls",
                         {{{"id", "call12345"},
                           {"type", "function"},
                           {"function", {{"name", "get_weather"}, {"arguments", {{"city", "Paris"}}}}}}}}});
    messages.push_back(
        {{"role", "tool"}, {"tool_call_id", "call12345"}, {"name", "get_weather"}, {"content", "21C"}});
    const json tools = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "add", "description": "a + b",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}])");
    const json vars = {{"messages", messages},
                       {"tools", tools},
                       {"add_generation_prompt", true},
                       {"bos_token", "<s>"},
                       {"eos_token", "</s>"}};

    std::vector<std::filesystem::path> files;
    for (const auto &e : std::filesystem::directory_iterator(argv[1]))
        if (e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    std::vector<double> medians;
    size_t n_failed = 0, bytes = 0;
    for (const auto &path : files) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        auto t = jinja::Template::parse(ss.str());
        if (!t.ok()) return std::fprintf(stderr, "%s: %s\n", path.c_str(), t.status().message().c_str()), 1;
        std::vector<double> us;
        bool failed = false;
        for (int r = 0; r < rounds; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            auto out = t->render(vars);
            us.push_back(
                std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
            if (!out.ok())
                failed = true;
            else if (r == 0)
                bytes += out->size();
        }
        if (failed) {
            ++n_failed;  // the template refuses this conversation (e.g. "single tool-calls at once"); timed
                         // anyway
        }
        std::sort(us.begin(), us.end());
        medians.push_back(us[us.size() / 2]);
        std::printf("%-55s %9.1f us%s\n", path.filename().c_str(), us[us.size() / 2],
                    failed ? " (raised)" : "");
    }
    std::vector<double> sorted = medians;
    std::sort(sorted.begin(), sorted.end());
    std::printf(
        "templates %zu, rounds %d, raised %zu, output %zu bytes; render median %.1f us, p90 %.1f us, max "
        "%.1f us\n",
        files.size(), rounds, n_failed, bytes, sorted[sorted.size() / 2], sorted[sorted.size() * 9 / 10],
        sorted.back());
    return 0;
}
