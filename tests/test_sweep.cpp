// Sweeps end to end, through the `extrap` command line (EXTRAP_CLI): grid expansion, the HDF5
// schema as h5py sees it, kill -9 and resume, shards and merge, the writer lock, reports.
// Tiny models (1 layer, d_model 32, L = 16) on a tiny corpus in a temporary directory.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "core/results_store.h"
#include "tests/cli_harness.h"

namespace fs = std::filesystem;
using extrap::PointRecord;
using extrap::ResultsStore;
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
    if (p.ok()) CHECK(p.nll_sum == Approx(q.nll_sum).epsilon(1e-12));
  }
}

size_t points_in(const fs::path& path) {
  try {
    return ResultsStore::open(path.string()).points().size();
  } catch (const std::exception&) {
    return 0;  // not created yet
  }
}

}  // namespace

TEST_CASE("extrap --version names the LibTorch the project's environment holds, and its CUDA",
          "[cli]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"--version"}, &out) == 0);
  // The independent reference: the torch package of the project's Python, which
  // scripts/setup.sh built extrap against (e.g. "2.15.0+cu132 13.2").
  const fs::path py_out = d.root / "torch_version.txt";
  REQUIRE(std::system((std::string(EXTRAP_PYTHON) +
                       " -c 'import torch; print(torch.__version__.split(\"+\")[0], torch.version.cuda)' > " +
                       py_out.string())
                          .c_str()) == 0);
  std::istringstream versions(read_text(py_out));
  std::string torch_version, cuda_version;
  versions >> torch_version >> cuda_version;
  CHECK(out.find("\nlibtorch: " + torch_version + "\n") != std::string::npos);  // headers == loaded
  if (cuda_version != "None")
    CHECK(out.find("\ncuda: compiled in (CUDA " + cuda_version + "), ") != std::string::npos);
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
  const std::vector<std::string> ids = {"00-alibi-seed1", "01-alibi-seed2", "02-learned-seed1",
                                        "03-learned-seed2"};
  size_t at = 0;
  for (const auto& id : ids) {
    const auto found = out.find("\n" + id + "  ", at);
    INFO(id);
    REQUIRE(found != std::string::npos);
    at = found;
  }
  CHECK(out.find("4 of 4 points") != std::string::npos);
  CHECK(out.find("evals: 16/nonoverlapping 16/sliding_8 32/nonoverlapping 32/sliding_8\n") !=
        std::string::npos);

  // --set on the grid (the key after "grid." is the dotted config key) and on the base.
  REQUIRE(run_cli(d,
                  {"sweep", "tiny.yaml", "--list", "--set", "grid.train.seed=[1,2,3]", "--set",
                   "grid.model.layers=[1,2]", "--set", "eval.lengths=[20]"},
                  &out) == 0);
  CHECK(out.find("12 of 12 points") != std::string::npos);
  CHECK(out.find("\n00-alibi-seed1-layers1  ") != std::string::npos);
  CHECK(out.find("\n01-alibi-seed1-layers2  ") != std::string::npos);
  CHECK(out.find("\n11-learned-seed3-layers2  ") != std::string::npos);
  CHECK(out.find("evals: 16/nonoverlapping 16/sliding_8 20/nonoverlapping 20/sliding_8 32/") !=
        std::string::npos);

  // Shards: index % N == I.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--shard", "1/3"}, &out) == 0);
  CHECK(out.find("1 of 4 points") != std::string::npos);
  CHECK(out.find("\n01-alibi-seed2  ") != std::string::npos);

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
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.position.name=[alibii]"},
                &out) == 2);
  CHECK(out.find("alibii") != std::string::npos);
}

TEST_CASE("sweep results file: the documented HDF5 schema as h5py reads it and a report from it",
          "[sweep]") {
  SweepDir d;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml"}) == 0);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  CHECK(store.runs().size() == 4);
  CHECK(store.points().size() == kPoints);
  size_t failed = 0;
  for (const auto& p : store.points()) failed += !p.ok();
  CHECK(failed == kFailedPoints);
  for (const auto& [id, run] : store.runs()) CHECK(run.status == "complete");

  // The project's environment (scripts/setup.sh) has h5py and matplotlib: required here.
  std::ofstream(d.root / "check.py") << R"PY(
import sys, h5py, numpy as np
f = h5py.File(sys.argv[1], "r")
for key in ["format_version", "sweep_name", "sweep_spec", "spec_hash", "sweep_file", "shard",
            "extrap_version", "git_commit", "created"]:
    assert key in f.attrs, "root attribute " + key
assert f.attrs["sweep_name"] == "tiny" and len(f.attrs["spec_hash"]) == 16
assert "grid:" in f.attrs["sweep_spec"]
s = f["summary"]
assert s.dtype.names == ("run_id", "position", "train_length", "seed", "mode", "stride",
                         "eval_length", "perplexity", "nll_sum", "scored_tokens",
                         "bits_per_byte", "seconds", "status"), s.dtype.names
assert s.shape == (16,) and s.maxshape == (None,), (s.shape, s.maxshape)
rows = s[...]
ok = rows["status"] == b"ok"
assert ok.sum() == 12
assert np.allclose(rows["perplexity"][ok], np.exp(rows["nll_sum"][ok] / rows["scored_tokens"][ok]))
assert set(rows["mode"]) == {b"nonoverlapping", b"sliding_8"}
bad = rows[~ok]
assert all(r["position"] == b"learned" and r["eval_length"] == 32 for r in bad)
assert all(r["status"].startswith(b"failed: ") and b"max_length" in r["status"] for r in bad)
assert len(f["runs"]) == 4
for run_id, g in f["runs"].items():
    for key in ["config", "grid_point", "position", "train_length", "seed", "extrap_version",
                "git_commit", "machine", "runtime", "start_time", "end_time", "tokens_per_second",
                "peak_memory_bytes", "num_parameters", "status"]:
        assert key in g.attrs, run_id + " attribute " + key
    assert g.attrs["runtime"].startswith("extrap ") and ", LibTorch " in g.attrs["runtime"], g.attrs["runtime"]
    assert g.attrs["runtime"].endswith(", 1 threads"), g.attrs["runtime"]  # train.threads of tiny.yaml
    assert g.attrs["train_length"] == 16 and g.attrs["status"] == "complete"
    assert "seq_len: 16" in g.attrs["config"]
    assert g["train_loss"].shape == (4, 2) and g["valid_loss"].shape == (2, 2)
    assert list(g["train_loss"][:, 0]) == [10, 20, 30, 40]
    for mode in ["nonoverlapping", "sliding_8"]:
        e = g["eval"][mode]
        n = e["length"].shape[0]
        for column in ["perplexity", "nll_sum", "scored_tokens", "bits_per_byte", "seconds"]:
            assert e[column].shape == (n,), (run_id, mode, column)
        failures = e["failures"][...]
        if g.attrs["position"] == "learned":
            assert list(e["length"][...]) == [16] and list(failures["length"]) == [32]
        else:
            assert list(e["length"][...]) == [16, 32] and len(failures) == 0
print("schema ok")
)PY";
  std::string out;
  const int code = std::system((std::string(EXTRAP_PYTHON) + " " + (d.root / "check.py").string() + " " +
                                (d.root / "results/tiny.h5").string() + " > " +
                                (d.root / "py.log").string() + " 2>&1")
                                   .c_str());
  INFO(read_text(d.root / "py.log"));
  REQUIRE(code == 0);

  REQUIRE(run_cli(d, {"report", "results/tiny.h5", "--out", "report"}, &out) == 0);
  const std::string md = read_text(d.root / "report/report.md");
  INFO(md);
  CHECK(md.find("| eval length | alibi | learned |") != std::string::npos);
  CHECK(md.find("| 16 (= L) |") != std::string::npos);
  CHECK(md.find(" ± ") != std::string::npos);  // two seeds aggregated
  CHECK(md.find("failed [1]") != std::string::npos);
  CHECK(md.find("| method | tokens/s | peak memory (MiB) |") != std::string::npos);
  for (const char* image :
       {"ppl_L16_nonoverlapping.png", "ppl_L16_sliding_8.png", "curves_L16.png"}) {
    CHECK(md.find(std::string("](") + image + ")") != std::string::npos);
    CHECK(fs::file_size(d.root / "report" / image) > 1000);
  }
}

TEST_CASE("sweep killed with kill -9 at any moment continues to the uninterrupted results",
          "[sweep]") {
  SweepDir d;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--out", "results/reference.h5", "--set",
                      "output.run_root=runs/reference"}) == 0);
  const Rows reference =
      rows_of(ResultsStore::open((d.root / "results/reference.h5").string()).points());
  REQUIRE(reference.size() == kPoints);

  const fs::path results = d.root / "results/tiny.h5";
  const fs::path log = d.root / "killed.log";
  // Kill when the first point is on disk; then in the middle of training a later run (it has a
  // checkpoint, none of its points are recorded); then at random moments, running two points
  // at a time in worker processes (which must die with the sweep).
  const std::vector<std::function<bool()>> kill_when = {
      [&] { return points_in(results) >= 1; },
      [&] {
        // A later run in the middle of training: it has a checkpoint, none of its points are
        // recorded (each run has 4). Whichever run that is, as the first kill's moment varies.
        static const char* const ids[] = {"00-alibi-seed1", "01-alibi-seed2", "02-learned-seed1",
                                          "03-learned-seed2"};
        const size_t n = points_in(results);
        return n > 0 && n < kPoints && n % 4 == 0 &&
               fs::exists(d.root / "runs/tiny" / ids[n / 4] / "checkpoint") &&
               points_in(results) == n;
      },
  };
  std::mt19937 rng(Catch::rngSeed());
  int kills = 0;
  for (size_t attempt = 0; attempt < kill_when.size() + 2; ++attempt) {
    const bool parallel = attempt >= kill_when.size();
    const pid_t pid = spawn(d.root,
                            parallel ? std::vector<std::string>{"sweep", "tiny.yaml", "--jobs", "2"}
                                     : std::vector<std::string>{"sweep", "tiny.yaml"},
                            log);
    const auto start = std::chrono::steady_clock::now();
    const double random_delay = std::uniform_real_distribution<double>(0.5, 2.5)(rng);
    bool exited = false;
    while (!exited) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const bool now = attempt < kill_when.size() ? kill_when[attempt]() : elapsed > random_delay;
      if (now || elapsed > 60) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (!exited) {
      ::kill(pid, SIGKILL);
      wait_exit(pid);
      ++kills;
    }
    // Whatever the moment, the file is readable and holds no point twice.
    if (fs::exists(results)) {
      const auto points = ResultsStore::open(results.string()).points();
      CHECK(rows_of(points).size() == points.size());
    }
  }
  CHECK(kills >= 2);
  UNSCOPED_INFO("the killed sweeps printed:\n" << read_text(log));
  std::string out;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml"}, &out) == 0);
  const auto points = ResultsStore::open(results.string()).points();
  CHECK(points.size() == kPoints);  // nothing lost, nothing twice
  require_same_rows(reference, rows_of(points));
  CHECK((read_text(log) + out).find("resuming") !=
        std::string::npos);  // a run resumed from its checkpoint
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
