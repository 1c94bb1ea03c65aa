// The plain C++ entry points of the CUDA residual add and LayerNorm (residual_norm_kernels.cuh).
// No torch: the LibTorch side (residual_norm_wrapper.cpp) fills the parameters.
//
// Both queue work on `stream` and return without waiting; they throw std::invalid_argument for a
// row width the kernels do not take (above kAddLayerNormMaxWidth) and std::runtime_error for a
// failed launch.
#pragma once

#include "core/kernels/cuda/residual_norm_params.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace extrap::cuda {

void add_layer_norm_forward(const AddLayerNormForward& params, cudaStream_t stream);
void add_layer_norm_backward(const AddLayerNormBackward& params, cudaStream_t stream);

// The backward's block count for `rows` rows on `device`: eight blocks a multiprocessor (each
// then walks rows / blocks rows), at most `rows`. Fixed per device and row count, so are the
// weight gradients' sums.
int64_t add_layer_norm_backward_blocks(int64_t rows, int device);

}  // namespace extrap::cuda
