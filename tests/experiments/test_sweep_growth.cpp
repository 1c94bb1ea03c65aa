// Sweeps that grow: a point is its grid values, so adding seeds, methods, evaluation lengths or
// modes to a finished sweep trains and evaluates only what is new, into the same results file,
// which then equals the file of the final sweep run at once (numbers bit for bit); shrinking
// keeps what was recorded; kill -9 while growing loses nothing; other changes are refused.
#include <catch2/catch.hpp>
#include <filesystem>

#include "core/results/results_store.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using namespace extrap;
using namespace extrap::testing;

namespace {

// Two results files hold the same sweep: header spec, runs (grid values, place, status,
// curves) and points (every number bit for bit); times, machines and row order aside.
void require_same_results(const fs::path& a_path, const fs::path& b_path) {
  const ResultsStore a = ResultsStore::open(a_path.string());
  const ResultsStore b = ResultsStore::open(b_path.string());
  CHECK(a.header().spec_hash == b.header().spec_hash);
  CHECK(a.header().sweep_spec == b.header().sweep_spec);
  REQUIRE(a.runs().size() == b.runs().size());
  for (const auto& [id, run] : a.runs()) {
    INFO("run " << id);
    const RunRecord* other = b.run(id);
    REQUIRE(other != nullptr);
    CHECK(run.grid_point == other->grid_point);
    CHECK(run.point_index == other->point_index);
    CHECK(run.status == other->status);
    CHECK(run.config == other->config);
    REQUIRE(run.train_loss.size() == other->train_loss.size());
    for (size_t i = 0; i < run.train_loss.size(); ++i)
      CHECK(run.train_loss[i].loss == other->train_loss[i].loss);
    REQUIRE(run.valid_loss.size() == other->valid_loss.size());
    for (size_t i = 0; i < run.valid_loss.size(); ++i)
      CHECK(run.valid_loss[i].loss == other->valid_loss[i].loss);
  }
  REQUIRE(a.points().size() == b.points().size());
  for (const auto& p : a.points()) {
    INFO("point " << p.run_id << " " << p.mode << " " << p.eval_length);
    const PointRecord* q = b.point(p.run_id, p.mode, p.eval_length);
    REQUIRE(q != nullptr);
    CHECK(p.status == q->status);
    CHECK(p.scored_tokens == q->scored_tokens);
    CHECK(p.stride == q->stride);
    if (is_profile_mode(p.mode)) {  // no perplexity: where the model looks, bin by bin
      REQUIRE(p.attention_profile.size() == q->attention_profile.size());
      for (size_t i = 0; i < p.attention_profile.size(); ++i) {
        CHECK(p.attention_profile[i].end == q->attention_profile[i].end);
        CHECK(p.attention_profile[i].mass == q->attention_profile[i].mass);
        CHECK(p.attention_profile[i].entropy == q->attention_profile[i].entropy);
      }
    } else {
      CHECK(p.nll_sum == q->nll_sum);
      CHECK(p.perplexity == q->perplexity);
    }
    REQUIRE(p.by_position.size() == q->by_position.size());
    for (size_t i = 0; i < p.by_position.size(); ++i)
      CHECK(p.by_position[i].nll_sum == q->by_position[i].nll_sum);
  }
}

const std::vector<std::string> kOneAlibi = {"grid.position=[{name: alibi}]", "grid.train.seed=[1]",
                                            "eval.length_multiples=[1]", "eval.strides=[]"};

}  // namespace

TEST_CASE("growing a sweep runs only the new points and evaluations, and equals the sweep run "
          "at once",
          "[sweep][growth]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, sweep_with(kOneAlibi), &out) == 0);
  // Each run: non-overlapping windows and the attention profile, at L.
  CHECK_THAT(out, Catch::Contains("1 points (0 already complete, 1 trained now), 2 evaluations"));
  const std::string manifest = read_text(d.root / "runs/tiny/alibi-seed1/checkpoint/manifest.json");

  // A seed.
  std::vector<std::string> grown = kOneAlibi;
  grown[1] = "grid.train.seed=[1, 2]";
  REQUIRE(run_cli(d, sweep_with(grown), &out) == 0);
  CHECK_THAT(out, Catch::Contains("2 points (1 already complete, 1 trained now), 2 evaluations"));
  // A method, first on its axis: the recorded points keep their ids and take their new places.
  grown[0] = "grid.position=[{name: rotary}, {name: alibi}]";
  REQUIRE(run_cli(d, sweep_with(grown), &out) == 0);
  CHECK_THAT(out, Catch::Contains("4 points (2 already complete, 2 trained now), 4 evaluations"));
  // An evaluation length: every run evaluated again from its finished checkpoint, none trained
  // (and profiled at its new longest length).
  grown[2] = "eval.length_multiples=[1, 2]";
  REQUIRE(run_cli(d, sweep_with(grown), &out) == 0);
  CHECK_THAT(out, Catch::Contains("4 points (0 already complete, 0 trained now, 4 from finished "
                                  "checkpoints), 8 evaluations"));
  // A mode (sliding windows of stride 8).
  grown[3] = "eval.strides=[8]";
  REQUIRE(run_cli(d, sweep_with(grown), &out) == 0);
  CHECK_THAT(out, Catch::Contains("4 points (0 already complete, 0 trained now, 4 from finished "
                                  "checkpoints), 8 evaluations"));
  // Nothing more to do.
  REQUIRE(run_cli(d, sweep_with(grown), &out) == 0);
  CHECK_THAT(out, Catch::Contains("4 points (4 already complete, 0 trained now), 0 evaluations"));

  // The first run was never trained again, and no other run directory was made.
  CHECK(read_text(d.root / "runs/tiny/alibi-seed1/checkpoint/manifest.json") == manifest);
  std::set<std::string> dirs;
  for (const auto& e : fs::directory_iterator(d.root / "runs/tiny")) dirs.insert(e.path().filename().string());
  CHECK(dirs == std::set<std::string>{"alibi-seed1", "alibi-seed2", "rotary-seed1", "rotary-seed2"});

  // The same sweep run at once, elsewhere: the same file.
  SweepDir fresh;
  REQUIRE(run_cli(fresh, sweep_with(grown), &out) == 0);
  CHECK_THAT(out, Catch::Contains("4 points (0 already complete, 4 trained now), 24 evaluations"));
  require_same_results(d.root / "results/tiny.h5", fresh.root / "results/tiny.h5");
}

TEST_CASE("a shrunk sweep keeps its recorded points, kill -9 while growing loses nothing, and "
          "other changes are refused",
          "[sweep][growth]") {
  SweepDir d;
  std::string out;
  std::vector<std::string> two = kOneAlibi;
  two[1] = "grid.train.seed=[1, 2]";
  REQUIRE(run_cli(d, sweep_with(two), &out) == 0);
  const fs::path results = d.root / "results/tiny.h5";
  const size_t recorded = ResultsStore::open(results.string()).points().size();

  // Fewer seeds: nothing runs, nothing recorded goes; --status says what is kept.
  REQUIRE(run_cli(d, sweep_with(kOneAlibi), &out) == 0);
  CHECK_THAT(out, Catch::Contains("1 points (1 already complete, 0 trained now), 0 evaluations"));
  CHECK(ResultsStore::open(results.string()).points().size() == recorded);
  std::vector<std::string> status = sweep_with(kOneAlibi);
  status.push_back("--status");
  REQUIRE(run_cli(d, status, &out) == 0);
  CHECK_THAT(out, Catch::Contains("(1 recorded point(s) no longer in the grid kept)"));
  CHECK_THAT(out, Catch::Contains("\nalibi-seed1  [complete, 2/2 evals]"));

  // Three seeds, killed right after the first new point is recorded, then run again.
  std::vector<std::string> three = kOneAlibi;
  three[1] = "grid.train.seed=[1, 2, 3]";
  const auto stops = kill_at(d, sweep_with(three), "point:1");
  CHECK(stops[0].detail == "alibi-seed3 nonoverlapping 16");
  REQUIRE(run_cli(d, sweep_with(three), &out) == 0);  // its profile from the finished checkpoint
  CHECK_THAT(out, Catch::Contains("3 points (2 already complete, 0 trained now, 1 from finished "
                                  "checkpoints), 1 evaluations"));
  SweepDir fresh;
  REQUIRE(run_cli(fresh, sweep_with(three), &out) == 0);
  require_same_results(results, fresh.root / "results/tiny.h5");

  // What is not growth: a base key, a new grid axis, another retrieval setting.
  const std::string before = read_text(results);
  std::vector<std::string> other = three;
  other.push_back("base.train.lr=0.001");
  CHECK(run_cli(d, sweep_with(other), &out) == 2);
  require_one_line_error(out, "holds the results of a different sweep (first difference at "
                              "'base.train.lr'");
  other = three;
  other.push_back("grid.model.layers=[1, 2]");
  CHECK(run_cli(d, sweep_with(other), &out) == 2);
  require_one_line_error(out, "first difference at 'grid keys");
  CHECK(read_text(results) == before);
}

TEST_CASE("the shards of a grown sweep merge into the results of its earlier stage, which then "
          "equal the grown sweep run at once",
          "[sweep][growth]") {
  SweepDir d;
  std::string out;
  const auto sharded = [](const std::vector<std::string>& overrides, const std::string& shard) {
    std::vector<std::string> args = sweep_with(overrides);
    args.insert(args.end(), {"--shard", shard});
    return args;
  };
  // The first stage, two seeds, as two shards merged (as `--slurm`'s jobs do).
  std::vector<std::string> first = kOneAlibi;
  first[1] = "grid.train.seed=[1, 2]";
  REQUIRE(run_cli(d, sharded(first, "0/2"), &out) == 0);
  REQUIRE(run_cli(d, sharded(first, "1/2"), &out) == 0);
  REQUIRE(run_cli(d, {"merge", "results/all.h5", "results/tiny.shard-0-of-2.h5",
                      "results/tiny.shard-1-of-2.h5"},
                  &out) == 0);
  // The grown sweep (a method first on its axis, an evaluation length) in three shards.
  std::vector<std::string> grown = first;
  grown[0] = "grid.position=[{name: rotary}, {name: alibi}]";
  grown[2] = "eval.length_multiples=[1, 2]";
  for (const char* shard : {"0/3", "1/3", "2/3"}) REQUIRE(run_cli(d, sharded(grown, shard), &out) == 0);
  const std::vector<std::string> stage2 = {"results/tiny.shard-0-of-3.h5", "results/tiny.shard-1-of-3.h5",
                                           "results/tiny.shard-2-of-3.h5"};

  // Shards of the two stages together are refused, saying what to do.
  CHECK(run_cli(d, {"merge", "results/mixed.h5", "results/tiny.shard-0-of-2.h5", stage2[0]}, &out) == 2);
  require_one_line_error(out, "they hold one sweep before and after it grew: merge the earlier "
                              "stage's shards first, then the later's");
  CHECK(!fs::exists(d.root / "results/mixed.h5"));
  // The earlier stage's file takes the grown sweep's shards and spec.
  std::vector<std::string> merge = {"merge", "results/all.h5"};
  merge.insert(merge.end(), stage2.begin(), stage2.end());
  REQUIRE(run_cli(d, merge, &out) == 0);
  CHECK_THAT(out, Catch::Contains("results/all.h5 now holds the shards' spec"));
  SweepDir fresh;
  REQUIRE(run_cli(fresh, sweep_with(grown), &out) == 0);
  require_same_results(d.root / "results/all.h5", fresh.root / "results/tiny.h5");
  // An earlier stage's shard merged late: the file keeps the later stage's spec (it took the
  // shard's before, rolling the sweep back).
  REQUIRE(run_cli(d, {"merge", "results/all.h5", "results/tiny.shard-1-of-2.h5"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("results/all.h5 holds a later stage of the sweep than these files"));
  require_same_results(d.root / "results/all.h5", fresh.root / "results/tiny.h5");
  // Another sweep is still refused.
  std::vector<std::string> other = kOneAlibi;
  other.insert(other.end(), {"base.train.lr=0.001", "output.run_root=runs/lr", "output.path=results/lr.h5"});
  REQUIRE(run_cli(d, sweep_with(other), &out) == 0);
  CHECK(run_cli(d, {"merge", "results/all.h5", "results/lr.h5"}, &out) == 2);
  require_one_line_error(out, "results/all.h5 holds the results of a different sweep (first difference "
                              "at 'base.train.lr'");
}

TEST_CASE("a results file of extrap 0.11 (numbered run ids) grows without training its points "
          "again",
          "[sweep][growth]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, sweep_with(kOneAlibi), &out) == 0);
  // The same run as 0.11 recorded it: id and run directory numbered by place in the grid.
  fs::rename(d.root / "runs/tiny/alibi-seed1", d.root / "runs/tiny/00-alibi-seed1");
  {
    const ResultsStore now = ResultsStore::open((d.root / "results/tiny.h5").string());
    RunRecord run = *now.run("alibi-seed1");
    run.run_id = "00-alibi-seed1";
    const std::string dir = "runs/tiny/alibi-seed1";
    REQUIRE(run.config.find(dir) != std::string::npos);
    run.config.replace(run.config.find(dir), dir.size(), "runs/tiny/00-alibi-seed1");
    std::vector<PointRecord> points = now.points();
    for (auto& p : points) p.run_id = run.run_id;
    ResultsStore old = ResultsStore::open_or_create((d.root / "results/old.h5").string(), now.header());
    old.write({run}, points);
  }
  std::vector<std::string> grown = kOneAlibi;
  grown[1] = "grid.train.seed=[1, 2]";
  std::vector<std::string> args = sweep_with(grown);
  args.insert(args.end(), {"--out", "results/old.h5"});
  REQUIRE(run_cli(d, args, &out) == 0);
  CHECK_THAT(out, Catch::Contains("2 points (1 already complete, 1 trained now), 2 evaluations"));
  // A new length: the recorded point is evaluated from its numbered run directory.
  grown[2] = "eval.length_multiples=[1, 2]";
  args = sweep_with(grown);
  args.insert(args.end(), {"--out", "results/old.h5"});
  REQUIRE(run_cli(d, args, &out) == 0);
  CHECK_THAT(out, Catch::Contains("2 points (0 already complete, 0 trained now, 2 from finished "
                                  "checkpoints), 4 evaluations"));
  std::set<std::string> dirs;
  for (const auto& e : fs::directory_iterator(d.root / "runs/tiny")) dirs.insert(e.path().filename().string());
  CHECK(dirs == std::set<std::string>{"00-alibi-seed1", "alibi-seed2"});
  const ResultsStore old = ResultsStore::open((d.root / "results/old.h5").string());
  CHECK(old.runs().size() == 2);
  CHECK(old.point("00-alibi-seed1", "nonoverlapping", 32) != nullptr);
  CHECK(old.point("alibi-seed2", "nonoverlapping", 32) != nullptr);
}
