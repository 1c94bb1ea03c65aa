// Sweep results in one HDF5 file: the schema, crash-safe appends and reading back.
//
// Schema (format_version 1; every string is variable-length UTF-8):
//   /                      attributes: format_version, sweep_name, sweep_spec (the resolved
//                          sweep as YAML), spec_hash, sweep_file (the file's text plus --set
//                          overrides), shard, extrap_version, git_commit, created, spec_time
//   /runs/<run_id>         one group per grid point; attributes: config (resolved YAML),
//                          grid_point (its grid values as YAML), point_index, position,
//                          train_length, seed, extrap_version, git_commit, machine,
//                          start_time, end_time, tokens_per_second, peak_memory_bytes,
//                          num_parameters, status; datasets train_loss, valid_loss (N, 2):
//                          columns step, loss (mean cross-entropy, nats)
//   /runs/<run_id>/eval/<mode>   mode = nonoverlapping | sliding_<stride> |
//                          streaming_<sinks>_<cache> (StreamingLLM); 1-D extendable
//                          datasets length, perplexity, nll_sum, scored_tokens,
//                          bits_per_byte, seconds (one row per finished point), and
//                          failures: compound (length, reason), one row per failed point
//                          mode: the window mode, then "+<variant>" for an evaluation with
//                          RoPE scaling (e.g. "nonoverlapping+yarn", "sliding_64+ntk_x4")
//   /summary               compound, extendable: one row per (run, mode, eval length): run_id,
//                          position, train_length, seed, mode, stride, eval_length, perplexity,
//                          nll_sum, scored_tokens, bits_per_byte, seconds, status
//                          ("ok" or "failed: <reason>")
//   /position_bins         compound, extendable: (summary_row, begin, end, nll_sum,
//                          scored_tokens): the scored tokens of the point in row summary_row
//                          of /summary (0-based) binned by position in the window [begin, end)
//                          (core/eval/evaluator.h, PositionBin); a point's rows together. Absent
//                          in files written before extrap 0.3.
//   /retrieval             compound, extendable: (summary_row, depth, trials, correct,
//                          answer_nll, answer_tokens, placed_depth, same_as): a retrieval point's
//                          exact-match counts at one key depth (percent, as asked;
//                          core/eval/retrieval_eval.h, RetrievalCell), where its keys went
//                          (placed_depth, percent, the mean over its trials) and the asked depth
//                          of the point's first row that places every key alike (same_as: its
//                          own depth, or an earlier row's, whose row measures the same thing);
//                          a point's rows together. Files of extrap 0.11 and before lack the
//                          last two columns (read as NaN: not recorded); a point appended to
//                          such a file rewrites /retrieval with them. A retrieval point's /summary row (mode
//                          "retrieval_<task>[+<variant>]", eval_length the instance length,
//                          stride = eval_length) holds the answers' NLL: nll_sum and
//                          scored_tokens over the answer tokens, perplexity their exp(mean);
//                          bits_per_byte is NaN. Its eval group has the columns length,
//                          accuracy, correct, trials, seconds (and failures). Absent in files
//                          written before extrap 0.4.
//   /longppl               compound, extendable: (summary_row, short_length, candidates,
//                          key_tokens, key_nll_sum, status): LongPPL (core/eval/longppl.h) of
//                          the non-overlapping point in row summary_row of /summary, at most
//                          one row a point: K, the targets with more than K tokens of context,
//                          the key tokens among them and the point's NLL summed over those;
//                          LongPPL = exp(key_nll_sum / key_tokens) (none without key tokens).
//                          status "ok" or "failed: <reason>" (the point's perplexity stands).
//                          Which model selected the key tokens: the spec's eval.longppl.reference
//                          ("": each point's own). Absent in files without LongPPL (extrap 0.11 and before).
//   /inputs                compound, extendable: (summary_row, model, data_key, corpus, tokens,
//                          reference): what the point in row summary_row of /summary was computed
//                          from (EvalInputs), one row a point. Absent in files of extrap 0.11 and
//                          before.
//   /attention_profile     compound, extendable: (summary_row, layer, head, begin, end, mass,
//                          entropy, sink): where the model of the attention-profile point in
//                          row summary_row of /summary looks (core/eval/attention_profile.h), one
//                          row per layer, head and distance bin [begin, end): the mean attention
//                          mass and entropy (nats) there over every query, and the head's sink
//                          share (the same in each of its bins). Such a point's /summary row has
//                          mode "attention_profile", eval_length the window, stride =
//                          eval_length, scored_tokens the queries averaged over, perplexity,
//                          nll_sum and bits_per_byte NaN; its eval group has the columns length,
//                          queries, seconds (and failures). Absent in files without profiles
//                          (extrap 0.11 and before).
// /summary is the source of truth (every point, failed or not, in the order it finished);
// the per-run eval groups are the same numbers arranged for plotting.
//
// A results file that is a symbolic link is written through it: the link stays, its target takes
// every change, and the lock is the target's (every path to the file locks the same one).
//
// Durability: the file is never modified in place. Every change copies it to PATH.tmp,
// applies the change there, closes (HDF5 flushes), fsyncs and renames it over PATH, then
// fsyncs the directory. A kill -9 at any moment therefore leaves PATH either before or after
// the change, never half-written; a stale PATH.tmp is removed by the next writer. Writers
// must hold a ResultsLock (one writer per file); readers need no lock.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/base/files.h"
#include "core/base/version.h"
#include "core/eval/evaluator.h"
#include "core/eval/retrieval_eval.h"
#include "core/run/checkpoint.h"

namespace H5 {
class H5File;
}

namespace extrap {

struct SweepHeader {
  std::string sweep_name;
  std::string sweep_spec;  // the resolved spec, YAML (what spec_hash covers)
  std::string spec_hash;
  std::string sweep_file;  // the sweep file as written, plus the --set overrides
  std::string shard;       // "" (whole sweep), "I/N", or "merged"
  std::string extrap_version = extrap::extrap_version();
  std::string git_commit = extrap::extrap_git_commit();
  std::string created;  // ISO time, UTC
  // When the sweep took the spec the file holds (ISO time to the microsecond): its creation, a
  // growth, or the shards' spec a merge took. A merge keeps the later of two stages' specs
  // (merge_results). Files of extrap 0.11 and before have none: their `created` stands in.
  std::string spec_time;
};

struct RunRecord {
  std::string run_id;
  std::string config;      // resolved config, YAML
  std::string grid_point;  // the point's grid values, YAML
  int64_t point_index = 0;
  std::string position;
  int64_t train_length = 0;
  int64_t seed = 0;
  std::string extrap_version = extrap::extrap_version();
  std::string git_commit = extrap::extrap_git_commit();
  std::string machine;
  std::string runtime;  // runtime_summary(): LibTorch, CUDA, BLAS, threads ("" in older files)
  std::string start_time;
  std::string end_time;  // "" until trained
  double tokens_per_second = NAN;
  int64_t peak_memory_bytes = 0;
  int64_t num_parameters = 0;
  int64_t train_tokens = 0;  // tokens trained on: steps x tokens_per_step (0 in older files)
  int64_t vocab_size = 0;    // the corpus's vocabulary, <mask> included (0 in older files)
  std::string status;  // training | trained | complete | failed: <reason>
  // A released checkpoint's point (a sweep's released models): what was evaluated, as one-line
  // YAML {path, config_json, weights} (the folder, config.json's XXH3, the weights digest); ""
  // for a model trained here.
  std::string released;
  std::vector<CurvePoint> train_loss;
  std::vector<CurvePoint> valid_loss;
};

// LongPPL of a non-overlapping point: a row of /longppl.
struct LongPplRecord {
  int64_t short_length = 0;  // K
  int64_t candidates = 0;    // targets with more than K tokens of context
  int64_t key_tokens = 0;
  double key_nll_sum = NAN;  // the point's NLL over its key tokens
  std::string status = "ok";  // ok | failed: <reason>

  bool ok() const { return status == "ok"; }
  // exp(key_nll_sum / key_tokens); NaN without key tokens or when it failed.
  double longppl() const {
    return ok() && key_tokens > 0 ? std::exp(key_nll_sum / double(key_tokens)) : NAN;
  }
};

// One layer, head and distance bin of an attention-profile point: a row of /attention_profile.
struct ProfileCell {
  int64_t layer = 0;
  int64_t head = 0;
  int64_t begin = 0;   // distances [begin, end)
  int64_t end = 0;
  double mass = NAN;     // mean over queries of the weights at those distances
  double entropy = NAN;  // mean over queries of their -p ln p, nats
  double sink = 0;       // the head's mean weight on a learned sink logit
};

// What a point's numbers were computed from beyond its sweep spec (whose growth rules keep the
// settings): the weights, the corpus and the tokens read, and LongPPL's reference model. Points
// of one file must agree where they share an input (sweep.h, inputs_conflict): a grown sweep
// never pools numbers of an edited validation text, a retrained run or another reference with
// the old ones. A row of /inputs; empty fields where not recorded (files of extrap 0.11).
struct EvalInputs {
  std::string model;      // hex64 of the evaluated weights (TransformerLMImpl::weights_digest), "" if unknown
  std::string data_key;   // hex64 of the run's data section, eval.split and eval.max_tokens
  std::string corpus;     // hex64 of the corpus identity (tokenizer, vocabulary, training tokens)
  std::string tokens;     // hex64 of the split's tokens read (first eval.max_tokens), "" if none
  std::string reference;  // hex64 of eval.longppl.reference's weights, "" if none

  bool recorded() const { return !data_key.empty(); }
};

// One evaluation point: a row of /summary.
struct PointRecord {
  std::string run_id;
  std::string position;
  int64_t train_length = 0;
  int64_t seed = 0;
  std::string mode;    // nonoverlapping | sliding_<stride> | streaming_<sinks>_<cache>, then +<RoPE variant> if any
  int64_t stride = 0;  // the scored tokens per window: eval_length when nonoverlapping
  int64_t eval_length = 0;
  double perplexity = NAN;
  double nll_sum = NAN;
  int64_t scored_tokens = 0;
  double bits_per_byte = NAN;
  double seconds = 0;
  std::string status = "ok";  // ok | failed: <reason>
  std::vector<PositionBin> by_position;  // ok points (empty in files before extrap 0.3)
  std::vector<RetrievalCell> retrieval;  // ok retrieval points: accuracy by depth
  std::optional<LongPplRecord> longppl;  // ok non-overlapping points a sweep scored LongPPL of
  std::vector<ProfileCell> attention_profile;  // ok attention-profile points: layer, head, bin order
  EvalInputs inputs;  // what it was computed from (failed points too, where it was known)

  bool ok() const { return status == "ok"; }
};

// The mode name of a (length, stride) evaluation: stride 0 or >= length is non-overlapping;
// a RoPE-scaling variant (rope_variant_label) is appended as "+<variant>".
std::string eval_mode_name(int64_t length, int64_t stride, const std::string& variant = "");
// The mode of a retrieval evaluation: "retrieval_passkey", "retrieval_multikey+yarn".
std::string retrieval_mode_name(RetrievalTask task, const std::string& variant = "");
bool is_retrieval_mode(const std::string& mode);
// The mode of an attention-profile point (core/eval/attention_profile.h): "attention_profile".
inline constexpr const char* kProfileMode = "attention_profile";
bool is_profile_mode(const std::string& mode);
// "streaming_<sinks>_<cache>": StreamingLLM through a cache of `cache` tokens, `sinks` of them sinks.
std::string streaming_mode_name(int64_t sinks, int64_t cache);

// An exclusive, non-blocking flock on PATH.lock, held for the object's lifetime (released by
// the kernel when the process dies, kill -9 included). The holder's pid is written into the
// lock file; a second writer gets a ConfigError naming the file and that pid.
class ResultsLock {
 public:
  explicit ResultsLock(const std::string& results_path);

 private:
  FileLock lock_;
};

class ResultsStore {
 public:
  // Reads an existing results file (ConfigError when missing or not a results file).
  static ResultsStore open(const std::string& path);
  // Opens `path`, creating it with `header` when it does not exist. The caller compares the
  // stored header with its own. Needs the lock: it also removes a stale PATH.tmp.
  static ResultsStore open_or_create(const std::string& path, const SweepHeader& header);

  // What the store holds. On a temporary (ResultsStore::open(path).points()) the containers
  // are moved out, and the pointer lookups do not compile: a pointer into a temporary store
  // dangles at the end of the statement.
  const std::string& path() const& { return path_; }
  const SweepHeader& header() const& { return header_; }
  SweepHeader header() && { return std::move(header_); }
  const std::map<std::string, RunRecord>& runs() const& { return runs_; }
  std::map<std::string, RunRecord> runs() && { return std::move(runs_); }
  const std::vector<PointRecord>& points() const& { return points_; }  // /summary order
  std::vector<PointRecord> points() && { return std::move(points_); }
  const RunRecord* run(const std::string& run_id) const&;
  const RunRecord* run(const std::string& run_id) const&& = delete;
  bool has_point(const std::string& run_id, const std::string& mode, int64_t eval_length) const;
  // The recorded point, or null.
  const PointRecord* point(const std::string& run_id, const std::string& mode,
                           int64_t eval_length) const&;
  const PointRecord* point(const std::string& run_id, const std::string& mode,
                           int64_t eval_length) const&& = delete;

  // One atomic change: creates or replaces the attributes and curves of each run, then appends
  // each point (to /summary and to its run's eval group). A point's run must exist (in the
  // file or in `runs`); a point already recorded is an error.
  void write(const std::vector<RunRecord>& runs, const std::vector<PointRecord>& points);
  void put_run(const RunRecord& run) { write({run}, {}); }
  void append_point(const PointRecord& point) { write({}, {point}); }
  // One atomic change for a sweep that grew (experiments/sweep/sweep.h): the header's spec,
  // spec hash, sweep file and spec time become `header`'s (its shard and creation time stay),
  // and `runs` (recorded runs with a new point_index) are rewritten.
  void grow(const SweepHeader& header, const std::vector<RunRecord>& runs);

 private:
  explicit ResultsStore(std::string path) : path_(std::move(path)) {}
  void load();
  // Copy, change, fsync, rename: the file is never seen half-changed.
  void commit(const std::function<void(H5::H5File&)>& change);

  std::string path_;
  SweepHeader header_;
  std::map<std::string, RunRecord> runs_;
  std::vector<PointRecord> points_;
  std::map<std::tuple<std::string, std::string, int64_t>, size_t> point_keys_;  // -> points_ index
};

}  // namespace extrap
