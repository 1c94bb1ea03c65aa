// The rotary rotation of q or k in one pass each way on the CPU: x (B, H, T, D), each row's first
// `rotated` dimensions turned in pairs by its position's angles, (2i, 2i+1) (interleaved) or
// (i, i + rotated/2) (half, Hugging Face's rotate_half), the rest copied. Unfused, LibTorch
// runs the pairs' slices, four products, a sum, a difference and a concatenation forward, and
// their backwards (zero-filled slices, copies) back; torch.compile fuses them into one loop.
// The backward is the rotation by the negative angles (a rotation's transpose), one pass too.
//
// Taken for float32 CPU tensors whose last dimension is contiguous (q and k are views of the
// projection: core/kernels/qkv_heads.h), with (T, rotated/2) float32 tables that need no
// gradient; positions/rotation.cpp's rotate_pairs runs LibTorch's operators elsewhere (GPUs,
// bfloat16, sampled positions' per-sequence tables), and EXTRAP_FUSED_ROTATION=0 everywhere.
#pragma once

#include <torch/torch.h>

namespace extrap {

// Whether rotate_pairs_fused() takes these.
bool rotate_pairs_fused_takes(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                              int64_t rotated);

// x rotated (a new contiguous (B, H, T, D) tensor), differentiable in x.
torch::Tensor rotate_pairs_fused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                 int64_t rotated, bool half);

// EXTRAP_FUSED_ROTATION, read once; throws ConfigError for a value other than 0 or 1.
bool fused_rotation_switched_on();

}  // namespace extrap
