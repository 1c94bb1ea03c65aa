// Memory-efficient attention for inference on the CPU: blockwise over queries and keys with
// an online (running max and sum) softmax, never holding a T x T tensor. Takes the same bias
// description as the reference; ALiBi is computed from slopes block by block and dense
// biases (T5) are requested one tile at a time.
#pragma once

#include "core/attention.h"

namespace extrap {

struct EfficientAttentionBlocks {
  int64_t query_block = 256;
  int64_t key_block = 512;
};

// Same contract as attention_reference(); no autograd support (inference only).
torch::Tensor attention_efficient(const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const AttentionBias& bias,
                                  const AttentionOptions& options,
                                  const EfficientAttentionBlocks& blocks = {});

}  // namespace extrap
