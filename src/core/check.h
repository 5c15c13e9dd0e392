// TD_ASSERT: a broken invariant is a bug. Always on (release too); prints file:line, the condition and a
// formatted message, then aborts. Never use it on data that came from a file, a socket or a request:
// that is bad input and returns a Status (status.h).
#pragma once

#include <fmt/core.h>

#include <string>

namespace td::detail {
[[noreturn]] void assert_fail(const char *file, int line, const char *cond, const std::string &message);
}

#define TD_ASSERT(cond, ...)                                                                     \
    do {                                                                                         \
        if (__builtin_expect(!(cond), 0))                                                        \
            ::td::detail::assert_fail(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
    } while (0)

#define TD_UNREACHABLE(...) \
    ::td::detail::assert_fail(__FILE__, __LINE__, "unreachable", ::fmt::format("" __VA_ARGS__))
