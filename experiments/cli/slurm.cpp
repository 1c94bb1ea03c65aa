// `extrap sweep FILE --slurm`: the sweep as a Slurm job array and a merge job that waits for it.
//
//   DIR/array.sbatch   array task I of N runs `extrap sweep FILE --shard I/N` (each point on
//                      --ranks data-parallel ranks: srun starts them, extrap reads SLURM_PROCID,
//                      SLURM_NTASKS and SLURM_LOCALID, and the script exports MASTER_ADDR (the
//                      task's first node) and MASTER_PORT)
//   DIR/merge.sbatch   `extrap merge OUT SHARD...` of the N shard files
//   DIR/submit.sh      submits the array, then the merge with --dependency=afterok on it
// DIR is OUT's name with .slurm in place of .h5, beside it; logs go to DIR/logs/.
#include "experiments/cli/commands.h"
#include "experiments/sweep/sweep.h"

#include "core/base/files.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace fs = std::filesystem;

namespace extrap::cli {

namespace {

// One word for bash, in single quotes.
std::string quoted(const std::string& word) {
  std::string out = "'";
  for (char c : word) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string this_executable() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  if (error) throw std::runtime_error("--slurm: cannot tell where this extrap is: " + error.message());
  return self.string();
}

}  // namespace

std::string write_slurm_scripts(const SweepSpec& spec, const SweepOptions& options,
                                const SlurmOptions& slurm) {
  const int64_t points = int64_t(expand_grid(spec).size());
  const int64_t tasks = slurm.tasks > 0 ? slurm.tasks : points;
  if (tasks < 1 || tasks > points)
    throw ConfigError("--tasks " + std::to_string(tasks) + ": between 1 and the sweep's " +
                      std::to_string(points) + " points");
  if (slurm.ranks < 1) throw ConfigError("--ranks " + std::to_string(slurm.ranks) + ": at least 1");
  // Values written into #SBATCH lines: one word of printable characters (a newline or a space
  // would end the directive and start a line of the script).
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--partition", slurm.partition},
                                    {"--time", slurm.time}, {"the sweep's name", spec.name}})
    for (const unsigned char c : value)
      if (!std::isgraph(c)) {
        std::string shown;  // the value on one line: \n for a line break, \xNN for other controls
        for (const unsigned char v : value) {
          char code[8];
          std::snprintf(code, sizeof code, v == '\n' ? "\\n" : "\\x%02x", v);
          shown += std::isprint(v) ? std::string(1, char(v)) : std::string(code);
        }
        throw ConfigError(std::string(flag) + " '" + shown + "': one word of printable characters, no spaces or "
                          "line breaks (it is written into an #SBATCH line)");
      }
  if (slurm.gpus_per_rank < 0 || slurm.cpus_per_rank < 1)
    throw ConfigError("--gpus-per-rank must be at least 0 and --cpus-per-rank at least 1");
  if (!options.shard.whole())
    throw ConfigError("--slurm shards the sweep itself (--tasks): drop --shard");
  if ((options.jobs > 0 ? options.jobs : spec.jobs) > 1)
    throw ConfigError("--slurm runs one point at a time per array task: drop --jobs (or set jobs: 1)");

  const fs::path cwd = fs::current_path();
  const fs::path output = fs::absolute(options.output.empty() ? spec.output : options.output);
  fs::path dir = output;
  dir.replace_extension(".slurm");
  fs::create_directories(dir / "logs");
  const std::string extrap = this_executable();
  std::string sweep_args = quoted(fs::absolute(spec.source).string());
  for (const auto& o : spec.overrides) sweep_args += " --set " + quoted(o);
  if (!options.output.empty()) sweep_args += " --out " + quoted(output.string());

  std::ostringstream array;
  array << "#!/bin/bash\n"
        << "# extrap sweep " << spec.source << " on Slurm: array task I of " << tasks
        << " runs shard I/" << tasks << ", each point on " << slurm.ranks
        << " data-parallel rank(s). Written by `extrap sweep --slurm`; submit with "
        << (dir / "submit.sh").string() << ".\n"
        << "#SBATCH --job-name=extrap-" << spec.name << "\n"
        << "#SBATCH --array=0-" << tasks - 1 << "\n"
        << "#SBATCH --ntasks=" << slurm.ranks << "\n"
        << "#SBATCH --cpus-per-task=" << slurm.cpus_per_rank << "\n";
  if (slurm.gpus_per_rank > 0) array << "#SBATCH --gpus-per-task=" << slurm.gpus_per_rank << "\n";
  if (!slurm.partition.empty()) array << "#SBATCH --partition=" << slurm.partition << "\n";
  if (!slurm.time.empty()) array << "#SBATCH --time=" << slurm.time << "\n";
  array << "#SBATCH --output=" << (dir / "logs" / "%A_%a.out").string() << "\n"
        << "set -euo pipefail\n"
        << "cd " << quoted(cwd.string()) << "\n"
        << "# The store of the task's ranks: its first node, a port from the job id.\n"
        << "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n"
        << "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 40000))\n"
        << "srun --ntasks=" << slurm.ranks << " " << quoted(extrap) << " sweep " << sweep_args
        << " --shard \"$SLURM_ARRAY_TASK_ID/" << tasks << "\"\n";

  std::ostringstream merge;
  merge << "#!/bin/bash\n"
        << "# Merges the " << tasks << " shard files of extrap sweep " << spec.source
        << " into " << output.string() << " (after the array job succeeded).\n"
        << "#SBATCH --job-name=extrap-" << spec.name << "-merge\n"
        << "#SBATCH --ntasks=1\n";
  if (!slurm.partition.empty()) merge << "#SBATCH --partition=" << slurm.partition << "\n";
  merge << "#SBATCH --output=" << (dir / "logs" / "merge_%j.out").string() << "\n"
        << "set -euo pipefail\n"
        << "cd " << quoted(cwd.string()) << "\n"
        << quoted(extrap) << " merge " << quoted(output.string());
  for (int64_t i = 0; i < tasks; ++i)
    merge << " \\\n  " << quoted(shard_output(output.string(), Shard{i, tasks}));
  merge << "\n";

  std::ostringstream submit;
  submit << "#!/bin/bash\n"
         << "# Submits the sweep's array job, then its merge job to run once every task succeeded.\n"
         << "set -euo pipefail\n"
         << "array=$(sbatch --parsable " << quoted((dir / "array.sbatch").string()) << ")\n"
         << "merge=$(sbatch --parsable --dependency=afterok:\"${array%%;*}\" "
         << quoted((dir / "merge.sbatch").string()) << ")\n"
         << "echo \"submitted array job $array and merge job $merge\"\n";

  write_file_atomic(dir / "array.sbatch", array.str());
  write_file_atomic(dir / "merge.sbatch", merge.str());
  write_file_atomic(dir / "submit.sh", submit.str());
  fs::permissions(dir / "submit.sh", fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  return dir.string();
}

}  // namespace extrap::cli
