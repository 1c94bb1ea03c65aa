// A cache of LibTorch's large CPU blocks for evaluation (`extrap eval`): LibTorch's CPU
// allocator with freed blocks of 1 MiB and more kept, by size, for the next request of that
// size.
//
// A long window's forward allocates the same tensors layer after layer: the normed input, the
// projections, the attention's output, the feed-forward's chunks, 3-25 MB each at 8k tokens
// for a 100M-parameter model, 8.7 GB in all for one window of 12 layers. Under glibc either
// they come from the heap (extrap's training thresholds, core/base/allocator.h), whose
// high-water mark then holds freed blocks in fragments, or each is a fresh mapping whose pages
// the kernel faults in and zeroes again (with a 4 MiB mmap threshold: five times the system
// time). Here a freed block goes back to its size's list and the next layer's tensor of that
// size takes it, pages already in: the peak is the blocks live at once plus those waiting, and
// the faults are mostly the first layer's. That window: 919 MiB peak through glibc's heap, 850
// MiB through the cache, at the same speed (benchmarks/RESULTS.md, "Evaluation's allocator").
//
// A freed block is kept until `kept_for` more large blocks were asked for without taking it
// (a size that does not come back, a growing cache's, is returned to the system then), so the
// free blocks held are at most the last `kept_for` requests' bytes. Blocks below 1 MiB go to
// the allocator that was LibTorch's before (its default), with glibc's heap for them.
//
// Installed for the whole process by install_block_cache(), before the first tensor; tensors
// made before keep their allocator's deleter. Thread-safe (OpenMP workers allocate too). A
// block the system will not map is c10::OutOfMemoryError, naming its size (the evaluation
// then fails as one line), not an abort.
#pragma once

#include <cstddef>
#include <cstdint>

namespace extrap {

struct BlockCacheStats {
  int64_t maps = 0;          // blocks mapped afresh
  int64_t reuses = 0;        // requests served from a freed block
  int64_t unmaps = 0;        // freed blocks returned to the system (not asked for again in time)
  size_t live_bytes = 0;     // in blocks tensors hold now
  size_t free_bytes = 0;     // in freed blocks kept for reuse
  size_t peak_bytes = 0;     // the most live + free there has been
};

struct BlockCacheOptions {
  size_t min_bytes = size_t(1) << 20;  // smaller requests go to the previous allocator
  int64_t kept_for = 16;               // fresh maps after which a freed block not taken again is unmapped
};

// Makes the cache LibTorch's CPU allocator (idempotent: the first call's options stay).
void install_block_cache(const BlockCacheOptions& options = {});
bool block_cache_installed();
BlockCacheStats block_cache_stats();

}  // namespace extrap
