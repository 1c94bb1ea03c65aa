// What a run directory keeps besides its checkpoint: RUN/metrics.jsonl (a line per log and
// validation point, whole and each step once after kill -9 and --resume), RUN/eval.json and
// `train --json` (the evaluation after training), and the TensorBoard conversion of the log.
#include <catch2/catch.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/base/files.h"
#include "core/eval/evaluator.h"
#include "core/run/metrics_log.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace extrap;
using namespace extrap::testing;

namespace {

// Log points every 5 steps, validation every 10, checkpoints every 3: a resumption from a
// checkpoint lands between log points, where the loss of the steps since the last one counts.
const char* const kLoggedRun = R"(data: {path: corpus, tokenizer: byte, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: kerple_log
train: {seq_len: 16, batch_tokens: 256, steps: 20, lr: 0.003, warmup: 2, validate_every: 10,
        validate_tokens: 512, checkpoint_every: 3, log_every: 5, threads: 1, out_dir: runs/a}
eval: {lengths: [16, 32], max_tokens: 512}
)";

// A metrics line without what depends on the clock.
json without_timing(json record) {
  for (const char* key : {"tokens_per_second", "seconds", "time"}) {
    REQUIRE(record.contains(key));
    record.erase(key);
  }
  return record;
}

std::vector<json> timeless_metrics(const fs::path& path) {
  std::vector<json> lines;
  for (const json& record : read_metrics(path)) lines.push_back(without_timing(record));
  return lines;
}

// The logged run trained straight in runs/a, and the command that trains it again in runs/b,
// without and with --resume.
struct LoggedRuns {
  std::vector<std::string> b, b_resume;
};
LoggedRuns train_logged_runs(const SweepDir& d) {
  write_text(d.root / "train.yaml", kLoggedRun);
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--no-eval"}) == 0);
  LoggedRuns runs;
  runs.b = {"train", "--config", "train.yaml", "--no-eval", "--set", "train.out_dir=runs/b"};
  runs.b_resume = runs.b;
  runs.b_resume.push_back("--resume");
  return runs;
}

}  // namespace

TEST_CASE("train writes metrics.jsonl, eval.json and --json, and they agree with the run",
          "[cli][run_logs]") {
  SweepDir d;
  write_text(d.root / "train.yaml", kLoggedRun);
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--json", "train.json"}) == 0);

  auto [corpus, run] = load_cli_run(d, "runs/a");
  // A line at each log point (5, 10, 15, 20), validation at 10 and 20.
  const auto lines = read_metrics(d.root / "runs/a/metrics.jsonl");
  REQUIRE(lines.size() == 4);
  const json summary = read_json(d.root / "train.json");
  const json& train_curve = summary.at("train_curve");
  const json& valid_curve = summary.at("valid_curve");
  REQUIRE(train_curve.size() == 4);
  REQUIRE(valid_curve.size() == 2);
  for (size_t i = 0; i < lines.size(); ++i) {
    const json& line = lines[i];
    const int64_t step = 5 * int64_t(i + 1);
    INFO("line " << i + 1);
    CHECK(line.at("step") == step);
    CHECK(line.at("tokens") == step * 256);  // 16 sequences of 16 tokens a step
    CHECK(line.at("loss").get<double>() == train_curve[i][1].get<double>());
    CHECK(line.at("lr").get<double>() == learning_rate(run.config.train, step));
    CHECK(line.at("tokens_per_second").get<double>() > 0);
    const bool validated = step % 10 == 0;
    CHECK(line.contains("valid_loss") == validated);
    // kerple_log logs its learned parameters at validation points.
    CHECK(line.contains("position") == validated);
    if (validated) {
      CHECK(line.at("valid_loss").get<double>() == valid_curve[step / 10 - 1][1].get<double>());
      CHECK(line.at("valid_perplexity").get<double>() ==
            Approx(std::exp(line.at("valid_loss").get<double>())).epsilon(1e-12));
      CHECK(!line.at("position").empty());
    }
  }

  // The last validation loss is the checkpoint's validation, evaluated here in-process.
  EvalSpec spec;
  spec.length = 16;
  spec.max_tokens = 512;
  const auto r = evaluate(run.model, corpus, corpus.valid, spec);
  CHECK(lines.back().at("valid_loss").get<double>() ==
        Approx(r.nll_sum / double(r.scored_tokens)).epsilon(1e-9));

  // RUN/eval.json is the evaluation --json holds: each length once, non-overlapping.
  const json evaluation = read_json(d.root / "runs/a/eval.json");
  CHECK(summary.at("evaluation") == evaluation);
  CHECK(evaluation.at("step") == 20);
  const json& rows = evaluation.at("results");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].at("length") == 16);
  CHECK(rows[1].at("length") == 32);
  CHECK(rows[0].at("status") == "ok");
  // At L = 16 the evaluation is the validation's windows: the same tokens, the same loss.
  CHECK(rows[0].at("nll_sum").get<double>() == Approx(r.nll_sum).epsilon(1e-9));
  CHECK(summary.at("steps") == 20);
  CHECK(summary.at("tokens") == 20 * 256);
  CHECK(summary.at("parameters").get<int64_t>() == run.model->num_parameters());

  // --no-eval keeps no evaluation; training the model again removes the stale eval.json.
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--overwrite", "--no-eval", "--json",
                      "again.json"}) == 0);
  CHECK(!fs::exists(d.root / "runs/a/eval.json"));
  CHECK(read_json(d.root / "again.json").at("evaluation").is_null());
  CHECK(timeless_metrics(d.root / "runs/a/metrics.jsonl").size() == 4);  // not 8
}

TEST_CASE("metrics.jsonl after two kill -9s and resumptions is the uninterrupted run's",
          "[cli][run_logs]") {
  SweepDir d;
  const auto [b, b_resume] = train_logged_runs(d);

  // Killed after step 7 (its last checkpoint is step 6, its last line step 5), then resumed and
  // killed after step 13 (checkpoint 12, line 10), when line 10 and more were written.
  kill_at(d, b, "step@ step 7 rank:1");
  CHECK(timeless_metrics(d.root / "runs/b/metrics.jsonl").size() == 1);
  kill_at(d, b_resume, "step@ step 13 rank:1");
  // A line torn by the kill (as a crash in the middle of a write would leave it) is cut too.
  {
    std::ofstream torn(d.root / "runs/b/metrics.jsonl", std::ios::app);
    torn << "{\"step\":14,\"loss\":4.2";
  }
  REQUIRE(run_cli(d, b_resume) == 0);

  const auto a = timeless_metrics(d.root / "runs/a/metrics.jsonl");
  const auto resumed = timeless_metrics(d.root / "runs/b/metrics.jsonl");
  REQUIRE(a.size() == 4);
  REQUIRE(resumed.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("line " << i + 1);
    CHECK(resumed[i] == a[i]);  // losses bit for bit: the same steps averaged
  }
  // The curves the checkpoint keeps (the report's) are the uninterrupted run's too.
  const VerifiedCheckpoint ca = require_checkpoint(d.root / "runs/a");
  const VerifiedCheckpoint cb = require_checkpoint(d.root / "runs/b");
  REQUIRE(ca.state.train_curve.size() == cb.state.train_curve.size());
  for (size_t i = 0; i < ca.state.train_curve.size(); ++i) {
    CHECK(ca.state.train_curve[i].step == cb.state.train_curve[i].step);
    CHECK(ca.state.train_curve[i].loss == cb.state.train_curve[i].loss);
  }
  REQUIRE(ca.state.valid_curve.size() == cb.state.valid_curve.size());
  for (size_t i = 0; i < ca.state.valid_curve.size(); ++i)
    CHECK(ca.state.valid_curve[i].loss == cb.state.valid_curve[i].loss);
}

TEST_CASE("a metrics log keeps the whole lines up to the step it continues from",
          "[run_logs]") {
  TempDir d("metrics");
  const fs::path path = d.root / "metrics.jsonl";
  {
    MetricsLog log(path, 0);
    for (int step : {5, 10, 15}) log.append({{"step", step}, {"loss", 1.0 / step}});
  }
  CHECK(read_metrics(path).size() == 3);
  // Continuing from step 12: lines 5 and 10 stay, 15 goes; new lines follow.
  {
    MetricsLog log(path, 12);
    log.append({{"step", 15}, {"loss", 0.5}});
  }
  auto lines = read_metrics(path);
  REQUIRE(lines.size() == 3);
  CHECK(lines[1].at("step") == 10);
  CHECK(lines[2].at("loss") == 0.5);
  // A torn last line is cut without a word; step 0 starts afresh.
  write_text(path, read_text(path) + "{\"step\": 20, \"lo");
  {
    MetricsLog log(path, 100);
    CHECK(log.skipped_text().empty());
  }
  CHECK(read_metrics(path).size() == 3);
  { MetricsLog log(path, 0); }
  CHECK(read_text(path).empty());
}

TEST_CASE("a metrics log keeps every valid line after a malformed one, and names what it skipped",
          "[run_logs]") {
  TempDir d("metrics");
  const fs::path path = d.root / "metrics.jsonl";
  // A blank line, garbage, a duplicated line and one out of order, between valid lines; a line
  // written after the checkpoint (step 40) and a torn last line.
  write_text(path,
             "{\"step\": 5}\n\n{\"step\": 10}\ngarbage\n{\"step\": 10}\n{\"step\": 15}\n{\"step\": 12}\n"
             "{\"step\": 20, \"loss\": 2}\n{\"step\": 40}\n{\"step\": 45");
  std::string skipped;
  {
    MetricsLog log(path, 30);
    skipped = log.skipped_text();
    log.append({{"step", 35}});
  }
  const auto lines = read_metrics(path);
  std::vector<int64_t> steps;
  for (const auto& line : lines) steps.push_back(line.at("step").get<int64_t>());
  CHECK(steps == std::vector<int64_t>{5, 10, 15, 20, 35});
  CHECK(lines[3].at("loss") == 2);
  CHECK_THAT(skipped, Catch::Contains("metrics.jsonl: skipped 4 line(s)") &&
                          Catch::Contains("line 2 (blank)") && Catch::Contains("line 4 (not a metrics record)") &&
                          Catch::Contains("line 5 (step 10 again)") && Catch::Contains("line 7 (step 12 after step 15)"));
  CHECK(skipped.find("line 9") == std::string::npos);  // written after the checkpoint: cut, not skipped
  // Nothing skipped: the file is the kept lines, and nothing is said.
  {
    MetricsLog log(path, 35);
    CHECK(log.skipped_text().empty());
  }
  CHECK(read_metrics(path).size() == 5);
  // A reader names the file and line of a line that is not a record.
  write_text(path, "{\"step\": 5}\n[1, 2]\n");
  CHECK_THROWS_WITH(read_metrics(path),
                    Catch::Contains("metrics.jsonl: line 2 is not a metrics record"));
}

TEST_CASE("a run resumed with its checkpoint gone trains it from step 0 and says so in one line",
          "[cli][run_logs]") {
  SweepDir d;
  write_text(d.root / "train.yaml", kLoggedRun);
  const std::vector<std::string> resume = {"train", "--config", "train.yaml", "--no-eval", "--resume"};
  std::string out;
  // A fresh directory: --resume starts it, with nothing to say.
  REQUIRE(run_cli(d, resume, &out) == 0);
  CHECK(out.find("no checkpoint") == std::string::npos);
  const auto straight = timeless_metrics(d.root / "runs/a/metrics.jsonl");
  REQUIRE(straight.size() == 4);
  // The checkpoint deleted: trained again from step 0, said once, the log the same as before.
  remove_tree(d.root / "runs/a/checkpoint");
  remove_tree(d.root / "runs/a/checkpoint.old");
  REQUIRE(run_cli(d, resume, &out) == 0);
  CHECK_THAT(out, Catch::Contains("runs/a has no checkpoint to resume from") &&
                      Catch::Contains("metrics.jsonl has records up to step 20") &&
                      Catch::Contains("it trains from step 0, and that log starts again"));
  CHECK(timeless_metrics(d.root / "runs/a/metrics.jsonl") == straight);
}

// metrics.jsonl edited by hand before --resume: the lines the checkpoint's curves hold come back
// (marked, with what the curves know), and the run says which steps it restored.
TEST_CASE("a metrics log cut by hand gets its lines back from the checkpoint on --resume, and says so",
          "[cli][run_logs]") {
  SweepDir d;
  const auto [b, b_resume] = train_logged_runs(d);
  // Killed after step 13: checkpoint 12, lines of steps 5 and 10. The log then loses both.
  kill_at(d, b, "step@ step 13 rank:1");
  const fs::path log = d.root / "runs/b/metrics.jsonl";
  REQUIRE(timeless_metrics(log).size() == 2);
  write_text(log, "");
  std::string out;
  REQUIRE(run_cli(d, b_resume, &out) == 0);
  CHECK_THAT(out, Catch::Contains("metrics.jsonl: the records of 2 step(s) were missing (5-10): restored from "
                                  "the checkpoint's curves"));
  const auto a = timeless_metrics(d.root / "runs/a/metrics.jsonl");
  const auto resumed = read_metrics(log);
  REQUIRE(a.size() == 4);
  REQUIRE(resumed.size() == a.size());
  for (size_t i = 0; i < 2; ++i) {  // steps 5 and 10: what the curves hold, bit for bit
    INFO("line " << i + 1);
    CHECK(resumed[i].at("restored") == true);
    json expected = a[i];
    expected.erase("position");  // the method's logged values are not in the curves
    json got = resumed[i];
    got.erase("restored");
    CHECK(got == expected);
  }
  for (size_t i = 2; i < 4; ++i) CHECK(without_timing(resumed[i]) == a[i]);
  // Resumed again with nothing missing: nothing restored, nothing said.
  REQUIRE(run_cli(d, b_resume, &out) == 0);
  CHECK(out.find("missing") == std::string::npos);
  CHECK(read_metrics(log) == resumed);
}

// The same for a sweep's point: a sweep that grows needs the checkpoint to evaluate the new
// lengths; gone, the point trains again from step 0, says so, and its log starts again rather than
// mixing the old lines with the new.
TEST_CASE("a sweep point whose checkpoint is gone trains again from step 0, says so, and its log starts again",
          "[cli][run_logs][sweep]") {
  SweepDir d;
  const std::vector<std::string> one = {"grid.position=[{name: alibi}]", "grid.train.seed=[1]",
                                        "eval.length_multiples=[1]", "eval.strides=[]",
                                        "eval.attention_profile=false"};
  std::string out;
  REQUIRE(run_cli(d, sweep_with(one), &out) == 0);
  const fs::path run = d.root / "runs/tiny/alibi-seed1";
  const auto straight = timeless_metrics(run / "metrics.jsonl");
  REQUIRE(straight.size() >= 2);
  remove_tree(run / "checkpoint");
  remove_tree(run / "checkpoint.old");
  std::vector<std::string> longer = one;
  longer.push_back("eval.length_multiples=[1, 2]");
  REQUIRE(run_cli(d, sweep_with(longer), &out) == 0);
  CHECK_THAT(out, Catch::Contains("runs/tiny/alibi-seed1 has no checkpoint to resume from") &&
                      Catch::Contains("it trains from step 0, and that log starts again"));
  CHECK(timeless_metrics(run / "metrics.jsonl") == straight);  // each step once, as trained
}

TEST_CASE("metrics_to_tensorboard.py writes the log as TensorBoard reads it back", "[cli][run_logs]") {
  SweepDir d;
  write_text(d.root / "train.yaml", kLoggedRun);
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--no-eval"}) == 0);
  write_text(d.root / "check.py", R"(import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
lines = [json.loads(l) for l in open("runs/a/metrics.jsonl")]
acc = EventAccumulator("tb/a"); acc.Reload()
tags = set(acc.Tags()["scalars"])
expect = {"train/loss": "loss", "train/lr": "lr", "valid/loss": "valid_loss",
          "train/tokens": "tokens", "valid/perplexity": "valid_perplexity"}
for tag, key in expect.items():
    want = [(l["step"], l[key]) for l in lines if key in l]
    got = [(e.step, e.value) for e in acc.Scalars(tag)]
    assert [s for s, _ in got] == [s for s, _ in want], (tag, got, want)
    for (_, g), (_, w) in zip(got, want):
        assert abs(g - w) <= 1e-6 * max(1.0, abs(w)), (tag, g, w)
positions = sorted(t for t in tags if t.startswith("position/"))
assert positions, tags
print("checked", len(expect) + len(positions), "scalars")
)");
  const std::string script = std::string(EXTRAP_SOURCE_DIR) + "/analysis/metrics_to_tensorboard.py";
  std::string out;
  REQUIRE(run_python(d, script + " runs/a --out tb", &out) == 0);
  REQUIRE(run_python(d, "check.py", &out) == 0);
  CHECK_THAT(out, Catch::Contains("checked"));
  // Converting again replaces the run's events instead of adding a second curve.
  REQUIRE(run_python(d, script + " runs --out tb", &out) == 0);
  REQUIRE(run_python(d, "check.py", &out) == 0);
  // A directory without logs is refused by name.
  fs::create_directories(d.root / "empty");
  CHECK(run_python(d, script + " empty --out tb", &out) == 1);
  CHECK_THAT(out, Catch::Contains("empty: holds no metrics.jsonl"));
}
