// The C library's allocator, set for training's allocation pattern.
//
// A training step allocates and frees the same large tensors (activations, their gradients)
// every step. glibc's malloc serves a block above its mmap threshold (128 KiB at start, raised
// only as such blocks are freed) with a fresh mmap, and hands free memory at the heap's top
// back to the system once it passes the trim threshold (twice the mmap threshold). Either way
// the next step's tensors land on new pages, which the kernel faults in and zeroes one 4 KiB
// page at a time, a large share of a small model's step. With a fixed 64 MiB mmap threshold
// and a 512 MiB trim threshold the step reuses the heap's pages (most of the faults left are
// the first step's), for a little more peak memory (benchmarks/RESULTS.md, part 3).
//
// The setting is the process's: the CLI applies it at start. A user's own allocator setting
// wins: GLIBC_TUNABLES naming a glibc.malloc threshold, MALLOC_MMAP_THRESHOLD_ or
// MALLOC_TRIM_THRESHOLD_ in the environment leave it alone, as does an allocator LD_PRELOAD
// names (jemalloc, tcmalloc) and EXTRAP_MALLOC_TUNING=0 (for A/B runs). glibc before 2.35
// takes at most a 32 MiB mmap threshold: there it is 32 MiB. Benchmarks report which applies (allocator_summary()).
#pragma once

#include <cstddef>
#include <string>

namespace extrap {

struct AllocatorTuning {
  static constexpr size_t mmap_threshold = size_t(64) << 20;
  static constexpr size_t fallback_mmap_threshold = size_t(32) << 20;  // glibc < 2.35's most
  static constexpr size_t trim_threshold = size_t(512) << 20;
};

// Applies the thresholds above unless the environment says otherwise (see the header's
// comment); idempotent. Throws ConfigError for EXTRAP_MALLOC_TUNING other than 0 or 1.
void tune_allocator();

// What malloc runs with, for benchmark headers and results files: "glibc, mmap threshold
// 64 MiB, trim threshold 512 MiB", "glibc defaults (EXTRAP_MALLOC_TUNING=0)", "glibc, as
// GLIBC_TUNABLES sets", "glibc defaults" (before tune_allocator()).
std::string allocator_summary();

}  // namespace extrap
