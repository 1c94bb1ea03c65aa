// The optimiser step on a GPU (core/kernels/fused_adamw.h): optimizer_step takes ATen's
// multi-tensor clipping and fused AdamW there; parameters and state after several steps equal
// LibTorch's clip_grad_norm_ and AdamW::step on the CPU (the GPU's own arithmetic differs in
// the last bits: fused multiply-adds, another order of the norm's sums), and the EXTRAP_FUSED_ADAMW
// switch's other path, LibTorch's on the GPU, agrees as well. Without a CUDA device every test
// warns and returns.
#include "tests/support/adamw_support.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

using namespace extrap;
using namespace extrap::testing;

TEST_CASE("optimiser step on a GPU: ATen's multi-tensor path equals LibTorch's on the CPU", "[cuda][optimizer]") {
  if (!have_cuda()) return;
  const std::vector<std::pair<const char*, AdamwStepper>> steppers = {
      {"optimizer_step", optimizer_step}, {"LibTorch's step on the GPU", libtorch_adamw_step}};
  for (const auto& [path, stepper] : steppers)
    for (const auto& [clip, magnitude, weight_decay] : adamw_cases()) {
      INFO(path << ", clip " << clip << ", gradients of scale " << magnitude << ", weight decay " << weight_decay);
      AdamwSetup tested(5, weight_decay, torch::kCUDA), reference(5, weight_decay);
      REQUIRE(optimizer_step_path(*tested.optimizer) == "ATen's multi-tensor clipping and fused AdamW");
      for (int step = 0; step < 6; ++step) step_both(tested, reference, stepper, step, magnitude, clip);
      require_same(tested, reference, 1e-5);
    }
}

TEST_CASE("optimiser step on a GPU: resumes the reference path's state, skips a parameter without a gradient, spreads a NaN", "[cuda][optimizer]") {
  if (!have_cuda()) return;
  AdamwSetup tested(9, 0.1, torch::kCUDA), reference(9, 0.1);
  for (int step = 0; step < 5; ++step)
    step_both(tested, reference, optimizer_step, step, 1.0, 1.0, /*tested_takes_reference=*/step < 2,
              [](AdamwSetup& s) { s.no_decay[1].mutable_grad() = torch::Tensor(); });
  REQUIRE(tested.optimizer->state().count(tested.no_decay[1].unsafeGetTensorImpl()) == 0);
  require_same(tested, reference, 1e-5);

  step_both(tested, reference, optimizer_step, 5, 1.0, 1.0, false,
            [](AdamwSetup& s) { s.decay[1].mutable_grad()[0][0] = std::nan(""); });
  for (const auto& p : tested.all())
    if (p.grad().defined()) REQUIRE(p.isnan().all().item<bool>());
}
