// The plain C++ parameters of the CUDA residual add and norm (residual_norm_kernels.cuh); no
// torch, no CUDA. The math and the dtypes are core/kernels/residual_norm.h's: h = x + y and u =
// (h - mean) rstd gamma + beta over rows of `width` float32 values (an RMSNorm: mean 0 and rstd
// from the mean square; no bias: beta null).
#pragma once

#include "core/kernels/cuda/row_type.h"

#include <cstdint>

namespace extrap::cuda {

// The widest row the kernels take: 128 threads a row, at most 32 values each.
constexpr int64_t kAddLayerNormMaxWidth = 4096;

struct AddLayerNormForward {
  int64_t rows = 0, width = 0;
  float eps = 0;
  bool rms = false;              // an RMSNorm: no mean subtracted
  const float* x = nullptr;     // (rows, width)
  const void* y = nullptr;      // (rows, width) of y_type; absent: h is x
  RowType y_type = RowType::none;
  const float* gamma = nullptr;  // (width)
  const float* beta = nullptr;   // (width), or null: no bias
  float* h = nullptr;            // x + y, where there is a y
  float* u = nullptr;            // u in float32, or null
  void* u_bf16 = nullptr;        // u rounded to bfloat16 (alone, or beside u as its copy), or null
  float* mean = nullptr;         // (rows)
  float* rstd = nullptr;         // (rows): 1 / sqrt(variance + eps)
};

struct AddLayerNormBackward {
  int64_t rows = 0, width = 0;
  bool rms = false;
  const float* h = nullptr;
  const float* mean = nullptr;
  const float* rstd = nullptr;
  const float* gamma = nullptr;
  const void* du = nullptr;  // u's gradient, of du_type (none where nothing read u)
  RowType du_type = RowType::none;
  const void* du_copy = nullptr;  // the bfloat16 copy's gradient, bfloat16, or null
  const float* dh = nullptr;      // h's gradient, or null (added to dx)
  float* dx = nullptr;            // (rows, width)
  void* dy_bf16 = nullptr;        // dx rounded to bfloat16 (y's gradient for a bfloat16 y), or null
  // The row kernel's blocks (add_layer_norm_backward_blocks()) each sum their rows' weight and
  // bias gradients into `partial` (blocks, 2, width); a second kernel adds the blocks in order,
  // so the sums depend on the block count alone, never on the order blocks ran in.
  int64_t blocks = 0;
  float* partial = nullptr;
  float* dgamma = nullptr;  // (width), written
  float* dbeta = nullptr;   // (width), written; null: no bias
};

}  // namespace extrap::cuda
