#include "experiments/sweep/point_runner.h"

#include "core/base/hashing.h"
#include "core/base/yaml_options.h"
#include "core/eval/attention_profile.h"
#include "core/eval/evaluator.h"
#include "core/eval/longppl.h"
#include "core/eval/retrieval_eval.h"
#include "core/hub/hf_checkpoint.h"
#include "core/run/checkpoint.h"
#include "core/run/import_run.h"
#include "core/runtime/failure.h"
#include "core/runtime/sysinfo.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

namespace extrap {

namespace {

// Resets the kernel's peak-RSS mark (VmHWM), so that each run's peak is its own.
void reset_peak_memory() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

}  // namespace

RunRecord new_run_record(const SweepPoint& point) {
  RunRecord r;
  r.run_id = point.id;
  r.config = YAML::Dump(point.config.to_yaml());
  r.grid_point = point.grid_yaml();
  r.point_index = point.index;
  r.position = position_label(point.config);
  r.train_length = point.config.train.seq_len;
  r.seed = point.config.train.seed;
  r.machine = machine_description();
  RuntimeInfo runtime = runtime_info();
  const int64_t threads = point.config.train.threads;
  runtime.threads = threads > 0 ? int(threads) : available_cores();  // what the trainer sets
  r.runtime = runtime_summary(runtime);
  r.start_time = iso_time_now();
  r.status = "training";
  return r;
}

PointRecord new_point_record(const RunRecord& run, const EvalPoint& e) {
  PointRecord p;
  p.run_id = run.run_id;
  p.position = run.position;
  p.train_length = run.train_length;
  p.seed = run.seed;
  p.mode = e.mode;
  p.stride = e.stride > 0 ? e.stride : e.length;
  p.eval_length = e.length;
  return p;
}

TrainedPoint train_point(const SweepPoint& point, const Corpus& corpus, RunRecord& record,
                         SweepDisplay& display, bool quiet) {
  const Config& config = point.config;
  TrainedPoint out;
  try {
    reset_peak_memory();
    out.trainer = std::make_unique<Trainer>(config, corpus);
  } catch (const DistributedError&) {
    throw;  // the job cannot go on
  } catch (const c10::Error& e) {
    out.failure = one_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    // a method that does not support this objective, a config that cannot fit in memory
    out.failure = one_line(e.what());
  }
  if (!out.trainer) return out;
  // Known once the model is built: a run that fails in training (a divergence) keeps them.
  record.num_parameters = out.trainer->model()->num_parameters();
  record.vocab_size = corpus.vocab_size;
  const int64_t step_tokens = tokens_per_step(config.train);
  out.trainer->on_progress = [&](const TrainProgress& p) { display.training(p, step_tokens); };
  out.trainer->quiet = quiet;
  try {
    const TrainSummary summary = out.trainer->run(RunStart::resume);
    out.reused = summary.resumed_from == summary.steps;
    char text[160];
    std::snprintf(
        text, sizeof text, "trained %" PRId64 " steps%s: valid loss %.4f, %.0f tok/s", summary.steps,
        summary.resumed_from > 0
            ? (" (resumed from step " + std::to_string(summary.resumed_from) + ")").c_str()
            : "",
        summary.valid_curve.empty() ? NAN : summary.valid_curve.back().loss,
        summary.tokens_per_second);
    display.line(text);
    display.trained(summary.tokens_per_second > 0
                        ? double(summary.steps - summary.resumed_from) * double(step_tokens) /
                              summary.tokens_per_second
                        : 0.0);
    if (record.status == "training") {
      record.end_time = iso_time_now();
      record.tokens_per_second = summary.tokens_per_second;
      record.peak_memory_bytes = summary.peak_memory_bytes;
      record.num_parameters = summary.num_parameters;
      record.train_tokens = summary.steps * step_tokens;
      record.vocab_size = corpus.vocab_size;
      record.train_loss = summary.train_curve;
      record.valid_loss = summary.valid_curve;
      record.status = "trained";
    }
  } catch (const DistributedError&) {
    throw;  // the job cannot go on
  } catch (const EvalFailure& e) {
    out.failure = one_line(e.what());  // validation could not run (e.g. a split too short)
  } catch (const ConfigError&) {
    throw;  // a run directory of another config, a damaged checkpoint, a full disk
  } catch (const c10::Error& e) {
    out.failure = one_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    out.failure = one_line(e.what());  // divergence, out of memory
  }
  if (!out.failure.empty()) out.trainer.reset();
  if (out.trainer) out.model = out.trainer->model();
  return out;
}

TrainedPoint load_released_point(const SweepSpec& spec, const SweepPoint& point, const Corpus& corpus,
                                 RunRecord& record, SweepDisplay& display) {
  const ReleasedModel& m = spec.released.at(size_t(point.index));
  const std::filesystem::path run = point.config.train.out_dir;
  reset_peak_memory();
  if (!has_checkpoint(run) && !std::filesystem::exists(run / "fingerprint.yaml")) {
    import_checkpoint(m.path, run, m.options);
    display.line("imported " + m.path);
  }
  if (!has_checkpoint(run))
    throw ConfigError(run.string() + ": a run directory without a checkpoint (an import of " + m.path +
                      " that was interrupted?); remove it, and the sweep imports the model again");
  const VerifiedCheckpoint checkpoint = require_checkpoint(run);
  if (!checkpoint.is_imported())
    throw ConfigError(run.string() + ": holds a trained run, not the import of released model " + m.name + " (" +
                      m.path + "); give the sweep another output.run_root, or remove it");
  if (const auto d = first_difference(checkpoint.config.result_keys(), point.config.result_keys()))
    throw ConfigError(run.string() + ": holds another import than released model " + m.name + " (" + d->key + ": " +
                      d->first + " there, " + d->second + " now); remove it to import " + m.path + " again");
  TrainedPoint out;
  out.loaded = std::make_unique<LoadedRun>(load_run(checkpoint, corpus));  // the weights checked
  out.model = out.loaded->model;
  out.reused = true;
  const nlohmann::json& weights = *checkpoint.imported;
  YAML::Node released(YAML::NodeType::Map);
  released["path"] = m.path;
  released["config_json"] = weights.at("config_json").at("xxh3").get<std::string>();
  released["weights"] = hf_weights_digest(weights);
  record.released = flow_text(released);
  record.num_parameters = out.model->num_parameters();
  record.vocab_size = corpus.vocab_size;
  record.train_tokens = 0;
  if (record.status == "training") {
    record.status = "trained";
    record.end_time = iso_time_now();
  }
  return out;
}

namespace {

// `r` with its token NLLs cut to the first n targets of the stream (the short evaluation's).
EvalResult first_targets(const EvalResult& r, int64_t n) {
  EvalResult out = r;
  if (r.token_nll.defined() && r.token_nll.size(0) > n) {
    out.token_nll = r.token_nll.slice(0, 0, n);
    out.token_position = r.token_position.slice(0, 0, n);
  }
  return out;
}

}  // namespace

std::vector<ProfileCell> profile_cells(const AttentionProfile& profile) {
  std::vector<ProfileCell> cells;
  const auto mass = profile.mass.accessor<double, 3>();
  const auto entropy = profile.entropy.accessor<double, 3>();
  const auto sink = profile.sink.accessor<double, 2>();
  for (int64_t l = 0; l < mass.size(0); ++l)
    for (int64_t h = 0; h < mass.size(1); ++h)
      for (int64_t b = 0; b < mass.size(2); ++b)
        cells.push_back({l, h, profile.edges[size_t(b)], profile.edges[size_t(b) + 1], mass[l][h][b],
                         entropy[l][h][b], sink[l][h]});
  return cells;
}

std::string LongPplCache::reference_weights(const Corpus& corpus, const Config& config) {
  if (settings_.reference.empty()) return "";
  if (!reference_)
    reference_ = load_key_token_model(settings_.reference, corpus, torch_device(config.train.device),
                                      "eval.longppl.reference " + settings_.reference);
  if (reference_digest_.empty()) reference_digest_ = reference_->model->weights_digest();
  return reference_digest_;
}

void PointInputs::set_model(TransformerLM& model) { common_.model = model->weights_digest(); }

PointInputs::PointInputs(const Corpus& corpus, const Config& config) {
  const YAML::Node data = config.to_yaml()["data"];
  common_.data_key = hex64(ContentHasher()
                               .add_field(yaml_to_string(data))
                               .add_field(enum_name(config.eval.split))
                               .add_field(std::to_string(config.eval.max_tokens))
                               .digest());
  common_.corpus = hex64(content_hash(YAML::Dump(plain_yaml(corpus.identity()))));
  // The tokens every evaluation of the split reads from: its first eval.max_tokens, with the
  // bytes of text behind them where the tokenizer says, and the split's size in bytes (bits per
  // byte).
  const TokenStream& stream = corpus.split(config.eval.split);
  const int64_t n = config.eval.max_tokens > 0 ? std::min(config.eval.max_tokens, stream.size()) : stream.size();
  ContentHasher tokens;
  tokens.add(&n, sizeof n).add(stream.data(), size_t(n) * sizeof(int32_t));
  if (stream.text_bytes()) tokens.add(stream.text_bytes(), size_t(n) * sizeof(int32_t));
  const int64_t bytes = stream.num_bytes();
  tokens.add(&bytes, sizeof bytes);
  common_.tokens = hex64(tokens.digest());
}

EvalInputs PointInputs::of(const EvalPoint& e, LongPplCache& longppl, const Corpus& corpus,
                           const Config& config) const {
  EvalInputs inputs = common_;
  if (e.retrieval) inputs.tokens.clear();  // instances are written, not read from the split
  if (e.longppl) {
    // A reference that cannot be loaded fails the point's LongPPL (its status says why); its
    // weights are then unknown.
    try {
      inputs.reference = longppl.reference_weights(corpus, config);
    } catch (const std::exception&) {
      inputs.reference.clear();
    }
  }
  return inputs;
}

LongPplRecord LongPplCache::score(TransformerLM& model, const Corpus& corpus, const Config& config,
                                  const EvalPoint& e, const EvalResult& evaluated) {
  LongPplRecord out;
  out.short_length = e.longppl_short;
  const torch::Device device = torch_device(config.train.device);
  const TokenStream& stream = corpus.split(config.eval.split);
  const std::string failure = failure_of([&] {
    if (!settings_.reference.empty() && !reference_)
      reference_ = load_key_token_model(settings_.reference, corpus, device,
                                        "eval.longppl.reference " + settings_.reference);
    TransformerLM& selector = reference_ ? reference_->model : model;
    if (!short_eval_ && short_failure_.empty()) {
      short_failure_ = failure_of([&] {
        EvalSpec base = eval_spec_for(config, e.longppl_short);
        if (settings_.max_tokens > 0)
          base.max_tokens = base.max_tokens > 0 ? std::min(base.max_tokens, settings_.max_tokens)
                                                : settings_.max_tokens;
        short_eval_ = evaluate(selector, corpus, stream, short_context_spec(base, e.longppl_short), device);
      });
    }
    if (!short_failure_.empty()) throw EvalFailure("short context evaluation: " + short_failure_);
    const int64_t n = short_eval_->token_nll.size(0);
    const EvalResult* selecting = &evaluated;
    if (reference_) {
      auto found = reference_long_.find(e.length);
      if (found == reference_long_.end()) {
        EvalSpec spec = eval_spec_for(config, e.length);  // the reference unscaled
        spec.keep_token_nll = true;
        found = reference_long_.emplace(e.length, evaluate(selector, corpus, stream, spec, device)).first;
      }
      selecting = &found->second;
    }
    LongPplSpec spec;
    spec.short_length = e.longppl_short;
    spec.alpha = settings_.alpha;
    spec.beta = settings_.beta;
    const KeyTokens keys = select_key_tokens(first_targets(*selecting, n), *short_eval_, spec);
    const LongPplResult r = longppl(first_targets(evaluated, n), keys);
    out.candidates = r.candidates;
    out.key_tokens = r.key_tokens;
    out.key_nll_sum = r.nll_sum;
  });
  if (!failure.empty()) out.status = "failed: " + failure;
  return out;
}

PointRecord evaluate_point(TransformerLM& model, const Corpus& corpus, const SweepPoint& point,
                           const RunRecord& record, const EvalPoint& e, LongPplCache& longppl,
                           const PointInputs& inputs) {
  const Config& config = point.config;
  PointRecord p = new_point_record(record, e);
  const std::string failure = failure_of([&] {
    if (e.retrieval) {
      RetrievalSpec spec = e.retrieval_spec;
      spec.rope_scaling =
          rope_scaling_for(e.rope_scaling, e.rope_factor, config.train.seq_len, e.length);
      // A long one is said before it starts (even under --quiet: it may take days).
      if (const std::string warning =
              estimate_retrieval_work(model, spec, torch_device(config.train.device))
                  .warning("extrap sweep: " + point.id + " " + e.mode + " at length " + std::to_string(e.length));
          !warning.empty())
        std::cerr << warning << std::endl;
      const RetrievalResult r =
          evaluate_retrieval(model, corpus, spec, torch_device(config.train.device));
      p.retrieval = r.cells;
      const RetrievalCell total = retrieval_totals(r.cells);
      p.nll_sum = total.answer_nll;
      p.scored_tokens = total.answer_tokens;
      p.perplexity = std::exp(p.nll_sum / double(p.scored_tokens));
      p.seconds = r.seconds;
      return;
    }
    if (e.profile) {
      AttentionProfileSpec spec;
      spec.length = e.length;
      spec.windows = e.profile_windows;
      spec.max_tokens = config.eval.max_tokens;
      spec.split_at = config.train.seq_len;
      const AttentionProfile r = attention_profile(model, corpus.split(config.eval.split),
                                                   spec, torch_device(config.train.device));
      p.attention_profile = profile_cells(r);
      p.scored_tokens = r.windows * r.length;
      p.seconds = r.seconds;
      return;
    }
    EvalSpec spec = eval_spec_for(config, e.length, e.stride);
    spec.rope_scaling =
        rope_scaling_for(e.rope_scaling, e.rope_factor, config.train.seq_len, e.length);
    spec.streaming = e.streaming;
    spec.keep_token_nll = e.longppl;
    const EvalResult r = evaluate(model, corpus, corpus.split(config.eval.split), spec,
                                  torch_device(config.train.device));
    p.perplexity = r.perplexity;
    p.nll_sum = r.nll_sum;
    p.scored_tokens = r.scored_tokens;
    p.bits_per_byte = r.bits_per_byte;
    p.seconds = r.seconds;
    p.by_position = r.by_position;
    if (e.longppl) p.longppl = longppl.score(model, corpus, config, e, r);
  });
  if (!failure.empty()) {
    p = new_point_record(record, e);  // nothing half-filled
    p.status = "failed: " + failure;
  }
  // A failure (a length the split cannot fill) depends on the inputs as much as a number does.
  p.inputs = inputs.of(e, longppl, corpus, config);
  return p;
}

}  // namespace extrap
