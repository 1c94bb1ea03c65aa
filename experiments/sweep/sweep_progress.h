// A sweep's progress on stderr (core/runtime/progress.h's status line): run k of n, step, loss,
// tokens/s and the sweep's ETA, with finished evaluations printed above it. A worker process
// of a parallel sweep writes labelled log lines only (the terminal is shared).
#pragma once

#include "core/runtime/progress.h"
#include "core/train/trainer.h"

#include <string>

namespace extrap {

class SweepDisplay {
 public:
  // `worker`: "K/N" in worker process K of N, "" in the sweep's own process.
  SweepDisplay(std::string name, int64_t runs, bool enabled, std::string worker);

  // `remaining_tokens`: training tokens of the runs after this one.
  void start_run(int64_t ordinal, const std::string& id, int64_t remaining_tokens);
  void training(const TrainProgress& p, int64_t tokens_per_step);
  // Training finished after `train_seconds` of pure training.
  void trained(double train_seconds) { run_train_seconds_ = train_seconds; }
  void finish_run();
  void line(const std::string& text);

 private:
  std::string prefix() const;

  std::string name_;
  int64_t runs_;
  std::string worker_;
  bool enabled_;
  StatusLine status_;
  int64_t ordinal_ = 0;
  std::string id_;
  int64_t later_tokens_ = 0;
  double run_started_ = 0;
  double wall_seconds_ = 0, trained_seconds_ = 0, run_train_seconds_ = 0;
};

}  // namespace extrap
