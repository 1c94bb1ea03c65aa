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
  return hb;
}

// bias(i, j) * log2(e): -m_left (i - j) for j <= i, -m_right (j - i) for j > i.
template <BiasMode kMode>
__device__ __forceinline__ float bias_log2(const HeadBias& hb, int i, int j) {
  if constexpr (kMode == BiasMode::None) {
    return 0.f;
  } else {
    const float distance = static_cast<float>(i - j);  // exact below 2^24
    return distance >= 0.f ? -hb.slope_left_log2 * distance : hb.slope_right_log2 * distance;
  }
}

// The logit of one score in base 2: (q . k * scale + bias) * log2(e). The forward and the
// backward pass call this same function, so the backward's recomputed probabilities match
// the saved log-sum-exp.
template <BiasMode kMode>
__device__ __forceinline__ float logit_log2(float score, float scale_log2, const HeadBias& hb,
                                            int i, int j) {
  return fmaf(score, scale_log2, bias_log2<kMode>(hb, i, j));
}

}  // namespace extrap::cuda
