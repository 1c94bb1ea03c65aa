// The block cache (core/runtime/block_cache.h), `extrap eval`'s CPU allocator: an evaluation
// gives the same numbers through it as through LibTorch's allocator, a freed large block is the
// next request of its size, a block not asked for again is unmapped after `kept_for` fresh maps,
// small requests and raw allocations of either size go where they belong, and threads
// allocating at once leave its books balanced.
//
// Installing it is for the whole process, so this one test case does it, after the
// evaluation it compares against.
#include "core/eval/evaluator.h"
#include "core/runtime/block_cache.h"
#include "tests/support/test_support.h"

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>

using namespace extrap;
using namespace extrap::testing;

namespace {

// A float tensor of exactly `bytes` (a multiple of 4), its every element written.
torch::Tensor block_of(size_t bytes, float value) {
  auto t = torch::empty({int64_t(bytes / sizeof(float))}, torch::kFloat32);
  t.fill_(value);
  return t;
}

}  // namespace

TEST_CASE("the block cache: an evaluation's numbers unchanged, a freed block the next of its size, stale ones unmapped",
          "[block_cache]") {
  // A model whose window's tensors are 1 MiB and more (1024 x 256 floats; the feed-forward's
  // 4 MiB), evaluated first through LibTorch's allocator.
  Config config = tiny_config("alibi");
  config.model.d_model = 256;
  config.model.d_ffn = 1024;
  torch::manual_seed(5);
  auto model = build_model(config, 257);
  model->eval();
  const auto corpus = tiny_byte_corpus(100);  // a valid split of about 4,600 bytes
  EvalSpec spec;
  spec.length = 1024;
  spec.stride = 512;
  spec.max_tokens = 4000;
  spec.batch_tokens = 1024;  // a window a forward: 7 of them
  const EvalResult before = evaluate(model, corpus, corpus.valid, spec);
  REQUIRE(!block_cache_installed());

  BlockCacheOptions options;
  install_block_cache(options);
  REQUIRE(block_cache_installed());
  const BlockCacheStats start = block_cache_stats();
  const EvalResult after = evaluate(model, corpus, corpus.valid, spec);
  const BlockCacheStats evaluated = block_cache_stats();
  CHECK(after.scored_tokens == before.scored_tokens);
  CHECK(after.nll_sum == before.nll_sum);  // the same arithmetic on the same values: bit for bit
  for (size_t b = 0; b < before.by_position.size(); ++b) CHECK(after.by_position[b].nll_sum == before.by_position[b].nll_sum);
  // Windows after the first take the first's blocks.
  CHECK(evaluated.maps > start.maps);
  CHECK(evaluated.reuses - start.reuses > 2 * (evaluated.maps - start.maps));
  CHECK(evaluated.live_bytes == start.live_bytes);

  // A freed block is the next request of its size: the same address, its pages kept.
  const size_t size = (size_t(3) << 20) + 7 * 4096;  // a size nothing else here asks for
  void* first = nullptr;
  {
    auto t = block_of(size, 1.5f);
    first = t.data_ptr();
    REQUIRE(t.sum().item<double>() == Approx(1.5 * double(size / 4)));
  }
  const BlockCacheStats freed = block_cache_stats();
  CHECK(freed.live_bytes == evaluated.live_bytes);
  CHECK(freed.free_bytes >= size);
  {
    auto t = block_of(size, -2.0f);
    CHECK(t.data_ptr() == first);
    CHECK(t.sum().item<double>() == Approx(-2.0 * double(size / 4)));
    const BlockCacheStats reused = block_cache_stats();
    CHECK(reused.reuses == freed.reuses + 1);
    CHECK(reused.maps == freed.maps);
    CHECK(reused.live_bytes == freed.live_bytes + size);
  }
  // A size off by a page is not that block.
  {
    auto t = block_of(size + 4096, 0.0f);
    CHECK(t.data_ptr() != first);
  }

  // Below min_bytes: LibTorch's allocator, not counted here.
  {
    const BlockCacheStats s = block_cache_stats();
    auto small = block_of(options.min_bytes - 64, 3.0f);
    const BlockCacheStats t = block_cache_stats();
    CHECK(t.maps + t.reuses == s.maps + s.reuses);
  }

  // Stale: `size`'s block, freed, waits through kept_for fresh maps (sizes never asked for
  // before) and is unmapped at the next; asked for again it is mapped afresh.
  {
    const BlockCacheStats s = block_cache_stats();
    for (int64_t i = 0; i <= options.kept_for; ++i) block_of((size_t(5) << 20) + size_t(i + 1) * 4096, 0.0f);
    const BlockCacheStats t = block_cache_stats();
    CHECK(t.maps == s.maps + options.kept_for + 1);
    CHECK(t.unmaps > s.unmaps);
    auto again = block_of(size, 0.0f);
    CHECK(block_cache_stats().maps == t.maps + 1);
  }

  // raw_allocate and raw_deleter, large and small: each freed by the allocator it came from.
  c10::Allocator* allocator = c10::GetCPUAllocator();
  for (const size_t bytes : {size_t(64), size_t(2) << 20}) {
    INFO(bytes << " bytes");
    const BlockCacheStats s = block_cache_stats();
    void* p = allocator->raw_allocate(bytes);
    std::memset(p, 1, bytes);
    allocator->raw_deleter()(p);
    CHECK(block_cache_stats().live_bytes == s.live_bytes);
  }

  // Threads: every request served and returned, the books balanced.
  {
    const BlockCacheStats s = block_cache_stats();
    std::atomic<int64_t> bad{0};
    at::parallel_for(0, 64, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const auto t = block_of((size_t(1) << 20) + size_t(i % 3) * 4096, float(i));
        if (t[100].item<float>() != float(i)) ++bad;
      }
    });
    const BlockCacheStats t = block_cache_stats();
    CHECK(bad == 0);
    CHECK(t.live_bytes == s.live_bytes);
    CHECK(t.maps + t.reuses == s.maps + s.reuses + 64);
  }
}
