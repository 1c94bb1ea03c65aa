// The optimiser step: gradient-norm clipping, then torch::optim::AdamW's update, on the CPU in
// one pass over each parameter.
//
// LibTorch's clip_grad_norm_ and AdamW::step run about ten tensor operations a parameter
// (a norm, a scale, weight decay, the two moments, the denominator, the update): for the
// quick model's 39 parameters about 400 operator calls and as many passes over memory. Here
// the norm is one pass over the gradients and the update one pass over p, g, m and v, with
// the clipping scale folded into it. The state lives in the optimiser as AdamW keeps it
// (exp_avg, exp_avg_sq, step), so checkpoints are unchanged and either path resumes the
// other's. Float32 arithmetic in AdamW's order of operations, equal to LibTorch's to the last
// bits, not bit for bit (LibTorch's addcdiv, its float32 norms, contracted multiply-adds):
// EXTRAP_FUSED_ADAMW 0 and 1 give loss curves that agree to rounding. The total norm is
// accumulated in double; a NaN norm makes every parameter NaN, as clip_grad_norm_ does.
//
// Taken for float32 parameters, gradients and state on the CPU, contiguous, of matching
// shapes, without amsgrad, unless EXTRAP_FUSED_ADAMW=0 (for A/B runs).
//
// On a GPU the same step runs through ATen's multi-tensor kernels (aten_fused_step: a
// _foreach_norm, one scale and _fused_adamw_, which PyTorch's AdamW(fused=True) runs): a few
// launches a step instead of about ten a parameter, and no wait for the device, where
// clip_grad_norm_ reads the total norm back to the host (.item()) before AdamW's launches.
// Taken for parameters, gradients and state of one floating type on one CUDA device, dense and
// contiguous, of matching shapes, without amsgrad, unless EXTRAP_FUSED_ADAMW=0. Anything else
// runs clip_grad_norm_ and AdamW::step.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

namespace extrap {

// Clips the gradients of the optimiser's parameters to total 2-norm `clip` (0: no clipping,
// as torch::nn::utils::clip_grad_norm_ with max_norm `clip`) and steps the optimiser. The
// gradients are left as they were (clip_grad_norm_ scales them in place; nothing reads them
// after the step).
void optimizer_step(torch::optim::AdamW& optimizer, double clip);

// Whether optimizer_step() takes the fused CPU path for this optimiser now.
bool fused_adamw_takes(const torch::optim::AdamW& optimizer);

// Whether the optimiser's parameters, gradients and state suit aten_fused_step() (one device,
// one floating type, dense and contiguous, no amsgrad), on whichever device they are;
// optimizer_step() takes it where that device is CUDA and the switch is on.
bool aten_fused_adamw_suits(const torch::optim::AdamW& optimizer);

// The clipping and AdamW step through ATen's multi-tensor kernels, on any device ATen has them
// for (CUDA, and the CPU, where the tests check it): the gradients are scaled in place as
// clip_grad_norm_ scales them, nothing is read back to the host. Requires
// aten_fused_adamw_suits(optimizer).
void aten_fused_step(torch::optim::AdamW& optimizer, double clip);

// What a step captured in a CUDA graph (core/train/graphed_step.h) reads from the device
// instead of the host: the learning rate, a float32 scalar on the parameters' device, and
// AdamW's step counts, one counter (float32 scalar) for each distinct host count a stepped
// parameter had when the counters were made. The step increments the counters itself and leaves
// the host's AdamWParamState::step alone: the caller advances those after each replay.
struct DeviceAdamwState {
  torch::Tensor lr;
  std::map<int64_t, torch::Tensor> counters;
};

// aten_fused_step reading `device_state` for the learning rate and step counts. Every
// parameter with a gradient must have AdamW state already (moments created now would be
// zeroed again at every replay) and a counter for its count; else std::invalid_argument.
void aten_fused_device_step(torch::optim::AdamW& optimizer, double clip, const DeviceAdamwState& device_state);

// The path optimizer_step() takes for this optimiser now, in words (bench train's report).
std::string optimizer_step_path(const torch::optim::AdamW& optimizer);

// EXTRAP_FUSED_ADAMW, read once; throws ConfigError for a value other than 0 or 1 (the CLI
// reads it at start).
bool fused_adamw_switched_on();

}  // namespace extrap
