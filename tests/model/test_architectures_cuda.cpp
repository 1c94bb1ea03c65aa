// The architectures of tests/support/architectures.h on a GPU: each model's float32 logits and
// every gradient on CUDA equal the same model's on the CPU (whose parts tests/model/
// test_architectures.cpp checks against float64), with the GPU routes as they are by default and
// with EXTRAP_GPU_NEW_ROUTES=1 (grouped-query attention goes to every route with k and v repeated
// to the query heads; RMSNorm and norms without a bias to the CUDA residual-add kernels); and a
// bf16 training run of each lowers its loss. The CUDA residual add with RMSNorm and without a
// bias: tests/kernels/test_residual_norm_cuda.cpp. Without a CUDA device every test is skipped.
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "tests/support/architectures.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

using namespace extrap;
using namespace extrap::testing;

TEST_CASE("a model of each architecture on CUDA: float32 logits and every gradient equal the CPU's", "[cuda][architectures]") {
  if (!have_cuda()) return;
  for (const char* routes : {"0", "1"}) {
    ScopedVariable switch_routes("EXTRAP_GPU_NEW_ROUTES", routes);
    for (const auto& arch : architectures()) {
      INFO(arch.name << ", EXTRAP_GPU_NEW_ROUTES=" << routes);
      Config config = tiny_config("alibi");
      arch.apply(config);
      torch::manual_seed(37);
      auto cpu = build_model(config, 257);
      auto gpu = build_model(config, 257);
      {
        torch::NoGradGuard no_grad;
        for (auto& p : cpu->parameters()) p.add_(torch::randn_like(p) * 0.05);
        const auto from = cpu->named_parameters(), to = gpu->named_parameters();
        for (const auto& item : from) to[item.key()].copy_(item.value());
      }
      gpu->to(torch::kCUDA);
      const auto tokens = torch::randint(0, 257, {2, 40}, torch::kLong);
      const auto targets = torch::randint(0, 257, {2, 40}, torch::kLong);
      const auto logits_cpu = cpu->forward(tokens);
      const auto logits_gpu = gpu->forward(tokens.to(torch::kCUDA));
      CHECK(max_scaled_error(logits_gpu, logits_cpu.detach().to(torch::kFloat64)) < 1e-4);
      torch::nn::functional::cross_entropy(logits_cpu.flatten(0, 1), targets.flatten()).backward();
      torch::nn::functional::cross_entropy(logits_gpu.flatten(0, 1), targets.flatten().to(torch::kCUDA)).backward();
      const auto grads_gpu = gpu->named_parameters();
      for (const auto& item : cpu->named_parameters()) {
        INFO(item.key());
        CHECK(max_scaled_error(grads_gpu[item.key()].grad(), item.value().grad().to(torch::kFloat64)) < 1e-4);
      }
    }
  }
}

TEST_CASE("a model of each architecture trains on CUDA in bf16", "[cuda][architectures]") {
  if (!have_cuda()) return;
  const auto corpus = tiny_byte_corpus();
  for (const auto& arch : architectures()) {
    INFO(arch.name);
    Config config = tiny_config("alibi");
    arch.apply(config);
    config.train.device = Device::cuda;
    config.train.precision = Precision::bf16;
    TempDir dir("architecture_cuda");
    const auto summary = train_briefly(config, corpus, dir.root);
    CHECK(std::isfinite(summary.train_curve.back().loss));
    CHECK(summary.train_curve.back().loss < 0.8 * summary.train_curve.front().loss);
  }
}
