// Minimal leveled logging to stderr. Level from TANDEM_LOG (error|warn|info|debug), default warn;
// the CLI raises it with --verbose. Thread-safe (one fprintf per line).
#pragma once

#include <fmt/core.h>

#include <string>

namespace td {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

LogLevel log_level();
void log_set_level(LogLevel level);
void log_write(LogLevel level, const std::string &message);

template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args &&...args) {
    log_write(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args &&...args) {
    if (log_level() >= LogLevel::warn) log_write(LogLevel::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args &&...args) {
    if (log_level() >= LogLevel::info) log_write(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args &&...args) {
    if (log_level() >= LogLevel::debug)
        log_write(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace td
