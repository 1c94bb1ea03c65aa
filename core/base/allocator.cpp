#include "core/base/allocator.h"

#include "core/base/environment.h"

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

// Why the environment keeps extrap's hands off the allocator ("" when it does not). A user's
// own thresholds come first, then a preloaded allocator (mallopt would not reach it), then
// the switch.
std::string left_to_environment() {
  const bool switched_on = environment_switch(
      "EXTRAP_MALLOC_TUNING", "the C library's default malloc thresholds", "extrap's, the default");
  const std::string tunables = environment("GLIBC_TUNABLES");
  if (tunables.find("glibc.malloc.mmap_threshold") != std::string::npos ||
      tunables.find("glibc.malloc.trim_threshold") != std::string::npos)
    return "GLIBC_TUNABLES";
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"})
    if (std::getenv(name)) return name;
  const std::string preload = environment("LD_PRELOAD");
  if (preload.find("malloc") != std::string::npos)  // jemalloc, tcmalloc, mimalloc
    return "LD_PRELOAD";
  return switched_on ? "" : "EXTRAP_MALLOC_TUNING=0";
}

// What allocator_summary() says: glibc's defaults until tune_allocator() has run.
std::string& summary() {
  static std::string text = "glibc defaults";
  return text;
}

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

void tune_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    const std::string reason = left_to_environment();
    if (!reason.empty()) {
      summary() = reason == "EXTRAP_MALLOC_TUNING=0" ? "glibc defaults (" + reason + ")"
                  : reason == "LD_PRELOAD"             ? "the allocator LD_PRELOAD names: untouched"
                                                       : "glibc, as " + reason + " sets";
      return;
    }
    // glibc before 2.35 refuses an mmap threshold above 32 MiB (HEAP_MAX_SIZE / 2): fall back to
    // that, and set the trim threshold either way.
    size_t mmap_threshold = AllocatorTuning::mmap_threshold;
    if (mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)) != 1) {
      mmap_threshold = AllocatorTuning::fallback_mmap_threshold;
      if (mallopt(M_MMAP_THRESHOLD, int(mmap_threshold)) != 1) mmap_threshold = 0;
    }
    const bool trim = mallopt(M_TRIM_THRESHOLD, int(AllocatorTuning::trim_threshold)) == 1;
    summary() = mmap_threshold > 0 && trim ? "glibc, mmap threshold " + mib(mmap_threshold) +
                                                 ", trim threshold " + mib(AllocatorTuning::trim_threshold)
                                           : "glibc defaults (mallopt refused extrap's thresholds)";
#else
    summary() = "not glibc: untouched";
#endif
  });
}

std::string allocator_summary() { return summary(); }

}  // namespace extrap
