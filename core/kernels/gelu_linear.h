// The feed-forward block's second half, linear(gelu(a), W, b), on the CPU with GELU's backward
// folded into a matrix product.
//
// Unfused, GELU's backward is a oneDNN pass of its own, costlier than the matrix product
// beside it (benchmarks/RESULTS.md, part 4): it reads a (saved since the forward, out of cache
// by then) and dG, evaluating erf and exp again.
//
// Here the forward's one pass over a writes both gelu(a) and its slope gelu'(a) (the erf and
// the exp that GELU's value needs give its slope too, for a few more operations), and the
// backward's dA = (dY W) o gelu'(a) is one oneDNN product with the multiply in its epilogue
// (mkldnn::_linear_pointwise.binary), so there is no separate GELU backward pass.
//
// Numbers: GELU is the exact (erf) form, erf by Abramowitz and Stegun 7.1.26 (absolute error
// below 1.5e-7, the formula of ATen's vectorised erf), evaluated in float32. Under bf16
// autocast the products take bfloat16 operands as autocast's linear does (a, the cast weight
// and bias; float32 accumulation; bfloat16 output), and the slope is rounded to bfloat16 as the
// epilogue's operand: dA is rounded twice (slope, product) where LibTorch's gelu_backward
// rounds once, an error of the order of bfloat16's own. The bias gradient is summed in float32.
//
// Taken while gradients are recorded, on the CPU, unless EXTRAP_FUSED_GELU=0 (for A/B runs):
// float32 when core/kernels/cpu_linear.h takes the layer through oneDNN, bfloat16 under bf16 autocast
// on a CPU with AVX512_BF16. Everything else (evaluation, GPUs, other dtypes) runs
// torch::gelu and then the linear layer. No double backward (create_graph): refused by name.
#pragma once

#include <torch/torch.h>

namespace extrap {

// linear(gelu(a), weight, bias): a (..., K), weight (M, K), bias (M) or undefined -> (..., M);
// differentiable in all three.
torch::Tensor gelu_linear(const torch::Tensor& a, const torch::Tensor& weight, const torch::Tensor& bias);

// Whether gelu_linear() takes these through the fused path now.
bool gelu_linear_fused_takes(const torch::Tensor& a, const torch::Tensor& weight);

// GELU's value and slope at x, as the fused path computes them (float32): exposed for tests.
void gelu_with_slope(const float* x, float* value, float* slope, int64_t n);

// EXTRAP_FUSED_GELU, read once; throws ConfigError for a value other than 0 or 1 (the CLI reads
// it at start).
bool fused_gelu_switched_on();

}  // namespace extrap
