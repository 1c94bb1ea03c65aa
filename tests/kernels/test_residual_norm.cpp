// The residual add fused with the LayerNorm after it (core/kernels/residual_norm.h): h, u and the
// gradients of x, y, the weight and the bias against float64, with y in float32 and bfloat16,
// without y, with h unused; thread-count independence; what it leaves to LibTorch; a model's
// loss with and without it; the double backward's refusal; the switch.
#include <catch2/catch.hpp>

#include "core/kernels/precision.h"
#include "core/kernels/residual_norm.h"
#include "core/model/model.h"
#include "tests/support/cli_harness.h"
#include "tests/support/norm_support.h"
#include "tests/support/test_support.h"

using namespace extrap;
using namespace extrap::testing;

namespace {

struct Float64Case {
  torch::Tensor h, u, dx, dy, dw, db;
};

// h = x + y, u = layer_norm(h) and the gradients of (h gh).sum() + (u gu).sum() in float64.
Float64Case float64_case(const torch::Tensor& x, const torch::Tensor& y, const torch::nn::LayerNorm& norm,
                         const torch::Tensor& gh, const torch::Tensor& gu) {
  const auto x64 = x.detach().to(torch::kFloat64).requires_grad_();
  const auto y64 = y.defined() ? y.detach().to(torch::kFloat64).requires_grad_() : torch::Tensor();
  const auto w64 = norm->weight.detach().to(torch::kFloat64).requires_grad_();
  const auto b64 = norm->bias.detach().to(torch::kFloat64).requires_grad_();
  const auto h = y.defined() ? x64 + y64 : x64;
  const auto u = torch::layer_norm(h, {x.size(-1)}, w64, b64, norm->options.eps());
  auto loss = (u * gu.to(torch::kFloat64)).sum();
  if (gh.defined()) loss = loss + (h * gh.to(torch::kFloat64)).sum();
  loss.backward();
  return {h.detach(), u.detach(), x64.grad(), y.defined() ? y64.grad() : torch::Tensor(), w64.grad(), b64.grad()};
}

// The gradients of x, y (where there is one), the LayerNorm's weight and bias against float64's:
// y's to dy_tolerance (a bfloat16 y's gradient is bfloat16), the others to float32 rounding.
void check_gradients(const torch::Tensor& x, const torch::Tensor& y, const torch::nn::LayerNorm& norm,
                     const Float64Case& expected, double dy_tolerance) {
  CHECK(max_relative_error(x.grad(), expected.dx) < 1e-5);
  if (y.defined()) CHECK(max_relative_error(y.grad(), expected.dy) < dy_tolerance);
  CHECK(max_relative_error(norm->weight.grad(), expected.dw) < 1e-5);
  CHECK(max_relative_error(norm->bias.grad(), expected.db) < 1e-5);
}

}  // namespace

TEST_CASE("add_layer_norm in float32: h, u and every gradient equal float64's to float32 rounding", "[layer_norm]") {
  torch::manual_seed(21);
  for (const int64_t D : {128, 37}) {
    for (const bool with_y : {true, false}) {
      for (const bool h_used : {true, false}) {
        INFO("D " << D << (with_y ? ", with y" : ", no y") << (h_used ? ", h used" : ", h unused"));
        auto norm = random_layer_norm(D);
        norm->weight.mutable_grad() = torch::Tensor();
        const auto x = (3 + 2 * torch::randn({3, 70, D})).requires_grad_();
        const auto y = with_y ? torch::randn({3, 70, D}).requires_grad_() : torch::Tensor();
        const auto gh = h_used ? torch::randn({3, 70, D}) : torch::Tensor();
        const auto gu = torch::randn({3, 70, D});
        REQUIRE(add_layer_norm_fused_takes(x, y, norm));
        const auto [h, u] = add_layer_norm(x, y, norm);
        REQUIRE(u.scalar_type() == torch::kFloat32);
        auto loss = (u * gu).sum();
        if (h_used) loss = loss + (h * gh).sum();
        loss.backward();
        const auto expected = float64_case(x, y, norm, gh, gu);
        CHECK(max_relative_error(h, expected.h) < 1e-6);
        CHECK(max_relative_error(u, expected.u) < 1e-5);
        check_gradients(x, y, norm, expected, 1e-5);
      }
    }
  }
}

TEST_CASE("add_layer_norm with a bfloat16 y and a bfloat16 u: y widened exactly, u rounded once, dy in bfloat16", "[layer_norm]") {
  torch::manual_seed(22);
  auto norm = random_layer_norm(128);
  const auto x = torch::randn({2, 64, 128}).requires_grad_();
  const auto y = torch::randn({2, 64, 128}).to(torch::kBFloat16).requires_grad_();
  const auto gh = torch::randn({2, 64, 128}), gu = torch::randn({2, 64, 128}).to(torch::kBFloat16);
  const auto [h, u] = add_layer_norm(x, y, norm, torch::kBFloat16);
  REQUIRE(h.scalar_type() == torch::kFloat32);
  REQUIRE(u.scalar_type() == torch::kBFloat16);
  ((h * gh).sum() + (u.to(torch::kFloat32) * gu.to(torch::kFloat32)).sum()).backward();
  REQUIRE(y.grad().scalar_type() == torch::kBFloat16);
  const auto expected = float64_case(x, y, norm, gh, gu);
  // h is x + y in float32 exactly as LibTorch's mixed add; u is float32's LayerNorm rounded to bfloat16.
  CHECK(torch::equal(h, x.detach() + y.detach()));
  CHECK(max_relative_error(u, expected.u) < 4e-3);
  check_gradients(x, y, norm, expected, 4e-3);
}

TEST_CASE("add_layer_norm_with_copy: u in float32 and its bfloat16 rounding from one pass, their gradients added", "[layer_norm]") {
  torch::manual_seed(25);
  const auto x0 = torch::randn({2, 70, 128}), y0 = torch::randn({2, 70, 128}).to(torch::kBFloat16);
  const auto gh = torch::randn({2, 70, 128}), gu = torch::randn({2, 70, 128}),
             gl = torch::randn({2, 70, 128}).to(torch::kBFloat16);
  {
    auto norm = random_layer_norm(128);
    const auto [h, u, u_low] = add_layer_norm_with_copy(x0.clone().requires_grad_(), y0, norm);
    REQUIRE_FALSE(u_low.defined());  // no autocast: no copy
  }
  // Which outputs the loss reads: both (the attention's LayerNorm under a method that reads its
  // input), the copy only (the usual case), u only; with and without y.
  for (const bool with_y : {true, false}) {
    for (const int reads : {0, 1, 2}) {
      INFO((with_y ? "with y, " : "no y, ") << (reads == 0 ? "u and the copy" : reads == 1 ? "the copy only" : "u only"));
      auto norm = random_layer_norm(128);
      const auto x = x0.clone().requires_grad_();
      const auto y = with_y ? y0.clone().requires_grad_() : torch::Tensor();
      torch::Tensor h, u, u_low;
      {
        ComputePrecision bf16(Precision::bf16, torch::kCPU);
        std::tie(h, u, u_low) = add_layer_norm_with_copy(x, y, norm);
      }
      REQUIRE(u.scalar_type() == torch::kFloat32);
      REQUIRE(u_low.scalar_type() == torch::kBFloat16);
      CHECK(torch::equal(u_low, u.detach().to(torch::kBFloat16)));  // the cast autocast would make
      auto loss = (h * gh).sum();
      if (reads != 1) loss = loss + (u * gu).sum();
      if (reads != 2) loss = loss + (u_low.to(torch::kFloat32) * gl.to(torch::kFloat32)).sum();
      loss.backward();
      // float64: u's gradient is gu + gl (each where read).
      const auto zero = torch::zeros_like(gu);
      const auto expected = float64_case(x, y, norm, gh, (reads != 1 ? gu : zero) + (reads != 2 ? gl.to(torch::kFloat32) : zero));
      CHECK(max_relative_error(u, expected.u) < 1e-5);
      check_gradients(x, y, norm, expected, 4e-3);
    }
  }
}

TEST_CASE("add_layer_norm: the weight and bias gradients do not depend on the thread count", "[layer_norm]") {
  torch::manual_seed(23);
  auto norm = random_layer_norm(96);
  const auto x0 = torch::randn({5, 300, 96}), y0 = torch::randn({5, 300, 96}), gu = torch::randn({5, 300, 96});
  const int threads = torch::get_num_threads();
  std::vector<torch::Tensor> grads;
  for (const int n : {1, 2, 3}) {
    torch::set_num_threads(n);
    norm->weight.mutable_grad() = torch::Tensor();
    norm->bias.mutable_grad() = torch::Tensor();
    const auto x = x0.clone().requires_grad_(), y = y0.clone().requires_grad_();
    (add_layer_norm(x, y, norm).second * gu).sum().backward();
    grads.push_back(torch::cat({norm->weight.grad(), norm->bias.grad(), x.grad().flatten()}));
  }
  torch::set_num_threads(threads);
  CHECK(torch::equal(grads[0], grads[1]));
  CHECK(torch::equal(grads[0], grads[2]));
}

TEST_CASE("add_layer_norm leaves evaluation and float64 to LibTorch, with training's numbers", "[layer_norm]") {
  torch::manual_seed(24);
  auto norm = random_layer_norm(64);
  const auto x = torch::randn({4, 10, 64}), y = torch::randn({4, 10, 64});
  REQUIRE(add_layer_norm_fused_takes(x, y, norm));  // the norm's weight trains
  const auto trained = add_layer_norm(x, y, norm).second.detach();
  {
    torch::NoGradGuard no_grad;
    REQUIRE_FALSE(add_layer_norm_fused_takes(x, y, norm));
    CHECK(max_relative_error(add_layer_norm(x, y, norm).second, trained.to(torch::kFloat64)) < 1e-6);
  }
  REQUIRE_FALSE(add_layer_norm_fused_takes(x.to(torch::kFloat64), {}, norm));
  REQUIRE_FALSE(add_layer_norm_fused_takes(x, y.narrow(2, 0, 32), norm));  // not x's shape
}

TEST_CASE("a model's loss and gradients with the fused adds and LayerNorms equal LibTorch's path's", "[layer_norm]") {
  // Training (the fused path) against evaluation's forward (LibTorch's path) on the same
  // weights and tokens; the gradients against a float64 copy of the model, which the fused
  // path does not take.
  Config config = tiny_config("alibi");
  TransformerLM model = build_model(config, 257);
  const auto tokens = torch::randint(0, 257, {2, 24});
  const auto fused = model->forward(tokens);
  torch::Tensor reference;
  {
    torch::NoGradGuard no_grad;
    reference = model->forward(tokens);
  }
  CHECK(max_relative_error(fused.detach(), reference.to(torch::kFloat64)) < 1e-5);
  fused.pow(2).mean().backward();
  TransformerLM model64 = build_model(config, 257);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < model->parameters().size(); ++i) model64->parameters()[i].copy_(model->parameters()[i]);
  }
  model64->to(torch::kFloat64);
  model64->forward(tokens).pow(2).mean().backward();
  for (size_t i = 0; i < model->parameters().size(); ++i) {
    INFO("parameter " << i);
    CHECK(max_relative_error(model->parameters()[i].grad(), model64->parameters()[i].grad()) < 1e-4);
  }
}

TEST_CASE("add_layer_norm refuses a double backward by name", "[layer_norm]") {
  auto norm = random_layer_norm(8);
  const auto x = torch::randn({4, 8}).requires_grad_(), y = torch::randn({4, 8}).requires_grad_();
  const auto loss = add_layer_norm(x, y, norm).second.pow(2).sum();
  REQUIRE_THROWS_WITH(torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true),
                      Catch::Contains("no double backward"));
  REQUIRE(torch::autograd::grad({loss}, {x})[0].defined());
}

TEST_CASE("EXTRAP_FUSED_LAYER_NORM: 0 runs LibTorch's adds and LayerNorms, 1 the fused ones, anything else is refused by value", "[layer_norm][cli]") {
  TempDir d("layer-norm-switch");
  require_environment_switch(d, "EXTRAP_FUSED_LAYER_NORM", one_step_bench(), "2",
                             "environment variable EXTRAP_FUSED_LAYER_NORM=2: expected 0 (residual adds and "
                             "LayerNorms as LibTorch runs them) or 1 (each residual add fused with the LayerNorm "
                             "after it, the default)",
                             "residual adds and LayerNorms as LibTorch runs them,",
                             "residual adds fused with the LayerNorm after them,");
}
