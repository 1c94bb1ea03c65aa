// Which kernel computes an attention call on a GPU: the one table, per bias kind, that the
// dispatcher (core/attention/attention.cpp) follows for CUDA tensors under the `auto` backend.
//
//   bias                                  route          why
//   none (no options)                     sdpa           LibTorch's scaled_dot_product_attention:
//                                                        cuDNN on Hopper, flash elsewhere
//   causal: the paper's ALiBi, a         cudnn          cuDNN's fused attention with its ALiBi
//   window (none or the paper's ALiBi                    mask and diagonal band (forward and
//   with `attention.window`), or both                    backward), where built
//   other linear biases (learned slopes   extrap-fused   extrap's kernels: the only ones that take
//   and their gradients, symmetric,                      per-head slopes and return their gradient
//   nonsymmetric, the paper's slopes
//   without cuDNN)
//   dense biases of j - i alone (T5,      extrap-fused   extrap's kernels, reading a per-head table
//   KERPLE, Sandwich: by_offset)                         of the call's offsets; its gradient too
//   everything else (FIRE, the other      reference      T x T scores in float32
//   biases with a window, chunk, sink,
//   logit scale, attention dropout with
//   a bias, ...)
//
// Until they have run on a GPU (issue 66), the routes written on 2026-11-28 without one (SDPA,
// cuDNN's, extrap's kernels for dense biases of j - i) are opt-in:
// EXTRAP_GPU_NEW_ROUTES=1 takes them; unset (or 0), a call goes where it went before: no bias
// and the paper's ALiBi to extrap's kernels, dense biases and windows to the reference.
//
// Each row falls to the next one that takes the call (the paper's ALiBi to extrap's kernels,
// those to the reference), and every choice carries the reason the faster routes passed: what
// `extrap bench attention --device cuda --impls auto` and docs/performance.md print. The table
// is pure logic over the call's description and the kernels present, so it is tested on any
// machine (tests/attention/test_gpu_routes.cpp); every route is tested against the float64
// reference on a GPU (tests/attention/test_fused_cuda_attention.cpp).
#pragma once

#include "core/attention/attention.h"

#include <torch/torch.h>

#include <functional>
#include <string>

namespace extrap {

enum class GpuRoute { Sdpa, Cudnn, ExtrapFused, Reference };

inline const char* to_string(GpuRoute route) {
  switch (route) {
    case GpuRoute::Sdpa: return "sdpa";
    case GpuRoute::Cudnn: return "cudnn";
    case GpuRoute::ExtrapFused: return "extrap-fused";
    case GpuRoute::Reference: return "reference";
  }
  return "?";
}

// The kernels a process has for CUDA tensors. Each function returns "" where it takes the call
// (bfloat16 or float16 q, k, v already), else why not; a null function: not built or not loaded.
struct GpuKernels {
  using Reason = std::function<std::string(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                           const AttentionBias& bias, bool causal)>;
  Reason cudnn;         // cuDNN's fused attention, ALiBi and band masks (core/attention/cuda/cudnn_attention.h)
  Reason extrap_fused;  // extrap's fused kernels (core/attention/cuda/fused_attention.h)
  // Whether the routes not yet run on a GPU are taken (EXTRAP_GPU_NEW_ROUTES, above).
  bool new_routes = false;
};

// What this process has: the functions libextrap_cuda.so registered (core/attention/cuda_attention.h).
GpuKernels gpu_kernels_present();

struct GpuRouteChoice {
  GpuRoute route = GpuRoute::Reference;
  // Why each faster route passed, "; "-separated ("" for the first row's route).
  std::string passed_over;
};

// The route for q, k, v (B, H, T, D) as they would reach the kernels (under train.precision bf16
// their bfloat16 copies) and `bias` under `options`. Queries must equal keys (fewer queries,
// decoding with a KV cache, is the reference's).
GpuRouteChoice choose_gpu_route(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const AttentionBias& bias, const AttentionOptions& options,
                                const GpuKernels& kernels);

}  // namespace extrap
