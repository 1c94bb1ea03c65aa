// Hostile input a user tried on 0.11 that was not refused cleanly, each with the line it prints
// now: absurd sizes, a diverging learning rate, a perplexity past a double, a cache or results
// file that cannot be written, refusals that left a run directory behind, a stride that would
// skip tokens, a report written over a file; and the small command-line items (keys' marks,
// sweep --status, --help, the closing hint, a misspelt method, --max-tokens, word-level bpb).
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/base/files.h"
#include "core/results/results_store.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using extrap::ResultsStore;
using namespace extrap;
using namespace extrap::testing;

namespace {

const char* const kHostileTrainFile = R"(data: {path: corpus, tokenizer: byte, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: alibi
train: {seq_len: 16, batch_tokens: 256, steps: 10, lr: 0.003, warmup: 2, validate_every: 5,
        validate_tokens: 512, checkpoint_every: 5, log_every: 5, threads: 1, out_dir: runs/a}
eval: {lengths: [16], max_tokens: 1024}
)";

// The token cache file of `split` under d/cache (one corpus there).
fs::path cache_file(const TempDir& d, const std::string& split) {
  for (const auto& entry : fs::recursive_directory_iterator(d.root / "cache"))
    if (entry.path().filename() == split + ".tokens") return entry.path();
  FAIL("no " << split << ".tokens under cache/");
  return {};
}

}  // namespace

TEST_CASE("absurd sizes and learning rates are refused, an overflowing perplexity says so",
          "[refusals]") {
  SweepDir d;
  write_text(d.root / "t.yaml", kHostileTrainFile);
  std::string out;
  // The memory estimate saturates instead of wrapping negative; nothing is created.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "model.d_model=1000000000"}, &out) == 2);
  require_one_line_error(out, "needs more than 8 EiB of memory");
  require_one_line_error(out, "lower model.d_model (1000000000), model.d_ffn (64) or model.layers (1)");
  CHECK(!fs::exists(d.root / "runs"));

  // A loss above twice the untrained model's (or ln V's, where that is larger) is divergence,
  // in train and in sweeps.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.lr=100", "--set", "train.out_dir=runs/lr"},
                &out) == 1);
  require_one_line_error(out, "training diverged at step ");
  require_one_line_error(out, "twice the untrained model's ");
  require_one_line_error(out, " at step 1; a uniform guess over 257 tokens scores 5.55); nothing of this step was "
                              "saved; lower train.lr");
  CHECK(!fs::exists(d.root / "runs/lr/checkpoint"));
  // Validation that cannot fill one window of seq_len is refused before any step (and before
  // --overwrite clears a run directory), naming the key that limits it.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.validate_tokens=10", "--set", "train.out_dir=runs/vt"},
                &out) == 2);
  require_one_line_error(out, "validation needs 17 tokens (a window of train.seq_len 16); train.validate_tokens is 10");
  CHECK(!fs::exists(d.root / "runs/vt"));
  // Thread counts no CPU has are refused (100,000 segfaulted in the thread pools).
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.threads=100000", "--set", "train.out_dir=runs/th"},
                &out) == 2);
  require_one_line_error(out, "CPU threads 100000: must be 0 (all cores) to 1024");
  CHECK(!fs::exists(d.root / "runs/th"));
  // More threads than cores run, with one warning line (they take turns on the cores).
  cpu_set_t cores;
  REQUIRE(sched_getaffinity(0, sizeof(cores), &cores) == 0);
  const std::string many = std::to_string(CPU_COUNT(&cores) + 1);
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--no-eval", "--set", "train.threads=" + many, "--set",
                    "train.steps=1", "--set", "train.out_dir=runs/many"}, &out) == 0);
  CHECK(out.find("extrap: warning: " + many + " CPU threads on " + std::to_string(CPU_COUNT(&cores)) +
                 " cores: threads beyond one a core take turns") != std::string::npos);
  // What a process killed between writing and renaming left (config.yaml.tmp.<pid>) goes when
  // the run directory is next taken; a live process's stays.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  const fs::path stale = d.root / ("runs/many/config.yaml.tmp." + std::to_string(child));
  const fs::path live = d.root / ("runs/many/config.yaml.tmp." + std::to_string(getpid()));
  write_text(stale, "data: {");
  write_text(live, "data: {");
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--no-eval", "--resume", "--set", "train.steps=1", "--set",
                    "train.out_dir=runs/many"}, &out) == 0);
  CHECK(!fs::exists(stale));
  CHECK(fs::exists(live));
  // A wide model's untrained loss is above 2 ln V (its tied embeddings favour the input token
  // by about sqrt(d_model)); at a learning rate that changes nothing it is no divergence.
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval", "--set", "model.d_model=256", "--set", "train.lr=1e-9",
                      "--set", "train.warmup=0", "--set", "train.steps=3", "--set", "train.checkpoint_every=1",
                      "--set", "train.validate_every=0", "--set", "train.out_dir=runs/wide"},
                  &out) == 0);
  const auto wide = nlohmann::json::parse(read_text(d.root / "runs/wide/checkpoint/state.json"));
  CHECK(wide.at("first_loss").get<double>() > 2 * std::log(257.0));  // the case this checks
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "base.train.lr=100", "--set",
                      "grid.train.seed=[1]", "--set", "output.run_root=runs/lr", "--out",
                      "results/lr.h5"},
                  &out) == 0);
  const ResultsStore diverged = ResultsStore::open((d.root / "results/lr.h5").string());
  REQUIRE(!diverged.points().empty());
  for (const auto& p : diverged.points()) {
    INFO(p.status);
    CHECK(p.status.rfind("failed: training: training diverged at step", 0) == 0);
  }
  // A run that failed in training had a model: its size and vocabulary are recorded, not 0.
  for (const auto& [id, run] : diverged.runs()) {
    INFO(id << " " << run.status);
    CHECK(run.num_parameters > 0);
    CHECK(run.vocab_size == 257);
  }

  // A trained model whose logits are scaled up a thousandfold: a mean NLL past ln(DBL_MAX).
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval"}, &out) == 0);
  {
    const InDirectory in_directory(d);
    const VerifiedCheckpoint checkpoint = require_checkpoint("runs/a");
    auto [corpus, run] = load_cli_run(d, "runs/a");
    torch::NoGradGuard no_grad;
    for (auto& p : run.model->named_parameters())
      if (p.key().find("ln_final") != std::string::npos) p.value().mul_(1e4);
    save_checkpoint("runs/a", checkpoint.config, checkpoint.manifest, checkpoint.state, run.model,
                    nullptr);
  }
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", "e.json"}, &out) == 0);
  require_one_line_error(out, "    overflow");
  require_one_line_error(out, "16         perplexity overflows a double: mean NLL ");
  CHECK(out.find(" inf ") == std::string::npos);
  const std::string json = read_text(d.root / "e.json");
  CHECK(json.find("\"perplexity\": null") != std::string::npos);
  CHECK(json.find("\"mean_nll\"") != std::string::npos);
}

TEST_CASE("files that cannot be written name the file and the reason, and refusals leave no "
          "run directory",
          "[refusals]") {
  SweepDir d;
  write_text(d.root / "t.yaml", kHostileTrainFile);
  std::string out;
  // A token cache on a full disk (here a file-size limit) says so.
  CHECK(run_cli(d, {"train", "-c", "t.yaml"}, &out, 1024) == 2);
  require_one_line_error(out, ".tokens.tmp.");
  require_one_line_error(out, ": cannot write: file size limit exceeded (");
  CHECK(!fs::exists(d.root / "runs/a"));  // refused before the run directory was made
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval"}, &out) == 0);

  // A cache file that cannot be replaced gives the reason (it said "Success").
  const fs::path valid = cache_file(d, "valid");
  fs::remove(valid);
  fs::create_directories(valid / "in-the-way");
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--overwrite", "--no-eval"}, &out) == 2);
  require_one_line_error(out, "valid.tokens: cannot replace: ");
  CHECK(out.find("Success") == std::string::npos);
  remove_tree(valid);

  // A sweep's new results file on a full disk: a write error, not an HDF5 error or a crash.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--quiet"}, &out, 1024) == 2);
  require_one_line_error(out, "results/tiny.h5.tmp: cannot write: file size limit exceeded");
  CHECK(out.find("HDF5") == std::string::npos);
  CHECK(!fs::exists(d.root / "results/tiny.h5"));

  // Refusals in a new run directory leave nothing behind (not even a lock file).
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.out_dir=runs/new", "--set",
                    "train.seq_len=20000", "--set", "train.batch_tokens=20000"},
                &out) == 2);
  require_one_line_error(out, "the training split has 14690 tokens: too few for train.seq_len 20000");
  CHECK(!fs::exists(d.root / "runs/new"));
  // (the limit lets the log through but not fingerprint.yaml, about 840 bytes)
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.out_dir=runs/new"}, &out, 600) == 2);
  require_one_line_error(out, "cannot write: file size limit exceeded");
  CHECK(!fs::exists(d.root / "runs/new"));
  // ... and in an existing one change nothing.
  const auto listing = [&] {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(d.root / "runs/a")) names.insert(e.path().filename().string());
    return names;
  };
  const auto before = listing();
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--resume", "--set", "train.steps=20"}, &out) == 2);
  require_one_line_error(out, "runs/a belongs to another run");
  CHECK(listing() == before);

  // A report written over a file names --out, not the results file.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "grid.train.seed=[1]"}, &out) == 0);
  write_text(d.root / "notadir", "");
  CHECK(run_cli(d, {"report", "results/tiny.h5", "--out", "notadir"}, &out) == 2);
  require_one_line_error(out, "--out notadir: is a file, not a directory");
  CHECK(run_python(d, std::string(EXTRAP_SOURCE_DIR) + "/analysis/report.py results/tiny.h5 --out notadir",
                   &out) == 1);
  require_one_line_error(out, "report: cannot write notadir: is a file, not a directory");
}

TEST_CASE("the --json of eval, train and task never overwrites what it did not write: a run's files, "
          "another command's output, a directory",
          "[refusals]") {
  SweepDir d;
  write_text(d.root / "t.yaml", kHostileTrainFile);
  std::string out;
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval"}, &out) == 0);
  const std::string config = read_text(d.root / "runs/a/config.yaml");
  // Inside the run directory: its own files (config.yaml, eval.json) or beside them.
  for (const char* path : {"runs/a/config.yaml", "runs/a/results.json", "runs/a/checkpoint/x.json"}) {
    INFO(path);
    CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", path}, &out) == 2);
    require_one_line_error(out, std::string("extrap eval --json ") + path + ": lies inside the run directory");
  }
  CHECK(read_text(d.root / "runs/a/config.yaml") == config);
  // An existing file that is not an earlier --json of the same command is left as it is.
  write_text(d.root / "notes.json", "{\"mine\": 1}\n");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", "notes.json"}, &out) == 2);
  require_one_line_error(out, "notes.json exists and is not an earlier output of `extrap eval --json`");
  CHECK(read_text(d.root / "notes.json") == "{\"mine\": 1}\n");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", "runs"}, &out) == 2);
  require_one_line_error(out, "is a directory");
  // A folder that is missing, or one that cannot be written, is said before the evaluation.
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", "missing/e.json"}, &out) == 2);
  require_one_line_error(out, "extrap eval --json missing/e.json: the directory ");
  CHECK(out.find("perplexity") == std::string::npos);  // no row was computed
  if (geteuid() != 0) {  // root writes anywhere
    fs::create_directories(d.root / "locked");
    fs::permissions(d.root / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", "locked/e.json"}, &out) == 2);
    require_one_line_error(out, "is not writable (Permission denied)");
    fs::permissions(d.root / "locked", fs::perms::owner_all);
  }
  // An earlier output of the same command is replaced; another command's is not.
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--json", "e.json"}, &out) == 0);
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "32", "--json", "e.json"}, &out) == 0);
  CHECK(read_text(d.root / "e.json").find("\"written_by\": \"extrap eval --json\"") != std::string::npos);
  CHECK(run_cli(d, {"task", "--length", "200", "--json", "e.json"}, &out) == 2);
  require_one_line_error(out, "not an earlier output of `extrap task --json`");
}

TEST_CASE("eval: a stride longer than a length scores non-overlapping windows there and says so",
          "[refusals]") {
  SweepDir d;
  write_text(d.root / "t.yaml", kHostileTrainFile);
  std::string out;
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval"}, &out) == 0);
  // Windows 64 apart at L = 32 would leave tokens unscored: every token is scored once.
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "32", "-S", "64"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("32         stride 64 is longer than the length: scored non-overlapping"));
  CHECK_THAT(out, Catch::Contains("32         32             2399"));
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "48", "-S", "32",
                      "--max-tokens", "500"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("16         stride 32 is longer than the length: scored non-overlapping"));
  // --max-tokens is credited to itself, not to the run's config.
  CHECK_THAT(out, Catch::Contains("scoring the first 500 of 2400 tokens of the valid split (--max-tokens)"));

  // --device: the CPU explicitly gives the same numbers; a device this machine lacks, or one
  // extrap does not know, is refused in one line.
  std::string by_default, on_cpu;
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--max-tokens", "500"}, &by_default) == 0);
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--max-tokens", "500", "--device", "cpu"},
                  &on_cpu) == 0);
  const auto row = [](const std::string& text) {  // the row at L 16 without its seconds
    const size_t at = text.find("\n16 ");
    return at == std::string::npos ? std::string() : text.substr(at, text.find(" 0.", at) - at);
  };
  CHECK_FALSE(row(by_default).empty());
  CHECK(row(on_cpu) == row(by_default));
  if (!torch::cuda::is_available()) {
    CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--device", "cuda"}, &out) == 2);
    require_one_line_error(out, "--device cuda, but ");
  }
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16", "--device", "tpu"}, &out) == 2);
  require_one_line_error(out, "--device");
  CHECK_THAT(out, Catch::Contains("tpu"));

  // A sweep whose points would evaluate nothing is refused.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--set", "eval.nonoverlapping=false", "--set",
                    "eval.strides=[64]"},
                &out) == 2);
  require_one_line_error(out, "has nothing to evaluate: eval.nonoverlapping is false and no stride is "
                        "below any of its evaluation lengths");
}

TEST_CASE("the small command-line items: keys' marks, sweep --status, --help, hints, early "
          "refusals, word-level bpb",
          "[cli]") {
  SweepDir d;
  write_text(d.root / "t.yaml", kHostileTrainFile);
  std::string out;
  REQUIRE(run_cli(d, {"keys"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("affects"));
  // Line by line: a regex over the whole listing ("(.|\n)*") recurses once a character in
  // libstdc++ and overflows the stack on a long one.
  const auto line_of = [&](const std::string& key) {
    const auto at = out.find("\n" + key + " ");
    return at == std::string::npos ? std::string() : out.substr(at + 1, out.find('\n', at + 1) - at - 1);
  };
  CHECK_THAT(line_of("model.d_model"), Catch::Matches("model.d_model +256 +model +.*"));
  CHECK_THAT(line_of("train.threads"), Catch::Matches("train.threads +0 +nothing +.*"));
  REQUIRE(run_cli(d, {"keys", "--sweep"}, &out) == 0);
  for (const char* key : {"grid", "eval.length_multiples", "eval.rope_scaling",
                          "eval.retrieval.task", "jobs", "output.run_root"})
    CHECK_THAT(out, Catch::Contains(std::string("\n") + key + " "));

  // --status before, during nothing, and after a sweep.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--status"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("(no results yet)"));
  CHECK_THAT(out, Catch::Contains("\nalibi-seed1  [pending, 0/6 evals]"));
  CHECK_THAT(out, Catch::Contains("points: 4 pending"));
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("--out reports/tiny)"));
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--status"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("\nalibi-seed1  [complete, 6/6 evals]"));
  CHECK_THAT(out, Catch::Contains("\n" + sweep_ids(d)[2] + "  [complete, 6/6 evals (3 failed)]"));
  CHECK_THAT(out, Catch::Contains("points: 4 complete"));
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("\nalibi-seed1  [complete, 6/6 evals]  {position: {name: alibi}"));
  // The closing hint names a report directory of this results file, not the sweep's name.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "grid.train.seed=[1]", "--set",
                      "output.run_root=runs/other", "--out", "results/other.h5"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("(extrap report results/other.h5 --out reports/other)"));

  // --help: train shows --nproc; sweep does not show its workers' options.
  REQUIRE(run_cli(d, {"train", "--help"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("--nproc N"));
  REQUIRE(run_cli(d, {"sweep", "--help"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("--status"));
  CHECK(out.find("--worker") == std::string::npos);
  CHECK(out.find("internal") == std::string::npos);

  // A misspelt method is refused before the corpus is read.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "position=alibbi"}, &out) == 2);
  require_one_line_error(out, "unknown position method 'alibbi'");
  CHECK(out.find("corpus corpus") == std::string::npos);

  // Word-level evaluation: no bits per byte, and a line that says why (it printed nan).
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--set", "data.tokenizer=word", "--set",
                      "train.out_dir=runs/w"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("(bpb: bits per byte need the bytes of text behind each token"));
  CHECK_THAT(out, Catch::Contains("word tokens here do not say how many bytes they cover"));
  CHECK(out.find("nan") == std::string::npos);
}
