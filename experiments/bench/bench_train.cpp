// `extrap bench train`: training throughput (tokens/s) and peak memory of one config's model,
// on random tokens of the config's shapes, after warm-up steps. benchmarks/train_pytorch.py
// runs the same model, shapes and thread count in eager PyTorch for comparison.
#include "core/kernels/cpu_linear.h"
#include "core/kernels/gelu_linear.h"
#include "core/kernels/glu_linear.h"
#include "core/kernels/precision.h"
#include "core/kernels/residual_norm.h"
#include "core/model/config.h"
#include "core/model/memory_estimate.h"
#include "core/model/model.h"
#include "core/runtime/cuda_support.h"
#include "core/runtime/distributed.h"
#include "core/runtime/sysinfo.h"
#include "core/train/graphed_step.h"
#include "core/train/optimizer.h"
#include "core/train/trainer.h"
#include "experiments/bench/bench_profile.h"
#include "experiments/bench/bench_util.h"
#include "experiments/cli/commands.h"

#ifdef EXTRAP_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

namespace po = boost::program_options;

namespace extrap::cli {

namespace {

// The command line of `extrap bench train`.
struct TrainBenchOptions {
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 20, warmup = 3, vocab = 257, profile = 0;
};

// Parses the command line; false when --help was asked for (and printed).
bool parse_train_bench_options(const Args& args, TrainBenchOptions& o) {
  po::options_description options("extrap bench train");
  options.add_options()
      ("config,c", po::value(&o.config_path)->required(), "YAML config (model, position, train shapes)")
      ("set", po::value(&o.overrides)->composing(), "override a key (repeatable)")
      ("steps", po::value(&o.steps), "timed optimiser steps")
      ("warmup", po::value(&o.warmup), "untimed steps first")
      ("vocab", po::value(&o.vocab), "vocabulary size of the random tokens (257: byte level)")
      ("profile", po::value(&o.profile), "then profile N more steps and print the operators by self time");
  po::variables_map vm;
  return parse(args, "extrap bench train --config FILE [--steps N] [--set key=value ...]\n"
               "       [--nproc N: N local data-parallel ranks]", options, vm);
}

// Runs `warmup` untimed steps, then times `steps` steps (waiting for the GPU after each); the
// times in seconds, sorted.
std::vector<double> time_steps(const std::function<void()>& step, int64_t warmup, int64_t steps,
                               const torch::Device& device) {
  for (int64_t i = 0; i < warmup; ++i) step();
  std::vector<double> seconds;
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    if (device.is_cuda()) torch::cuda::synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds;
}

// Prints the machine, the model and the step's shape: what the timings below were taken on.
void print_setup(const Config& config, const TransformerLM& model, int64_t global, int threads,
                 const torch::Device& device) {
  const TrainConfig& t = config.train;
  std::printf("machine: %s\ndate: %s\nruntime: %s\n", machine_description().c_str(), iso_time_now().c_str(),
              runtime_summary().c_str());
  const std::string options = config.layer_pattern.empty() ? config.model.attention_options.describe() : "";
  std::printf("model: %lld parameters, %lld layers, d_model %lld, heads %lld, position %s, attention %s%s\n",
              (long long)model->num_parameters(), (long long)config.model.layers,
              (long long)config.model.d_model, (long long)config.model.heads,
              position_label(config).c_str(), enum_name(config.model.attention).c_str(),
              options.empty() ? "" : (" (" + options + ")").c_str());
  std::printf("shape: %lld sequences x %lld tokens x %lld accumulation, %d threads, device %s, precision %s%s\n",
              (long long)global, (long long)t.seq_len, (long long)t.accumulation, threads, enum_name(t.device).c_str(),
              enum_name(t.precision).c_str(),
              t.precision == Precision::bf16 && device.is_cpu() && !cpu_has_fast_bf16()
                  ? " (no AVX512_BF16 or AMX here: bf16 products are emulated)" : "");
}

// Prints which paths the step took (core/kernels/cpu_linear.h, core/kernels/fused_adamw.h): the A/B switches show here.
void print_step_paths(const Config& config, const torch::Device& device, const torch::optim::Optimizer& optimizer) {
  const TrainConfig& t = config.train;
  // Asked inside the step's precision region, as the model asks.
  ComputePrecision precision(t.precision, device.type());
  const auto probe = torch::empty({1, 1}, torch::TensorOptions().device(device));
  const bool onednn = onednn_linear_takes(probe, probe), onednn_bf16 = onednn_bf16_linear_takes(probe, probe);
  const auto& m = config.model;
  const auto activations = torch::empty({1, 2}, probe.options().dtype(
      t.precision == Precision::bf16 ? torch::kBFloat16 : torch::kFloat32)).requires_grad_();
  std::string ffn;
  if (m.gated_ffn()) {
    ffn = std::string(m.ffn == FfnKind::swiglu ? "SwiGLU" : "GeGLU") +
          (glu_linear_fused_takes(activations, probe) ? " gate and product in one pass each way"
                                                      : " as LibTorch runs it");
  } else if (m.activation == Activation::gelu) {
    ffn = gelu_linear_fused_takes(activations.narrow(-1, 0, 1), probe) ? "GELU backward folded into the next product"
                                                      : "GELU as LibTorch runs it";
  } else {
    ffn = "ReLU as LibTorch runs it";
  }
  const char* norm_name = m.norm == NormKind::rmsnorm ? "RMSNorm" : "LayerNorm";
  const auto weight = torch::ones({4}, probe.options());
  const bool norm_fused = add_layer_norm_fused_takes(torch::empty({1, 4}, probe.options()).requires_grad_(), {},
                                                     RowNorm(weight, m.bias ? torch::zeros_like(weight) : torch::Tensor(),
                                                             m.norm_eps, m.norm == NormKind::rmsnorm));
  std::printf("paths: linear layers through %s, %s, residual adds %s%s%s, optimiser step %s\n",
              onednn            ? "oneDNN (float32)"
              : onednn_bf16     ? "oneDNN (bfloat16, autocast's casts)"
              : t.precision == Precision::bf16 ? "LibTorch (autocast bfloat16)"
                                               : "LibTorch",
              ffn.c_str(), norm_fused ? "fused with the " : "and ", norm_name,
              norm_fused ? " after them" : "s as LibTorch runs them", training_step_path(optimizer).c_str());
}

// Model FLOPs utilisation: 6 x parameters a token (forward and backward products, the tied
// embedding counted once, as the output projection; adaptive bands: the head's alone), plus attention's q.k and p.v products,
// 12 x layers x T x d_model a token, halved when causal; over the large-matrix-product rate
// of this machine (the CPU, or the GPU the model is on) measured now, in the training precision.
void print_model_flops(const Config& config, const TransformerLM& model, double tokens, double median,
                       int threads, const torch::Device& device) {
  const TrainConfig& t = config.train;
  const auto& m = config.model;
  const double attention = 12.0 * double(m.layers * t.seq_len * m.d_model) * (m.causal() ? 0.5 : 1.0);
  // With adaptive bands every token's products are the head's, c_0 + bands - 1 rows of d_model;
  // the tails and the projections run for the tokens of their bands alone and are left out
  // (the count errs low).
  double products = double(model->num_parameters());
  if (m.adaptive())
    products += double(m.d_model * (m.adaptive_cutoffs.front() + int64_t(m.adaptive_cutoffs.size()))) -
                double(vocabulary_parameters(m, model->vocab_size()));
  const double per_token = 6.0 * products + attention;
  const double achieved = per_token * tokens / median / 1e9;
  const auto dtype = t.precision == Precision::bf16 ? torch::kBFloat16 : torch::kFloat32;
  const auto rate = bench::matrix_product_gflops(dtype, device);
  const double peak = rate.gflops;
  const long long n = rate.size;
  std::printf("model FLOPs: %.3g a token, %.1f GFLOP/s\n", per_token, achieved);
  if (device.is_cuda())
    std::printf("matrix-product rate: %.1f GFLOP/s (%s %lld x %lld x %lld through %s)\n", peak,
                enum_name(t.precision).c_str(), n, n, n, rate.library.c_str());
  else
    std::printf("matrix-product rate: %.1f GFLOP/s (%s %lld x %lld x %lld through %s, %d threads)\n", peak,
                enum_name(t.precision).c_str(), n, n, n, rate.library.c_str(), threads);
  std::printf("MFU: %.3f\n", achieved / peak);
}

}  // namespace

int bench_train(const Args& args) {
  TrainBenchOptions o;
  if (!parse_train_bench_options(args, o)) return 0;
  const Config config = load_config(o.config_path, o.overrides);
  const TrainConfig& t = config.train;
  const int threads = configure_threads(t.threads);
  torch::Device device = torch_device(t.device);
  if (device.is_cuda()) require_cuda(config.source + ": train.device is cuda");
  // Data parallel (--nproc N or a launcher): each rank takes 1/N of the same global batch and
  // the gradients are summed across ranks after backward, as `extrap train` does.
  ProcessGroup* ranks = ProcessGroup::get(device);
  const int64_t world = ranks ? ranks->size() : 1;
  if (ranks) device = ranks->device();
  torch::manual_seed(uint64_t(t.seed));
  TransformerLM model = build_model(config, o.vocab);
  model->to(device);
  model->train();
  if (ranks) broadcast_parameters(*ranks, *model);
  const auto optimizer = make_training_optimizer(model, t);  // the trainer's (core/train/optimizer.h)
  const int64_t global = std::max<int64_t>(1, t.batch_tokens / t.seq_len / t.accumulation);
  if (global % world != 0)
    throw ConfigError(o.config_path + ": " + std::to_string(global) + " sequences a micro-batch do not split evenly over " +
                      std::to_string(world) + " ranks");
  const int64_t sequences = global / world;
  // train.cuda_graph, as the trainer takes it (core/train/graphed_step.h).
  std::string eager_reason;
  auto graphed = GraphedTrainingStep::for_config(model, *optimizer, t, device, ranks != nullptr, sequences,
                                                 config.source, &eager_reason);
  // A micro-batch of random tokens, on the host as the trainer's come, scored over the whole
  // micro-batch (all ranks').
  auto random_batch = [&] {
    const auto tokens = torch::randint(0, o.vocab, {sequences, t.seq_len + 1}, torch::kLong);
    return MicroBatch{tokens.narrow(1, 0, t.seq_len), tokens.narrow(1, 1, t.seq_len), global * t.seq_len};
  };
  auto graphed_step = [&] {
    std::vector<MicroBatch> batches;
    for (int64_t a = 0; a < t.accumulation; ++a) batches.push_back(random_batch());
    graphed->step(batches, t.lr);
    if (const std::string failure = graphed->failure_under_auto(config.source); !failure.empty()) {
      eager_reason = "the capture failed: " + failure;
      graphed.reset();
    }
  };
  auto eager_step = [&] {
    optimizer->zero_grad();
    std::vector<MicroBatch> batches;
    for (int64_t a = 0; a < t.accumulation; ++a) {
      batches.push_back(random_batch());
      batches.back().inputs = batches.back().inputs.to(device);
      batches.back().targets = batches.back().targets.to(device);
    }
    accumulate_gradients(model, batches, t.precision);
    if (ranks) all_reduce_gradients(*ranks, model->parameters(), "the gradient all-reduce");
    training_step(*optimizer, t, t.lr);
  };
  auto step = [&] { graphed ? graphed_step() : eager_step(); };
  const std::vector<double> seconds = time_steps(step, o.warmup, o.steps, device);
  const double median = seconds[seconds.size() / 2];
  const double tokens = double(global * t.accumulation * t.seq_len);  // all ranks together
  print_setup(config, model, global, threads, device);
  print_step_paths(config, device, *optimizer);
  std::printf("training step: %s\n", graphed ? "one CUDA graph, replayed (train.cuda_graph)"
                                              : ("eager (" + eager_reason + ")").c_str());
  if (ranks)
    std::printf("ranks: %lld data-parallel (%s, %lld sequences each), %d threads each\n", (long long)world,
                ranks->device().is_cuda() ? "nccl" : "gloo", (long long)sequences, threads);
  std::printf("step time: median %.4f s (min %.4f, max %.4f) over %lld steps\n", median, seconds.front(),
              seconds.back(), (long long)o.steps);
  std::printf("tokens/s: %.0f\npeak memory: %.1f MiB\n", tokens / median, peak_rss_bytes() / 1048576.0);
#ifdef EXTRAP_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    // Index 0 of the statistic arrays is the aggregate over all pools (StatType::AGGREGATE).
    std::printf("peak CUDA memory: %.1f MiB (allocated; the caching allocator's peak)\n",
                double(stats.allocated_bytes[0].peak) / 1048576.0);
  }
#endif
  print_model_flops(config, model, tokens, median, threads, device);
  if (o.profile > 0) bench::print_operator_profile(step, o.profile, 40);
  return 0;
}

}  // namespace extrap::cli
