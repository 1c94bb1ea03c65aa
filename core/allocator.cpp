#include "core/allocator.h"

#include "core/environment.h"

#include <cstdlib>
#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace extrap {

namespace {

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

// Why the environment keeps extrap's hands off the allocator ("" when it does not).
std::string left_to_environment() {
  if (!environment_switch("EXTRAP_MALLOC_TUNING", "the C library's default malloc thresholds",
                          "extrap's, the default"))
    return "EXTRAP_MALLOC_TUNING=0";
  const std::string tunables = environment("GLIBC_TUNABLES");
  if (tunables.find("glibc.malloc.mmap_threshold") != std::string::npos ||
      tunables.find("glibc.malloc.trim_threshold") != std::string::npos)
    return "GLIBC_TUNABLES";
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (std::getenv(name)) return name;
  return "";
}

struct State {
  bool applied = false;
  std::string summary = "glibc defaults";
};

State& state() {
  static State s;
  return s;
}

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

void tune_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    const std::string reason = left_to_environment();
    if (!reason.empty()) {
      state().summary = reason == "EXTRAP_MALLOC_TUNING=0" ? "glibc defaults (" + reason + ")"
                                                       : "glibc, as " + reason + " sets";
      return;
    }
    const bool ok = mallopt(M_MMAP_THRESHOLD, int(AllocatorTuning::mmap_threshold)) == 1 &&
                    mallopt(M_TRIM_THRESHOLD, int(AllocatorTuning::trim_threshold)) == 1;
    state().applied = ok;
    state().summary = ok ? "glibc, mmap threshold " + mib(AllocatorTuning::mmap_threshold) +
                               ", trim threshold " + mib(AllocatorTuning::trim_threshold)
                         : "glibc defaults (mallopt refused extrap's thresholds)";
#else
    state().summary = "not glibc: untouched";
#endif
  });
}

std::string allocator_summary() { return state().summary; }

}  // namespace extrap
