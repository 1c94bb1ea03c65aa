// cuDNN's fused attention, causal, with its ALiBi mask, its diagonal band (a sliding window), or
// both, through the cuDNN frontend's graph API (built into libextrap_cuda.so where the frontend's
// headers were found, EXTRAP_CUDNN_FRONTEND; the route table, core/attention/gpu_routes.h, sends it
// the paper's causal ALiBi and causal windows of no bias).
//
// cuDNN adds m_h * (j - i) to the scaled scores q_i . k_j / sqrt(D) of a causal call, with m_h the
// paper's slopes for H heads, which cuDNN computes itself: the call takes no slope tensor, and
// returns no slope gradient. A window W keeps keys j > i - W (extrap's `attention.window`:
// |i - j| < W). Forward and backward are cuDNN graphs built once per shape, layout, mask and
// device and cached (a graph first needed inside a CUDA graph capture is refused, so the capture
// takes another route rather than building plans mid-capture); execution is on the current
// stream with a workspace from LibTorch's caching allocator.
#pragma once

#include "core/attention/attention.h"

#include <torch/torch.h>

#include <string>
#include <vector>

// Its source is compiled with hidden visibility; these stay visible (the tests call them).
#define EXTRAP_CUDNN_API __attribute__((visibility("default")))

namespace extrap {

// "" if cudnn_attention() takes q, k, v (B, H, T, D) with this bias: one CUDA device, bfloat16
// or float16, D a multiple of 8 up to 128, T >= 1, a causal call, a bias of kind none or linear
// (the ALiBi mask: the route table checks the slopes are the paper's) with no option but a window,
// and cuDNN graphs that build on this GPU with this cuDNN.
EXTRAP_CUDNN_API std::string cudnn_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k,
                                                      const torch::Tensor& v, const AttentionBias& bias,
                                                      bool causal);

// Causal attention with the paper's ALiBi (`alibi`) and a window of `window` keys (0: none);
// differentiable in q, k, v. Returns (B, H, T, D) contiguous, q's dtype.
EXTRAP_CUDNN_API torch::Tensor cudnn_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                               bool alibi, int64_t window);

// The slopes cuDNN's ALiBi mask uses for `heads` heads (what tests compare with the paper's).
EXTRAP_CUDNN_API std::vector<float> cudnn_alibi_slopes(int64_t heads);

// "cuDNN 9.x.y, frontend 1.a.b" (the cuDNN loaded, the frontend compiled in).
EXTRAP_CUDNN_API std::string cudnn_description();

}  // namespace extrap
