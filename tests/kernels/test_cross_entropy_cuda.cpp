// The CUDA training loss (core/kernels/cuda/cross_entropy_kernels.cuh) through cross_entropy_sum()
// on a GPU: the loss and the gradient against float64 on the CPU for float32 and bfloat16 logits,
// GPT-2's class count, ignored rows; when it is taken (EXTRAP_GPU_NEW_ROUTES=1). A bf16 training
// step with and without it: tests/kernels/test_residual_norm_cuda.cpp. The kernels' source runs
// on CPU threads on any machine in tests/kernels/test_cross_entropy_simt.cpp.
#include <catch2/catch.hpp>

#include "core/kernels/fused_cpu_loss.h"
#include "tests/support/test_support.h"

using namespace extrap;
using namespace extrap::testing;

TEST_CASE("cross_entropy_sum on CUDA: loss and gradient equal float64's, ignored rows add nothing", "[cuda][loss]") {
  if (!have_cuda()) return;
  ScopedVariable on("EXTRAP_GPU_NEW_ROUTES", "1");
  torch::manual_seed(51);
  for (const int64_t V : {1, 257, 50304}) {
    for (const auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      INFO("classes " << V << (dtype == torch::kBFloat16 ? " bfloat16" : " float32"));
      const int64_t N = V > 1000 ? 64 : 1000;
      const auto logits_cpu = (4 * torch::randn({N, V})).to(dtype);
      auto targets_cpu = torch::randint(0, V, {N}, torch::kInt64);
      targets_cpu.narrow(0, 0, 7).fill_(-100);
      const auto logits = logits_cpu.to(torch::kCUDA).requires_grad_();
      const auto targets = targets_cpu.to(torch::kCUDA);
      REQUIRE(cross_entropy_sum_unsupported_reason(logits, targets).empty());
      const auto loss = cross_entropy_sum(logits, targets, -100);
      (loss * 0.5).backward();

      const auto x64 = logits_cpu.to(torch::kFloat64).requires_grad_();
      const auto loss64 = torch::nn::functional::cross_entropy(
          x64, targets_cpu, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
      (loss64 * 0.5).backward();
      CHECK(std::abs(loss.item<double>() - loss64.item<double>()) < 1e-5 * loss64.item<double>() + 1e-6);
      CHECK(max_scaled_error(logits.grad(), x64.grad()) < (dtype == torch::kBFloat16 ? 1.0 / 128 : 1e-5));
      CHECK(torch::equal(logits.grad().narrow(0, 0, 7).cpu(), torch::zeros({7, V}, dtype)));
    }
  }
}

TEST_CASE("cross_entropy_sum on CUDA: taken with EXTRAP_GPU_NEW_ROUTES=1, each refusal names why", "[cuda][loss]") {
  if (!have_cuda()) return;
  const auto logits = torch::randn({4, 10}).to(torch::kCUDA);
  const auto targets = torch::randint(0, 10, {4}, torch::kInt64).to(torch::kCUDA);
  {
    ScopedVariable off("EXTRAP_GPU_NEW_ROUTES", "0");
    CHECK_THAT(cross_entropy_sum_unsupported_reason(logits, targets), Catch::Matchers::Contains("EXTRAP_GPU_NEW_ROUTES=1"));
  }
  ScopedVariable on("EXTRAP_GPU_NEW_ROUTES", "1");
  CHECK(cross_entropy_sum_unsupported_reason(logits, targets).empty());
  CHECK_THAT(cross_entropy_sum_unsupported_reason(logits, targets.cpu()), Catch::Matchers::Contains("different devices"));
  CHECK_THAT(cross_entropy_sum_unsupported_reason(logits.to(torch::kFloat16), targets),
             Catch::Matchers::Contains("float32 or bfloat16"));
  // A target outside the classes: NaN, so the trainer's non-finite check stops the run.
  const auto bad = torch::tensor({int64_t(1), int64_t(10), int64_t(2), int64_t(3)}).to(torch::kCUDA);
  CHECK(std::isnan(cross_entropy_sum(logits, bad, -100).item<float>()));
}
