#include "core/kernels/qkv_heads.h"

namespace extrap {

namespace {

// The (B, T, H + 2 Hkv, Dh) tensor whose slices q, k and v are; callers check packed_heads() first.
torch::Tensor packed_base(const torch::Tensor& q, int64_t kv_heads) {
  const auto B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), W = H + 2 * kv_heads;
  return q.as_strided({B, T, W, D}, {T * W * D, W * D, D, 1}, q.storage_offset());
}

class SplitHeadsFunction : public torch::autograd::Function<SplitHeadsFunction> {
 public:
  static torch::autograd::tensor_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                              int64_t heads, int64_t kv_heads) {
    const auto B = x.size(0), T = x.size(1), W = heads + 2 * kv_heads, D = x.size(2) / W;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["kv_heads"] = kv_heads;
    const auto all = x.view({B, T, W, D}).permute({0, 2, 1, 3});  // (B, W, T, D)
    return {all.narrow(1, 0, heads), all.narrow(1, heads, kv_heads), all.narrow(1, heads + kv_heads, kv_heads)};
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const int64_t H = ctx->saved_data["heads"].toInt(), Hkv = ctx->saved_data["kv_heads"].toInt();
    const torch::Tensor* any = nullptr;
    for (const auto& g : grads)
      if (g.defined()) any = &g;
    if (!any) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const auto B = any->size(0), T = any->size(2), D = any->size(3), W = H + 2 * Hkv;
    const bool all = grads[0].defined() && grads[1].defined() && grads[2].defined();
    if (all && packed_heads(grads[0], grads[1], grads[2]))
      return {packed_base(grads[0], Hkv).view({B, T, W * D}), torch::Tensor(), torch::Tensor()};
    auto packed = torch::empty({B, T, W, D}, any->options());
    const int64_t first[3] = {0, H, H + Hkv}, count[3] = {H, Hkv, Hkv};
    for (int64_t i = 0; i < 3; ++i) {
      auto slot = packed.narrow(2, first[i], count[i]).permute({0, 2, 1, 3});
      if (grads[size_t(i)].defined())
        slot.copy_(grads[size_t(i)]);
      else
        slot.zero_();
    }
    return {packed.view({B, T, W * D}), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

std::array<torch::Tensor, 3> split_heads(const torch::Tensor& x, int64_t heads, int64_t kv_heads) {
  if (kv_heads == 0) kv_heads = heads;
  TORCH_CHECK(x.dim() == 3 && heads > 0 && kv_heads > 0 && heads % kv_heads == 0 &&
                  x.size(2) % (heads + 2 * kv_heads) == 0,
              "split_heads: expected (B, T, (heads + 2 kv_heads) * d_head) with heads = ", heads, " and kv_heads = ",
              kv_heads, ", got ", x.sizes());
  const auto parts = SplitHeadsFunction::apply(x, heads, kv_heads);
  return {parts[0], parts[1], parts[2]};
}

bool packed_heads(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  if (q.dim() != 4 || k.dim() != 4 || k.sizes() != v.sizes()) return false;
  if (q.size(0) != k.size(0) || q.size(2) != k.size(2) || q.size(3) != k.size(3)) return false;
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type()) return false;
  if (!q.has_storage() || !k.has_storage() || !v.has_storage()) return false;
  if (!k.storage().is_alias_of(q.storage()) || !v.storage().is_alias_of(q.storage())) return false;
  const auto H = q.size(1), Hkv = k.size(1), D = q.size(3);
  const auto strides = packed_head_strides(q.sizes(), H + 2 * Hkv);
  for (const auto* x : {&q, &k, &v})
    for (int64_t i = 0; i < 4; ++i)
      if (x->size(i) > 1 && x->stride(i) != strides[size_t(i)]) return false;
  return k.storage_offset() == q.storage_offset() + H * D && v.storage_offset() == q.storage_offset() + (H + Hkv) * D;
}

std::vector<int64_t> heads_major_strides(at::IntArrayRef sizes) {
  TORCH_CHECK(sizes.size() == 4, "heads_major_strides: expected (B, H, T, D), got ", sizes);
  const auto H = sizes[1], T = sizes[2], D = sizes[3];
  return {T * H * D, D, H * D, 1};
}

std::vector<int64_t> packed_head_strides(at::IntArrayRef sizes, int64_t width_heads) {
  TORCH_CHECK(sizes.size() == 4, "packed_head_strides: expected (B, H, T, D), got ", sizes);
  const auto H = sizes[1], T = sizes[2], D = sizes[3], W = width_heads > 0 ? width_heads : 3 * H;
  return {T * W * D, D, W * D, 1};
}

torch::Tensor empty_heads_major(const torch::Tensor& like) {
  return torch::empty_strided(like.sizes(), heads_major_strides(like.sizes()), like.options());
}

std::array<torch::Tensor, 3> empty_head_gradients(const torch::Tensor& q, const torch::Tensor& k,
                                                  const torch::Tensor& v) {
  if (!packed_heads(q, k, v)) return {empty_heads_major(q), empty_heads_major(k), empty_heads_major(v)};
  const auto H = q.size(1), Hkv = k.size(1);
  const auto packed = torch::empty({q.size(0), q.size(2), H + 2 * Hkv, q.size(3)}, q.options());
  const auto slice = [&](int64_t first, int64_t count) { return packed.narrow(2, first, count).permute({0, 2, 1, 3}); };
  return {slice(0, H), slice(H, Hkv), slice(H + Hkv, Hkv)};
}

}  // namespace extrap
