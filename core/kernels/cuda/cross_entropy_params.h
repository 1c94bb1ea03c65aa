// The plain C++ parameters of the CUDA training loss (cross_entropy_kernels.cuh); no torch, no
// CUDA. The math is core/kernels/fused_cpu_loss.h's: the summed cross-entropy of (rows, classes)
// logits and its gradient, float32 arithmetic.
#pragma once

#include "core/kernels/cuda/row_type.h"

#include <cstdint>

namespace extrap::cuda {

// What both passes read: the logits, their targets and each row's log-sum-exp.
struct CrossEntropyRows {
  int64_t rows = 0, classes = 0;
  const void* logits = nullptr;  // (rows, classes) of logits_type (float32 or bfloat16)
  RowType logits_type = RowType::float32;
  const int64_t* targets = nullptr;  // (rows)
  int64_t ignore_index = -100;
  float* lse = nullptr;  // (rows): written by the forward (0 for an ignored row), read backward
};

struct CrossEntropyForward : CrossEntropyRows {
  double* row_loss = nullptr;  // (rows): lse - logit of the target; 0 ignored, NaN for a target
                               // outside [0, classes)
  float* loss = nullptr;       // the sum of row_loss in row order, one float32
};

struct CrossEntropyBackward : CrossEntropyRows {
  const float* grad_loss = nullptr;  // the loss's incoming gradient: one float32 on the device
  void* grad = nullptr;              // (rows, classes) in the logits' type: g (softmax - onehot)
};

}  // namespace extrap::cuda
