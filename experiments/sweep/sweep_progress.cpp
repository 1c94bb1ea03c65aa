#include "experiments/sweep/sweep_progress.h"

#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>

namespace extrap {

namespace {
double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

SweepDisplay::SweepDisplay(std::string name, int64_t runs, bool enabled, std::string worker)
    : name_(std::move(name)),
      runs_(runs),
      worker_(std::move(worker)),
      enabled_(enabled),
      status_(enabled && worker_.empty()) {}

void SweepDisplay::start_run(int64_t ordinal, const std::string& id, int64_t remaining_tokens) {
  ordinal_ = ordinal;
  id_ = id;
  later_tokens_ = remaining_tokens;
  run_started_ = now();
}

void SweepDisplay::training(const TrainProgress& p, int64_t tokens_per_step) {
  if (!enabled_) return;
  const double remaining =
      double(p.total_steps - p.step) * double(tokens_per_step) + double(later_tokens_);
  // Wall time per pure-training second: validation, evaluation and saving on top of it.
  const double overhead = trained_seconds_ > 0 ? wall_seconds_ / trained_seconds_ : 1.3;
  const double eta = p.tokens_per_second > 0 ? remaining / p.tokens_per_second * overhead : NAN;
  char text[256];
  std::snprintf(text, sizeof text, "step %" PRId64 "/%" PRId64 "  loss %.4f  %.0f tok/s  %s ETA %s",
                p.step, p.total_steps, p.loss, p.tokens_per_second,
                worker_.empty() ? "sweep" : "run", format_duration(eta).c_str());
  if (status_.redraws())
    status_.status(prefix() + "  " + text, p.step == p.total_steps);
  else
    status_.line(prefix() + ": " + text);
}

void SweepDisplay::finish_run() {
  wall_seconds_ += now() - run_started_;
  trained_seconds_ += run_train_seconds_;
  run_train_seconds_ = 0;
}

void SweepDisplay::line(const std::string& text) {
  if (enabled_) status_.line(prefix() + ": " + text);
}

std::string SweepDisplay::prefix() const {
  const std::string position = (worker_.empty() ? "" : "worker " + worker_ + ", run ") +
                               std::to_string(ordinal_) + "/" + std::to_string(runs_);
  return "sweep " + name_ + " [" + position + "] " + id_;
}

}  // namespace extrap
