// The training loop: AdamW or NAG (core/train/optimizer.h), warm-up + cosine / inverse-sqrt
// decay or fairseq's cosine with restarts, gradient clipping and
// accumulation, periodic validation and checkpoints, exact resumption.
//
// Data order: the training stream is cut into blocks of seq_len inputs (fairseq
// --sample-break-mode none; targets are the inputs shifted by one token) and visited in a
// seeded permutation per epoch. A checkpoint holds the model, the optimiser, the step, the
// data cursor (epoch, index) and LibTorch's CPU RNG state, so `--resume` continues
// bit-for-bit on the CPU for the same thread count.
// Retrieval tasks (data.task): each training sequence is, with probability data.task_fraction
// (decided by train.seed and the sequence's number in the run, so resumption is exact), a
// whole task instance of seq_len + 1 tokens (core/data/retrieval_task.h) instead of a corpus block.
//
// Data parallel (core/runtime/distributed.h): every rank builds the same global batch from the one
// seeded order and trains on its own contiguous share of each micro-batch (the micro-batch
// must split evenly). Each rank's loss is its share's summed NLL over the global batch's
// scored-token count, so the summed gradients (bucketed all-reduce after backward) are
// those of one process on the whole batch; the step's mathematics do not depend on the world
// size (up to summation order; dropout masks are drawn per share). Parameters are broadcast
// from rank 0 at start; all ranks draw from the same RNG stream, so randomized positions and
// masked-LM corruption agree. Only rank 0 writes the run directory; other ranks resume from
// the checkpoint rank 0 resumes from (the run directory must be readable by every rank), at
// the same world size.
#pragma once

#include "core/data/corpus.h"
#include "core/data/retrieval_task.h"
#include "core/train/graphed_step.h"
#include "core/model/config.h"
#include "core/model/model.h"
#include "core/run/checkpoint.h"
#include "core/run/metrics_log.h"
#include "core/run/run_dir.h"
#include "core/runtime/distributed.h"

#include <functional>
#include <string>
#include <vector>

namespace extrap {

struct TrainProgress {
  int64_t step = 0;
  int64_t total_steps = 0;
  double loss = 0;           // mean training loss since the last report
  double lr = 0;
  double tokens_per_second = 0;
  double eta_seconds = 0;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t resumed_from = 0;            // 0 if started fresh
  std::vector<CurvePoint> train_curve;
  std::vector<CurvePoint> valid_curve;
  double tokens_per_second = 0;        // training throughput (validation excluded)
  int64_t peak_memory_bytes = 0;       // peak resident memory of the process
  double seconds = 0;
  int64_t num_parameters = 0;
};

// Sequences in one micro-batch (all ranks together): batch_tokens / seq_len over accumulation.
int64_t micro_batch_sequences(const TrainConfig& config);
// Tokens one optimiser step trains on (all ranks together): micro_batch_sequences x
// accumulation x seq_len, at most batch_tokens (at least one sequence a micro-batch).
int64_t tokens_per_step(const TrainConfig& config);

// The learning rate at optimiser step `step` (1-based). cosine_restarts is fairseq's cosine
// scheduler: warm-up from warmup_init_lr to lr over `warmup` updates, then periods of `period`
// updates, period i t_mult^i times the first, each a half cosine from lr * lr_shrink^i down to
// min_lr * lr_shrink^i; fairseq sets update n's rate after n - 1 updates, and so does this.
double learning_rate(const TrainConfig& config, int64_t step);

// AdamW with the config's betas and epsilon, weight decay on matrices only.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const TransformerLM& model, const TrainConfig& config);

// One micro-batch's loss: the summed NLL of `targets` (-100: not scored) over `scored`, the
// forward pass under train.precision (core/kernels/precision.h). What the trainer and `extrap bench
// train` both call.
torch::Tensor training_loss(TransformerLM& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                            int64_t scored, Precision precision);
// The summed NLL training_loss divides (a float32 scalar).
torch::Tensor training_nll_sum(TransformerLM& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                               Precision precision);

// One optimiser step's gradients, added to the parameters' .grad (zeroing them is the
// caller's), from all its micro-batches, drawn before the first forward pass: the gradient of the
// step's summed NLL over the step's scored tokens (every micro-batch's `scored` together, all
// ranks'), as one batch of them all would take it, whatever each micro-batch scores (a masked
// LM's vary). Each micro-batch's training_loss (its own mean) is divided by
// micro_batch_divisor(), backward. Returns the step's loss, that mean, as a float64 scalar on the
// model's device, not read back (one read a step, where wanted). The trainer's eager step, the
// graphed step's first (eager) step and `extrap bench train`'s eager step.
torch::Tensor accumulate_gradients(TransformerLM& model, const std::vector<MicroBatch>& batches, Precision precision);
// What micro-batch a's mean NLL is divided by for the step's: the step's scored tokens over its
// own (the number of micro-batches where each scores alike, as a causal LM's do). At least 1
// token a micro-batch is taken, as training_loss takes it.
double micro_batch_divisor(const std::vector<MicroBatch>& batches, size_t a);

class Trainer {
 public:
  Trainer(Config config, const Corpus& corpus);

  // Trains to config.train.steps in the run directory config.train.out_dir (core/run/run_dir.h):
  // `resume` continues from its checkpoint when there is one; a run directory of another
  // config, a damaged checkpoint or a held lock is a ConfigError. A training or validation
  // loss that is not finite, or exceeds twice the larger of ln V (a uniform guess's) and the
  // run's step-1 loss, stops the run with an error naming the step (nothing of it is saved).
  TrainSummary run(RunStart start);

  TransformerLM& model() { return model_; }
  const Config& config() const { return config_; }

  // Called at every log point (progress display of a sweep, say). Replaces the default
  // progress line / log output when set.
  std::function<void(const TrainProgress&)> on_progress;
  bool quiet = false;  // no default progress output
  // Return after this step (and its checkpoint), as an interruption would; -1: never.
  int64_t stop_after_step = -1;

 private:
  struct Cursor {
    int64_t epoch = 0;
    int64_t index = 0;
  };
  // `sequences` training sequences; `first_slot` numbers the first of them among all the
  // sequences of the run (what decides, with train.seed, which are retrieval-task instances).
  torch::Tensor next_batch(Cursor& cursor, int64_t sequences, int64_t first_slot,
                           torch::Tensor& targets);
  bool task_slot(int64_t slot) const;  // whether sequence `slot` is a task instance
  double validate();

  // The steps of run(), in order; RunState (trainer.cpp) is what they share.
  struct RunState;
  void open_run(RunState& state, RunStart start);
  void resume(RunState& state);
  void prepare_training(RunState& state);
  double train_step(RunState& state);
  // Micro-batch `a` of the coming step: this rank's rows, on device_; scored, the whole
  // micro-batch's scored-token count (all ranks').
  MicroBatch micro_batch(RunState& state, int64_t a);
  double forward_backward(RunState& state);
  double graphed_step(RunState& state, double lr);
  void log_progress(RunState& state, double lr);
  void validate_and_log(RunState& state);
  std::vector<std::pair<std::string, double>> position_log_values();
  void write_metrics(RunState& state);
  std::vector<nlohmann::ordered_json> saved_metrics(const TrainSummary& summary) const;
  void check_divergence(int64_t step, const char* what, double loss, double first_loss) const;
  void save_run(RunState& state);
  TrainSummary finish(RunState& state);

  Config config_;
  const Corpus& corpus_;
  torch::Device device_;
  ProcessGroup* group_ = nullptr;  // data-parallel ranks (nullptr: one process)
  TransformerLM model_ = nullptr;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;  // train.optimizer's (core/train/optimizer.h)
  std::unique_ptr<TaskGenerator> tasks_;  // data.task, when set
  std::vector<int64_t> order_;  // block permutation of the current epoch
  int64_t order_epoch_ = -1;
};

}  // namespace extrap
