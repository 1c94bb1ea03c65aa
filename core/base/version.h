// What built this binary: extrap's version and the git commit of the source tree at build time
// (with "-dirty" when tracked files had uncommitted changes). Recorded in every results file.
#pragma once

namespace extrap {

const char* extrap_version();
const char* extrap_git_commit();

}  // namespace extrap
