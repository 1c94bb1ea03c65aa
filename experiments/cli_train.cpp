// `extrap train` and `extrap eval`.
#include "core/evaluator.h"
#include "core/files.h"
#include "core/sysinfo.h"
#include "core/trainer.h"
#include "experiments/commands.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <set>
#include <iostream>

namespace po = boost::program_options;

namespace extrap::cli {

namespace {

void print_eval_header() {
  std::printf("%-10s %-8s %10s %14s %12s %10s %8s\n", "length", "stride", "tokens", "nll_sum",
              "perplexity", "bpb", "seconds");
}

void print_eval_row(const EvalResult& r) {
  std::printf("%-10lld %-8lld %10lld %14.3f %12.4f %10.4f %8.2f\n", (long long)r.length,
              (long long)r.stride, (long long)r.scored_tokens, r.nll_sum, r.perplexity,
              r.bits_per_byte, r.seconds);
  std::fflush(stdout);
}

// Every (length, stride) of the config's eval section: non-overlapping (when asked), then
// each sliding stride shorter than the length. An evaluation that cannot give a right number
// prints its reason in place of the row; returns how many did. Each row (or failure) is also
// appended to `rows` when given, numbers at full precision.
int evaluate_all(TransformerLM& model, const Corpus& corpus, const Config& config,
                 torch::Device device, bool non_overlapping, nlohmann::json* rows = nullptr) {
  const TokenStream& stream = corpus.split(config.eval.split);
  const int64_t limit = config.eval.max_tokens > 0 ? std::min(config.eval.max_tokens, stream.size())
                                                   : stream.size();
  if (limit < stream.size())
    std::cout << "scoring the first " << limit << " of " << stream.size() << " tokens of the "
              << enum_name(config.eval.split) << " split (eval.max_tokens)\n";
  else
    std::cout << "scoring all " << limit << " tokens of the " << enum_name(config.eval.split)
              << " split\n";
  print_eval_header();
  int failures = 0;
  for (int64_t length : config.eval.lengths) {
    // A stride of L or more scores whole windows: the non-overlapping case.
    std::set<int64_t> strides;
    if (non_overlapping) strides.insert(0);
    for (int64_t s : config.eval.strides) strides.insert(s < length ? s : 0);
    for (int64_t stride : strides) {
      std::string failure;
      try {
        const EvalResult r = evaluate(model, corpus, stream, eval_spec_for(config, length, stride), device);
        print_eval_row(r);
        if (rows)
          rows->push_back({{"length", r.length}, {"stride", r.stride}, {"status", "ok"},
                           {"nll_sum", r.nll_sum}, {"scored_tokens", r.scored_tokens},
                           {"perplexity", r.perplexity},
                           {"bits_per_byte", std::isfinite(r.bits_per_byte) ? nlohmann::json(r.bits_per_byte) : nlohmann::json()},
                           {"windows", r.windows}, {"seconds", r.seconds}});
      } catch (const c10::Error& e) {
        failure = one_line(e.what_without_backtrace());
      } catch (const std::exception& e) {
        failure = e.what();
      }
      if (!failure.empty()) {
        ++failures;
        if (rows)
          rows->push_back({{"length", length}, {"stride", stride > 0 ? stride : length},
                           {"status", "failed"}, {"error", failure}});
        std::printf("%-10lld %-8lld failed: %s\n", (long long)length, (long long)stride, failure.c_str());
        std::fflush(stdout);
      }
    }
  }
  return failures;
}

}  // namespace

int train(const Args& args) {
  po::options_description options("extrap train");
  std::string config_path;
  std::vector<std::string> overrides, plugins;
  options.add_options()
      ("config,c", po::value(&config_path)->required(), "YAML config file")
      ("set", po::value(&overrides)->composing(), "override a key: --set train.steps=100 (repeatable)")
      ("plugin", po::value(&plugins)->composing(), "position-method plugin .so to load (repeatable)")
      ("resume", "continue from the run directory's checkpoint if there is one")
      ("overwrite", "replace the run directory's checkpoint (without this, a trained run is kept)")
      ("no-eval", "skip the evaluation at eval.lengths after training");
  po::variables_map vm;
  if (!parse(args, "extrap train --config FILE [--set key=value ...] [--resume]", options, vm)) return 0;

  for (const auto& p : plugins) PositionRegistry::instance().load_plugin(p);
  Config config = load_config(config_path, overrides);
  for (const auto& p : plugins) config.plugins.push_back(p);
  const int threads = configure_threads(config.train.threads);
  Corpus corpus = load_corpus(config.data);
  std::cerr << "corpus " << corpus.name << " (" << enum_name(corpus.tokenizer) << ", vocabulary "
            << corpus.vocab_size << "): train " << corpus.train.size() << " valid "
            << corpus.valid.size() << " test " << corpus.test.size() << " tokens\n";
  Trainer trainer(config, corpus);
  std::cerr << "model: " << trainer.model()->num_parameters() << " parameters, position "
            << config.position_name << ", " << threads << " threads -> " << config.train.out_dir << "\n";
  if (vm.count("resume") && vm.count("overwrite"))
    throw ConfigError("--resume and --overwrite contradict each other: choose one");
  const TrainSummary summary = trainer.run(vm.count("resume")      ? RunStart::resume
                                           : vm.count("overwrite") ? RunStart::overwrite
                                                                   : RunStart::fresh);
  std::cerr << "trained " << summary.steps << " steps at " << int64_t(summary.tokens_per_second)
            << " tokens/s, peak memory " << summary.peak_memory_bytes / (1 << 20) << " MiB\n";
  if (!vm.count("no-eval")) {
    std::cout << "evaluation on " << enum_name(config.eval.split) << " (trained at L = "
              << config.train.seq_len << "):\n";
    const int failures =
        evaluate_all(trainer.model(), corpus, config, torch_device(config.train.device), true);
    if (failures > 0) {
      std::cerr << "extrap train: " << failures << " evaluation(s) failed (reasons above)\n";
      return 1;
    }
  }
  return 0;
}

int eval(const Args& args) {
  po::options_description options("extrap eval");
  std::string run_dir, split = "valid", attention, json_path;
  std::vector<int64_t> lengths, strides;
  int64_t max_tokens = 0, batch_tokens = 0, threads = 0;
  options.add_options()
      ("checkpoint", po::value(&run_dir)->required(), "run directory written by extrap train")
      ("length,L", po::value(&lengths)->multitoken()->required(), "evaluation length(s)")
      ("stride,S", po::value(&strides)->multitoken(),
       "sliding-window stride(s), each at least 1 (a stride >= L is non-overlapping); omit for "
       "non-overlapping")
      ("split", po::value(&split), "valid | test | train")
      ("max-tokens", po::value(&max_tokens), "score the first N tokens only (default: the whole split)")
      ("batch-tokens", po::value(&batch_tokens), "tokens per forward pass")
      ("attention", po::value(&attention), "force an attention path: reference | efficient | auto")
      ("threads", po::value(&threads), "CPU threads (default: all cores)")
      ("json", po::value(&json_path),
       "also write the results to this JSON file (full precision; failures with their reason)");
  po::variables_map vm;
  if (!parse(args, "extrap eval --checkpoint DIR --length L [--stride S] [--split valid|test]", options, vm))
    return 0;
  const Split which = parse_enum<Split>(split, "--split");
  for (int64_t length : lengths)
    if (length < 1) throw ConfigError("--length " + std::to_string(length) + ": must be at least 1");
  for (int64_t stride : strides)
    if (stride < 1)
      throw ConfigError("--stride " + std::to_string(stride) +
                        ": must be at least 1 (omit --stride for non-overlapping windows)");
  if (vm.count("max-tokens") && max_tokens < 1)
    throw ConfigError("--max-tokens " + std::to_string(max_tokens) + ": must be at least 1");
  if (vm.count("batch-tokens") && batch_tokens < 1)
    throw ConfigError("--batch-tokens " + std::to_string(batch_tokens) + ": must be at least 1");
  if (threads < 0) throw ConfigError("--threads " + std::to_string(threads) + ": must not be negative");
  configure_threads(threads);
  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  Config config = checkpoint.config;
  Corpus corpus = load_corpus(config.data);
  LoadedRun run = load_run(checkpoint, corpus);
  if (!attention.empty())
    run.model->set_attention_backend(parse_enum<AttentionBackend>(attention, "--attention"));
  config.eval.lengths = lengths;
  config.eval.strides = strides;
  config.eval.split = which;
  config.eval.max_tokens = vm.count("max-tokens") ? max_tokens : 0;  // not the training config's
  if (batch_tokens > 0) config.eval.batch_tokens = batch_tokens;
  std::cout << "run " << run_dir << " (" << config.position_name << ", trained " << run.step
            << " steps at L = " << config.train.seq_len << "):\n";
  nlohmann::json rows = nlohmann::json::array();
  const int failures = evaluate_all(run.model, corpus, config, torch::kCPU, strides.empty(), &rows);
  if (!json_path.empty()) {
    const nlohmann::json document = {{"checkpoint", run_dir},
                                     {"position", config.position_name},
                                     {"step", run.step},
                                     {"split", enum_name(which)},
                                     {"max_tokens", config.eval.max_tokens},
                                     {"results", rows}};
    write_file_atomic(json_path, document.dump(1) + "\n");
  }
  if (failures > 0) {
    std::cerr << "extrap eval: " << failures << " evaluation(s) failed (reasons above)\n";
    return 1;
  }
  return 0;
}

}  // namespace extrap::cli
