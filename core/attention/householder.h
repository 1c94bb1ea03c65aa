// PaTH's scores (Yang et al. 2025, "PaTH Attention: Position Encoding via Accumulating
// Householder Transformations"; fla-org/flash-linear-attention, fla/ops/path_attn). Every
// position t carries a generalised Householder reflection H_t = I - beta_t w_t w_t^T (w_t of about
// unit norm, beta_t in (0, 2)), and the logit of query i and key j <= i is
//     q_i^T (H_i H_{i-1} ... H_{j+1}) k_j          (the empty product, I, for j = i).
// The products are not those of any transform of q and k apart (H_t need not be invertible), so
// the scores are computed here, in blocks of C positions, without a d x d matrix per pair:
//   - within a block, the products of its reflections in the compact WY form (a unit lower
//     triangular C x C system per block): the logits of the block's own pairs, each key carried to
//     the end of its block, k^_j = H_end ... H_{j+1} k_j, each query to its start, q^_i =
//     H_start ... H_i q_i, and the block's product G = H_end ... H_start (d x d);
//   - across blocks, q^_i^T G_{I-1} ... G_{J+1} k^_j for key block J < query block I, the queries
//     carried one block further left per step: T / C steps of batched products.
// O(T^2 d + T C (C + d)) work and O(T (C + d)) memory beyond the (Tq, Tk) scores. Differentiable:
// the reference path trains through it.
#pragma once

#include "core/attention/attention.h"

namespace extrap {

// q (B, H, Tq, D) the queries at positions Tk - Tq .. Tk - 1 (the last of the keys); k (B, H, Tk,
// D); w (B, H, Tk, D) and beta (B, H, Tk) the reflections of the Tk positions. Returns (B, H, Tq,
// Tk): q_i^T (H_i ... H_{j+1}) k_j for j <= i, 0 for j > i (the caller masks those). `block` is C
// (0: chosen from Tk); the result does not depend on it beyond rounding.
torch::Tensor householder_scores(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                 const torch::Tensor& beta, int64_t block = 0);

// attention_reference() takes a Kind::Householder bias with these scores in place of q.k, and
// attention_reference_blocked() a block of query rows at a time (long evaluations).

}  // namespace extrap
