// The plain C++ entry points of the CUDA training loss (cross_entropy_kernels.cuh). No torch: the
// LibTorch side (cross_entropy_wrapper.cpp) fills the parameters.
//
// Both queue work on `stream` and return without waiting; a failed launch throws
// std::runtime_error.
#pragma once

#include "core/kernels/cuda/cross_entropy_params.h"

#include <cuda_runtime_api.h>

namespace extrap::cuda {

void cross_entropy_forward(const CrossEntropyForward& params, cudaStream_t stream);
void cross_entropy_backward(const CrossEntropyBackward& params, cudaStream_t stream);

}  // namespace extrap::cuda
