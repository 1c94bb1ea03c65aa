// The linear (ALiBi family) bias of the fused kernels: per-head slopes and directions, and
// the bias of one score. No N x N tensor exists anywhere: a score's bias is computed from
// its two positions and its head's slope.
//
// Per head h (i = query, j = key; j == i is always visible):
//   None               bias 0; sees both sides (the causal flag masks j > i)
//   AlibiCausal        -m_h (i - j); sees only j <= i
//   AlibiSymmetric     -m_left (i - j) for j <= i, -m_right (j - i) for j > i; both sides
//   AlibiNonsymmetric  slopes of H/2 heads used twice: head h < H/2 sees only j <= i with
//                      slope m_h, head h >= H/2 only j >= i with slope m_{h - H/2}
//   Linear             slopes_left[h] / slopes_right[h] and the direction bits of FlashBias
//   Offsets            not linear at all: offsets[h][j - i] of FlashBias's table; both sides
// For the Alibi modes with null slope arrays, m is the paper's geometric slope computed here
// (REFERENCE.md, "ALiBi slopes"); with arrays, slopes_left[h] serves j < i and
// slopes_right[h] serves j > i (the arrays then already hold the per-head values, also for
// Nonsymmetric). A causal call then masks j > i on top of any mode.
//
// The kernels work in base 2 (exp2), so the slopes are kept multiplied by log2(e).
#pragma once

#include "core/attention/cuda/flash_params.h"

#include <cuda_runtime.h>

namespace extrap::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Slope of head `head` of `num_heads` (0-based): for p = the largest power of two <= n,
// heads h < p get 2^(-8 (h + 1) / p); the rest get every other slope of the 2p-head
// sequence, 2^(-8 (2 (h - p) + 1) / (2p)). Evaluated in double and rounded once, so it
// equals the host's alibi_slopes() rounded to float.
__host__ __device__ inline float alibi_geometric_slope(int head, int num_heads) {
  int p = 1;
  while (p * 2 <= num_heads) p *= 2;
  const double exponent = head < p ? -8.0 * (head + 1) / p : -4.0 * (2 * (head - p) + 1) / p;
  return static_cast<float>(exp2(exponent));
}

// One head's slopes and directions as the mode defines them (before the causal flag).
struct HeadSlopes {
  float left = 0.f;         // m for j <= i
  float right = 0.f;        // m for j > i
  bool look_left = true;    // keys j < i visible
  bool look_right = true;   // keys j > i visible
};

__device__ inline bool head_bit(const uint64_t (&bits)[kMaxLinearHeads / 64], int head) {
  return (bits[head / 64] >> (head % 64)) & 1u;
}

// The slope of `head` in the Alibi modes: from the array if given, else geometric.
__device__ inline float alibi_slope(const float* slopes, int head, int geometric_head,
                                    int geometric_heads) {
  return slopes != nullptr ? slopes[head] : alibi_geometric_slope(geometric_head, geometric_heads);
}

template <BiasMode kMode>
__device__ inline HeadSlopes head_slopes(const FlashBias& bias, int head, int num_heads) {
  HeadSlopes hs;
  if constexpr (kMode == BiasMode::AlibiCausal) {
    hs.left = alibi_slope(bias.slopes_left, head, head, num_heads);
    hs.look_right = false;
  } else if constexpr (kMode == BiasMode::AlibiSymmetric) {
    hs.left = alibi_slope(bias.slopes_left, head, head, num_heads);
    hs.right = alibi_slope(bias.slopes_right, head, head, num_heads);
  } else if constexpr (kMode == BiasMode::AlibiNonsymmetric) {
    const int half = num_heads / 2;
    if (head < half) {
      hs.left = alibi_slope(bias.slopes_left, head, head, half);
      hs.look_right = false;
    } else {
      hs.right = alibi_slope(bias.slopes_right, head, head - half, half);
      hs.look_left = false;
    }
  } else if constexpr (kMode == BiasMode::Linear) {
    hs.left = bias.slopes_left[head];
    hs.right = bias.slopes_right[head];
    hs.look_left = head_bit(bias.look_left_bits, head);
    hs.look_right = head_bit(bias.look_right_bits, head);
  }
  return hs;
}

// What the kernels use per head: slopes in base 2 and directions with the causal flag.
struct HeadBias {
  float slope_left_log2 = 0.f;   // m_left * log2(e)
  float slope_right_log2 = 0.f;  // m_right * log2(e)
  bool look_left = true;         // keys j < i visible
  bool look_right = true;        // keys j > i visible (false for a causal call)
  // Offsets only: the head's row of the table at offset 0 (index it with j - i), and the
  // offsets the table holds, inclusive.
  const float* offsets = nullptr;
  int offset_lo = 0, offset_hi = 0;
};

template <BiasMode kMode>
__device__ inline HeadBias make_head_bias(const FlashBias& bias, int head, int num_heads,
                                          bool causal) {
  const HeadSlopes hs = head_slopes<kMode>(bias, head, num_heads);
  HeadBias hb;
  hb.slope_left_log2 = hs.left * kLog2e;
  hb.slope_right_log2 = hs.right * kLog2e;
  hb.look_left = hs.look_left;
  hb.look_right = hs.look_right && !causal;
  if constexpr (kMode == BiasMode::Offsets) {
    hb.offsets = bias.offsets + static_cast<int64_t>(head) * bias.offsets_len + bias.offsets_origin;
    hb.offset_lo = -bias.offsets_origin;
    hb.offset_hi = bias.offsets_len - 1 - bias.offsets_origin;
  }
  return hb;
}

// The table index of the score at distance d = i - j (a float holding an integer): j - i,
// clamped into the table. Only masked scores are ever clamped (keys past T, j > i of a causal
// call, queries past T), and their logits are replaced, so the clamp only keeps reads in bounds.
__device__ __forceinline__ int offset_index(const HeadBias& hb, float distance) {
  return min(max(-__float2int_rn(distance), hb.offset_lo), hb.offset_hi);
}

// bias(i, j) * log2(e) from the distance d = i - j, given as a float (exact: positions are
// below 2^24): -m_left d for d >= 0, m_right d for d < 0.
template <BiasMode kMode>
__device__ __forceinline__ float bias_log2(const HeadBias& hb, float distance) {
  if constexpr (kMode == BiasMode::None) {
    return 0.f;
  } else {
    return distance >= 0.f ? -hb.slope_left_log2 * distance : hb.slope_right_log2 * distance;
  }
}

// The base-2 logits of one warp's 16 x (8 kNTiles) accumulator tile (mma.cuh layout), in
// place: x = score * scale * log2(e) + bias(i, j) * log2(e). The forward pass's tiles have
// queries as rows and keys as columns, the backward pass's (S^T) the other way round
// (kRowsAreQueries). Element (nt, e) of lane (g, t) sits at row position row_pos[e / 2]
// (tokens g and g + 8 of the tile) and column position col_pos0 + 8 nt + e % 2, col_pos0 the
// lane's first column (tile start + 2t). Positions are floats holding integers, so every
// distance is exact and one floating-point subtraction.
//
// Every score gets the same bias as bias_log2 computes, bit for bit; a tile that lies
// wholly on one side of the diagonal (`side` +1: every key at or before its query, -1: at
// or after) takes its slope once instead of choosing per score (0: it straddles). The
// forward and the backward pass both call this, so their logits agree.
template <BiasMode kMode, bool kRowsAreQueries, int kNTiles>
__device__ __forceinline__ void tile_logits(float (&x)[kNTiles][4], const HeadBias& hb,
                                            float scale_log2, const float (&row_pos)[2],
                                            float col_pos0, int side) {
  if constexpr (kMode == BiasMode::None) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[nt][e] *= scale_log2;
  } else if constexpr (kMode == BiasMode::Offsets) {
    // The table's value at j - i (read through the read-only cache: a 16 x 64 tile reaches
    // 79 offsets, each read by many lanes), in base 2.
    constexpr float kSign = kRowsAreQueries ? 1.f : -1.f;
    const float rel[2] = {row_pos[0] - col_pos0, row_pos[1] - col_pos0};
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = kSign * (rel[e / 2] - static_cast<float>(8 * nt + e % 2));
        x[nt][e] = fmaf(x[nt][e], scale_log2, __ldg(hb.offsets + offset_index(hb, d)) * kLog2e);
      }
  } else {
    // d = i - j = sign (row - column), exact; rel[r] = row_pos[r] - col_pos0.
    constexpr float kSign = kRowsAreQueries ? 1.f : -1.f;
    const float rel[2] = {row_pos[0] - col_pos0, row_pos[1] - col_pos0};
    if (side != 0) {
      const float m = side > 0 ? -hb.slope_left_log2 : hb.slope_right_log2;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = kSign * (rel[e / 2] - static_cast<float>(8 * nt + e % 2));
          x[nt][e] = fmaf(x[nt][e], scale_log2, m * d);
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float d = kSign * (rel[e / 2] - static_cast<float>(8 * nt + e % 2));
          x[nt][e] = fmaf(x[nt][e], scale_log2, bias_log2<kMode>(hb, d));
        }
    }
  }
}

// Which side of the diagonal the tile of queries [q0, q1) and keys [k0, k1) lies on:
// +1 when every key is at or before every query (j <= i), -1 when every key is at or after
// (j >= i), 0 when it straddles.
__device__ __forceinline__ int tile_side(int q0, int q1, int k0, int k1) {
  if (k1 - 1 <= q0) return 1;
  if (k0 >= q1 - 1) return -1;
  return 0;
}

}  // namespace extrap::cuda
