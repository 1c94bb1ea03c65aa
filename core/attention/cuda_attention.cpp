#include "core/attention/cuda_attention.h"

#include <atomic>

namespace extrap {

namespace {

CudaAttention registered{};
std::atomic<bool> present{false};

}  // namespace

void register_cuda_attention(const CudaAttention& entry) {
  registered = entry;
  present.store(true, std::memory_order_release);
}

const CudaAttention* cuda_attention() {
  return present.load(std::memory_order_acquire) ? &registered : nullptr;
}

}  // namespace extrap
