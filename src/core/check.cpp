#include "core/check.h"

#include <cstdio>
#include <cstdlib>

namespace td::detail {

void assert_fail(const char *file, int line, const char *cond, const std::string &message) {
    std::fprintf(stderr, "tandem: internal error at %s:%d: assertion '%s' failed%s%s\n", file, line, cond,
                 message.empty() ? "" : ": ", message.c_str());
    std::fflush(stderr);
    std::abort();
}

}  // namespace td::detail
