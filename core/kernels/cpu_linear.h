// Linear layers on the CPU through oneDNN's matrix products, float32 and under bf16 autocast.
//
// LibTorch runs a float32 linear on the CPU through MKL's sgemm, and MKL takes its AVX2 path on
// AMD CPUs whatever they support, where oneDNN (which LibTorch carries) picks its kernels by
// the CPU's features: on an AMD CPU with AVX-512 the model's products run much faster through
// oneDNN, with float32 rounding errors of the same size (benchmarks/RESULTS.md, part 3).
// PyTorch offers oneDNN for float32 products only with allow_tf32/bf16-style reduced
// precision; here it is exact float32 arithmetic in another order.
//
// linear() is torch::linear with the forward product and the input gradient (x W^T + b and
// g W) through oneDNN, and the weight gradient g^T x: on an Intel CPU through MKL's mm, which
// takes g^T as it lies and runs AVX-512 there; elsewhere through oneDNN with the smaller of its
// two sizes as the output's rows, the layout oneDNN runs well (a deep product with a square
// output gains nothing there, so those stay with MKL). The float32 training step is mostly
// matrix products, so it moves with them.
//
// It takes float32 CPU tensors outside autocast, where oneDNN is compiled in, keeps float32
// arithmetic (ONEDNN_DEFAULT_FPMATH_MODE unset or STRICT), extrap's kernels run AVX-512
// (core/runtime/cpu_isa.h: on AVX2 paths, an AVX2-only CPU or a capped one, oneDNN's float32
// products are slower than MKL's, which LibTorch's linear then runs) and it is not switched
// off (EXTRAP_ONEDNN_LINEAR=0, for A/B runs).
//
// Under the CPU's bf16 autocast, on a CPU with AVX512_BF16 or AMX, it runs the same operator in
// bfloat16 with the casts autocast would make (x, the weight and the bias to bfloat16, the
// output bfloat16). What it saves against autocast's addmm: the bias is added in the product's
// epilogue instead of being copied into the output first, the weight and bias are cast
// inside the product and their gradients come back in float32 from it (no cast nodes), the bias
// gradient is summed in float32 straight from the bfloat16 gradient (LibTorch's sum with a
// float32 dtype copies it first), and the weight gradient avoids the operator's copy of g^T.
// Everything else goes to torch::linear. No double backward (create_graph): refused by name.
#pragma once

#include <torch/torch.h>

namespace extrap {

// x (..., K), weight (M, K), bias (M) or undefined -> (..., M); differentiable in all three.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias);

// Whether linear() takes these through oneDNN in float32 (else torch::linear).
bool onednn_linear_takes(const torch::Tensor& x, const torch::Tensor& weight);
// Whether linear() takes these through oneDNN in bfloat16: under the CPU's bf16 autocast, on a
// CPU with AVX512_BF16 or AMX, unless EXTRAP_ONEDNN_LINEAR=0.
bool onednn_bf16_linear_takes(const torch::Tensor& x, const torch::Tensor& weight);

// oneDNN's products as LibTorch registers them (mkldnn::_linear_pointwise), float32 or bfloat16
// (all operands of one dtype), for core/kernels/gelu_linear.h and this file. Need
// onednn_products_available().
bool onednn_products_available();
// x (N, K), w (M, K) any strides, b (M) or undefined -> x w^T + b (N, M); times `multiplier`
// (N, M) element-wise in the product's epilogue when it is defined.
torch::Tensor onednn_product(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                             const torch::Tensor& multiplier = {});
// g (N, M), x (N, K) -> g^T x (M, K), a linear layer's weight gradient: in float32 on an Intel
// CPU LibTorch's mm (MKL); elsewhere with the smaller of M and K as the product's rows (a square
// one through LibTorch's mm).
torch::Tensor onednn_weight_gradient(const torch::Tensor& g, const torch::Tensor& x);

// g (N, M) -> a linear layer's bias gradient, g's column sums: for bfloat16 g in float32 (summed
// in float32, in fixed row blocks), otherwise g.sum(0).
torch::Tensor linear_bias_gradient(const torch::Tensor& g);

// EXTRAP_ONEDNN_LINEAR, read once; throws ConfigError for a value other than 0 or 1 (the CLI
// reads it at start, so that a bad value is the command's one-line error).
bool onednn_linear_switched_on();

}  // namespace extrap
