// `extrap train` and `extrap eval`.
#include "core/evaluator.h"
#include "core/sysinfo.h"
#include "core/trainer.h"
#include "experiments/commands.h"

#include <cstdio>
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
// each sliding stride shorter than the length.
void evaluate_all(TransformerLM& model, const Corpus& corpus, const Config& config,
                  torch::Device device, bool non_overlapping) {
  const TokenStream& stream = corpus.split(config.eval.split);
  print_eval_header();
  for (int64_t length : config.eval.lengths) {
    std::vector<int64_t> strides;
    if (non_overlapping) strides.push_back(0);
    for (int64_t s : config.eval.strides)
      if (s < length) strides.push_back(s);
    for (int64_t stride : strides) {
      try {
        print_eval_row(evaluate(model, corpus, stream, eval_spec_for(config, length, stride), device));
      } catch (const c10::Error& e) {
        std::printf("%-10lld %-8lld cannot evaluate: %s\n", (long long)length, (long long)stride,
                    e.what_without_backtrace());
      }
    }
  }
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
      ("no-eval", "skip the evaluation at eval.lengths after training");
  po::variables_map vm;
  if (!parse(args, "extrap train --config FILE [--set key=value ...] [--resume]", options, vm)) return 0;

  for (const auto& p : plugins) PositionRegistry::instance().load_plugin(p);
  Config config = load_config(config_path, overrides);
  for (const auto& p : plugins) config.plugins.push_back(p);
  const int threads = configure_threads(config.train.threads);
  Corpus corpus = load_corpus(config.data);
  std::cerr << "corpus " << corpus.name << " (" << corpus.tokenizer << ", vocabulary "
            << corpus.vocab_size << "): train " << corpus.train.size() << " valid "
            << corpus.valid.size() << " test " << corpus.test.size() << " tokens\n";
  Trainer trainer(config, corpus);
  std::cerr << "model: " << trainer.model()->num_parameters() << " parameters, position "
            << config.position_name << ", " << threads << " threads -> " << config.train.out_dir << "\n";
  const TrainSummary summary = trainer.run(vm.count("resume") > 0);
  std::cerr << "trained " << summary.steps << " steps at " << int64_t(summary.tokens_per_second)
            << " tokens/s, peak memory " << summary.peak_memory_bytes / (1 << 20) << " MiB\n";
  if (!vm.count("no-eval")) {
    std::cout << "evaluation on " << config.eval.split << " (trained at L = " << config.train.seq_len << "):\n";
    evaluate_all(trainer.model(), corpus, config,
                 config.train.device == "cuda" ? torch::kCUDA : torch::kCPU, true);
  }
  return 0;
}

int eval(const Args& args) {
  po::options_description options("extrap eval");
  std::string run_dir, split = "valid", attention;
  std::vector<int64_t> lengths, strides;
  int64_t max_tokens = 0, batch_tokens = 0, threads = 0;
  options.add_options()
      ("checkpoint", po::value(&run_dir)->required(), "run directory written by extrap train")
      ("length,L", po::value(&lengths)->multitoken()->required(), "evaluation length(s)")
      ("stride,S", po::value(&strides)->multitoken(), "sliding-window stride(s); omit for non-overlapping")
      ("split", po::value(&split), "valid | test")
      ("max-tokens", po::value(&max_tokens), "evaluate on the first N tokens only")
      ("batch-tokens", po::value(&batch_tokens), "tokens per forward pass")
      ("attention", po::value(&attention), "force an attention path: reference | efficient | auto")
      ("threads", po::value(&threads), "CPU threads (default: all cores)");
  po::variables_map vm;
  if (!parse(args, "extrap eval --checkpoint DIR --length L [--stride S] [--split valid|test]", options, vm))
    return 0;
  if (split != "valid" && split != "test")
    throw ConfigError("--split must be valid or test, got '" + split + "'");
  configure_threads(threads);
  Config config = load_run_config(run_dir);
  Corpus corpus = load_corpus(config.data);
  LoadedRun run = load_run(run_dir, corpus.vocab_size);
  if (!attention.empty()) run.model->set_attention_backend(parse_attention_backend(attention));
  config.eval.lengths = lengths;
  config.eval.strides = strides;
  config.eval.split = split;
  if (vm.count("max-tokens")) config.eval.max_tokens = max_tokens;
  if (batch_tokens > 0) config.eval.batch_tokens = batch_tokens;
  std::cout << "run " << run_dir << " (" << config.position_name << ", trained " << run.step
            << " steps at L = " << config.train.seq_len << "), split " << split << ":\n";
  evaluate_all(run.model, corpus, config, torch::kCPU, strides.empty());
  return 0;
}

}  // namespace extrap::cli
