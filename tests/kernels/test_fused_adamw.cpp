// The fused optimiser step (core/kernels/fused_adamw.h) against LibTorch's clip_grad_norm_ and
// AdamW::step: parameters and state after several steps, with and without clipping and weight
// decay, from fresh state and from state the reference path wrote; what it leaves to LibTorch;
// the switch's refusal of a bad value.
#include <catch2/catch.hpp>

#include "core/kernels/fused_adamw.h"
#include "tests/support/cli_harness.h"

#include <functional>

using namespace extrap;
using namespace extrap::testing;

namespace {

// Parameters of a few shapes (one larger than a parallel task) in two groups, decay and none,
// as the trainer groups them.
struct Setup {
  std::vector<torch::Tensor> decay, no_decay;
  std::unique_ptr<torch::optim::AdamW> optimizer;

  explicit Setup(uint64_t seed, double weight_decay) {
    torch::manual_seed(seed);
    for (const auto& shape : std::vector<std::vector<int64_t>>{{257, 130}, {64, 48}})
      decay.push_back(torch::randn(shape).requires_grad_());
    for (const auto& shape : std::vector<std::vector<int64_t>>{{130}, {7}})
      no_decay.push_back(torch::randn(shape).requires_grad_());
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
  // Gradients of step `step` (the same in every Setup), scaled so that clipping at 1 bites.
  void set_gradients(int step, double magnitude) {
    torch::manual_seed(1000 + step);
    for (auto& p : all()) p.mutable_grad() = torch::randn(p.sizes()) * magnitude;
  }
  void reference_step(double clip) {
    if (clip > 0) torch::nn::utils::clip_grad_norm_(all(), clip);
    optimizer->step();
  }
};

// One step of both: the same gradients (then `adjust`, on each), the fused step for `fused`
// (the reference one when `fused_takes_reference`), the reference one for `reference`.
void step_both(Setup& fused, Setup& reference, int step, double magnitude, double clip,
               bool fused_takes_reference = false, const std::function<void(Setup&)>& adjust = {}) {
  for (auto* s : {&fused, &reference}) {
    s->set_gradients(step, magnitude);
    if (adjust) adjust(*s);
  }
  if (fused_takes_reference) fused.reference_step(clip);
  else optimizer_step(*fused.optimizer, clip);
  reference.reference_step(clip);
}

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item<double>();
}

void require_same(const Setup& fused, const Setup& reference) {
  const auto f = fused.all(), r = reference.all();
  for (size_t i = 0; i < f.size(); ++i) {
    INFO("parameter " << i << " of shape " << f[i].sizes());
    CHECK(relative_difference(f[i].detach(), r[i].detach()) < 1e-6);
    const bool has_state = fused.optimizer->state().count(f[i].unsafeGetTensorImpl()) > 0;
    REQUIRE(has_state == (reference.optimizer->state().count(r[i].unsafeGetTensorImpl()) > 0));
    if (!has_state) continue;  // never had a gradient
    const auto& fs = static_cast<torch::optim::AdamWParamState&>(*fused.optimizer->state().at(f[i].unsafeGetTensorImpl()));
    const auto& rs = static_cast<torch::optim::AdamWParamState&>(*reference.optimizer->state().at(r[i].unsafeGetTensorImpl()));
    CHECK(fs.step() == rs.step());
    CHECK(relative_difference(fs.exp_avg(), rs.exp_avg()) < 1e-6);
    CHECK(relative_difference(fs.exp_avg_sq(), rs.exp_avg_sq()) < 1e-6);
  }
}

}  // namespace

TEST_CASE("fused AdamW: parameters and state equal LibTorch's clip_grad_norm_ and AdamW::step", "[optimizer]") {
  // (clip, gradient size, weight decay): clipping that bites, clipping that does not, none.
  for (const auto& [clip, magnitude, weight_decay] : std::vector<std::tuple<double, double, double>>{
           {1.0, 1.0, 0.1}, {1000.0, 1.0, 0.1}, {0.0, 3.0, 0.01}, {1.0, 0.01, 0.0}}) {
    INFO("clip " << clip << ", gradients of scale " << magnitude << ", weight decay " << weight_decay);
    Setup fused(5, weight_decay), reference(5, weight_decay);
    REQUIRE(fused_adamw_takes(*fused.optimizer));
    for (int step = 0; step < 6; ++step) step_both(fused, reference, step, magnitude, clip);
    require_same(fused, reference);
  }
}

TEST_CASE("fused AdamW continues from state the reference path wrote (a checkpoint of either resumes with the other)", "[optimizer]") {
  // Reference steps first, then fused ones; and fused steps first, then reference ones.
  for (const bool reference_first : {true, false}) {
    INFO((reference_first ? "reference, then fused" : "fused, then reference"));
    Setup mixed(9, 0.1), reference(9, 0.1);
    for (int step = 0; step < 5; ++step) step_both(mixed, reference, step, 1.0, 1.0, (step < 2) == reference_first);
    require_same(mixed, reference);
  }
}

TEST_CASE("fused AdamW: a parameter without a gradient is left alone, a NaN gradient makes every parameter NaN as clip_grad_norm_ does", "[optimizer]") {
  Setup fused(11, 0.1), reference(11, 0.1);
  for (int step = 0; step < 3; ++step)
    step_both(fused, reference, step, 1.0, 1.0, false, [](Setup& s) {
      s.no_decay[1].mutable_grad() = torch::Tensor();  // e.g. a position table no batch reached
    });
  REQUIRE(fused.optimizer->state().count(fused.no_decay[1].unsafeGetTensorImpl()) == 0);
  REQUIRE(torch::equal(fused.no_decay[1], reference.no_decay[1]));
  require_same(fused, reference);

  step_both(fused, reference, 3, 1.0, 1.0, false, [](Setup& s) { s.decay[1].mutable_grad()[0][0] = std::nan(""); });
  for (const auto& p : reference.all())
    if (p.grad().defined()) REQUIRE(p.isnan().all().item<bool>());  // what LibTorch does
  for (const auto& p : fused.all())
    if (p.grad().defined()) REQUIRE(p.isnan().all().item<bool>());
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
  auto plain = torch::randn({4, 6}).requires_grad_();
  torch::optim::AdamW amsgrad({plain}, torch::optim::AdamWOptions(1e-2).amsgrad(true));
  plain.mutable_grad() = torch::randn({4, 6});
  REQUIRE_FALSE(fused_adamw_takes(amsgrad));
}

TEST_CASE("EXTRAP_FUSED_ADAMW: 0 and 1 train, anything else is refused by value", "[optimizer][cli]") {
  TempDir d("adamw-switch");
  require_environment_switch(d, "EXTRAP_FUSED_ADAMW", one_step_bench(),
                             "yes",
                             "environment variable EXTRAP_FUSED_ADAMW=yes: expected 0 (LibTorch's "
                             "clip_grad_norm_ and AdamW::step) or 1 (one pass a parameter, the default)",
                             "optimiser step LibTorch's clip_grad_norm_ and AdamW", "optimiser step fused");
}
