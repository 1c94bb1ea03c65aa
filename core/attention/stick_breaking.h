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

// Long evaluations compute it a block of query rows at a time, each against the keys it can see
// only, through attention_reference_blocked() (core/attention/attention.h).

}  // namespace extrap
