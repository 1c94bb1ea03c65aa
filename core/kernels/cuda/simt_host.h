// simt.h's subset of CUDA as threads on the CPU, for tests of a kernel's own source on a machine
// with no GPU (include simt.h, not this).
//
// launch(blocks, threads, body) runs `body` (a call of the kernel) once per thread of each block:
// a block's threads are std::threads running at once, so a barrier or a shuffle really waits for
// the others; blocks run one after another, and EXTRAP_SIMT_SHARED arrays are function-static
// (one copy, reused by each block in turn, as each CUDA block gets its own). A barrier that some
// thread of the block never reaches (a sync_block() inside a branch that differs between threads,
// or after an early return) would hang on CUDA; here the waiting threads give up after
// host::barrier_seconds and launch() throws, naming it. bfloat16 rounds to nearest even, as
// __float2bfloat16_rn; rsqrt, exp and log are the C++ library's.
#pragma once

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#define EXTRAP_SIMT_KERNEL inline
#define EXTRAP_SIMT_DEVICE inline
#define EXTRAP_SIMT_SHARED static
#define EXTRAP_SIMT_UNROLL

namespace extrap::simt {

// The layout of CUDA's __nv_bfloat16 (and LibTorch's c10::BFloat16): the high half of a float.
struct bf16 {
  uint16_t bits;
};

inline float to_float(bf16 value) {
  const uint32_t word = uint32_t(value.bits) << 16;
  float out;
  std::memcpy(&out, &word, sizeof out);
  return out;
}

inline bf16 to_bf16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  if (std::isnan(value)) return bf16{uint16_t((word >> 16) | 0x40u)};  // stays a (quiet) NaN
  word += 0x7fffu + ((word >> 16) & 1u);                               // to nearest, ties to even
  return bf16{uint16_t(word >> 16)};
}

inline float rsqrt(float value) { return 1.0f / std::sqrt(value); }
inline float exp(float value) { return std::exp(value); }
inline double log(double value) { return std::log(value); }
inline float quiet_nan() { return std::numeric_limits<float>::quiet_NaN(); }

namespace host {

constexpr int kWarp = 32;
// How long a barrier waits for the rest of its threads (tests of a missed barrier shorten it).
inline int barrier_seconds = 20;

// A reusable barrier for `count` threads that gives up (throws) after barrier_seconds.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}

  void wait(const char* what) {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      ++generation_;
      released_.notify_all();
      return;
    }
    if (!released_.wait_for(lock, std::chrono::seconds(barrier_seconds), [&] { return generation_ != generation; }))
      throw std::runtime_error(std::string("simt host emulation: ") + what + " waited " +
                               std::to_string(barrier_seconds) + " s for threads that never reached it (" +
                               std::to_string(arrived_) + " of " + std::to_string(count_) +
                               " arrived): a barrier not reached by every thread of the block");
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  const int count_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// What a thread of a launch knows about itself.
struct ThreadState {
  int thread = 0, block = 0, blocks = 0;
  Barrier* block_barrier = nullptr;
  Barrier* warp_barrier = nullptr;
  float* warp_slots = nullptr;  // kWarp floats, one per lane: shuffles pass values through them
};

inline thread_local ThreadState state;

}  // namespace host

inline int thread_index() { return host::state.thread; }
inline int block_index() { return host::state.block; }
inline int block_count() { return host::state.blocks; }
inline void sync_block() { host::state.block_barrier->wait("sync_block()"); }

inline float shuffle_xor(float value, int lane_mask) {
  const int lane = host::state.thread % host::kWarp;
  host::state.warp_slots[lane] = value;
  host::state.warp_barrier->wait("shuffle_xor()");
  const float out = host::state.warp_slots[(lane ^ lane_mask) % host::kWarp];
  host::state.warp_barrier->wait("shuffle_xor()");  // the slots are free again
  return out;
}

// Runs body() as every thread of `blocks` blocks of `threads` threads (a whole number of warps).
template <class Body>
void launch(int64_t blocks, int threads, Body&& body) {
  if (threads <= 0 || threads % host::kWarp != 0 || blocks <= 0)
    throw std::invalid_argument("simt host emulation: " + std::to_string(blocks) + " blocks of " +
                                std::to_string(threads) + " threads (a positive number of whole warps)");
  host::Barrier block_barrier(threads);
  std::vector<std::unique_ptr<host::Barrier>> warp_barriers;
  for (int w = 0; w < threads / host::kWarp; ++w) warp_barriers.push_back(std::make_unique<host::Barrier>(host::kWarp));
  std::vector<float> slots(static_cast<size_t>(threads));
  std::mutex failure_mutex;
  std::exception_ptr failure;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      host::state = host::ThreadState{t, 0, static_cast<int>(blocks), &block_barrier,
                                      warp_barriers[size_t(t / host::kWarp)].get(),
                                      slots.data() + (t / host::kWarp) * host::kWarp};
      try {
        for (int64_t b = 0; b < blocks; ++b) {
          host::state.block = static_cast<int>(b);
          body();
          block_barrier.wait("the end of a block");  // the next block reuses the shared arrays
        }
      } catch (...) {
        const std::lock_guard<std::mutex> lock(failure_mutex);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& thread : pool) thread.join();
  if (failure) std::rethrow_exception(failure);
}

// The kernels' dispatchers take a launch(kernel, blocks, threads, params); this one runs it here.
struct HostLaunch {
  template <class Kernel, class Params>
  void operator()(Kernel kernel, int64_t blocks, int threads, const Params& params) const {
    launch(blocks, threads, [&] { kernel(params); });
  }
};

}  // namespace extrap::simt
