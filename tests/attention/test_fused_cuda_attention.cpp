// Tests of the fused CUDA attention against the reference (core/attention/attention.h), on fresh
// random inputs for every bias mode, both input types, head dimensions 64 and 128, and odd
// sequence lengths (below, at and across the 64-row tiles).
//
// Criterion (STYLE.md): against an fp64 reference on upcast inputs, the kernel's largest
// error must be at most twice that of LibTorch's own attention computed in the same low
// precision, plus a floor of 1e-4 (max |ref| + 1) for the cases where LibTorch is exact
// (T = 1); outputs also meet atol + rtol |ref|. Outputs are filled with NaN before each run
// so that an element the kernels never write fails the comparison.
// Without a CUDA device every test warns and returns.
#include "core/attention/cuda/fused_attention.h"
#include "positions/alibi_slopes.h"
#include "tests/support/low_precision_check.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <sstream>
#include <tuple>
#include <vector>

namespace {

using extrap::AttentionBias;
using extrap::FusedAlibiLayout;

using extrap::testing::check_close;
using extrap::testing::have_cuda;
using extrap::testing::max_error;

torch::Tensor float_slopes(const std::vector<double>& values) {
  return torch::tensor(values, torch::kFloat64).to(torch::kFloat32);
}

// One bias configuration: how the fused call is made and the equivalent AttentionBias for
// the reference.
struct Case {
  std::string name;
  bool causal = true;
  bool in_kernel = false;  // fused_attention_alibi (slopes computed in the kernel)
  FusedAlibiLayout layout = FusedAlibiLayout::Causal;
  AttentionBias bias;      // reference bias; also the fused bias unless in_kernel
  bool learned = false;    // slopes require grad: check their gradients
};

std::vector<double> repeat_halves(int heads) {
  auto half = extrap::alibi_slopes(heads / 2);
  half.insert(half.end(), half.begin(), half.end());
  return half;
}

torch::Tensor directions(const std::vector<bool>& values) {
  auto t = torch::zeros({int64_t(values.size())}, torch::kBool);
  for (size_t h = 0; h < values.size(); ++h) t[int64_t(h)] = bool(values[h]);
  return t;
}

std::vector<Case> make_cases(int heads) {
  const auto alibi = float_slopes(extrap::alibi_slopes(heads));
  const auto halves = float_slopes(repeat_halves(heads));
  std::vector<bool> first_half(heads), second_half(heads);
  for (int h = 0; h < heads; ++h) first_half[h] = h < heads / 2, second_half[h] = h >= heads / 2;
  std::vector<Case> cases;
  cases.push_back({"none, causal", true, false, {}, AttentionBias::none(), false});
  cases.push_back({"none, bidirectional", false, false, {}, AttentionBias::none(), false});
  cases.push_back({"alibi causal, in-kernel slopes", true, true, FusedAlibiLayout::Causal,
                   AttentionBias::linear_causal(alibi), false});
  cases.push_back({"alibi symmetric, in-kernel slopes", false, true, FusedAlibiLayout::Symmetric,
                   AttentionBias::linear_symmetric(alibi), false});
  cases.push_back({"alibi nonsymmetric, in-kernel slopes", false, true,
                   FusedAlibiLayout::Nonsymmetric,
                   AttentionBias::linear(halves, halves, directions(first_half), directions(second_half)),
                   false});
  cases.push_back({"alibi causal, slope tensor", true, false, {},
                   AttentionBias::linear_causal(alibi.cuda()), false});
  cases.push_back({"alibi symmetric under a causal call", true, false, {},
                   AttentionBias::linear_symmetric(alibi.cuda()), false});
  cases.push_back({"alibi nonsymmetric, slope tensors", false, false, {},
                   AttentionBias::linear(halves.cuda(), halves.cuda(), directions(first_half),
                                         directions(second_half)),
                   false});
  // Mixed directions per head (left, right, both, only the diagonal, ...), fixed slopes.
  std::vector<bool> mixed_left(heads), mixed_right(heads);
  for (int h = 0; h < heads; ++h) mixed_left[h] = h % 4 == 0 || h % 4 == 2, mixed_right[h] = h % 4 == 1 || h % 4 == 2;
  cases.push_back({"mixed directions", false, false, {},
                   AttentionBias::linear(alibi.cuda(), (alibi * 0.5).cuda(), directions(mixed_left),
                                         directions(mixed_right)),
                   false});
  // Learned slopes: separate left and right (bidirectional), and causal.
  auto left = (alibi * 1.5).cuda().requires_grad_(true);
  auto right = (alibi * 0.75).cuda().requires_grad_(true);
  cases.push_back({"learned left and right, bidirectional", false, false, {},
                   AttentionBias::linear(left, right, torch::ones({heads}, torch::kBool),
                                         torch::ones({heads}, torch::kBool)),
                   true});
  auto causal_slopes = alibi.cuda().requires_grad_(true);
  cases.push_back({"learned causal", true, false, {}, AttentionBias::linear_causal(causal_slopes), true});
  return cases;
}

// A copy of the bias whose slope tensors are fresh leaves of `type` on `device` (requiring
// grad when `learned`), so that each computation owns its slope gradients.
AttentionBias bias_copy(const AttentionBias& bias, torch::ScalarType type, torch::Device device,
                        bool learned) {
  if (bias.kind != AttentionBias::Kind::Linear) return bias;
  auto left = bias.slopes_left.detach().to(device, type).clone().requires_grad_(learned);
  auto right = bias.slopes_right.detach().to(device, type).clone().requires_grad_(learned);
  return AttentionBias::linear(left, right, bias.look_left, bias.look_right);
}

struct Results {
  torch::Tensor out, dq, dk, dv, dslopes_left, dslopes_right;
};

// LibTorch's attention (attention_reference) on inputs converted to `type`.
Results reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  const torch::Tensor& dout, const Case& c, torch::ScalarType type) {
  auto q2 = q.detach().to(type).requires_grad_(true);
  auto k2 = k.detach().to(type).requires_grad_(true);
  auto v2 = v.detach().to(type).requires_grad_(true);
  // Slopes in fp64 for the fp64 reference, fp32 otherwise (as the models hold them).
  const auto slope_type = type == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  AttentionBias bias = bias_copy(c.bias, slope_type, q.device(), c.learned);
  extrap::AttentionOptions options;
  options.causal = c.causal;
  auto out = extrap::attention_reference(q2, k2, v2, bias, options);
  out.backward(dout.to(type));
  Results r{out.detach(), q2.grad(), k2.grad(), v2.grad(), {}, {}};
  if (c.learned) r.dslopes_left = bias.slopes_left.grad(), r.dslopes_right = bias.slopes_right.grad();
  return r;
}

// The kernels through fused_detail on NaN-poisoned outputs.
Results fused_poisoned(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& dout, const Case& c) {
  namespace fd = extrap::fused_detail;
  const AttentionBias bias = bias_copy(c.bias, torch::kFloat32, q.device(), c.learned);
  fd::KernelBias kb = c.in_kernel ? fd::plan_alibi(c.layout, q.size(1))
                                  : fd::plan_bias(bias, q.size(1), c.causal, q.device());
  REQUIRE(kb.unsupported.empty());
  const auto nan = std::numeric_limits<double>::quiet_NaN();
  auto out = torch::full_like(q, nan);
  auto lse = torch::full({q.size(0), q.size(1), q.size(2)}, nan, q.options().dtype(torch::kFloat32));
  fd::forward_into(q, k, v, kb, c.causal, out, lse);
  auto dq = torch::full_like(q, nan), dk = torch::full_like(k, nan), dv = torch::full_like(v, nan);
  torch::Tensor dsl, dsr;
  if (kb.slope_grads) {
    dsl = torch::zeros({q.size(1)}, q.options().dtype(torch::kFloat32));
    dsr = torch::zeros({q.size(1)}, q.options().dtype(torch::kFloat32));
  }
  fd::backward_into(q, k, v, out, lse, dout, kb, c.causal, dq, dk, dv, dsl, dsr);
  CHECK(torch::isfinite(lse).all().item<bool>());
  return {out, dq, dk, dv, dsl, dsr};
}

// The kernels through the autograd function (what the models call).
Results fused_autograd(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& dout, const Case& c) {
  auto q2 = q.detach().clone().requires_grad_(true);
  auto k2 = k.detach().clone().requires_grad_(true);
  auto v2 = v.detach().clone().requires_grad_(true);
  const AttentionBias bias = bias_copy(c.bias, torch::kFloat32, q.device(), c.learned);
  auto out = c.in_kernel ? extrap::fused_attention_alibi(q2, k2, v2, c.layout, c.causal)
                         : extrap::fused_attention(q2, k2, v2, bias, c.causal);
  out.backward(dout);
  Results r{out.detach(), q2.grad(), k2.grad(), v2.grad(), {}, {}};
  if (c.learned) r.dslopes_left = bias.slopes_left.grad(), r.dslopes_right = bias.slopes_right.grad();
  return r;
}

}  // namespace

TEST_CASE("fused attention: geometric slopes computed in the kernel", "[cuda]") {
  if (!have_cuda()) return;
  for (int heads : {1, 2, 8, 12, 16, 24, 64}) {
    INFO("heads " << heads);
    const auto expected = float_slopes(extrap::alibi_slopes(heads)).cuda();
    auto [left, right] = extrap::fused_alibi_geometric_slopes(FusedAlibiLayout::Causal, heads, torch::kCUDA);
    // One rounding of the same double: equal to within one float ulp.
    CHECK(torch::allclose(left, expected, 1.2e-7, 0.0));
    CHECK(right.eq(0).all().item<bool>());
    std::tie(left, right) = extrap::fused_alibi_geometric_slopes(FusedAlibiLayout::Symmetric, heads, torch::kCUDA);
    CHECK(torch::allclose(left, expected, 1.2e-7, 0.0));
    CHECK(torch::allclose(right, expected, 1.2e-7, 0.0));
    if (heads % 2 == 0) {
      const auto half = float_slopes(extrap::alibi_slopes(heads / 2)).cuda();
      const auto zeros = torch::zeros({heads / 2}, half.options());
      std::tie(left, right) =
          extrap::fused_alibi_geometric_slopes(FusedAlibiLayout::Nonsymmetric, heads, torch::kCUDA);
      CHECK(torch::allclose(left, torch::cat({half, zeros}), 1.2e-7, 0.0));
      CHECK(torch::allclose(right, torch::cat({zeros, half}), 1.2e-7, 0.0));
    }
  }
  // Spot values from the paper: 8 heads 1/2 .. 1/256; 12 heads end with 16-head slopes 0, 2, 4, 6.
  auto [left8, right8] = extrap::fused_alibi_geometric_slopes(FusedAlibiLayout::Causal, 8, torch::kCUDA);
  CHECK(left8[0].item<float>() == 0.5f);
  CHECK(left8[7].item<float>() == 1.0f / 256);
  auto [left12, right12] = extrap::fused_alibi_geometric_slopes(FusedAlibiLayout::Causal, 12, torch::kCUDA);
  CHECK(left12[8].item<float>() == static_cast<float>(std::pow(2.0, -0.5)));
  CHECK(left12[11].item<float>() == static_cast<float>(std::pow(2.0, -3.5)));
}

TEST_CASE("fused attention matches the reference: outputs and gradients", "[cuda]") {
  if (!have_cuda()) return;
  torch::manual_seed(20240611);
  const int64_t batch = 2, heads = 6;  // 6: not a power of two; 3 heads per nonsymmetric half
  for (const auto type : {torch::kBFloat16, torch::kHalf}) {
    for (const int64_t head_dim : {64, 128}) {
      for (const int64_t length : {1, 17, 64, 100, 257, 1000}) {
        for (const Case& c : make_cases(int(heads))) {
          std::ostringstream where;
          where << c.name << ", " << (type == torch::kBFloat16 ? "bf16" : "fp16") << ", D " << head_dim
                << ", T " << length;
          INFO(where.str());
          const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(type);
          const auto q = torch::randn({batch, heads, length, head_dim}, options);
          const auto k = torch::randn({batch, heads, length, head_dim}, options);
          const auto v = torch::randn({batch, heads, length, head_dim}, options);
          const auto dout = torch::randn({batch, heads, length, head_dim}, options);

          const Results ref = reference(q, k, v, dout, c, torch::kFloat64);
          const Results low = reference(q, k, v, dout, c, type);
          const Results fused = fused_poisoned(q, k, v, dout, c);

          check_close("out", fused.out, low.out, ref.out);
          const double tolerance = type == torch::kBFloat16 ? 1e-2 : 2e-3;
          CHECK(((fused.out.to(torch::kFloat64) - ref.out).abs() <= tolerance + tolerance * ref.out.abs())
                    .all()
                    .item<bool>());
          check_close("dq", fused.dq, low.dq, ref.dq);
          check_close("dk", fused.dk, low.dk, ref.dk);
          check_close("dv", fused.dv, low.dv, ref.dv);
          if (c.learned) {
            check_close("dslopes_left", fused.dslopes_left, low.dslopes_left, ref.dslopes_left);
            check_close("dslopes_right", fused.dslopes_right, low.dslopes_right, ref.dslopes_right);
          }

          // The autograd function computes the same (dq and slope sums use atomics, so
          // their order of addition, and last bits, may differ).
          const Results via_autograd = fused_autograd(q, k, v, dout, c);
          CHECK(torch::equal(via_autograd.out, fused.out));
          CHECK(torch::allclose(via_autograd.dq.to(torch::kFloat32), fused.dq.to(torch::kFloat32), 1e-2, 1e-3));
          CHECK(torch::equal(via_autograd.dk, fused.dk));
          CHECK(torch::equal(via_autograd.dv, fused.dv));
          if (c.learned) {
            CHECK(torch::allclose(via_autograd.dslopes_left, fused.dslopes_left, 1e-4, 1e-4));
            CHECK(torch::allclose(via_autograd.dslopes_right, fused.dslopes_right, 1e-4, 1e-4));
          }
        }
      }
    }
  }
}

TEST_CASE("fused attention accepts strided views in the kernel layout", "[cuda]") {
  if (!have_cuda()) return;
  torch::manual_seed(7);
  // q, k, v as slices of one (B, T, 3, H, D) projection: no copies needed.
  const int64_t batch = 2, length = 129, heads = 4, head_dim = 64;
  const auto qkv = torch::randn({batch, length, 3, heads, head_dim},
                                torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16));
  const auto q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2),
             v = qkv.select(2, 2).transpose(1, 2);  // (B, H, T, D) views
  const auto bias = AttentionBias::linear_causal(float_slopes(extrap::alibi_slopes(heads)).cuda());
  const auto out = extrap::fused_attention(q, k, v, bias, true);
  extrap::AttentionOptions options;
  const auto ref = extrap::attention_reference(q.to(torch::kFloat64), k.to(torch::kFloat64),
                                               v.to(torch::kFloat64), bias, options);
  CHECK(max_error(out, ref) < 2e-2);
}

TEST_CASE("fused attention: the attention dispatcher routes to it", "[cuda]") {
  if (!have_cuda()) return;
  const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto q = torch::randn({1, 2, 40, 64}, options), k = torch::randn({1, 2, 40, 64}, options),
             v = torch::randn({1, 2, 40, 64}, options);
  const auto bias = AttentionBias::linear_causal(float_slopes(extrap::alibi_slopes(2)).cuda());
  extrap::AttentionOptions attention_options;
  attention_options.backend = extrap::AttentionBackend::Fused;
  const auto via_dispatcher = extrap::attention(q, k, v, bias, attention_options);
  CHECK(torch::equal(via_dispatcher, extrap::fused_attention(q, k, v, bias, true)));
  attention_options.backend = extrap::AttentionBackend::Auto;
  CHECK(torch::equal(extrap::attention(q, k, v, bias, attention_options), via_dispatcher));
}

TEST_CASE("fused attention: unsupported calls fail with a clear message", "[cuda]") {
  if (!have_cuda()) return;
  const auto bf16 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const auto q = torch::randn({1, 2, 16, 64}, bf16);
  const auto none = AttentionBias::none();
  using Catch::Matchers::Contains;
  const auto q32 = q.to(torch::kFloat32);
  CHECK_THROWS_WITH(extrap::fused_attention(q32, q32, q32, none, true), Contains("bfloat16 or float16"));
  const auto q96 = torch::randn({1, 2, 16, 96}, bf16);
  CHECK_THROWS_WITH(extrap::fused_attention(q96, q96, q96, none, true), Contains("head dimension"));
  const auto cpu = q.cpu();
  CHECK_THROWS_WITH(extrap::fused_attention(cpu, cpu, cpu, none, true), Contains("CUDA"));
  const auto dense = AttentionBias::dense_blocks([](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    return torch::zeros({2, q1 - q0, k1 - k0});
  });
  CHECK_THROWS_WITH(extrap::fused_attention(q, q, q, dense, true), Contains("offset j - i alone"));
  // A table of offsets that by_offset returns in the wrong shape is refused, naming both shapes.
  const auto short_table = AttentionBias::dense_by_offset([](int64_t lo, int64_t hi) {
    return torch::zeros({2, hi - lo - 1}, torch::TensorOptions().device(torch::kCUDA));
  });
  CHECK_THROWS_WITH(extrap::fused_attention(q, q, q, short_table, true), Contains("returned"));
  CHECK_FALSE(extrap::fused_attention_unsupported_reason(q, q, q, dense, true).empty());
  CHECK(extrap::fused_attention_unsupported_reason(q, q, q, none, true).empty());
  const auto q3 = torch::randn({1, 3, 16, 64}, bf16);
  CHECK_THROWS_WITH(extrap::fused_attention_alibi(q3, q3, q3, FusedAlibiLayout::Nonsymmetric, false),
                    Contains("even number of heads"));
}

// A small run for compute-sanitizer (memcheck, racecheck): few sizes, every kernel.
TEST_CASE("fused attention: small run for the sanitizers", "[cuda][sanitize]") {
  if (!have_cuda()) return;
  torch::manual_seed(3);
  for (const int64_t head_dim : {64, 128}) {
    for (const int64_t length : {17, 100, 200}) {  // 200: two forward blocks, four query tiles
      for (const Case& c : make_cases(4)) {
        INFO(c.name << ", D " << head_dim << ", T " << length);
        const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
        const auto q = torch::randn({1, 4, length, head_dim}, options);
        const auto k = torch::randn({1, 4, length, head_dim}, options);
        const auto v = torch::randn({1, 4, length, head_dim}, options);
        const auto dout = torch::randn({1, 4, length, head_dim}, options);
        const Results fused = fused_poisoned(q, k, v, dout, c);
        CHECK(torch::isfinite(fused.out).all().item<bool>());
        CHECK(torch::isfinite(fused.dq).all().item<bool>());
        CHECK(torch::isfinite(fused.dk).all().item<bool>());
        CHECK(torch::isfinite(fused.dv).all().item<bool>());
      }
      // The offsets table (Offsets mode): its reads and the gradient's shared and global
      // atomics, causal (a table of j - i <= 0 only) and not.
      for (const bool causal : {true, false}) {
        INFO("offsets, causal " << causal << ", D " << head_dim << ", T " << length);
        const auto options = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
        const auto q = torch::randn({1, 4, length, head_dim}, options);
        auto table = torch::randn({4, 2 * length - 1}, torch::TensorOptions().device(torch::kCUDA))
                         .requires_grad_(true);
        const auto bias = AttentionBias::dense_by_offset([table, length](int64_t lo, int64_t hi) {
          return table.narrow(1, lo + length - 1, hi - lo);
        });
        auto qg = q.clone().requires_grad_(true);
        const auto out = extrap::fused_attention(qg, q, q, bias, causal);
        out.sum().backward();
        CHECK(torch::isfinite(out).all().item<bool>());
        CHECK(torch::isfinite(table.grad()).all().item<bool>());
        if (causal) CHECK(table.grad().narrow(1, length, length - 1).eq(0).all().item<bool>());  // j > i: none
      }
    }
  }
}
