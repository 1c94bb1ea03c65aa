// `extrap bench train`: training throughput (tokens/s) and peak memory of one config's model,
// on random tokens of the config's shapes, after warm-up steps. benchmarks/train_pytorch.py
// runs the same model, shapes and thread count in eager PyTorch for comparison.
#include "core/config.h"
#include "core/distributed.h"
#include "core/model.h"
#include "core/sysinfo.h"
#include "core/trainer.h"
#include "experiments/commands.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace po = boost::program_options;

namespace extrap::cli {

int bench_train(const Args& args) {
  po::options_description options("extrap bench train");
  std::string config_path;
  std::vector<std::string> overrides;
  int64_t steps = 20, warmup = 3, vocab = 257;
  options.add_options()
      ("config,c", po::value(&config_path)->required(), "YAML config (model, position, train shapes)")
      ("set", po::value(&overrides)->composing(), "override a key (repeatable)")
      ("steps", po::value(&steps), "timed optimiser steps")
      ("warmup", po::value(&warmup), "untimed steps first")
      ("vocab", po::value(&vocab), "vocabulary size of the random tokens (257: byte level)");
  po::variables_map vm;
  if (!parse(args, "extrap bench train --config FILE [--steps N] [--set key=value ...]", options, vm)) return 0;
  const Config config = load_config(config_path, overrides);
  const TrainConfig& t = config.train;
  const int threads = configure_threads(t.threads);
  torch::Device device = torch_device(t.device);
  // Data parallel (--nproc N or a launcher): each rank takes 1/N of the same global batch and
  // the gradients are summed across ranks after backward, as `extrap train` does.
  ProcessGroup* ranks = ProcessGroup::get(device);
  const int64_t world = ranks ? ranks->size() : 1;
  if (ranks) device = ranks->device();
  torch::manual_seed(uint64_t(t.seed));
  TransformerLM model = build_model(config, vocab);
  model->to(device);
  model->train();
  if (ranks) broadcast_parameters(*ranks, *model);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(t.lr).weight_decay(t.weight_decay));
  const int64_t global = std::max<int64_t>(1, t.batch_tokens / t.seq_len / t.accumulation);
  if (global % world != 0)
    throw ConfigError(config_path + ": " + std::to_string(global) + " sequences a micro-batch do not split evenly over " +
                      std::to_string(world) + " ranks");
  const int64_t sequences = global / world;
  auto step = [&] {
    optimizer.zero_grad();
    for (int64_t a = 0; a < t.accumulation; ++a) {
      auto tokens = torch::randint(0, vocab, {sequences, t.seq_len + 1}, torch::kLong).to(device);
      auto logits = model->forward(tokens.narrow(1, 0, t.seq_len));
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}),
                                                       tokens.narrow(1, 1, t.seq_len).reshape({-1}));
      (loss / double(t.accumulation * world)).backward();
    }
    if (ranks) all_reduce_gradients(*ranks, model->parameters(), "the gradient all-reduce");
    if (t.clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), t.clip);
    optimizer.step();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  std::vector<double> seconds;
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    if (device.is_cuda()) torch::cuda::synchronize();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  const double tokens = double(global * t.accumulation * t.seq_len);  // all ranks together
  std::printf("machine: %s\ndate: %s\nruntime: %s\n", machine_description().c_str(), iso_time_now().c_str(),
              runtime_summary().c_str());
  std::printf("model: %lld parameters, %lld layers, d_model %lld, heads %lld, position %s, attention %s\n",
              (long long)model->num_parameters(), (long long)config.model.layers,
              (long long)config.model.d_model, (long long)config.model.heads,
              config.position_name.c_str(), enum_name(config.model.attention).c_str());
  std::printf("shape: %lld sequences x %lld tokens x %lld accumulation, %d threads, device %s\n",
              (long long)global, (long long)t.seq_len, (long long)t.accumulation, threads, enum_name(t.device).c_str());
  if (ranks)
    std::printf("ranks: %lld data-parallel (%s, %lld sequences each), %d threads each\n", (long long)world,
                ranks->device().is_cuda() ? "nccl" : "gloo", (long long)sequences, threads);
  std::printf("step time: median %.4f s (min %.4f, max %.4f) over %lld steps\n", median, seconds.front(),
              seconds.back(), (long long)steps);
  std::printf("tokens/s: %.0f\npeak memory: %.1f MiB\n", tokens / median, peak_rss_bytes() / 1048576.0);
  return 0;
}

}  // namespace extrap::cli
