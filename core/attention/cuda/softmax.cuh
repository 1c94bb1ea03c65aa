// Online softmax over the score tiles of one warp (FlashAttention's running max and sum).
//
// A warp owns 16 query rows; in the mma accumulator layout (mma.cuh) lane l holds, for each
// 8-column n-tile, columns 2t, 2t+1 of rows g and g + 8 (g = l / 4, t = l % 4). The four
// lanes of a quad (same g) together hold a whole row, so row reductions are two xor-shuffles.
// Logits are in base 2 (log2(e) folded into scale and slopes); masked logits are -inf.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace extrap::cuda {

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <int kNTiles>
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8, base-2 logits
  float row_sum[2] = {0.f, 0.f};              // this lane's part of sum 2^(x - row_max)

  // Turns the logits x of one tile into unnormalised probabilities 2^(x - row max) in place
  // and returns, per row, the factor by which earlier accumulators must be scaled.
  __device__ __forceinline__ void update(float (&x)[kNTiles][4], float (&correction)[2]) {
    float tile_max[2] = {row_max[0], row_max[1]};
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      tile_max[0] = fmaxf(tile_max[0], fmaxf(x[nt][0], x[nt][1]));
      tile_max[1] = fmaxf(tile_max[1], fmaxf(x[nt][2], x[nt][3]));
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = quad_max(tile_max[r]);
      // A row with nothing visible so far keeps max -inf; subtract 0 then, not -inf, so
      // that 2^(-inf - base) is 0 and never NaN.
      base[r] = tile_max[r] == -INFINITY ? 0.f : tile_max[r];
      correction[r] = exp2f(row_max[r] - base[r]);
      row_max[r] = tile_max[r];
    }
    float tile_sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        x[nt][e] = exp2f(x[nt][e] - base[e / 2]);
        tile_sum[e / 2] += x[nt][e];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * correction[r] + tile_sum[r];
  }

  // After the last tile: 1 / row sum (0 for a row that saw nothing) and the natural-log
  // log-sum-exp of the row's logits.
  __device__ __forceinline__ void finish(float (&inv_sum)[2], float (&lse)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = quad_sum(row_sum[r]);
      inv_sum[r] = sum > 0.f ? 1.f / sum : 0.f;
      lse[r] = sum > 0.f ? (row_max[r] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
    }
  }
};

}  // namespace extrap::cuda
