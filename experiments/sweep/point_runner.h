// One grid point of a sweep: train (or resume) its model in its run directory, and evaluate
// it at one (length, mode). Failures that belong to the point (a divergence, a length the data
// cannot fill, a method that does not support the objective) come back as a status
// "failed: <reason>" to be recorded; failures that the user must look at (a run directory of
// another config, a damaged checkpoint, a full disk) are thrown as ConfigError.
#pragma once

#include "core/eval/attention_profile.h"
#include "core/results/results_store.h"
#include "core/run/run_dir.h"
#include "core/train/trainer.h"
#include "experiments/sweep/sweep_progress.h"
#include "experiments/sweep/sweep_spec.h"

#include <map>
#include <memory>
#include <optional>
#include <string>

namespace extrap {

RunRecord new_run_record(const SweepPoint& point);
PointRecord new_point_record(const RunRecord& run, const EvalPoint& e);

struct TrainedPoint {
  std::unique_ptr<Trainer> trainer;   // null when training failed, or for a released point
  std::unique_ptr<LoadedRun> loaded;  // a released point's imported model
  TransformerLM model = nullptr;      // the model to evaluate (the trainer's, or the loaded one)
  std::string failure;                // why, one line
  bool reused = false;                // its checkpoint was already at the last step: nothing trained
};
// Trains the point to its steps (resuming its checkpoint), updating `record` (curves,
// throughput, status "trained") when this process trained it.
TrainedPoint train_point(const SweepPoint& point, const Corpus& corpus, RunRecord& record,
                         SweepDisplay& display, bool quiet);
// A released point (SweepSpec::released): its run directory imported from the checkpoint folder
// when it holds nothing yet (a directory holding another run is a ConfigError), then loaded, the
// weights checked against the import's record. `record` gets its `released` fields, and status
// "trained" (nothing was: it is ready to be evaluated).
TrainedPoint load_released_point(const SweepSpec& spec, const SweepPoint& point, const Corpus& corpus,
                                 RunRecord& record, SweepDisplay& display);

// What one point's LongPPL scores share (EvalPoint::longppl): the key-token model (the point's
// own, or the reference run's, loaded on first use), its short-context NLLs (one evaluation at
// K, stride 1, for every length) and the reference's long NLLs by length.
class LongPplCache {
 public:
  explicit LongPplCache(const SweepLongPpl& settings) : settings_(settings) {}
  // The point's LongPPL from its non-overlapping evaluation `evaluated` (with token NLLs) at
  // `e`; a failure (the reference reads other data, a non-finite NLL) is the record's status.
  LongPplRecord score(TransformerLM& model, const Corpus& corpus, const Config& config,
                      const EvalPoint& e, const EvalResult& evaluated);
  // The reference run's weights (TransformerLMImpl::weights_digest), loading it on first use;
  // "" without eval.longppl.reference. A reference that cannot be loaded is a ConfigError.
  std::string reference_weights(const Corpus& corpus, const Config& config);

 private:
  const SweepLongPpl& settings_;
  std::optional<LoadedRun> reference_;
  std::optional<EvalResult> short_eval_;
  std::string short_failure_;  // the short evaluation's failure, once
  std::map<int64_t, EvalResult> reference_long_;
  std::string reference_digest_;  // the reference's weights_digest, once loaded
};

// What a point's evaluations are computed from (EvalInputs), worked out once a point: the data
// before it trains, the weights once it has.
class PointInputs {
 public:
  PointInputs(const Corpus& corpus, const Config& config);
  void set_model(TransformerLM& model);
  // The inputs of evaluation `e`: a retrieval point reads no split; a LongPPL point with a
  // reference run names its weights.
  EvalInputs of(const EvalPoint& e, LongPplCache& longppl, const Corpus& corpus, const Config& config) const;

 private:
  EvalInputs common_;  // model, data key, corpus and the split's tokens
};

// A profile's rows of /attention_profile: layer, head, distance bin order.
std::vector<ProfileCell> profile_cells(const AttentionProfile& profile);

// Evaluates a trained point at `e`: a finished row, or a failed one with the reason; with
// e.longppl its LongPPL too (`longppl` holds what the point's lengths share); with e.profile,
// where the model looks instead (an attention-profile point).
PointRecord evaluate_point(TransformerLM& model, const Corpus& corpus, const SweepPoint& point,
                           const RunRecord& record, const EvalPoint& e, LongPplCache& longppl,
                           const PointInputs& inputs);

}  // namespace extrap
