// Registers the CUDA residual add and LayerNorm with core/kernels/residual_norm.h when
// libextrap_cuda.so loads: the kernels' entry points on the current device's current stream.
#include "core/kernels/cuda/residual_norm_launch.h"
#include "core/kernels/residual_norm.h"

#include <ATen/cuda/CUDAContext.h>

namespace extrap {

namespace {

void forward_on_current_stream(const cuda::AddLayerNormForward& params) {
  cuda::add_layer_norm_forward(params, at::cuda::getCurrentCUDAStream().stream());
}

void backward_on_current_stream(const cuda::AddLayerNormBackward& params) {
  cuda::add_layer_norm_backward(params, at::cuda::getCurrentCUDAStream().stream());
}

const bool registered_add_layer_norm = [] {
  register_cuda_add_layer_norm({&forward_on_current_stream, &backward_on_current_stream,
                                &cuda::add_layer_norm_backward_blocks});
  return true;
}();

}  // namespace

}  // namespace extrap
