// What the optimiser-step tests share (tests/kernels/test_fused_adamw.cpp on the CPU,
// tests/kernels/test_cuda_adamw.cpp on a GPU): parameters in the trainer's two groups, the same
// gradients step after step, LibTorch's clip_grad_norm_ and AdamW::step as the reference, and
// the comparison of parameters and state.
#pragma once

#include "core/kernels/fused_adamw.h"

#include <catch2/catch.hpp>

#include <functional>
#include <memory>
#include <tuple>
#include <vector>

namespace extrap::testing {

// The reference step: LibTorch's clip_grad_norm_ (clip > 0) and AdamW::step.
inline void libtorch_adamw_step(torch::optim::AdamW& optimizer, double clip) {
  std::vector<torch::Tensor> parameters;
  for (const auto& group : optimizer.param_groups())
    parameters.insert(parameters.end(), group.params().begin(), group.params().end());
  if (clip > 0) torch::nn::utils::clip_grad_norm_(parameters, clip);
  optimizer.step();
}

// Parameters of a few shapes (one larger than a parallel task) in two groups, decay and none,
// as the trainer groups them, on `device`.
struct AdamwSetup {
  std::vector<torch::Tensor> decay, no_decay;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  torch::Device device;

  AdamwSetup(uint64_t seed, double weight_decay, torch::Device on = torch::kCPU) : device(on) {
    torch::manual_seed(seed);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{257, 130}, {64, 48}})
      decay.push_back(torch::randn(shape).to(device).requires_grad_());
    for (const auto& shape : std::vector<std::vector<int64_t>>{{130}, {7}})
      no_decay.push_back(torch::randn(shape).to(device).requires_grad_());
    auto options = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(3e-3).betas({0.9, 0.98}).eps(1e-8).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, options(weight_decay));
    groups.emplace_back(no_decay, options(0.0));
    optimizer = std::make_unique<torch::optim::AdamW>(std::move(groups));
  }
  std::vector<torch::Tensor> all() const {
    auto out = decay;
    out.insert(out.end(), no_decay.begin(), no_decay.end());
    return out;
  }
  // Gradients of step `step` (the same in every setup, on any device), scaled so that clipping
  // at 1 bites.
  void set_gradients(int step, double magnitude) {
    torch::manual_seed(1000 + step);
    for (auto& p : all()) p.mutable_grad() = (torch::randn(p.sizes()) * magnitude).to(device);
  }
  void reference_step(double clip) { libtorch_adamw_step(*optimizer, clip); }
};

// The step under test: optimizer_step (the path it picks) or a path called directly.
using AdamwStepper = std::function<void(torch::optim::AdamW&, double)>;

// One step of both: the same gradients (then `adjust`, on each), `stepper` for `tested` (the
// reference step when `tested_takes_reference`), the reference step for `reference`.
inline void step_both(AdamwSetup& tested, AdamwSetup& reference, const AdamwStepper& stepper, int step,
                      double magnitude, double clip, bool tested_takes_reference = false,
                      const std::function<void(AdamwSetup&)>& adjust = {}) {
  for (auto* s : {&tested, &reference}) {
    s->set_gradients(step, magnitude);
    if (adjust) adjust(*s);
  }
  if (tested_takes_reference) tested.reference_step(clip);
  else stepper(*tested.optimizer, clip);
  reference.reference_step(clip);
}

inline double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  const auto x = a.detach().cpu(), y = b.detach().cpu();
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item<double>();
}

// Parameters, step counts and moments equal within `tolerance` (relative to each tensor's
// largest magnitude), and state present for the same parameters.
inline void require_same(const AdamwSetup& tested, const AdamwSetup& reference, double tolerance = 1e-6) {
  const auto f = tested.all(), r = reference.all();
  for (size_t i = 0; i < f.size(); ++i) {
    INFO("parameter " << i << " of shape " << f[i].sizes());
    CHECK(relative_difference(f[i], r[i]) < tolerance);
    const bool has_state = tested.optimizer->state().count(f[i].unsafeGetTensorImpl()) > 0;
    REQUIRE(has_state == (reference.optimizer->state().count(r[i].unsafeGetTensorImpl()) > 0));
    if (!has_state) continue;  // never had a gradient
    const auto& fs = static_cast<torch::optim::AdamWParamState&>(*tested.optimizer->state().at(f[i].unsafeGetTensorImpl()));
    const auto& rs = static_cast<torch::optim::AdamWParamState&>(*reference.optimizer->state().at(r[i].unsafeGetTensorImpl()));
    CHECK(fs.step() == rs.step());
    CHECK(relative_difference(fs.exp_avg(), rs.exp_avg()) < tolerance);
    CHECK(relative_difference(fs.exp_avg_sq(), rs.exp_avg_sq()) < tolerance);
  }
}

// (clip, gradient size, weight decay): clipping that bites, clipping that does not, none, and
// small gradients without decay.
inline std::vector<std::tuple<double, double, double>> adamw_cases() {
  return {{1.0, 1.0, 0.1}, {1000.0, 1.0, 0.1}, {0.0, 3.0, 0.01}, {1.0, 0.01, 0.0}};
}

}  // namespace extrap::testing
