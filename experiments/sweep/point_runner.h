// One grid point of a sweep: train (or resume) its model in its run directory, and evaluate
// it at one (length, mode). Failures that belong to the point (a divergence, a length the data
// cannot fill, a method that does not support the objective) come back as a status
// "failed: <reason>" to be recorded; failures that the user must look at (a run directory of
// another config, a damaged checkpoint, a full disk) are thrown as ConfigError.
#pragma once

#include "core/results/results_store.h"
#include "core/train/trainer.h"
#include "experiments/sweep/sweep_progress.h"
#include "experiments/sweep/sweep_spec.h"

#include <memory>
#include <string>

namespace extrap {

RunRecord new_run_record(const SweepPoint& point);
PointRecord new_point_record(const RunRecord& run, const EvalPoint& e);

struct TrainedPoint {
  std::unique_ptr<Trainer> trainer;  // null when training failed
  std::string failure;               // why, one line
  bool reused = false;               // its checkpoint was already at the last step: nothing trained
};
// Trains the point to its steps (resuming its checkpoint), updating `record` (curves,
// throughput, status "trained") when this process trained it.
TrainedPoint train_point(const SweepPoint& point, const Corpus& corpus, RunRecord& record,
                         SweepDisplay& display, bool quiet);

// Evaluates a trained point at `e`: a finished row, or a failed one with the reason.
PointRecord evaluate_point(Trainer& trainer, const Corpus& corpus, const SweepPoint& point,
                           const RunRecord& record, const EvalPoint& e);

}  // namespace extrap
