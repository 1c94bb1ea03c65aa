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
#include <string>

namespace extrap::cuda {

// Whether the kernels are compiled for this input type and head dimension.
bool flash_supports(ElementType dtype, int head_dim);

// Query rows a forward block takes for this call: 64 (one m-fragment a warp) or 128 (two).
// The environment variable EXTRAP_FLASH_FWD_ROWS (read once) sets it: "auto" (the default:
// 64 where every head's work is triangular, i.e. causal, else 128), 64 or 128; any other
// value is refused. For side-by-side measurement: every shape computes the same numbers.
int flash_fwd_block_rows(const FlashFwdParams& params);
// The setting in force: "auto", "64" or "128".
std::string flash_fwd_rows_setting();

// Floats each fp32 atomic of the backward's dQ adds: 1, 2 or 4. The environment variable
// EXTRAP_FLASH_BWD_ATOMICS (read once) sets it: unset or empty -> 4, else 1, 2 or 4; any other
// value is refused. For side-by-side measurement: every width computes the same sums (the
// order of the atomic additions is unspecified in any case).
int flash_bwd_atomic_width();

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
