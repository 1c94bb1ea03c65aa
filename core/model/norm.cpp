#include "core/model/norm.h"

namespace extrap {

NormImpl::NormImpl(NormOptions options_) : options(std::move(options_)) { reset(); }

void NormImpl::reset() {
  if (!options.affine()) return;
  weight = register_parameter("weight", torch::ones({options.width()}));
  if (options.bias()) bias = register_parameter("bias", torch::zeros({options.width()}));
}

RowNorm NormImpl::row_norm() const { return RowNorm(weight, bias, options.eps(), options.kind() == NormKind::rmsnorm); }

torch::Tensor NormImpl::forward(const torch::Tensor& x) { return norm_reference(x, row_norm()); }

}  // namespace extrap
