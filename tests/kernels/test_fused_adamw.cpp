// The fused optimiser steps (core/kernels/fused_adamw.h: extrap's CPU pass, and ATen's
// multi-tensor kernels, the GPU's path, run here on the CPU) against LibTorch's clip_grad_norm_
// and AdamW::step: parameters and state after several steps, with and without clipping and
// weight decay, from fresh state and from state the reference path wrote; what they leave to
// LibTorch; the switch's refusal of a bad value.
#include <catch2/catch.hpp>

#include "core/kernels/fused_adamw.h"
#include "tests/support/adamw_support.h"
#include "tests/support/cli_harness.h"

using namespace extrap;
using namespace extrap::testing;

namespace {

// The two paths under test: extrap's fused CPU step (what optimizer_step takes here) and ATen's
// multi-tensor one (what it takes on a GPU), run here on the CPU.
const std::vector<std::pair<const char*, AdamwStepper>> kSteppers = {
    {"extrap's fused CPU step", optimizer_step}, {"ATen's multi-tensor step", aten_fused_step}};

}  // namespace

TEST_CASE("fused AdamW: parameters and state equal LibTorch's clip_grad_norm_ and AdamW::step", "[optimizer]") {
  for (const auto& [path, stepper] : kSteppers)
    for (const auto& [clip, magnitude, weight_decay] : adamw_cases()) {
      INFO(path << ", clip " << clip << ", gradients of scale " << magnitude << ", weight decay " << weight_decay);
      AdamwSetup tested(5, weight_decay), reference(5, weight_decay);
      REQUIRE(fused_adamw_takes(*tested.optimizer));
      REQUIRE(aten_fused_adamw_suits(*tested.optimizer));
      for (int step = 0; step < 6; ++step) step_both(tested, reference, stepper, step, magnitude, clip);
      require_same(tested, reference);
    }
}

TEST_CASE("fused AdamW continues from state the reference path wrote (a checkpoint of either resumes with the other)", "[optimizer]") {
  // Reference steps first, then fused ones; and fused steps first, then reference ones.
  for (const auto& [path, stepper] : kSteppers)
    for (const bool reference_first : {true, false}) {
      INFO(path << (reference_first ? ": reference, then fused" : ": fused, then reference"));
      AdamwSetup mixed(9, 0.1), reference(9, 0.1);
      for (int step = 0; step < 5; ++step)
        step_both(mixed, reference, stepper, step, 1.0, 1.0, (step < 2) == reference_first);
      require_same(mixed, reference);
    }
}

TEST_CASE("fused AdamW: a parameter without a gradient is left alone, a NaN gradient makes every parameter NaN as clip_grad_norm_ does", "[optimizer]") {
  for (const auto& [path, stepper] : kSteppers) {
    INFO(path);
    AdamwSetup tested(11, 0.1), reference(11, 0.1);
    for (int step = 0; step < 3; ++step)
      step_both(tested, reference, stepper, step, 1.0, 1.0, false, [](AdamwSetup& s) {
        s.no_decay[1].mutable_grad() = torch::Tensor();  // e.g. a position table no batch reached
      });
    REQUIRE(tested.optimizer->state().count(tested.no_decay[1].unsafeGetTensorImpl()) == 0);
    REQUIRE(torch::equal(tested.no_decay[1], reference.no_decay[1]));
    require_same(tested, reference);

    step_both(tested, reference, stepper, 3, 1.0, 1.0, false,
              [](AdamwSetup& s) { s.decay[1].mutable_grad()[0][0] = std::nan(""); });
    for (const auto& p : reference.all())
      if (p.grad().defined()) REQUIRE(p.isnan().all().item<bool>());  // what LibTorch does
    for (const auto& p : tested.all())
      if (p.grad().defined()) REQUIRE(p.isnan().all().item<bool>());
  }
}

TEST_CASE("fused AdamW leaves amsgrad, float64 and non-contiguous parameters to LibTorch, with the same result", "[optimizer]") {
  torch::manual_seed(2);
  auto p64 = torch::randn({5, 3}, torch::kFloat64).requires_grad_();
  torch::optim::AdamW doubles({p64}, torch::optim::AdamWOptions(1e-2));
  p64.mutable_grad() = torch::randn({5, 3}, torch::kFloat64);
  REQUIRE_FALSE(fused_adamw_takes(doubles));
  auto q64 = p64.detach().clone().requires_grad_();
  torch::optim::AdamW reference({q64}, torch::optim::AdamWOptions(1e-2));
  q64.mutable_grad() = p64.grad().clone();
  optimizer_step(doubles, 0.5);
  torch::nn::utils::clip_grad_norm_(std::vector<torch::Tensor>{q64}, 0.5);
  reference.step();
  REQUIRE(torch::equal(p64, q64));

  auto transposed = torch::randn({4, 6}).t().requires_grad_();
  torch::optim::AdamW strided({transposed}, torch::optim::AdamWOptions(1e-2));
  transposed.mutable_grad() = torch::randn({6, 4});
  REQUIRE_FALSE(fused_adamw_takes(strided));
  REQUIRE_FALSE(aten_fused_adamw_suits(strided));
  auto plain = torch::randn({4, 6}).requires_grad_();
  torch::optim::AdamW amsgrad({plain}, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  plain.mutable_grad() = torch::randn({4, 6});
  REQUIRE_FALSE(fused_adamw_takes(amsgrad));
  REQUIRE_FALSE(aten_fused_adamw_suits(amsgrad));
  REQUIRE_THROWS_WITH(aten_fused_step(amsgrad, 1.0), Catch::Contains("amsgrad"));
  // On the CPU, what extrap's pass leaves goes to LibTorch, not to ATen's multi-tensor step.
  REQUIRE(aten_fused_adamw_suits(doubles));
  REQUIRE(optimizer_step_path(doubles) == "LibTorch's clip_grad_norm_ and AdamW");
  auto mixed = torch::randn({3}, torch::kFloat64).requires_grad_();
  torch::optim::AdamW two_types({plain, mixed}, torch::optim::AdamWOptions(1e-2));
  mixed.mutable_grad() = torch::randn({3}, torch::kFloat64);
  REQUIRE_FALSE(aten_fused_adamw_suits(two_types));
}

TEST_CASE("EXTRAP_FUSED_ADAMW: 0 and 1 train, anything else is refused by value", "[optimizer][cli]") {
  TempDir d("adamw-switch");
  require_environment_switch(d, "EXTRAP_FUSED_ADAMW", one_step_bench(),
                             "yes",
                             "environment variable EXTRAP_FUSED_ADAMW=yes: expected 0 (LibTorch's "
                             "clip_grad_norm_ and AdamW::step) or 1 (one pass a parameter, the default)",
                             "optimiser step LibTorch's clip_grad_norm_ and AdamW", "optimiser step fused");
}

TEST_CASE("fused AdamW for a captured step: learning rate and step counts read from device scalars", "[optimizer]") {
  // aten_fused_device_step (what a CUDA graph of the training step records, core/train/
  // graphed_step.h), here on the CPU, against ATen's step reading the host's values: the same
  // parameters and moments step after step, a learning rate changed between steps reaching it
  // through the scalar, the counters advanced by the step itself, the host's counts left to the
  // caller.
  for (const auto& [clip, magnitude, weight_decay] : adamw_cases()) {
    INFO("clip " << clip << ", gradients of scale " << magnitude << ", weight decay " << weight_decay);
    AdamwSetup tested(7, weight_decay), reference(7, weight_decay);
    step_both(tested, reference, aten_fused_step, 0, magnitude, clip);  // AdamW state exists now
    DeviceAdamwState device{torch::full({}, 3e-3, torch::kFloat32), {{1, torch::full({}, 1.0, torch::kFloat32)}}};
    for (int step = 1; step < 6; ++step) {
      const double lr = step < 3 ? 3e-3 : 1e-3;
      device.lr.fill_(lr);
      for (auto& group : reference.optimizer->param_groups())
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      step_both(tested, reference, [&](torch::optim::AdamW& o, double c) { aten_fused_device_step(o, c, device); },
                step, magnitude, clip);
      REQUIRE(device.counters.at(1).item<double>() == 1 + step);
    }
    for (const auto& p : tested.all()) {
      auto& state = static_cast<torch::optim::AdamWParamState&>(*tested.optimizer->state().at(p.unsafeGetTensorImpl()));
      REQUIRE(state.step() == 1);  // the caller's to advance
      state.step(6);
    }
    require_same(tested, reference);
  }
}

TEST_CASE("fused AdamW for a captured step refuses a parameter without state or without a counter", "[optimizer]") {
  AdamwSetup fresh(3, 0.1);
  fresh.set_gradients(0, 1.0);
  const DeviceAdamwState device{torch::full({}, 1e-3, torch::kFloat32), {{0, torch::zeros({}, torch::kFloat32)}}};
  REQUIRE_THROWS_WITH(aten_fused_device_step(*fresh.optimizer, 1.0, device),
                      Catch::Contains("no AdamW state yet") && Catch::Contains("[257, 130]"));
  aten_fused_step(*fresh.optimizer, 1.0);  // step count 1 now; the counter is for 0
  REQUIRE_THROWS_WITH(aten_fused_device_step(*fresh.optimizer, 1.0, device),
                      Catch::Contains("no device step counter"));
}
