// The dispatchers' launch (residual_norm_kernels.cuh, cross_entropy_kernels.cuh) on a CUDA stream:
// launch(kernel, blocks, threads, params) starts kernel<<<blocks, threads, 0, stream>>>(params)
// and throws std::runtime_error, naming `what`, if the launch failed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace extrap::cuda {

struct StreamLaunch {
  cudaStream_t stream;
  const char* what;
  template <class Kernel, class Params>
  void operator()(Kernel kernel, int64_t blocks, int threads, const Params& params) const {
    kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(params);
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess)
      throw std::runtime_error(std::string(what) + " on CUDA: launch failed: " + cudaGetErrorString(status));
  }
};

}  // namespace extrap::cuda
