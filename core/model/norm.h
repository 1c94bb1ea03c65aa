// The model's norms: a LayerNorm or an RMSNorm (model.norm) over the last dimension, with a weight
// and, unless model.bias is false, a bias. Its parameters are `weight` and `bias`, as
// torch::nn::LayerNorm's, so that checkpoints of runs before model.norm load as they were. The
// fused residual-add kernels (core/kernels/residual_norm.h) take it as a RowNorm; forward() is
// the same norm with LibTorch's operators.
#pragma once

#include "core/kernels/residual_norm.h"
#include "core/model/config.h"

#include <torch/torch.h>

namespace extrap {

struct NormOptions {
  NormOptions(int64_t width, NormKind kind, double eps, bool bias) : width_(width), kind_(kind), eps_(eps), bias_(bias) {}
  // The norms model.norm, model.norm_eps and model.norm_bias describe, over `width` values.
  static NormOptions of(const ModelConfig& model, int64_t width) {
    return NormOptions(width, model.norm, model.norm_eps, model.norm_biased());
  }
  TORCH_ARG(int64_t, width);
  TORCH_ARG(NormKind, kind);
  TORCH_ARG(double, eps);
  TORCH_ARG(bool, bias);
};

class NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  explicit NormImpl(NormOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);  // (..., width) -> (..., width)
  RowNorm row_norm() const;

  NormOptions options;
  torch::Tensor weight;  // (width), 1 at the start
  torch::Tensor bias;    // (width), 0 at the start; undefined without a bias
};
TORCH_MODULE(Norm);

}  // namespace extrap
