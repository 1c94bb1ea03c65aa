// Internal to the kernels: tile shapes, the launchers' declarations, and THE list of
// compiled configurations. flash_fwd.cu and flash_bwd.cu instantiate every entry of the list
// and flash_dispatch.cu dispatches over the same list, so a configuration cannot be
// dispatched without being compiled.
#pragma once

#include "core/attention/cuda/flash_params.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

namespace extrap::cuda {

// Forward: a block of 4 warps owns 64 kMFrags query rows (16 kMFrags per warp: kMFrags
// m-fragments of 16 rows) and streams 64-key tiles. Shared memory: Q, K and V tiles, rows
// padded to D + 8 elements (tile_io.cuh). Two m-fragments a warp halve the shared-memory
// reads per tensor-core instruction (each K or V fragment loaded serves two); Q then stays
// in registers only where it fits (D 64), else it is read from shared memory every k-step.
template <class Element, int kHeadDim, int kMFrags>
struct FwdTiles {
  static_assert(kMFrags == 1 || kMFrags == 2, "one or two m-fragments a warp");
  static constexpr int kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kWarpRows = 16 * kMFrags, kBlockM = kWarpRows * kWarps;
  static constexpr int kBlockN = kMFrags * kHeadDim <= 128 ? 64 : 32;
  static constexpr bool kQInRegisters = kMFrags * kHeadDim <= 128;
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kSmemBytes =
      (kBlockM + 2 * kBlockN) * kStride * static_cast<int>(sizeof(Element));
};

// Backward: a block of 4 warps owns 64 keys (16 per warp, accumulating dK and dV) and
// streams 64-query tiles of Q, dO, log-sum-exp and delta; dS^T goes through shared memory
// for dQ = dS K, which is added into the fp32 dq_accum with atomics. BiasMode::Offsets sums
// each tile's dS along its kBlockM + kBlockN - 1 diagonals in shared memory (one slot per
// offset j - i), then adds them into the table's gradient.
template <class Element, int kHeadDim>
struct BwdTiles {
  static constexpr int kBlockM = 64, kBlockN = 64, kWarps = 4, kThreads = 32 * kWarps;
  static constexpr int kStride = kHeadDim + 8;
  static constexpr int kDsStride = kBlockM + 8;  // dS^T tile: rows = keys, columns = queries
  static constexpr int kOffsetSlots = kBlockM + kBlockN;  // a tile's offsets (one spare)
  static constexpr int kSmemBytes =
      (4 * kBlockN * kStride + kBlockN * kDsStride) * static_cast<int>(sizeof(Element)) +
      (2 * kBlockM + kOffsetSlots) * static_cast<int>(sizeof(float));
};

template <class Element>
constexpr ElementType element_type_of();
template <>
constexpr ElementType element_type_of<__nv_bfloat16>() { return ElementType::BFloat16; }
template <>
constexpr ElementType element_type_of<__half>() { return ElementType::Float16; }

template <class Element, int kHeadDim, BiasMode kMode, int kMFrags>
void launch_flash_fwd(const FlashFwdParams& params, cudaStream_t stream);

template <class Element, int kHeadDim, BiasMode kMode>
void launch_flash_bwd(const FlashBwdParams& params, cudaStream_t stream);

}  // namespace extrap::cuda

// X(Element, head_dim, bias_mode) for every compiled configuration: both input types, head
// dimensions 64 and 128, every bias mode (the causal flag is a run-time argument).
#define EXTRAP_FLASH_MODES(X, Element, HeadDim)                        \
  X(Element, HeadDim, ::extrap::cuda::BiasMode::None)                  \
  X(Element, HeadDim, ::extrap::cuda::BiasMode::AlibiCausal)           \
  X(Element, HeadDim, ::extrap::cuda::BiasMode::AlibiSymmetric)        \
  X(Element, HeadDim, ::extrap::cuda::BiasMode::AlibiNonsymmetric)     \
  X(Element, HeadDim, ::extrap::cuda::BiasMode::Linear)               \
  X(Element, HeadDim, ::extrap::cuda::BiasMode::Offsets)

#define EXTRAP_FLASH_CONFIGS(X)             \
  EXTRAP_FLASH_MODES(X, __nv_bfloat16, 64)  \
  EXTRAP_FLASH_MODES(X, __nv_bfloat16, 128) \
  EXTRAP_FLASH_MODES(X, __half, 64)         \
  EXTRAP_FLASH_MODES(X, __half, 128)
