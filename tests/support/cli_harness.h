// Running the `extrap` command line (EXTRAP_CLI) from tests: a temporary directory with a
// small corpus and a tiny sweep file, and helpers to run the CLI in it.
#pragma once

#include "core/run/checkpoint.h"
#include "core/train/trainer.h"
#include "experiments/sweep/sweep_spec.h"
#include "tests/support/test_support.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace extrap::testing {

inline const char* const kSweepFile = R"(name: tiny
base:
  data: {path: corpus, tokenizer: byte, cache_dir: cache}
  model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
  position: alibi
  train: {seq_len: 16, batch_tokens: 256, steps: 40, lr: 0.003, warmup: 4, validate_every: 20,
          validate_tokens: 512, checkpoint_every: 5, log_every: 10, threads: 1}
  eval: {max_tokens: 1024}
grid:
  position: [{name: alibi}, {name: learned, max_length: 24}]
  train.seed: [1, 2]
eval:
  length_multiples: [1, 2]
  strides: [8]
output:
  path: results/tiny.h5
  run_root: runs/tiny
)";
// 4 runs x ((16, 32) x (non-overlapping, sliding_8) + attention profiles at 16 and 32);
// `learned` fails at 32 (past max_length 24).
inline constexpr size_t kPoints = 24;
inline constexpr size_t kFailedPoints = 6;

// A temporary directory with a small corpus and the sweep file; removed afterwards.
struct SweepDir : TempDir {
  SweepDir() : TempDir("sweep") {
    fs::create_directories(root / "corpus");
    const std::string sentence =
        "A model trained on short inputs can be evaluated on longer ones when attention "
        "scores get a penalty linear in distance. ";
    std::string text;
    for (int i = 0; i < 120; ++i)
      text += std::to_string(i % 11) + " " + sentence + (i % 3 ? "" : "\n");
    std::ofstream(root / "corpus" / "train.txt") << text;
    std::ofstream(root / "corpus" / "valid.txt") << text.substr(0, 2400);
    std::ofstream(root / "corpus" / "test.txt") << text.substr(2400, 2400);
    std::ofstream(root / "tiny.yaml") << kSweepFile;
  }
};

// `extrap sweep FILE --quiet` with each of `overrides` as a --set.
inline std::vector<std::string> sweep_with(const std::vector<std::string>& overrides,
                                           const std::string& file = "tiny.yaml") {
  std::vector<std::string> args = {"sweep", file, "--quiet"};
  for (const auto& o : overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  return args;
}

// One line: the message, no C++ backtrace ("Exception raised from", frames "#0 ").
inline void require_one_line_error(const std::string& out, const std::string& expected) {
  INFO(out);
  CHECK(out.find(expected) != std::string::npos);
  CHECK(out.find("Exception raised from") == std::string::npos);
  CHECK(out.find("frame #") == std::string::npos);
}

// The CLI as a child process in `dir`, stdout and stderr to `log`.
// `file_size_limit` > 0: RLIMIT_FSIZE in bytes for the child (a disk that fills up).
// `env`: extra NAME=VALUE variables for the child.
inline pid_t spawn(const fs::path& dir, const std::vector<std::string>& args, const fs::path& log,
                   long file_size_limit = 0, const std::vector<std::string>& env = {}) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::chdir(dir.c_str()) != 0) ::_exit(127);
    if (file_size_limit > 0) {
      const rlimit limit{rlim_t(file_size_limit), rlim_t(file_size_limit)};
      ::setrlimit(RLIMIT_FSIZE, &limit);
    }
    for (const auto& assignment : env) ::putenv(const_cast<char*>(assignment.c_str()));
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<std::string> all = {EXTRAP_CLI};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(EXTRAP_CLI, argv.data());
    ::_exit(127);
  }
  return pid;
}

inline int wait_exit(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Runs the CLI to completion; returns the exit code and (in `output`) what it printed.
inline int run_cli(const TempDir& d, const std::vector<std::string>& args,
                   std::string* output = nullptr, long file_size_limit = 0) {
  const fs::path log = d.root / "cli.log";
  fs::remove(log);
  const int code = wait_exit(spawn(d.root, args, log, file_size_limit));
  const std::string text = read_text(log);
  if (output) *output = text;
  UNSCOPED_INFO("extrap " << (args.empty() ? std::string() : args[0]) << " printed:\n" << text);
  return code;
}

// `extrap bench train` for one step of configs/train_quick.yaml at 256 tokens, plus `overrides`
// (--set words).
inline std::vector<std::string> one_step_bench(const std::vector<std::string>& overrides = {}) {
  std::vector<std::string> args = {"bench", "train", "--config",
                                   std::string(EXTRAP_SOURCE_DIR) + "/configs/train_quick.yaml",
                                   "--set", "train.batch_tokens=256", "--steps", "1", "--warmup", "0"};
  args.insert(args.end(), overrides.begin(), overrides.end());
  return args;
}

// An on/off switch in the environment (core/base/environment.h), through the CLI: `args` exit 0
// with NAME=0 and with NAME=1, printing `off_shows` and `on_shows` respectively (when not
// empty), and NAME=`bad` exits 2 printing `message`. NAME is as it was after.
inline void require_environment_switch(const TempDir& d, const std::string& name,
                                       const std::vector<std::string>& args, const std::string& bad,
                                       const std::string& message, const std::string& off_shows = "",
                                       const std::string& on_shows = "") {
  for (const char* good : {"0", "1"}) {
    INFO(name << "=" << good);
    const ScopedVariable variable(name, good);
    std::string printed;
    REQUIRE(run_cli(d, args, &printed) == 0);
    const std::string& shows = std::string(good) == "0" ? off_shows : on_shows;
    if (!shows.empty()) REQUIRE_THAT(printed, Catch::Contains(shows));
  }
  const ScopedVariable variable(name, bad);
  std::string out;
  REQUIRE(run_cli(d, args, &out) == 2);
  REQUIRE_THAT(out, Catch::Contains(message));
}

// This process's working directory is `d` for the object's lifetime (paths in configs the CLI
// wrote there are relative to it), then back to what it was.
struct InDirectory {
  explicit InDirectory(const TempDir& d) { fs::current_path(d.root); }
  ~InDirectory() { fs::current_path(previous); }
  InDirectory(const InDirectory&) = delete;
  InDirectory& operator=(const InDirectory&) = delete;
  fs::path previous = fs::current_path();
};

// Runs the project's Python (EXTRAP_PYTHON) with `args` (shell words) in `d`; returns its exit
// status and (in `output`) what it printed, stdout and stderr together.
inline int run_python(const TempDir& d, const std::string& args, std::string* output = nullptr) {
  const fs::path log = d.root / "python.log";
  const std::string command = "cd '" + d.root.string() + "' && " EXTRAP_PYTHON " " + args + " > '" +
                              log.string() + "' 2>&1";
  const int status = std::system(command.c_str());
  if (output) *output = read_text(log);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A run directory that the CLI wrote in `d`, loaded in this process (checkpoint verified):
// its corpus, named in its config relative to `d`, and its model.
struct CliRun {
  Corpus corpus;
  LoadedRun run;
};
inline CliRun load_cli_run(const TempDir& d, const std::string& run_dir) {
  const InDirectory in_directory(d);
  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  CliRun loaded;
  loaded.corpus = load_corpus(checkpoint.config.data);
  loaded.run = load_run(checkpoint, loaded.corpus);
  return loaded;
}

// The run ids of the points of the sweep file `file` in `d` (with --set `overrides`), in grid
// order: ids name points by their grid values ("alibi-seed1"; "learned-seed1-h<8 hex>" for a
// method with options).
inline std::vector<std::string> sweep_ids(const TempDir& d, const std::string& file = "tiny.yaml",
                                          const std::vector<std::string>& overrides = {}) {
  const InDirectory in_directory(d);
  std::vector<std::string> ids;
  for (const auto& point : expand_grid(load_sweep(file, overrides))) ids.push_back(point.id);
  return ids;
}

// A stop announced by the fault hook (core/base/fault.h): "PID MOMENT N DETAIL".
struct Stop {
  pid_t pid = 0;
  std::string moment, detail;
};

inline std::vector<Stop> read_stops(const fs::path& file) {
  std::vector<Stop> stops;
  std::istringstream in(read_text(file));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    Stop s;
    long n = 0;
    fields >> s.pid >> s.moment >> n;
    std::getline(fields, s.detail);
    if (!s.detail.empty() && s.detail[0] == ' ') s.detail.erase(0, 1);
    stops.push_back(s);
  }
  return stops;
}

// Whether `pid` is gone: no such process, or a zombie nobody has reaped yet.
inline bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string text((std::istreambuf_iterator<char>(stat)), {});
  const auto close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'Z';
}

// The direct children of `parent`, from /proc.
inline std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), {});
    const auto close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(text.substr(close + 2));
    char state = 0;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == parent) children.push_back(pid_t(std::stol(name)));
  }
  return children;
}

// Runs `extrap args...` in `d` until `count` of its processes have stopped at `at`
// (core/base/fault.h), then kills it with SIGKILL. Returns the stops; its child processes at that
// moment (a sweep's workers) in `children`.
inline std::vector<Stop> kill_at(const TempDir& d, const std::vector<std::string>& args,
                                 const std::string& at, size_t count = 1,
                                 std::vector<pid_t>* children = nullptr) {
  const fs::path stops = d.root / ("stops-" + at);
  const fs::path log = d.root / "killed.log";
  const pid_t pid = spawn(d.root, args, log, 0,
                          {"EXTRAP_TEST_STOP_AT=" + at, "EXTRAP_TEST_STOP_FILE=" + stops.string()});
  const auto start = std::chrono::steady_clock::now();
  bool exited = false;
  while (read_stops(stops).size() < count) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(180)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  INFO("stopping at " << at << "; extrap printed:\n" << read_text(log));
  REQUIRE(!exited);  // the moment came before the process ended
  if (children) *children = children_of(pid);
  ::kill(pid, SIGKILL);
  wait_exit(pid);
  const auto found = read_stops(stops);
  REQUIRE(found.size() == count);
  return found;
}

}  // namespace extrap::testing
