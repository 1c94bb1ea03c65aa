// Registers the CUDA training loss with core/kernels/fused_cpu_loss.h when libextrap_cuda.so
// loads: the kernels' entry points on the current device's current stream.
#include "core/kernels/cuda/cross_entropy_launch.h"
#include "core/kernels/cuda/current_stream.h"
#include "core/kernels/fused_cpu_loss.h"

namespace extrap {

namespace {

const bool registered_cross_entropy = [] {
  register_cuda_cross_entropy({&cuda::on_current_stream<cuda::CrossEntropyForward, &cuda::cross_entropy_forward>,
                               &cuda::on_current_stream<cuda::CrossEntropyBackward, &cuda::cross_entropy_backward>});
  return true;
}();

}  // namespace

}  // namespace extrap
