#include "core/kernels/cuda/residual_norm_kernels.cuh"
#include "core/kernels/cuda/residual_norm_launch.h"
#include "core/kernels/cuda/stream_launch.cuh"

#include <cuda_runtime.h>

#include <atomic>
#include <stdexcept>
#include <string>

namespace extrap::cuda {

namespace {

constexpr int kMaxDevices = 64;

}  // namespace

void add_layer_norm_forward(const AddLayerNormForward& params, cudaStream_t stream) {
  dispatch_add_layer_norm_forward(params, StreamLaunch{stream, "add_layer_norm"});
}

void add_layer_norm_backward(const AddLayerNormBackward& params, cudaStream_t stream) {
  dispatch_add_layer_norm_backward(params, StreamLaunch{stream, "add_layer_norm"});
}

int64_t add_layer_norm_backward_blocks(int64_t rows, int device) {
  // Read once a device (the first backward runs eagerly, before any CUDA graph capture).
  static std::atomic<int> processors_of[kMaxDevices];
  if (device < 0 || device >= kMaxDevices)
    throw std::invalid_argument("add_layer_norm on CUDA: device " + std::to_string(device) + " (0 to " +
                                std::to_string(kMaxDevices - 1) + ")");
  int processors = processors_of[device].load(std::memory_order_relaxed);
  if (processors == 0) {
    const cudaError_t status = cudaDeviceGetAttribute(&processors, cudaDevAttrMultiProcessorCount, device);
    if (status != cudaSuccess)
      throw std::runtime_error(std::string("add_layer_norm on CUDA: multiprocessor count of device ") +
                               std::to_string(device) + ": " + cudaGetErrorString(status));
    processors_of[device].store(processors, std::memory_order_relaxed);
  }
  const int64_t blocks = int64_t(processors) * 8;
  return rows < blocks ? rows : blocks;
}

}  // namespace extrap::cuda
