// Registers the CUDA training loss with core/kernels/fused_cpu_loss.h when libextrap_cuda.so
// loads: the kernels' entry points on the current device's current stream.
#include "core/kernels/cuda/cross_entropy_launch.h"
#include "core/kernels/fused_cpu_loss.h"

#include <ATen/cuda/CUDAContext.h>

namespace extrap {

namespace {

void cross_entropy_forward_on_current_stream(const cuda::CrossEntropyForward& params) {
  cuda::cross_entropy_forward(params, at::cuda::getCurrentCUDAStream().stream());
}

void cross_entropy_backward_on_current_stream(const cuda::CrossEntropyBackward& params) {
  cuda::cross_entropy_backward(params, at::cuda::getCurrentCUDAStream().stream());
}

const bool registered_cross_entropy = [] {
  register_cuda_cross_entropy({&cross_entropy_forward_on_current_stream, &cross_entropy_backward_on_current_stream});
  return true;
}();

}  // namespace

}  // namespace extrap
