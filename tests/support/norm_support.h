// A LayerNorm with a random weight near 1 and a random bias, for the residual-norm tests (CPU and
// CUDA): LibTorch's initial weight 1 and bias 0 would hide a kernel that drops either.
#pragma once

#include <torch/torch.h>

namespace extrap::testing {

inline torch::nn::LayerNorm random_layer_norm(int64_t D) {
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({D}));
  torch::NoGradGuard no_grad;
  norm->weight.copy_(1 + 0.5 * torch::randn({D}));
  norm->bias.copy_(0.5 * torch::randn({D}));
  return norm;
}

}  // namespace extrap::testing
