#include "core/kernels/qkv_heads.h"

namespace extrap {

namespace {

// The (B, T, 3, H, Dh) tensor whose slices q, k and v are; callers check packed_heads() first.
torch::Tensor packed_base(const torch::Tensor& q) {
  const auto B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  return q.as_strided({B, T, 3, H, D}, {T * 3 * H * D, 3 * H * D, H * D, D, 1}, q.storage_offset());
}

class SplitHeadsFunction : public torch::autograd::Function<SplitHeadsFunction> {
 public:
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                              int64_t heads) {
    const auto B = x.size(0), T = x.size(1), D = x.size(2) / (3 * heads);
    ctx->saved_data["heads"] = heads;
    auto parts = x.view({B, T, 3, heads, D}).permute({2, 0, 3, 1, 4}).unbind(0);
    return {parts[0], parts[1], parts[2]};
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const int64_t H = ctx->saved_data["heads"].toInt();
    const torch::Tensor* any = nullptr;
    for (const auto& g : grads)
      if (g.defined()) any = &g;
    if (!any) return {torch::Tensor(), torch::Tensor()};
    const auto B = any->size(0), T = any->size(2), D = any->size(3);
    const bool all = grads[0].defined() && grads[1].defined() && grads[2].defined();
    if (all && packed_heads(grads[0], grads[1], grads[2]))
      return {packed_base(grads[0]).view({B, T, 3 * H * D}), torch::Tensor()};
    auto packed = torch::empty({B, T, 3, H, D}, any->options());
    for (int64_t i = 0; i < 3; ++i) {
      auto slot = packed.select(2, i).permute({0, 2, 1, 3});
      if (grads[size_t(i)].defined())
        slot.copy_(grads[size_t(i)]);
      else
        slot.zero_();
    }
    return {packed.view({B, T, 3 * H * D}), torch::Tensor()};
  }
};

}  // namespace

std::array<torch::Tensor, 3> split_heads(const torch::Tensor& x, int64_t heads) {
  TORCH_CHECK(x.dim() == 3 && heads > 0 && x.size(2) % (3 * heads) == 0,
              "split_heads: expected (B, T, 3 * heads * d_head) with heads = ", heads, ", got ", x.sizes());
  const auto parts = SplitHeadsFunction::apply(x, heads);
  return {parts[0], parts[1], parts[2]};
}

bool packed_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  if (q.dim() != 4 || q.sizes() != k.sizes() || q.sizes() != v.sizes()) return false;
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type()) return false;
  if (!q.has_storage() || !k.has_storage() || !v.has_storage()) return false;
  if (!k.storage().is_alias_of(q.storage()) || !v.storage().is_alias_of(q.storage())) return false;
  const auto H = q.size(1), D = q.size(3);
  const auto strides = packed_head_strides(q.sizes());
  for (const auto* x : {&q, &k, &v})
    for (int64_t i = 0; i < 4; ++i)
      if (x->size(i) > 1 && x->stride(i) != strides[size_t(i)]) return false;
  return k.storage_offset() == q.storage_offset() + H * D && v.storage_offset() == q.storage_offset() + 2 * H * D;
}

std::vector<int64_t> heads_major_strides(at::IntArrayRef sizes) {
  TORCH_CHECK(sizes.size() == 4, "heads_major_strides: expected (B, H, T, D), got ", sizes);
  const auto H = sizes[1], T = sizes[2], D = sizes[3];
  return {T * H * D, D, H * D, 1};
}

std::vector<int64_t> packed_head_strides(at::IntArrayRef sizes) {
  TORCH_CHECK(sizes.size() == 4, "packed_head_strides: expected (B, H, T, D), got ", sizes);
  const auto H = sizes[1], T = sizes[2], D = sizes[3];
  return {T * 3 * H * D, D, 3 * H * D, 1};
}

torch::Tensor empty_heads_major(const torch::Tensor& like) {
  return torch::empty_strided(like.sizes(), heads_major_strides(like.sizes()), like.options());
}

std::array<torch::Tensor, 3> empty_head_gradients(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v) {
  if (!packed_heads(q, k, v)) return {empty_heads_major(q), empty_heads_major(k), empty_heads_major(v)};
  const auto packed = torch::empty({q.size(0), q.size(2), 3, q.size(1), q.size(3)}, q.options());
  const auto slice = [&](int64_t i) { return packed.select(2, i).permute({0, 2, 1, 3}); };
  return {slice(0), slice(1), slice(2)};
}

}  // namespace extrap
