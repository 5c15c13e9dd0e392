#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace td {
namespace {

LogLevel level_from_env() {
    const char *env = std::getenv("TANDEM_LOG");
    if (env == nullptr) return LogLevel::warn;
    if (std::strcmp(env, "error") == 0) return LogLevel::error;
    if (std::strcmp(env, "info") == 0) return LogLevel::info;
    if (std::strcmp(env, "debug") == 0) return LogLevel::debug;
    return LogLevel::warn;
}

std::atomic<int> &level_ref() {
    static std::atomic<int> level{static_cast<int>(level_from_env())};
    return level;
}

}  // namespace

LogLevel log_level() {
    return static_cast<LogLevel>(level_ref().load(std::memory_order_relaxed));
}
void log_set_level(LogLevel level) {
    level_ref().store(static_cast<int>(level));
}

void log_write(LogLevel level, const std::string &message) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    std::fprintf(stderr, "tandem %s: %s\n", names[static_cast<int>(level)], message.c_str());
}

}  // namespace td
