#include "core/kernels/cuda/cross_entropy_kernels.cuh"
#include "core/kernels/cuda/cross_entropy_launch.h"
#include "core/kernels/cuda/stream_launch.cuh"

namespace extrap::cuda {

void cross_entropy_forward(const CrossEntropyForward& params, cudaStream_t stream) {
  dispatch_cross_entropy_forward(params, StreamLaunch{stream, "cross_entropy"});
}

void cross_entropy_backward(const CrossEntropyBackward& params, cudaStream_t stream) {
  dispatch_cross_entropy_backward(params, StreamLaunch{stream, "cross_entropy"});
}

}  // namespace extrap::cuda
