// Linear layers through oneDNN (core/kernels/cpu_linear.h), float32 and under bf16 autocast: the output and the three gradients
// against float64, for each layout the weight gradient chooses, with and without a bias; what
// it leaves to torch::linear; and the switch's refusal of a bad value.
#include <catch2/catch.hpp>

#include "core/kernels/cpu_linear.h"
#include "core/kernels/precision.h"
#include "core/runtime/cpu_isa.h"
#include "tests/support/cli_harness.h"

using namespace extrap;
using namespace extrap::testing;

namespace {

// x w^T + b and its gradients for the output gradient g, in float64 on the given values:
// {y, dx, dw} and db where there is a b.
std::vector<torch::Tensor> float64_linear(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                          const torch::Tensor& g) {
  const auto x64 = x.detach().to(torch::kFloat64).requires_grad_();
  const auto w64 = w.detach().to(torch::kFloat64).requires_grad_();
  const auto b64 = b.defined() ? b.detach().to(torch::kFloat64).requires_grad_() : torch::Tensor();
  const auto y64 = torch::linear(x64, w64, b64);
  y64.backward(g.to(torch::kFloat64));
  std::vector<torch::Tensor> out = {y64.detach(), x64.grad(), w64.grad()};
  if (b.defined()) out.push_back(b64.grad());
  return out;
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
      // oneDNN where extrap's kernels run AVX-512, MKL (LibTorch's linear) on AVX2 paths: the
      // per-capability choice; the numbers below hold for whichever it is.
      REQUIRE(onednn_linear_takes(x, w) == (cpu_isa() == CpuIsa::avx512));
      const auto y = linear(x, w, b);
      y.backward(g);

      const auto exact = float64_linear(x, w, b, g);
      REQUIRE(y.sizes() == exact[0].sizes());
      CHECK(max_relative_error(y, exact[0]) < 1e-5);
      CHECK(max_relative_error(x.grad(), exact[1]) < 1e-5);
      CHECK(max_relative_error(w.grad(), exact[2]) < 1e-5);
      REQUIRE(w.grad().is_contiguous());
      if (with_bias) CHECK(max_relative_error(b.grad(), exact[3]) < 1e-5);
    }
  }
}

TEST_CASE("linear leaves float64, and bf16 autocast without fast bfloat16 products, to LibTorch", "[linear]") {
  torch::manual_seed(3);
  const auto x = torch::randn({64, 32}), w = torch::randn({16, 32}), b = torch::randn({16});
  REQUIRE_FALSE(onednn_linear_takes(x.to(torch::kFloat64), w.to(torch::kFloat64)));
  REQUIRE_FALSE(onednn_bf16_linear_takes(x, w));  // no autocast
  REQUIRE(torch::equal(linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64)),
                       torch::linear(x.to(torch::kFloat64), w.to(torch::kFloat64), b.to(torch::kFloat64))));
  {
    ComputePrecision bf16(Precision::bf16, torch::kCPU);  // autocast, as bf16 training runs it
    REQUIRE_FALSE(onednn_linear_takes(x, w));
    REQUIRE_FALSE(onednn_bf16_linear_takes(x.to(torch::kFloat64), w.to(torch::kFloat64)));
    const auto y = linear(x, w, b);
    REQUIRE(y.scalar_type() == torch::kBFloat16);  // autocast's dtype either way
    if (cpu_has_fast_bf16()) {
      REQUIRE(onednn_bf16_linear_takes(x, w));
      CHECK(max_relative_error(y, torch::linear(x, w, b).to(torch::kFloat64)) < 1e-2);
    } else {
      REQUIRE_FALSE(onednn_bf16_linear_takes(x, w));
      REQUIRE(torch::equal(y, torch::linear(x, w, b)));
    }
  }
}

TEST_CASE("linear under bf16 autocast: bfloat16's accuracy, as LibTorch's autocast path has it", "[linear][avx512_bf16]") {
  if (!cpu_has_fast_bf16()) {
    skip_test("this CPU has no AVX512_BF16 or AMX: linear leaves bf16 autocast to LibTorch");
    return;
  }
  torch::manual_seed(8);
  // (rows, K, M): weight gradients with M < K, M > K and M == K, odd sizes; float32 inputs (cast
  // as autocast casts them) and bfloat16 ones (an earlier product's output).
  for (const auto& [rows, K, M] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {512, 128, 384}, {512, 512, 128}, {256, 64, 64}, {77, 33, 19}}) {
    for (const bool with_bias : {true, false}) {
      for (const auto input_dtype : {torch::kFloat32, torch::kBFloat16}) {
        INFO("rows " << rows << ", K " << K << ", M " << M << (with_bias ? ", bias" : ", no bias")
                     << (input_dtype == torch::kBFloat16 ? ", bfloat16 input" : ", float32 input"));
        const auto input = torch::randn({rows, K}).to(input_dtype);
        const auto w = torch::randn({M, K}).mul_(0.1).requires_grad_();
        const auto b = with_bias ? torch::randn({M}).requires_grad_() : torch::Tensor();
        const auto g = torch::randn({rows, M}).to(torch::kBFloat16);
        std::vector<torch::Tensor> ours, libtorch;
        for (const bool use_ours : {true, false}) {
          ComputePrecision bf16(Precision::bf16, torch::kCPU);
          const auto x = input.clone().requires_grad_();
          w.mutable_grad() = torch::Tensor();
          if (with_bias) b.mutable_grad() = torch::Tensor();
          REQUIRE(onednn_bf16_linear_takes(x, w));
          const auto y = use_ours ? linear(x, w, b) : torch::linear(x, w, b);
          REQUIRE(y.scalar_type() == torch::kBFloat16);
          y.backward(g);
          REQUIRE(x.grad().scalar_type() == input_dtype);
          REQUIRE(w.grad().scalar_type() == torch::kFloat32);
          REQUIRE(w.grad().is_contiguous());
          auto& results = use_ours ? ours : libtorch;
          results = {y.detach(), x.grad(), w.grad()};
          if (with_bias) results.push_back(b.grad());
        }
        // float64 on the bfloat16-rounded operands, as both paths see them.
        const auto rounded = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kBFloat16) : t; };
        const auto exact = float64_linear(rounded(input), rounded(w), rounded(b), g);
        const char* names[] = {"output", "input gradient", "weight gradient", "bias gradient"};
        for (size_t i = 0; i < exact.size(); ++i) {
          INFO(names[i]);
          const double our_error = max_relative_error(ours[i], exact[i]);
          CHECK(our_error < 1.5e-2);
          // No worse than LibTorch's own bfloat16 path, give or take a rounding.
          CHECK(our_error < 2 * max_relative_error(libtorch[i], exact[i]) + 4e-3);
        }
      }
    }
  }
}

TEST_CASE("linear_bias_gradient: a bfloat16 gradient's column sums in float32, the same for any thread count", "[linear]") {
  torch::manual_seed(9);
  for (const auto& [N, M] : std::vector<std::pair<int64_t, int64_t>>{{4096, 384}, {77, 19}, {1, 5}, {130, 128}}) {
    INFO("N " << N << ", M " << M);
    const auto g = (torch::randn({N, M}) + 3).to(torch::kBFloat16);  // an offset: sums far from 0
    const auto expected = g.to(torch::kFloat64).sum(0);
    const int threads = torch::get_num_threads();
    std::vector<torch::Tensor> sums;
    for (const int n : {1, 2, 3}) {
      torch::set_num_threads(n);
      sums.push_back(linear_bias_gradient(g));
    }
    torch::set_num_threads(threads);
    REQUIRE(sums[0].scalar_type() == torch::kFloat32);
    CHECK(max_relative_error(sums[0], expected) < 1e-6);  // float32 sums, not bfloat16's
    CHECK(torch::equal(sums[0], sums[1]));
    CHECK(torch::equal(sums[0], sums[2]));
  }
  // float32 and strided gradients: LibTorch's sum.
  const auto f = torch::randn({64, 8});
  CHECK(torch::equal(linear_bias_gradient(f), f.sum(0)));
  const auto strided = torch::randn({8, 64}).to(torch::kBFloat16).t();
  CHECK(torch::equal(linear_bias_gradient(strided), strided.sum(0)));
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
  CHECK(max_relative_error(xs.grad(), expected) < 1e-5);
  // A transposed (non-contiguous) input and a weight that is a transposed view.
  const auto xt = torch::randn({32, 40}).t().requires_grad_();
  const auto wt = torch::randn({32, 12}).t().requires_grad_();
  const auto g2 = torch::randn({40, 12});
  extrap::linear(xt, wt, {}).backward(g2);
  const auto x64 = xt.detach().to(torch::kFloat64), w64 = wt.detach().to(torch::kFloat64);
  CHECK(max_relative_error(extrap::linear(xt, wt, {}).detach(), x64.matmul(w64.t())) < 1e-5);
  CHECK(max_relative_error(xt.grad(), g2.to(torch::kFloat64).matmul(w64)) < 1e-5);
  CHECK(max_relative_error(wt.grad(), g2.to(torch::kFloat64).t().matmul(x64)) < 1e-5);
}

TEST_CASE("linear refuses a double backward by name (oneDNN's operator has no derivative)", "[linear]") {
  const auto x = torch::randn({4, 8}).requires_grad_(), w = torch::randn({3, 8}).requires_grad_();
  const auto y = extrap::linear(x, w, {}).pow(2).sum();
  if (onednn_linear_takes(x, w))
    REQUIRE_THROWS_WITH(torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true),
                        Catch::Contains("no double backward"));
  else  // AVX2 paths: LibTorch's linear, which has one
    CHECK(torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0].requires_grad());
  // A plain backward is unaffected.
  REQUIRE(torch::autograd::grad({y}, {x})[0].defined());
}

TEST_CASE("EXTRAP_ONEDNN_LINEAR: 0 trains float32 through MKL, 1 through oneDNN, anything else is refused by value", "[linear][cli]") {
  TempDir d("onednn-switch");
  require_environment_switch(d, "EXTRAP_ONEDNN_LINEAR", one_step_bench(),
                             "off",
                             "environment variable EXTRAP_ONEDNN_LINEAR=off: expected 0 (linear layers as LibTorch "
                             "runs them: MKL in float32, autocast in bfloat16) or 1 (through oneDNN where "
                             "extrap's kernels run AVX-512, the default)",
                             "paths: linear layers through LibTorch,",
                             cpu_isa() == CpuIsa::avx512 ? "paths: linear layers through oneDNN (float32)"
                                                         : "paths: linear layers through LibTorch,");
}
