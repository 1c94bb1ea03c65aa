// Registers the CUDA residual add and LayerNorm with core/kernels/residual_norm.h when
// libextrap_cuda.so loads: the kernels' entry points on the current device's current stream.
#include "core/kernels/cuda/current_stream.h"
#include "core/kernels/cuda/residual_norm_launch.h"
#include "core/kernels/residual_norm.h"

namespace extrap {

namespace {

const bool registered_add_layer_norm = [] {
  register_cuda_add_layer_norm({&cuda::on_current_stream<cuda::AddLayerNormForward, &cuda::add_layer_norm_forward>,
                                &cuda::on_current_stream<cuda::AddLayerNormBackward, &cuda::add_layer_norm_backward>,
                                &cuda::add_layer_norm_backward_blocks});
  return true;
}();

}  // namespace

}  // namespace extrap
