// Every command a user types, end to end through the `extrap` binary on tiny configs: train,
// an interrupted train resumed, eval (against an in-process evaluation), positions and keys
// (with --plugin and the plugins: key), inspect for every method and mode, both benchmarks;
// and every shipped file in configs/ loads and validates. (sweep --list, report and merge:
// test_sweep.cpp.)
#include <catch2/catch.hpp>
#include <cmath>
#include <regex>
#include <sstream>

#include "core/eval/evaluator.h"
#include "core/model/model.h"
#include "experiments/sweep/sweep_spec.h"
#include "positions/alibi_slopes.h"
#include "positions/position.h"
#include "tests/support/cli_harness.h"
#include "tests/support/position_support.h"

namespace fs = std::filesystem;
using namespace extrap;
using namespace extrap::testing;

namespace {


const char* const kTrainFile = R"(data: {path: corpus, tokenizer: byte, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: alibi
train: {seq_len: 16, batch_tokens: 256, steps: 20, lr: 0.003, warmup: 2, validate_every: 10,
        validate_tokens: 512, checkpoint_every: 5, log_every: 5, threads: 1, out_dir: runs/a}
eval: {lengths: [16, 32], strides: [8], max_tokens: 1024}
)";

// The rows `extrap train` and `extrap eval` print: length stride tokens nll_sum ppl bpb s.
struct EvalRow {
  int64_t length = 0, stride = 0, tokens = 0;
  double nll_sum = 0, perplexity = 0;
};
std::vector<EvalRow> eval_rows(const std::string& output) {
  static const std::regex row(R"((\d+) +(\d+) +(\d+) +([0-9.]+) +([0-9.]+) +[0-9.]+ +[0-9.]+)");
  std::vector<EvalRow> rows;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (!std::regex_match(line, m, row)) continue;
    rows.push_back({std::stoll(m[1]), std::stoll(m[2]), std::stoll(m[3]), std::stod(m[4]), std::stod(m[5])});
  }
  return rows;
}

// Parses `inspect bias` output: "head h" then T rows of T numbers, per head. Lines before the
// first head are notes (stderr, e.g. "fox: ... shown at a zero input").
std::vector<std::vector<std::vector<double>>> bias_blocks(const std::string& output) {
  std::vector<std::vector<std::vector<double>>> heads;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("head ", 0) == 0) {
      heads.emplace_back();
      continue;
    }
    if (heads.empty()) continue;
    std::istringstream fields(line);
    std::vector<double> row;
    for (std::string f; fields >> f;)
      row.push_back(f == "-inf" ? -INFINITY : f == "inf" ? INFINITY : std::stod(f));
    heads.back().push_back(row);
  }
  return heads;
}

}  // namespace

TEST_CASE("train, an interrupted train --resume, and eval agree with an in-process evaluation",
          "[cli]") {
  SweepDir d;
  write_text(d.root / "train.yaml", kTrainFile);
  std::string out;
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml"}, &out) == 0);
  // The evaluation after training: eval.lengths x (non-overlapping, stride 8), 1023 targets.
  auto rows = eval_rows(out);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].length == 16);
  CHECK(rows[0].stride == 16);
  CHECK(rows[1].length == 16);
  CHECK(rows[1].stride == 8);
  CHECK(rows[3].length == 32);
  for (const auto& r : rows) CHECK(r.tokens == 1023);

  // The same run killed right after its second checkpoint (step 10), then resumed.
  const auto stops = kill_at(d, {"train", "--config", "train.yaml", "--set", "train.out_dir=runs/b"},
                             "checkpoint:2");
  REQUIRE_THAT(stops[0].detail, Catch::EndsWith("runs/b step 10"));
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--set", "train.out_dir=runs/b", "--resume"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("resuming runs/b from step 10"));

  // `extrap eval` of both runs: the resumed run is the uninterrupted one, bit for bit.
  std::string a_out, b_out;
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "--length", "16", "48",
                      "--stride", "5", "--max-tokens", "1000", "--threads", "1"},
                  &a_out) == 0);
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/b", "--length", "16", "48",
                      "--stride", "5", "--max-tokens", "1000", "--threads", "1"},
                  &b_out) == 0);
  const auto a_rows = eval_rows(a_out), b_rows = eval_rows(b_out);
  REQUIRE(a_rows.size() == 2);
  REQUIRE(b_rows.size() == 2);
  for (size_t i = 0; i < 2; ++i) CHECK(a_rows[i].nll_sum == b_rows[i].nll_sum);
  CHECK_THAT(a_out, Catch::Contains("scoring the first 1000 of"));

  // The printed numbers are an in-process evaluation of the checkpoint.
  auto [corpus, run] = load_cli_run(d, "runs/a");
  CHECK(run.step == 20);
  for (const auto& row : a_rows) {
    INFO("L " << row.length << " stride " << row.stride);
    EvalSpec spec;
    spec.length = row.length;
    spec.stride = 5;
    spec.max_tokens = 1000;
    const auto r = evaluate(run.model, corpus, corpus.valid, spec);
    CHECK(row.stride == 5);
    CHECK(row.tokens == 999);
    CHECK(row.tokens == r.scored_tokens);
    CHECK(row.nll_sum == Approx(r.nll_sum).margin(0.0005));  // printed to 3 decimals
    CHECK(row.perplexity == Approx(r.perplexity).margin(0.00005));
  }
}

TEST_CASE("positions, keys, --plugin and the plugins: key", "[cli]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"positions"}, &out) == 0);
  for (const char* name : {"none", "sinusoidal", "learned", "alibi", "rotary", "t5_bias",
                           "alibi_symmetric", "alibi_nonsymmetric", "alibi_learned", "kerple_log",
                           "kerple_power", "sandwich", "xpos", "fire", "cope", "fox", "p_rope"}) {
    INFO(name);
    CHECK(("\n" + out).find(std::string("\n") + name + "\n    ") != std::string::npos);
  }
  CHECK(out.find("local_window") == std::string::npos);
  CHECK_THAT(out, Catch::Contains("alibi_symmetric\n") && Catch::Contains("modes: bidirectional"));
  CHECK_THAT(out, Catch::Contains("option randomize_max = 0"));
  CHECK_THAT(out, Catch::Contains("xpos\n") && Catch::Contains("randomized: yes"));
  REQUIRE(run_cli(d, {"positions", "--plugin", kPlugin}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("local_window\n") && Catch::Contains("from: " + kPlugin));

  REQUIRE(run_cli(d, {"keys"}, &out) == 0);
  for (const auto& doc : config_documentation()) {
    if (doc.section) continue;
    INFO(doc.key);
    CHECK(("\n" + out).find("\n" + doc.key + " ") != std::string::npos);
  }

  // A plugin method trains through the command line: by --plugin, and by the plugins: key.
  write_text(d.root / "train.yaml", std::string(kTrainFile) + "plugins: [" + kPlugin + "]\n");
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--set", "position.name=local_window", "--set",
                      "train.steps=6", "--no-eval"},
                  &out) == 0);
  CHECK(fs::exists(d.root / "runs/a/checkpoint/manifest.json"));
  write_text(d.root / "train.yaml", kTrainFile);
  CHECK(run_cli(d, {"train", "--config", "train.yaml", "--set", "position.name=local_window", "--set",
                    "train.out_dir=runs/c", "--no-eval"},
                &out) == 2);
  CHECK_THAT(out, Catch::Contains("unknown position method 'local_window'"));
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--plugin", kPlugin, "--set",
                      "position.name=local_window", "--set", "train.steps=6", "--set",
                      "train.out_dir=runs/c", "--no-eval"},
                  &out) == 0);
  CHECK(fs::exists(d.root / "runs/c/checkpoint/manifest.json"));
}

TEST_CASE("inspect bias works for every method and mode, and shows a checkpoint's values", "[cli]") {
  SweepDir d;
  auto& registry = PositionRegistry::instance();
  registry.load_plugin(kPlugin);
  const int64_t heads = 4, T = 5;
  const auto slopes = alibi_slopes(int(heads));
  for (const auto& name : registry.names()) {
    const PositionInfo& info = registry.get(name);
    for (bool causal : {true, false}) {
      INFO(name << (causal ? " (causal)" : " (bidirectional)"));
      std::vector<std::string> args = {"inspect", "bias", "--position", name, "--heads",
                                       std::to_string(heads), "--length", std::to_string(T),
                                       "--plugin", kPlugin};
      if (!causal) args.push_back("--bidirectional");
      std::string out;
      const int code = run_cli(d, args, &out);
      if (!(info.modes & (causal ? kCausal : kBidirectional))) {
        CHECK(code == 2);  // refused, with the method to use instead where there is one
        const std::string& alternative = causal ? info.causal_alternative : info.bidirectional_alternative;
        CHECK_THAT(out, Catch::Contains(name) && Catch::Contains(alternative));
        continue;
      }
      REQUIRE(code == 0);
      const auto blocks = bias_blocks(out);
      REQUIRE(blocks.size() == size_t(heads));
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < T; ++i) {
          REQUIRE(blocks[h][i].size() == size_t(T));
          for (int64_t j = 0; j < T; ++j) {
            const double v = blocks[h][i][j];
            INFO("head " << h << " (" << i << ", " << j << ") = " << v);
            // alibi_nonsymmetric: the first half of the heads looks left, the rest right.
            const bool hidden = (causal && j > i) ||
                                (name == "alibi_nonsymmetric" && (h < heads / 2 ? j > i : j < i)) ||
                                (name == "stick_breaking" && j == i);  // keys before the query only
            if (hidden) {
              CHECK(v == -INFINITY);
              continue;
            }
            CHECK(std::isfinite(v));
            const double m = slopes[size_t(h)], distance = double(std::abs(i - j));
            if (name == "none" || name == "sinusoidal" || name == "learned" || name == "path") CHECK(v == 0);
            if (name == "stick_breaking") {  // log A_ij for the unit query and key: every logit 1 / sqrt(d)
              const double z = 1 / std::sqrt(64.0);  // inspect bias's default head size
              CHECK(v == Approx(-std::log1p(std::exp(-z)) - double(i - 1 - j) * std::log1p(std::exp(z))).epsilon(1e-5));
            }
            // alibi_learned starts at ALiBi's slopes, on both sides when bidirectional.
            if (name == "alibi" || name == "alibi_symmetric" || name == "alibi_learned")
              CHECK(v == Approx(-m * distance).epsilon(1e-6));
            if (name == "alibi_nonsymmetric")  // each half has the slopes of heads / 2 heads
              CHECK(v == Approx(-alibi_slopes(int(heads / 2))[size_t(h % (heads / 2))] * distance).epsilon(1e-6));
            // Learned, randomly initialised relative biases: at most 0, a function of i - j.
            if (name == "kerple_log" || name == "kerple_power") {
              CHECK(v <= 0);
              if (i > 0 && j > 0) CHECK(v == blocks[h][i - 1][j - 1]);
            }
            if (name == "sandwich") {  // head size 64 (the default --head-dim)
              double sum = 0;
              for (int k = 1; k <= 32; ++k) sum += std::cos(distance * std::pow(10000.0, -2.0 * k / 64.0));
              CHECK(v == Approx((sum - 32.0) / (8.0 * double(h + 1) / double(heads))).margin(1e-5));
            }
            if (name == "fox") CHECK(v == Approx(-std::log(2.0) * distance).epsilon(1e-6));  // zero input: gates 1/2
            if (name == "cope" || name == "local_window") CHECK(v == 0);  // zero embeddings; window 64
            if (name == "fire") CHECK(std::abs(v) < 100);
            if (name == "rotary" || name == "xpos" || name == "p_rope") {
              // A fixed unit query and key: 1 on the diagonal, a function of i - j only.
              if (i == j) CHECK(v == Approx(1.0).epsilon(1e-6));
              if (i > 0 && j > 0) CHECK(v == Approx(blocks[h][i - 1][j - 1]).margin(1e-6));
            }
            if (name == "t5_bias" && i > 0 && j > 0) CHECK(v == blocks[h][i - 1][j - 1]);
          }
        }
    }
  }

  // --checkpoint: a trained alibi_learned run's own slopes, not the initial ones.
  write_text(d.root / "train.yaml", kTrainFile);
  std::string out;
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--set", "position.name=alibi_learned",
                      "--set", "train.lr=0.05", "--no-eval"},
                  &out) == 0);
  REQUIRE(run_cli(d, {"inspect", "bias", "--checkpoint", "runs/a", "--length", "3"}, &out) == 0);
  const auto trained = bias_blocks(out);
  REQUIRE(trained.size() == 2);  // the checkpoint's 2 heads
  const auto initial = alibi_slopes(2);
  bool moved = false;
  for (int h = 0; h < 2; ++h) {
    const double slope = -trained[h][1][0];
    CHECK(slope > 0);
    CHECK(trained[h][2][0] == Approx(2 * trained[h][1][0]).epsilon(1e-6));  // still linear
    moved = moved || std::abs(slope - initial[size_t(h)]) > 1e-4 * initial[size_t(h)];
  }
  CHECK(moved);
}

TEST_CASE("bench train and bench attention run on tiny shapes and report what they measured",
          "[cli]") {
  SweepDir d;
  write_text(d.root / "train.yaml", kTrainFile);
  std::string out;
  REQUIRE(run_cli(d, {"bench", "train", "--config", "train.yaml", "--steps", "3", "--warmup", "1"}, &out) == 0);
  CHECK_THAT(out, Catch::Contains("model: ") && Catch::Contains("position alibi"));
  CHECK_THAT(out, Catch::Contains("shape: 16 sequences x 16 tokens"));
  CHECK_THAT(out, Catch::Contains("over 3 steps"));
  std::smatch m;
  REQUIRE(std::regex_search(out, m, std::regex(R"(tokens/s: (\d+))")));
  CHECK(std::stod(m[1]) > 0);

  REQUIRE(run_cli(d, {"bench", "attention", "--lengths", "64,96", "--heads", "2", "--head-dim", "8",
                      "--repeats", "1", "--threads", "1"},
                  &out) == 0);
  // One row per length; the efficient path, the fused kernel (it takes ALiBi) and SDPA agree
  // with the reference.
  for (const char* length : {"64", "96"}) {
    INFO("T " << length);
    REQUIRE(std::regex_search(out, m, std::regex(std::string(R"(\n +)") + length +
                                                 R"( .* ([0-9.e+-]+) +([0-9.e+-]+) +([0-9.e+-]+)\n)")));
    CHECK(std::stod(m[1]) < 1e-5);
    CHECK(std::stod(m[2]) < 1e-5);
    CHECK(std::stod(m[3]) < 1e-5);
  }
}

TEST_CASE("train.precision bf16 on a CPU without bf16 hardware warns once with its cost", "[cli]") {
  SweepDir d;
  write_text(d.root / "train.yaml", kTrainFile);
  const std::vector<std::string> args = {"train", "--config", "train.yaml", "--no-eval",
                                         "--set", "train.steps=2", "--set", "train.precision=bf16"};
  const std::string warning = "extrap: warning: train.precision bf16 on a CPU without AVX512_BF16 or AMX";
  std::string out;
  {
    // Capped to AVX2 (core/runtime/cpu_isa.h), every CPU is one without bf16 hardware.
    const ScopedVariable capped("ATEN_CPU_CAPABILITY", "avx2");
    REQUIRE(run_cli(d, args, &out) == 0);
  }
  const auto first = out.find(warning);
  REQUIRE(first != std::string::npos);
  CHECK_THAT(out, Catch::Contains("about 18x slower than fp32") &&
                      Catch::Contains("train.precision: fp32 is faster here"));
  CHECK(out.find(warning, first + 1) == std::string::npos);
  // fp32 never warns.
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml", "--no-eval", "--set", "train.steps=2",
                      "--set", "train.out_dir=runs/fp32"},
                  &out) == 0);
  CHECK(out.find(warning) == std::string::npos);
}

TEST_CASE("every shipped config in configs/ loads and validates", "[cli]") {
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(EXTRAP_SOURCE_DIR) / "configs")) {
    if (entry.path().extension() != ".yaml") continue;
    ++files;
    const std::string path = entry.path().string();
    INFO(path);
    std::vector<Config> configs;
    if (read_text(entry.path()).find("\nreleased:") != std::string::npos) {
      // Released checkpoints are folders the user has: the file reads up to its first model, which
      // it names (tests/hub/test_import.cpp runs it on tiny checkpoints).
      CHECK_THROWS_WITH(load_sweep(path, {}), Catch::Contains("no such folder in the working directory"));
      continue;
    }
    if (read_text(entry.path()).find("\ngrid:") != std::string::npos) {
      const SweepSpec spec = load_sweep(path, {});
      for (const auto& point : expand_grid(spec)) configs.push_back(point.config);
      CHECK(!configs.empty());
    } else {
      configs.push_back(load_config(path, {}));
    }
    for (const auto& config : configs) {
      // The position method and its options, as the model builds them.
      CHECK_NOTHROW(PositionRegistry::instance().create(
          config.position_name, position_context(config.model), OptionReader(config.position, path, "position")));
    }
  }
  CHECK(files >= 4);
}
