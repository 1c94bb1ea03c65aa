#include "core/trainer.h"

#include "core/evaluator.h"
#include "core/sysinfo.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

namespace fs = std::filesystem;

namespace extrap {

double learning_rate(const TrainConfig& c, int64_t step) {
  if (c.warmup > 0 && step <= c.warmup) return c.lr * double(step) / double(c.warmup);
  if (c.schedule == "constant") return c.lr;
  if (c.schedule == "inverse_sqrt")
    return c.lr * std::sqrt(double(std::max<int64_t>(c.warmup, 1))) / std::sqrt(double(step));
  const double span = double(std::max<int64_t>(c.steps - c.warmup, 1));
  const double progress = std::min(1.0, double(step - c.warmup) / span);
  return c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + std::cos(M_PI * progress));
}

namespace {

std::vector<torch::optim::OptimizerParamGroup> parameter_groups(TransformerLM& model,
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

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buffer[32];
  const int s = int(seconds + 0.5);
  if (s >= 3600) std::snprintf(buffer, sizeof buffer, "%dh%02dm", s / 3600, s / 60 % 60);
  else std::snprintf(buffer, sizeof buffer, "%dm%02ds", s / 60, s % 60);
  return buffer;
}

// The keys whose change makes a checkpoint unusable for resumption.
YAML::Node identity(const Config& c) {
  YAML::Node n = c.to_yaml();
  n.remove("eval");
  n["train"].remove("steps");
  n["train"].remove("validate_every");
  n["train"].remove("checkpoint_every");
  n["train"].remove("log_every");
  n["train"].remove("out_dir");
  n["train"].remove("threads");
  n["data"].remove("cache_dir");
  return n;
}

void write_text_atomic(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error("cannot write " + tmp.string());
  }
  fs::rename(tmp, path);
}

}  // namespace

Trainer::Trainer(Config config, const Corpus& corpus)
    : config_(std::move(config)),
      corpus_(corpus),
      device_(config_.train.device == "cuda" ? torch::kCUDA : torch::kCPU) {
  if (device_.is_cuda() && !torch::cuda::is_available())
    throw ConfigError(config_.source + ": train.device is cuda but no CUDA device is available");
  configure_threads(config_.train.threads);
  torch::manual_seed(uint64_t(config_.train.seed));
  model_ = build_model(config_, corpus.vocab_size);
  model_->to(device_);
  optimizer_ = std::make_unique<torch::optim::AdamW>(parameter_groups(model_, config_.train));
}

torch::Tensor Trainer::next_batch(Cursor& cursor, int64_t sequences, torch::Tensor& targets) {
  const TrainConfig& c = config_.train;
  const TokenStream& train = corpus_.train;
  const int64_t blocks = (train.size() - 1) / c.seq_len;
  if (blocks < 1)
    throw ConfigError("the training split has " + std::to_string(train.size()) +
                      " tokens: too few for train.seq_len " + std::to_string(c.seq_len));
  auto inputs = torch::empty({sequences, c.seq_len}, torch::kLong);
  targets = torch::empty({sequences, c.seq_len}, torch::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto tg = targets.accessor<int64_t, 2>();
  const bool causal = config_.model.causal();
  for (int64_t s = 0; s < sequences; ++s) {
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

void Trainer::save_checkpoint(int64_t step, const Cursor& cursor, const TrainSummary& summary) {
  const fs::path dir = fs::path(config_.train.out_dir) / "checkpoint";
  const fs::path tmp = fs::path(config_.train.out_dir) / "checkpoint.tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  torch::save(model_, (tmp / "model.pt").string());
  torch::save(*optimizer_, (tmp / "optimizer.pt").string());
  torch::save(at::detail::getDefaultCPUGenerator().get_state(), (tmp / "rng.pt").string());
  YAML::Node state;
  state["step"] = step;
  state["epoch"] = cursor.epoch;
  state["index"] = cursor.index;
  state["tokens_per_second"] = summary.tokens_per_second;
  state["seconds"] = summary.seconds;
  for (const auto& p : summary.train_curve) {
    YAML::Node point;
    point.push_back(p.step);
    point.push_back(p.loss);
    state["train_curve"].push_back(point);
  }
  for (const auto& p : summary.valid_curve) {
    YAML::Node point;
    point.push_back(p.step);
    point.push_back(p.loss);
    state["valid_curve"].push_back(point);
  }
  write_text_atomic(tmp / "state.yaml", yaml_to_string(state) + "\n");
  write_text_atomic(tmp / "config.yaml", YAML::Dump(config_.to_yaml()) + "\n");
  // Swap in the new checkpoint: the old one stays whole until the new one is complete.
  const fs::path old = fs::path(config_.train.out_dir) / "checkpoint.old";
  fs::remove_all(old);
  if (fs::exists(dir)) fs::rename(dir, old);
  fs::rename(tmp, dir);
  fs::remove_all(old);
}

bool Trainer::load_checkpoint(int64_t& step, Cursor& cursor, TrainSummary& summary) {
  fs::path dir = fs::path(config_.train.out_dir) / "checkpoint";
  if (!fs::exists(dir / "state.yaml")) {
    // A crash between the two renames of save_checkpoint leaves only checkpoint.old.
    dir = fs::path(config_.train.out_dir) / "checkpoint.old";
    if (!fs::exists(dir / "state.yaml")) return false;
  }
  const Config saved = config_from_yaml(load_yaml_file((dir / "config.yaml").string()),
                                        (dir / "config.yaml").string());
  const std::string a = YAML::Dump(identity(saved)), b = YAML::Dump(identity(config_));
  if (a != b)
    throw ConfigError("cannot resume from " + dir.string() +
                      ": its config differs from this one.\n--- checkpoint ---\n" + a +
                      "\n--- now ---\n" + b);
  torch::load(model_, (dir / "model.pt").string());
  torch::load(*optimizer_, (dir / "optimizer.pt").string());
  torch::Tensor rng;
  torch::load(rng, (dir / "rng.pt").string());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  generator.set_state(rng);
  const YAML::Node state = load_yaml_file((dir / "state.yaml").string());
  step = state["step"].as<int64_t>();
  cursor.epoch = state["epoch"].as<int64_t>();
  cursor.index = state["index"].as<int64_t>();
  summary.tokens_per_second = state["tokens_per_second"].as<double>();
  summary.seconds = state["seconds"].as<double>();
  for (const auto& p : state["train_curve"]) summary.train_curve.push_back({p[0].as<int64_t>(), p[1].as<double>()});
  for (const auto& p : state["valid_curve"]) summary.valid_curve.push_back({p[0].as<int64_t>(), p[1].as<double>()});
  return true;
}

TrainSummary Trainer::run(bool resume) {
  const TrainConfig& c = config_.train;
  fs::create_directories(c.out_dir);
  TrainSummary summary;
  summary.num_parameters = model_->num_parameters();
  int64_t step = 0;
  Cursor cursor;
  if (resume && load_checkpoint(step, cursor, summary)) {
    summary.resumed_from = step;
    if (!quiet) std::cerr << "resuming " << c.out_dir << " from step " << step << "\n";
  }
  write_text_atomic(fs::path(c.out_dir) / "config.yaml", YAML::Dump(config_.to_yaml()) + "\n");

  const int64_t sequences_per_step = std::max<int64_t>(c.accumulation, c.batch_tokens / c.seq_len);
  const int64_t micro = sequences_per_step / c.accumulation;
  const bool terminal = stderr_is_terminal() && !quiet;
  model_->train();

  double trained_seconds = summary.seconds;  // training time only (validation excluded)
  const int64_t tokens_per_step = micro * c.accumulation * c.seq_len;
  const double tokens_before = summary.tokens_per_second * summary.seconds;
  int64_t tokens_done = 0;
  double loss_sum = 0;
  int64_t loss_count = 0;

  while (step < c.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    const double lr = learning_rate(c, step + 1);
    for (auto& group : optimizer_->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    optimizer_->zero_grad();
    double step_loss = 0;
    for (int64_t a = 0; a < c.accumulation; ++a) {
      torch::Tensor targets;
      auto inputs = next_batch(cursor, micro, targets).to(device_);
      targets = targets.to(device_);
      auto logits = model_->forward(inputs);  // (B, T, V)
      auto loss = torch::nn::functional::cross_entropy(
          logits.view({-1, logits.size(-1)}), targets.view({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
      (loss / double(c.accumulation)).backward();
      step_loss += loss.item<double>() / double(c.accumulation);
    }
    if (c.clip > 0) torch::nn::utils::clip_grad_norm_(model_->parameters(), c.clip);
    optimizer_->step();
    ++step;
    trained_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tokens_done += tokens_per_step;
    loss_sum += step_loss;
    ++loss_count;
    if (!std::isfinite(step_loss))
      throw std::runtime_error("training diverged at step " + std::to_string(step) +
                               " (loss " + std::to_string(step_loss) + "); lower train.lr");

    summary.tokens_per_second = (tokens_before + double(tokens_done)) / std::max(trained_seconds, 1e-9);
    const bool log_point = step % std::max<int64_t>(c.log_every, 1) == 0 || step == c.steps;
    if (log_point || terminal) {
      TrainProgress progress{step, c.steps, loss_sum / double(loss_count), lr,
                             summary.tokens_per_second,
                             double(c.steps - step) * double(tokens_per_step) / summary.tokens_per_second};
      if (log_point) {
        summary.train_curve.push_back({step, progress.loss});
        loss_sum = 0;
        loss_count = 0;
      }
      if (on_progress) {
        on_progress(progress);
      } else if (terminal) {
        std::fprintf(stderr, "\r\033[Kstep %lld/%lld  loss %.4f  lr %.2e  %.0f tok/s  ETA %s",
                     (long long)step, (long long)c.steps, progress.loss, lr,
                     progress.tokens_per_second, format_duration(progress.eta_seconds).c_str());
        if (step == c.steps) std::fputc('\n', stderr);
      } else if (!quiet && log_point) {
        std::fprintf(stderr, "step %lld/%lld loss %.4f lr %.3e tok/s %.0f eta %s\n", (long long)step,
                     (long long)c.steps, progress.loss, lr, progress.tokens_per_second,
                     format_duration(progress.eta_seconds).c_str());
      }
    }
    const bool validate_now =
        step == c.steps || (c.validate_every > 0 && step % c.validate_every == 0);
    if (validate_now) {
      const double valid = validate();
      summary.valid_curve.push_back({step, valid});
      if (!quiet) {
        if (terminal) std::fputs("\r\033[K", stderr);
        std::fprintf(stderr, "step %lld valid loss %.4f ppl %.2f", (long long)step, valid, std::exp(valid));
        for (const auto& [name, value] : model_->position().log_values())
          std::fprintf(stderr, "  %s=%.5f", name.c_str(), value);
        std::fputc('\n', stderr);
      }
      model_->train();
    }
    summary.seconds = trained_seconds;
    if (step == c.steps || (c.checkpoint_every > 0 && step % c.checkpoint_every == 0))
      save_checkpoint(step, cursor, summary);
    if (step == stop_after_step) break;
  }
  summary.steps = step;
  summary.seconds = trained_seconds;
  summary.peak_memory_bytes = peak_rss_bytes();
  return summary;
}

Config load_run_config(const std::string& run_dir) {
  const fs::path path = fs::path(run_dir) / "checkpoint" / "config.yaml";
  if (!fs::exists(path))
    throw ConfigError(run_dir + ": no checkpoint found (expected " + path.string() + ")");
  return config_from_yaml(load_yaml_file(path.string()), path.string());
}

LoadedRun load_run(const std::string& run_dir, int64_t vocab_size) {
  LoadedRun run;
  run.config = load_run_config(run_dir);
  const fs::path dir = fs::path(run_dir) / "checkpoint";
  run.model = build_model(run.config, vocab_size);
  torch::load(run.model, (dir / "model.pt").string());
  run.step = load_yaml_file((dir / "state.yaml").string())["step"].as<int64_t>();
  run.model->eval();
  return run;
}

}  // namespace extrap
