// The CUDA residual add and LayerNorm (core/kernels/cuda/) through add_layer_norm() on a GPU:
// every output and gradient against float64 autograd on the CPU, for each y, u and width kind;
// when it is taken (EXTRAP_GPU_NEW_ROUTES=1, rows up to 4096); a model's bf16 training step with
// it (and the CUDA loss) against the same step without. tests/kernels/test_residual_norm_simt.cpp runs the same
// kernels' source on CPU threads on any machine.
#include <catch2/catch.hpp>

#include "core/kernels/precision.h"
#include "core/kernels/residual_norm.h"
#include "core/model/model.h"
#include "tests/support/norm_support.h"
#include "tests/support/test_support.h"

using namespace extrap;
using namespace extrap::testing;

namespace {

torch::nn::LayerNorm cuda_norm(int64_t D) {
  auto norm = random_layer_norm(D);
  norm->to(torch::kCUDA);
  return norm;
}

}  // namespace

TEST_CASE("add_layer_norm on CUDA: every output and gradient equals float64's, for each y, u and width", "[cuda][layer_norm]") {
  if (!have_cuda()) return;
  ScopedVariable on("EXTRAP_GPU_NEW_ROUTES", "1");
  torch::manual_seed(31);
  for (const int64_t D : {1, 64, 768, 1000, 4096}) {
    for (const int y_kind : {0, 1, 2}) {      // none, float32, bfloat16
      for (const int u_kind : {0, 1, 2}) {    // float32, bfloat16, float32 with its bfloat16 copy
        INFO("width " << D << " y " << y_kind << " u " << u_kind);
        const int64_t B = 3, T = D >= 1000 ? 50 : 333;
        const auto x = (3 + 2 * torch::randn({B, T, D})).to(torch::kCUDA).requires_grad_();
        torch::Tensor y;
        if (y_kind > 0)
          y = torch::randn({B, T, D}).to(torch::kCUDA, y_kind == 2 ? torch::kBFloat16 : torch::kFloat32).requires_grad_();
        auto norm = cuda_norm(D);
        REQUIRE(add_layer_norm_fused_takes(x, y, norm));
        torch::Tensor h, u, u_low;
        if (u_kind == 2) {
          ComputePrecision bf16(Precision::bf16, torch::kCUDA);
          std::tie(h, u, u_low) = add_layer_norm_with_copy(x, y, norm);
          REQUIRE(u_low.defined());
          CHECK(torch::equal(u_low, u.detach().to(torch::kBFloat16)));
        } else {
          std::tie(h, u) = add_layer_norm(x, y, norm, u_kind == 1 ? torch::kBFloat16 : torch::kFloat32);
        }
        REQUIRE(u.scalar_type() == (u_kind == 1 ? torch::kBFloat16 : torch::kFloat32));
        const auto gh = torch::randn({B, T, D}), gu = torch::randn({B, T, D}), gl = torch::randn({B, T, D});
        auto loss = (h * gh.to(torch::kCUDA)).sum() + (u.to(torch::kFloat32) * gu.to(torch::kCUDA)).sum();
        if (u_low.defined()) loss = loss + (u_low.to(torch::kFloat32) * gl.to(torch::kCUDA)).sum();
        loss.backward();

        // float64 on the CPU, from the definition.
        const auto x64 = x.detach().cpu().to(torch::kFloat64).requires_grad_();
        const auto y64 = y.defined() ? y.detach().cpu().to(torch::kFloat64).requires_grad_() : torch::Tensor();
        const auto w64 = norm->weight.detach().cpu().to(torch::kFloat64).requires_grad_();
        const auto b64 = norm->bias.detach().cpu().to(torch::kFloat64).requires_grad_();
        const auto h64 = y.defined() ? x64 + y64 : x64;
        const auto u64 = torch::layer_norm(h64, {D}, w64, b64, norm->options.eps());
        auto loss64 = (h64 * gh.to(torch::kFloat64)).sum() + (u64 * gu.to(torch::kFloat64)).sum();
        if (u_low.defined()) loss64 = loss64 + (u64 * gl.to(torch::kFloat64)).sum();
        loss64.backward();

        CHECK(max_scaled_error(h, h64.detach()) < 1e-6);
        CHECK(max_scaled_error(u, u64.detach()) < (u_kind == 1 ? 1.0 / 128 : 1e-5));
        CHECK(max_scaled_error(x.grad(), x64.grad()) < 1e-5);
        if (y.defined()) CHECK(max_scaled_error(y.grad(), y64.grad()) < (y_kind == 2 ? 1.0 / 128 : 1e-5));
        CHECK(max_scaled_error(norm->weight.grad(), w64.grad()) < 1e-5);
        CHECK(max_scaled_error(norm->bias.grad(), b64.grad()) < 1e-5);
      }
    }
  }
}

TEST_CASE("add_layer_norm on CUDA with RMSNorm and without a bias: every output and gradient equals float64's", "[cuda][layer_norm]") {
  if (!have_cuda()) return;
  ScopedVariable on("EXTRAP_GPU_NEW_ROUTES", "1");
  torch::manual_seed(32);
  for (const int64_t D : {64, 1000, 4096}) {
    for (const bool rms : {true, false}) {
      for (const bool with_bias : {true, false}) {
        if (!rms && with_bias) continue;  // the case above
        INFO("width " << D << (rms ? " rmsnorm" : " layernorm") << (with_bias ? " with" : " without") << " a bias");
        const int64_t B = 2, T = 77;
        const auto x = (1 + 2 * torch::randn({B, T, D})).to(torch::kCUDA).requires_grad_();
        const auto y = torch::randn({B, T, D}).to(torch::kCUDA).requires_grad_();
        const auto w = (1 + 0.3 * torch::randn({D})).to(torch::kCUDA).requires_grad_();
        const auto b = with_bias ? (0.3 * torch::randn({D})).to(torch::kCUDA).requires_grad_() : torch::Tensor();
        const RowNorm norm(w, b, 1e-6, rms);
        REQUIRE(add_layer_norm_fused_takes(x, y, norm));
        auto [h, u] = add_layer_norm(x, y, norm);
        const auto gh = torch::randn({B, T, D}), gu = torch::randn({B, T, D});
        ((h * gh.to(torch::kCUDA)).sum() + (u * gu.to(torch::kCUDA)).sum()).backward();

        // float64 on the CPU, from the definitions: (h - mean) / sqrt(var + eps), or
        // h / sqrt(mean(h^2) + eps); times w, plus b where there is one.
        const auto x64 = x.detach().cpu().to(torch::kFloat64).requires_grad_();
        const auto y64 = y.detach().cpu().to(torch::kFloat64).requires_grad_();
        const auto w64 = w.detach().cpu().to(torch::kFloat64).requires_grad_();
        const auto b64 = with_bias ? b.detach().cpu().to(torch::kFloat64).requires_grad_() : torch::Tensor();
        const auto h64 = x64 + y64;
        const auto centred = rms ? h64 : h64 - h64.mean(-1, true);
        auto u64 = centred / (centred.pow(2).mean(-1, true) + 1e-6).sqrt() * w64;
        if (with_bias) u64 = u64 + b64;
        ((h64 * gh.to(torch::kFloat64)).sum() + (u64 * gu.to(torch::kFloat64)).sum()).backward();

        CHECK(max_scaled_error(h, h64.detach()) < 1e-6);
        CHECK(max_scaled_error(u, u64.detach()) < 1e-5);
        CHECK(max_scaled_error(x.grad(), x64.grad()) < 1e-5);
        CHECK(max_scaled_error(y.grad(), y64.grad()) < 1e-5);
        CHECK(max_scaled_error(w.grad(), w64.grad()) < 1e-5);
        if (with_bias) CHECK(max_scaled_error(b.grad(), b64.grad()) < 1e-5);
      }
    }
  }
}

TEST_CASE("add_layer_norm on CUDA: taken with EXTRAP_GPU_NEW_ROUTES=1 for rows up to 4096, else LibTorch's ops", "[cuda][layer_norm]") {
  if (!have_cuda()) return;
  torch::manual_seed(32);
  const auto x = torch::randn({4, 8, 4097}).to(torch::kCUDA).requires_grad_();
  auto wide = cuda_norm(4097), narrow = cuda_norm(64);
  const auto x64 = x.narrow(2, 0, 64).contiguous();
  {
    ScopedVariable off("EXTRAP_GPU_NEW_ROUTES", "0");
    CHECK_FALSE(add_layer_norm_fused_takes(x64, {}, narrow));
  }
  ScopedVariable on("EXTRAP_GPU_NEW_ROUTES", "1");
  CHECK(add_layer_norm_fused_takes(x64, {}, narrow));
  CHECK_FALSE(add_layer_norm_fused_takes(x, {}, wide));  // wider than the kernels' rows
  const auto [h, u] = add_layer_norm(x, {}, wide);         // LibTorch's LayerNorm, the same numbers
  const auto expected = torch::layer_norm(x.detach().cpu().to(torch::kFloat64), {4097},
                                          wide->weight.detach().cpu().to(torch::kFloat64),
                                          wide->bias.detach().cpu().to(torch::kFloat64), 1e-5);
  CHECK(max_relative_error(u.detach().cpu(), expected) < 1e-5);
  CHECK_FALSE(add_layer_norm_fused_takes(x64.cpu(), {}, narrow));  // the norm is on the GPU, x is not
  torch::NoGradGuard no_grad;
  CHECK_FALSE(add_layer_norm_fused_takes(x64, {}, narrow));  // evaluation: LibTorch's ops
}

TEST_CASE("a bf16 training step on CUDA with the fused adds, LayerNorms and loss equals the step without", "[cuda][layer_norm][loss]") {
  // FIRE's attention takes the reference path with or without EXTRAP_GPU_NEW_ROUTES, so the
  // LayerNorms and the loss (core/kernels/fused_cpu_loss.h, also CUDA kernels with the switch) are
  // the differences between the two steps.
  if (!have_cuda()) return;
  Config config = tiny_config("fire");
  config.model.d_model = 64;
  torch::manual_seed(33);
  TransformerLM model = build_model(config, 257);
  model->to(torch::kCUDA);
  model->train();
  const auto tokens = torch::randint(0, 257, {4, 33}).to(torch::kCUDA);
  std::vector<std::pair<double, torch::Tensor>> runs;
  for (const char* setting : {"0", "1"}) {
    ScopedVariable routes("EXTRAP_GPU_NEW_ROUTES", setting);
    runs.push_back(loss_and_gradients(model, tokens, Precision::bf16));
  }
  INFO("loss " << runs[0].first << " without, " << runs[1].first << " with");
  CHECK(std::abs(runs[0].first - runs[1].first) < 1e-4 * std::abs(runs[0].first));
  // bf16 products of inputs that differ by LayerNorm's float32 rounding: gradients to bf16's.
  CHECK(max_relative_error(runs[1].second.cpu(), runs[0].second.cpu().to(torch::kFloat64)) < 2e-2);
}
