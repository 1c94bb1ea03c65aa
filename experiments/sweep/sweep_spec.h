// The sweep spec: a sweep file parsed, checked, expanded into grid points, and hashed.
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
//     rope_scaling: [none, yarn]    # RoPE-scaling variants for points of rotary/xpos models
//     rope_factor: 4                # the factor s (default: each length / train.seq_len)
//     longppl:                      # LongPPL (core/eval/longppl.h) beside perplexity, on by default
//                                   # (`longppl: false`: off):
//       enabled: true               # each causal point's non-overlapping windows past K
//       short_length: 0             # K; 0: the key-token model's train.seq_len
//       alpha: 2                    # key: NLL_short - NLL_long > alpha ...
//       beta: -2                    # ... and -NLL_long > beta
//       reference: ""               # a run directory whose model selects every point's key
//                                   # tokens; "": each point's own model
//       max_tokens: 0               # key tokens among the first N targets (0: every scored one)
//     attention_profile:            # where each model looks (core/eval/attention_profile.h), on
//                                   # by default (`attention_profile: false`: off):
//       enabled: true
//       lengths: []                 # window lengths; with length_multiples both empty: each
//       length_multiples: []        # point's train.seq_len and its longest evaluation length
//       windows: 4                  # windows averaged over, from the start of base.eval's split
//     retrieval:                    # exact-match retrieval (core/eval/retrieval_eval.h), causal points
//       task: passkey               # passkey | multikey | variable_tracking
//       length_multiples: [1, 2, 4] # instance lengths, multiples of train.seq_len (or lengths:)
//       depths: [0, 25, 50, 75, 100]   # key depths, percent
//       samples: 20                 # instances per (length, depth); the same for every point
//       seed: 1
//   released:                       # instead of base and grid: released checkpoints, nothing trained
//     data: data/wikitext-2         # the corpus every model reads (each with its own tokenizer)
//     set: {eval.max_tokens: 65536, train.threads: 2}   # eval.* and train.threads/device keys
//     models:                       # run id -> a Hugging Face checkpoint folder, or a map
//       bloom-560m: /models/bloom-560m
//       mpt-1b: {path: /models/mpt-1b, train_length: 2048, alibi_bias: exact}
//   output:
//     path: results/quick.h5        # default results/NAME.h5
//     run_root: runs/quick          # default runs/NAME; point runs in RUN_ROOT/<run id>
//   jobs: 2                         # processes running points at once (experiments/sweep/sweep.h)
//
// Invariants:
//  - Grid order is the nested loop over the grid keys in file order, the last key varying
//    fastest. A point's identity is its grid values (SweepPoint::key), not its index: values
//    added to an axis, or evaluation lengths and modes added, grow a sweep into the same
//    results file (sweep_growth_difference) and leave the recorded points as they are.
//  - A point's evaluations are (length ascending; per length non-overlapping first, then each
//    stride ascending; per window mode each RoPE variant in the order listed), then its
//    retrieval lengths ascending (each under every RoPE variant), mode "retrieval_<task>",
//    then its attention-profile lengths ascending, mode "attention_profile" (unscaled). A
//    masked-LM point has no retrieval evaluations. A point is
//    identified by (run id, mode, length) and recorded once. RoPE variants apply to the points
//    whose method has rotary angles (PositionInfo::rope_scaling); the others are evaluated
//    once per window mode, unscaled.
//  - The spec hash covers exactly the keys marked Affects::model or Affects::evaluation in
//    core/model/config.cpp (the base config's eval lengths and strides are replaced by the sweep's
//    eval section), the grid and the evaluation plan; not where files go, threads or jobs.
//  - A grid axis is a non-empty list of distinct values; the evaluation plan is not empty.
//  - A released sweep's points are its models, in file order, each identified by its name
//    (grid value `released: NAME`); its run directory is `extrap import` of the folder
//    (core/run/import_run.h) with the `set` keys, and a directory holding anything else is
//    refused. The spec hash covers each model's imported config (config.json mapped), not its
//    weights: those are checked against the import's record at every load.
#pragma once

#include <yaml-cpp/yaml.h>

#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/eval/retrieval_eval.h"
#include "core/model/config.h"
#include "core/run/import_run.h"
#include "core/results/results_store.h"

namespace extrap {

struct GridAxis {
  std::string key;  // dotted config key, e.g. "position.name"
  std::vector<YAML::Node> values;
};

struct SweepRetrieval {
  RetrievalTask task = RetrievalTask::none;  // none: no retrieval evaluation
  std::vector<int64_t> lengths;              // absolute
  std::vector<int64_t> length_multiples;     // of train.seq_len
  std::vector<double> depths{0, 25, 50, 75, 100};
  int64_t samples = 20;
  int64_t seed = 1;
};

// LongPPL in a sweep: key tokens selected by `reference` (or each point's own model) with a
// short context of K tokens, scored in each non-overlapping evaluation of a causal point past K.
struct SweepLongPpl {
  bool enabled = true;
  int64_t short_length = 0;  // K; 0: the selecting model's train.seq_len
  double alpha = 2.0;
  double beta = -2.0;
  std::string reference;     // run directory; "": each point's own model
  int64_t max_tokens = 0;    // targets among the first N tokens of the stream (0: all)
  // Resolved at load (not part of the spec): the reference run's training length and data
  // section (its keys that change the tokens).
  int64_t reference_length = 0;
  YAML::Node reference_data;

  // K for a point trained at `train_length`.
  int64_t short_for(int64_t train_length) const {
    return short_length > 0 ? short_length : reference.empty() ? train_length : reference_length;
  }
};

// Where each model looks in a sweep: every point's attention profile (distance bins with an
// edge at its train.seq_len) at a few window lengths, over the first `windows` windows of the
// split its evaluation reads (within base eval.max_tokens).
struct SweepAttentionProfile {
  bool enabled = true;
  std::vector<int64_t> lengths;           // absolute
  std::vector<int64_t> length_multiples;  // of train.seq_len
  int64_t windows = 4;

  // The lengths for a point trained at `train_length` whose longest evaluation is `longest`;
  // `source`, the sweep file, for a refusal (length_of_multiple).
  std::set<int64_t> lengths_for(int64_t train_length, int64_t longest, const std::string& source) const;
};

// multiple x train_length, the length a length multiple names; a product past 64 bits is a
// ConfigError naming `key` in `source` (not a negative or wrapped length evaluated silently).
int64_t length_of_multiple(int64_t multiple, int64_t train_length, const std::string& source, const std::string& key);

struct SweepEval {
  std::vector<int64_t> lengths;           // absolute
  std::vector<int64_t> length_multiples;  // of train.seq_len
  std::vector<int64_t> strides;           // sliding-window strides
  bool nonoverlapping = true;
  std::vector<RopeScalingKind> rope_scaling{RopeScalingKind::none};
  double rope_factor = 0;  // 0: each evaluation length / train.seq_len
  SweepRetrieval retrieval;
  // StreamingLLM (core/model/model.h): cache sizes W; each length above W is also read as
  // streams through that cache with `streaming_sinks` sinks (causal points).
  std::vector<int64_t> streaming;
  int64_t streaming_sinks = 4;
  SweepLongPpl longppl;
  SweepAttentionProfile attention_profile;
};

// A released checkpoint a sweep evaluates (SweepSpec::released).
struct ReleasedModel {
  std::string name;                   // the point's run id
  std::string path;                   // the checkpoint folder, absolute
  // How `extrap import` reads it: the sweep's corpus and set keys, the model's own
  // train_length (0: config.json's) and alibi_bias; filled once, at spec load.
  ImportOptions options;
  Config config;                      // what `extrap import` makes of it, the `set` keys applied
};

// A sweep's points at most: a grid of more is refused (expand_grid would run out of memory).
inline constexpr int64_t kMostGridPoints = 1'000'000;

struct SweepSpec {
  std::string name;
  std::string source;       // the sweep file's path
  std::string source_text;  // its text, plus the --set overrides
  std::string base_file;    // the file holding it: the sweep file, or the file base names
  bool base_inline = true;  // base is the sweep file's `base` map (else the whole base_file)
  std::vector<std::string> base_overrides;  // --set base.KEY=VALUE, as KEY=VALUE
  // The base document parsed afresh, overrides applied: a new tree whose nodes keep the
  // lines of the file they came from (YAML::Clone drops them), so errors name the line.
  Config base_config;       // ... decoded
  std::vector<GridAxis> grid;
  // A sweep of released checkpoints (no base, no grid): the models, the corpus they read, and
  // the evaluation keys set in every model's config ("eval.max_tokens=65536").
  std::vector<ReleasedModel> released;
  std::string released_data;
  std::vector<std::string> released_set;
  SweepEval eval;
  std::string output;                  // results file
  std::string run_root;                // run directories
  int64_t jobs = 1;                    // grid points run at once (not part of the spec)
  std::vector<std::string> overrides;  // the --set arguments it was loaded with

  // The resolved spec as YAML: what the hash covers and what the results file stores.
  YAML::Node canonical() const;
  YAML::Node fresh_base() const;
  std::string canonical_yaml() const;
  std::string hash() const;  // 16 hex digits (XXH3 of canonical_yaml())
  // What a parallel sweep's workers must run exactly as their parent does (16 hex digits): the
  // spec and where runs go. A worker reads the sweep file afresh; one edited meanwhile is refused.
  std::string worker_identity() const;
  // The grid's points: the axes' sizes multiplied (kMostGridPoints + 1 past that many).
  int64_t point_count() const;
  SweepHeader header(const std::string& shard) const;
};

// One evaluation of a point: mode "nonoverlapping" (stride 0), "sliding_<stride>",
// "streaming_<sinks>_<cache>" or "retrieval_<task>", then "+<variant>" for a RoPE-scaling
// variant.
struct EvalPoint {
  int64_t length = 0;
  int64_t stride = 0;
  std::string mode;
  RopeScalingKind rope_scaling = RopeScalingKind::none;
  double rope_factor = 0;  // 0: derived from the length
  bool retrieval = false;  // a retrieval evaluation: retrieval_spec holds its task and plan
  RetrievalSpec retrieval_spec;
  StreamingCache streaming;  // active: a StreamingLLM evaluation (non-overlapping streams)
  // LongPPL too (a non-overlapping evaluation of a causal point past K): with K and the rest.
  bool longppl = false;
  int64_t longppl_short = 0;
  // An attention profile (mode "attention_profile") over this many windows of `length`.
  bool profile = false;
  int64_t profile_windows = 0;
};

struct SweepPoint {
  int64_t index = 0;   // place in the grid (shards, workers); not part of its identity
  std::string key;     // the point's identity: grid_point_key(values)
  std::string id;      // e.g. "alibi-L64-seed1"; "learned-seed1-h3f2a9c01" when the labels
                       // lose information (a method with options); a results file of extrap
                       // 0.11 keeps its "03-alibi-L64-seed1" (adopt_recorded_runs)
  std::vector<std::pair<std::string, YAML::Node>> values;  // grid key -> value
  Config config;                                           // train.out_dir = RUN_ROOT/id
  std::vector<EvalPoint> evals;

  std::string grid_yaml() const;  // the grid values as a YAML map (flow style)
};

// A point's identity: a hash of its grid values (map keys sorted at every level), whatever the
// axes' order or the values' places in them; from the values, or from a run's recorded
// grid_point (RunRecord::grid_point).
std::string grid_point_key(const std::vector<std::pair<std::string, YAML::Node>>& values);
std::string grid_point_key(const std::string& grid_yaml);

// Loads a sweep file and applies --set overrides: "grid.KEY=[values]" sets a grid axis (KEY
// is the dotted config key), anything else edits the sweep document ("base.train.steps=10",
// "eval.length_multiples=[1,2]"). Unknown keys are errors naming file, line and key.
SweepSpec load_sweep(const std::string& path, const std::vector<std::string>& overrides);

// The keys of a sweep file (name, base, grid, eval.*, jobs, output.*) with their defaults
// and help, for `extrap keys --sweep`.
std::vector<OptionDoc> sweep_documentation();

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

// The results path of a shard: "results/NAME.h5" when whole, else
// "results/NAME.shard-I-of-N.h5" (for the spec's output path or a given --out path).
std::string shard_output(const std::string& output, const Shard& shard);

// "" when both headers are of the same sweep (same spec hash), else a sentence naming the
// first differing key and its value in each (e.g. "... 'grid.position.name': [a, b] in
// results/quick.h5, [a, c] in configs/quick.yaml").
std::string describe_difference(const SweepHeader& first, const std::string& first_label,
                                const SweepHeader& second, const std::string& second_label);

// Whether a results file of sweep `recorded` can take the points of sweep `current`: "" when it
// can, else what differs. A sweep may grow or shrink the values of its grid axes and its
// evaluation lengths, strides, non-overlapping windows and RoPE variants; its name, base
// config, set of grid keys, RoPE factor and retrieval task, depths, samples and seed must stay.
std::string sweep_growth_difference(const SweepHeader& recorded, const std::string& recorded_label,
                                    const SweepHeader& current, const std::string& current_label);

}  // namespace extrap
