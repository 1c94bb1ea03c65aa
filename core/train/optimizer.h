// The training optimisers (train.optimizer) and the step that clips the gradients and applies one.
//
//   adamw: torch::optim::AdamW with the config's betas and epsilon, weight decay on matrices
//          only; stepped through core/kernels/fused_adamw.h.
//   nag:   fairseq's NAG (fairseq/optim/nag.py), the optimiser of the ALiBi paper's WikiText-103
//          runs. fairseq keeps a buffer b = -lr v and corrects it by lr / lr_old when the rate
//          changes; that is Nesterov momentum as torch::optim::SGD keeps it (v_t = m v_{t-1} + g_t,
//          p -= lr (g_t + m v_t)) in other variables, step for step, with dampening 0. Its weight
//          decay is decoupled: p *= 1 - lr * wd on every parameter before the update, not
//          wd * p added to the gradient as SGD's own would. SGD with weight decay 0 plus that
//          product gives fairseq's update; the momentum buffers checkpoint as SGD's.
// Clipping (train.clip) is the gradients' global 2-norm, as torch's clip_grad_norm_ and
// fairseq's --clip-norm scale them.
#pragma once

#include "core/model/config.h"
#include "core/model/model.h"

#include <torch/torch.h>

#include <memory>
#include <string>

namespace extrap {

// The optimiser train.optimizer names, over the model's parameters.
std::unique_ptr<torch::optim::Optimizer> make_training_optimizer(const TransformerLM& model, const TrainConfig& config);

// Sets every parameter group's learning rate.
void set_learning_rate(torch::optim::Optimizer& optimizer, double lr);

// Clips the gradients to config.clip and steps the optimiser at learning rate `lr` (set first).
void training_step(torch::optim::Optimizer& optimizer, const TrainConfig& config, double lr);

// The path training_step() takes for this optimiser now, in words (bench train's report).
std::string training_step_path(const torch::optim::Optimizer& optimizer);

}  // namespace extrap
