#include "core/train/graphed_step.h"

#include "core/kernels/fused_adamw.h"
#include "core/train/trainer.h"

#include <stdexcept>

namespace extrap {

std::string GraphedTrainingStep::unsupported_reason(TransformerLM& model, torch::optim::Optimizer& optimizer,
                                                    const TrainConfig& config, const torch::Device& device,
                                                    bool data_parallel) {
  if (!device.is_cuda()) return "train.device is " + enum_name(config.device) + " (CUDA graphs run on a GPU)";
  if (!cuda_graph_capture()) return "extrap's CUDA half (libextrap_cuda.so) is not loaded";
  if (data_parallel) return "the run is data-parallel (the gradient all-reduce is not captured)";
  if (const PositionSampling& sampling = model->position().sampling(); sampling.active())
    return sampling.key() + " draws the positions on the host at every step";
  if (model->adaptive()) return "model.adaptive_cutoffs: the adaptive softmax picks each band's targets on the host";
  auto* adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer);
  if (!adamw) return "train.optimizer is " + enum_name(config.optimizer) + " (the captured step is AdamW's)";
  if (!fused_adamw_switched_on()) return "EXTRAP_FUSED_ADAMW=0 takes LibTorch's optimiser step, which reads back to the host";
  if (!aten_fused_adamw_suits(*adamw))
    return "the parameters or AdamW's state are not dense tensors of one type on one device (or amsgrad is on)";
  return "";
}

std::unique_ptr<GraphedTrainingStep> GraphedTrainingStep::for_config(TransformerLM model, torch::optim::Optimizer& optimizer,
                                                                     const TrainConfig& config,
                                                                     const torch::Device& device, bool data_parallel,
                                                                     int64_t micro_batch, const std::string& source,
                                                                     std::string* eager_reason) {
  std::string why = "train.cuda_graph is off";
  if (config.cuda_graph != CudaGraphMode::off) {
    why = unsupported_reason(model, optimizer, config, device, data_parallel);
    if (why.empty())
      return std::make_unique<GraphedTrainingStep>(model, dynamic_cast<torch::optim::AdamW&>(optimizer), config, micro_batch);
    if (config.cuda_graph == CudaGraphMode::on) throw ConfigError(source + ": train.cuda_graph is on, but " + why);
  }
  if (eager_reason) *eager_reason = why;
  return nullptr;
}

std::string GraphedTrainingStep::failure_under_auto(const std::string& source) const {
  if (!failure_.empty() && config_.cuda_graph == CudaGraphMode::on)
    throw ConfigError(source + ": train.cuda_graph is on, but the training step could not be captured: " + failure_);
  return failure_;
}

GraphedTrainingStep::GraphedTrainingStep(TransformerLM model, torch::optim::AdamW& optimizer,
                                         const TrainConfig& config, int64_t micro_batch)
    : model_(std::move(model)), optimizer_(optimizer), config_(config) {
  const auto device = model_->parameters().front().device();
  const auto tokens = torch::TensorOptions().dtype(torch::kLong).device(device);
  const auto scalar = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  for (int64_t a = 0; a < config.accumulation; ++a) {
    inputs_.push_back(torch::zeros({micro_batch, config.seq_len}, tokens));
    targets_.push_back(torch::zeros({micro_batch, config.seq_len}, tokens));
    scored_.push_back(torch::ones({}, scalar));
    divisors_.push_back(torch::ones({}, scalar));
  }
  loaded_.resize(size_t(config.accumulation));
  lr_ = torch::zeros({}, scalar);
}

GraphedTrainingStep::~GraphedTrainingStep() = default;

void GraphedTrainingStep::load(const std::vector<MicroBatch>& batches, double lr) {
  const size_t n = inputs_.size();
  if (batches.size() != n)
    throw std::invalid_argument("GraphedTrainingStep::step: " + std::to_string(n) + " micro-batches expected, got " +
                                std::to_string(batches.size()));
  for (size_t a = 0; a < n; ++a) {
    const MicroBatch& batch = batches[a];
    if (batch.inputs.sizes() != inputs_[a].sizes() || batch.targets.sizes() != targets_[a].sizes())
      throw std::invalid_argument("GraphedTrainingStep::step: micro-batch " + std::to_string(a) +
                                  " is not of the captured shape (micro-batch x seq_len)");
    inputs_[a].copy_(batch.inputs);
    targets_[a].copy_(batch.targets);
    loaded_[a] = {inputs_[a], targets_[a], batch.scored};
    scored_[a].fill_(double(std::max<int64_t>(batch.scored, 1)));
  }
  for (size_t a = 0; a < n; ++a) divisors_[a].fill_(micro_batch_divisor(loaded_, a));
  lr_.fill_(lr);
  for (auto& group : optimizer_.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
}

// The trainer's eager step (Trainer::forward_backward and optimizer_step), on the loaded batch.
double GraphedTrainingStep::eager_step() {
  optimizer_.zero_grad();
  const double loss = accumulate_gradients(model_, loaded_, config_.precision).item<double>();
  optimizer_step(optimizer_, config_.clip);
  return loss;
}

// After the eager step, before the capture: a device counter for each distinct AdamW step count
// of the parameters that step, made now (a tensor made during the capture would be filled
// afresh at every replay).
void GraphedTrainingStep::prepare_capture() {
  step_counters_.clear();
  stepped_.clear();
  const auto scalar = lr_.options();
  for (const auto& group : optimizer_.param_groups())
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto held = optimizer_.state().find(p.unsafeGetTensorImpl());
      if (held == optimizer_.state().end()) continue;  // the capture then refuses it, naming it
      const int64_t count = static_cast<const torch::optim::AdamWParamState&>(*held->second).step();
      auto& counter = step_counters_[count];
      if (!counter.defined()) counter = torch::full({}, double(count), scalar);
      stepped_.push_back(p);
    }
}

// What the graph records: the eager step's operations, with the scored-token counts, the
// micro-batches' divisors and the learning rate read from device scalars and AdamW's counts
// from the device counters.
void GraphedTrainingStep::captured_step() {
  optimizer_.zero_grad();  // the backward below makes the gradients, in the graph's memory
  torch::Tensor loss;
  for (size_t a = 0; a < inputs_.size(); ++a) {
    const auto part = training_nll_sum(model_, inputs_[a], targets_[a], config_.precision) / scored_[a];
    (part / divisors_[a]).backward();
    const auto share = part.detach() / divisors_[a];
    loss = loss.defined() ? loss + share : share;
  }
  loss_ = loss;
  aten_fused_device_step(optimizer_, config_.clip, DeviceAdamwState{lr_, step_counters_});
}

double GraphedTrainingStep::step(const std::vector<MicroBatch>& batches, double lr) {
  if (!failure_.empty())
    throw std::logic_error("GraphedTrainingStep::step: the capture failed (" + failure_ + "); train eagerly");
  load(batches, lr);
  if (!graph_) {
    const CudaGraphCapture capture = cuda_graph_capture();
    if (!capture) throw std::logic_error("GraphedTrainingStep::step: extrap's CUDA half is not loaded");
    double loss = 0;
    bool trained = false;
    const auto warmup = [&] {
      loss = eager_step();
      trained = true;
      prepare_capture();
    };
    try {
      graph_ = capture(warmup, [&] { captured_step(); });
    } catch (const std::exception& error) {
      if (!trained) throw;  // the eager step's own error, not the capture's
      failure_ = error.what();
      graph_.reset();
      loss_ = torch::Tensor();
      optimizer_.zero_grad();
    }
    return loss;
  }
  graph_->replay();
  for (const auto& p : stepped_) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(*optimizer_.state().at(p.unsafeGetTensorImpl()));
    state.step(state.step() + 1);
  }
  return loss_.item<double>();
}

}  // namespace extrap
