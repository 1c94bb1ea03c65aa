// Every path gives the right number or refuses with one clear line: run identity, checkpoint
// verification, non-finite numbers, lengths the data cannot fill, bad sweep files, full disks,
// conflicting merges. Through the `extrap` command line, on the tiny sweep of cli_harness.h.
#include <sys/file.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "core/base/files.h"
#include "core/results/results_store.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using extrap::ResultsStore;
using namespace extrap::testing;

namespace {

const char* const kRefusedTrainFile = R"(data: {path: corpus, tokenizer: byte, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: alibi
train: {seq_len: 16, batch_tokens: 256, steps: 10, lr: 0.003, warmup: 2, validate_every: 0,
        validate_tokens: 512, checkpoint_every: 5, log_every: 5, threads: 1, out_dir: runs/a}
eval: {lengths: [16], max_tokens: 1024}
)";

void flip_byte(const fs::path& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(at);
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("a run directory has an identity: other configs, a second writer and overwrites are refused",
          "[refusals]") {
  SweepDir d;
  std::ofstream(d.root / "t.yaml") << kRefusedTrainFile;
  std::string out;
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml"}, &out) == 0);

  // Training again over the finished run is refused; --overwrite replaces it.
  CHECK(run_cli(d, {"train", "-c", "t.yaml"}, &out) == 2);
  require_one_line_error(out, "runs/a already holds a trained run (a checkpoint); --resume continues it");
  // Resuming with a result-affecting key changed is refused, naming the key and both values.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--resume", "--set", "train.steps=20"}, &out) == 2);
  require_one_line_error(out, "runs/a belongs to another run: first difference at 'config.train.steps': "
                              "10 in runs/a/fingerprint.yaml, 20 now");
  // Keys marked as not affecting the model (threads, logging) may change.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--resume", "--set", "train.log_every=3", "--no-eval"},
                &out) == 0);
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--overwrite", "--set", "train.steps=5", "--no-eval"},
                &out) == 0);
  CHECK(read_text(d.root / "runs/a/fingerprint.yaml").find("steps: 5") != std::string::npos);

  // A second writer is refused, naming the holder.
  const std::string lock_path = (d.root / "runs/a/lock").string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX | LOCK_NB) == 0);
  const std::string pid = std::to_string(::getpid()) + "\n";
  REQUIRE(::pwrite(fd, pid.data(), pid.size(), 0) == ssize_t(pid.size()));
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--resume", "--set", "train.steps=5"}, &out) == 2);
  require_one_line_error(out, "runs/a is being trained by another extrap process (pid " +
                                  std::to_string(::getpid()));
  ::close(fd);

  // Two sweeps sharing a run root: the second (another step count) is refused, not resumed
  // from the first's models.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "base.train.steps=10"}, &out) == 0);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--out", "results/other.h5"}, &out) == 2);
  require_one_line_error(out, "runs/tiny/alibi-seed1 belongs to another run: first difference at "
                              "'config.train.steps': 10 in");
  CHECK((!fs::exists(d.root / "results/other.h5") ||
         ResultsStore::open((d.root / "results/other.h5").string()).points().empty()));
}

TEST_CASE("checkpoints are verified: truncated, bit-flipped or another vocabulary are refused",
          "[refusals]") {
  SweepDir d;
  std::ofstream(d.root / "t.yaml") << kRefusedTrainFile;
  std::string out;
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval"}, &out) == 0);
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16"}, &out) == 0);
  const std::string good = out;

  fs::copy(d.root / "runs/a", d.root / "runs/t", fs::copy_options::recursive);
  fs::resize_file(d.root / "runs/t/checkpoint/model.pt", 1000);
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/t", "-L", "16"}, &out) == 2);
  require_one_line_error(out, "runs/t/checkpoint/model.pt: 1000 bytes, the manifest says");
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--resume", "--set", "train.out_dir=runs/t"}, &out) == 2);
  require_one_line_error(out, "runs/t/checkpoint/model.pt: 1000 bytes");

  fs::copy(d.root / "runs/a", d.root / "runs/f", fs::copy_options::recursive);
  flip_byte(d.root / "runs/f/checkpoint/model.pt", 2000);
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/f", "-L", "16"}, &out) == 2);
  require_one_line_error(out, "runs/f/checkpoint/model.pt: checksum");
  CHECK(out.find("the checkpoint is corrupt") != std::string::npos);
  CHECK(out.find("perplexity") == std::string::npos);

  // Its last byte alone: a checksum of part of the file would pass it.
  fs::copy(d.root / "runs/a", d.root / "runs/l", fs::copy_options::recursive);
  flip_byte(d.root / "runs/l/checkpoint/model.pt", std::streamoff(fs::file_size(d.root / "runs/l/checkpoint/model.pt") - 1));
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/l", "-L", "16"}, &out) == 2);
  require_one_line_error(out, "runs/l/checkpoint/model.pt: checksum");

  fs::copy(d.root / "runs/a", d.root / "runs/m", fs::copy_options::recursive);
  fs::remove(d.root / "runs/m/checkpoint/manifest.json");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/m", "-L", "16"}, &out) == 2);
  require_one_line_error(out, "runs/m/checkpoint: no manifest.json");

  // A word-level run evaluated after its corpus gained words: another vocabulary.
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval", "--set", "data.tokenizer=word", "--set",
                      "train.out_dir=runs/w"},
                  &out) == 0);
  std::ofstream(d.root / "corpus/train.txt", std::ios::app) << "\nunheard-of words appear\n";
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/w", "-L", "16"}, &out) == 2);
  require_one_line_error(out, "runs/w/checkpoint was trained with another vocabulary");
  // The untouched run still evaluates to the same numbers.
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "16"}, &out) == 0);
}

TEST_CASE("non-finite numbers and lengths the data cannot fill are failures, never 'ok'",
          "[refusals]") {
  SweepDir d;
  std::ofstream(d.root / "t.yaml") << kRefusedTrainFile;
  std::string out;
  // A diverging run stops naming the step; nothing of it is checkpointed.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.lr=1e30", "--set", "train.clip=0"},
                &out) == 1);
  require_one_line_error(out, "training diverged at step ");
  CHECK(!fs::exists(d.root / "runs/a/checkpoint"));

  // In a sweep the point is recorded as failed with the reason.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "base.train.lr=1e30", "--set",
                      "base.train.clip=0", "--set", "grid.train.seed=[1]", "--set",
                      "output.run_root=runs/nan", "--out", "results/nan.h5"},
                  &out) == 0);
  const ResultsStore diverged = ResultsStore::open((d.root / "results/nan.h5").string());
  REQUIRE(!diverged.points().empty());
  for (const auto& p : diverged.points()) {
    INFO(p.status);
    CHECK(p.status.rfind("failed: training: training diverged at step", 0) == 0);
  }

  // An evaluation length past the data: `extrap eval` exits non-zero naming the length; the
  // sweep records the point as failed. --stride 0 is an error; a stride >= L is non-overlapping.
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval", "--set", "train.out_dir=runs/ok"},
                  &out) == 0);
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/ok", "-L", "16", "5000"}, &out) == 1);
  CHECK(out.find("scoring all 2400 tokens of the valid split") != std::string::npos);
  require_one_line_error(out, "5000       5000     failed: evaluation length 5000 needs at least "
                              "5001 tokens; the split has 2400 tokens");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/ok", "-L", "16", "-S", "0"}, &out) == 2);
  require_one_line_error(out, "--stride 0: must be at least 1");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/ok", "-L", "16", "32", "16"}, &out) == 2);
  require_one_line_error(out, "--length 16: is listed twice");
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/ok", "-L", "16", "-S", "16"}, &out) == 0);
  CHECK(out.find("16         16             2399") != std::string::npos);

  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "eval.lengths=[4096]", "--set",
                      "eval.length_multiples=[]", "--set", "eval.strides=[]", "--out",
                      "results/long.h5"},
                  &out) == 0);
  const auto long_points = ResultsStore::open((d.root / "results/long.h5").string()).points();
  REQUIRE(long_points.size() == 4 * 3);  // non-overlapping windows; profiles at 16 and 4096
  for (const auto& p : long_points) {
    INFO(p.mode << " " << p.eval_length);
    if (p.mode == extrap::kProfileMode && p.eval_length == 16)
      CHECK(p.ok());
    else if (p.mode == extrap::kProfileMode)
      CHECK(p.status == "failed: attention profile at length 4096: the first 1024 tokens of the "
                        "stream's 2400 (max_tokens) cannot fill one window (give a shorter length or "
                        "more tokens)");
    else
      CHECK(p.status == "failed: evaluation length 4096 needs at least 4097 tokens; the split has "
                        "1024 tokens (the first eval.max_tokens of 2400)");
  }

  // An empty validation split: nothing to score is a failure, not a perplexity; training, which
  // validates at its last step, is refused before its first.
  std::ofstream(d.root / "corpus/valid.txt", std::ios::trunc) << "";
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--set", "grid.train.seed=[1]", "--set",
                      "base.train.validate_every=0", "--set", "output.run_root=runs/empty",
                      "--out", "results/empty.h5"},
                  &out) == 0);
  const auto empty = ResultsStore::open((d.root / "results/empty.h5").string()).points();
  REQUIRE(!empty.empty());
  for (const auto& p : empty) {
    INFO(p.status);
    CHECK(!p.ok());
    CHECK(p.status.find("validation needs 17 tokens (a window of train.seq_len 16); the validation split has 0") !=
          std::string::npos);
  }
  REQUIRE(run_cli(d, {"report", "results/empty.h5", "--out", "report-empty"}, &out) == 0);
}

TEST_CASE("sweep files: scalar grids, duplicates, empty evaluations and shards' outputs", "[refusals]") {
  SweepDir d;
  std::string out;
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.seed=1"}, &out) == 2);
  require_one_line_error(out, "--set 'grid.train.seed=1': a grid axis is a list of values, e.g. "
                              "grid.train.seed=[1]");
  {
    std::string text = kSweepFile;
    const size_t at = text.find("train.seed: [1, 2]");
    REQUIRE(at < text.size());
    text = text.substr(0, at) + "train.seed: 1" + text.substr(at + 18);
    std::ofstream(d.root / "scalar.yaml") << text;
  }
  CHECK(run_cli(d, {"sweep", "scalar.yaml", "--list"}, &out) == 2);
  require_one_line_error(out, "scalar.yaml:11: key 'grid.train.seed': expected a non-empty list");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "grid.train.seed=[1, 1]"}, &out) == 2);
  require_one_line_error(out, "the value 1 is listed twice");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.length_multiples=[]"}, &out) == 2);
  require_one_line_error(out, "no evaluation lengths");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "eval.strides=[8, 8]"}, &out) == 2);
  require_one_line_error(out, "8 is listed twice");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "jobs=0"}, &out) == 2);
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "base.train.lr="}, &out) == 2);
  require_one_line_error(out, "--set 'base.train.lr=': no value after '='");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--list", "--set", "base.model.d_ffn=-1"}, &out) == 2);
  require_one_line_error(out, "key 'model.d_ffn' (set on the command line or by a sweep's grid): "
                              "must not be negative, got -1");

  // --shard with --out: each shard to its own file.
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--list", "--shard", "1/2", "--out", "results/x.h5"},
                  &out) == 0);
  CHECK(out.find("-> results/x.shard-1-of-2.h5") != std::string::npos);
}

TEST_CASE("a sweep's --out is refused before any lock when it is a directory, in a run directory or not HDF5",
          "[refusals]") {
  SweepDir d;
  std::string out;
  // A run directory, made as `extrap train` makes it.
  fs::create_directories(d.root / "runs/r");
  write_text(d.root / "runs/r/fingerprint.yaml", "run: x\n");
  write_text(d.root / "runs/r/metrics.jsonl", "{\"step\": 1}\n");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--out", "runs/r/metrics.jsonl"}, &out) == 2);
  require_one_line_error(out, "runs/r/metrics.jsonl: lies inside the run directory");
  CHECK(read_text(d.root / "runs/r/metrics.jsonl") == "{\"step\": 1}\n");
  CHECK(!fs::exists(d.root / "runs/r/metrics.jsonl.lock"));
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--out", "runs/r/new.h5"}, &out) == 2);
  CHECK(!fs::exists(d.root / "runs/r/new.h5"));
  CHECK(!fs::exists(d.root / "runs/r/new.h5.lock"));
  // A file of something else, and a directory.
  write_text(d.root / "notes.txt", "my own notes, not results\n");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--out", "notes.txt"}, &out) == 2);
  require_one_line_error(out, "notes.txt: exists and is not an HDF5 results file; it is left as it is");
  CHECK(read_text(d.root / "notes.txt") == "my own notes, not results\n");
  CHECK(!fs::exists(d.root / "notes.txt.lock"));
  fs::create_directories(d.root / "adir");
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--quiet", "--out", "adir"}, &out) == 2);
  require_one_line_error(out, "adir: is a directory; give a results file name");
  CHECK(!fs::exists(d.root / "adir.lock"));
}

TEST_CASE("a full disk names the file and keeps every earlier result, and merges refuse conflicts",
          "[refusals]") {
  SweepDir d;
  std::string out;
  // Every checkpoint file of this tiny model stays under 96 KiB (the optimiser state, the
  // largest, is about 47 KiB); the results file (about 75 KiB after its first point, HDF5
  // metadata mostly) outgrows it.
  const std::vector<std::string> args = {
      "sweep", "tiny.yaml", "--quiet", "--set", "base.model.d_model=8", "--set",
      "base.model.heads=2", "--set", "base.model.d_ffn=16", "--set",
      "grid.train.seed=[1, 2, 3, 4, 5, 6]", "--set", "eval.length_multiples=[1, 2, 3]"};
  CHECK(run_cli(d, args, &out, 96 * 1024) == 2);
  require_one_line_error(out, "results/tiny.h5.tmp: cannot write: file size limit exceeded "
                              "(results/tiny.h5 is unchanged)");
  const auto before = ResultsStore::open((d.root / "results/tiny.h5").string()).points();
  CHECK(!before.empty());
  // With room again the same command finishes, and what was written before is kept as it was.
  REQUIRE(run_cli(d, args, &out) == 0);
  const ResultsStore after = ResultsStore::open((d.root / "results/tiny.h5").string());
  CHECK(after.points().size() == 12 * 8);  // 3 lengths x 2 modes, 2 attention profiles
  for (const auto& p : before) {
    const auto* q = after.point(p.run_id, p.mode, p.eval_length);
    REQUIRE(q);
    CHECK(q->nll_sum == p.nll_sum);
  }

  // Two files of one sweep (same spec) holding one point with different numbers do not merge:
  // here the corpus text changed between them (the spec names the corpus by path).
  const std::vector<std::string> one = {"sweep", "tiny.yaml", "--quiet", "--set",
                                        "grid.train.seed=[1]", "--set", "grid.position=[alibi]"};
  auto with = [&](std::vector<std::string> a, const std::string& name) {
    for (const std::string& s : {std::string("--out"), "results/" + name + ".h5", std::string("--set"),
                                 "output.run_root=runs/" + name})
      a.push_back(s);
    return a;
  };
  REQUIRE(run_cli(d, with(one, "a"), &out) == 0);
  std::ofstream(d.root / "corpus/train.txt", std::ios::app) << "More text, another model.\n";
  REQUIRE(run_cli(d, with(one, "b"), &out) == 0);
  CHECK(run_cli(d, {"merge", "results/m.h5", "results/a.h5", "results/b.h5"}, &out) == 2);
  require_one_line_error(out, "point (alibi-seed1, nonoverlapping, L=16) differs between "
                              "results/a.h5 and results/b.h5");
  CHECK(out.find("nothing merged") != std::string::npos);
  CHECK(out.find("(NLL ") != std::string::npos);  // the field that differs, with both values
  CHECK(!fs::exists(d.root / "results/m.h5"));

  // A file whose stored perplexity was edited (or damaged) while its NLL was not: the merge
  // names the field, whichever file comes first.
  {
    const ResultsStore a = ResultsStore::open((d.root / "results/a.h5").string());
    ResultsStore c = ResultsStore::open_or_create((d.root / "results/c.h5").string(), a.header());
    std::vector<extrap::RunRecord> runs;
    for (const auto& [id, run] : a.runs()) runs.push_back(run);
    auto points = a.points();
    REQUIRE(points.front().ok());
    points.front().perplexity *= 2;
    c.write(runs, points);
  }
  for (const auto& order : {std::vector<std::string>{"results/a.h5", "results/c.h5"},
                            std::vector<std::string>{"results/c.h5", "results/a.h5"}}) {
    CHECK(run_cli(d, {"merge", "results/m.h5", order[0], order[1]}, &out) == 2);
    require_one_line_error(out, "differs between " + order[0] + " and " + order[1] + " (perplexity ");
    CHECK(!fs::exists(d.root / "results/m.h5"));
  }
}

TEST_CASE("the small refusals: stray arguments, malformed keys, infinities, a checkpoint of another run, "
          "lengths no memory holds, text that would leave its line",
          "[refusals]") {
  SweepDir d;
  std::ofstream(d.root / "t.yaml") << kRefusedTrainFile;
  std::string out;
  // A word no option takes is refused, not dropped.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "stray"}, &out) == 2);
  require_one_line_error(out, "extrap train: unexpected argument 'stray': options start with --");
  CHECK_FALSE(fs::exists(d.root / "runs/a"));
  // Malformed keys and files are named, never yaml-cpp's or the filesystem's words.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "position={name: [alibi]}"}, &out) == 2);
  require_one_line_error(out, "'name' must be one method's name, got '[alibi]'");
  CHECK(out.find("yaml-cpp") == std::string::npos);
  CHECK(run_cli(d, {"train", "-c", "corpus"}, &out) == 2);
  require_one_line_error(out, "corpus: is a directory, not a file");
  // Infinities are refused where NaN is: a rotary base, a RoPE factor.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "position={name: rotary, base: .inf}"}, &out) == 2);
  require_one_line_error(out, "key 'position.base'");
  require_one_line_error(out, "must be a finite number, got '.inf'");

  // Zero steps: the initial model is the run's checkpoint, and eval.json its evaluation.
  CHECK(run_cli(d, {"train", "-c", "t.yaml", "--set", "train.steps=0", "--set", "train.out_dir=runs/zero"}, &out) == 0);
  REQUIRE(fs::exists(d.root / "runs/zero/checkpoint/manifest.json"));
  CHECK(read_json(d.root / "runs/zero/eval.json").at("step") == 0);
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/zero", "-L", "16", "--max-tokens", "1024", "--json", "zero.json"},
                &out) == 0);
  const auto without_seconds = [](nlohmann::json rows) {
    for (auto& row : rows) row.erase("seconds");
    return rows;
  };
  CHECK(without_seconds(read_json(d.root / "zero.json").at("results")) ==
        without_seconds(read_json(d.root / "runs/zero/eval.json").at("results")));
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/zero", "-L", "16", "--rope-scaling", "yarn", "--rope-factor", "inf"},
                &out) == 2);
  require_one_line_error(out, "--rope-factor inf: must be a finite number of at least 1");
  CHECK(run_cli(d, {"export", "--checkpoint", "runs/zero", "--out", ""}, &out) == 2);
  require_one_line_error(out, "--out '': name the .safetensors file to write");
  CHECK(run_cli(d, {"export", "--checkpoint", "runs/zero", "--out", "corpus"}, &out) == 2);
  require_one_line_error(out, "--out corpus: is a directory");

  // A checkpoint copied into another run's directory is not evaluated as that run.
  REQUIRE(run_cli(d, {"train", "-c", "t.yaml", "--no-eval"}, &out) == 0);
  remove_tree(d.root / "runs/zero/checkpoint");
  fs::copy(d.root / "runs/a/checkpoint", d.root / "runs/zero/checkpoint");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/zero", "-L", "16"}, &out) == 2);
  require_one_line_error(out, "runs/zero/checkpoint was written by another run than runs/zero's");

  // Lengths no memory holds are refused before anything is built: a retrieval instance of 10^12
  // tokens, and the reference attention forced at a length whose scores no machine holds.
  CHECK(run_cli(d, {"task", "--length", "1000000000000"}, &out) == 2);
  require_one_line_error(out, "1 retrieval instance(s) of 1000000000000 tokens needs");
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "--retrieval", "passkey", "-L", "1000000000000"}, &out) == 1);
  require_one_line_error(out, "retrieval instance(s) of 1000000000000 tokens needs");
  std::ofstream(d.root / "long.txt") << std::string(200001, 'a');
  write_text(d.root / "corpus/valid.txt", read_text(d.root / "long.txt"));
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/a", "-L", "200000", "--attention", "reference"}, &out) == 1);
  require_one_line_error(out, "evaluating at length 200000 needs");

  // A Slurm partition with a line break would write a line of its own into the job script.
  CHECK(run_cli(d, {"sweep", "tiny.yaml", "--slurm", "--partition", "gpu\nrm -rf /"}, &out) == 2);
  require_one_line_error(out, "--partition 'gpu\\nrm -rf /': one word of printable characters");
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
  CHECK_FALSE(fs::exists(d.root / "results/tiny.slurm"));

  // SentencePiece's reasons with the flags spelt as extrap takes them.
  CHECK(run_cli(d, {"tokenizer", "train", "--data", "corpus", "--vocab-size", "8", "--out", "x.model"}, &out) == 2);
  require_one_line_error(out, "Increase --vocab-size or decrease --character-coverage");
  CHECK(out.find("vocab_size") == std::string::npos);
  CHECK(out.find("trainer_interface.cc") == std::string::npos);
}
