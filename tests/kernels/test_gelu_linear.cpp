// GELU with its backward folded into the next product (core/kernels/gelu_linear.h): GELU's value and
// slope against float64's erf; the layer's output and three gradients against float64, in
// float32 and under bf16 autocast; what it leaves to LibTorch; NaN; the double backward's
// refusal; the switch.
#include <catch2/catch.hpp>

#include "core/kernels/bf16_gemm.h"
#include "core/kernels/cpu_linear.h"
#include "core/kernels/gelu_linear.h"
#include "core/kernels/precision.h"
#include "core/runtime/cpu_isa.h"
#include "tests/support/cli_harness.h"

#include <cmath>

using namespace extrap;
using namespace extrap::testing;

namespace {

// float32 layers fuse where their linear layer goes through oneDNN: where extrap's kernels run
// AVX-512 (core/kernels/cpu_linear.h); on AVX2 paths MKL's products are faster.
bool float32_fused_here() { return extrap::cpu_isa() == extrap::CpuIsa::avx512; }

struct Float64Layer {
  torch::Tensor y, da, dw, db;
};

// linear(gelu(a), w, b) and its gradients for upstream g, in float64 through LibTorch.
Float64Layer float64_layer(const torch::Tensor& a, const torch::Tensor& w, const torch::Tensor& b,
                           const torch::Tensor& g) {
  const auto a64 = a.detach().to(torch::kFloat64).requires_grad_();
  const auto w64 = w.detach().to(torch::kFloat64).requires_grad_();
  const auto b64 = b.defined() ? b.detach().to(torch::kFloat64).requires_grad_() : torch::Tensor();
  const auto y = torch::linear(torch::gelu(a64), w64, b64);
  y.backward(g.to(torch::kFloat64));
  return {y.detach(), a64.grad(), w64.grad(), b.defined() ? b64.grad() : torch::Tensor()};
}

}  // namespace

TEST_CASE("gelu_with_slope: GELU's value and slope against float64's erf", "[gelu]") {
  std::vector<float> x;
  for (float v = -12.0f; v <= 12.0f; v += 0.001953125f) x.push_back(v);
  for (float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 40.0f, -40.0f}) x.push_back(v);
  std::vector<float> value(x.size()), slope(x.size());
  gelu_with_slope(x.data(), value.data(), slope.data(), int64_t(x.size()));
  double worst_value = 0, worst_slope = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i], cdf = 0.5 * std::erfc(-v / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * v * v) / std::sqrt(2.0 * M_PI);
    // Abramowitz and Stegun's erf is good to 1.5e-7 absolute: scaled by |x| in the value.
    worst_value = std::max(worst_value, std::abs(value[i] - v * cdf) / std::max(1.0, std::abs(v)));
    worst_slope = std::max(worst_slope, std::abs(slope[i] - (cdf + v * pdf)) / std::max(1.0, std::abs(v)));
  }
  CHECK(worst_value < 3e-7);
  CHECK(worst_slope < 5e-7);
  // Far tails: exactly the identity and zero, slope 1 and 0.
  CHECK(value[x.size() - 2] == 40.0f);
  CHECK(value[x.size() - 1] == -0.0f);
  CHECK(slope[x.size() - 2] == 1.0f);
  CHECK(slope[x.size() - 1] == 0.0f);
}

TEST_CASE("gelu_linear in float32: output and gradients equal float64's to float32 rounding", "[gelu]") {
  torch::manual_seed(11);
  // (rows, K, M): the second layer's shapes (K > M), K < M, odd sizes, a (B, T, K) input.
  for (const auto& [rows, K, M] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {256, 96, 32}, {128, 24, 40}, {77, 33, 19}}) {
    for (const bool with_bias : {true, false}) {
      INFO("rows " << rows << ", K " << K << ", M " << M << (with_bias ? ", bias" : ", no bias"));
      const auto a = (2 * torch::randn({rows, K})).view({-1, rows % 2 ? rows : rows / 2, K}).requires_grad_();
      const auto w = torch::randn({M, K}).requires_grad_();
      const auto b = with_bias ? torch::randn({M}).requires_grad_() : torch::Tensor();
      const auto g = torch::randn({a.size(0), a.size(1), M});
      REQUIRE(gelu_linear_fused_takes(a, w) == float32_fused_here());
      const auto y = gelu_linear(a, w, b);
      y.backward(g);
      const auto expected = float64_layer(a, w, b, g);
      REQUIRE(y.sizes() == expected.y.sizes());
      CHECK(max_relative_error(y, expected.y) < 1e-5);
      CHECK(max_relative_error(a.grad(), expected.da) < 1e-5);
      CHECK(max_relative_error(w.grad(), expected.dw) < 1e-5);
      if (with_bias) CHECK(max_relative_error(b.grad(), expected.db) < 1e-5);
    }
  }
}

TEST_CASE("gelu_linear under bf16 autocast: bfloat16's accuracy, as LibTorch's autocast path has it", "[gelu][avx512_bf16]") {
  if (!bf16_gemm::supported()) {
    skip_test("this CPU has no AVX512_BF16: the bfloat16 path is not taken");
    return;
  }
  torch::manual_seed(12);
  const auto w = torch::randn({128, 512}).mul_(0.05).requires_grad_(), b = torch::randn({128}).requires_grad_();
  const auto input = torch::randn({4, 64, 512}).mul_(2);
  const auto g = torch::randn({4, 64, 128});
  torch::Tensor fused_a, reference_a;
  std::vector<torch::Tensor> fused, reference;
  for (const bool use_fused : {true, false}) {
    ComputePrecision bf16(Precision::bf16, torch::kCPU);
    const auto a = input.to(torch::kBFloat16).requires_grad_();  // as ffn_in gives it
    w.mutable_grad() = torch::Tensor();
    b.mutable_grad() = torch::Tensor();
    torch::Tensor y;
    if (use_fused) {
      REQUIRE(gelu_linear_fused_takes(a, w));
      y = gelu_linear(a, w, b);
    } else {
      y = torch::linear(torch::gelu(a), w, b);  // LibTorch's autocast path
    }
    REQUIRE(y.scalar_type() == torch::kBFloat16);
    y.backward(g.to(torch::kBFloat16));
    REQUIRE(a.grad().scalar_type() == torch::kBFloat16);
    REQUIRE(w.grad().scalar_type() == torch::kFloat32);
    (use_fused ? fused : reference) = {y.detach(), a.grad(), w.grad(), b.grad()};
  }
  const auto expected = float64_layer(input.to(torch::kBFloat16), w, b, g.to(torch::kBFloat16));
  const std::vector<torch::Tensor> exact = {expected.y, expected.da, expected.dw, expected.db};
  const char* names[] = {"output", "input gradient", "weight gradient", "bias gradient"};
  for (size_t i = 0; i < exact.size(); ++i) {
    INFO(names[i]);
    const double fused_error = max_relative_error(fused[i], exact[i]);
    const double reference_error = max_relative_error(reference[i], exact[i]);
    CHECK(fused_error < 1.5e-2);
    // No worse than LibTorch's own bfloat16 path, give or take a rounding.
    CHECK(fused_error < 2 * reference_error + 4e-3);
  }
}

TEST_CASE("gelu_linear leaves evaluation, frozen layers and float64 to LibTorch, with the same numbers", "[gelu]") {
  torch::manual_seed(13);
  const auto a = torch::randn({8, 16, 32}), w = torch::randn({12, 32}).requires_grad_(), b = torch::randn({12});
  const auto trained = gelu_linear(a, w, b);
  REQUIRE(gelu_linear_fused_takes(a, w) == float32_fused_here());
  {
    torch::NoGradGuard no_grad;
    REQUIRE_FALSE(gelu_linear_fused_takes(a, w));
    const auto evaluated = gelu_linear(a, w, b);
    CHECK(max_relative_error(evaluated, trained.detach().to(torch::kFloat64)) < 1e-6);
  }
  REQUIRE_FALSE(gelu_linear_fused_takes(a, w.detach()));  // nothing to differentiate
  REQUIRE_FALSE(gelu_linear_fused_takes(a.to(torch::kFloat64), w.to(torch::kFloat64)));
  // Only the input trains: its gradient, none for the frozen weight.
  const auto frozen = w.detach();
  const auto x = a.clone().requires_grad_();
  const auto g = torch::randn({8, 16, 12});
  gelu_linear(x, frozen, {}).backward(g);
  REQUIRE_FALSE(frozen.grad().defined());
  CHECK(max_relative_error(x.grad(), float64_layer(a, frozen, {}, g).da) < 1e-5);
}

TEST_CASE("gelu_linear carries NaN through, and refuses a double backward by name", "[gelu]") {
  const auto a = torch::randn({4, 8});
  a[2][3] = std::nanf("");
  const auto x = a.clone().requires_grad_(), w = torch::randn({3, 8}).requires_grad_();
  const auto y = gelu_linear(x, w, {});
  CHECK(torch::isnan(y[2]).all().item<bool>());
  CHECK_FALSE(torch::isnan(y[1]).any().item<bool>());
  const auto loss = gelu_linear(torch::randn({4, 8}).requires_grad_(), w, {}).pow(2).sum();
  if (float32_fused_here())
    REQUIRE_THROWS_WITH(torch::autograd::grad({loss}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true),
                        Catch::Contains("no double backward"));
  else  // AVX2 paths: LibTorch's GELU and linear, which have one
    CHECK(torch::autograd::grad({loss}, {w}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0].requires_grad());
  REQUIRE(torch::autograd::grad({loss}, {w})[0].defined());
}

TEST_CASE("EXTRAP_FUSED_GELU: 0 runs LibTorch's GELU, 1 the fused one, anything else is refused by value", "[gelu][cli]") {
  TempDir d("gelu-switch");
  require_environment_switch(d, "EXTRAP_FUSED_GELU", one_step_bench(), "yes",
                             "environment variable EXTRAP_FUSED_GELU=yes: expected 0 (GELU and its backward as "
                             "LibTorch runs them) or 1 (GELU's backward folded into the next product, the default)",
                             "GELU as LibTorch runs it,",
                             float32_fused_here() ? "GELU backward folded into the next product,"
                                                  : "GELU as LibTorch runs it,");
}
