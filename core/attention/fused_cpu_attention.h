// Fused attention for training on the CPU: forward and backward in one pass per (batch, head),
// the position bias computed in the kernel from its description, never a (B, H, T, T) tensor.
//
// What it stands in for: the reference path's batched products, the materialised bias added
// to (B, H, T, T) scores, softmax and its backward, and the copies that make the strided q, k,
// v and the output contiguous, each a pass of its own over memory.
//
// Per (batch, head), for each block of 64 query rows: S = q k^T / sqrt(d) against the keys the
// block can see (for causal attention, only up to its last row), the bias added row by row,
// softmax in place, O = P v written straight into a (B, T, H, Dh) buffer (so the output
// projection needs no transpose copy), and the row's log-sum-exp kept. The backward pass
// recomputes P from q, k and the log-sum-exp (as FlashAttention does), then dV += P^T dO,
// dP = dO v^T, dS = P (dP - rowsum(dO o O)), dQ = dS k / sqrt(d), dK += dS^T q / sqrt(d).
// Products go to the BLAS that LibTorch carries (its exported sgemm_, found at run time),
// single-threaded inside the (batch x head) parallel loop. Deterministic for a thread count.
//
// bfloat16 inputs (train.precision bf16: q, k, v come from autocast's bfloat16 products) are
// taken as they are, with no float32 copies, and the output and gradients are bfloat16. The
// scores, the bias, the softmax and its backward are float32 whatever the inputs. On a CPU with
// AVX512_BF16 the products run in bfloat16 with float32 accumulation (core/kernels/bf16_gemm.h): q, k,
// v and dO are bfloat16 already, and P and dS are rounded to bfloat16 for the products that
// take them, as FlashAttention does; elsewhere the inputs are widened and the products are
// the float32 BLAS ones. The backward's softmax shift rowsum(dO o O) is computed as
// rowsum(P o dP) (equal), so the forward's output is not kept for it.
//
// Supported: float32 or bfloat16 CPU tensors (B, H, T, Dh) with unit stride in Dh (any other
// strides), as many queries as keys, no attention dropout, a bias of kind None or Linear (ALiBi and its
// symmetric and direction-masked variants) at window positions with slopes that need no
// gradient, or a dense bias of j - i alone (AttentionBias::by_offset: T5, KERPLE, Sandwich) with
// its gradient (each offset's: dZ summed along its diagonal, then autograd on to the method's
// parameters), causal or not; and the bias's options (attention.h): window and chunk masks (keys
// outside a block's range are left out of its products in float32), a sink per head and a logit
// scale per row, both with gradients, and the soft cap (attention.softcap: each score capped as
// C tanh(s / C) after its product, before the bias, by a vectorised tanh whose relative error is
// about 3e-7; its gradient 1 - tanh^2 from the capped scores kept for the backward's block).
// Everything else goes to the reference path (attention()
// picks).
#pragma once

#include "core/attention/attention.h"

#include <string>

namespace extrap {

// Empty when fused_cpu_attention() takes these inputs; otherwise why not (for the log of
// `extrap bench train` and for the tests).
std::string fused_cpu_attention_unsupported_reason(const torch::Tensor& q, const torch::Tensor& k,
                                                   const torch::Tensor& v, const AttentionBias& bias,
                                                   const AttentionOptions& options);

// Same contract as attention_reference() (equal to rounding), differentiable in q, k and v;
// refuses, with the reason, a call it does not take (attention dropout in training among them).
// The result is a (B, H, T, Dh) view of a (B, T, H, Dh) tensor: y.transpose(1, 2) is contiguous.
torch::Tensor fused_cpu_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const AttentionBias& bias, const AttentionOptions& options);

// The soft cap as the kernel applies it (attention.softcap C): s <- C tanh(s / C) for the m rows
// of n scores `stride` apart, in float32 by a vectorised tanh (relative error about 3e-7); the
// attention profile (core/eval/attention_profile.cpp) caps its rows with it. C must hold as a
// normal float32 (normal_float32, core/base/float_range.h): the config refuses
// others, the kernel names them.
void softcap_scores(float* rows, int64_t m, int64_t n, int64_t stride, float cap);

// The rule by which the kernel skips tiles of far keys under a linear bias, which the attention
// profile (core/eval/attention_profile.cpp) follows key by key. For query i and key j,
// score(i, j) <= |q_i| |k_j| + bias(i, j) (q scaled by 1/sqrt(d)), and row i's largest score is
// at least its diagonal's, >= -|q_i| |k_i| (bias 0, always seen). So for a block of queries and
// a set of keys with reach = max |q_i| (max |k_j| + max |k_i| of the block's own keys), a key
// farther than negligible_distance(reach, slope) from every query of the block, on a side whose
// bias falls by `slope` a unit of distance, weighs below e^-64 of its row's largest: summed over
// a billion keys, under float32's resolution. Infinite where slope <= 0.
double negligible_distance(double reach, double slope);

}  // namespace extrap
