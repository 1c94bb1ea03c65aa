// ProcessGroupNCCL for data-parallel runs on GPUs. Built into libextrap_cuda.so, not
// libextrap.so, since it needs LibTorch's CUDA half (core/runtime/cuda_support.h); it registers
// itself with core/runtime/distributed.h when that library loads.
#include "core/runtime/distributed.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

namespace extrap {

namespace {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world_size,
                                                    std::chrono::milliseconds timeout) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, options);
}

const bool registered_nccl = [] {
  register_nccl_backend(&make_nccl_backend);
  return true;
}();

}  // namespace

}  // namespace extrap
