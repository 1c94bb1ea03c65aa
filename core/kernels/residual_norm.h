// The residual add and the LayerNorm after it, h = x + y and u = layer_norm(h), in one pass
// over the rows on the CPU or a GPU, forward and backward.
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
// Taken while gradients are recorded, for float32 x with the LayerNorm's last dimension,
// contiguous, with an affine LayerNorm, unless EXTRAP_FUSED_LAYER_NORM=0 (for A/B runs): on the
// CPU, and on a GPU (the same arithmetic as CUDA kernels, core/kernels/cuda/, rows of up to 4096)
// with EXTRAP_GPU_NEW_ROUTES=1 until they have run on one (core/base/environment.h). Everything
// else (evaluation, other devices) runs x + y and the LayerNorm module. No double backward
// (create_graph): refused by name.
#pragma once

#include "core/kernels/cuda/residual_norm_params.h"

#include <torch/torch.h>

#include <tuple>
#include <utility>

namespace extrap {

// {h, u}: h = x + y (x itself where y is undefined), u = norm(h) in float32, or in `u_dtype`
// where the fused path takes it (bfloat16 is for a layer-norm output that only a linear layer
// under bf16 autocast reads: the cast it saves is the one autocast would make).
std::pair<torch::Tensor, torch::Tensor> add_layer_norm(const torch::Tensor& x, const torch::Tensor& y,
                                                       const torch::nn::LayerNorm& norm,
                                                       torch::ScalarType u_dtype = torch::kFloat32);

// {h, u, u_low}: add_layer_norm()'s h and float32 u, and under bf16 autocast on the fused path
// u_low, u rounded to bfloat16 in the same pass (the cast autocast would make for a linear
// layer reading u); undefined elsewhere. For a u read both by a bf16 product (u_low) and by
// code that wants float32 (the attention's LayerNorm: position methods read its output). The
// backward adds the two gradients in its row loop: no cast of u forward, none of its gradient
// backward.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> add_layer_norm_with_copy(const torch::Tensor& x,
                                                                                const torch::Tensor& y,
                                                                                const torch::nn::LayerNorm& norm);

// Whether add_layer_norm() takes these through the fused path now.
bool add_layer_norm_fused_takes(const torch::Tensor& x, const torch::Tensor& y, const torch::nn::LayerNorm& norm);

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
