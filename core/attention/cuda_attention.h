// The fused CUDA attention as the rest of extrap sees it. Its code (core/attention/cuda) is in
// libextrap_cuda.so, which core/runtime/cuda_support.h loads only where CUDA can run; when it
// loads, it registers its entry points here. Without it, cuda_attention() is null and CUDA
// tensors cannot exist in the process (LibTorch's CUDA half is not loaded either).
#pragma once

#include "core/attention/attention.h"

#include <torch/torch.h>

#include <string>

namespace extrap {

// Fixed ALiBi layouts with in-kernel slopes (REFERENCE.md, "Bias variants").
enum class FusedAlibiLayout { Causal, Symmetric, Nonsymmetric };

// core/attention/cuda/fused_attention.h documents each.
struct CudaAttention {
  std::string (*unsupported_reason)(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, const AttentionBias& bias, bool causal);
  torch::Tensor (*attention)(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const AttentionBias& bias, bool causal);
  torch::Tensor (*alibi)(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         FusedAlibiLayout layout, bool causal);
  // The kernels' tile shapes in force (flash_dispatch.h), e.g. "fwd_rows=auto".
  std::string (*kernel_shapes)();
};

void register_cuda_attention(const CudaAttention& entry);
// Null until libextrap_cuda.so has loaded.
const CudaAttention* cuda_attention();

}  // namespace extrap
