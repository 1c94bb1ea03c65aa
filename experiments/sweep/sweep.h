// Running sweeps: every grid point of a sweep spec (experiments/sweep/sweep_spec.h) trained once
// and evaluated at its lengths, every result appended to one HDF5 file (core/results/results_store.h)
// the moment it exists.
//
//  - One process: the points of the shard in grid order; each point trains (or resumes) in
//    RUN_ROOT/<id> (core/run/run_dir.h), then records each evaluation not yet in the file.
//  - jobs: N > 1 (one parallel mechanism): the pending points are dealt round-robin to N
//    worker processes, each a one-process sweep of its points into its own part file
//    OUT.part-K.h5 that skips what OUT holds; the sweep process holds OUT's lock and merges
//    each part into OUT when its worker ends. Parts left by an interrupted sweep are merged
//    first when it runs again. Workers die with the sweep process.
//  - --shard I/N runs the points with index % N == I into their own file; `extrap merge`
//    joins shards (and refuses two files with different numbers for the same point).
#pragma once

#include <string>
#include <vector>

#include "experiments/sweep/sweep_spec.h"

namespace extrap {

struct SweepOptions {
  std::string output;  // overrides spec.output (a shard writes OUTPUT.shard-I-of-N.h5)
  Shard shard;
  bool progress = true;  // progress on stderr (a redrawn line on a terminal, else log lines)
  int64_t jobs = 0;      // 0: spec.jobs
  // Worker processes of a parallel sweep (set by the parent through hidden options):
  std::vector<int64_t> points;  // run only these point indices (empty: all of the shard)
  std::string known;            // a results file whose finished points count as done
  std::string worker;           // "K/N": worker K of N (log lines, no redraw)
  std::string expect_spec;      // the parent's SweepSpec::worker_identity: a worker refuses another
};

struct SweepOutcome {
  int64_t points = 0;     // grid points in this shard
  int64_t skipped = 0;    // already complete in the results file
  int64_t trained = 0;    // trained or resumed now
  int64_t reused = 0;     // evaluated now from a checkpoint already trained to its last step
  int64_t released = 0;   // released checkpoints evaluated now (nothing trained)
  int64_t evaluated = 0;  // evaluation points recorded now (failed ones included)
  int64_t failed = 0;     // evaluation points recorded as failed now
  std::string output;
};

// Gives each point the run id and run directory its grid values were recorded under in `files`
// (null entries skipped): growing a sweep never trains a recorded point again, and the
// numbered ids of extrap 0.11's files stay theirs.
void adopt_recorded_runs(std::vector<SweepPoint>& points,
                         const std::vector<const ResultsStore*>& files);

// Runs (or continues) a sweep: locks the output, refuses a file of a different sweep, then
// runs every point of the shard not complete in the file. Points that cannot give a right
// number are recorded as failed, with the reason.
SweepOutcome run_sweep(const SweepSpec& spec, const SweepOptions& options);

// The results file a run of `spec` with `options` writes.
std::string sweep_output(const SweepSpec& spec, const SweepOptions& options);

// The part files a parallel sweep into `output` left beside it (its workers' results, merged
// into `output` when each ends, or when the sweep runs again after an interruption).
std::vector<std::string> sweep_part_files(const std::string& output);

// Merges results files of the same sweep into `output` (created if missing): every run and
// every point once. Files of different sweeps are refused, naming the first difference; so
// is a point that two files hold with different numbers, naming the point, and points computed
// from other inputs where they share one. The inputs are of one spec; `output` may hold the
// sweep at another stage of its growth (values added to or removed from its grid axes and
// evaluation lists): the later stage's spec stands (SweepHeader::spec_time). Where the inputs'
// is later, `output` takes it, its runs their places in the inputs' grid, and keeps the runs
// the inputs do not hold; where `output`'s is later, it keeps its spec and adds the inputs' runs.
struct MergeOutcome {
  int64_t runs_added = 0;
  int64_t points_added = 0;
  int64_t points_already_present = 0;
  bool took_spec = false;        // OUT held an earlier stage of the sweep and took the shards' spec
  bool kept_later_spec = false;  // OUT held a later stage than the shards and kept its spec
};
MergeOutcome merge_results(const std::string& output, const std::vector<std::string>& inputs);

}  // namespace extrap
