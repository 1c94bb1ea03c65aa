// A GPU training step captured once as a CUDA graph and replayed (train.cuda_graph,
// core/model/config.h; core/runtime/cuda_graph.h).
//
// An eager step on a GPU launches every operator from the host: about 640 kernels a step for a
// GPT-2-small-sized model, each after LibTorch's dispatch and autograd's bookkeeping, and the
// host's launches, not the GPU, set the pace (core/attention/cuda/NOTES.md). A graph records
// the step's kernels once (forward, backward, clipping and AdamW) and replays them with one
// launch. The arithmetic is the eager step's: the same kernels on the same values.
//
// The first call is an eager step (on a side stream), then the next step is captured, not run;
// every later call copies its micro-batches into the tensors the graph was captured with,
// writes the learning rate and each micro-batch's scored-token count into device scalars, and
// replays. The graph owns the step's memory (its private pool) for as long as it lives. What
// the host keeps that the graph cannot update, AdamW's step counts, is advanced after each
// replay, so checkpoints hold what an eager run's hold and either kind of run resumes the
// other's.
//
// What a graph cannot follow is refused up front (unsupported_reason): data parallelism (the
// all-reduce), positions drawn on the host every step (position.randomize_max, pose_target),
// an optimiser step that reads back to the host (EXTRAP_FUSED_ADAMW=0), a CPU device. Anything
// else that synchronises with the host inside the step makes the capture fail with CUDA's
// reason (failure()); the call's eager step has then still trained, and the caller decides.
#pragma once

#include "core/model/config.h"
#include "core/model/model.h"
#include "core/runtime/cuda_graph.h"

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace extrap {

// One micro-batch of a training step: token ids and targets (sequences, seq_len), targets -100
// where not scored; `scored`, the targets it scores, all ranks' (at least 1 is taken): its
// summed NLL is divided by it, and the step's scored tokens are the micro-batches' together.
struct MicroBatch {
  torch::Tensor inputs, targets;
  int64_t scored = 0;
};

class GraphedTrainingStep {
 public:
  // Why the steps of `model` under `config` cannot be graphed on `device` ("" when they can);
  // `data_parallel`: the run has ranks.
  static std::string unsupported_reason(TransformerLM& model, torch::optim::Optimizer& optimizer,
                                        const TrainConfig& config, const torch::Device& device, bool data_parallel);

  // The graphed step that config.cuda_graph asks for, or nullptr: where it is off, or under
  // `auto` where the steps cannot be graphed (why in *eager_reason, when given). Under `on`,
  // steps that cannot be graphed are a ConfigError naming train.cuda_graph in `source` (the
  // config's file). The trainer's choice and `extrap bench train`'s.
  static std::unique_ptr<GraphedTrainingStep> for_config(TransformerLM model, torch::optim::Optimizer& optimizer,
                                                         const TrainConfig& config, const torch::Device& device,
                                                         bool data_parallel, int64_t micro_batch,
                                                         const std::string& source, std::string* eager_reason);

  // micro_batch: the sequences of each micro-batch (config.seq_len tokens each).
  GraphedTrainingStep(TransformerLM model, torch::optim::AdamW& optimizer, const TrainConfig& config,
                      int64_t micro_batch);
  ~GraphedTrainingStep();
  GraphedTrainingStep(const GraphedTrainingStep&) = delete;
  GraphedTrainingStep& operator=(const GraphedTrainingStep&) = delete;

  // One optimiser step at learning rate `lr` (set on every parameter group) on
  // config.accumulation micro-batches of (micro_batch, seq_len) token ids, on any device.
  // Returns the step's loss (its summed NLL over its scored tokens), read back from the device.
  double step(const std::vector<MicroBatch>& batches, double lr);

  bool captured() const { return graph_ != nullptr; }
  // Why the capture failed ("" unless it did): the step() that tried trained eagerly; later
  // calls throw.
  const std::string& failure() const { return failure_; }
  // After a step(): "" unless its capture failed. Then, under train.cuda_graph `auto`, the
  // reason (the step trained eagerly; the caller drops this object and trains on eagerly);
  // under `on`, a ConfigError naming the key in `source`.
  std::string failure_under_auto(const std::string& source) const;

 private:
  void load(const std::vector<MicroBatch>& batches, double lr);
  double eager_step();
  void prepare_capture();
  void captured_step();

  TransformerLM model_;
  torch::optim::AdamW& optimizer_;
  TrainConfig config_;
  // What the graph reads: each micro-batch's tokens, scored-token count and divisor
  // (micro_batch_divisor), the learning rate; the loaded micro-batches as the eager step takes them.
  std::vector<torch::Tensor> inputs_, targets_, scored_, divisors_;
  std::vector<MicroBatch> loaded_;
  torch::Tensor lr_;
  // AdamW's step counts on the device (one counter a distinct count, incremented in the graph)
  // and the parameters the graph steps, whose host counts advance after each replay.
  std::map<int64_t, torch::Tensor> step_counters_;
  std::vector<torch::Tensor> stepped_;
  torch::Tensor loss_;  // the graph's output: the step's loss
  std::unique_ptr<CapturedGraph> graph_;
  std::string failure_;
};

}  // namespace extrap
