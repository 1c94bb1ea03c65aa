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
#pragma once

#include <torch/torch.h>

#include <string>

namespace extrap {

// Empty when cross_entropy_sum() takes these inputs; otherwise why not.
std::string cross_entropy_sum_unsupported_reason(const torch::Tensor& logits, const torch::Tensor& targets);

// sum over rows i with targets[i] != ignore_index of -log softmax(logits[i])[targets[i]], as a
// float32 scalar, differentiable in logits. logits (N, V) float32 or bfloat16 on the CPU,
// targets (N) int64.
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets, int64_t ignore_index);

}  // namespace extrap
