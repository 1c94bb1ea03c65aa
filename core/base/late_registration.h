// Entry points that a library loaded after libextrap registers (libextrap_cuda.so's kernels, when
// core/runtime/cuda_support.h loads it): null until then, the registered copy after.
#pragma once

#include <atomic>

namespace extrap {

template <class Entry>
class LateRegistration {
 public:
  void set(const Entry& entry) {
    entry_ = entry;
    present_.store(true, std::memory_order_release);
  }
  const Entry* get() const { return present_.load(std::memory_order_acquire) ? &entry_ : nullptr; }

 private:
  Entry entry_{};
  std::atomic<bool> present_{false};
};

}  // namespace extrap
