#include "core/train/trainer.h"

#include "core/base/fault.h"
#include "core/base/files.h"
#include "core/base/hashing.h"
#include "core/eval/evaluator.h"
#include "core/kernels/fused_adamw.h"
#include "core/kernels/fused_cpu_loss.h"
#include "core/kernels/precision.h"
#include "core/model/memory_estimate.h"
#include "core/runtime/cuda_support.h"
#include "core/runtime/progress.h"
#include "core/runtime/sysinfo.h"
#include "core/train/graphed_step.h"
#include "core/train/optimizer.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <random>

namespace fs = std::filesystem;

namespace extrap {

namespace {
// fairseq's cosine scheduler (fairseq/optim/lr_scheduler/cosine_lr_scheduler.py, the ALiBi
// paper's --lr-scheduler cosine) after n updates: fairseq sets the rate for the next update
// from the count of updates done, so update n + 1 runs at this.
double fairseq_cosine(const TrainConfig& c, int64_t n) {
  if (c.warmup > 0 && n < c.warmup) return c.warmup_init_lr + double(n) * (c.lr - c.warmup_init_lr) / double(c.warmup);
  const double done = double(n - c.warmup);
  const double period = double(c.period > 0 ? c.period : std::max<int64_t>(c.steps - c.warmup, 1));
  double i = 0, length = period, into = 0;
  if (c.t_mult != 1) {
    i = std::floor(std::log(1 - done / period * (1 - c.t_mult)) / std::log(c.t_mult));
    length = std::pow(c.t_mult, i) * period;
    into = done - (1 - std::pow(c.t_mult, i)) / (1 - c.t_mult) * period;
  } else {
    i = std::floor(done / period);
    into = done - period * i;
  }
  const double shrink = std::pow(c.lr_shrink, i);
  const double low = c.min_lr * shrink, high = c.lr * shrink;
  return low + 0.5 * (high - low) * (1 + std::cos(M_PI * into / length));
}
}  // namespace

double learning_rate(const TrainConfig& c, int64_t step) {
  if (c.schedule == Schedule::cosine_restarts) return fairseq_cosine(c, step - 1);
  if (c.warmup > 0 && step <= c.warmup) return c.lr * double(step) / double(c.warmup);
  if (c.schedule == Schedule::constant) return c.lr;
  if (c.schedule == Schedule::inverse_sqrt)
    return c.lr * std::sqrt(double(std::max<int64_t>(c.warmup, 1))) / std::sqrt(double(step));
  const double span = double(std::max<int64_t>(c.steps - c.warmup, 1));
  const double progress = std::min(1.0, double(step - c.warmup) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

namespace {

std::vector<torch::optim::OptimizerParamGroup> parameter_groups(const TransformerLM& model,
                                                                const TrainConfig& c) {
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.lr).betas({c.beta1, c.beta2}).eps(c.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(c.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return groups;
}

// bf16 products without AVX512_BF16 or AMX are emulated by oneDNN: a run that asked for bf16 to
// be fast is told, once a process, what it costs and what to do instead.
void warn_emulated_bf16() {
  static std::once_flag once;
  if (cpu_has_fast_bf16()) return;
  std::call_once(once, [] {
    std::cerr << "extrap: warning: train.precision bf16 on a CPU without AVX512_BF16 or AMX (or "
                 "capped below AVX-512) emulates its bf16 products: about 18x slower than fp32 on an "
                 "AVX2-only EPYC (benchmarks/RESULTS.md); train.precision: fp32 is faster here\n";
  });
}

}  // namespace

std::unique_ptr<torch::optim::AdamW> make_optimizer(const TransformerLM& model, const TrainConfig& config) {
  TORCH_CHECK(config.optimizer == OptimizerKind::adamw, "make_optimizer: train.optimizer is ", enum_name(config.optimizer));
  return std::make_unique<torch::optim::AdamW>(parameter_groups(model, config));
}

torch::Tensor training_nll_sum(TransformerLM& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                               Precision precision) {
  ComputePrecision region(precision, inputs.device().type());
  if (model->adaptive())  // only the targets' bands of the softmax
    return model->nll(model->hidden(inputs).reshape({targets.numel(), -1}), targets.reshape({-1})).sum();
  const auto logits = model->forward(inputs).reshape({-1, model->vocab_size()});  // (B T, V)
  const auto flat_targets = targets.reshape({-1});
  // On the CPU the fused loss (core/kernels/fused_cpu_loss.h): the same float32 arithmetic in one pass
  // each way, and no float32 copy of bf16 logits.
  return cross_entropy_sum_unsupported_reason(logits, flat_targets).empty()
             ? cross_entropy_sum(logits, flat_targets, -100)
             : torch::nn::functional::cross_entropy(
                   logits, flat_targets,
                   torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
}

torch::Tensor training_loss(TransformerLM& model, const torch::Tensor& inputs, const torch::Tensor& targets,
                            int64_t scored, Precision precision) {
  return training_nll_sum(model, inputs, targets, precision) / double(std::max<int64_t>(scored, 1));
}

double micro_batch_divisor(const std::vector<MicroBatch>& batches, size_t a) {
  int64_t total = 0;
  for (const MicroBatch& b : batches) total += std::max<int64_t>(b.scored, 1);
  return double(total) / double(std::max<int64_t>(batches[a].scored, 1));
}

torch::Tensor accumulate_gradients(TransformerLM& model, const std::vector<MicroBatch>& batches, Precision precision) {
  TORCH_CHECK(!batches.empty(), "accumulate_gradients: no micro-batches (at least one)");
  torch::Tensor loss;
  for (size_t a = 0; a < batches.size(); ++a) {
    const MicroBatch& batch = batches[a];
    const auto part = training_loss(model, batch.inputs, batch.targets, batch.scored, precision);
    const double divisor = micro_batch_divisor(batches, a);
    (part / divisor).backward();
    // In float64, as the trainer added the loss up on the host before: the same sum, digit for digit.
    const auto share = part.detach().to(torch::kFloat64) / divisor;
    loss = loss.defined() ? loss + share : share;
  }
  return loss;
}

Trainer::Trainer(Config config, const Corpus& corpus)
    : config_(std::move(config)),
      corpus_(corpus),
      device_(torch_device(config_.train.device)) {
  if (device_.is_cuda()) require_cuda(config_.source + ": train.device is cuda");
  if (!config_.model.causal() && corpus.mask_token < 0)
    throw ConfigError(config_.source + ": model.objective masked_lm replaces tokens by <mask>, and corpus '" +
                      corpus.name + "' (data.tokenizer " + enum_name(corpus.tokenizer) + ") has none");
  group_ = ProcessGroup::get(device_);
  if (group_) {
    device_ = group_->device();
    YAML::Node identity;
    identity["config"] = config_.to_yaml();
    identity["corpus"] = corpus.identity();
    group_->check_same("config or data", YAML::Dump(identity));
  }
  configure_threads(config_.train.threads);
  check_training_memory(config_, corpus.vocab_size);
  torch::manual_seed(uint64_t(config_.train.seed));
  model_ = build_model(config_, corpus.vocab_size);
  if (config_.task != RetrievalTask::none) {
    tasks_ = std::make_unique<TaskGenerator>(config_.task, corpus);
    if (config_.train.seq_len + 1 < tasks_->min_length())
      throw ConfigError(config_.source + ": data.task " + enum_name(config_.task) + " needs " +
                        std::to_string(tasks_->min_length()) + "-token instances; train.seq_len " +
                        std::to_string(config_.train.seq_len) + " gives " +
                        std::to_string(config_.train.seq_len + 1) + " (inputs and the last target)");
  }
  // Refused here, before the run directory is touched, rather than at the first batch.
  if ((corpus.train.size() - 1) / config_.train.seq_len < 1 && !(tasks_ && config_.task_fraction >= 1))
    throw ConfigError(config_.source + ": the training split has " +
                      std::to_string(corpus.train.size()) + " tokens: too few for train.seq_len " +
                      std::to_string(config_.train.seq_len));
  // Validation (every train.validate_every steps, and at the last) scores windows of seq_len
  // from the first train.validate_tokens of the validation split; one that cannot fill a
  // window is refused now, not after the steps before the first validation (and before
  // --overwrite clears the run directory).
  const int64_t valid_split = corpus.valid.size(), limit = config_.train.validate_tokens;
  const int64_t valid_tokens = limit > 0 ? std::min(limit, valid_split) : valid_split;
  const int64_t window = window_tokens(config_.train.seq_len, config_.model.causal());
  if (valid_tokens < window)
    throw ConfigError(config_.source + ": validation needs " + std::to_string(window) + " tokens (a window of " +
                      "train.seq_len " + std::to_string(config_.train.seq_len) + "); " +
                      (limit > 0 && limit < valid_split
                           ? "train.validate_tokens is " + std::to_string(limit) + " (the split has " +
                                 std::to_string(valid_split) + ")"
                           : "the validation split has " + std::to_string(valid_split)));
  model_->to(device_);
  if (group_) {
    const int64_t micro = micro_batch_sequences(config_.train);
    if (micro % group_->size() != 0)
      throw ConfigError(config_.source + ": train.batch_tokens " +
                        std::to_string(config_.train.batch_tokens) + " gives " +
                        std::to_string(micro) + " sequences a micro-batch, which " +
                        std::to_string(group_->size()) +
                        " ranks cannot share evenly: make it a multiple of " +
                        std::to_string(group_->size()) + " sequences of train.seq_len " +
                        std::to_string(config_.train.seq_len));
    broadcast_parameters(*group_, *model_);
  }
  optimizer_ = make_training_optimizer(model_, config_.train);
}

int64_t micro_batch_sequences(const TrainConfig& c) {
  return std::max<int64_t>(c.accumulation, c.batch_tokens / c.seq_len) / c.accumulation;
}

int64_t tokens_per_step(const TrainConfig& c) {
  return micro_batch_sequences(c) * c.accumulation * c.seq_len;
}

bool Trainer::task_slot(int64_t slot) const {
  if (!tasks_) return false;
  const double fraction = config_.task_fraction;
  if (fraction >= 1) return true;
  const uint64_t draw = task_seed({uint64_t(config_.train.seed), uint64_t(slot), 0x7461736bu});
  return task_unit(draw) < fraction;
}

torch::Tensor Trainer::next_batch(Cursor& cursor, int64_t sequences, int64_t first_slot,
                                  torch::Tensor& targets) {
  const TrainConfig& c = config_.train;
  const TokenStream& train = corpus_.train;
  const int64_t blocks = (train.size() - 1) / c.seq_len;  // at least 1 (the constructor checks)
  auto inputs = torch::empty({sequences, c.seq_len}, torch::kLong);
  targets = torch::empty({sequences, c.seq_len}, torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto tg = targets.accessor<int64_t, 2>();
  const bool causal = config_.model.causal();
  for (int64_t s = 0; s < sequences; ++s) {
    if (task_slot(first_slot + s)) {
      // A whole task instance of seq_len + 1 tokens, its key at a uniform depth; the corpus
      // cursor stays where it is.
      const uint64_t seed = task_seed({uint64_t(c.seed), uint64_t(first_slot + s), 0x696e7374u});
      const TaskInstance task = tasks_->make(c.seq_len + 1, task_unit(seed), task_seed({seed}));
      for (int64_t p = 0; p < c.seq_len; ++p) {
        in[s][p] = task.tokens[size_t(p)];
        tg[s][p] = task.tokens[size_t(p + 1)];
      }
      continue;
    }
    if (cursor.index >= blocks) {
      ++cursor.epoch;
      cursor.index = 0;
    }
    if (order_epoch_ != cursor.epoch) {
      order_.resize(blocks);
      for (int64_t i = 0; i < blocks; ++i) order_[i] = i;
      std::mt19937_64 rng(uint64_t(c.seed) * 1000003ull + uint64_t(cursor.epoch));
      for (int64_t i = blocks - 1; i > 0; --i) std::swap(order_[i], order_[rng() % uint64_t(i + 1)]);
      order_epoch_ = cursor.epoch;
    }
    const int32_t* block = train.data() + order_[cursor.index++] * c.seq_len;
    for (int64_t p = 0; p < c.seq_len; ++p) {
      in[s][p] = block[p];
      tg[s][p] = causal ? block[p + 1] : block[p];
    }
  }
  if (!causal) {
    // BERT-style corruption: select mask_prob of the tokens; of those 80% -> <mask>,
    // 10% -> random token, 10% unchanged. Loss only on selected tokens (others -100).
    auto u = torch::rand({sequences, c.seq_len});
    auto selected = u.lt(c.mask_prob);
    auto action = torch::rand({sequences, c.seq_len});
    auto random_tokens = torch::randint(0, corpus_.vocab_size, {sequences, c.seq_len}, torch::kLong);
    random_tokens = torch::where(random_tokens.eq(corpus_.mask_token),
                                 torch::zeros_like(random_tokens), random_tokens);
    auto masked = inputs.clone();
    masked = torch::where(selected & action.lt(0.8), torch::full_like(inputs, corpus_.mask_token), masked);
    masked = torch::where(selected & action.ge(0.8) & action.lt(0.9), random_tokens, masked);
    targets = torch::where(selected, targets, torch::full_like(targets, -100));
    inputs = masked;
  }
  return inputs;
}

double Trainer::validate() {
  EvalSpec spec = eval_spec_for(config_, config_.train.seq_len);
  spec.max_tokens = config_.train.validate_tokens;
  auto r = evaluate(model_, corpus_, corpus_.valid, spec, device_);
  return r.scored_tokens ? r.nll_sum / double(r.scored_tokens) : NAN;
}

// What the steps of run() share: the run directory, the position in the data, the summary so
// far and the loss and time counted since the last log point. Members are destroyed in reverse
// order, so the run directory (its lock) is released last, as a local of run() would be.
struct Trainer::RunState {
  bool leader = true;  // rank 0 (or the only process)
  int64_t world = 1;
  // Only rank 0 owns (locks, checks, writes) the run directory.
  std::optional<RunDirectory> run_dir;
  std::optional<VerifiedCheckpoint> checkpoint_read;  // the other ranks' checkpoint
  TrainSummary summary;
  int64_t step = 0;
  Cursor cursor;
  CheckpointManifest manifest;
  int64_t micro = 0;  // sequences of each micro-batch, all ranks together
  std::optional<StatusLine> display;
  bool terminal = false;
  double trained_seconds = 0;  // training time only (validation excluded)
  int64_t tokens_per_step = 0;
  double tokens_before = 0;  // tokens trained before a resumption
  int64_t tokens_done = 0;
  double loss_sum = 0;  // training loss since the last log point
  int64_t loss_count = 0;
  double first_loss = NAN;  // step 1's training loss, the untrained model's (check_divergence)
  std::optional<MetricsLog> metrics;  // RUN/metrics.jsonl (rank 0)
  nlohmann::ordered_json record;      // this step's metrics line, while it is being filled
  std::unique_ptr<GraphedTrainingStep> graphed;  // train.cuda_graph's step, where it is taken

  // The checkpoint to continue from: rank 0's run directory's, or the one another rank read.
  std::optional<VerifiedCheckpoint>& checkpoint() { return leader ? run_dir->checkpoint() : checkpoint_read; }
};

TrainSummary Trainer::run(RunStart start) {
  const TrainConfig& c = config_.train;
  RunState state;
  open_run(state, start);
  resume(state);
  prepare_training(state);
  // Zero steps: the run is its initial model, saved like any other, so that what `extrap train`
  // then evaluates (eval.json) is a checkpoint that eval, export and sweeps read.
  if (state.step == c.steps && !state.checkpoint()) save_run(state);
  while (state.step < c.steps) {
    const double lr = train_step(state);
    log_progress(state, lr);
    if (state.step == c.steps || (c.validate_every > 0 && state.step % c.validate_every == 0))
      validate_and_log(state);
    write_metrics(state);
    state.summary.seconds = state.trained_seconds;
    if (state.step == c.steps || (c.checkpoint_every > 0 && state.step % c.checkpoint_every == 0))
      save_run(state);
    if (state.step == stop_after_step) break;
  }
  return finish(state);
}

namespace {
// --resume of a run directory that has trained (its log has records) but has no checkpoint: it
// was deleted, or the run was killed before its first one. The run trains from step 0 and its
// log starts again, which is said in one line (even when quiet), never done silently.
void say_restarted_log(const std::string& out_dir) {
  const fs::path log = fs::path(out_dir) / "metrics.jsonl";
  std::error_code error;
  if (!fs::exists(log, error) || fs::file_size(log, error) == 0 || error) return;
  std::string reached = "records that cannot be read";
  try {
    int64_t last = 0;
    for (const auto& record : read_metrics(log)) last = std::max<int64_t>(last, record["step"].get<int64_t>());
    reached = "records up to step " + std::to_string(last);
  } catch (const std::exception&) {
  }
  std::cerr << "extrap: " << out_dir << " has no checkpoint to resume from (" << log.string() << " has "
            << reached << "): it trains from step 0, and that log starts again\n";
}
}  // namespace

// Opening: rank 0 locks and checks the run directory; every rank finds rank 0's checkpoint.
void Trainer::open_run(RunState& state, RunStart start) {
  const TrainConfig& c = config_.train;
  state.leader = !group_ || group_->rank() == 0;
  state.world = group_ ? group_->size() : 1;
  if (state.leader) state.run_dir.emplace(config_, corpus_, start);
  std::optional<VerifiedCheckpoint>& checkpoint = state.checkpoint();
  if (state.leader && start == RunStart::resume && !checkpoint) say_restarted_log(c.out_dir);
  if (group_) {
    // Every rank continues from the checkpoint rank 0 continues from.
    const std::string resume_step = group_->share(
        "resume step", checkpoint ? std::to_string(checkpoint->state.step) : "none");
    if (!state.leader && resume_step != "none") {
      checkpoint = find_checkpoint(c.out_dir);
      if (!checkpoint || std::to_string(checkpoint->state.step) != resume_step)
        throw ConfigError("rank " + std::to_string(group_->rank()) + " cannot read the checkpoint " +
                          "rank 0 resumes from (" + c.out_dir + ", step " + resume_step +
                          "): a data-parallel run directory must be on a filesystem every rank reads");
    }
  }
}

// Resuming from the checkpoint, if any: model, optimiser, RNG, data cursor, throughput, curves.
void Trainer::resume(RunState& state) {
  const TrainConfig& c = config_.train;
  TrainSummary& summary = state.summary;
  summary.num_parameters = model_->num_parameters();
  std::optional<VerifiedCheckpoint>& checkpoint = state.checkpoint();
  if (!checkpoint) return;
  if (checkpoint->is_imported())
    throw ConfigError(c.out_dir + " is an imported model (extrap import): it is evaluated, not trained further "
                      "(no optimiser state); train into another train.out_dir");
  // The validation curve continues only if it measures as before (the run's identity leaves the
  // evaluation keys out, so this one is compared here).
  if (const int64_t before = checkpoint->config.train.validate_tokens;
      before != c.validate_tokens && !checkpoint->state.valid_curve.empty())
    throw ConfigError(config_.source + ": train.validate_tokens is " + std::to_string(c.validate_tokens) +
                      "; the run in " + c.out_dir + " validated on " + std::to_string(before) +
                      " (0: the whole split) up to step " + std::to_string(checkpoint->state.step) +
                      ", and its validation curve would mix the two: resume with " + std::to_string(before) +
                      " or train again with --overwrite");
  if (checkpoint->state.step > c.steps)
    throw ConfigError(checkpoint->dir.string() + " is at step " +
                      std::to_string(checkpoint->state.step) + ", past train.steps " +
                      std::to_string(c.steps));
  if (checkpoint->state.world_size != state.world)
    throw ConfigError(checkpoint->dir.string() + " was trained by " +
                      std::to_string(checkpoint->state.world_size) + " data-parallel rank(s); " +
                      "resuming it with " + std::to_string(state.world) +
                      " would not continue the same run: resume with the same number of ranks");
  load_model(*checkpoint, model_);
  load_optimizer(*checkpoint, *optimizer_);
  const ModelConfig& m = config_.model;
  const bool drops = m.dropout > 0 || m.attention_dropout > 0 || m.activation_dropout > 0 || m.adaptive_dropout > 0;
  if (!load_rng(*checkpoint, device_) && drops && state.leader)
    std::cerr << "extrap: " << checkpoint->dir.string() << " holds no CUDA generator state (saved on a CPU, or by "
              << "an older extrap): dropout's masks restart from train.seed's stream, not where the run left them\n";
  state.step = checkpoint->state.step;
  state.cursor = {checkpoint->state.epoch, checkpoint->state.index};
  summary.tokens_per_second = checkpoint->state.tokens_per_second;
  summary.seconds = checkpoint->state.seconds;
  summary.train_curve = checkpoint->state.train_curve;
  summary.valid_curve = checkpoint->state.valid_curve;
  state.loss_sum = checkpoint->state.pending_loss_sum;
  state.loss_count = checkpoint->state.pending_loss_count;
  state.first_loss = checkpoint->state.first_loss;
  summary.resumed_from = state.step;
  if (!quiet && state.leader) std::cerr << "resuming " << c.out_dir << " from step " << state.step << "\n";
}

// The metrics lines a resumed run's curves can rebuild (MetricsLog restores those its log lacks):
// a line for each step of the training and validation curves, with what they hold and what
// follows from the config (the rate, the tokens), marked "restored".
std::vector<nlohmann::ordered_json> Trainer::saved_metrics(const TrainSummary& summary) const {
  const TrainConfig& c = config_.train;
  std::map<int64_t, nlohmann::ordered_json> records;
  for (const auto& point : summary.train_curve) {
    auto& record = records[point.step];
    record["step"] = point.step;
    record["loss"] = point.loss;
    record["lr"] = learning_rate(c, point.step);
  }
  for (const auto& point : summary.valid_curve) {
    auto& record = records[point.step];
    record["step"] = point.step;
    record["valid_loss"] = point.loss;
    record["valid_perplexity"] = std::exp(point.loss);
  }
  std::vector<nlohmann::ordered_json> out;
  for (auto& [step, record] : records) {
    record["tokens"] = step * tokens_per_step(c);
    record["restored"] = true;
    out.push_back(std::move(record));
  }
  return out;
}

// Before the first step: config.yaml and the manifest (rank 0), the display, throughput counts.
void Trainer::prepare_training(RunState& state) {
  const TrainConfig& c = config_.train;
  if (!state.leader) quiet = true;
  if (state.leader && c.precision == Precision::bf16 && device_.is_cpu()) warn_emulated_bf16();
  if (state.leader) {
    write_file_atomic(fs::path(c.out_dir) / "config.yaml", YAML::Dump(config_.to_yaml()) + "\n");
    state.manifest.fingerprint = state.run_dir->fingerprint().hash;
    state.metrics.emplace(state.run_dir->path() / "metrics.jsonl", state.step, saved_metrics(state.summary));
    if (const std::string skipped = state.metrics->skipped_text(); !skipped.empty())
      std::cerr << skipped << "\n";  // even when quiet: lines of the run's log were dropped
    if (const std::string& restored = state.metrics->restored_text(); !restored.empty())
      std::cerr << restored << "\n";  // even when quiet: the log had lost lines
    // The evaluation `extrap train` saved describes the model as it was: it goes once the
    // model changes.
    if (state.step < c.steps) fs::remove(state.run_dir->path() / "eval.json");
  }
  state.manifest.vocabulary = hex64(corpus_.vocabulary_hash());
  state.micro = micro_batch_sequences(c);
  state.display.emplace(!quiet);
  state.terminal = state.display->redraws();
  model_->train();
  state.trained_seconds = state.summary.seconds;
  state.tokens_per_step = tokens_per_step(c);
  state.tokens_before = state.summary.tokens_per_second * state.summary.seconds;
  state.graphed = GraphedTrainingStep::for_config(model_, *optimizer_, c, device_, group_ != nullptr, state.micro,
                                                 config_.source, nullptr);
}

// One optimiser step (forward, backward, AdamW); returns its lr, throws on a non-finite loss.
double Trainer::train_step(RunState& state) {
  const TrainConfig& c = config_.train;
  const auto t0 = std::chrono::steady_clock::now();
  const double lr = learning_rate(c, state.step + 1);
  double step_loss = 0;
  if (state.graphed) {
    step_loss = graphed_step(state, lr);
  } else {
    optimizer_->zero_grad();
    step_loss = forward_backward(state);
    training_step(*optimizer_, c, lr);  // clipping and the optimiser (core/train/optimizer.h)
  }
  const int64_t step = ++state.step;
  fault_point("step", c.out_dir + " step " + std::to_string(step) + " rank " +
                          std::to_string(group_ ? group_->rank() : 0));
  state.trained_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  state.tokens_done += state.tokens_per_step;
  state.loss_sum += step_loss;
  ++state.loss_count;
  if (step == 1) state.first_loss = step_loss;
  check_divergence(step, "loss", step_loss, state.first_loss);
  state.summary.tokens_per_second =
      (state.tokens_before + double(state.tokens_done)) / std::max(state.trained_seconds, 1e-9);
  return lr;
}

// A loss that is not finite, or above twice the larger of ln V (a uniform guess's) and the run's
// first training loss (the untrained model's): no model that learns gets there; it takes
// weights blown up by too high a learning rate. The first loss is in the bound because an
// untrained model can score well above ln V: with tied embeddings scaled by sqrt(d_model) its
// logits favour the input token itself by about sqrt(d_model) (step 1's loss about 12.8 at
// d_model 256 over 257 bytes, 2 ln V = 11.1), and a healthy run comes down from there.
void Trainer::check_divergence(int64_t step, const char* what, double loss, double first_loss) const {
  const double uniform = std::log(double(corpus_.vocab_size));
  const bool first_known = std::isfinite(first_loss) && first_loss > uniform;
  const double bound = 2 * (first_known ? first_loss : uniform);
  if (std::isfinite(loss) && loss <= bound) return;
  char text[400];
  if (!std::isfinite(loss) && step == 1)
    std::snprintf(text, sizeof text,
                  "training diverged at step 1 (%s %g before any update: not the learning rate; the "
                  "untrained model's forward pass gives it); nothing was saved",
                  what, loss);
  else if (!std::isfinite(loss))
    std::snprintf(text, sizeof text,
                  "training diverged at step %lld (%s %g); nothing of this step was saved; lower train.lr",
                  (long long)step, what, loss);
  else {
    // The bound, in words: twice the untrained model's loss where it is known and the larger.
    char bound_text[96];
    if (first_known)
      std::snprintf(bound_text, sizeof bound_text, "%.2f, twice the untrained model's %.2f at step 1", bound, first_loss);
    else
      std::snprintf(bound_text, sizeof bound_text, "2 ln V = %.2f", bound);
    std::snprintf(text, sizeof text,
                  "training diverged at step %lld (%s %.6g nats a token, above %s; a uniform guess over %lld "
                  "tokens scores %.2f); nothing of this step was saved; lower train.lr",
                  (long long)step, what, loss, bound_text, (long long)corpus_.vocab_size, uniform);
  }
  throw std::runtime_error(text);
}

MicroBatch Trainer::micro_batch(RunState& state, int64_t a) {
  const TrainConfig& c = config_.train;
  const int64_t micro = state.micro;
  const int64_t share = micro / state.world;  // this rank's sequences of each micro-batch
  const int64_t first_row = group_ ? group_->rank() * share : 0;
  MicroBatch batch;
  batch.inputs = next_batch(state.cursor, micro, (state.step * c.accumulation + a) * micro, batch.targets);
  // The loss is the mean over the whole micro-batch's scored tokens: this rank's summed NLL over
  // the count of all ranks' (in one process: cross-entropy's mean).
  batch.scored = batch.targets.ne(-100).sum().item<int64_t>();
  if (group_) {
    batch.inputs = batch.inputs.narrow(0, first_row, share);
    batch.targets = batch.targets.narrow(0, first_row, share);
  }
  batch.inputs = batch.inputs.to(device_);
  batch.targets = batch.targets.to(device_);
  return batch;
}

// Forward and backward on this rank's share of the step's micro-batches; returns the batch's loss.
double Trainer::forward_backward(RunState& state) {
  const TrainConfig& c = config_.train;
  const int64_t step = state.step;
  double step_loss = 0;
  // With ranks, an error is agreed on below, so that all ranks fail alike.
  const std::string local_failure = run_or_capture(group_, [&] {
    std::vector<MicroBatch> batches;
    for (int64_t a = 0; a < c.accumulation; ++a) batches.push_back(micro_batch(state, a));
    const auto loss = accumulate_gradients(model_, batches, c.precision);
    step_loss = loss.item<double>();
  });
  if (group_) {
    // The loss of the whole batch (and whether any rank failed), then the gradients.
    const std::string what = "the gradient all-reduce of step " + std::to_string(step + 1);
    std::vector<torch::Tensor> loss{torch::full({1}, step_loss, torch::kFloat64)};
    const std::string failure = group_->all_reduce_agreeing(loss, local_failure, what);
    if (!failure.empty()) throw std::runtime_error(failure);
    step_loss = loss[0].item<double>();
    all_reduce_gradients(*group_, model_->parameters(), what);
  }
  return step_loss;
}

// The step of train_step through train.cuda_graph's captured step (one process, no ranks): the
// same micro-batches as forward_backward takes. Where the capture fails, this step has trained
// eagerly; `on` then stops the run, `auto` says so once and trains on without a graph.
double Trainer::graphed_step(RunState& state, double lr) {
  std::vector<MicroBatch> batches;
  for (int64_t a = 0; a < config_.train.accumulation; ++a) batches.push_back(micro_batch(state, a));
  const double loss = state.graphed->step(batches, lr);
  if (const std::string failure = state.graphed->failure_under_auto(config_.source); !failure.empty()) {
    if (!quiet)
      std::cerr << "extrap: train.cuda_graph: the training step could not be captured (" << failure
                << "); training on without a CUDA graph\n";
    state.graphed.reset();
  }
  return loss;
}

// Logging a step: the training curve at log points; the progress callback, status line or line.
void Trainer::log_progress(RunState& state, double lr) {
  const TrainConfig& c = config_.train;
  const int64_t step = state.step;
  TrainSummary& summary = state.summary;
  const bool log_point = step % std::max<int64_t>(c.log_every, 1) == 0 || step == c.steps;
  if (!log_point && !state.terminal) return;
  TrainProgress progress{step, c.steps, state.loss_sum / double(state.loss_count), lr,
                         summary.tokens_per_second,
                         double(c.steps - step) * double(state.tokens_per_step) / summary.tokens_per_second};
  if (log_point) {
    summary.train_curve.push_back({step, progress.loss});
    state.loss_sum = 0;
    state.loss_count = 0;
    state.record["loss"] = progress.loss;
    state.record["lr"] = lr;
  }
  if (on_progress) {
    on_progress(progress);
  } else if (state.terminal) {
    char text[160];
    std::snprintf(text, sizeof text, "step %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s",
                  (long long)step, (long long)c.steps, progress.loss, lr,
                  progress.tokens_per_second, format_duration(progress.eta_seconds).c_str());
    state.display->status(text, step == c.steps);
    if (step == c.steps) state.display->finish();
  } else if (!quiet && log_point) {
    char text[160];
    std::snprintf(text, sizeof text, "step %lld/%lld loss %.4f lr %.3e tok/s %.0f eta %s",
                  (long long)step, (long long)c.steps, progress.loss, lr,
                  progress.tokens_per_second, format_duration(progress.eta_seconds).c_str());
    state.display->line(text);
  }
}

// The position methods' logged values; with a layer pattern each kind's under its name
// ("local.slope0").
std::vector<std::pair<std::string, double>> Trainer::position_log_values() {
  const LayerPlan& plan = model_->plan();
  std::vector<std::pair<std::string, double>> out;
  for (int64_t k = 0; k < int64_t(plan.kinds.size()); ++k)
    for (const auto& [name, value] : model_->kind_position(k).log_values())
      out.emplace_back(plan.patterned() ? plan.kinds[k].name + "." + name : name, value);
  return out;
}

// Validation: a point of the validation curve and its line; the model goes back to training.
void Trainer::validate_and_log(RunState& state) {
  const int64_t step = state.step;
  const double valid = validate();
  check_divergence(step, "validation loss", valid, state.first_loss);
  state.summary.valid_curve.push_back({step, valid});
  state.record["valid_loss"] = valid;
  state.record["valid_perplexity"] = std::exp(valid);
  const auto logged = position_log_values();
  if (!logged.empty()) {
    nlohmann::ordered_json values = nlohmann::ordered_json::object();
    for (const auto& [name, value] : logged) values[name] = value;
    state.record["position"] = values;
  }
  if (!quiet) {
    char text[96];
    std::snprintf(text, sizeof text, "step %lld valid loss %.4f ppl %.2f", (long long)step, valid,
                  std::exp(valid));
    std::string line = text;
    for (const auto& [name, value] : logged) {
      std::snprintf(text, sizeof text, "  %s=%.5f", name.c_str(), value);
      line += text;
    }
    state.display->line(line);
  }
  model_->train();
}

// The step's line of RUN/metrics.jsonl, when it was a log or validation point (rank 0 writes).
void Trainer::write_metrics(RunState& state) {
  if (state.record.empty()) return;
  nlohmann::ordered_json line = {{"step", state.step}};
  line.update(state.record);
  state.record = nlohmann::ordered_json::object();
  line["tokens"] = state.step * state.tokens_per_step;
  line["tokens_per_second"] = state.summary.tokens_per_second;
  line["seconds"] = state.trained_seconds;
  line["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  if (state.metrics) state.metrics->append(line);
}

// A checkpoint of the run at its current step (rank 0 only writes the run directory).
void Trainer::save_run(RunState& state) {
  if (!state.leader) return;
  const int64_t step = state.step;
  const TrainSummary& summary = state.summary;
  state.manifest.step = step;
  CheckpointState saved;
  saved.step = step;
  saved.epoch = state.cursor.epoch;
  saved.index = state.cursor.index;
  saved.tokens_per_second = summary.tokens_per_second;
  saved.seconds = summary.seconds;
  saved.world_size = state.world;
  saved.train_curve = summary.train_curve;
  saved.valid_curve = summary.valid_curve;
  saved.pending_loss_sum = state.loss_sum;
  saved.pending_loss_count = state.loss_count;
  saved.first_loss = state.first_loss;
  save_checkpoint(state.run_dir->path(), config_, state.manifest, saved, model_, optimizer_.get());
  fault_point("checkpoint", state.run_dir->path().string() + " step " + std::to_string(step));
}

// The summary as the run ends, at train.steps or after stop_after_step.
TrainSummary Trainer::finish(RunState& state) {
  state.summary.steps = state.step;
  state.summary.seconds = state.trained_seconds;
  state.summary.peak_memory_bytes = peak_rss_bytes();
  return std::move(state.summary);
}

}  // namespace extrap
