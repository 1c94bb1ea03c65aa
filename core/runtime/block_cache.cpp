#include "core/runtime/block_cache.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace extrap {

namespace {

constexpr size_t kPage = 4096;

void unmap(void* data, size_t bytes) {
  if (munmap(data, bytes) != 0) {
    std::fprintf(stderr, "extrap: block cache: munmap of %zu bytes failed: %s\n", bytes, std::strerror(errno));
    std::abort();
  }
}

class BlockCache final : public c10::Allocator {
 public:
  BlockCache(c10::Allocator* previous, const BlockCacheOptions& options) : previous_(previous), options_(options) {}

  c10::DataPtr allocate(size_t n) override {
    if (n < options_.min_bytes) return previous_->allocate(n);
    const size_t bytes = (n + kPage - 1) / kPage * kPage;
    void* data = take(bytes);
    // The context is the data pointer (a "simple" DataPtr, as raw_allocate requires); the
    // block's size is found again by its address.
    return {data, data, &BlockCache::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &BlockCache::release_raw; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  BlockCacheStats stats() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  static BlockCache*& instance() {
    static BlockCache* cache = nullptr;
    return cache;
  }

 private:
  struct FreeBlock {
    void* data;
    size_t bytes;
    int64_t freed_at;  // stats_.maps when it was freed
  };

  static void release(void* data) { instance()->give_back(data); }
  // raw_allocate's blocks: large ones are the cache's, small ones the previous allocator's.
  static void release_raw(void* data) {
    BlockCache* cache = instance();
    if (!cache->give_back(data, /*only_if_owned=*/true)) cache->previous_->raw_deleter()(data);
  }

  void* take(size_t bytes) {
    std::vector<FreeBlock> stale;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      // The most recently freed block of this size (its pages likeliest in the caches).
      const auto found = std::find_if(free_.begin(), free_.end(), [&](const FreeBlock& b) { return b.bytes == bytes; });
      if (found != free_.end()) {
        void* data = found->data;
        free_.erase(found);
        stats_.free_bytes -= bytes;
        ++stats_.reuses;
        live_.emplace(data, bytes);
        stats_.live_bytes += bytes;
        return data;
      }
      ++stats_.maps;  // counted before the map: the blocks it makes stale go first
      stale = take_stale();
    }
    for (const FreeBlock& b : stale) unmap(b.data, b.bytes);
    void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED)
      TORCH_CHECK_WITH(OutOfMemoryError, false, "extrap's block cache: cannot map ", bytes, " bytes for a tensor (",
                       std::strerror(errno), ")");
    const std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(data, bytes);
    stats_.live_bytes += bytes;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes + stats_.free_bytes);
    return data;
  }

  // Returns `data`'s block to the free list; false if it is not a live block of this cache
  // (only_if_owned), which is otherwise a bug: a block freed twice or never the cache's.
  bool give_back(void* data, bool only_if_owned = false) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(data);
    if (it == live_.end()) {
      if (only_if_owned) return false;
      std::fprintf(stderr, "extrap: block cache: %p freed but not a live block of the cache\n", data);
      std::abort();
    }
    const size_t bytes = it->second;
    live_.erase(it);
    stats_.live_bytes -= bytes;
    free_.push_front({data, bytes, stats_.maps});
    stats_.free_bytes += bytes;
    return true;
  }

  // Under the lock: the free blocks freed more than kept_for fresh maps ago (the oldest are at
  // the back), taken out to be unmapped outside the lock.
  std::vector<FreeBlock> take_stale() {
    std::vector<FreeBlock> stale;
    while (!free_.empty() && stats_.maps - free_.back().freed_at > options_.kept_for) {
      stale.push_back(free_.back());
      stats_.free_bytes -= free_.back().bytes;
      ++stats_.unmaps;
      free_.pop_back();
    }
    return stale;
  }

  c10::Allocator* const previous_;
  const BlockCacheOptions options_;
  std::mutex mutex_;
  std::unordered_map<void*, size_t> live_;  // data -> bytes
  std::list<FreeBlock> free_;               // newest first
  BlockCacheStats stats_;
};

}  // namespace

void install_block_cache(const BlockCacheOptions& options) {
  static std::once_flag once;
  std::call_once(once, [&] {
    // Never destroyed: tensors freed during the process's exit still give their blocks back.
    auto* cache = new BlockCache(c10::GetCPUAllocator(), options);
    BlockCache::instance() = cache;
    c10::SetCPUAllocator(cache, /*priority=*/1);
  });
}

bool block_cache_installed() { return BlockCache::instance() != nullptr; }

BlockCacheStats block_cache_stats() {
  BlockCache* cache = BlockCache::instance();
  return cache ? cache->stats() : BlockCacheStats{};
}

}  // namespace extrap
