// The model's norms: a LayerNorm or an RMSNorm (model.norm) over the last dimension, with a weight
// and, unless model.bias is false, a bias; with model.norm_affine false, neither (OLMo's LayerNorm:
// x normalised alone, no parameters). Its parameters are `weight` and `bias`, as
// torch::nn::LayerNorm's, so that checkpoints of runs before model.norm load as they were. The
// fused residual-add kernels (core/kernels/residual_norm.h) take it as a RowNorm; forward() is
// the same norm with LibTorch's operators.
#pragma once

#include "core/kernels/residual_norm.h"
#include "core/model/config.h"

#include <torch/torch.h>

namespace extrap {

struct NormOptions {
  NormOptions(int64_t width, NormKind kind, double eps, bool bias, bool affine = true)
      : width_(width), kind_(kind), eps_(eps), bias_(bias && affine), affine_(affine) {}
  // The norms model.norm, model.norm_eps, model.norm_bias and model.norm_affine describe, over `width` values.
  static NormOptions of(const ModelConfig& model, int64_t width) {
    return NormOptions(width, model.norm, model.norm_eps, model.norm_biased(), model.norm_affine);
  }
  TORCH_ARG(int64_t, width);
  TORCH_ARG(NormKind, kind);
  TORCH_ARG(double, eps);
  TORCH_ARG(bool, bias);
  TORCH_ARG(bool, affine);  // false: no weight and no bias
};

class NormImpl : public torch::nn::Cloneable<NormImpl> {
 public:
  explicit NormImpl(NormOptions options);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);  // (..., width) -> (..., width)
  RowNorm row_norm() const;

  NormOptions options;
  torch::Tensor weight;  // (width), 1 at the start; undefined without parameters (affine false)
  torch::Tensor bias;    // (width), 0 at the start; undefined without a bias
};
TORCH_MODULE(Norm);

}  // namespace extrap
