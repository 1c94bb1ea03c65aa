// Extrapolation sweeps: a grid of training configs, each trained once and evaluated at many
// lengths, with every result appended to one HDF5 file (core/results_store.h).
//
// A sweep file:
//   name: quick                     # default: the file's name without extension
//   base: {...}                     # a full `extrap train` config, or the path of one
//   grid:                           # dotted config keys -> lists of values
//     position.name: [sinusoidal, alibi]
//     train.seed: [1, 2]
//   eval:                           # default: base.eval.lengths / base.eval.strides
//     lengths: [1024]               # absolute evaluation lengths
//     length_multiples: [1, 2, 4]   # multiples of each point's train.seq_len
//     strides: [32]                 # sliding-window strides (each used where < length)
//     nonoverlapping: true
//   output:
//     path: results/quick.h5        # default results/NAME.h5
//     run_root: runs/quick          # default runs/NAME; point runs in RUN_ROOT/<run id>
//   jobs: 2                         # grid points run at once, each in its own process
//
// Invariants:
//  - Grid order is the nested loop over the grid keys in file order, the last key varying
//    fastest; a point's index and id depend only on the spec.
//  - A point's evaluations are (length ascending; per length non-overlapping first, then each
//    stride ascending). A point is identified by (run id, mode, length) and recorded once.
//  - The spec hash covers everything that changes results (the resolved base config, grid,
//    evaluation lengths and modes), not where files go or how many threads or jobs run.
//  - With jobs > 1 the sweep process holds the output's lock and runs every pending point in
//    a fresh worker process (`extrap sweep ... --worker`), up to `jobs` at once. A worker
//    writes its own part file OUT.part-<index>.h5 and skips what OUT already holds; each part
//    is merged into OUT and removed as soon as its worker ends. Parts left by an interrupted
//    sweep are merged first when it runs again.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/results_store.h"

namespace extrap {

struct GridAxis {
  std::string key;  // dotted config key, e.g. "position.name"
  std::vector<YAML::Node> values;
};

struct SweepEval {
  std::vector<int64_t> lengths;           // absolute
  std::vector<int64_t> length_multiples;  // of train.seq_len
  std::vector<int64_t> strides;           // sliding-window strides
  bool nonoverlapping = true;
};

struct SweepSpec {
  std::string name;
  std::string source;       // the sweep file's path
  std::string source_text;  // its text, plus the --set overrides
  YAML::Node base;          // the base config document (position normalised to a map)
  Config base_config;       // ... decoded
  std::vector<GridAxis> grid;
  SweepEval eval;
  std::string output;                  // results file
  std::string run_root;                // run directories
  int64_t jobs = 1;                    // grid points run at once (not part of the spec)
  std::vector<std::string> overrides;  // the --set arguments it was loaded with

  // The resolved spec as YAML: what the hash covers and what the results file stores.
  YAML::Node canonical() const;
  std::string canonical_yaml() const;
  std::string hash() const;  // 16 hex digits (FNV-1a 64 of canonical_yaml())
  SweepHeader header(const std::string& shard) const;
};

// One evaluation of a point: mode "nonoverlapping" (stride 0) or "sliding_<stride>".
struct EvalPoint {
  int64_t length = 0;
  int64_t stride = 0;
  std::string mode;
};

struct SweepPoint {
  int64_t index = 0;
  std::string id;                                          // e.g. "03-alibi-L64-seed1"
  std::vector<std::pair<std::string, YAML::Node>> values;  // grid key -> value
  Config config;                                           // train.out_dir = RUN_ROOT/id
  std::vector<EvalPoint> evals;

  std::string grid_yaml() const;  // the grid values as a YAML map (flow style)
};

// Loads a sweep file and applies --set overrides: "grid.KEY=[values]" sets a grid axis (KEY
// is the dotted config key), anything else edits the sweep document ("base.train.steps=10",
// "eval.length_multiples=[1,2]"). Unknown keys are errors naming file, line and key.
SweepSpec load_sweep(const std::string& path, const std::vector<std::string>& overrides);

// Every grid point in order, each config decoded strictly and its position method checked.
std::vector<SweepPoint> expand_grid(const SweepSpec& spec);

struct Shard {
  int64_t index = 0;
  int64_t count = 1;
  bool whole() const { return count == 1; }
  bool contains(int64_t point_index) const { return point_index % count == index; }
  std::string text() const;  // "" when whole, else "I/N"
};
Shard parse_shard(const std::string& text);  // "I/N", 0 <= I < N

// The first key at which two sweep specs (parsed YAML) differ, with both values as YAML text.
struct SpecDifference {
  std::string key;    // dotted, e.g. "grid.position.name"
  std::string first;  // "(absent)" when the key is missing on that side
  std::string second;
};
std::optional<SpecDifference> first_difference(const YAML::Node& first, const YAML::Node& second,
                                               const std::string& prefix = "");
// "" when both headers are of the same sweep (same spec hash), else a sentence naming the
// first differing key and its value in each (e.g. "... 'grid.position.name': [a, b] in
// results/quick.h5, [a, c] in configs/quick.yaml").
std::string describe_difference(const SweepHeader& first, const std::string& first_label,
                                const SweepHeader& second, const std::string& second_label);

struct SweepOptions {
  std::string output;  // overrides spec.output
  Shard shard;
  bool progress = true;  // progress on stderr (a redrawn line on a terminal, else log lines)
  int64_t jobs = 0;      // 0: spec.jobs
  // Worker processes of a parallel sweep (set by the parent through hidden options):
  std::vector<int64_t> points;  // run only these point indices (empty: all of the shard)
  std::string known;            // a results file whose finished points count as done
  std::string worker;           // "K/N": a worker running point K of N (log lines, no redraw)
};

struct SweepOutcome {
  int64_t points = 0;     // grid points in this shard
  int64_t skipped = 0;    // already complete in the results file
  int64_t trained = 0;    // trained or resumed now
  int64_t evaluated = 0;  // evaluation points recorded now (failed ones included)
  int64_t failed = 0;     // evaluation points recorded as failed now
  std::string output;
};

// Runs (or continues) a sweep: locks the output, refuses a file of a different sweep, then for
// each point of the shard trains (resuming from its checkpoint) and records every evaluation
// point not yet in the file. Points that cannot run are recorded as failed, with the reason.
SweepOutcome run_sweep(const SweepSpec& spec, const SweepOptions& options);

// The default results path of a sweep for a shard ("results/NAME.h5",
// "results/NAME.shard-I-of-N.h5").
std::string default_output(const SweepSpec& spec, const Shard& shard);

// Merges results files of the same sweep into `output` (created if missing): every run and
// every point once. Files of different sweeps are refused, naming the first difference.
struct MergeOutcome {
  int64_t runs_added = 0;
  int64_t points_added = 0;
  int64_t points_already_present = 0;
};
MergeOutcome merge_results(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace extrap
