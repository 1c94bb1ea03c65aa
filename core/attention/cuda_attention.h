// The fused CUDA attention as the rest of extrap sees it. Its code (core/attention/cuda) is in
// libextrap_cuda.so, which core/runtime/cuda_support.h loads only where CUDA can run; when it
// loads, it registers its entry points here. Without it, cuda_attention() is null and CUDA
// tensors cannot exist in the process (LibTorch's CUDA half is not loaded either).
#pragma once

#include "core/attention/attention.h"

#include <torch/torch.h>

#include <string>
#include <vector>

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
  // cuDNN's fused causal attention with its ALiBi mask and/or diagonal band
  // (core/attention/cuda/cudnn_attention.h); null where libextrap_cuda.so was built without the
  // cuDNN frontend's headers.
  std::string (*cudnn_unsupported_reason)(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const AttentionBias& bias, bool causal);
  torch::Tensor (*cudnn)(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool alibi,
                         int64_t window);
  // The slopes cuDNN's ALiBi mask uses for H heads (the route table's condition is that they are
  // the paper's; tests/attention/test_gpu_routes_cuda.cpp checks it on any machine).
  std::vector<float> (*cudnn_alibi_slopes)(int64_t heads);
  // "cuDNN 9.x.y (frontend 1.a.b)", or why there is none.
  std::string (*cudnn_description)();
};

void register_cuda_attention(const CudaAttention& entry);
// Null until libextrap_cuda.so has loaded.
const CudaAttention* cuda_attention();

}  // namespace extrap
