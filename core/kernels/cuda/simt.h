// One source for a CUDA kernel and for its test on a machine with no GPU.
//
// A kernel written against this header (its thread and block indices, block barriers, warp
// shuffles, bfloat16 conversions and shared arrays, nothing else of CUDA) compiles with nvcc as
// CUDA, and with a C++ compiler as threads on the CPU (simt_host.h, for tests): the tests run the
// kernel's own source, its index arithmetic, reductions and barriers included, on any machine.
// What the CPU run cannot say: speed, memory coalescing, races that the CPU's threads happen to
// order, and the GPU's own rounding of rsqrt and exp (a few ulp under --use_fast_math).
//
// The subset: one-dimensional grids and blocks (thread_index(), block_index(), block_count());
// blocks of a whole number of warps; sync_block() reached by every thread of the block;
// shuffle_xor() by all 32 lanes of a warp; EXTRAP_SIMT_SHARED arrays with no initialiser, read
// only after a barrier that follows their writes.
#pragma once

#if defined(__CUDACC__)

#include <cuda_bf16.h>

#define EXTRAP_SIMT_KERNEL __global__
#define EXTRAP_SIMT_DEVICE __device__ __forceinline__
#define EXTRAP_SIMT_SHARED __shared__
#define EXTRAP_SIMT_UNROLL _Pragma("unroll")

namespace extrap::simt {

using bf16 = __nv_bfloat16;

EXTRAP_SIMT_DEVICE int thread_index() { return static_cast<int>(threadIdx.x); }
EXTRAP_SIMT_DEVICE int block_index() { return static_cast<int>(blockIdx.x); }
EXTRAP_SIMT_DEVICE int block_count() { return static_cast<int>(gridDim.x); }
EXTRAP_SIMT_DEVICE void sync_block() { __syncthreads(); }
EXTRAP_SIMT_DEVICE float shuffle_xor(float value, int lane_mask) {
  return __shfl_xor_sync(0xffffffffu, value, lane_mask);
}
EXTRAP_SIMT_DEVICE float to_float(bf16 value) { return __bfloat162float(value); }
EXTRAP_SIMT_DEVICE bf16 to_bf16(float value) { return __float2bfloat16_rn(value); }
EXTRAP_SIMT_DEVICE float rsqrt(float value) { return rsqrtf(value); }
EXTRAP_SIMT_DEVICE float exp(float value) { return expf(value); }
EXTRAP_SIMT_DEVICE double log(double value) { return ::log(value); }
EXTRAP_SIMT_DEVICE float quiet_nan() { return __int_as_float(0x7fffffff); }

}  // namespace extrap::simt

#else

#include "core/kernels/cuda/simt_host.h"

#endif
