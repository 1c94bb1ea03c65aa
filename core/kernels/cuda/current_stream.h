// A kernel's launch function, `Launch(params, stream)`, as an entry point that takes only its
// parameters and launches on the current device's current stream: what the wrappers of
// libextrap_cuda.so register with libextrap (the training loss, the residual add and LayerNorm),
// which links no CUDA symbol and so cannot ask for a stream itself.
#pragma once

#include <ATen/cuda/CUDAContext.h>

namespace extrap::cuda {

template <typename Params, void (*Launch)(const Params&, cudaStream_t)>
void on_current_stream(const Params& params) {
  Launch(params, at::cuda::getCurrentCUDAStream().stream());
}

}  // namespace extrap::cuda
