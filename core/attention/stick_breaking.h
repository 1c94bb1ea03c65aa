// Stick-breaking attention (Tan et al., ICLR 2025, "Scaling Stick-Breaking Attention"): no
// softmax. With z_ij the scaled logits (q_i . k_j / sqrt(d), times the logit scale if any),
// query i gives key j < i (j <= i with the diagonal) the weight
//     A_ij = sigmoid(z_ij) prod_{j < k < i, k visible} (1 - sigmoid(z_ik)),
// near keys first, and its output is sum_j A_ij v_j + (1 - sum_j A_ij) v_i: the remaining mass
// goes to the query's own value, as the authors' reference model does (sb_ref.py with
// o + rem * v). Computed in log space: log A_ij = log sigmoid(z_ij) + the sum of
// log sigmoid(-z_ik) over the visible k after j, summed from the query leftwards.
// Masks (window, chunk) leave keys out of both the weights and the products; a sink has no
// meaning without a softmax and is refused.
#pragma once

#include "core/attention/attention.h"

namespace extrap {

// Same contract as attention_reference() for a Kind::StickBreaking bias, causal only: q
// (B, H, Tq, D) are the last Tq of k's and v's Tk positions. Differentiable (training). Its
// memory is a few (B, H, Tq, Tk) tensors.
torch::Tensor stick_breaking_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                       const AttentionBias& bias, const AttentionOptions& options);

// The weights A (B, H, Tq, Tk) of the same call, 0 where a key is not visible (what `extrap
// inspect bias` shows).
torch::Tensor stick_breaking_weights(const torch::Tensor& q, const torch::Tensor& k, const AttentionBias& bias);

// The same numbers a block of query rows at a time, each against the keys it can see, with its
// own backward (the gradients written out below, not autograd over the block): memory (B, H,
// query_block, Tk) for a call and nothing score-sized kept for backward, so training and long
// evaluations take O(T) memory per query block instead of several (B, H, T, T) tensors. It computes
// in float32 (float64 for float64 inputs) and returns q's type. No attention dropout (the
// reference path has it). What the Auto and Efficient backends run (core/attention/attention.cpp).
// With w_ij = A_ij g_i . (v_j - v_i), g_i the output's gradient, the logits' gradient is
//     dL/dz_ik = w_ik - sigmoid(z_ik) sum_{visible j <= k} w_ij,
// since log A_ij = log sigmoid(z_ij) + sum over visible k > j of log sigmoid(-z_ik).
torch::Tensor stick_breaking_attention_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                               const AttentionBias& bias, const AttentionOptions& options,
                                               int64_t query_block = 128);

}  // namespace extrap
