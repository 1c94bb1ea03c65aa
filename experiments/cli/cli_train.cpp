// `extrap train` and `extrap eval`.
#include "core/base/files.h"
#include "core/base/hashing.h"
#include "core/eval/evaluator.h"
#include "core/runtime/sysinfo.h"
#include "core/train/trainer.h"
#include "experiments/cli/commands.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <iostream>
#include <optional>
#include <limits>

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace extrap::cli {

namespace {

std::ostream& null_stream() {
  static std::ostream discard(nullptr);  // no buffer: writes go nowhere
  return discard;
}

void print_eval_header(bool scaled) {
  std::printf("%-10s %-8s %10s %14s %12s %10s %8s%s\n", "length", "stride", "tokens", "nll_sum",
              "perplexity", "bpb", "seconds", scaled ? "  rope scaling" : "");
}

// The RoPE column, when any evaluation is scaled: "yarn s=4", or "none".
std::string rope_column(const RopeScaling& scaling) {
  if (!scaling.active()) return "  none";
  char text[64];
  std::snprintf(text, sizeof text, "  %s s=%g", rope_scaling_name(scaling.kind).c_str(),
                scaling.factor);
  return text;
}

// A number of the table, or `none` in its place (a perplexity past a double's range; bits per
// byte of a corpus that is not byte-level).
std::string cell(double value, int width, int decimals, const char* none) {
  char text[48];
  if (std::isfinite(value)) std::snprintf(text, sizeof text, "%*.*f", width, decimals, value);
  else std::snprintf(text, sizeof text, "%*s", width, none);
  return text;
}

void print_eval_row(const EvalResult& r, const std::string& rope) {
  std::printf("%-10lld %-8lld %10lld %14.3f %s %s %8.2f%s\n", (long long)r.length,
              (long long)r.stride, (long long)r.scored_tokens, r.nll_sum,
              cell(r.perplexity, 12, 4, "overflow").c_str(), cell(r.bits_per_byte, 10, 4, "-").c_str(),
              r.seconds, rope.c_str());
  if (!std::isfinite(r.perplexity))
    std::printf("%-10lld perplexity overflows a double: mean NLL %.1f nats a token > %.1f\n",
                (long long)r.length, r.nll_sum / double(r.scored_tokens),
                std::log(std::numeric_limits<double>::max()));
  std::fflush(stdout);
}

nlohmann::json bins_json(const std::vector<PositionBin>& bins) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& b : bins) out.push_back({b.begin, b.end, b.nll_sum, b.scored_tokens});
  return out;
}

// Every (length, stride) of the config's eval section: non-overlapping (when asked), then
// each sliding stride shorter than the length, each under every RoPE variant asked for (factor
// `rope_factor`, or 0: the length over train.seq_len), under StreamingLLM where `streaming` is
// active. An evaluation that cannot give a right number prints its reason in place of the row;
// returns how many did. Each row (or failure) is also appended to `rows` when given, numbers at
// full precision, with the loss by position.
int evaluate_all(TransformerLM& model, const Corpus& corpus, const Config& config,
                 torch::Device device, bool non_overlapping, nlohmann::json* rows = nullptr,
                 const std::vector<RopeScalingKind>& variants = {RopeScalingKind::none},
                 double rope_factor = 0, const char* limit_source = "eval.max_tokens",
                 const StreamingCache& streaming = {}) {
  const TokenStream& stream = corpus.split(config.eval.split);
  const int64_t limit = config.eval.max_tokens > 0 ? std::min(config.eval.max_tokens, stream.size())
                                                   : stream.size();
  if (limit < stream.size())
    std::cout << "scoring the first " << limit << " of " << stream.size() << " tokens of the "
              << enum_name(config.eval.split) << " split (" << limit_source << ")\n";
  else
    std::cout << "scoring all " << limit << " tokens of the " << enum_name(config.eval.split)
              << " split\n";
  const bool scaled = variants != std::vector<RopeScalingKind>{RopeScalingKind::none};
  if (streaming.active())
    std::cout << "StreamingLLM: each window one stream through a cache of " << streaming.cache
              << " tokens, the first " << streaming.sinks << " of them sinks, positions cache slots\n";
  // The StreamingLLM cache of a row, where there is one.
  const auto with_streaming = [&](nlohmann::json row) {
    if (streaming.active()) row["streaming"] = {{"sinks", streaming.sinks}, {"cache", streaming.cache}};
    return row;
  };
  print_eval_header(scaled);
  if (!corpus.counts_bytes())
    std::cout << "(bpb: bits per byte need the bytes of text behind each token: byte-level corpora "
                 "have them, and ids with data.token_bytes; "
              << enum_name(corpus.tokenizer) << " tokens here do not say how many bytes they cover)\n";
  int failures = 0;
  for (int64_t length : config.eval.lengths) {
    // A stride of L or more scores whole windows: the non-overlapping case.
    std::set<int64_t> strides;
    if (non_overlapping) strides.insert(0);
    for (int64_t s : config.eval.strides) {
      // Windows further apart than they are long would leave tokens unscored: such a stride
      // scores non-overlapping windows, and says so.
      if (s > length)
        std::printf("%-10lld stride %lld is longer than the length: scored non-overlapping\n",
                    (long long)length, (long long)s);
      strides.insert(s < length ? s : 0);
    }
    for (int64_t stride : strides) for (RopeScalingKind kind : variants) {
      EvalSpec spec = eval_spec_for(config, length, stride);
      spec.max_tokens_source = limit_source;
      spec.streaming = streaming;
      const std::string variant = rope_variant_label(kind, rope_factor);
      StatusLine progress(ProcessGroup::leader());
      spec.on_progress = progress_display(
          progress, "length " + std::to_string(length) +
                        (stride > 0 ? ", stride " + std::to_string(stride) : std::string()) +
                        (variant.empty() ? std::string() : ", " + variant),
          "windows");
      const std::string failure = failure_of([&] {
        spec.rope_scaling = rope_scaling_for(kind, rope_factor, config.train.seq_len, length);
        const EvalResult r = evaluate(model, corpus, stream, spec, device);
        progress.clear();
        print_eval_row(r, scaled ? rope_column(spec.rope_scaling) : "");
        if (rows)
          rows->push_back(with_streaming({{"length", r.length}, {"stride", r.stride}, {"status", "ok"},
                           {"rope_scaling", variant.empty() ? "none" : variant},
                           {"rope_factor", kind == RopeScalingKind::none
                                               ? nlohmann::json()  // no scaling: no factor
                                               : nlohmann::json(spec.rope_scaling.factor)},
                           {"nll_sum", r.nll_sum}, {"scored_tokens", r.scored_tokens},
                           {"mean_nll", r.nll_sum / double(r.scored_tokens)},
                           // null when exp(mean NLL) is past a double's range
                           {"perplexity", std::isfinite(r.perplexity) ? nlohmann::json(r.perplexity)
                                                                      : nlohmann::json()},
                           {"bits_per_byte", std::isfinite(r.bits_per_byte) ? nlohmann::json(r.bits_per_byte) : nlohmann::json()},
                           {"scored_bytes", r.scored_bytes},
                           {"windows", r.windows}, {"seconds", r.seconds},
                           {"by_position", bins_json(r.by_position)}}));
      });
      if (!failure.empty()) {
        progress.clear();
        ++failures;
        if (rows)
          rows->push_back(with_streaming({{"length", length}, {"stride", stride > 0 ? stride : length},
                                          {"rope_scaling", variant.empty() ? "none" : variant},
                                          {"status", "failed"}, {"error", failure}}));
        std::printf("%-10lld %-8lld failed: %s%s\n", (long long)length, (long long)(stride > 0 ? stride : length),
                    failure.c_str(), scaled ? (" (" + rope_scaling_name(kind) + ")").c_str() : "");
        std::fflush(stdout);
      }
    }
  }
  return failures;
}

// What `train --json` writes before the evaluation: the run and how its training went.
nlohmann::json summary_json(const Config& config, const TrainSummary& summary) {
  return {{"run", config.train.out_dir},
          {"position", position_label(config)},
          {"parameters", summary.num_parameters},
          {"steps", summary.steps},
          {"resumed_from", summary.resumed_from},
          {"tokens", summary.steps * tokens_per_step(config.train)},
          {"tokens_per_second", summary.tokens_per_second},
          {"seconds", summary.seconds},
          {"peak_memory_bytes", summary.peak_memory_bytes},
          {"train_curve", curve_json(summary.train_curve)},
          {"valid_curve", curve_json(summary.valid_curve)},
          {"metrics", (fs::path(config.train.out_dir) / "metrics.jsonl").string()},
          {"evaluation", nullptr}};
}

}  // namespace

int train(const Args& args) {
  po::options_description options("extrap train");
  std::string config_path;
  std::vector<std::string> overrides, plugins;
  std::string json_path;
  options.add_options()
      ("config,c", po::value(&config_path)->required(), "YAML config file")
      ("set", po::value(&overrides)->composing(), "override a key: --set train.steps=100 (repeatable)")
      ("plugin", po::value(&plugins)->composing(), "position-method plugin .so to load (repeatable)")
      ("resume", "continue from the run directory's checkpoint if there is one")
      ("overwrite", "replace the run directory's checkpoint (without this, a trained run is kept)")
      ("no-eval", "skip the evaluation at eval.lengths after training")
      ("json", po::value(&json_path),
       "also write the run's summary and evaluation to this JSON file (full precision)");
  po::variables_map vm;
  if (!parse(args, "extrap train --config FILE [--set key=value ...] [--resume | --overwrite] [--json FILE]\n"
               "       [--nproc N: N local data-parallel ranks]", options, vm)) return 0;
  check_json_path(json_path, "train");

  for (const auto& p : plugins) PositionRegistry::instance().load_plugin(p);
  Config config = load_config(config_path, overrides);
  for (const auto& p : plugins) config.plugins.push_back(p);
  check_position_method(config);  // before the corpus is read
  const int threads = configure_threads(config.train.threads);
  Corpus corpus = load_corpus(config.data);
  // Data parallel: rank 0 speaks for all (the others print only their errors).
  std::ostream& info = ProcessGroup::leader() ? std::cerr : null_stream();
  info << "corpus " << corpus.name << " (" << enum_name(corpus.tokenizer) << ", vocabulary "
            << corpus.vocab_size << "): train " << corpus.train.size() << " valid "
            << corpus.valid.size() << " test " << corpus.test.size() << " tokens\n";
  Trainer trainer(config, corpus);
  info << "model: " << trainer.model()->num_parameters() << " parameters, position "
            << position_label(config) << ", " << threads << " threads -> " << config.train.out_dir << "\n";
  if (vm.count("resume") && vm.count("overwrite"))
    throw ConfigError("--resume and --overwrite contradict each other: choose one");
  const TrainSummary summary = trainer.run(vm.count("resume")      ? RunStart::resume
                                           : vm.count("overwrite") ? RunStart::overwrite
                                                                   : RunStart::fresh);
  info << "trained " << summary.steps << " steps at " << int64_t(summary.tokens_per_second)
            << " tokens/s, peak memory " << summary.peak_memory_bytes / (1 << 20) << " MiB\n";
  nlohmann::json document = summary_json(config, summary);
  document["written_by"] = json_written_by("train");
  int failures = 0;
  if (!vm.count("no-eval")) {
    std::cout << "evaluation on " << enum_name(config.eval.split) << " (trained at L = "
              << config.train.seq_len << "):\n";
    nlohmann::json rows = nlohmann::json::array();
    failures = evaluate_all(trainer.model(), corpus, config, torch_device(config.train.device),
                            true, &rows);
    nlohmann::json evaluation = {{"checkpoint", config.train.out_dir},
                                 {"position", position_label(config)},
                                 {"step", summary.steps},
                                 {"split", enum_name(config.eval.split)},
                                 {"max_tokens", config.eval.max_tokens},
                                 {"results", rows}};
    if (ProcessGroup::leader())
      write_file_atomic(fs::path(config.train.out_dir) / "eval.json", evaluation.dump(1) + "\n");
    document["evaluation"] = std::move(evaluation);
  }
  if (!json_path.empty() && ProcessGroup::leader())
    write_file_atomic(json_path, document.dump(1) + "\n");
  if (failures > 0) {
    if (ProcessGroup::leader())
      std::cerr << "extrap train: " << failures << " evaluation(s) failed (reasons above)\n";
    return 1;
  }
  return 0;
}

namespace {

// What `extrap eval` was asked for, as given on the command line.
struct EvalOptions {
  std::string run_dir, split = "valid", attention, json_path, device;
  std::vector<int64_t> lengths, strides;
  std::vector<std::string> rope_names;
  double rope_factor = 0;
  int64_t max_tokens = 0, batch_tokens = 0, threads = 0;
  std::string retrieval;
  RetrievalSpec retrieval_spec;
  bool longppl = false;
  int64_t longppl_short = 0;
  std::string longppl_reference;
  StreamingCache streaming{4, 0};  // --sinks, --streaming
  po::variables_map vm;  // which options were given
};

// Parsing `extrap eval`'s options into `opt`; false after printing help.
bool parse_eval_options(const Args& args, EvalOptions& opt) {
  po::options_description options("extrap eval");
  options.add_options()
      ("checkpoint", po::value(&opt.run_dir)->required(), "run directory written by extrap train")
      ("length,L", po::value(&opt.lengths)->multitoken()->required(), "evaluation length(s)")
      ("stride,S", po::value(&opt.strides)->multitoken(),
       "sliding-window stride(s), each at least 1; at a length it is not below, the windows do "
       "not overlap (a line says so: a stride past every length asks for non-overlapping "
       "windows beside the sliding ones); omit for non-overlapping only")
      ("split", po::value(&opt.split), "valid | test | train")
      ("max-tokens", po::value(&opt.max_tokens), "score the first N tokens only (default: the whole split)")
      ("batch-tokens", po::value(&opt.batch_tokens), "tokens per forward pass")
      ("attention", po::value(&opt.attention), "force an attention path: reference | efficient | auto")
      ("threads", po::value(&opt.threads), "CPU threads (default: all cores)")
      ("device", po::value(&opt.device), "cpu | cuda (default: the device the run trained on)")
      ("rope-scaling", po::value(&opt.rope_names)->multitoken(),
       "RoPE scaling variant(s) for a rotary or xpos model: none linear ntk dynamic yarn yarn_paper llama3 self_extend "
       "(each evaluated in turn)")
      ("rope-factor", po::value(&opt.rope_factor),
       "RoPE scaling factor s >= 1 (default: each length / the training length; dynamic: 1)")
      ("retrieval", po::value(&opt.retrieval),
       "score a retrieval task instead of perplexity: passkey | multikey | variable_tracking (exact match by "
       "length and depth; core/eval/retrieval_eval.h)")
      ("depths", po::value(&opt.retrieval_spec.depths)->multitoken(),
       "retrieval: key depths in percent (default 0 25 50 75 100)")
      ("samples", po::value(&opt.retrieval_spec.samples), "retrieval: instances per depth (default 20)")
      ("seed", po::value(&opt.retrieval_spec.seed), "retrieval: instance seed (default 1)")
      ("longppl", po::bool_switch(&opt.longppl),
       "score LongPPL beside perplexity: the NLL over the key tokens only, those the long context "
       "helps (core/eval/longppl.h)")
      ("longppl-short", po::value(&opt.longppl_short),
       "LongPPL: the short context K (default: the key-token model's training length)")
      ("longppl-reference", po::value(&opt.longppl_reference),
       "LongPPL: the run whose model selects the key tokens (default: each model itself)")
      ("streaming", po::value(&opt.streaming.cache),
       "StreamingLLM: read each window as a stream through a KV cache of this many tokens, "
       "--sinks of them the stream's first, at cache slots (core/model/model.h)")
      ("sinks", po::value(&opt.streaming.sinks), "StreamingLLM: attention sinks kept in the cache (default 4)")
      ("json", po::value(&opt.json_path),
       "also write the results to this JSON file (full precision; failures with their reason)");
  return parse(args, "extrap eval --checkpoint DIR --length L [--stride S] [--split valid|test] "
               "[--rope-scaling yarn --rope-factor 4] [--streaming W [--sinks 4]]\n"
               "       [--nproc N: N local data-parallel ranks]", options, opt.vm);
}

// Checking the options against each other before anything is loaded (sets the retrieval task).
void check_eval_options(EvalOptions& opt) {
  const po::variables_map& vm = opt.vm;
  if (opt.retrieval.empty()) {
    for (const char* name : {"depths", "samples", "seed"})
      if (vm.count(name))
        throw ConfigError(std::string("--") + name + " is a retrieval option: add --retrieval TASK");
  } else {
    opt.retrieval_spec.task = parse_enum<RetrievalTask>(opt.retrieval, "--retrieval");
    if (opt.retrieval_spec.task == RetrievalTask::none)
      throw ConfigError("--retrieval none: name a task (passkey, multikey, variable_tracking)");
    for (const char* name : {"stride", "split", "max-tokens"})
      if (vm.count(name))
        throw ConfigError(std::string("--") + name +
                          " has no meaning with --retrieval (instances are generated, whole)");
    if (opt.rope_names.size() > 1)
      throw ConfigError("--retrieval takes one --rope-scaling variant at a time");
    check_retrieval_spec(opt.retrieval_spec);
  }
  if (!opt.longppl) {
    for (const char* name : {"longppl-short", "longppl-reference"})
      if (vm.count(name))
        throw ConfigError(std::string("--") + name + " is a LongPPL option: add --longppl");
  } else {
    if (!opt.retrieval.empty()) throw ConfigError("--longppl and --retrieval: one at a time");
    for (const char* name : {"stride", "rope-scaling"})
      if (vm.count(name))
        throw ConfigError(std::string("--") + name +
                          " is not taken with --longppl (LongPPL reads non-overlapping windows of "
                          "the trained model)");
    if (vm.count("longppl-short") && opt.longppl_short < 1)
      throw ConfigError("--longppl-short " + std::to_string(opt.longppl_short) +
                        ": must be at least 1");
  }
  if (vm.count("sinks") && !vm.count("streaming"))
    throw ConfigError("--sinks is a StreamingLLM option: add --streaming W");
  if (vm.count("streaming")) {
    if (opt.streaming.cache < 1)
      throw ConfigError("--streaming " + std::to_string(opt.streaming.cache) + ": the cache must hold at least 1 token");
    if (opt.streaming.sinks < 0 || opt.streaming.sinks >= opt.streaming.cache)
      throw ConfigError("--sinks " + std::to_string(opt.streaming.sinks) + ": must be at least 0 and fewer than "
                        "the cache (--streaming " + std::to_string(opt.streaming.cache) + ")");
    if (!opt.retrieval.empty() || opt.longppl)
      throw ConfigError("--streaming scores perplexity: not with --retrieval or --longppl");
    for (const char* name : {"stride", "rope-scaling"})
      if (vm.count(name))
        throw ConfigError(std::string("--") + name +
                          " is not taken with --streaming (each window is one stream, its positions "
                          "cache slots below the cache size)");
  }
  check_eval_lengths(opt.lengths, {}, opt.strides,
                     [](EvalLengthList list, int64_t value, EvalLengthProblem problem) {
                       const bool stride = list == EvalLengthList::strides;
                       std::string text = (stride ? "--stride " : "--length ") + std::to_string(value);
                       if (problem == EvalLengthProblem::listed_twice)
                         throw ConfigError(text + ": is listed twice");
                       throw ConfigError(text + ": must be at least 1" +
                                         (stride ? " (omit --stride for non-overlapping windows)" : ""));
                     });
  if (vm.count("max-tokens") && opt.max_tokens < 1)
    throw ConfigError("--max-tokens " + std::to_string(opt.max_tokens) + ": must be at least 1");
  if (vm.count("batch-tokens") && opt.batch_tokens < 1)
    throw ConfigError("--batch-tokens " + std::to_string(opt.batch_tokens) + ": must be at least 1");
  if (opt.threads < 0) throw ConfigError("--threads " + std::to_string(opt.threads) + ": must not be negative");
  if (vm.count("rope-factor") && !(std::isfinite(opt.rope_factor) && opt.rope_factor >= 1.0))
    throw ConfigError("--rope-factor " + number_text(opt.rope_factor) + ": must be a finite number of at least 1");
  if (vm.count("rope-factor") && opt.rope_names.empty())
    throw ConfigError("--rope-factor without --rope-scaling: name the variant (e.g. --rope-scaling yarn)");
}

// The --rope-scaling variants, each once, in the order given; none when none was named.
std::vector<RopeScalingKind> rope_variants(const std::vector<std::string>& rope_names) {
  std::vector<RopeScalingKind> variants = parse_rope_variants(rope_names, "--rope-scaling");
  if (variants.empty()) variants.push_back(RopeScalingKind::none);
  return variants;
}

// Applying the options to the loaded run: its attention path and the command line's eval section.
void apply_eval_options(const EvalOptions& opt, Split which, const std::vector<RopeScalingKind>& variants,
                        Config& config, LoadedRun& run) {
  const bool scaled = variants != std::vector<RopeScalingKind>{RopeScalingKind::none};
  if (scaled && !has_rotary_angles(config))
    throw ConfigError("--rope-scaling: run " + opt.run_dir + " uses position method '" +
                      position_label(config) + "', which has no rotary angles to scale (rotary and "
                      "xpos have)");
  // What only a causal model has (one of them at a time), refused before anything is evaluated.
  if (!config.model.causal()) {
    const auto refuse = [&](const std::string& flag, const std::string& why) {
      throw ConfigError(flag + ": run " + opt.run_dir + " is a masked LM; " + why);
    };
    if (opt.streaming.active()) refuse("--streaming", "StreamingLLM reads a causal model's stream through its cache");
    if (!opt.retrieval.empty()) refuse("--retrieval", "retrieval scores a causal model's greedy answer");
    if (opt.longppl) refuse("--longppl", "LongPPL scores a causal model's next-token predictions");
  }
  if (!opt.attention.empty())
    run.model->set_attention_backend(parse_enum<AttentionBackend>(opt.attention, "--attention"));
  config.eval.lengths = opt.lengths;
  config.eval.strides = opt.strides;
  config.eval.split = which;
  config.eval.max_tokens = opt.vm.count("max-tokens") ? opt.max_tokens : 0;  // not the training config's
  if (opt.batch_tokens > 0) config.eval.batch_tokens = opt.batch_tokens;
}

// Writing the results (--json, rank 0) and the exit code: 1 when any evaluation failed.
int write_eval_results(const EvalOptions& opt, nlohmann::json& document, const nlohmann::json& rows,
                       int failures) {
  if (!opt.json_path.empty() && ProcessGroup::leader()) {
    document["results"] = rows;
    write_file_atomic(opt.json_path, document.dump(1) + "\n");
  }
  if (failures > 0 && ProcessGroup::leader()) {
    std::cerr << "extrap eval: " << failures << (opt.retrieval.empty() ? "" : " retrieval")
              << " evaluation(s) failed (reasons above)\n";
    return 1;
  }
  return 0;
}

// `extrap eval --longppl`: the key-token model (--longppl-reference, on the same data, or the
// run itself), then LongPPL at each length.
int evaluate_longppl(const EvalOptions& opt, LoadedRun& run, const Corpus& corpus,
                     const Config& config, torch::Device device, nlohmann::json& rows,
                     nlohmann::json& document) {
  LongPplSpec spec;
  spec.short_length = opt.longppl_short > 0 ? opt.longppl_short : config.train.seq_len;
  std::optional<LoadedRun> reference;
  if (!opt.longppl_reference.empty()) {
    reference = load_key_token_model(opt.longppl_reference, corpus, device,
                                     "--longppl-reference " + opt.longppl_reference);
    if (opt.longppl_short <= 0) spec.short_length = reference->config.train.seq_len;
  }
  document["longppl_reference"] = opt.longppl_reference.empty() ? opt.run_dir : opt.longppl_reference;
  document["longppl_short"] = spec.short_length;
  document["split"] = enum_name(config.eval.split);
  document["max_tokens"] = config.eval.max_tokens;
  return evaluate_longppl_all(run.model, reference ? &reference->model : nullptr, corpus, config,
                              spec, &rows, device);
}

}  // namespace

int eval(const Args& args) {
  EvalOptions opt;
  if (!parse_eval_options(args, opt)) return 0;
  const Split which = parse_enum<Split>(opt.split, "--split");
  check_eval_options(opt);
  check_json_path(opt.json_path, "eval");
  const std::vector<RopeScalingKind> variants = rope_variants(opt.rope_names);
  configure_threads(opt.threads);
  const VerifiedCheckpoint checkpoint = require_checkpoint(opt.run_dir);
  Config config = checkpoint.config;
  Corpus corpus = load_corpus(config.data);
  LoadedRun run = load_run(checkpoint, corpus);
  apply_eval_options(opt, which, variants, config, run);
  // The device the run trained on unless --device names another; the checkpoint loads on the CPU.
  const torch::Device device = command_device(opt.device, config.train.device, opt.run_dir, "evaluate");
  // Data parallel: every rank scores its share of the windows with its own copy of the run, so
  // the copies must be one (a stale copy on one node's disk would mix two models' numbers).
  if (ProcessGroup* ranks = ProcessGroup::get(device)) {
    YAML::Node identity;
    identity["checkpoint"]["step"] = run.step;
    identity["checkpoint"]["fingerprint"] = checkpoint.manifest.fingerprint;
    identity["checkpoint"]["model.pt"] = hex64(content_hash(*checkpoint.model_bytes));
    identity["corpus"] = corpus.identity();
    ranks->check_same("checkpoint or data", YAML::Dump(identity));
  }
  run.model->to(device);
  std::cout << "run " << opt.run_dir << " (" << position_label(config) << ", trained " << run.step
            << " steps at L = " << config.train.seq_len << "):\n";
  nlohmann::json rows = nlohmann::json::array();
  nlohmann::json document = {{"written_by", json_written_by("eval")},
                              {"checkpoint", opt.run_dir},
                              {"position", position_label(config)},
                              {"step", run.step}};
  const double given_factor = opt.vm.count("rope-factor") ? opt.rope_factor : 0.0;
  int failures = 0;
  if (!opt.retrieval.empty()) {
    RetrievalSpec& retrieval_spec = opt.retrieval_spec;
    retrieval_spec.batch_tokens = config.eval.batch_tokens;
    std::cout << "retrieval task " << opt.retrieval << ": " << retrieval_spec.samples
              << " instances per depth, seed " << retrieval_spec.seed << "\n";
    failures = evaluate_retrieval_all(run.model, corpus, retrieval_spec, opt.lengths,
                                      config.train.seq_len, variants.front(), given_factor, &rows,
                                      device);
    document["retrieval"] = opt.retrieval;
    document["samples"] = retrieval_spec.samples;
    document["seed"] = retrieval_spec.seed;
    document["rope_scaling"] = variants.front() == RopeScalingKind::none
                                   ? std::string("none")
                                   : rope_variant_label(variants.front(), given_factor);
  } else if (opt.longppl) {
    failures = evaluate_longppl(opt, run, corpus, config, device, rows, document);
  } else {
    failures = evaluate_all(run.model, corpus, config, device, opt.strides.empty(), &rows,
                            variants, given_factor, "--max-tokens", opt.streaming);
    if (opt.streaming.active())
      document["streaming"] = {{"sinks", opt.streaming.sinks}, {"cache", opt.streaming.cache}};
    document["split"] = enum_name(which);
    document["max_tokens"] = config.eval.max_tokens;
  }
  return write_eval_results(opt, document, rows, failures);
}

}  // namespace extrap::cli
