// `extrap sweep`, `extrap merge` and `extrap report`.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>

#include "core/results/results_store.h"
#include "core/runtime/distributed.h"
#include "experiments/cli/commands.h"
#include "experiments/sweep/sweep.h"

namespace po = boost::program_options;
namespace fs = std::filesystem;

#if !defined(EXTRAP_SOURCE_DIR) || !defined(EXTRAP_PYTHON)
#error "EXTRAP_SOURCE_DIR and EXTRAP_PYTHON must be defined (CMakeLists.txt): report.py and its Python"
#endif

namespace extrap::cli {

namespace {

// Ctrl-C: say how to continue, then die of the signal as usual. Everything on disk is whole
// at any instant (results are replaced atomically, checkpoints swapped by rename).
void on_interrupt(int signal_number) {
  static const char message[] =
      "\nextrap sweep: interrupted; run the same command again to continue where it stopped\n";
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, message, sizeof message - 1);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

// Whether another process holds RUN's lock (is training there now).
bool being_trained(const fs::path& run_dir) {
  const int fd = ::open((run_dir / "lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

// A point's state from the results file and the part files a parallel sweep left beside it:
// pending | running | interrupted | trained | complete | failed | to evaluate, with its
// evaluations recorded (failed ones counted). A run whose record is still "training", or that
// has no record but a checkpoint in its run directory (a worker stopped before it recorded the
// run), was interrupted.
std::string point_status(const SweepPoint& point, const std::vector<const ResultsStore*>& stores) {
  const auto rank = [](const std::string& status) {
    return status == "training" ? 0 : status == "trained" ? 1 : 2;
  };
  const RunRecord* run = nullptr;
  for (const ResultsStore* store : stores)
    if (const RunRecord* r = store->run(point.id); r && (!run || rank(r->status) > rank(run->status))) run = r;
  size_t recorded = 0, failed = 0;
  for (const auto& e : point.evals)
    for (const ResultsStore* store : stores)
      if (const PointRecord* p = store->point(point.id, e.mode, e.length)) {
        ++recorded;
        failed += !p->ok();
        break;
      }
  std::string state = run ? run->status.substr(0, run->status.find(':')) : "pending";
  if (being_trained(point.config.train.out_dir)) state = "running";
  else if (state == "training" || (state == "pending" && has_checkpoint(point.config.train.out_dir)))
    state = "interrupted";
  if (state == "complete" && recorded < point.evals.size()) state = "to evaluate";
  std::string text = state + ", " + std::to_string(recorded) + "/" + std::to_string(point.evals.size()) +
                     " evals";
  if (failed > 0) text += " (" + std::to_string(failed) + " failed)";
  return text;
}

// --list and --status: the grid points with their state in the results file (when it is this
// sweep's); --list adds each point's grid values and evaluations.
void list_points(const SweepSpec& spec, const Shard& shard, const std::string& output, bool details) {
  auto points = expand_grid(spec);
  int64_t mine = 0;
  for (const auto& p : points) mine += shard.contains(p.index);
  std::optional<ResultsStore> store;
  std::vector<ResultsStore> parts;  // what an interrupted parallel sweep's workers recorded
  std::string note;
  if (fs::exists(output)) {
    store.emplace(ResultsStore::open(output));
    if (!sweep_growth_difference(store->header(), output, spec.header(""), spec.source).empty()) {
      note = " (" + output + " holds another sweep: states not shown)";
      store.reset();
    } else {
      for (const auto& part : sweep_part_files(output)) parts.push_back(ResultsStore::open(part));
      std::vector<const ResultsStore*> recorded = {&*store};
      for (const auto& part : parts) recorded.push_back(&part);
      adopt_recorded_runs(points, recorded);
      int64_t kept = int64_t(store->runs().size());
      for (const auto& p : points) kept -= store->run(p.id) != nullptr;
      if (kept > 0) note = " (" + std::to_string(kept) + " recorded point(s) no longer in the grid kept)";
    }
  } else {
    note = " (no results yet)";
  }
  std::cout << "sweep " << spec.name << " (spec hash " << spec.hash() << "): " << mine << " of "
            << points.size() << " points -> " << output << ", runs in " << spec.run_root << "/" << note
            << "\n";
  if (const SweepLongPpl& l = spec.eval.longppl; l.enabled)
    std::cout << "LongPPL in each non-overlapping evaluation of a causal point past K = "
              << (l.short_length > 0 ? std::to_string(l.short_length)
                                     : l.reference.empty() ? std::string("its train.seq_len")
                                                           : std::to_string(l.reference_length))
              << ", key tokens by " << (l.reference.empty() ? "each point's own model" : "the run " + l.reference)
              << " (eval.longppl)\n";
  if (const SweepAttentionProfile& a = spec.eval.attention_profile; a.enabled)
    std::cout << "Attention profile (mode " << kProfileMode << ") of every point over " << a.windows
              << " window(s) at "
              << (a.lengths.empty() && a.length_multiples.empty()
                      ? std::string("its train.seq_len and its longest evaluation length")
                      : std::string("the lengths of eval.attention_profile"))
              << " (eval.attention_profile)\n";
  std::map<std::string, int64_t> counts;
  for (const auto& p : points) {
    if (!shard.contains(p.index)) continue;
    std::vector<const ResultsStore*> stores;
    if (store) stores.push_back(&*store);
    for (const auto& part : parts) stores.push_back(&part);
    const std::string status = point_status(p, stores);
    ++counts[status.substr(0, status.find(','))];
    std::cout << p.id << "  [" << status << "]";
    if (details) {
      std::cout << "  " << p.grid_yaml() << "  evals:";
      for (const auto& e : p.evals) std::cout << " " << e.length << "/" << e.mode;
    }
    std::cout << "\n";
  }
  std::cout << "points:";
  for (const auto& [state, n] : counts) std::cout << " " << n << " " << state;
  std::cout << "\n";
}

}  // namespace

int sweep(const Args& args) {
  po::options_description options("extrap sweep");
  std::string path, output, shard_text, points_text, known, expect_spec;
  std::vector<std::string> overrides;
  int64_t jobs = 0;
  std::string worker;
  SlurmOptions slurm;
  options.add_options()
      ("file", po::value(&path)->required(), "sweep file (YAML: name, base, grid, eval, output)")
      ("set", po::value(&overrides)->composing(),
       "override a key: --set base.train.steps=100, --set grid.train.seed=[1,2] (repeatable)")
      ("out", po::value(&output), "results file (default: output.path of the sweep file)")
      ("shard", po::value(&shard_text), "run only points with index % N == I, into their own file: I/N")
      ("jobs,j", po::value(&jobs),
       "grid points to run at once, each in its own process (default: the file's jobs, else 1)")
      ("list", "print the grid points, their state, values and evaluations; run nothing")
      ("status", "print each grid point's state (pending, running, interrupted, trained, "
       "complete, failed) and evaluations recorded; run nothing")
      ("slurm", "write a Slurm array job (a shard a task) and a merge job instead of running")
      ("tasks", po::value(&slurm.tasks), "--slurm: array tasks (default: one per grid point)")
      ("ranks", po::value(&slurm.ranks), "--slurm: data-parallel ranks per point (default 1)")
      ("gpus-per-rank", po::value(&slurm.gpus_per_rank), "--slurm: GPUs per rank (default 0)")
      ("cpus-per-rank", po::value(&slurm.cpus_per_rank), "--slurm: CPU cores per rank (default 1)")
      ("partition", po::value(&slurm.partition), "--slurm: the partition")
      ("time", po::value(&slurm.time), "--slurm: each array task's time limit (e.g. 24:00:00)")
      ("quiet", "no progress output");
  po::options_description internal("internal");  // a parallel sweep's workers; not in --help
  internal.add_options()
      ("worker", po::value(&worker), "a worker of a parallel sweep, running point K/N")
      ("points", po::value(&points_text), "run only these point indices: I,J,...")
      ("known", po::value(&known), "results file whose points count as done")
      ("expect-spec", po::value(&expect_spec), "the sweep the parent runs (SweepSpec::worker_identity)");
  po::positional_options_description positional;
  positional.add("file", 1);
  po::variables_map vm;
  const char* usage =
      "extrap sweep FILE.yaml [--set key=value ...] [--out OUT.h5] [--shard I/N] [--jobs N] [--list | --status]\n"
      "       [--nproc N: each point on N local data-parallel ranks]\n"
      "       [--slurm [--tasks N] [--ranks R] [--gpus-per-rank G] [--partition P] [--time T]]";
  if (!parse(args, usage, options, vm, &positional, &internal)) return 0;
  const SweepSpec spec = load_sweep(path, overrides);
  SweepOptions run_options;
  if (!shard_text.empty()) run_options.shard = parse_shard(shard_text);
  run_options.output = output;
  run_options.progress = !vm.count("quiet");
  run_options.jobs = jobs;
  run_options.worker = worker;
  run_options.known = known;
  run_options.expect_spec = expect_spec;
  std::istringstream list(points_text);
  for (std::string item; std::getline(list, item, ',');) {
    try {
      run_options.points.push_back(std::stoll(item));
    } catch (const std::exception&) {
      throw ConfigError("--points '" + points_text + "': expected point indices I,J,...");
    }
  }
  if (vm.count("jobs") && jobs < 1)
    throw ConfigError("--jobs " + std::to_string(jobs) + ": must be at least 1");
  if (vm.count("list") || vm.count("status")) {
    list_points(spec, run_options.shard, sweep_output(spec, run_options), vm.count("list") > 0);
    return 0;
  }
  for (const char* name : {"tasks", "ranks", "gpus-per-rank", "cpus-per-rank", "partition", "time"})
    if (vm.count(name) && !vm.count("slurm"))
      throw ConfigError(std::string("--") + name + " is a --slurm option: add --slurm");
  if (vm.count("slurm")) {
    const std::string dir = write_slurm_scripts(spec, run_options, slurm);
    std::cout << "wrote " << dir << "/array.sbatch, merge.sbatch and submit.sh; submit with: bash "
              << dir << "/submit.sh\n";
    return 0;
  }
  if (worker.empty()) {
    std::signal(SIGINT, on_interrupt);
    std::signal(SIGTERM, on_interrupt);
  }
  const SweepOutcome outcome = run_sweep(spec, run_options);
  if (!worker.empty() || !ProcessGroup::leader()) return 0;  // rank 0 speaks for all
  std::cerr << "sweep " << spec.name << ": " << outcome.points << " points (" << outcome.skipped << " already complete, ";
  if (outcome.released > 0 || !spec.released.empty())
    std::cerr << outcome.released << " released checkpoints evaluated now";
  else
    std::cerr << outcome.trained << " trained now";
  if (outcome.reused > 0) std::cerr << ", " << outcome.reused << " from finished checkpoints";
  std::cerr << "), " << outcome.evaluated << " evaluations recorded now";
  if (outcome.failed > 0)
    std::cerr << ", " << outcome.failed << " of them failed (reasons in the file)";
  std::cerr << "\nresults: " << outcome.output << "   (extrap report " << outcome.output
            << " --out reports/" << fs::path(outcome.output).stem().string() << ")\n";
  return 0;
}

int merge(const Args& args) {
  po::options_description options("extrap merge");
  std::string output;
  std::vector<std::string> inputs;
  options.add_options()
      ("output", po::value(&output)->required(), "merged results file (created, or extended if it exists)")
      ("inputs", po::value(&inputs)->multitoken()->required(), "results files of shards of one sweep");
  po::positional_options_description positional;
  positional.add("output", 1).add("inputs", -1);
  po::variables_map vm;
  if (!parse(args, "extrap merge OUT.h5 SHARD.h5 [SHARD.h5 ...]", options, vm, &positional))
    return 0;
  const MergeOutcome outcome = merge_results(output, inputs);
  std::cerr << "merged " << inputs.size() << " files into " << output << ": " << outcome.runs_added
            << " runs and " << outcome.points_added << " points added";
  if (outcome.points_already_present > 0)
    std::cerr << ", " << outcome.points_already_present << " points were already there";
  if (outcome.took_spec)
    std::cerr << "; the sweep changed since " << output << " was written (it grew or shrank), and "
              << output << " now holds the shards' spec (its other runs kept)";
  if (outcome.kept_later_spec)
    std::cerr << "; " << output << " holds a later stage of the sweep than these files (it grew or shrank "
              << "since they were written), and keeps its spec";
  std::cerr << "\n";
  return 0;
}

int report(const Args& args) {
  po::options_description options("extrap report");
  std::string results, out_dir, python = EXTRAP_PYTHON;
  options.add_options()
      ("results", po::value(&results)->required(), "results file written by extrap sweep")
      ("out", po::value(&out_dir)->required(), "directory for report.md and its PNG plots")
      ("python", po::value(&python),
       "Python with h5py and matplotlib (default: the project's environment, " EXTRAP_PYTHON ")");
  po::positional_options_description positional;
  positional.add("results", 1);
  po::variables_map vm;
  if (!parse(args, "extrap report RESULTS.h5 --out DIR", options, vm, &positional)) return 0;
  const std::string script = std::string(EXTRAP_SOURCE_DIR) + "/analysis/report.py";
  if (!fs::exists(script)) throw ConfigError("report script not found: " + script);
  if (!fs::exists(results)) throw ConfigError(results + ": no such results file");
  if (fs::exists(out_dir) && !fs::is_directory(out_dir))
    throw ConfigError("--out " + out_dir + ": is a file, not a directory (report.md and its plots "
                      "go in a directory)");
  std::vector<std::string> argv_text = {python, script, results, "--out", out_dir};
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  ::execv(python.c_str(), argv.data());
  throw ConfigError("cannot run " + python + ": " + std::strerror(errno) +
                    " (scripts/setup.sh makes the project's environment; or pass --python)");
}

}  // namespace extrap::cli
