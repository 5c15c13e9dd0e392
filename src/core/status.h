// Status and Result<T>: how bad input and peer failures travel up to the caller.
//
// A bug is a TD_ASSERT (check.h). Anything that came from a file, a socket, a request or the command line
// and is wrong becomes a Status with a message a user can act on, e.g.
//   "model.gguf: tensor blk.3.attn_q.weight ends at byte 912 MB, file is 480 MB".
// The kind tells the caller what to do next (retry, reconnect, give up, report bad input).
#pragma once

#include <fmt/core.h>

#include <string>
#include <utility>
#include <variant>

namespace td {

enum class ErrorKind {
    ok = 0,
    invalid_input,  // the caller's data is wrong (file, request, flag); retrying will not help
    not_found,      // a file, key, tensor or model that does not exist
    io,             // the OS refused (open, read, mmap)
    failed,         // an operation failed for another reason
    overloaded,     // try again later
    disconnected,   // a peer went away; reconnect may help
    unimplemented,  // valid but not supported by this build
};

const char *error_kind_name(ErrorKind kind);

class [[nodiscard]] Status {
public:
    Status() = default;  // ok
    Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}

    static Status ok_status() { return {}; }

    bool ok() const { return kind_ == ErrorKind::ok; }
    explicit operator bool() const { return ok(); }
    ErrorKind kind() const { return kind_; }
    const std::string &message() const { return message_; }

    // Prefix the message with context: "model.gguf: " + message.
    Status with_context(std::string_view context) const;

private:
    ErrorKind kind_ = ErrorKind::ok;
    std::string message_;
};

template <typename... Args>
Status make_error(ErrorKind kind, fmt::format_string<Args...> format, Args &&...args) {
    return Status(kind, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
Status invalid_input(fmt::format_string<Args...> format, Args &&...args) {
    return Status(ErrorKind::invalid_input, fmt::format(format, std::forward<Args>(args)...));
}

// Result<T>: a value or an error Status (never an ok Status).
template <typename T>
class [[nodiscard]] Result {
public:
    Result(T value) : v_(std::move(value)) {}
    Result(Status status) : v_(std::move(status)) {}

    bool ok() const { return v_.index() == 0; }
    explicit operator bool() const { return ok(); }

    T &value() & { return std::get<0>(v_); }
    const T &value() const & { return std::get<0>(v_); }
    T &&value() && { return std::get<0>(std::move(v_)); }
    T *operator->() { return &std::get<0>(v_); }
    const T *operator->() const { return &std::get<0>(v_); }
    T &operator*() & { return std::get<0>(v_); }
    const T &operator*() const & { return std::get<0>(v_); }

    // The error; an ok Status when the Result holds a value.
    Status status() const { return ok() ? Status() : std::get<1>(v_); }

private:
    std::variant<T, Status> v_;
};

}  // namespace td

// Propagate an error Status: TD_TRY(some_call_returning_status());
#define TD_TRY(expr)                                     \
    do {                                                 \
        ::td::Status td_try_status_ = (expr);            \
        if (!td_try_status_.ok()) return td_try_status_; \
    } while (0)

#define TD_CONCAT_INNER(a, b) a##b
#define TD_CONCAT(a, b) TD_CONCAT_INNER(a, b)

// Unwrap a Result<T> into a declaration or propagate its error:
//   TD_ASSIGN_OR_RETURN(auto file, MappedFile::open(path));
#define TD_ASSIGN_OR_RETURN(decl, expr) TD_ASSIGN_OR_RETURN_IMPL(TD_CONCAT(td_result_, __LINE__), decl, expr)
#define TD_ASSIGN_OR_RETURN_IMPL(tmp, decl, expr) \
    auto tmp = (expr);                            \
    if (!tmp.ok()) return tmp.status();           \
    decl = std::move(tmp).value()
