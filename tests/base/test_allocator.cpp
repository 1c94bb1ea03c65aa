// malloc's thresholds (core/base/allocator.h): with them a training step's freed blocks are reused
// without faulting their pages in again, and the environment's own setting wins.
#include <catch2/catch.hpp>

#include "core/base/allocator.h"
#include "tests/support/cli_harness.h"

#include <sys/resource.h>

#include <cstdlib>
#include <vector>

using namespace extrap;
using namespace extrap::testing;

namespace {

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Allocates `count` blocks of `bytes`, writes one byte a page (every page faults in unless
// malloc hands back pages this process already touched), frees them; returns the faults.
long faults_of_one_step(int count, size_t bytes) {
  const long before = minor_faults();
  std::vector<void*> blocks;
  for (int i = 0; i < count; ++i) {
    auto* block = static_cast<volatile char*>(std::malloc(bytes));
    REQUIRE(block);
    for (size_t at = 0; at < bytes; at += 4096) block[at] = char(i);
    blocks.push_back(const_cast<char*>(block));
  }
  for (void* block : blocks) std::free(block);
  return minor_faults() - before;
}

// The variables that make tune_allocator() leave malloc alone.
bool environment_sets_allocator() {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const char* preload = std::getenv("LD_PRELOAD");
  return std::getenv("EXTRAP_MALLOC_TUNING") || std::getenv("MALLOC_MMAP_THRESHOLD_") ||
         (preload && *preload) ||
         std::getenv("MALLOC_TRIM_THRESHOLD_") ||
         (tunables && std::string(tunables).find("glibc.malloc.") != std::string::npos);
}

}  // namespace

TEST_CASE("tune_allocator: a step's freed blocks are reused without faulting their pages in again", "[allocator]") {
#if !defined(__GLIBC__)
  skip_test("not glibc: extrap leaves this C library's malloc alone");
  return;
#endif
  if (environment_sets_allocator()) {
    skip_test("the environment sets malloc's thresholds; extrap leaves them alone");
    return;
  }
  tune_allocator();
  // 32 MiB where glibc (before 2.35) takes no more.
  REQUIRE_THAT(allocator_summary(), Catch::Equals("glibc, mmap threshold 64 MiB, trim threshold 512 MiB") ||
                                        Catch::Equals("glibc, mmap threshold 32 MiB, trim threshold 512 MiB"));
  // 64 blocks of 1 MiB, a step's activations in miniature: glibc's defaults map each afresh
  // or trim the heap after the step, so the second step faults in all 16,384 pages again.
  const int count = 64;
  const size_t bytes = size_t(1) << 20;
  faults_of_one_step(count, bytes);  // the first step faults its pages in
  const long again = faults_of_one_step(count, bytes);
  INFO("minor page faults of the second step: " << again << " (of " << count * bytes / 4096 << " pages)");
  REQUIRE(again < 256);
}

TEST_CASE("EXTRAP_MALLOC_TUNING and GLIBC_TUNABLES: the environment's malloc setting wins, a bad value is refused by value", "[allocator][cli]") {
#if !defined(__GLIBC__)
  skip_test("not glibc: extrap leaves this C library's malloc alone");
  return;
#endif
  struct Restore {
    ~Restore() {
      unsetenv("EXTRAP_MALLOC_TUNING");
      unsetenv("MALLOC_TRIM_THRESHOLD_");
      tunables ? setenv("GLIBC_TUNABLES", tunables->c_str(), 1) : unsetenv("GLIBC_TUNABLES");
    }
    std::optional<std::string> tunables =
        std::getenv("GLIBC_TUNABLES") ? std::optional<std::string>(std::getenv("GLIBC_TUNABLES")) : std::nullopt;
  } restore;
  if (environment_sets_allocator()) {
    skip_test("the environment sets malloc's thresholds; this test sets its own");
    return;
  }
  TempDir d("malloc-switch");
  std::string out;
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  REQUIRE_THAT(out, Catch::Contains("malloc: glibc, mmap threshold ") && Catch::Contains(" MiB, trim threshold 512 MiB"));
  setenv("EXTRAP_MALLOC_TUNING", "0", 1);
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  REQUIRE_THAT(out, Catch::Contains("malloc: glibc defaults (EXTRAP_MALLOC_TUNING=0)"));
  setenv("EXTRAP_MALLOC_TUNING", "1", 1);
  setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576", 1);
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  REQUIRE_THAT(out, Catch::Contains("malloc: glibc, as GLIBC_TUNABLES sets"));
  unsetenv("GLIBC_TUNABLES");
  setenv("MALLOC_TRIM_THRESHOLD_", "1048576", 1);
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  REQUIRE_THAT(out, Catch::Contains("malloc: glibc, as MALLOC_TRIM_THRESHOLD_ sets"));
  unsetenv("MALLOC_TRIM_THRESHOLD_");
  setenv("EXTRAP_MALLOC_TUNING", "off", 1);
  REQUIRE(run_cli(d, {"train", "--help"}, &out) == 2);
  REQUIRE(out == "extrap: environment variable EXTRAP_MALLOC_TUNING=off: expected 0 (the C library's "
                 "default malloc thresholds) or 1 (extrap's, the default)\n");
}
