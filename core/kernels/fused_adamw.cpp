#include "core/kernels/fused_adamw.h"

#include "core/base/environment.h"
#include "core/kernels/cpu_vector_math.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace extrap {

namespace {

constexpr int64_t kGrain = 16384;  // elements a task; smaller parameters run on one thread

EXTRAP_ISA_KERNEL(double, squared_sum, (const float* g, int64_t n), (g, n)) {
  double sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += double(g[i]) * double(g[i]);
  return sum;
}

struct Update {
  float decay;       // 1 - lr * weight_decay (1: none)
  float scale;       // the clipping scale on the gradient (1: none)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bias_correction2, eps, step_size;  // step_size: lr / bias_correction1
};

// AdamW's update of one stretch, in the order of torch::optim::AdamW::step: p *= decay;
// m = m beta1 + (1 - beta1) g; v = v beta2 + (1 - beta2) g g; p -= step_size m / (sqrt(v) /
// sqrt(bc2) + eps).
EXTRAP_ISA_KERNEL(void, update, (float* p, const float* grad, float* m, float* v, int64_t n, Update u), (p, grad, m, v, n, u)) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * u.scale;
    const float pi = p[i] * u.decay;
    const float mi = m[i] * u.beta1 + u.one_minus_beta1 * g;
    const float vi = v[i] * u.beta2 + u.one_minus_beta2 * g * g;
    const float denom = std::sqrt(vi) / u.sqrt_bias_correction2 + u.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi - u.step_size * (mi / denom);
  }
}

bool takes_parameter(const torch::Tensor& p, const torch::optim::AdamW& optimizer) {
  if (!p.grad().defined()) return true;  // skipped, as AdamW skips it
  const auto& g = p.grad();
  if (!(p.device().is_cpu() && p.scalar_type() == torch::kFloat32 && p.is_contiguous() &&
        g.device().is_cpu() && g.scalar_type() == torch::kFloat32 && g.is_contiguous() && !g.is_sparse() &&
        g.sizes() == p.sizes()))
    return false;
  // State AdamW holds for it (a checkpoint's) must be what the pass writes through.
  const auto found = optimizer.state().find(p.unsafeGetTensorImpl());
  if (found == optimizer.state().end()) return true;
  const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
  for (const auto* moment : {&state.exp_avg(), &state.exp_avg_sq()})
    if (!moment->defined() || moment->sizes() != p.sizes() || moment->scalar_type() != torch::kFloat32 ||
        !moment->device().is_cpu() || !moment->is_contiguous())
      return false;
  return true;
}

}  // namespace

bool fused_adamw_switched_on() {
  static const bool on = environment_switch("EXTRAP_FUSED_ADAMW", "LibTorch's clip_grad_norm_ and AdamW::step",
                                            "one pass a parameter, the default");
  return on;
}

bool fused_adamw_takes(const torch::optim::AdamW& optimizer) {
  if (!fused_adamw_switched_on()) return false;
  for (const auto& group : optimizer.param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params())
      if (!takes_parameter(p, optimizer)) return false;
  }
  return true;
}

void optimizer_step(torch::optim::AdamW& optimizer, double clip) {
  if (!fused_adamw_takes(optimizer)) {
    std::vector<torch::Tensor> parameters;
    for (const auto& group : optimizer.param_groups())
      parameters.insert(parameters.end(), group.params().begin(), group.params().end());
    if (clip > 0) torch::nn::utils::clip_grad_norm_(parameters, clip);
    optimizer.step();
    return;
  }
  torch::NoGradGuard no_grad;
  // clip_grad_norm_'s scale: max_norm / (norm + 1e-6) in float32, at most 1.
  float scale = 1.0f;
  if (clip > 0) {
    double sum = 0;
    for (const auto& group : optimizer.param_groups())
      for (const auto& p : group.params())
        if (p.grad().defined()) sum += squared_sum(p.grad().data_ptr<float>(), p.numel());
    // A NaN norm makes a NaN scale, as in clip_grad_norm_: every parameter goes NaN and the
    // run's loss says so, rather than an unclipped step for the finite ones.
    const float coefficient = float(clip) / (float(std::sqrt(sum)) + 1e-6f);
    scale = std::isnan(coefficient) ? coefficient : std::min(1.0f, coefficient);
  }
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
      if (!slot) {
        auto fresh = std::make_unique<torch::optim::AdamWParamState>();
        fresh->step(0);
        fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(fresh);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*slot);
      state.step(state.step() + 1);
      const auto [beta1, beta2] = options.betas();
      const double bias_correction1 = 1 - std::pow(beta1, double(state.step()));
      const double bias_correction2 = 1 - std::pow(beta2, double(state.step()));
      const Update u{options.weight_decay() != 0 ? float(1 - options.lr() * options.weight_decay()) : 1.0f,
                     scale,
                     float(beta1),
                     float(1 - beta1),
                     float(beta2),
                     float(1 - beta2),
                     float(std::sqrt(bias_correction2)),
                     float(options.eps()),
                     float(options.lr() / bias_correction1)};
      float* pp = p.data_ptr<float>();
      const float* gp = p.grad().data_ptr<float>();
      float* mp = state.exp_avg().data_ptr<float>();
      float* vp = state.exp_avg_sq().data_ptr<float>();
      at::parallel_for(0, p.numel(), kGrain, [&](int64_t begin, int64_t end) {
        update(pp + begin, gp + begin, mp + begin, vp + begin, end - begin, u);
      });
      // Written through pointers: tell autograd they changed, as in-place operators do.
      for (const auto* changed : {&p, &state.exp_avg(), &state.exp_avg_sq()})
        torch::autograd::impl::bump_version(*changed);
    }
  }
}

}  // namespace extrap
