// The plain C++ entry points of the fused attention kernels: the one place where run-time
// flags (input type, head dimension, bias mode) become template parameters. No torch here;
// the LibTorch wrapper (fused_attention.h) and the benchmark call these.
//
// All functions queue work on `stream` and return without waiting. They throw
// std::invalid_argument for parameters the kernels do not support (naming the value) and
// std::runtime_error for a failed launch.
#pragma once

#include "core/attention/cuda/flash_params.h"

#include <cuda_runtime_api.h>

#include <cstdint>

namespace extrap::cuda {

// Whether the kernels are compiled for this input type and head dimension.
bool flash_supports(ElementType dtype, int head_dim);

// Writes o and lse.
void flash_attention_forward(const FlashFwdParams& params, cudaStream_t stream);

// Writes dq, dk, dv and adds into dslopes_* (if set); overwrites the two workspaces.
void flash_attention_backward(const FlashBwdParams& params, cudaStream_t stream);

// Sizes, in floats, of the backward pass's workspaces.
int64_t flash_bwd_delta_floats(int batch, int heads, int seq_len);                  // (B, H, T)
int64_t flash_bwd_dq_accum_floats(int batch, int heads, int seq_len, int head_dim);  // (B, H, T, D)

// The per-head slopes an Alibi mode uses when FlashBias has no slope arrays (the paper's
// geometric slopes, computed on the device exactly as the kernels do): left[h] for keys
// j <= i and right[h] for keys j > i, 0 where the head does not look. `left` and `right`
// are (heads,) fp32 device arrays.
void flash_geometric_slopes(BiasMode mode, int heads, float* left, float* right,
                            cudaStream_t stream);

}  // namespace extrap::cuda
