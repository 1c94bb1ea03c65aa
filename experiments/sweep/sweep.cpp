#include "experiments/sweep/sweep.h"

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <limits>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/base/fault.h"
#include "core/runtime/cuda_support.h"
#include "core/runtime/distributed.h"
#include "core/runtime/progress.h"
#include "core/runtime/sysinfo.h"
#include "experiments/sweep/point_runner.h"

namespace fs = std::filesystem;

namespace extrap {

namespace {

int status_rank(const std::string& status) {
  if (status == "training") return 0;
  if (status == "trained") return 1;
  return 2;  // complete, failed
}

// What counts as done: the points of the file being written, and those of a read-only
// `known` file (a parallel sweep's main output, when this process is one of its workers).
struct DoneSet {
  const ResultsStore& store;
  const ResultsStore* known;
  bool has_point(const std::string& id, const std::string& mode, int64_t length) const {
    return store.has_point(id, mode, length) || (known && known->has_point(id, mode, length));
  }
  const RunRecord* run(const std::string& id) const {
    if (const RunRecord* r = store.run(id)) return r;
    return known ? known->run(id) : nullptr;
  }
  bool complete(const SweepPoint& point) const {
    if (!run(point.id)) return false;
    for (const auto& e : point.evals)
      if (!has_point(point.id, e.mode, e.length)) return false;
    return true;
  }
};

// Data parallel (core/runtime/distributed.h): rank 0 decides from the results file what each point
// needs, and tells the other ranks, which hold no results file: "skip", or the indices (into
// point.evals) of the evaluations to run ("" trains only).
std::string share_plan(const SweepPoint& point, const std::vector<EvalPoint>& pending, bool skip) {
  ProcessGroup* ranks = ProcessGroup::get(torch_device(point.config.train.device));
  if (!ranks) return "";
  std::string plan = skip ? "skip" : "";
  if (!skip)
    for (size_t i = 0; i < point.evals.size(); ++i)
      for (const auto& e : pending)
        if (e.mode == point.evals[i].mode && e.length == point.evals[i].length)
          plan += (plan.empty() ? "" : ",") + std::to_string(i);
  return ranks->share("sweep point " + point.id, plan);
}

// ", LongPPL 3.64 over 3 key tokens" (or its failure) for a point that scored it.
std::string longppl_text(const PointRecord& p) {
  if (!p.longppl) return "";
  const LongPplRecord& l = *p.longppl;
  if (!l.ok()) return ", LongPPL " + l.status;
  char text[112];
  if (l.key_tokens == 0)
    std::snprintf(text, sizeof text, ", LongPPL: no key token among %" PRId64 " candidates",
                  l.candidates);
  else
    std::snprintf(text, sizeof text, ", LongPPL %.4f over %" PRId64 " key tokens", l.longppl(),
                  l.key_tokens);
  return text;
}

// "4 windows: mass past 16 0.1234, entropy 2.10 nats" for an attention-profile point: its
// weights at distances of at least the training length and its entropy over the keys, each the
// mean over layers and heads.
std::string profile_text(const PointRecord& p) {
  std::map<std::pair<int64_t, int64_t>, std::pair<double, double>> heads;  // -> (past, entropy)
  for (const auto& c : p.attention_profile) {
    auto& [past, entropy] = heads[{c.layer, c.head}];
    if (c.begin >= p.train_length) past += c.mass;
    entropy += c.entropy;
  }
  double past = 0, entropy = 0;
  for (const auto& [head, values] : heads) {
    past += values.first / double(heads.size());
    entropy += values.second / double(heads.size());
  }
  char text[160];
  std::snprintf(text, sizeof text, "%" PRId64 " queries: mass past %" PRId64 " %.4f, entropy %.3f nats",
                p.scored_tokens, p.train_length, past, entropy);
  return text;
}

// A rank other than 0: trains and evaluates what rank 0's plan says, point by point, taking
// part in every collective; rank 0 records the results.
void follow_points(const SweepSpec& spec, const std::vector<const SweepPoint*>& points,
                   SweepOutcome& outcome) {
  SweepDisplay silent(spec.name, int64_t(points.size()), false, "");
  std::map<std::string, Corpus> corpora;
  for (const SweepPoint* point : points) {
    const std::string plan = share_plan(*point, {}, false);
    if (plan == "skip") {
      ++outcome.skipped;
      continue;
    }
    const std::string data_key = yaml_to_string(point->config.to_yaml()["data"]);
    if (!corpora.count(data_key)) corpora.emplace(data_key, load_corpus(point->config.data));
    const Corpus& corpus = corpora.at(data_key);
    RunRecord record = new_run_record(*point);
    TrainedPoint trained = train_point(*point, corpus, record, silent, true);
    if (!trained.model) continue;
    ++(trained.reused ? outcome.reused : outcome.trained);
    std::stringstream indices(plan);
    LongPplCache longppl(spec.eval.longppl);
    PointInputs inputs(corpus, point->config);
    inputs.set_model(trained.model);
    for (std::string index; std::getline(indices, index, ',');) {
      if (index.empty()) continue;
      evaluate_point(trained.model, corpus, *point, record, point->evals.at(std::stoul(index)),
                     longppl, inputs);
      ++outcome.evaluated;
    }
  }
}

// An evaluated point's line in the sweep's progress: its length and mode, then its accuracy,
// profile, perplexity (with LongPPL) or failure, and the time it took.
std::string point_line(const PointRecord& p, const EvalPoint& e) {
  const std::string where = "L=" + std::to_string(e.length) + " " + e.mode + ": ";
  char text[160];
  if (!p.ok()) return where + p.status;
  if (e.retrieval) {
    const RetrievalCell total = retrieval_totals(p.retrieval);
    std::snprintf(text, sizeof text, "%" PRId64 "/%" PRId64 " correct (%.1f s)", total.correct, total.trials, p.seconds);
    return where + text;
  }
  if (e.profile) {
    std::snprintf(text, sizeof text, " (%.1f s)", p.seconds);
    return where + profile_text(p) + text;
  }
  if (!std::isfinite(p.perplexity)) {  // exp(mean NLL) past a double's range: the NLL is the number
    std::snprintf(text, sizeof text, "perplexity overflows a double (mean NLL %.1f nats a token > %.1f) (%.1f s)",
                  p.nll_sum / double(p.scored_tokens), std::log(std::numeric_limits<double>::max()), p.seconds);
    return where + text;
  }
  std::snprintf(text, sizeof text, "perplexity %.4f (%.1f s)", p.perplexity, p.seconds);
  return where + text + longppl_text(p);
}

// A recorded point as a message names it: "alibi-L32-seed1 nonoverlapping L=64".
std::string point_name(const PointRecord& p) {
  return p.run_id + " " + p.mode + " L=" + std::to_string(p.eval_length);
}

// Which input two points that share it were computed from differently (EvalInputs): the same
// run's weights, the same data section's corpus or tokens, LongPPL's reference.
enum class InputsDiffer { none, model, corpus, tokens, reference };

InputsDiffer inputs_differ(const EvalInputs& was, const std::string& was_run, const EvalInputs& now,
                           const std::string& now_run) {
  if (!was.recorded() || !now.recorded()) return InputsDiffer::none;
  if (was_run == now_run && !was.model.empty() && !now.model.empty() && was.model != now.model)
    return InputsDiffer::model;
  if (was.data_key == now.data_key && was.corpus != now.corpus) return InputsDiffer::corpus;
  if (was.data_key == now.data_key && !was.tokens.empty() && !now.tokens.empty() && was.tokens != now.tokens)
    return InputsDiffer::tokens;
  if (!was.reference.empty() && !now.reference.empty() && was.reference != now.reference)
    return InputsDiffer::reference;
  return InputsDiffer::none;
}

// The difference in words, for points of `config` (run `run_id`).
std::string describe(InputsDiffer differ, const std::string& run_id, const Config& config) {
  switch (differ) {
    case InputsDiffer::model:
      return "run " + run_id + "'s weights differ from those its recorded points evaluated (it was trained again)";
    case InputsDiffer::corpus:
      return "the corpus " + config.data.path + " differs from the one the recorded points read (its training "
             "text, vocabulary or tokenizer changed)";
    case InputsDiffer::tokens:
      return "the " + enum_name(config.eval.split) + " split of " + config.data.path +
             (config.eval.max_tokens > 0 ? " (its first " + std::to_string(config.eval.max_tokens) + " tokens)"
                                         : std::string()) +
             " differs from the text the recorded points evaluated";
    case InputsDiffer::reference:
      return "eval.longppl.reference's weights differ from those that chose the recorded points' key tokens";
    case InputsDiffer::none:
      break;
  }
  return "";
}

// Refuses (ConfigError, before anything is evaluated) to evaluate `pending` of `point` into a file
// whose recorded points were computed from other inputs where they share one: their numbers
// would be pooled with the new ones (a grown sweep after the validation text was edited, a run
// trained again, another LongPPL reference). Names the recorded points.
void refuse_other_inputs(const DoneSet& done, const SweepPoint& point, const std::vector<EvalPoint>& pending,
                         const PointInputs& inputs, LongPplCache& longppl, const Corpus& corpus,
                         const std::string& output) {
  std::vector<EvalInputs> now;
  for (const EvalPoint& e : pending) now.push_back(inputs.of(e, longppl, corpus, point.config));
  std::string reason;
  std::vector<std::string> names;
  int64_t unrecorded = 0;
  for (const ResultsStore* file : {&done.store, done.known}) {
    if (!file) continue;
    for (const PointRecord& recorded : file->points()) {
      if (!recorded.inputs.recorded()) {
        ++unrecorded;
        continue;
      }
      for (const EvalInputs& e : now) {
        const std::string why =
            describe(inputs_differ(recorded.inputs, recorded.run_id, e, point.id), point.id, point.config);
        if (why.empty()) continue;
        if (reason.empty()) reason = why;
        if (why == reason) names.push_back(point_name(recorded));
        break;
      }
    }
  }
  if (!names.empty()) {
    std::string listed;
    for (size_t i = 0; i < names.size() && i < 4; ++i) listed += (i ? ", " : "") + names[i];
    if (names.size() > 4) listed += " and " + std::to_string(names.size() - 4) + " more";
    throw ConfigError(output + ": not evaluating " + point.id + ": " + reason + " (" + listed +
                      "), and the file would pool their numbers with the new ones; restore what changed, or "
                      "run the sweep into another results file (--out)");
  }
  static bool said = false;  // once a process: the note is about the file, not the point
  if (unrecorded > 0 && !said) {
    said = true;
    std::fprintf(stderr,
                 "%s: %lld recorded point(s) were written by an extrap that did not record what they "
                 "evaluated; points added now cannot be checked against them\n",
                 output.c_str(), (long long)unrecorded);
  }
}

// Before anything is trained, evaluated or grown: each point with evaluations to run against
// what the file recorded (refuse_other_inputs: the data and LongPPL's reference; the weights are
// compared once the point is trained).
void refuse_pending_other_inputs(const SweepSpec& spec, const std::vector<const SweepPoint*>& points,
                                 const DoneSet& done, const std::string& output) {
  bool recorded = false;
  for (const ResultsStore* file : {&done.store, done.known})
    if (file)
      for (const auto& p : file->points()) recorded = recorded || p.inputs.recorded();
  if (!recorded) return;  // nothing to compare with
  std::map<std::string, Corpus> corpora;  // by data section
  LongPplCache longppl(spec.eval.longppl);
  for (const SweepPoint* point : points) {
    std::vector<EvalPoint> pending;
    for (const auto& e : point->evals)
      if (!done.has_point(point->id, e.mode, e.length)) pending.push_back(e);
    if (pending.empty()) continue;
    const std::string data_key = yaml_to_string(point->config.to_yaml()["data"]);
    if (!corpora.count(data_key)) corpora.emplace(data_key, load_corpus(point->config.data));
    const Corpus& corpus = corpora.at(data_key);
    refuse_other_inputs(done, *point, pending, PointInputs(corpus, point->config), longppl, corpus, output);
  }
}

// Trains and evaluates `points` in order, appending every finished point to `store`.
void run_points(const SweepSpec& spec, const std::vector<const SweepPoint*>& points,
                ResultsStore& store, const ResultsStore* known, const SweepOptions& options,
                SweepOutcome& outcome) {
  const DoneSet done{store, known};
  SweepDisplay display(spec.name, int64_t(points.size()), options.progress, options.worker);
  // Workers share the terminal: the trainer's own (unlabelled) lines would interleave.
  const bool quiet_trainer = !options.progress || !options.worker.empty();
  std::map<std::string, Corpus> corpora;  // by data section
  for (size_t k = 0; k < points.size(); ++k) {
    const SweepPoint& point = *points[k];
    std::vector<EvalPoint> pending;
    for (const auto& e : point.evals)
      if (!done.has_point(point.id, e.mode, e.length)) pending.push_back(e);
    const RunRecord* existing = done.run(point.id);
    // Data parallel: the other ranks run what rank 0 runs (plan_for_ranks).
    share_plan(point, pending, existing && pending.empty());
    int64_t later_tokens = 0;
    for (size_t j = k + 1; j < points.size() && spec.released.empty(); ++j)  // released: nothing to train
      later_tokens += points[j]->config.train.steps * tokens_per_step(points[j]->config.train);
    display.start_run(int64_t(k) + 1, point.id, later_tokens);

    if (existing && pending.empty()) {
      if (existing->status == "trained") {
        RunRecord finished = *existing;
        finished.status = "complete";
        store.put_run(finished);
      }
      ++outcome.skipped;
      display.line("already complete");
      continue;
    }
    const std::string data_key = yaml_to_string(point.config.to_yaml()["data"]);
    if (!corpora.count(data_key)) corpora.emplace(data_key, load_corpus(point.config.data));
    const Corpus& corpus = corpora.at(data_key);
    // Nothing is trained or evaluated that the file's recorded points would be pooled with but
    // were computed from other data; then nothing is evaluated from other weights.
    LongPplCache longppl(spec.eval.longppl);
    PointInputs inputs(corpus, point.config);
    refuse_other_inputs(done, point, pending, inputs, longppl, corpus, store.path());

    RunRecord record = existing ? *existing : new_run_record(point);
    if (!store.run(point.id)) store.put_run(record);

    TrainedPoint trained = spec.released.empty() ? train_point(point, corpus, record, display, quiet_trainer)
                                                 : load_released_point(spec, point, corpus, record, display);
    if (!trained.model) {
      record.status = "failed: " + trained.failure;
      record.end_time = iso_time_now();
      std::vector<PointRecord> failed;
      for (const auto& e : pending) {
        failed.push_back(new_point_record(record, e));
        failed.back().status = "failed: training: " + trained.failure;
      }
      store.write({record}, failed);
      outcome.evaluated += int64_t(failed.size());
      outcome.failed += int64_t(failed.size());
      display.line("failed: " + trained.failure);
      display.finish_run();
      continue;
    }
    ++(!spec.released.empty() ? outcome.released : trained.reused ? outcome.reused : outcome.trained);
    if (record.status == "trained") store.put_run(record);

    // Evaluate every pending point; each is on disk before the next starts.
    inputs.set_model(trained.model);
    refuse_other_inputs(done, point, pending, inputs, longppl, corpus, store.path());
    for (const auto& e : pending) {
      const PointRecord p = evaluate_point(trained.model, corpus, point, record, e, longppl, inputs);
      store.append_point(p);
      fault_point("point", p.run_id + " " + p.mode + " " + std::to_string(p.eval_length));
      ++outcome.evaluated;
      outcome.failed += !p.ok();
      display.line(point_line(p, e));
    }
    record.status = "complete";
    store.put_run(record);
    display.finish_run();
  }
}

// Where two records of one point differ ("" where they hold the same numbers: evaluations of
// one model on one machine agree to rounding; different threads may change the summation
// order). The time taken may differ.
std::string number_difference(const PointRecord& a, const PointRecord& b) {
  const auto close = [](double x, double y, double tolerance) {
    return (std::isnan(x) && std::isnan(y)) || std::abs(x - y) <= tolerance * std::max(1.0, std::abs(x));
  };
  const auto both = [](const auto& x, const auto& y) {
    std::ostringstream text;
    text << std::setprecision(17) << x << " vs " << y;
    return text.str();
  };
  if (a.status != b.status) return "status " + a.status + " vs " + b.status;
  if (a.scored_tokens != b.scored_tokens) return "scored tokens " + both(a.scored_tokens, b.scored_tokens);
  if (!a.ok()) return "";
  if (a.retrieval.size() != b.retrieval.size()) return "retrieval depths " + both(a.retrieval.size(), b.retrieval.size());
  for (size_t i = 0; i < a.retrieval.size(); ++i)
    if (a.retrieval[i].depth != b.retrieval[i].depth || a.retrieval[i].correct != b.retrieval[i].correct ||
        a.retrieval[i].trials != b.retrieval[i].trials)
      return "retrieval at depth " + std::to_string(a.retrieval[i].depth) + ": " +
             std::to_string(a.retrieval[i].correct) + " of " + std::to_string(a.retrieval[i].trials) + " vs " +
             std::to_string(b.retrieval[i].correct) + " of " + std::to_string(b.retrieval[i].trials);
    else if (!close(a.retrieval[i].same_as, b.retrieval[i].same_as, 0) && !std::isnan(a.retrieval[i].same_as) &&
             !std::isnan(b.retrieval[i].same_as))
      return "retrieval at depth " + std::to_string(a.retrieval[i].depth) + ": the key placed as at depth " +
             both(a.retrieval[i].same_as, b.retrieval[i].same_as);
  if (a.longppl.has_value() != b.longppl.has_value()) return "LongPPL recorded in one file only";
  if (a.longppl) {
    const LongPplRecord &x = *a.longppl, &y = *b.longppl;
    if (x.status != y.status || x.short_length != y.short_length || x.key_tokens != y.key_tokens ||
        x.candidates != y.candidates)
      return "LongPPL's key tokens (" + x.status + ", " + std::to_string(x.key_tokens) + " vs " + y.status + ", " +
             std::to_string(y.key_tokens) + ")";
    if (x.ok() && !close(x.key_nll_sum, y.key_nll_sum, 1e-9)) return "LongPPL's key NLL " + both(x.key_nll_sum, y.key_nll_sum);
  }
  if (is_profile_mode(a.mode)) {  // float32 weights summed in float64: agree to 1e-5
    if (a.attention_profile.size() != b.attention_profile.size())
      return "attention-profile cells " + both(a.attention_profile.size(), b.attention_profile.size());
    for (size_t i = 0; i < a.attention_profile.size(); ++i) {
      const ProfileCell &x = a.attention_profile[i], &y = b.attention_profile[i];
      if (x.layer != y.layer || x.head != y.head || x.begin != y.begin || x.end != y.end ||
          !(std::abs(x.mass - y.mass) <= 1e-5) || !(std::abs(x.entropy - y.entropy) <= 1e-5) ||
          !(std::abs(x.sink - y.sink) <= 1e-5))
        return "the attention profile of layer " + std::to_string(x.layer) + " head " + std::to_string(x.head);
    }
    return "";
  }
  if (!close(a.nll_sum, b.nll_sum, 1e-9)) return "NLL " + both(a.nll_sum, b.nll_sum);
  // Derived from the NLL, but stored: a file whose derived numbers were edited or damaged.
  if (!close(a.perplexity, b.perplexity, 1e-9)) return "perplexity " + both(a.perplexity, b.perplexity);
  if (!close(a.bits_per_byte, b.bits_per_byte, 1e-9)) return "bits per byte " + both(a.bits_per_byte, b.bits_per_byte);
  return "";
}

// The error for one point recorded with different numbers in two files.
ConfigError conflict(const PointRecord& first, const std::string& first_file,
                     const PointRecord& second, const std::string& second_file) {
  return ConfigError("point (" + second.run_id + ", " + second.mode + ", L=" +
                     std::to_string(second.eval_length) + ") differs between " + first_file +
                     " and " + second_file + " (" + number_difference(first, second) +
                     "): these files hold different runs under one name; nothing merged");
}

// Adds to `store` every run and point of `source` that it lacks, in one atomic change. A run
// already present is replaced only by a more finished record of it. A point present in both
// with different numbers is a ConfigError naming it.
void absorb(ResultsStore& store, const ResultsStore& source, MergeOutcome& outcome) {
  std::vector<RunRecord> runs;
  for (const auto& [id, run] : source.runs()) {
    const RunRecord* existing = store.run(id);
    if (!existing) ++outcome.runs_added;
    if (!existing || status_rank(run.status) > status_rank(existing->status)) runs.push_back(run);
  }
  std::vector<PointRecord> points;
  std::map<std::tuple<std::string, std::string, int64_t>, const PointRecord*> adding;
  for (const auto& p : source.points()) {
    const auto key = std::make_tuple(p.run_id, p.mode, p.eval_length);
    const PointRecord* other = store.point(p.run_id, p.mode, p.eval_length);
    if (!other && adding.count(key)) other = adding.at(key);
    if (other) {
      if (!number_difference(*other, p).empty()) throw conflict(*other, store.path(), p, source.path());
      ++outcome.points_already_present;
      continue;
    }
    points.push_back(p);
    adding[key] = &p;
  }
  outcome.points_added += int64_t(points.size());
  if (!runs.empty() || !points.empty()) store.write(runs, points);
}

std::string part_path(const std::string& output, int64_t worker) {
  return output + ".part-" + std::to_string(worker) + ".h5";
}

// Refuses (ConfigError, naming both points and their files) files whose points were computed
// from other inputs where they share one (EvalInputs: a shard or worker that evaluated after the
// validation text was edited): `doing` them together would pool their numbers as one sweep's.
// The first point of each run, data section and LongPPL reference stands for the others.
void refuse_mixed_inputs(const std::vector<const ResultsStore*>& files, const std::string& doing) {
  using Place = std::pair<const PointRecord*, std::string>;  // a point and its file
  std::map<std::string, Place> by_run, by_data, by_tokens;
  std::optional<Place> by_reference;
  for (const ResultsStore* file : files)
    for (const auto& p : file->points()) {
      if (!p.inputs.recorded()) continue;
      const Place here{&p, file->path()};
      std::vector<Place> earlier;
      const auto compare_with_first = [&](std::map<std::string, Place>& index, const std::string& key) {
        const auto [entry, added] = index.emplace(key, here);
        if (!added) earlier.push_back(entry->second);
      };
      compare_with_first(by_run, p.run_id);
      compare_with_first(by_data, p.inputs.data_key);
      if (!p.inputs.tokens.empty()) compare_with_first(by_tokens, p.inputs.data_key);
      if (!p.inputs.reference.empty() && !by_reference) by_reference = here;
      if (by_reference) earlier.push_back(*by_reference);
      for (const auto& [other, other_file] : earlier) {
        const InputsDiffer differ = inputs_differ(other->inputs, other->run_id, p.inputs, p.run_id);
        if (differ == InputsDiffer::none) continue;
        const char* what = differ == InputsDiffer::model    ? "their run's weights"
                           : differ == InputsDiffer::corpus ? "their corpus (its training text or vocabulary)"
                           : differ == InputsDiffer::tokens ? "the text they evaluated"
                                                            : "LongPPL's reference model";
        throw ConfigError("point (" + point_name(p) + ") in " + file->path() + " and point (" + point_name(*other) +
                          ") in " + other_file + " differ in " + what + ": " + doing +
                          ", their numbers would be pooled as one sweep's; nothing " + doing);
      }
    }
}

// Merges one part file of a parallel sweep into `store` and removes it. A part still being
// written is an error naming its writer.
void absorb_part(ResultsStore& store, const std::string& output, const fs::path& part) {
  if (!fs::exists(part)) return;  // the worker failed before creating it
  {
    ResultsLock part_lock(part.string());
    const ResultsStore source = ResultsStore::open(part.string());
    const std::string difference =
        sweep_growth_difference(store.header(), output, source.header(), part.string());
    if (!difference.empty())
      throw ConfigError(part.string() + " is a part of a different sweep (" + difference +
                        "); remove it");
    refuse_mixed_inputs({&store, &source}, "merged");
    MergeOutcome ignored;
    absorb(store, source, ignored);
    fs::remove(part);
  }
  fs::remove(part.string() + ".lock");
}

// A sweep grown (or shrunk) since its results file was written: the file takes the current
// spec, and recorded runs whose place in the grid moved take the new one, in one change.
void grow_results(ResultsStore& store, const SweepHeader& header,
                  const std::vector<SweepPoint>& points, bool progress) {
  if (store.header().spec_hash == header.spec_hash) return;
  std::map<std::string, const SweepPoint*> by_id;
  for (const auto& p : points) by_id[p.id] = &p;
  std::vector<RunRecord> moved;
  int64_t recorded = 0;
  for (const auto& [id, run] : store.runs()) {
    const auto found = by_id.find(id);
    if (found == by_id.end()) continue;
    ++recorded;
    if (run.point_index == found->second->index) continue;
    moved.push_back(run);
    moved.back().point_index = found->second->index;
  }
  const int64_t kept = int64_t(store.runs().size()) - recorded;
  store.grow(header, moved);
  if (progress)
    std::fprintf(stderr,
                 "%s: the sweep changed (%lld of its %zu points recorded before%s); its results "
                 "file takes the new spec\n",
                 store.path().c_str(), (long long)recorded, points.size(),
                 kept > 0 ? (", " + std::to_string(kept) + " recorded point(s) no longer in the "
                             "grid kept").c_str()
                          : "");
}

// Merges the part files that an interrupted parallel sweep left beside `output`.
void absorb_parts(ResultsStore& store, const std::string& output) {
  for (const auto& part : sweep_part_files(output)) absorb_part(store, output, part);
}

// Starts worker process `worker` (of `count`) running `indices` into its part file, skipping
// what `output` holds; it dies with this process.
pid_t start_worker(const SweepSpec& spec, int64_t worker, int64_t count,
                   const std::vector<int64_t>& indices, const std::string& output, bool progress) {
  std::vector<std::string> args = {"extrap", "sweep", spec.source};
  for (const auto& o : spec.overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  std::string list;
  for (int64_t i : indices) list += (list.empty() ? "" : ",") + std::to_string(i);
  for (const std::string& a :
       {std::string("--worker"), std::to_string(worker + 1) + "/" + std::to_string(count),
        std::string("--points"), list, std::string("--out"), part_path(output, worker),
        std::string("--known"), output, std::string("--expect-spec"), spec.worker_identity()})
    args.push_back(a);
  if (!progress) args.push_back("--quiet");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0)
    throw std::runtime_error(std::string("cannot start a worker process: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed sweep takes its workers with it
    if (::getppid() != parent) ::_exit(1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  return pid;
}

// jobs > 1: the pending points dealt round-robin to `jobs` worker processes; each worker's part
// is merged into the output as soon as it ends.
void run_parallel(const SweepSpec& spec, const std::vector<const SweepPoint*>& points,
                  ResultsStore& store, int64_t jobs, const SweepOptions& options,
                  SweepOutcome& outcome) {
  const DoneSet done{store, nullptr};
  std::vector<const SweepPoint*> pending;
  for (const auto* p : points)
    if (!done.complete(*p)) pending.push_back(p);
  outcome.skipped = int64_t(points.size() - pending.size());
  const size_t points_before = store.points().size();
  std::set<std::string> trained_before;  // pending points whose run was trained already
  for (const auto* p : pending)
    if (const RunRecord* r = done.run(p->id); r && (r->status == "trained" || r->status == "complete"))
      trained_before.insert(p->id);
  // Tokenise (and cache) each corpus once here, not in every worker at the same time.
  std::set<std::string> loaded;
  for (const auto* p : pending)
    if (loaded.insert(yaml_to_string(p->config.to_yaml()["data"])).second)
      load_corpus(p->config.data);
  const int64_t workers = std::min<int64_t>(jobs, int64_t(pending.size()));
  if (options.progress)
    std::fprintf(stderr, "sweep %s: %zu of %zu points to run, in %lld worker processes\n",
                 spec.name.c_str(), pending.size(), points.size(), (long long)workers);
  std::vector<std::vector<int64_t>> assigned(size_t(std::max<int64_t>(workers, 0)));
  for (size_t i = 0; i < pending.size(); ++i) assigned[i % size_t(workers)].push_back(pending[i]->index);

  const auto started = std::chrono::steady_clock::now();
  std::map<pid_t, int64_t> running;
  for (int64_t w = 0; w < workers; ++w)
    running[start_worker(spec, w, workers, assigned[size_t(w)], outcome.output, options.progress)] = w;
  std::string failures;
  while (!running.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("waiting for worker processes: ") + std::strerror(errno));
    }
    const auto found = running.find(pid);
    if (found == running.end()) continue;
    const int64_t w = found->second;
    running.erase(found);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failures += " worker " + std::to_string(w + 1) +
                  (WIFEXITED(status) ? " (exit code " + std::to_string(WEXITSTATUS(status)) + ")"
                                     : " (signal " + std::to_string(WTERMSIG(status)) + ")") +
                  ";";
    absorb_part(store, outcome.output, part_path(outcome.output, w));
    if (options.progress)
      std::fprintf(stderr, "sweep %s: worker %lld of %lld done after %s\n", spec.name.c_str(),
                   (long long)(w + 1), (long long)workers,
                   format_duration(std::chrono::duration<double>(
                                       std::chrono::steady_clock::now() - started)
                                       .count())
                       .c_str());
  }
  const DoneSet after{store, nullptr};
  for (const auto* p : pending)
    if (after.run(p->id))
      ++(!spec.released.empty() ? outcome.released : trained_before.count(p->id) ? outcome.reused : outcome.trained);
  for (size_t i = points_before; i < store.points().size(); ++i) {
    ++outcome.evaluated;
    outcome.failed += !store.points()[i].ok();
  }
  if (!failures.empty())
    throw std::runtime_error("sweep " + spec.name + ": workers failed:" + failures +
                             " (their messages are above); finished points are in " +
                             outcome.output + ": run the same command again to continue");
}

}  // namespace

std::vector<std::string> sweep_part_files(const std::string& output) {
  const fs::path out_path = fs::absolute(output);
  const std::string prefix = out_path.filename().string() + ".part-";
  std::vector<std::string> parts;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(out_path.parent_path(), error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > 3 && name.compare(name.size() - 3, 3, ".h5") == 0)
      parts.push_back(entry.path().string());
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

std::string sweep_output(const SweepSpec& spec, const SweepOptions& options) {
  return shard_output(options.output.empty() ? spec.output : options.output, options.shard);
}

SweepOutcome run_sweep(const SweepSpec& spec, const SweepOptions& options) {
  SweepOutcome outcome;
  const bool worker = !options.worker.empty();
  if (worker && !options.expect_spec.empty() && options.expect_spec != spec.worker_identity())
    throw ConfigError(spec.source + " changed while its parallel sweep ran (worker " + options.worker +
                      " read another sweep than the one its sweep started): this worker stops; finished points "
                      "are in the results file, and running the sweep again continues with the file as it is now");
  outcome.output = worker ? options.output : sweep_output(spec, options);
  std::vector<SweepPoint> all = expand_grid(spec);
  if (worker) {
    // Workers share the machine's cores: a point that would take all of them (train.threads 0)
    // takes its worker's share. N workers each running a thread per core spin against each
    // other in OpenMP's waits (two 2-thread trainings on 2 cores: 13x slower than one alone).
    const int64_t workers = std::max<int64_t>(1, std::stoll(options.worker.substr(options.worker.find('/') + 1)));
    for (auto& point : all)
      if (point.config.train.threads == 0)
        point.config.train.threads = std::max<int64_t>(1, available_cores() / workers);
  }
  const std::set<int64_t> chosen(options.points.begin(), options.points.end());
  std::vector<const SweepPoint*> points;
  for (const auto& p : all)
    if (options.shard.contains(p.index) && (chosen.empty() || chosen.count(p.index)))
      points.push_back(&p);
  outcome.points = int64_t(points.size());
  for (const auto* p : points)
    if (p->config.train.device == Device::cuda)
      require_cuda(spec.source + ": point " + p->id + " trains on cuda");

  if (ProcessGroup::environment()) {
    if (!spec.released.empty())
      throw ConfigError(spec.source + ": a sweep of released checkpoints runs in one process, not data-parallel "
                        "under extrap launch (nothing is trained; jobs: N runs its models side by side)");
    if ((options.jobs > 0 ? options.jobs : spec.jobs) > 1)
      throw ConfigError(spec.source + ": jobs " +
                        std::to_string(options.jobs > 0 ? options.jobs : spec.jobs) +
                        " and data-parallel ranks do not combine: each point already runs on "
                        "every rank (set jobs: 1 or --jobs 1)");
    if (!ProcessGroup::leader()) {
      // The run directories rank 0 adopts from the results file (on a filesystem every rank
      // reads, as the run directories are).
      if (fs::exists(outcome.output)) {
        const ResultsStore recorded = ResultsStore::open(outcome.output);
        adopt_recorded_runs(all, {&recorded});
      }
      follow_points(spec, points, outcome);
      return outcome;
    }
  }
  ResultsLock lock(outcome.output);
  const SweepHeader header = spec.header(worker ? "part" : options.shard.text());
  ResultsStore store = ResultsStore::open_or_create(outcome.output, header);
  const std::string difference =
      sweep_growth_difference(store.header(), outcome.output, header, spec.source);
  if (!difference.empty())
    throw ConfigError(outcome.output + " holds the results of a different sweep (" + difference +
                      "). Use another --out, or delete " + outcome.output + " to start over.");
  std::optional<ResultsStore> known;
  if (!options.known.empty() && fs::exists(options.known))
    known.emplace(ResultsStore::open(options.known));
  adopt_recorded_runs(all, {&store, known ? &*known : nullptr});
  if (!worker) absorb_parts(store, outcome.output);  // left by an interrupted parallel sweep
  refuse_pending_other_inputs(spec, points, DoneSet{store, known ? &*known : nullptr}, outcome.output);
  if (!worker) grow_results(store, header, all, options.progress);

  const int64_t jobs = options.jobs > 0 ? options.jobs : spec.jobs;
  if (!worker && jobs > 1) {
    run_parallel(spec, points, store, jobs, options, outcome);
    return outcome;
  }
  run_points(spec, points, store, known ? &*known : nullptr, options, outcome);
  return outcome;
}

namespace {

// Refuses merging shards of sweep `shards` into a results file of another sweep (one that is
// not the same sweep at another stage of its growth).
void refuse_other_sweep(const SweepHeader& out, const std::string& output, const SweepHeader& shards,
                        const std::string& shard_label) {
  const std::string difference = sweep_growth_difference(out, output, shards, shard_label);
  if (!difference.empty())
    throw ConfigError(output + " holds the results of a different sweep (" + difference + ")");
}

}  // namespace

MergeOutcome merge_results(const std::string& output, const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw ConfigError("no input files");
  std::vector<ResultsStore> sources;
  for (const auto& path : inputs) {
    if (fs::exists(output) && fs::equivalent(path, output))
      throw ConfigError("input " + path + " is the output file");
    sources.push_back(ResultsStore::open(path));
  }
  for (size_t i = 1; i < sources.size(); ++i) {
    const std::string difference =
        describe_difference(sources[0].header(), inputs[0], sources[i].header(), inputs[i]);
    if (difference.empty()) continue;
    const bool stages = sweep_growth_difference(sources[0].header(), inputs[0], sources[i].header(),
                                                inputs[i]).empty();
    throw ConfigError(inputs[i] + " is not from the same sweep as " + inputs[0] + " (" + difference +
                      (stages ? "); they hold one sweep before and after it grew: merge the "
                                "earlier stage's shards first, then the later's"
                              : "); only shards of one sweep can be merged"));
  }

  // Every point once across the inputs and the output: a point two files hold with different
  // numbers is refused before anything is written (and an output of another sweep first).
  {
    std::map<std::tuple<std::string, std::string, int64_t>, std::pair<const PointRecord*, std::string>>
        seen;
    std::optional<ResultsStore> existing;
    if (fs::exists(output)) existing.emplace(ResultsStore::open(output));
    if (existing) refuse_other_sweep(existing->header(), output, sources[0].header(), inputs[0]);
    std::vector<const ResultsStore*> all;
    if (existing) all.push_back(&*existing);
    for (const auto& source : sources) all.push_back(&source);
    for (const ResultsStore* file : all)
      for (const auto& p : file->points()) {
        const auto key = std::make_tuple(p.run_id, p.mode, p.eval_length);
        const auto found = seen.find(key);
        if (found == seen.end()) {
          seen[key] = {&p, file->path()};
        } else if (!number_difference(*found->second.first, p).empty()) {
          throw conflict(*found->second.first, found->second.second, p, file->path());
        }
      }
    refuse_mixed_inputs(all, "merged");
  }
  ResultsLock lock(output);
  SweepHeader header = sources[0].header();
  header.shard = "merged";
  header.created = iso_time_now();
  ResultsStore store = ResultsStore::open_or_create(output, header);
  refuse_other_sweep(store.header(), output, header, inputs[0]);  // again, now under the lock
  MergeOutcome outcome;
  for (const auto& source : sources) header.spec_time = std::max(header.spec_time, source.header().spec_time);
  if (store.header().spec_hash != header.spec_hash && store.header().spec_time > header.spec_time) {
    // OUT holds a later stage of the sweep than the shards (shards of an earlier stage merged
    // late): it keeps its spec, and the shards' runs are added as recorded.
    outcome.kept_later_spec = true;
  } else if (store.header().spec_hash != header.spec_hash) {
    // The sweep grew (or shrank) since OUT was written: OUT takes the shards' spec, and its runs
    // take their places in the shards' grid (a run no shard holds keeps its own).
    std::vector<RunRecord> moved;
    for (const auto& [id, run] : store.runs())
      for (const auto& source : sources)
        if (const RunRecord* now = source.run(id)) {
          if (now->point_index != run.point_index) {
            moved.push_back(run);
            moved.back().point_index = now->point_index;
          }
          break;
        }
    store.grow(header, moved);
    outcome.took_spec = true;
  }
  for (const auto& source : sources) absorb(store, source, outcome);
  return outcome;
}

// The recorded run of each grid point, by the point's identity (its grid values): a point keeps
// the run id and run directory it was recorded under (those of extrap 0.11 were numbered by
// place in the grid), so growing a sweep never trains a recorded point again.
void adopt_recorded_runs(std::vector<SweepPoint>& points,
                         const std::vector<const ResultsStore*>& files) {
  std::map<std::string, const RunRecord*> recorded;
  for (const ResultsStore* file : files)
    if (file)
      for (const auto& [id, run] : file->runs()) recorded.emplace(grid_point_key(run.grid_point), &run);
  for (auto& point : points) {
    const auto found = recorded.find(point.key);
    if (found == recorded.end() || found->second->run_id == point.id) continue;
    point.id = found->second->run_id;
    const YAML::Node config = YAML::Load(found->second->config);
    if (config["train"] && config["train"]["out_dir"])
      point.config.train.out_dir = config["train"]["out_dir"].Scalar();
  }
}

}  // namespace extrap
