// RUN/metrics.jsonl: the run's log, one JSON object per line, for plotting tools and
// analysis/metrics_to_tensorboard.py.
//
//   {"step": 20, "loss": 4.61, "lr": 0.003, "tokens": 5120, "tokens_per_second": 18400.5,
//    "seconds": 0.28, "time": 1764072000.1}
//   {"step": 40, ..., "valid_loss": 4.35, "valid_perplexity": 77.5, "position": {"slope_0": 0.5}}
//
// A line for every log point and validation point, in step order: "loss" is the mean
// training loss since the previous log point (present at log points), "valid_loss" and the
// position method's logged values at validation points; "tokens" counts training tokens
// seen, "seconds" training time (validation excluded), "time" the Unix time of the line.
//
// Each line is appended with one write and made durable (fdatasync) before training goes on.
// Opening the log for a run that continues from a checkpoint at step S keeps every whole record
// of a step up to S, in increasing step order, and cuts the lines written after that checkpoint
// and a torn last line, so after kill -9 and --resume each step is there once, as in an
// uninterrupted run. Only the lines' timing fields (tokens_per_second, seconds, time) can differ.
// A line the log cannot keep (blank, not a record, a step repeated or out of order: an edited or
// concatenated log) is skipped, never the valid lines after it, and skipped_text() names it;
// the kept lines then replace the file in one rename. A record the log lacks (lines deleted or
// the file truncated by hand) that the checkpoint holds goes back in from the checkpoint's
// curves, with what they hold, marked "restored": true, and restored_text() names the steps.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <vector>

namespace extrap {

class MetricsLog {
 public:
  // Opens (creates) `path` for a run continuing from `step` (0: from the start). `saved`: the
  // records the checkpoint at `step` can rebuild, in step order (each an object with an integer
  // "step"), which go in where the file lacks their step.
  MetricsLog(const std::filesystem::path& path, int64_t step, const std::vector<nlohmann::ordered_json>& saved = {});
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  // Appends `record` (an object with an integer "step") as one durable line; a write that
  // fails is a ConfigError naming the file and the reason (the lines before stay whole).
  void append(const nlohmann::ordered_json& record);

  const std::filesystem::path& path() const { return path_; }
  // What opening skipped ("" when nothing): "PATH: skipped 2 line(s) ...: line 5 (blank), ...".
  std::string skipped_text() const;
  // What opening restored ("" when nothing): "PATH: the records of 3 step(s) were missing (20-60) ...".
  const std::string& restored_text() const { return restored_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<std::string> skipped_;  // "line 5 (blank)", one a skipped line
  std::string restored_;
};

// The lines of a metrics log, parsed; a line that is not a JSON object with an integer "step"
// is a ConfigError naming the file and the line number.
std::vector<nlohmann::json> read_metrics(const std::filesystem::path& path);

}  // namespace extrap
