// Sweeps end to end, through the `extrap` command line (EXTRAP_CLI): grid expansion, the HDF5
// schema as h5py sees it, kill -9 and resume, shards and merge, the writer lock, reports.
// Tiny models (1 layer, d_model 32, L = 16) on a tiny corpus in a temporary directory.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "core/eval/attention_profile.h"
#include "core/eval/evaluator.h"
#include "core/model/model.h"
#include "core/results/results_store.h"
#include "experiments/sweep/sweep.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using extrap::PointRecord;
using extrap::ResultsStore;
using extrap::sweep_part_files;
using namespace extrap::testing;

namespace {

// (run, mode, length) -> the point, for comparing files regardless of row order.
using Rows = std::map<std::tuple<std::string, std::string, int64_t>, PointRecord>;
Rows rows_of(const std::vector<PointRecord>& points) {
  Rows rows;
  for (const auto& p : points) rows[{p.run_id, p.mode, p.eval_length}] = p;
  return rows;
}

void require_same_rows(const Rows& a, const Rows& b) {
  REQUIRE(a.size() == b.size());
  for (const auto& [key, p] : a) {
    INFO(std::get<0>(key) << " " << std::get<1>(key) << " L=" << std::get<2>(key));
    REQUIRE(b.count(key) == 1);
    const PointRecord& q = b.at(key);
    CHECK(p.status == q.status);
    CHECK(p.scored_tokens == q.scored_tokens);
    if (p.ok() && !extrap::is_profile_mode(p.mode)) CHECK(p.nll_sum == Approx(q.nll_sum).epsilon(1e-12));
    CHECK(p.by_position.size() == q.by_position.size());  // the loss by position travels too
    REQUIRE(p.attention_profile.size() == q.attention_profile.size());  // so do profiles
    for (size_t i = 0; i < p.attention_profile.size(); ++i) {
      CHECK(p.attention_profile[i].begin == q.attention_profile[i].begin);
      CHECK(p.attention_profile[i].mass == Approx(q.attention_profile[i].mass).margin(1e-9));
      CHECK(p.attention_profile[i].entropy == Approx(q.attention_profile[i].entropy).margin(1e-9));
    }
  }
}

}  // namespace

TEST_CASE("extrap --version names the LibTorch the project's environment holds", "[cli]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  // The independent reference: the torch package of the project's Python, which
  // scripts/setup.sh built extrap against (e.g. "2.15.0+cu132"). Its CUDA line:
  // tests/runtime/test_cuda_support.cpp.
  const fs::path py_out = d.root / "torch_version.txt";
  REQUIRE(std::system((std::string(EXTRAP_PYTHON) +
                       " -c 'import torch; print(torch.__version__.split(\"+\")[0])' > " +
                       py_out.string())
                          .c_str()) == 0);
  std::istringstream versions(read_text(py_out));
  std::string torch_version;
  versions >> torch_version;
  CHECK(out.find("\nlibtorch: " + torch_version + "\n") != std::string::npos);  // headers == loaded
  CHECK(out.find("\nthreads: ") != std::string::npos);
  CHECK(out.find("\nblas: ") != std::string::npos);
  CHECK(out.find("\nblas: unknown") == std::string::npos);
}

TEST_CASE("sweep grid expansion: nested-loop order and count with overrides and strict keys",
          "[sweep]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list"}, &out) == 0);
  // Nested loops over the grid keys in file order, the last key fastest.
  // Ids name points by their grid values; `learned` with an option gets a hash of them.
  const std::vector<std::string> ids = sweep_ids(d);
  REQUIRE(ids.size() == 4);
  CHECK(ids[0] == "alibi-seed1");
  CHECK(ids[1] == "alibi-seed2");
  CHECK_THAT(ids[2], Catch::Matches("learned-seed1-h[0-9a-f]{8}"));
  CHECK_THAT(ids[3], Catch::Matches("learned-seed2-h[0-9a-f]{8}"));
  size_t at = 0;
  for (const auto& id : ids) {
    const auto found = out.find("\n" + id + "  ", at);
    INFO(id);
    REQUIRE(found != std::string::npos);
    at = found;
  }
  CHECK(out.find("4 of 4 points") != std::string::npos);
  CHECK(out.find("evals: 16/nonoverlapping 16/sliding_8 32/nonoverlapping 32/sliding_8 16/attention_profile "
                 "32/attention_profile\n") != std::string::npos);

  // --set on the grid (the key after "grid." is the dotted config key) and on the base.
  REQUIRE(run_cli(d,
                  {"sweep", "tiny.yaml", "--list", "--set", "grid.train.seed=[1,2,3]", "--set",
                   "grid.model.layers=[1,2]", "--set", "eval.lengths=[20]"},
                  &out) == 0);
  CHECK(out.find("12 of 12 points") != std::string::npos);
  CHECK(out.find("\nalibi-seed1-layers1  ") != std::string::npos);
  CHECK(out.find("\nalibi-seed1-layers2  ") != std::string::npos);
  CHECK(out.find("\nlearned-seed3-layers2-h") != std::string::npos);
  CHECK(out.find("evals: 16/nonoverlapping 16/sliding_8 20/nonoverlapping 20/sliding_8 32/") !=
        std::string::npos);

  // Shards: index % N == I.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--shard", "1/3"}, &out) == 0);
  CHECK(out.find("1 of 4 points") != std::string::npos);
  CHECK(out.find("\nalibi-seed2  ") != std::string::npos);

  // Unknown keys name the file, the line and the key.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.sq_len=[8]"}, &out) == 2);
  CHECK(out.find("key 'grid.train.sq_len' (set on the command line or by a sweep's grid): "
                 "unknown config key") != std::string::npos);
  std::ofstream(d.root / "typo.yaml") << kSweepFile << "evaluate: {lengths: [3]}\n";
  CHECK(run_cli(d, {"sweep", "typo.yaml", "--list"}, &out) == 2);
  CHECK(out.find("typo.yaml:18: key 'evaluate': unknown key") != std::string::npos);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "base.train.stepz=3"}, &out) == 2);
  CHECK(out.find("key 'train.stepz' (set on the command line or by a sweep's grid): unknown key") !=
        std::string::npos);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.position=[{name: alibii}]"},
                &out) == 2);
  CHECK(out.find("alibii") != std::string::npos);

  // An axis inside another would set one key twice, under the outer axis's label.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.position.name=[alibi]"}, &out) == 2);
  require_one_line_error(out, "key 'grid.position.name' (set on the command line or by a sweep's grid): lies inside "
                              "the axis 'position'");
  // Values written differently that resolve to one config: one model trained twice.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.seed=[1, +1]"}, &out) == 2);
  require_one_line_error(out, "grid points alibi-seed1 and alibi-seed+1 resolve to the same config");
  // A name that is a path would put the results and runs outside results/ and runs/.
  for (const char* name : {"../../evil", "a/b", ".hidden"}) {
    CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", std::string("name=") + name}, &out) == 2);
    require_one_line_error(out, std::string("key 'name' (set on the command line or by a sweep's grid): '") + name +
                                    "' is not a file name");
  }
  // An integer with a leading zero (yaml-cpp would read 010 as octal 8): refused, never trained as 8.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.seed=[8, 010]"}, &out) == 2);
  require_one_line_error(out, "(grid point alibi-seed010): key 'train.seed' (set on the command line or by a sweep's "
                              "grid): expected integer, got '010' (a leading zero");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.lr=[0.001, 1e-3]"}, &out) == 2);
  require_one_line_error(out, "resolve to the same config");
  // A grid too large to list (1001 x 1001 points).
  std::string counts;
  for (int v = 1; v <= 1001; ++v) counts.append(v > 1 ? "," : "").append(std::to_string(v));
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.steps=[" + counts + "]", "--set",
                    "grid.train.log_every=[" + counts + "]"}, &out) == 2);
  require_one_line_error(out, "more than 1000000 points");
  // A length multiple whose length does not fit in 64 bits (2^59 x 16 wraps negative): refused
  // naming the list, not evaluated at a wrapped length.
  for (const std::string& key : {std::string("eval.length_multiples"),
                                 std::string("eval.attention_profile.length_multiples")}) {
    CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", key + "=[1, 576460752303423488]"}, &out) == 2);
    require_one_line_error(out, key + ": 576460752303423488 x train.seq_len 16 is past a 64-bit token count");
  }
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set",
                    "eval.retrieval={task: passkey, length_multiples: [576460752303423489]}"}, &out) == 2);
  require_one_line_error(out, "eval.retrieval.length_multiples: 576460752303423489 x train.seq_len 16");
}

TEST_CASE("sweep grid: one layers axis lists points of other methods, options and patterns", "[sweep][pattern]") {
  SweepDir d;
  std::string text = kSweepFile;
  const std::string axis = "  position: [{name: alibi}, {name: learned, max_length: 24}]\n";
  REQUIRE(text.find(axis) != std::string::npos);
  text.replace(text.find(axis), axis.size(),
               "  layers: [{pattern: [alibi]},\n"
               "           {pattern: [rope_sink], kinds: {rope_sink: {position: rotary, attention: {sink: true}}}},\n"
               "           {pattern: [swa, swa, nope], kinds: {swa: {position: rotary, attention: {window: 4}},\n"
               "                                              nope: {position: none}}}]\n");
  text.replace(text.find("layers: 1,"), 10, "layers: 3,");
  std::ofstream(d.root / "layers.yaml") << text;
  const InDirectory in_directory(d);
  const auto points = extrap::expand_grid(extrap::load_sweep("layers.yaml", {}));
  REQUIRE(points.size() == 6);
  CHECK(points[0].id == "alibi-seed1");
  CHECK(points[3].id == "rope_sink-seed2");
  CHECK(points[4].id == "swa2+nope-seed1");
  CHECK(extrap::position_label(points[0].config) == "alibi");
  CHECK(extrap::position_label(points[2].config) == "rotary (sink)");
  CHECK(extrap::position_label(points[4].config) == "rotary (window 4) x2, none");
  // Patterns of the same kind names would share a run id: refused, naming it.
  CHECK_THROWS_WITH(extrap::expand_grid(extrap::load_sweep(
                        "layers.yaml", {"grid.layers=[{pattern: [a], kinds: {a: {position: alibi}}}, "
                                        "{pattern: [a], kinds: {a: {position: rotary}}}]"})),
                    Catch::Contains("two grid points would have the run id a-seed1"));
  // A kind's key is a grid axis of its own; a typo in a kind fails before anything runs.
  std::string kinds = kSweepFile;
  kinds.replace(kinds.find(axis), axis.size(), "  layers.kinds.swa.attention.window: [2, 8]\n");
  kinds.replace(kinds.find("  position: alibi\n"), 17,
                "  position: rotary\n  layers: {pattern: [swa, nope], kinds: {swa: {attention: {window: 4}}, nope: "
                "{position: none}}}\n");
  kinds.replace(kinds.find("layers: 1,"), 10, "layers: 2,");
  std::ofstream(d.root / "kinds.yaml") << kinds;
  const auto windows = extrap::expand_grid(extrap::load_sweep("kinds.yaml", {}));
  REQUIRE(windows.size() == 4);
  CHECK(windows[0].id == "window2-seed1");
  CHECK(extrap::position_label(windows[3].config) == "rotary (window 8), none");
  CHECK_THROWS_WITH(extrap::expand_grid(extrap::load_sweep("kinds.yaml", {"grid.layers.kinds.swa.atention=[{}]"})),
                    Catch::Contains("layers.kinds.swa.atention") && Catch::Contains("unknown key"));
}

TEST_CASE("sweep results file: the documented HDF5 schema as h5py reads it and a report from it",
          "[sweep]") {
  SweepDir d;
  // A --set that changes nothing still goes into the file's record of how it was run.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--set", "eval.strides=[8]"}) == 0);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  CHECK(store.runs().size() == 4);
  CHECK(store.points().size() == kPoints);
  size_t failed = 0;
  for (const auto& p : store.points()) failed += !p.ok();
  CHECK(failed == kFailedPoints);
  for (const auto& [id, run] : store.runs()) CHECK(run.status == "complete");

  // The project's environment (scripts/setup.sh) has h5py: required here.
  std::string out;
  std::string py_out;
  const int code =
      run_python(d, EXTRAP_SOURCE_DIR "/tests/experiments/check_schema.py results/tiny.h5 tiny.yaml", &py_out);
  INFO(py_out);
  REQUIRE(code == 0);

  // One row against an in-process evaluation of its run's checkpoint.
  {
    auto [corpus, run] = load_cli_run(d, "runs/tiny/alibi-seed1");
    REQUIRE(run.config.eval.split == extrap::Split::valid);
    const auto r = extrap::evaluate(run.model, corpus, corpus.valid, extrap::eval_spec_for(run.config, 32, 8));
    const PointRecord* row = nullptr;
    for (const auto& p : store.points())
      if (p.run_id == "alibi-seed1" && p.mode == "sliding_8" && p.eval_length == 32) row = &p;
    REQUIRE(row != nullptr);
    CHECK(row->scored_tokens == r.scored_tokens);
    CHECK(row->nll_sum == Approx(r.nll_sum).epsilon(1e-9));
  }

  REQUIRE(run_cli(d, {"report", "results/tiny.h5", "--out", "report"}, &out) == 0);
  const std::string md = read_text(d.root / "report/report.md");
  INFO(md);
  CHECK(md.find("| eval length | alibi | learned |") != std::string::npos);
  CHECK(md.find("| method | tokens/s | peak memory (MiB) |") != std::string::npos);
  for (const char* image : {"ppl_L16_nonoverlapping.png", "ppl_L16_sliding_8.png", "curves_L16.png"})
    CHECK(md.find(std::string("](") + image + ")") != std::string::npos);
  // Every cell and every plotted curve against the HDF5 rows (tests/experiments/check_report.py).
  std::string report_out;
  const int report_code = run_python(
      d, EXTRAP_SOURCE_DIR "/tests/experiments/check_report.py results/tiny.h5 report " EXTRAP_SOURCE_DIR, &report_out);
  INFO(report_out);
  CHECK(report_code == 0);
}

TEST_CASE("RoPE-scaling variants: listed for rotary points only, equal to none up to L, reported",
          "[sweep]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list"}, &out) == 0);
  const auto hash = [](const std::string& listing) {
    const auto at = listing.find("spec hash ");
    return listing.substr(at, 26);
  };
  const std::string plain_hash = hash(out);
  // Saying none changes nothing, not even the spec hash (files of older sweeps stay theirs).
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.rope_scaling=[none]"}, &out) == 0);
  CHECK(hash(out) == plain_hash);

  const std::vector<std::string> variants = {
      "--set", "grid.position=[{name: alibi}, {name: rotary}]", "--set", "grid.train.seed=[1]",
      "--set", "eval.rope_scaling=[none, linear, yarn]", "--set", "eval.strides=[]",
      "--set", "eval.attention_profile=false"};
  std::vector<std::string> list = {"sweep", "tiny.yaml", "--list"};
  list.insert(list.end(), variants.begin(), variants.end());
  REQUIRE(run_cli(d, list, &out) == 0);
  CHECK(hash(out) != plain_hash);
  CHECK(out.find("alibi-seed1  [pending, 0/2 evals]  {position: {name: alibi}, train.seed: 1}  evals: "
                 "16/nonoverlapping 32/nonoverlapping\n") != std::string::npos);
  CHECK(out.find("evals: 16/nonoverlapping 16/nonoverlapping+linear 16/nonoverlapping+yarn "
                 "32/nonoverlapping 32/nonoverlapping+linear 32/nonoverlapping+yarn\n") !=
        std::string::npos);
  list.push_back("--set");
  list.push_back("eval.rope_factor=4");
  REQUIRE(run_cli(d, list, &out) == 0);
  CHECK(out.find("16/nonoverlapping+yarn_x4 ") != std::string::npos);

  // Variants with no rotary point, a name that is not a variant: refused in one line.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.rope_scaling=[none, yarn]"},
                &out) == 2);
  CHECK(out.find("eval.rope_scaling asks for RoPE variants, but no grid point uses a method with "
                 "rotary angles") != std::string::npos);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.rope_scaling=[yarn2]"}, &out) ==
        2);
  CHECK(out.find("unknown RoPE scaling 'yarn2'") != std::string::npos);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.rope_factor=4"}, &out) == 2);
  CHECK(out.find("is set but eval.rope_scaling lists no variant to scale") != std::string::npos);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.rope_factor=0.5", "--set",
                    "eval.rope_scaling=[none, yarn]", "--set",
                    "grid.position=[{name: rotary}]"}, &out) == 2);
  CHECK(out.find("key 'eval.rope_factor' (set on the command line or by a sweep's grid): must be at least 1, got 0.5") != std::string::npos);

  std::vector<std::string> run = {"sweep", "tiny.yaml"};
  run.insert(run.end(), variants.begin(), variants.end());
  REQUIRE(run_cli(d, run, &out) == 0);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  CHECK(store.points().size() == 2 + 6);
  const auto nll = [&](const std::string& mode, int64_t length) {
    const PointRecord* p = store.point("rotary-seed1", mode, length);
    REQUIRE(p != nullptr);
    REQUIRE(p->ok());
    return p->nll_sum;
  };
  // At the training length the derived factor is 1: every variant is the trained rotation.
  CHECK(nll("nonoverlapping+linear", 16) == nll("nonoverlapping", 16));
  CHECK(nll("nonoverlapping+yarn", 16) == nll("nonoverlapping", 16));
  CHECK(nll("nonoverlapping+linear", 32) != nll("nonoverlapping", 32));
  CHECK(nll("nonoverlapping+yarn", 32) != nll("nonoverlapping", 32));

  // The report draws each variant as its own method.
  REQUIRE(run_cli(d, {"report", "results/tiny.h5", "--out", "report"}, &out) == 0);
  const std::string md = read_text(d.root / "report/report.md");
  INFO(md);
  CHECK(md.find("| eval length | alibi | rotary | rotary + linear | rotary + yarn |") !=
        std::string::npos);
}

TEST_CASE("StreamingLLM in sweeps: a mode per cache size at the lengths above it, the evaluator's "
          "numbers, a report section, refusals",
          "[sweep][streaming]") {
  SweepDir d;
  std::string out;
  const std::vector<std::string> streaming = {"--set", "grid.position=[{name: alibi}, {name: rotary}]",
                                              "--set", "grid.train.seed=[1]", "--set", "eval.strides=[]",
                                              "--set", "eval.streaming=[8, 16]", "--set", "eval.streaming_sinks=2",
                                              "--set", "eval.attention_profile=false"};
  std::vector<std::string> list = {"sweep", "tiny.yaml", "--list"};
  list.insert(list.end(), streaming.begin(), streaming.end());
  REQUIRE(run_cli(d, list, &out) == 0);
  // A cache of 16 holds a 16-token window whole (the plain evaluation): only at 32.
  CHECK(out.find("evals: 16/nonoverlapping 16/streaming_2_8 32/nonoverlapping 32/streaming_2_8 "
                 "32/streaming_2_16\n") != std::string::npos);

  // Refusals, naming the key.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.streaming=[4]", "--set",
                    "eval.streaming_sinks=4"}, &out) == 2);
  require_one_line_error(out, "cache size 4 must hold more than the 4 sinks");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.streaming_sinks=2"}, &out) == 2);
  require_one_line_error(out, "eval.streaming lists no cache size");

  std::vector<std::string> run = {"sweep", "tiny.yaml"};
  run.insert(run.end(), streaming.begin(), streaming.end());
  REQUIRE(run_cli(d, run, &out) == 0);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  CHECK(store.points().size() == 2 * 5);
  for (const std::string id : {"alibi-seed1", "rotary-seed1"}) {
    INFO(id);
    auto loaded = load_cli_run(d, "runs/tiny/" + id);
    for (const auto& [length, cache] : std::vector<std::pair<int64_t, int64_t>>{{16, 8}, {32, 8}, {32, 16}}) {
      const PointRecord* p = store.point(id, extrap::streaming_mode_name(2, cache), length);
      REQUIRE(p != nullptr);
      REQUIRE(p->ok());
      extrap::EvalSpec spec;
      spec.length = length;
      spec.max_tokens = 1024;
      spec.streaming = {2, cache};
      const extrap::EvalResult r = extrap::evaluate(loaded.run.model, loaded.corpus, loaded.corpus.valid, spec);
      CHECK(p->nll_sum == Approx(r.nll_sum).epsilon(1e-9));
      CHECK(p->scored_tokens == r.scored_tokens);
      CHECK(p->nll_sum != Approx(store.point(id, "nonoverlapping", length)->nll_sum).epsilon(1e-6));
    }
  }
  REQUIRE(run_cli(d, {"report", "results/tiny.h5", "--out", "report"}, &out) == 0);
  const std::string md = read_text(d.root / "report/report.md");
  INFO(md);
  CHECK(md.find("### Perplexity, StreamingLLM, a cache of 8 tokens with 2 sinks") != std::string::npos);
  CHECK(md.find("### Perplexity, StreamingLLM, a cache of 16 tokens with 2 sinks") != std::string::npos);
}

namespace {

// The key tokens that `selector`'s long (T) and short (K, each target with its own last K
// tokens) NLLs pick, and `scored`'s NLL summed over them, written from the definition: a target
// with more than K tokens of context (a candidate) whose NLL drops by more than alpha with the
// whole window and whose log-probability is above beta.
struct Keys {
  int64_t candidates = 0, count = 0;
  double nll_sum = 0;
};
Keys key_tokens_by_definition(const extrap::EvalResult& selector_long,
                              const extrap::EvalResult& selector_short,
                              const extrap::EvalResult& scored, int64_t k, double alpha, double beta) {
  const auto long_nll = selector_long.token_nll.accessor<double, 1>();
  const auto long_position = selector_long.token_position.accessor<int64_t, 1>();
  const auto short_nll = selector_short.token_nll.accessor<double, 1>();
  const auto short_position = selector_short.token_position.accessor<int64_t, 1>();
  const auto nll = scored.token_nll.accessor<double, 1>();
  Keys keys;
  for (int64_t i = 0; i < long_nll.size(0); ++i) {
    if (long_position[i] < k || short_position[i] != k - 1) continue;  // context K + 1 .. T
    ++keys.candidates;
    if (short_nll[i] - long_nll[i] > alpha && -long_nll[i] > beta) {
      ++keys.count;
      keys.nll_sum += nll[i];
    }
  }
  return keys;
}

}  // namespace

TEST_CASE("LongPPL in sweeps: each causal point's non-overlapping windows past K, the definition's "
          "key tokens (its own or a reference run's), a report section, growth and refusals",
          "[sweep][longppl]") {
  SweepDir d;
  std::string out;
  // alpha 0 (any gain): the tiny models barely use the far context, but have key tokens then.
  const std::vector<std::string> plan = {"--set", "grid.position=[{name: alibi}, {name: rotary}]",
                                         "--set", "grid.train.seed=[1]", "--set", "eval.longppl.alpha=0",
                                         "--set", "eval.longppl.beta=-10"};
  std::vector<std::string> args = {"sweep", "tiny.yaml"};
  args.insert(args.end(), plan.begin(), plan.end());
  REQUIRE(run_cli(d, args, &out) == 0);
  INFO(out);
  CHECK(out.find("L=32 nonoverlapping: perplexity ") != std::string::npos);
  CHECK(out.find(" key tokens") != std::string::npos);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  for (const auto& p : store.points())  // only non-overlapping windows past K = L = 16
    CHECK(p.longppl.has_value() == (p.mode == "nonoverlapping" && p.eval_length == 32));

  std::map<std::string, extrap::EvalResult> long_eval, short_eval;
  std::map<std::string, CliRun> runs;
  for (const std::string id : {"alibi-seed1", "rotary-seed1"}) {
    runs.emplace(id, load_cli_run(d, "runs/tiny/" + id));
    auto& run = runs.at(id);
    extrap::EvalSpec spec = extrap::eval_spec_for(run.run.config, 32);
    spec.keep_token_nll = true;
    long_eval[id] = extrap::evaluate(run.run.model, run.corpus, run.corpus.valid, spec);
    spec = extrap::eval_spec_for(run.run.config, 16, 1);
    spec.keep_token_nll = true;
    short_eval[id] = extrap::evaluate(run.run.model, run.corpus, run.corpus.valid, spec);
  }
  for (const std::string id : {"alibi-seed1", "rotary-seed1"}) {
    INFO(id);
    const PointRecord* p = store.point(id, "nonoverlapping", 32);
    REQUIRE(p != nullptr);
    REQUIRE(p->longppl.has_value());
    REQUIRE(p->longppl->ok());
    const Keys keys = key_tokens_by_definition(long_eval[id], short_eval[id], long_eval[id], 16, 0.0, -10);
    REQUIRE(keys.count > 0);
    CHECK(keys.count < keys.candidates);
    CHECK(keys.candidates > 400);  // about half of the 1023 targets
    CHECK(p->longppl->short_length == 16);
    CHECK(p->longppl->candidates == keys.candidates);
    CHECK(p->longppl->key_tokens == keys.count);
    CHECK(p->longppl->key_nll_sum == Approx(keys.nll_sum).epsilon(1e-9));
    CHECK(p->longppl->longppl() == Approx(std::exp(keys.nll_sum / double(keys.count))).epsilon(1e-9));
  }

  // The report: a LongPPL section whose every cell and curve check_report.py recomputes.
  REQUIRE(run_cli(d, {"report", "results/tiny.h5", "--out", "report"}, &out) == 0);
  const std::string md = read_text(d.root / "report/report.md");
  CHECK(md.find("### LongPPL (non-overlapping windows)") != std::string::npos);
  CHECK(md.find("](longppl_L16.png)") != std::string::npos);
  std::string row = "| 32 |";
  for (const std::string id : {"alibi-seed1", "rotary-seed1"}) {
    const extrap::LongPplRecord& l = *store.point(id, "nonoverlapping", 32)->longppl;
    char text[64];
    std::snprintf(text, sizeof text, " %.2f (%lld) |", std::exp(l.key_nll_sum / double(l.key_tokens)),
                  (long long)l.key_tokens);
    row += text;
  }
  CHECK(md.find(row) != std::string::npos);

  // One reference run selects every point's key tokens: rotary is scored on alibi's.
  std::vector<std::string> referenced = args;
  for (const char* set : {"output.path=results/ref.h5", "eval.longppl.reference=runs/tiny/alibi-seed1"})
    referenced.insert(referenced.end(), {"--set", set});
  REQUIRE(run_cli(d, referenced, &out) == 0);
  const ResultsStore ref = ResultsStore::open((d.root / "results/ref.h5").string());
  const Keys alibis = key_tokens_by_definition(long_eval["alibi-seed1"], short_eval["alibi-seed1"],
                                               long_eval["rotary-seed1"], 16, 0.0, -10);
  const PointRecord* rotary = ref.point("rotary-seed1", "nonoverlapping", 32);
  REQUIRE(rotary != nullptr);
  REQUIRE(rotary->longppl.has_value());
  CHECK(rotary->longppl->key_tokens == alibis.count);
  CHECK(rotary->longppl->key_nll_sum == Approx(alibis.nll_sum).epsilon(1e-9));
  const Keys own = key_tokens_by_definition(long_eval["rotary-seed1"], short_eval["rotary-seed1"],
                                            long_eval["rotary-seed1"], 16, 0.0, -10);
  CHECK((own.count != alibis.count || own.nll_sum != Approx(alibis.nll_sum).epsilon(1e-9)));
  CHECK(ref.point("alibi-seed1", "nonoverlapping", 32)->longppl->key_tokens == alibis.count);
  REQUIRE(run_cli(d, {"report", "results/ref.h5", "--out", "report_ref"}, &out) == 0);
  CHECK(read_text(d.root / "report_ref/report.md").find("selected by the run `runs/tiny/alibi-seed1`") !=
        std::string::npos);

}

TEST_CASE("LongPPL in sweeps: growth, the short form, and refusals naming the key", "[sweep][longppl]") {
  SweepDir d;
  std::string out;
  // A reference run for the refusals that read one.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "grid.position=[{name: alibi}]", "--set",
                      "grid.train.seed=[1]", "--set", "eval.strides=[]", "--set", "eval.attention_profile=false"},
                  &out) == 0);
  // Growth: a file without LongPPL takes it for the points still to come; recorded settings stay.
  std::vector<std::string> off = {"sweep", "tiny.yaml", "--set", "grid.train.seed=[1]", "--set",
                                  "output.path=results/grow.h5", "--set", "eval.longppl.enabled=false",
                                  "--set", "eval.length_multiples=[1, 2]"};
  REQUIRE(run_cli(d, off, &out) == 0);
  std::vector<std::string> grown = {"sweep", "tiny.yaml", "--set", "grid.train.seed=[1]", "--set",
                                    "output.path=results/grow.h5", "--set", "eval.length_multiples=[1, 2, 3]"};
  REQUIRE(run_cli(d, grown, &out) == 0);
  {
    const ResultsStore grow = ResultsStore::open((d.root / "results/grow.h5").string());
    CHECK_FALSE(grow.point("alibi-seed1", "nonoverlapping", 32)->longppl.has_value());
    CHECK(grow.point("alibi-seed1", "nonoverlapping", 48)->longppl.has_value());
  }
  grown.insert(grown.end(), {"--set", "eval.longppl.short_length=8"});
  CHECK(run_cli(d, grown, &out) == 2);
  require_one_line_error(out, "first difference at 'eval.longppl.short_length': 0 in results/grow.h5, 8 in");

  // `longppl: false` is short for enabled: false (the same spec), and turns it off.
  std::string short_form;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl=false"}, &short_form) == 0);
  CHECK(short_form.find("LongPPL in each") == std::string::npos);
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.enabled=false"}, &out) == 0);
  CHECK(short_form.substr(0, short_form.find('\n')) == out.substr(0, out.find('\n')));  // the spec hash
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list"}, &out) == 0);
  CHECK(out.find("LongPPL in each non-overlapping evaluation of a causal point past K = its train.seq_len") !=
        std::string::npos);

  // Refusals, naming the key.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl=often"}, &out) == 2);
  require_one_line_error(out, "key 'eval.longppl' (set on the command line or by a sweep's grid): expected true, "
                              "false or a map of key: value, got 'often'");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.reference=runs/none"}, &out) == 2);
  require_one_line_error(out, "key 'eval.longppl.reference'");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.alpha=.inf"}, &out) == 2);
  require_one_line_error(out, "key 'eval.longppl.alpha' (set on the command line or by a sweep's grid): "
                              "must be a finite number, got '.inf'");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.short_length=32"}, &out) == 2);
  require_one_line_error(out, "tiny.yaml: eval.longppl.short_length 32: K is not below any evaluation length of a "
                              "causal point, so no point would score LongPPL");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.short_length=-1"}, &out) == 2);
  require_one_line_error(out, "key 'eval.longppl.short_length'");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.enabled=false", "--set",
                    "eval.longppl.reference=runs/tiny/alibi-seed1"}, &out) == 2);
  require_one_line_error(out, "is set but eval.longppl.enabled is false");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.longppl.reference=runs/tiny/alibi-seed1",
                    "--set", "base.data.path=other_corpus"}, &out) == 2);
  require_one_line_error(out, "eval.longppl.reference runs/tiny/alibi-seed1 reads other data than grid point");
}

TEST_CASE("attention profiles in sweeps: each point at L and its longest length, the profile of the "
          "run's checkpoint, failures recorded, growth and refusals",
          "[sweep][profile]") {
  SweepDir d;
  std::string out;
  const std::vector<std::string> args = {"sweep", "tiny.yaml", "--set", "grid.train.seed=[1]"};
  REQUIRE(run_cli(d, args, &out) == 0);
  INFO(out);
  CHECK(out.find("L=32 attention_profile: 128 queries: mass past 16 ") != std::string::npos);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  std::set<std::tuple<std::string, int64_t, bool>> profiled;
  for (const auto& p : store.points())
    if (extrap::is_profile_mode(p.mode)) {
      profiled.insert({p.run_id, p.eval_length, p.ok()});
      CHECK(std::isnan(p.perplexity));
      CHECK(p.stride == p.eval_length);
    }
  // At L = 16 and at the longest evaluation length, 32; learned cannot read 32 tokens.
  const std::string learned = sweep_ids(d, "tiny.yaml", {"grid.train.seed=[1]"}).at(1);
  CHECK((profiled == std::set<std::tuple<std::string, int64_t, bool>>{
                         {"alibi-seed1", 16, true}, {"alibi-seed1", 32, true}, {learned, 16, true}, {learned, 32, false}}));
  CHECK(store.point(learned, extrap::kProfileMode, 32)->status.find("max_length") != std::string::npos);

  // The recorded rows are the profile of the run's checkpoint over the first 4 windows of the
  // valid split within eval.max_tokens, with an edge at L (the profile's own numbers are checked
  // against loops in tests/eval/test_attention_profile.cpp).
  CliRun run = load_cli_run(d, "runs/tiny/alibi-seed1");
  extrap::AttentionProfileSpec spec;
  spec.length = 32;
  spec.windows = 4;
  spec.max_tokens = 1024;
  spec.split_at = 16;
  const extrap::AttentionProfile expected = extrap::attention_profile(run.run.model, run.corpus.valid, spec);
  REQUIRE(expected.edges == std::vector<int64_t>{0, 1, 2, 4, 8, 16, 32});
  const PointRecord* p = store.point("alibi-seed1", extrap::kProfileMode, 32);
  REQUIRE(p != nullptr);
  CHECK(p->scored_tokens == 4 * 32);
  REQUIRE(p->attention_profile.size() == size_t(1 * 2 * 6));  // layers x heads x bins
  double total = 0;
  for (const auto& c : p->attention_profile) {
    INFO("layer " << c.layer << " head " << c.head << " bin " << c.begin << "-" << c.end);
    const auto bin = std::find(expected.edges.begin(), expected.edges.end(), c.begin) - expected.edges.begin();
    REQUIRE(size_t(bin) + 1 < expected.edges.size());
    CHECK(c.end == expected.edges[size_t(bin) + 1]);
    CHECK(c.mass == Approx(expected.mass[c.layer][c.head][bin].item<double>()).margin(1e-9));
    CHECK(c.entropy == Approx(expected.entropy[c.layer][c.head][bin].item<double>()).margin(1e-9));
    CHECK(c.sink == 0);
    total += c.mass;
  }
  CHECK(total == Approx(2.0).margin(1e-6));  // each head's weights sum to 1

  // A training length that is not a power of two is an edge of its own: the mass past L.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--set", "grid.position=[{name: alibi}]", "--set", "grid.train.seed=[1]",
                      "--set", "base.train.seq_len=12", "--set", "base.train.steps=4", "--set", "eval.strides=[]",
                      "--set", "output.path=results/l12.h5", "--set", "output.run_root=runs/l12"}, &out) == 0);
  // (The store outlives the pointer into it: a temporary's point() dangled, and the loop below
  // read freed memory, a Bus error in about 1 run in 10 under load.)
  const ResultsStore l12 = ResultsStore::open((d.root / "results/l12.h5").string());
  const PointRecord* at24 = l12.point("alibi-seed1", extrap::kProfileMode, 24);
  REQUIRE(at24 != nullptr);
  std::set<int64_t> begins;
  for (const auto& c : at24->attention_profile) begins.insert(c.begin);
  CHECK(begins == std::set<int64_t>{0, 1, 2, 4, 8, 12, 16});

  // Growth: a file without profiles takes them for the points still to come (and every
  // recorded point's longest length is new); the recorded windows stay.
  const std::vector<std::string> off = {"sweep", "tiny.yaml", "--set", "grid.train.seed=[1]", "--set",
                                        "output.path=results/grow.h5", "--set", "eval.attention_profile=false"};
  REQUIRE(run_cli(d, off, &out) == 0);
  CHECK(out.find("attention_profile") == std::string::npos);
  std::vector<std::string> grown = {"sweep", "tiny.yaml", "--set", "grid.train.seed=[1]", "--set",
                                    "output.path=results/grow.h5", "--set", "eval.length_multiples=[1, 2, 3]"};
  REQUIRE(run_cli(d, grown, &out) == 0);
  {
    const ResultsStore grow = ResultsStore::open((d.root / "results/grow.h5").string());
    CHECK(grow.point("alibi-seed1", extrap::kProfileMode, 16) != nullptr);
    CHECK(grow.point("alibi-seed1", extrap::kProfileMode, 48) != nullptr);
    CHECK(grow.point("alibi-seed1", extrap::kProfileMode, 32) == nullptr);
  }
  grown.insert(grown.end(), {"--set", "eval.attention_profile.windows=2"});
  CHECK(run_cli(d, grown, &out) == 2);
  require_one_line_error(out, "first difference at 'eval.attention_profile.windows': 4 in results/grow.h5, 2 in");
}

TEST_CASE("attention profiles in sweeps: lengths of one's own, the short form, refusals naming the key",
          "[sweep][profile]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.attention_profile.length_multiples=[2]"}, &out) == 0);
  CHECK(out.find("evals: 16/nonoverlapping 16/sliding_8 32/nonoverlapping 32/sliding_8 32/attention_profile\n") !=
        std::string::npos);
  std::string short_form;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.attention_profile=false"}, &short_form) == 0);
  CHECK(short_form.find("Attention profile") == std::string::npos);
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.attention_profile.enabled=false"}, &out) == 0);
  CHECK(short_form.substr(0, short_form.find('\n')) == out.substr(0, out.find('\n')));  // the spec hash
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.attention_profile=often"}, &out) == 2);
  require_one_line_error(out, "key 'eval.attention_profile' (set on the command line or by a sweep's grid): "
                              "expected true, false or a map of key: value, got 'often'");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.attention_profile.windows=0"}, &out) == 2);
  require_one_line_error(out, "key 'eval.attention_profile.windows'");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.attention_profile.lengths=[0]"}, &out) == 2);
  require_one_line_error(out, "eval.attention_profile.lengths");
}

TEST_CASE("sweep killed with kill -9 at chosen moments continues to the uninterrupted results",
          "[sweep]") {
  SweepDir d;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--out", "results/reference.h5", "--set",
                      "output.run_root=runs/reference"}) == 0);
  const Rows reference =
      rows_of(ResultsStore::open((d.root / "results/reference.h5").string()).points());
  REQUIRE(reference.size() == kPoints);
  const fs::path results = d.root / "results/tiny.h5";
  // Whatever the moment, the file is readable and holds no point twice.
  const auto points_now = [&] {
    const auto points = ResultsStore::open(results.string()).points();
    CHECK(rows_of(points).size() == points.size());
    return points.size();
  };

  // 1. Right after the first point is in the results file.
  auto stops = kill_at(d, {"sweep", "tiny.yaml"}, "point:1");
  CHECK(stops[0].detail == "alibi-seed1 nonoverlapping 16");
  CHECK(points_now() == 1);

  // 2. In the middle of training a later run: run 00 is trained (its five other points, the
  // two attention profiles among them, need no checkpoint), run 01 has saved its third
  // checkpoint (step 15 of 40), none of its points is recorded.
  stops = kill_at(d, {"sweep", "tiny.yaml"}, "checkpoint:3");
  CHECK_THAT(stops[0].detail, Catch::EndsWith("runs/tiny/alibi-seed2 step 15"));
  CHECK(points_now() == 6);

  // 3. Between writing the results file's new contents and publishing them (the first write
  // of this process: run 01 resumed at step 15 and trained to the end, so it records its
  // status): the file keeps its earlier contents, the new ones are left in tiny.h5.tmp.
  stops = kill_at(d, {"sweep", "tiny.yaml"}, "publish@tiny.h5:1");
  CHECK(stops[0].detail == "results/tiny.h5");
  CHECK(fs::exists(results.string() + ".tmp"));
  CHECK(points_now() == 6);

  // 4. Two worker processes (--jobs 2), each stopped at its second checkpoint: the killed
  // sweep takes both with it. Pending are 01 (trained: evaluations only), 02 and 03, dealt
  // round-robin: one worker evaluates 01 and trains 03, the other trains 02.
  std::vector<pid_t> workers;
  stops = kill_at(d, {"sweep", "tiny.yaml", "--jobs", "2"}, "checkpoint:2", 2, &workers);
  std::vector<pid_t> stopped = {stops[0].pid, stops[1].pid};
  std::sort(stopped.begin(), stopped.end());
  std::sort(workers.begin(), workers.end());
  CHECK(workers == stopped);  // the stops were the sweep's two workers
  for (pid_t worker : workers) {
    INFO("worker " << worker);
    bool gone = false;
    for (int i = 0; i < 500 && !gone; ++i) {
      gone = process_gone(worker);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(gone);
  }
  std::set<std::string> runs;
  for (const auto& s : stops) runs.insert(fs::path(s.detail.substr(0, s.detail.find(" step "))).filename().string());
  CHECK(runs == std::set<std::string>{sweep_ids(d)[2], sweep_ids(d)[3]});
  for (const auto& s : stops) CHECK_THAT(s.detail, Catch::EndsWith(" step 10"));

  std::string out;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml"}, &out) == 0);
  const auto points = ResultsStore::open(results.string()).points();
  CHECK(points.size() == kPoints);  // nothing lost, nothing twice
  require_same_rows(reference, rows_of(points));
  CHECK(out.find("resuming") != std::string::npos);  // runs resumed from their checkpoints
  CHECK(!fs::exists(results.string() + ".tmp"));
  for (const auto& entry : fs::directory_iterator(d.root / "results"))
    CHECK(entry.path().filename().string().find(".part-") == std::string::npos);  // parts merged

  // Running it again changes nothing.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml"}, &out) == 0);
  CHECK(out.find("4 already complete") != std::string::npos);
  CHECK(ResultsStore::open(results.string()).points().size() == kPoints);
}

TEST_CASE(
    "sweep shards merge into the unsharded results and other sweeps or a held lock are refused",
    "[sweep]") {
  SweepDir d;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml"}) == 0);
  const Rows whole = rows_of(ResultsStore::open((d.root / "results/tiny.h5").string()).points());

  // The shards share the run directories, so they resume the trained models and only evaluate.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--shard", "0/2"}) == 0);
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--shard", "1/2"}) == 0);
  const auto shard0 = ResultsStore::open((d.root / "results/tiny.shard-0-of-2.h5").string());
  CHECK(shard0.runs().size() == 2);
  CHECK(shard0.header().shard == "0/2");
  std::string out;
  REQUIRE(run_cli(d,
                  {"merge", "results/merged.h5", "results/tiny.shard-0-of-2.h5",
                   "results/tiny.shard-1-of-2.h5"},
                  &out) == 0);
  const auto merged = ResultsStore::open((d.root / "results/merged.h5").string());
  CHECK(merged.runs().size() == 4);
  CHECK(merged.points().size() == kPoints);
  require_same_rows(whole, rows_of(merged.points()));
  // Merging a shard again adds nothing.
  REQUIRE(run_cli(d, {"merge", "results/merged.h5", "results/tiny.shard-1-of-2.h5"}) == 0);
  CHECK(ResultsStore::open((d.root / "results/merged.h5").string()).points().size() == kPoints);

  // Another sweep (other evaluation lengths) into its own file: merging it is refused, and so
  // is continuing tiny.h5 with the changed sweep; both name the first differing key.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--set", "eval.length_multiples=[1]", "--out",
                      "results/other.h5"}) == 0);
  CHECK(run_cli(d, {"merge", "results/merged2.h5", "results/tiny.h5", "results/other.h5"}, &out) ==
        2);
  CHECK(out.find("not from the same sweep") != std::string::npos);
  CHECK(out.find("first difference at 'eval.length_multiples'") != std::string::npos);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--set", "base.train.lr=0.001"}, &out) == 2);
  CHECK(out.find("holds the results of a different sweep") != std::string::npos);
  CHECK(out.find("first difference at 'base.train.lr'") != std::string::npos);

  // A writer holds the lock: a second sweep on the same output is refused, naming it.
  const std::string lock_path = (d.root / "results/tiny.h5.lock").string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::string pid = std::to_string(::getpid()) + "\n";
  REQUIRE(::ftruncate(fd, 0) == 0);
  REQUIRE(::pwrite(fd, pid.data(), pid.size(), 0) == ssize_t(pid.size()));
  CHECK(run_cli(d, {"sweep", "tiny.yaml"}, &out) == 2);
  CHECK(out.find("results/tiny.h5 is being written by another extrap process (pid " +
                 std::to_string(::getpid())) != std::string::npos);
  ::close(fd);
  CHECK(run_cli(d, {"sweep", "tiny.yaml"}, &out) == 0);
}

TEST_CASE("a symlinked results file is written through its link, a parallel sweep's worker runs only "
          "its parent's sweep, and --status reads what a killed parallel sweep's workers recorded",
          "[sweep]") {
  SweepDir d;
  std::string out;
  const std::vector<std::string> one = {"--set", "grid.position=[{name: alibi}]", "--set", "grid.train.seed=[1]",
                                        "--set", "eval.strides=[]", "--set", "eval.attention_profile=false"};
  // The link stays a link, its target takes the results, and the lock is the target's.
  fs::create_directories(d.root / "store");
  fs::create_directories(d.root / "results");
  fs::create_symlink("../store/kept.h5", d.root / "results/linked.h5");
  std::vector<std::string> args = {"sweep", "tiny.yaml", "--quiet", "--out", "results/linked.h5"};
  args.insert(args.end(), one.begin(), one.end());
  REQUIRE(run_cli(d, args, &out) == 0);
  CHECK(fs::is_symlink(d.root / "results/linked.h5"));
  CHECK(ResultsStore::open((d.root / "store/kept.h5").string()).points().size() == 2);
  CHECK(fs::exists(d.root / "store/kept.h5.lock"));
  CHECK_FALSE(fs::exists(d.root / "results/linked.h5.lock"));
  args.insert(args.end(), {"--set", "eval.length_multiples=[1, 2, 4]"});  // grows through the link
  REQUIRE(run_cli(d, args, &out) == 0);
  CHECK(fs::is_symlink(d.root / "results/linked.h5"));
  CHECK(ResultsStore::open((d.root / "results/linked.h5").string()).points().size() == 3);

  // A worker started for another sweep than the one it reads (the file edited since) stops.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--worker", "1/2", "--points", "0", "--out", "results/p.h5", "--known",
                    "results/tiny.h5", "--expect-spec", "0123456789abcdef"},
                &out) == 2);
  require_one_line_error(out, "tiny.yaml changed while its parallel sweep ran (worker 1/2");
  CHECK_FALSE(fs::exists(d.root / "results/p.h5"));

  // A parallel sweep killed (kill -9) once a worker recorded a point: --status counts the points
  // its part files hold, not "pending".
  const fs::path log = d.root / "parallel.log";
  const pid_t sweep = spawn(d.root, {"sweep", "tiny.yaml", "--quiet", "--jobs", "2"}, log);
  const auto recorded_in_a_part = [&] {
    for (const auto& part : sweep_part_files((d.root / "results/tiny.h5").string())) {
      try {
        if (!ResultsStore::open(part).points().empty()) return true;
      } catch (const std::exception&) {  // being created
      }
    }
    return false;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!recorded_in_a_part() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(recorded_in_a_part());
  ::kill(sweep, SIGKILL);
  wait_exit(sweep);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the workers die with it
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--status"}, &out) == 0);
  INFO(out);
  size_t with_points = 0;
  for (const auto& part : sweep_part_files((d.root / "results/tiny.h5").string()))
    for (const auto& [id, run] : ResultsStore::open(part).runs()) {
      ++with_points;
      CHECK(out.find(id + "  [pending") == std::string::npos);
    }
  CHECK(with_points > 0);
  // And the sweep then continues from what the parts hold.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet"}, &out) == 0);
  CHECK(ResultsStore::open((d.root / "results/tiny.h5").string()).points().size() == kPoints);
}
