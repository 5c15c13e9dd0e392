#include "core/status.h"

namespace td {

const char *error_kind_name(ErrorKind kind) {
    switch (kind) {
        case ErrorKind::ok:
            return "ok";
        case ErrorKind::invalid_input:
            return "invalid input";
        case ErrorKind::not_found:
            return "not found";
        case ErrorKind::io:
            return "i/o error";
        case ErrorKind::failed:
            return "failed";
        case ErrorKind::overloaded:
            return "overloaded";
        case ErrorKind::disconnected:
            return "disconnected";
        case ErrorKind::unimplemented:
            return "unimplemented";
    }
    return "unknown";
}

Status Status::with_context(std::string_view context) const {
    if (ok()) return *this;
    return Status(kind_, fmt::format("{}: {}", context, message_));
}

}  // namespace td
