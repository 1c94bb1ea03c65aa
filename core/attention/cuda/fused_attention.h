// The fused CUDA attention as a LibTorch autograd function (built only with a CUDA-enabled
// LibTorch, into libextrap_cuda.so; the rest of extrap reaches it through
// core/attention/cuda_attention.h, where it registers these functions when it loads).
//
// fused_attention() takes the same bias *description* as every other backend and hands the
// kernels slopes, never an N x N tensor:
//   - AttentionBias::None                -> no bias (causal mask if `causal`)
//   - AttentionBias::Linear, slopes that do not require grad: the head directions decide the
//     kernel mode (all heads left only -> ALiBi causal; all both -> ALiBi symmetric; first
//     half left only and second half right only -> ALiBi nonsymmetric; anything else ->
//     general linear); slopes are read from the given tensors (fp32 copies on the device)
//   - AttentionBias::Linear, slopes requiring grad (learned ALiBi): general linear mode, and
//     backward returns dL/dslopes_left and dL/dslopes_right
//   - AttentionBias::Dense described by offset (by_offset: T5, KERPLE, Sandwich): the kernels
//     read the bias from a per-head table of the offsets j - i the call reaches, computed once
//     per call by by_offset, and backward returns the table's gradient through it (so a
//     learned table trains); other dense biases (FIRE) are not supported.
// fused_attention_alibi() is the paper's ALiBi with the geometric slopes computed inside the
// kernel from the head index: no slope tensor at all. (Deciding that automatically from an
// AttentionBias would mean comparing device slopes on the host every call; position methods
// that want it call cuda_attention()->alibi.)
#pragma once

#include "core/attention/attention.h"
#include "core/attention/cuda/flash_params.h"
#include "core/attention/cuda_attention.h"

#include <torch/torch.h>

#include <string>
#include <utility>

namespace extrap {

// "" if fused_attention() can run this call, else why not (dtype, head dim, device, bias).
std::string fused_attention_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v, const AttentionBias& bias,
                                               bool causal);

// q, k, v: (B, H, T, D) on one CUDA device, bf16 or fp16, D = 64 or 128, any T >= 1, last
// dimension contiguous (other layouts are copied). Returns (B, H, T, D). Differentiable in
// q, k, v and in the bias slopes that require grad.
torch::Tensor fused_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const AttentionBias& bias, bool causal);

// The paper's ALiBi, slopes computed in the kernel (Nonsymmetric needs an even head count).
torch::Tensor fused_attention_alibi(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, FusedAlibiLayout layout, bool causal);

// The slopes the kernel computes for `layout`: (left, right), (heads,) fp32 on `device`;
// left[h] serves keys j <= i, right[h] keys j > i, 0 where head h does not look.
std::pair<torch::Tensor, torch::Tensor> fused_alibi_geometric_slopes(FusedAlibiLayout layout,
                                                                     int64_t heads,
                                                                     torch::Device device);

namespace fused_detail {

// How one call's bias reaches the kernels. Slope tensors are fp32, contiguous, on the
// device of q (undefined for in-kernel slopes); slope_grads: the backward adds slope
// gradients.
struct KernelBias {
  cuda::FlashBias flash;  // mode and direction bits; pointers filled in at launch
  torch::Tensor slopes_left, slopes_right;
  bool slope_grads = false;
  // BiasMode::Offsets: the (H, len) fp32 table on q's device, offset 0 at column offsets_origin
  // (FlashBias::offsets); offsets_grad: the backward adds the table's gradient.
  torch::Tensor offsets;
  int64_t offsets_origin = 0;
  bool offsets_grad = false;
  std::string unsupported;  // non-empty: why the fused kernels cannot take this bias
};

KernelBias plan_bias(const AttentionBias& bias, int64_t heads, bool causal, torch::Device device);
KernelBias plan_alibi(FusedAlibiLayout layout, int64_t heads);

// The kernels on caller-provided outputs (the tests poison them first). out: (B, H, T, D)
// like q; lse: (B, H, T) fp32 contiguous. Slope gradients, when wanted, are ADDED into the
// (H,) fp32 tensors dslopes_left/right; pass undefined tensors otherwise. The offsets table's
// gradient (bias.offsets_grad) is ADDED into doffsets, fp32 and shaped like bias.offsets.
void forward_into(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const KernelBias& bias, bool causal, torch::Tensor& out, torch::Tensor& lse);
void backward_into(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& out, const torch::Tensor& lse, const torch::Tensor& dout,
                   const KernelBias& bias, bool causal, torch::Tensor& dq, torch::Tensor& dk,
                   torch::Tensor& dv, torch::Tensor& dslopes_left, torch::Tensor& dslopes_right,
                   const torch::Tensor& doffsets = {});

// The offsets table of a by-offset dense bias for a call of `length` tokens: by_offset over
// j - i = -(length - 1) .. 0 (causal) or .. length - 1, as fp32 (H, len) on `device` (still
// differentiable), offset 0 at column length - 1. Refuses a table of the wrong shape.
torch::Tensor offsets_table(const AttentionBias& bias, int64_t heads, int64_t length, bool causal,
                            torch::Device device);

}  // namespace fused_detail
}  // namespace extrap
