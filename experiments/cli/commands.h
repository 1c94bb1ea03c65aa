// The subcommands of the `extrap` command line. Each takes the arguments after its name,
// parses them with Boost.Program_options and returns the process exit code. Errors are
// thrown (ConfigError: exit 2 with the message; anything else: exit 1).
#pragma once

#include "core/eval/longppl.h"
#include "core/eval/retrieval_eval.h"
#include "core/runtime/failure.h"
#include "core/runtime/progress.h"
#include "experiments/sweep/sweep.h"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>
#include <vector>

namespace extrap::cli {

using Args = std::vector<std::string>;

int train(const Args& args);
int eval(const Args& args);
int export_model(const Args& args);  // experiments/cli/cli_export.cpp
int import_model(const Args& args);  // experiments/cli/cli_import.cpp
int positions(const Args& args);
int inspect(const Args& args);
int config_keys(const Args& args);
int bench(const Args& args);            // dispatches to the three below
int bench_train(const Args& args);
int bench_attention(const Args& args);
int bench_generate(const Args& args);   // experiments/cli/cli_generate.cpp
int generate(const Args& args);
int task(const Args& args);    // experiments/cli/cli_retrieval.cpp
int tokenizer(const Args& args);  // experiments/cli/cli_tokenizer.cpp
int sweep(const Args& args);   // experiments/cli/cli_sweep.cpp
int merge(const Args& args);
int report(const Args& args);

// `extrap sweep FILE --slurm` (experiments/cli/slurm.cpp): writes the array, merge and submit
// scripts beside the results file and returns their folder.
struct SlurmOptions {
  int64_t tasks = 0;  // array tasks (shards); 0: one per grid point
  int64_t ranks = 1;  // data-parallel ranks per point
  int64_t gpus_per_rank = 0;
  int64_t cpus_per_rank = 1;
  std::string partition, time;
};
std::string write_slurm_scripts(const SweepSpec& spec, const SweepOptions& options,
                                const SlurmOptions& slurm);

// `--nproc N` (experiments/cli/launch.cpp): runs `extrap COMMAND ARGS` as N local data-parallel
// ranks and returns the first failing rank's exit code (0: all succeeded).
int launch_local_ranks(int nproc, const std::string& command, const Args& args);

// `extrap eval --retrieval`: one row of accuracy by depth per length (each with the RoPE
// scaling `rope` at `rope_factor`, or the length's own factor); a failure prints its reason in
// place of the row. Returns the number of failures; rows go to `rows` when given. The model
// is on `device`.
int evaluate_retrieval_all(TransformerLM& model, const Corpus& corpus, RetrievalSpec spec,
                           const std::vector<int64_t>& lengths, int64_t train_length,
                           RopeScalingKind rope, double rope_factor, nlohmann::json* rows,
                           torch::Device device);

// A length's evaluation that failed: its line in place of the row, and its JSON row.
inline void print_failed_length(int64_t length, const std::string& failure, nlohmann::json* rows) {
  std::printf("%-10lld failed: %s\n", (long long)length, failure.c_str());
  if (rows) rows->push_back({{"length", length}, {"status", "failed"}, {"error", failure}});
}

// `extrap eval --longppl`: LongPPL (core/eval/longppl.h) at each of config.eval.lengths, key
// tokens selected by `reference` (the evaluated model itself when null) with the short context
// `spec.short_length`; one row per length (perplexity, LongPPL, key tokens and candidates), a
// failure's reason in place of its row. Returns the number of failures. Both models are on
// `device`.
int evaluate_longppl_all(TransformerLM& model, TransformerLM* reference, const Corpus& corpus,
                         const Config& config, const LongPplSpec& spec, nlohmann::json* rows,
                         torch::Device device);

// The device a command runs a trained run's model on: `requested` (--device; "": the device
// the run trained on, `trained`). CUDA that cannot be used is refused in one line naming the
// run (`run_dir`) and what to pass instead (`doing`: "evaluate", "inspect").
torch::Device command_device(const std::string& requested, Device trained, const std::string& run_dir,
                             const std::string& doing);

// --json PATH of `command` ("eval", "train", "task"): refused (ConfigError naming the path) where
// it is a directory, lies inside a run directory (one holding fingerprint.yaml: the run's own
// files), or is an existing file that is not an earlier --json of the same command (its
// "written_by" field); checked before the command does any work. json_written_by(command) is
// that field's value, which every --json document carries.
void check_json_path(const std::string& path, const std::string& command);

// An evaluation's progress on `line` (a terminal, rank 0 only): "WHAT: 12/40 UNIT, 1m05s, about
// 3m20s left", for EvalSpec::on_progress and RetrievalSpec::on_progress. Clear the line before
// printing the evaluation's row.
std::function<void(int64_t, int64_t)> progress_display(StatusLine& line, const std::string& what,
                                                       const std::string& unit);
std::string json_written_by(const std::string& command);

// Parses `args` against `options` (+ positional names, + `hidden` options that --help does
// not show). Returns false after printing help when --help was given. Unknown options and
// missing values throw with a clear message.
bool parse(const Args& args, const std::string& usage_line,
           boost::program_options::options_description& options,
           boost::program_options::variables_map& values,
           const boost::program_options::positional_options_description* positional = nullptr,
           const boost::program_options::options_description* hidden = nullptr);

}  // namespace extrap::cli
