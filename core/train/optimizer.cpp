#include "core/train/optimizer.h"

#include "core/kernels/fused_adamw.h"
#include "core/train/trainer.h"

namespace extrap {

std::unique_ptr<torch::optim::Optimizer> make_training_optimizer(const TransformerLM& model, const TrainConfig& config) {
  if (config.optimizer == OptimizerKind::adamw) return make_optimizer(model, config);
  return std::make_unique<torch::optim::SGD>(
      model->parameters(),
      torch::optim::SGDOptions(config.lr).momentum(config.momentum).nesterov(true).dampening(0).weight_decay(0));
}

void set_learning_rate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

void training_step(torch::optim::Optimizer& optimizer, const TrainConfig& config, double lr) {
  set_learning_rate(optimizer, lr);
  if (auto* adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer)) {
    optimizer_step(*adamw, config.clip);  // clipping and AdamW (core/kernels/fused_adamw.h)
    return;
  }
  std::vector<torch::Tensor> parameters;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params())
      if (p.grad().defined()) parameters.push_back(p);
  if (config.clip > 0) torch::nn::utils::clip_grad_norm_(parameters, config.clip);
  if (config.weight_decay > 0) {  // fairseq's NAG: decoupled, on every parameter, before the update
    torch::NoGradGuard no_grad;
    for (auto& p : parameters) p.mul_(1 - lr * config.weight_decay);
  }
  optimizer.step();
}

std::string training_step_path(const torch::optim::Optimizer& optimizer) {
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return optimizer_step_path(*adamw);
  return "LibTorch's clip_grad_norm_ and SGD (nesterov: fairseq's NAG)";
}

}  // namespace extrap
