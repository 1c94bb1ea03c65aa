// Running the `extrap` command line (EXTRAP_CLI) from tests: a temporary directory with a
// small corpus and a tiny sweep file, and helpers to run the CLI in it.
#pragma once

#include "tests/test_support.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
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
// 4 runs x (16, 32) x (non-overlapping, sliding_8); `learned` fails at 32 (past max_length 24).
inline constexpr size_t kPoints = 16;
inline constexpr size_t kFailedPoints = 4;

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

}  // namespace extrap::testing
