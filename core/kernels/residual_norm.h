// The residual add and the norm after it, h = x + y and u = norm(h), in one pass over the rows
// on the CPU or a GPU, forward and backward. The norm (RowNorm) is a LayerNorm, u = (h -
// mean) / sqrt(var + eps) gamma + beta, or an RMSNorm (model.norm: rmsnorm), u = h / sqrt(mean(h^2)
// + eps) gamma + beta, each with or without its bias beta (model.bias).
//
// Unfused, LayerNorm's forward and backward, the residual adds and the float32 <-> bfloat16
// casts around them are each a separate pass over (B, T, d_model) with its own operator call
// and autograd node. Here the forward reads x and y once and writes h and u (u already in the
// dtype of the product that takes it, for the feed-forward LayerNorm under bf16 autocast); the
// backward reads dh, du and h once and writes dx and dy (dy in the dtype of y), with
// LayerNorm's weight and bias gradients summed alongside.
//
// Numbers: float32 throughout, the mean and variance of each row in two passes (mean, then the
// centred squares): LibTorch's layer_norm to float32 rounding, not bit for bit. y in bfloat16
// (an autocast linear layer's output) is widened exactly, as LibTorch's mixed add does; a
// bfloat16 u is float32's rounded to nearest even, as autocast's cast. Weight and bias
// gradients are summed in fixed blocks of rows, so they do not depend on the thread count (on a
// GPU: on the device's multiprocessor count).
//
// Taken while gradients are recorded, for float32 x with the norm's last dimension,
// contiguous, with a norm weight, unless EXTRAP_FUSED_LAYER_NORM=0 (for A/B runs): on the
// CPU, and on a GPU (the same arithmetic as CUDA kernels, core/kernels/cuda/, rows of up to 4096)
// with EXTRAP_GPU_NEW_ROUTES=1 until they have run on one (core/base/environment.h). Everything
// else (evaluation, other devices) runs x + y and the norm's reference (norm_reference). No double
// backward (create_graph): refused by name.
#pragma once

#include "core/kernels/cuda/residual_norm_params.h"

#include <torch/torch.h>

#include <tuple>
#include <utility>

namespace extrap {

// A norm over the last dimension of its input, as the row loops take it: the weight gamma (D),
// the bias beta (D, or undefined: none), eps, and whether it is an RMSNorm (no mean subtracted)
// or a LayerNorm. core/model/norm.h's Norm module hands its parts over as one; a
// torch::nn::LayerNorm converts to one too.
struct RowNorm {
  torch::Tensor weight, bias;  // either may be undefined: no weight (1), no bias (0)
  double eps = 1e-5;
  bool rms = false;
  RowNorm() = default;
  RowNorm(torch::Tensor weight, torch::Tensor bias, double eps, bool rms)
      : weight(std::move(weight)), bias(std::move(bias)), eps(eps), rms(rms) {}
  RowNorm(const torch::nn::LayerNorm& norm)  // NOLINT: implicit, as the LayerNorm it describes
      : weight(norm->weight), bias(norm->bias), eps(norm->options.eps()), rms(false) {}
};

// The norm with LibTorch's operators, in x's dtype: what the fused path computes, and what runs
// where it does not (evaluation, other dtypes).
torch::Tensor norm_reference(const torch::Tensor& x, const RowNorm& norm);

// {h, u}: h = x + y (x itself where y is undefined), u = norm(h) in float32, or in `u_dtype`
// where the fused path takes it (bfloat16 is for a layer-norm output that only a linear layer
// under bf16 autocast reads: the cast it saves is the one autocast would make).
std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& y,
                                                       const RowNorm& norm,
                                                       torch::ScalarType u_dtype = torch::kFloat32);

// {h, u, u_low}: add_layer_norm()'s h and float32 u, and under bf16 autocast on the fused path
// u_low, u rounded to bfloat16 in the same pass (the cast autocast would make for a linear
// layer reading u); undefined elsewhere. For a u read both by a bf16 product (u_low) and by
// code that wants float32 (the attention's LayerNorm: position methods read its output). The
// backward adds the two gradients in its row loop: no cast of u forward, none of its gradient
// backward.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> add_layer_norm_with_copy(const torch::Tensor& x,
                                                                                const torch::Tensor& y,
                                                                                const RowNorm& norm);

// Whether add_layer_norm() takes these through the fused path now.
bool add_layer_norm_fused_takes(const torch::Tensor& x, const torch::Tensor& y, const RowNorm& norm);

// EXTRAP_FUSED_LAYER_NORM, read once; throws ConfigError for a value other than 0 or 1 (the CLI
// reads it at start).
bool fused_layer_norm_switched_on();

// The CUDA kernels' entry points (core/kernels/cuda/residual_norm_launch.h) on the current
// device's current stream, registered by libextrap_cuda.so when it loads
// (core/runtime/cuda_support.h); null until then.
struct CudaAddLayerNorm {
  void (*forward)(const cuda::AddLayerNormForward& params);
  void (*backward)(const cuda::AddLayerNormBackward& params);
  int64_t (*backward_blocks)(int64_t rows, int device);
};
void register_cuda_add_layer_norm(const CudaAddLayerNorm& entry);
const CudaAddLayerNorm* cuda_add_layer_norm();

}  // namespace extrap
