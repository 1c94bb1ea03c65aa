// split_heads (core/kernels/qkv_heads.h): q, k and v as views of the fused projection, and the
// projection's gradient from theirs: equal to LibTorch's view + permute + unbind in every case
// (all three gradients, some missing, gradients in any layout), and the very buffer the fused
// CPU attention writes when it writes the three as slices of one; the layouts attention kernels
// allocate their output and gradients in (empty_heads_major, empty_head_gradients).
#include "core/attention/attention.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/kernels/qkv_heads.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

using namespace extrap;

namespace {

constexpr int64_t B = 2, T = 5, H = 3, D = 4;

// LibTorch's own split, the reference.
std::vector<torch::Tensor> unbind_heads_of(const torch::Tensor& x, int64_t batch) {
  return x.view({batch, T, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
}
std::vector<torch::Tensor> unbind_heads(const torch::Tensor& x) { return unbind_heads_of(x, B); }

}  // namespace

TEST_CASE("split_heads: the views and the projection gradient of view + permute + unbind", "[qkv_heads]") {
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    const auto x0 = torch::randn({B, T, 3 * H * D}).to(dtype);
    const auto wq = torch::randn({B, H, T, D}).to(dtype), wk = torch::randn({B, H, T, D}).to(dtype),
               wv = torch::randn({B, H, T, D}).to(dtype);
    // What the three heads feed: all of them; k unused (its gradient is missing); q through a
    // rotation-like product (its gradient in another layout).
    const std::vector<std::pair<std::string, std::function<torch::Tensor(const std::vector<torch::Tensor>&)>>>
        consumers = {
            {"all three", [&](const auto& p) { return (p[0] * wq + p[1] * wk + p[2] * wv).sum(); }},
            {"k unused", [&](const auto& p) { return (p[0] * wq + p[2] * wv).sum(); }},
            {"q only, transposed", [&](const auto& p) { return (p[0].transpose(2, 3).contiguous() * wq.transpose(2, 3)).sum(); }},
        };
    for (const auto& [name, consume] : consumers) {
      INFO(name << (dtype == torch::kBFloat16 ? ", bf16" : ", fp32"));
      auto x = x0.clone().requires_grad_(), x_ref = x0.clone().requires_grad_();
      const auto [q, k, v] = split_heads(x, H);
      const auto parts = unbind_heads(x_ref);
      REQUIRE(torch::equal(q, parts[0]));
      REQUIRE(torch::equal(k, parts[1]));
      REQUIRE(torch::equal(v, parts[2]));
      REQUIRE(q.data_ptr() == x.data_ptr());  // views, no copy
      REQUIRE(packed_heads(q, k, v));
      consume({q, k, v}).backward();
      consume(parts).backward();
      REQUIRE(x.grad().sizes() == x.sizes());
      REQUIRE(torch::equal(x.grad(), x_ref.grad()));
    }
  }
  REQUIRE_THROWS_WITH(split_heads(torch::zeros({2, 5, 35}), 3), Catch::Contains("split_heads"));
}

TEST_CASE("split_heads: gradients that are slices of one buffer are the projection's gradient, uncopied", "[qkv_heads]") {
  torch::manual_seed(4);
  auto x = torch::randn({B, T, 3 * H * D}, torch::requires_grad());
  const auto [q, k, v] = split_heads(x, H);
  const auto buffer = torch::randn({B, T, 3, H, D});
  auto slice = [&](int64_t i) { return buffer.select(2, i).permute({0, 2, 1, 3}); };
  REQUIRE(packed_heads(slice(0), slice(1), slice(2)));
  const auto grad = torch::autograd::grad({q, k, v}, {x}, {slice(0), slice(1), slice(2)}, true)[0];
  REQUIRE(grad.data_ptr() == buffer.data_ptr());
  REQUIRE(torch::equal(grad, buffer.view({B, T, 3 * H * D})));
  // The same slices in another order are not packed: copied into place, the values right.
  REQUIRE_FALSE(packed_heads(slice(1), slice(0), slice(2)));
  const auto swapped = torch::autograd::grad({q, k, v}, {x}, {slice(1), slice(0), slice(2)}, true)[0];
  REQUIRE(swapped.data_ptr() != buffer.data_ptr());
  REQUIRE(torch::equal(swapped.view({B, T, 3, H, D}), buffer.index_select(2, torch::tensor({1, 0, 2}))));
  // Not packed either: contiguous copies, another dtype, slices of a wider buffer.
  REQUIRE_FALSE(packed_heads(slice(0).contiguous(), slice(1), slice(2)));
  REQUIRE_FALSE(packed_heads(slice(0).to(torch::kBFloat16), slice(1), slice(2)));
  const auto wide = torch::randn({B, T, 4, H, D});
  REQUIRE_FALSE(packed_heads(wide.select(2, 0).permute({0, 2, 1, 3}), wide.select(2, 1).permute({0, 2, 1, 3}),
                             wide.select(2, 2).permute({0, 2, 1, 3})));
}

TEST_CASE("what attention kernels write: heads-major outputs merge without a copy, packed gradients go back uncopied", "[qkv_heads]") {
  torch::manual_seed(5);
  for (const int64_t batch : {int64_t(1), B}) {
    INFO("batch " << batch);
    auto x = torch::randn({batch, T, 3 * H * D}, torch::requires_grad());
    const auto [q, k, v] = split_heads(x, H);
    // The output: (B, H, T, D) whose merge y.transpose(1, 2).reshape(B, T, H D) is a view of it,
    // element (b, h, t, d) at the merged tensor's (b, t, h D + d).
    const auto out = empty_heads_major(q);
    REQUIRE(out.sizes() == q.sizes());
    REQUIRE(out.scalar_type() == q.scalar_type());
    REQUIRE(out.strides() == torch::IntArrayRef(heads_major_strides(q.sizes())));
    out.copy_(torch::randn(q.sizes()));
    const auto merged = out.transpose(1, 2).reshape({batch, T, H * D});
    REQUIRE(merged.data_ptr() == out.data_ptr());
    for (int64_t h = 0; h < H; ++h)
      REQUIRE(torch::equal(merged.narrow(2, h * D, D), out.select(1, h)));
    // The gradients of split_heads' views: slices of one buffer, which split_heads hands on.
    const auto [dq, dk, dv] = empty_head_gradients(q, k, v);
    REQUIRE(packed_heads(dq, dk, dv));
    for (const auto* g : {&dq, &dk, &dv}) REQUIRE(g->strides() == torch::IntArrayRef(packed_head_strides(q.sizes())));
    dq.copy_(torch::randn(q.sizes())), dk.copy_(torch::randn(q.sizes())), dv.copy_(torch::randn(q.sizes()));
    const auto grad = torch::autograd::grad({q, k, v}, {x}, {dq, dk, dv}, true)[0];
    REQUIRE(grad.data_ptr() == dq.data_ptr());
    const auto reference = torch::autograd::grad(unbind_heads_of(x, batch), {x}, {dq, dk, dv}, true)[0];
    REQUIRE(torch::equal(grad, reference));
    // Inputs that are not one projection's slices: a heads-major tensor each.
    const auto qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
    const auto separate = empty_head_gradients(qc, kc, vc);
    REQUIRE_FALSE(packed_heads(separate[0], separate[1], separate[2]));
    for (const auto& g : separate) {
      REQUIRE(g.sizes() == q.sizes());
      REQUIRE(g.strides() == torch::IntArrayRef(heads_major_strides(q.sizes())));
    }
    REQUIRE(separate[0].data_ptr() != separate[1].data_ptr());
  }
}

TEST_CASE("fused CPU attention on split_heads views: gradients written into the projection's layout, equal to the float64 reference", "[qkv_heads][attention][fused_cpu]") {
  const auto probe = torch::zeros({1, 1, 1, 1});
  if (!fused_cpu_attention_unsupported_reason(probe, probe, probe, AttentionBias::none(), {}).empty()) {
    testing::skip_test("this LibTorch exports no sgemm_: the fused CPU attention is not available");
    return;
  }
  torch::manual_seed(5);
  AttentionOptions options;
  options.training = true;
  const auto bias = AttentionBias::linear_causal(torch::tensor({0.5f, 0.25f, 0.125f}));
  for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
    INFO((dtype == torch::kBFloat16 ? "bf16" : "fp32"));
    const auto x0 = torch::randn({B, 70, 3 * H * D}).to(dtype);
    const auto grad_y = torch::randn({B, H, 70, D}).to(dtype);
    auto x = x0.clone().requires_grad_();
    const auto [q, k, v] = split_heads(x, H);
    const auto y = fused_cpu_attention(q, k, v, bias, options);
    const auto grads = torch::autograd::grad({y}, {q, k, v}, {grad_y}, true);
    REQUIRE(packed_heads(grads[0], grads[1], grads[2]));
    y.backward(grad_y);
    // Inputs that are not slices of one tensor get (B, T, H, D) gradients of their own.
    const auto qc = q.detach().contiguous().requires_grad_(), kc = k.detach().contiguous().requires_grad_(),
               vc = v.detach().contiguous().requires_grad_();
    const auto yc = fused_cpu_attention(qc, kc, vc, bias, options);
    const auto own = torch::autograd::grad({yc}, {qc, kc, vc}, {grad_y});
    REQUIRE_FALSE(packed_heads(own[0], own[1], own[2]));
    REQUIRE(torch::equal(own[0], grads[0]));
    REQUIRE(torch::equal(own[2], grads[2]));

    auto x64 = x0.to(torch::kFloat64).requires_grad_();
    const auto parts = x64.view({B, 70, 3, H, D}).permute({2, 0, 3, 1, 4}).unbind(0);
    attention_reference(parts[0], parts[1], parts[2], bias, options).backward(grad_y.to(torch::kFloat64));
    const double scale = x64.grad().abs().max().item<double>();
    REQUIRE((x.grad().to(torch::kFloat64) - x64.grad()).abs().max().item<double>() <
            (dtype == torch::kBFloat16 ? 2e-2 : 1e-4) * scale);
  }
}
