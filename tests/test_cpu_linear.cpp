// Float32 linear layers through oneDNN (core/cpu_linear.h): the output and the three gradients
// against float64, for each layout the weight gradient chooses, with and without a bias; what
// it leaves to torch::linear; and the switch's refusal of a bad value.
#include <catch2/catch.hpp>

#include "core/cpu_linear.h"
#include "core/precision.h"
#include "tests/cli_harness.h"

using namespace extrap;
using namespace extrap::testing;

namespace {

double relative_error(const torch::Tensor& got, const torch::Tensor& expected) {
  return ((got.to(torch::kFloat64) - expected).abs().max() / expected.abs().max()).item<double>();
}

}  // namespace

TEST_CASE("linear on float32 CPU tensors: output and gradients equal float64's to float32 rounding", "[linear]") {
  torch::manual_seed(7);
  // (rows, K, M): a weight gradient with M < K, M > K and M == K (the last stays with MKL),
  // odd sizes, and a (B, T, K) input.
  for (const auto& [rows, K, M] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {256, 32, 96}, {256, 96, 32}, {128, 48, 48}, {77, 33, 19}}) {
    for (const bool with_bias : {true, false}) {
      INFO("rows " << rows << ", K " << K << ", M " << M << (with_bias ? ", bias" : ", no bias"));
      const auto x = torch::randn({rows, K}).view({-1, rows / (rows % 2 ? rows : 2), K}).requires_grad_();
      const auto w = torch::randn({M, K}).requires_grad_();
      const auto b = with_bias ? torch::randn({M}).requires_grad_() : torch::Tensor();
      const auto g = torch::randn({x.size(0), x.size(1), M});
      REQUIRE(onednn_linear_takes(x, w));
      const auto y = linear(x, w, b);
      y.backward(g);

      const auto x64 = x.detach().to(torch::kFloat64).requires_grad_();
      const auto w64 = w.detach().to(torch::kFloat64).requires_grad_();
      const auto b64 = with_bias ? b.detach().to(torch::kFloat64).requires_grad_() : torch::Tensor();
      const auto y64 = torch::linear(x64, w64, b64);
      y64.backward(g.to(torch::kFloat64));
      REQUIRE(y.sizes() == y64.sizes());
      CHECK(relative_error(y, y64) < 1e-5);
      CHECK(relative_error(x.grad(), x64.grad()) < 1e-5);
      CHECK(relative_error(w.grad(), w64.grad()) < 1e-5);
      REQUIRE(w.grad().is_contiguous());
      if (with_bias) CHECK(relative_error(b.grad(), b64.grad()) < 1e-5);
    }
  }
}

TEST_CASE("linear leaves autocast and float64 to LibTorch", "[linear]") {
  torch::manual_seed(3);
  const auto x = torch::randn({64, 32}), w = torch::randn({16, 32}), b = torch::randn({16});
  REQUIRE_FALSE(onednn_linear_takes(x.to(torch::kFloat64), w.to(torch::kFloat64)));
  REQUIRE(torch::equal(linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64)),
                       torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64))));
  {
    ComputePrecision bf16(Precision::bf16, torch::kCPU);  // autocast, as bf16 training runs it
    REQUIRE_FALSE(onednn_linear_takes(x, w));
    const auto y = linear(x, w, b);
    REQUIRE(y.scalar_type() == torch::kBFloat16);  // autocast's product, as torch::linear gives it
    REQUIRE(torch::equal(y, torch::linear(x, w, b)));
  }
}

TEST_CASE("linear: evaluation (no_grad) gives training's numbers, a frozen weight gets no gradient, strided inputs", "[linear]") {
  torch::manual_seed(4);
  const auto w = torch::randn({16, 32}).requires_grad_(), b = torch::randn({16}).requires_grad_();
  const auto x = torch::randn({8, 64, 32});
  const auto trained = linear(x, w, b);
  REQUIRE(trained.requires_grad());
  {
    torch::NoGradGuard no_grad;
    REQUIRE(torch::equal(linear(x, w, b), trained.detach()));
  }
  // Only the input trains (a frozen layer): the input's gradient, none for the weight.
  const auto frozen = w.detach();
  const auto xs = x.clone().requires_grad_();
  const auto g = torch::randn({8, 64, 16});
  extrap::linear(xs, frozen, {}).backward(g);
  REQUIRE_FALSE(frozen.grad().defined());
  const auto expected = g.to(torch::kFloat64).matmul(frozen.to(torch::kFloat64));
  CHECK(relative_error(xs.grad(), expected) < 1e-5);
  // A transposed (non-contiguous) input and a weight that is a transposed view.
  const auto xt = torch::randn({32, 40}).t().requires_grad_();
  const auto wt = torch::randn({32, 12}).t().requires_grad_();
  const auto g2 = torch::randn({40, 12});
  extrap::linear(xt, wt, {}).backward(g2);
  const auto x64 = xt.detach().to(torch::kFloat64), w64 = wt.detach().to(torch::kFloat64);
  CHECK(relative_error(extrap::linear(xt, wt, {}).detach(), x64.matmul(w64.t())) < 1e-5);
  CHECK(relative_error(xt.grad(), g2.to(torch::kFloat64).matmul(w64)) < 1e-5);
  CHECK(relative_error(wt.grad(), g2.to(torch::kFloat64).t().matmul(x64)) < 1e-5);
}

TEST_CASE("linear refuses a double backward by name (oneDNN's operator has no derivative)", "[linear]") {
  const auto x = torch::randn({4, 8}).requires_grad_(), w = torch::randn({3, 8}).requires_grad_();
  const auto y = extrap::linear(x, w, {}).pow(2).sum();
  REQUIRE_THROWS_WITH(torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true),
                      Catch::Contains("no double backward"));
  // A plain backward is unaffected.
  REQUIRE(torch::autograd::grad({y}, {x})[0].defined());
}

TEST_CASE("EXTRAP_ONEDNN_LINEAR: 0 trains float32 through MKL, 1 through oneDNN, anything else is refused by value", "[linear][cli]") {
  TempDir d("onednn-switch");
  require_environment_switch(d, "EXTRAP_ONEDNN_LINEAR", one_step_bench(),
                             "off",
                             "environment variable EXTRAP_ONEDNN_LINEAR=off: expected 0 (float32 linear layers "
                             "through MKL, as LibTorch runs them) or 1 (through oneDNN, the default)",
                             "paths: linear layers through LibTorch,", "paths: linear layers through oneDNN (float32)");
}
