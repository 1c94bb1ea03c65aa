// The query, key and value heads of one fused q/k/v projection, and their gradients back in
// the projection's layout without a copy where the attention wrote them there.
//
// The projection's output x is (B, T, (H + 2 Hkv) * Dh), read as (B, T, H + 2 Hkv, Dh): the H query
// heads, then the Hkv key heads, then the Hkv value heads (Hkv = H without grouped-query
// attention: the (B, T, 3, H, Dh) layout). split_heads() returns q (B, H, T, Dh), k and v (B, Hkv,
// T, Dh) as views of it (what view + permute + unbind gave). In the backward pass the three
// gradients have to become one (B, T, (H + 2 Hkv) * Dh) gradient for the projection. LibTorch's
// unbind stacks them into a new tensor and its view then copies that into the projection's
// layout: two copies of the whole gradient per layer. Here, when the three gradients already are
// the slices of one buffer (the fused CPU attention writes them so when q, k and v are such
// slices: packed_heads()), the buffer itself is the gradient; otherwise each gradient is copied
// into its slot once.
#pragma once

#include <torch/torch.h>

#include <array>
#include <vector>

namespace extrap {

// q (B, heads, T, Dh), k and v (B, kv_heads, T, Dh): views of x (B, T, (heads + 2 kv_heads) * Dh)
// (kv_heads 0: heads). Differentiable in x. As with unbind, the views may not be modified in
// place while gradients are recorded.
std::array<torch::Tensor, 3> split_heads(const torch::Tensor& x, int64_t heads, int64_t kv_heads = 0);

// Whether q, k and v are the slices of one (B, T, H + 2 Hkv, Dh) tensor, in that order (as
// split_heads() returns them).
bool packed_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

// What attention kernels write, so that nothing is copied on the way back to the projections:
// an uninitialised (B, H, T, Dh) tensor like `like`, laid out as (B, T, H, Dh), in which the
// model's merge of the heads, y.transpose(1, 2).reshape(B, T, H * Dh), is a view;
torch::Tensor empty_heads_major(const torch::Tensor& like);
// and uninitialised gradients for q, k and v: views of one (B, T, H + 2 Hkv, Dh) buffer when q,
// k and v are such slices (split_heads() then hands the buffer on as the projection's gradient),
// else each heads-major like its input.
std::array<torch::Tensor, 3> empty_head_gradients(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v);

// The element strides of those layouts for (B, H, T, Dh) sizes (for kernels told them apart
// from a tensor): heads-major, and a slice of a (B, T, W, Dh) buffer of W = H + 2 Hkv heads
// (width_heads; 0: 3 H, no grouped-query attention).
std::vector<int64_t> heads_major_strides(at::IntArrayRef sizes);
std::vector<int64_t> packed_head_strides(at::IntArrayRef sizes, int64_t width_heads = 0);

}  // namespace extrap
