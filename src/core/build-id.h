// The source revision this binary was built from.
#pragma once

namespace td {

// `git describe --always --dirty` of the source tree at build time (refreshed at every build, so it names
// the commit actually compiled), or "unknown" outside a git checkout.
const char *build_git_id();

}  // namespace td
