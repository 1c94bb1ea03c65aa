// The gated feed-forward's second half (SwiGLU, GeGLU: model.ffn), linear(act(g) o u, W, b) with
// a = [g, u] the first product's output, on the CPU with the gate and the product in one pass
// over a each way.
//
// Unfused, the gate's activation, its product with u, the slice of a into g and u, and their
// backwards are each a pass over (N, F) with an autograd node, and the two halves' gradients are
// copied into one (N, 2F) gradient for the first product. Here the forward reads a once and writes
// s = act(g) o u (N, F); the backward's dS = dY W is one product, and one pass reads a and
// dS and writes dA = [dS o u act'(g), dS o act(g)] straight into the first product's (N, 2F)
// gradient. s is kept for the weight gradient, dW = dY^T s.
//
// Numbers: SiLU is x sigma(x), GELU the exact (erf) form by Abramowitz and Stegun 7.1.26 (as
// core/kernels/gelu_linear.h) or its tanh form (Gemma's; gelu_tanh_and_slope,
// core/kernels/cpu_vector_math.h), in float32. Under bf16 autocast a is bfloat16 (the first
// product's output), s and dA are rounded to bfloat16 once from float32, the products take
// bfloat16 operands with float32 accumulation as autocast's linear does.
//
// Taken while gradients are recorded, on the CPU, unless EXTRAP_FUSED_GLU=0 (for A/B runs):
// float32 on every CPU (its products through oneDNN where core/kernels/cpu_linear.h takes the
// layer there, else LibTorch's), bfloat16 under bf16 autocast on a CPU with AVX512_BF16. Everything else (evaluation, GPUs, other dtypes) runs
// glu_reference and then the linear layer. No double backward (create_graph): refused by name.
#pragma once

#include <torch/torch.h>

namespace extrap {

enum class GluGate { silu, gelu, gelu_tanh };

// act(a[..., :F]) o a[..., F:] for a (..., 2F), with LibTorch's operators: the definition, and
// what evaluation runs.
torch::Tensor glu_reference(const torch::Tensor& a, GluGate gate);

// linear(act(g) o u, weight, bias): a (..., 2F) = [g, u], weight (M, F), bias (M) or undefined ->
// (..., M); differentiable in all three.
torch::Tensor glu_linear(const torch::Tensor& a, GluGate gate, const torch::Tensor& weight, const torch::Tensor& bias);

// Whether glu_linear() takes these through the fused path now.
bool glu_linear_fused_takes(const torch::Tensor& a, const torch::Tensor& weight);

// EXTRAP_FUSED_GLU, read once; throws ConfigError for a value other than 0 or 1 (the CLI reads
// it at start).
bool fused_glu_switched_on();

}  // namespace extrap
