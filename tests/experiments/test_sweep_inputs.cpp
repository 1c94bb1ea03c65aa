// What a sweep's recorded numbers were computed from (EvalInputs, core/results/results_store.h):
// a grown or continued sweep, and a merge, never pool numbers computed from other inputs with
// the recorded ones: an edited validation or training text, a run trained again, another LongPPL
// reference; and every evaluation setting of a sweep file either makes new points (growth) or
// is refused.
#include <catch2/catch.hpp>
#include <filesystem>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "core/base/files.h"
#include "core/results/results_store.h"
#include "tests/support/cli_harness.h"

namespace fs = std::filesystem;
using namespace extrap;
using namespace extrap::testing;

namespace {

// One ALiBi point, evaluated at L (non-overlapping) with LongPPL; seed 2 and 2 L grow it.
const std::vector<std::string> kOne = {"grid.position=[{name: alibi}]", "grid.train.seed=[1]",
                                       "eval.length_multiples=[1]", "eval.strides=[]",
                                       "eval.attention_profile=false"};

std::vector<std::string> with(std::vector<std::string> settings, const std::vector<std::string>& more) {
  settings.insert(settings.end(), more.begin(), more.end());
  return settings;
}

// Each weight of the run's checkpoint moved by `delta`, its optimiser state and manifest as they
// were: the same run, trained again to other weights.
void retrain(const SweepDir& d, const std::string& run, double delta) {
  const InDirectory in_directory(d);
  const VerifiedCheckpoint checkpoint = require_checkpoint(run);
  const fs::path dir = fs::path(run) / "checkpoint";
  const std::string optimizer = read_text(dir / "optimizer.pt");
  const auto optimizer_entry = nlohmann::json::parse(read_text(dir / "manifest.json")).at("files").at("optimizer.pt");
  auto [corpus, loaded] = load_cli_run(d, run);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : loaded.model->parameters()) p.add_(delta);
  }
  save_checkpoint(run, checkpoint.config, checkpoint.manifest, checkpoint.state, loaded.model, nullptr);
  write_text(dir / "optimizer.pt", optimizer);
  auto manifest = nlohmann::json::parse(read_text(dir / "manifest.json"));
  manifest["files"]["optimizer.pt"] = optimizer_entry;
  write_text(dir / "manifest.json", manifest.dump(1) + "\n");
}

// `out` is a refusal naming `reason` and the recorded point `named`; the results file holds the
// points it held (`before`, its bytes: byte for byte where the refusal came before anything was
// trained, and the sweep's spec did not grow), and `absent` (a run directory the refused point
// would have trained) was not made.
void require_inputs_refused(const SweepDir& d, const std::string& out, const std::string& before,
                            const std::string& reason, const std::string& named, const std::string& absent = "",
                            bool byte_for_byte = true) {
  require_one_line_error(out, reason);
  CHECK_THAT(out, Catch::Contains(named) && Catch::Contains("would pool their numbers with the new ones"));
  const std::string now = read_text(d.root / "results/tiny.h5");
  if (byte_for_byte) CHECK(now == before);
  write_text(d.root / "before.h5", before);
  const ResultsStore was = ResultsStore::open((d.root / "before.h5").string());
  const ResultsStore is = ResultsStore::open((d.root / "results/tiny.h5").string());
  REQUIRE(is.points().size() == was.points().size());
  for (size_t i = 0; i < was.points().size(); ++i) CHECK(is.points()[i].nll_sum == was.points()[i].nll_sum);
  if (!absent.empty()) CHECK_FALSE(fs::exists(d.root / absent));
}

}  // namespace

TEST_CASE("a grown sweep refuses to pool numbers of an edited validation or training text, a run "
          "trained again or another LongPPL reference with the recorded ones",
          "[sweep][growth][inputs]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, sweep_with(kOne), &out) == 0);
  const fs::path results = d.root / "results/tiny.h5";
  {
    const ResultsStore store = ResultsStore::open(results.string());
    REQUIRE(store.points().size() == 1);
    const EvalInputs& inputs = store.points()[0].inputs;
    CHECK(inputs.model.size() == 16);
    CHECK(inputs.data_key.size() == 16);
    CHECK(inputs.corpus.size() == 16);
    CHECK(inputs.tokens.size() == 16);
    CHECK(inputs.reference.empty());
  }
  const std::string before = read_text(results);
  const std::vector<std::string> seed2 = with(kOne, {"grid.train.seed=[1, 2]"});
  const std::vector<std::string> longer = with(kOne, {"eval.length_multiples=[1, 2]"});

  // The validation text edited: neither a new point nor a new length of the recorded one.
  const std::string valid = read_text(d.root / "corpus/valid.txt");
  write_text(d.root / "corpus/valid.txt", "Edited. " + valid.substr(8));
  CHECK(run_cli(d, sweep_with(seed2), &out) == 2);
  require_inputs_refused(d, out, before, "not evaluating alibi-seed2: the valid split of corpus (its first 1024 tokens) differs from the text",
                  "(alibi-seed1 nonoverlapping L=16)", "runs/tiny/alibi-seed2");
  CHECK(run_cli(d, sweep_with(longer), &out) == 2);
  require_inputs_refused(d, out, before, "not evaluating alibi-seed1: the valid split of corpus (its first 1024 tokens) differs", "alibi-seed1");
  // The last evaluated token alone, the text's size kept: a hash of part of the tokens (a prefix,
  // bytes counted as tokens) would pass this one.
  REQUIRE(valid.size() >= 1024);
  std::string last_edited = valid;
  last_edited[1023] = last_edited[1023] == 'x' ? 'y' : 'x';
  write_text(d.root / "corpus/valid.txt", last_edited);
  CHECK(run_cli(d, sweep_with(longer), &out) == 2);
  require_inputs_refused(d, out, before, "not evaluating alibi-seed1: the valid split of corpus (its first 1024 tokens) differs", "alibi-seed1");
  write_text(d.root / "corpus/valid.txt", valid);

  // The training text edited: a new point would be a model of other text.
  const std::string train = read_text(d.root / "corpus/train.txt");
  write_text(d.root / "corpus/train.txt", train + "One more line of training text.\n");
  CHECK(run_cli(d, sweep_with(seed2), &out) == 2);
  require_inputs_refused(d, out, before, "the corpus corpus differs from the one the recorded points read",
                  "alibi-seed1 nonoverlapping L=16", "runs/tiny/alibi-seed2");
  // Its last training token alone, the size kept.
  std::string train_edited = train;
  train_edited[train.size() - 2] = train_edited[train.size() - 2] == 'x' ? 'y' : 'x';  // (the last is '\n')
  write_text(d.root / "corpus/train.txt", train_edited);
  CHECK(run_cli(d, sweep_with(seed2), &out) == 2);
  require_inputs_refused(d, out, before, "the corpus corpus differs from the one the recorded points read",
                  "alibi-seed1 nonoverlapping L=16", "runs/tiny/alibi-seed2");
  write_text(d.root / "corpus/train.txt", train);

  // The run trained again (other weights under the same fingerprint): its new lengths are refused.
  retrain(d, "runs/tiny/alibi-seed1", 0.01);
  CHECK(run_cli(d, sweep_with(longer), &out) == 2);
  require_inputs_refused(d, out, before, "run alibi-seed1's weights differ from those its recorded points evaluated",
                         "alibi-seed1 nonoverlapping L=16", "", /*byte_for_byte=*/false);  // found once loaded
  remove_tree(d.root / "runs/tiny/alibi-seed1/checkpoint");

  // With everything as it was, the sweep grows (the run trained again from its start, to the
  // same weights: training is deterministic).
  REQUIRE(run_cli(d, sweep_with(with(seed2, {"eval.length_multiples=[1, 2]"})), &out) == 0);
  CHECK(ResultsStore::open(results.string()).points().size() == 4);

  // LongPPL with a reference run: another reference's key tokens are not pooled either.
  const std::vector<std::string> referenced = with(kOne, {"eval.longppl={reference: runs/tiny/alibi-seed2, short_length: 8}",
                                                          "output.path=results/referenced.h5"});
  REQUIRE(run_cli(d, sweep_with(referenced), &out) == 0);
  {
    const ResultsStore store = ResultsStore::open((d.root / "results/referenced.h5").string());
    REQUIRE(store.points().size() == 1);
    CHECK(store.points()[0].inputs.reference.size() == 16);
    REQUIRE(store.points()[0].longppl);
  }
  retrain(d, "runs/tiny/alibi-seed2", 0.01);
  CHECK(run_cli(d, sweep_with(with(referenced, {"eval.length_multiples=[1, 2]"})), &out) == 2);
  require_one_line_error(out, "eval.longppl.reference's weights differ from those that chose the recorded points' key tokens");
}

TEST_CASE("merging shards evaluated on different validation texts is refused", "[sweep][merge][inputs]") {
  SweepDir d;
  std::string out;
  const std::vector<std::string> two = with(kOne, {"grid.train.seed=[1, 2]"});
  std::vector<std::string> shard0 = sweep_with(two), shard1 = sweep_with(two);
  shard0.insert(shard0.end(), {"--shard", "0/2"});
  shard1.insert(shard1.end(), {"--shard", "1/2"});
  REQUIRE(run_cli(d, shard0, &out) == 0);
  write_text(d.root / "corpus/valid.txt", "Edited. " + read_text(d.root / "corpus/valid.txt").substr(8));
  REQUIRE(run_cli(d, shard1, &out) == 0);  // a shard alone is consistent
  CHECK(run_cli(d, {"merge", "results/merged.h5", "results/tiny.shard-0-of-2.h5", "results/tiny.shard-1-of-2.h5"},
                &out) == 2);
  require_one_line_error(out, "differ in the text they evaluated: merged, their numbers would be pooled");
  CHECK_FALSE(fs::exists(d.root / "results/merged.h5"));
}

TEST_CASE("every evaluation setting of a sweep either makes new points or is refused: none changes a "
          "recorded number in place",
          "[sweep][growth][inputs]") {
  SweepDir d;
  std::string out;
  // Every lens on, with every setting the stored spec holds: RoPE variants (a rotary point),
  // LongPPL, attention profiles, retrieval and StreamingLLM.
  const std::vector<std::string> all = {
      "grid.position=[{name: rotary}]", "grid.train.seed=[1]", "eval.length_multiples=[1, 2]", "eval.strides=[8]",
      "eval.rope_scaling=[none, yarn]", "eval.rope_factor=2", "eval.streaming=[8]", "eval.streaming_sinks=2",
      "eval.retrieval={task: passkey, lengths: [128], depths: [50], samples: 1}",
      "eval.attention_profile={windows: 1}", "eval.longppl={short_length: 8}"};
  REQUIRE(run_cli(d, sweep_with(all), &out) == 0);
  const fs::path results = d.root / "results/tiny.h5";
  const std::string before = read_text(results);

  // Each leaf of the stored spec's eval section, by its key under eval: either growth (a value
  // added to a list, or a setting that is part of a point's mode, so that a change makes new
  // points beside the recorded ones) or a setting the recorded numbers depend on, which a grown
  // sweep may not change (here with another valid value). A setting added to the spec later
  // fails this test until it is placed in one of the two.
  const std::set<std::string> growth = {
      "lengths", "length_multiples", "strides", "nonoverlapping", "rope_scaling", "streaming",
      "streaming_sinks",  // in the mode's name: streaming_<sinks>_<cache>
      "retrieval.lengths", "retrieval.length_multiples", "attention_profile.lengths",
      "attention_profile.length_multiples"};
  const std::map<std::string, std::string> fixed = {
      {"rope_factor", "3"},         {"longppl.short_length", "4"},  {"longppl.alpha", "1"},
      {"longppl.beta", "-1"},       {"longppl.max_tokens", "100"},  {"longppl.reference", "runs/tiny/rotary-seed1"},
      {"attention_profile.windows", "2"}, {"retrieval.task", "multikey"}, {"retrieval.depths", "[25]"},
      {"retrieval.samples", "2"},   {"retrieval.seed", "2"}};
  std::vector<std::string> leaves;
  std::function<void(const YAML::Node&, const std::string&)> walk = [&](const YAML::Node& node, const std::string& key) {
    if (node.IsMap()) {
      for (const auto& entry : node) walk(entry.second, key.empty() ? entry.first.Scalar() : key + "." + entry.first.Scalar());
    } else {
      leaves.push_back(key);
    }
  };
  walk(YAML::Load(ResultsStore::open(results.string()).header().sweep_spec)["eval"], "");
  CHECK(leaves.size() == growth.size() + fixed.size());
  for (const auto& key : leaves) {
    INFO("eval." << key);
    CHECK(growth.count(key) + fixed.count(key) == 1);
  }
  for (const auto& [key, value] : fixed) {
    INFO("eval." << key << "=" << value);
    CHECK(run_cli(d, sweep_with(with(all, {"eval." + key + "=" + value})), &out) == 2);
    require_one_line_error(out, "holds the results of a different sweep (first difference at 'eval." +
                                    key.substr(0, key.find('.')));
    CHECK(read_text(results) == before);
  }
  // The base's evaluation keys too (eval.split, eval.max_tokens, ...): the base of a grown sweep stays.
  CHECK(run_cli(d, sweep_with(with(all, {"base.eval.max_tokens=1000"})), &out) == 2);
  require_one_line_error(out, "first difference at 'base.eval.max_tokens'");
  CHECK(run_cli(d, sweep_with(with(all, {"base.eval.split=test"})), &out) == 2);
  require_one_line_error(out, "first difference at 'base.eval.split'");
  CHECK(read_text(results) == before);

  // Growth by a setting in the mode's name: the recorded streaming points stay as they were,
  // the new sinks are new points.
  REQUIRE(run_cli(d, sweep_with(with(all, {"eval.streaming_sinks=1"})), &out) == 0);
  const ResultsStore grown = ResultsStore::open(results.string());
  const ResultsStore recorded_before = [&] {
    write_text(d.root / "before.h5", before);
    return ResultsStore::open((d.root / "before.h5").string());
  }();
  for (const auto& p : recorded_before.points()) {
    INFO(p.run_id << " " << p.mode << " " << p.eval_length);
    const PointRecord* kept = grown.point(p.run_id, p.mode, p.eval_length);
    REQUIRE(kept);
    CHECK(kept->scored_tokens == p.scored_tokens);
    CHECK((kept->nll_sum == p.nll_sum || (std::isnan(kept->nll_sum) && std::isnan(p.nll_sum))));
  }
  CHECK(grown.point("rotary-seed1", "streaming_1_8", 16));
  CHECK(grown.point("rotary-seed1", "streaming_2_8", 16));
}
