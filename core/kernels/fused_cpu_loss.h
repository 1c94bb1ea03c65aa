// The training loss on the CPU in one pass over the logits each way: the summed cross-entropy
// of (N, V) logits, float32 or bfloat16, and its gradient.
//
// What it stands in for: LibTorch's cross_entropy is log_softmax (a (N, V) float32 tensor kept
// for the backward) and nll_loss; under autocast the bfloat16 logits are first copied to
// float32, and the backward fills a zero (N, V) gradient, scatters into it, runs log_softmax's
// backward and casts the result back: five passes over memory.
//
// Here the forward keeps each row's log-sum-exp (N floats) and the backward writes the
// gradient g (softmax(x) - onehot(target)) straight into the logits' dtype: the float32
// arithmetic of the reference, one read of the logits forward, one read and one write back.
// Rows whose target is ignore_index add nothing and get a zero gradient; any other target
// outside [0, V) is refused by value, as LibTorch's cross_entropy refuses it.
//
// On a GPU the same arithmetic runs as CUDA kernels (core/kernels/cuda/cross_entropy_kernels.cuh),
// with EXTRAP_GPU_NEW_ROUTES=1 until they have run on one (core/base/environment.h): the rows'
// losses summed on the device in a fixed order, the incoming gradient read on the device, so
// neither pass waits for the GPU (a CUDA graph holds them). There a target outside [0, V) cannot
// be refused without that wait: its row's loss and gradient are NaN, and the trainer stops on
// the non-finite loss (LibTorch's CUDA loss stops the process with a device assertion).
#pragma once

#include "core/kernels/cuda/cross_entropy_params.h"

#include <torch/torch.h>

#include <string>

namespace extrap {

// Empty when cross_entropy_sum() takes these inputs; otherwise why not.
std::string cross_entropy_sum_unsupported_reason(const torch::Tensor& logits, const torch::Tensor& targets);

// sum over rows i with targets[i] != ignore_index of -log softmax(logits[i])[targets[i]], as a
// float32 scalar, differentiable in logits. logits (N, V) float32 or bfloat16 on the CPU (or a
// GPU, above), targets (N) int64 on the same device.
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index);

// The CUDA kernels' entry points (core/kernels/cuda/cross_entropy_launch.h) on the current
// device's current stream, registered by libextrap_cuda.so when it loads; null until then.
struct CudaCrossEntropy {
  void (*forward)(const cuda::CrossEntropyForward& params);
  void (*backward)(const cuda::CrossEntropyBackward& params);
};
void register_cuda_cross_entropy(const CudaCrossEntropy& entry);
const CudaCrossEntropy* cuda_cross_entropy();

}  // namespace extrap
