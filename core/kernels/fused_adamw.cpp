#include "core/kernels/fused_adamw.h"

#include "core/base/environment.h"
#include "core/kernels/cpu_vector_math.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>

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

// The state AdamW holds for p, created (zero moments, step 0) on first use.
torch::optim::AdamWParamState& state_of(torch::optim::AdamW& optimizer, const torch::Tensor& p) {
  auto& slot = optimizer.state()[p.unsafeGetTensorImpl()];
  if (!slot) {
    auto fresh = std::make_unique<torch::optim::AdamWParamState>();
    fresh->step(0);
    fresh->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    fresh->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
    slot = std::move(fresh);
  }
  return static_cast<torch::optim::AdamWParamState&>(*slot);
}

// Whether p, its gradient and the moments AdamW holds for it (a checkpoint's, if any) are
// contiguous dense tensors of `type` on `device` with p's sizes: what a pass that walks each as
// one flat run of memory needs. A parameter without a gradient passes (AdamW skips it).
bool flat_parameter(const torch::Tensor& p, const torch::optim::AdamW& optimizer, torch::Device device,
                    torch::ScalarType type) {
  if (!p.grad().defined()) return true;
  const auto& g = p.grad();
  const auto fits = [&](const torch::Tensor& t) {
    return t.defined() && t.device() == device && t.scalar_type() == type && t.is_contiguous() && !t.is_sparse() &&
           t.sizes() == p.sizes();
  };
  if (!fits(p) || !fits(g)) return false;
  const auto found = optimizer.state().find(p.unsafeGetTensorImpl());
  if (found == optimizer.state().end()) return true;
  const auto& state = static_cast<const torch::optim::AdamWParamState&>(*found->second);
  return fits(state.exp_avg()) && fits(state.exp_avg_sq());
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
      if (!flat_parameter(p, optimizer, torch::kCPU, torch::kFloat32)) return false;
  }
  return true;
}

bool aten_fused_adamw_suits(const torch::optim::AdamW& optimizer) {
  std::optional<torch::Device> device;
  std::optional<torch::ScalarType> type;
  for (const auto& group : optimizer.param_groups()) {
    if (static_cast<const torch::optim::AdamWOptions&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;  // skipped, as AdamW skips it
      if (!device) device = p.device(), type = p.scalar_type();
      // Contiguous throughout: the multi-tensor kernels walk each tensor's storage as a flat run.
      if (!torch::isFloatingType(*type) || !flat_parameter(p, optimizer, *device, *type)) return false;
    }
  }
  return true;
}

namespace {

std::string sizes_text(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// aten_fused_step once aten_fused_adamw_suits(optimizer) holds (optimizer_step has asked already);
// with `device_state`, its learning rate and step counters instead of the host's.
void aten_fused_step_checked(torch::optim::AdamW& optimizer, double clip, const DeviceAdamwState* device_state) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return;
  if (clip > 0) {
    // clip_grad_norm_'s arithmetic (the norm of the per-tensor norms; max_norm / (norm +
    // 1e-6), at most 1; a NaN stays NaN) on the device, without reading the norm back.
    const auto norms = at::_foreach_norm(grads, 2);
    const auto total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(2);
    at::_foreach_mul_(grads, torch::clamp(clip / (total + 1e-6), std::nullopt, 1.0));
  }
  const auto device = grads[0].device();
  if (device_state) {
    std::vector<torch::Tensor> counters;
    for (const auto& [count, counter] : device_state->counters) counters.push_back(counter);
    if (!counters.empty()) at::_foreach_add_(counters, 1);
  }
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const torch::optim::AdamWOptions&>(group.options());
    std::vector<torch::Tensor> params, group_grads, exp_avgs, exp_avg_sqs, steps;
    std::map<int64_t, torch::Tensor> step_tensors;  // one device scalar a distinct step count
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      torch::Tensor step;
      if (device_state) {
        const auto held = optimizer.state().find(p.unsafeGetTensorImpl());
        if (held == optimizer.state().end())
          throw std::invalid_argument("aten_fused_device_step: a parameter of shape " + sizes_text(p) +
                                      " has no AdamW state yet; a captured step needs an eager step first");
        const auto counter = device_state->counters.find(
            static_cast<const torch::optim::AdamWParamState&>(*held->second).step());
        if (counter == device_state->counters.end())
          throw std::invalid_argument("aten_fused_device_step: no device step counter for a parameter of shape " +
                                      sizes_text(p));
        step = counter->second;
      } else {
        auto& state = state_of(optimizer, p);
        state.step(state.step() + 1);
        auto& shared = step_tensors[state.step()];
        if (!shared.defined())
          shared = torch::full({}, static_cast<double>(state.step()), torch::dtype(torch::kFloat32).device(device));
        step = shared;
      }
      auto& state = state_of(optimizer, p);
      params.push_back(p);
      group_grads.push_back(p.grad());
      exp_avgs.push_back(state.exp_avg());
      exp_avg_sqs.push_back(state.exp_avg_sq());
      steps.push_back(step);
    }
    if (params.empty()) continue;
    const auto [beta1, beta2] = options.betas();
    // The learning rate as a double (the host's) or a device scalar (a captured step's).
    const auto update = [&](const auto& lr) {
      at::_fused_adamw_(params, group_grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr,
                        beta1, beta2, options.weight_decay(), options.eps(), /*amsgrad=*/false,
                        /*maximize=*/false);
    };
    if (device_state) update(device_state->lr);
    else update(options.lr());
  }
}

void require_suits(const torch::optim::AdamW& optimizer, const std::string& caller) {
  if (!aten_fused_adamw_suits(optimizer))
    throw std::invalid_argument(caller + ": the parameters, gradients or state are not contiguous tensors of one "
                                "floating type on one device (or amsgrad is on)");
}

}  // namespace

void aten_fused_step(torch::optim::AdamW& optimizer, double clip) {
  require_suits(optimizer, "aten_fused_step");
  aten_fused_step_checked(optimizer, clip, nullptr);
}

void aten_fused_device_step(torch::optim::AdamW& optimizer, double clip, const DeviceAdamwState& device_state) {
  require_suits(optimizer, "aten_fused_device_step");
  aten_fused_step_checked(optimizer, clip, &device_state);
}

namespace {

// Which path optimizer_step() takes.
enum class StepPath { FusedCpu, AtenFused, LibTorch };

// The device of the first parameter with a gradient, else of the first parameter (before the
// first backward pass: bench train's report).
std::optional<torch::Device> step_device(const torch::optim::AdamW& optimizer) {
  std::optional<torch::Device> first;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      if (p.grad().defined()) return p.device();
      if (!first) first = p.device();
    }
  return first;
}

StepPath step_path(const torch::optim::AdamW& optimizer) {
  const auto device = step_device(optimizer);
  if (device && device->is_cuda())
    return fused_adamw_switched_on() && aten_fused_adamw_suits(optimizer) ? StepPath::AtenFused : StepPath::LibTorch;
  return fused_adamw_takes(optimizer) ? StepPath::FusedCpu : StepPath::LibTorch;
}

}  // namespace

std::string optimizer_step_path(const torch::optim::AdamW& optimizer) {
  switch (step_path(optimizer)) {
    case StepPath::FusedCpu: return "fused (one pass a parameter)";
    case StepPath::AtenFused: return "ATen's multi-tensor clipping and fused AdamW";
    case StepPath::LibTorch: break;
  }
  return "LibTorch's clip_grad_norm_ and AdamW";
}

void optimizer_step(torch::optim::AdamW& optimizer, double clip) {
  const StepPath path = step_path(optimizer);
  if (path == StepPath::AtenFused) {
    aten_fused_step_checked(optimizer, clip, nullptr);
    return;
  }
  if (path == StepPath::LibTorch) {
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
      auto& state = state_of(optimizer, p);
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
