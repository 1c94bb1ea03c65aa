#include "core/base/version.h"

#include "extrap_git_commit.h"  // generated at build time by cmake/git_commit.cmake

namespace extrap {

const char* extrap_version() { return EXTRAP_VERSION; }
const char* extrap_git_commit() { return EXTRAP_GIT_COMMIT; }

}  // namespace extrap
