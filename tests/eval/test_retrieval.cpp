// Retrieval tasks: the generator's determinism and format (the answer and the key are where the
// instance says, rebuilt here from the definition in core/data/retrieval_task.h), the word-level
// adaptation and its refusals, training on the task (resumed bit-for-bit), and a small model
// trained on passkey end to end: its accuracy by length, each instance's verdict equal to
// greedy decoding with `generate`, and a sweep that stores it in the results file.
#include "core/data/retrieval_task.h"
#include "core/eval/generate.h"
#include "core/eval/retrieval_eval.h"
#include "core/model/memory_estimate.h"
#include "core/results/results_store.h"
#include "core/train/trainer.h"
#include "experiments/sweep/sweep.h"
#include "tests/support/cli_harness.h"
#include "tests/support/retrieval_support.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <regex>
#include <set>

using namespace extrap;
using namespace extrap::testing;
using testing::TempDir;

namespace {

std::string key_sentence(const std::string& name, int64_t key) {
  const std::string k = std::to_string(key);
  return "The " + name + " key is " + k + ". Remember it. " + k + " is the " + name + " key. ";
}

// `extrap sweep tiny.yaml [--list]` with the sweep's --set overrides.
std::vector<std::string> sweep_args(bool list, const std::vector<std::string>& settings) {
  std::vector<std::string> args = {"sweep", "tiny.yaml"};
  if (list) args.push_back("--list");
  args.insert(args.end(), settings.begin(), settings.end());
  return args;
}

}  // namespace

TEST_CASE("passkey instances: exact length, the key and answer where they say, filler rebuilt",
          "[retrieval]") {
  const Corpus corpus = task_byte_corpus();
  const TaskGenerator generator(RetrievalTask::passkey, corpus);
  REQUIRE(generator.min_length() == int64_t(key_sentence("pass", 50000).size() +
                                            std::string("What is the pass key? The pass key is").size() +
                                            std::string(" 50000.").size()));
  const std::string question = "What is the pass key? The pass key is";
  for (int64_t length : {generator.min_length(), int64_t(128), int64_t(333), int64_t(2048)})
    for (double depth : {0.0, 0.25, 0.5, 0.75, 1.0})
      for (uint64_t seed : {1u, 2u, 77u}) {
        CAPTURE(length, depth, seed);
        const TaskInstance t = generator.make(length, depth, seed);
        REQUIRE(int64_t(t.tokens.size()) == length);
        REQUIRE(t.key >= 1);
        REQUIRE(t.key <= 50000);
        const std::string answer = std::string(" ").append(std::to_string(t.key)).append(".");
        REQUIRE(bytes_text(t.tokens, size_t(t.prompt_length), t.tokens.size()) == answer);
        REQUIRE(t.answer == std::vector<int32_t>(t.tokens.begin() + t.prompt_length, t.tokens.end()));
        REQUIRE(bytes_text(t.tokens, size_t(t.key_begin), size_t(t.key_end)) == key_sentence("pass", t.key));
        const size_t question_at = size_t(t.prompt_length) - question.size();
        REQUIRE(bytes_text(t.tokens, question_at, size_t(t.prompt_length)) == question);
        // Without the key sentence, what precedes the question is the filler's tail.
        const std::string filler = bytes_text(t.tokens, 0, size_t(t.key_begin)) +
                                   bytes_text(t.tokens, size_t(t.key_end), question_at);
        REQUIRE(filler == filler_tail(filler.size()));
        // The key sits at a sentence start (or the filler's end), the one nearest the depth.
        const size_t before = size_t(t.key_begin);
        const auto is_start = [&](size_t i) { return filler_sentence_start(filler.size(), i); };
        REQUIRE(is_start(before));
        if (!filler.empty()) {
          REQUIRE(t.depth == Approx(double(before) / double(filler.size())));
          for (size_t i = 0; i <= filler.size(); ++i)
            if (is_start(i))
              REQUIRE(std::abs(double(i) - depth * double(filler.size())) >=
                      std::abs(double(before) - depth * double(filler.size())) - 1e-9);
        }
        if (depth == 1.0) REQUIRE(size_t(t.key_end) == question_at);
        // The same seed gives the same instance; the next seed another key.
        REQUIRE(generator.make(length, depth, seed).tokens == t.tokens);
      }
  // Pinned: the generator is the same on every platform (splitmix64, no std distributions).
  const TaskInstance pinned = generator.make(200, 0.5, 3);
  REQUIRE(pinned.key == 39054);
  REQUIRE(pinned.key_begin == 44);
  std::set<int64_t> keys;
  for (uint64_t seed = 0; seed < 200; ++seed) keys.insert(generator.make(128, 0.5, seed).key);
  REQUIRE(keys.size() > 190);
  REQUIRE_THROWS_WITH(generator.make(generator.min_length() - 1, 0.5, 1),
                      Catch::Contains("too short") && Catch::Contains(std::to_string(generator.min_length())));
  REQUIRE_THROWS_WITH(generator.make(300, 1.5, 1), Catch::Contains("depth 1.5"));
}

TEST_CASE("multikey instances: two distractors with other names and keys, the target asked for",
          "[retrieval]") {
  const Corpus corpus = task_byte_corpus();
  const TaskGenerator generator(RetrievalTask::multikey, corpus);
  const std::regex sentence("The (\\w+) key is (\\d+)\\. Remember it\\. (\\d+) is the (\\w+) key\\. ");
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const TaskInstance t = generator.make(600, 0.5, seed);
    REQUIRE(t.tokens.size() == 600);
    REQUIRE(t.distractor_keys.size() == 2);
    REQUIRE(t.distractor_begins.size() == 2);
    const std::string prompt = bytes_text(t.tokens, 0, size_t(t.prompt_length));
    const std::string question = "What is the " + t.name + " key? The " + t.name + " key is";
    REQUIRE(prompt.substr(prompt.size() - question.size()) == question);
    REQUIRE(bytes_text(t.tokens, size_t(t.key_begin), size_t(t.key_end)) == key_sentence(t.name, t.key));
    // Every key sentence in the text: the target's once, and two others with other names.
    std::set<std::string> names;
    int sentences = 0;
    for (auto it = std::sregex_iterator(prompt.begin(), prompt.end(), sentence);
         it != std::sregex_iterator(); ++it) {
      const auto& m = *it;
      REQUIRE(m[1] == m[4]);
      REQUIRE(m[2] == m[3]);
      names.insert(m[1]);
      ++sentences;
      if (m[1] != t.name) {
        const auto at = std::find(t.distractor_begins.begin(), t.distractor_begins.end(), m.position());
        REQUIRE(at != t.distractor_begins.end());
        REQUIRE(std::to_string(t.distractor_keys[size_t(at - t.distractor_begins.begin())]) == m[2]);
      }
    }
    REQUIRE(sentences == 3);
    REQUIRE(names.size() == 3);
    REQUIRE(names.count("pass") == 0);
  }
}

TEST_CASE("word-level instances: punctuation and digits as words, a missing word refused",
          "[retrieval]") {
  const std::string words =
      "The grass is green . The sky is blue . The sun is yellow . Here we go . There and back "
      "again . pass key Remember it the What ? 0 1 2 3 4 5 6 7 8 9 gold silver iron copper glass "
      "stone\n";
  TempDir dir("words");
  for (const char* split : {"train", "valid", "test"}) testing::write_text(dir.root / (std::string(split) + ".txt"), words);
  CorpusOptions options;
  options.path = dir.root.string();
  options.tokenizer = Tokenizer::word;
  options.cache_dir = (dir.root / "cache").string();
  const Corpus corpus = load_corpus(options);
  const TaskGenerator generator(RetrievalTask::passkey, corpus);
  const TaskInstance t = generator.make(80, 0.5, 5);
  REQUIRE(t.tokens.size() == 80);
  const std::string k = std::to_string(t.key);
  std::string spaced;
  for (char c : k) {
    if (!spaced.empty()) spaced += ' ';
    spaced += c;
  }
  REQUIRE(generator.text(t.answer) == spaced + " .");
  REQUIRE(generator.text({t.tokens.begin() + t.key_begin, t.tokens.begin() + t.key_end}) ==
          "The pass key is " + spaced + " . Remember it . " + spaced + " is the pass key .");

  TempDir other("words-missing");
  std::string without = words;
  without.replace(without.find("pass "), 5, "");
  for (const char* split : {"train", "valid", "test"}) testing::write_text(other.root / (std::string(split) + ".txt"), without);
  options.path = other.root.string();
  options.cache_dir = (other.root / "cache").string();
  const Corpus lacking = load_corpus(options);
  REQUIRE_THROWS_WITH(TaskGenerator(RetrievalTask::passkey, lacking),
                      Catch::Contains("no word 'pass'") && Catch::Contains("word level"));
}

TEST_CASE("data.task: config refusals, and a task mix resumes bit-for-bit", "[retrieval][train]") {
  const auto refused = [](const std::string& yaml) {
    return config_from_yaml(YAML::Load(yaml), "t.yaml");
  };
  REQUIRE_THROWS_WITH(refused("data: {task: passkey}"), Catch::Contains("task_fraction") && Catch::Contains("is 0"));
  REQUIRE_THROWS_WITH(refused("data: {task_fraction: 0.5}"), Catch::Contains("data.task is none"));
  REQUIRE_THROWS_WITH(refused("data: {task: passkey, task_fraction: 1.5}"), Catch::Contains("[0, 1]"));
  REQUIRE_THROWS_WITH(refused("data: {task: passkey, task_fraction: 1}\nmodel: {objective: masked_lm}"),
                      Catch::Contains("causal_lm"));
  REQUIRE_THROWS_WITH(refused("data: {task: needle, task_fraction: 1}"), Catch::Contains("needle"));
  // Left out of a run's identity at its default: runs of earlier versions keep theirs.
  Config plain = testing::tiny_config();
  REQUIRE_FALSE(plain.model_keys()["data"]["task"]);
  plain.task = RetrievalTask::passkey;
  plain.task_fraction = 0.5;
  REQUIRE(plain.model_keys()["data"]["task"].as<std::string>() == "passkey");

  auto corpus = testing::tiny_byte_corpus();
  Config config = testing::tiny_config("alibi");
  config.task = RetrievalTask::passkey;
  config.task_fraction = 0.5;
  config.train.seq_len = 110;
  config.train.batch_tokens = 110 * 4;
  config.train.accumulation = 2;
  config.train.steps = 8;
  config.train.checkpoint_every = 3;
  {
    Config short_window = config;
    short_window.train.seq_len = 64;
    REQUIRE_THROWS_WITH(Trainer(short_window, corpus),
                        Catch::Contains("data.task passkey needs 103-token instances") &&
                            Catch::Contains("train.seq_len 64"));
  }
  TempDir dir("task-resume");
  const auto a = testing::require_resume_bit_for_bit(config, corpus, dir.root, 6);
  // The mix changed what was trained: the same run without the task ends elsewhere.
  Config no_task = config;
  no_task.task = RetrievalTask::none;
  no_task.task_fraction = 0;
  no_task.train.out_dir = (dir.root / "plain").string();
  Trainer plain_trainer(no_task, corpus);
  plain_trainer.quiet = true;
  plain_trainer.run(RunStart::fresh);
  REQUIRE_FALSE(torch::equal(plain_trainer.model()->parameters()[0], a[0]));
}

TEST_CASE("a small model trained on passkey: accuracy by length, each verdict equal to greedy "
          "decoding, refusals",
          "[retrieval][slow]") {
  auto corpus = testing::tiny_byte_corpus();
  // The shortest instance (103 tokens, no filler), learned abruptly between 400 and 1200 steps.
  Config config = task_config(RetrievalTask::passkey, 102, 16, 1200);
  TempDir dir("task-train");
  config.train.out_dir = (dir.root / "run").string();
  Trainer trainer(config, corpus);
  trainer.quiet = true;
  trainer.run(RunStart::fresh);
  TransformerLM& model = trainer.model();

  RetrievalSpec spec;
  spec.depths = {0, 50, 100};
  spec.samples = 6;
  spec.seed = 9;
  const TaskGenerator generator(RetrievalTask::passkey, corpus);
  int64_t verdicts_correct = 0, verdicts_wrong = 0;
  for (int64_t length : {int64_t(103), int64_t(160)}) {
    spec.length = length;
    std::vector<int64_t> done;  // instances scored after each forward pass, of 18
    spec.on_progress = [&](int64_t scored, int64_t total) {
      CHECK(total == 18);
      done.push_back(scored);
    };
    const RetrievalResult r = evaluate_retrieval(model, corpus, spec);
    CAPTURE(length, r.correct, r.trials);
    REQUIRE(r.trials == 18);
    REQUIRE(!done.empty());
    CHECK(std::is_sorted(done.begin(), done.end()));
    CHECK(done.back() == 18);
    REQUIRE(r.cells.size() == 3);
    REQUIRE(int64_t(r.correct_by_trial.size()) == r.trials);
    if (length == 103) REQUIRE(r.accuracy >= 0.8);  // the training length: learned
    // Each verdict is greedy decoding's: exactly the answer's tokens.
    size_t trial = 0;
    for (double depth : spec.depths)
      for (int64_t s = 0; s < spec.samples; ++s, ++trial) {
        const TaskInstance t = generator.make(
            length, depth / 100.0, retrieval_instance_seed(spec.seed, length, depth, s));
        const auto out = greedy_after(model, t.tokens, t.prompt_length, int64_t(t.answer.size()),
                                      corpus.mask_token);
        const bool right = out == t.answer;
        REQUIRE(bool(r.correct_by_trial[trial]) == right);
        (right ? verdicts_correct : verdicts_wrong)++;
      }
  }
  REQUIRE(verdicts_correct > 0);

  spec.length = 90;
  REQUIRE_THROWS_AS(evaluate_retrieval(model, corpus, spec), EvalFailure);
  spec.length = 120;
  spec.depths = {50, 50};
  REQUIRE_THROWS_WITH(evaluate_retrieval(model, corpus, spec), Catch::Contains("listed twice"));
  spec.depths = {120};
  REQUIRE_THROWS_WITH(evaluate_retrieval(model, corpus, spec), Catch::Contains("[0, 100]"));
}

namespace {

// A rotary causal point's retrieval_passkey+yarn row at 256 against the same evaluation of its
// checkpoint in this process.
void check_point_in_process(const extrap::testing::SweepDir& d, const ResultsStore& store) {
  using namespace extrap::testing;
  const std::string id = [&] {
    for (const auto& [name, r] : store.runs())
      if (r.position == "rotary" && name.find("masked") == std::string::npos) return name;
    return std::string();
  }();
  auto [corpus, loaded] = load_cli_run(d, "runs/tiny/" + id);
  RetrievalSpec spec;
  spec.length = 256;
  spec.depths = {0, 100};
  spec.samples = 3;
  spec.rope_scaling = rope_scaling_for(RopeScalingKind::yarn, 0, 16, 256);
  const RetrievalResult r = evaluate_retrieval(loaded.model, corpus, spec);
  const PointRecord* p = store.point(id, "retrieval_passkey+yarn", 256);
  REQUIRE(p != nullptr);
  for (size_t c = 0; c < 2; ++c) {
    CHECK(p->retrieval[c].correct == r.cells[c].correct);
    CHECK(p->retrieval[c].answer_nll == Approx(r.cells[c].answer_nll).epsilon(1e-9));
  }

}

// `extrap eval --retrieval` gives a sweep's counts, `extrap task` prints the same instances, and
// both refuse in one line.
void check_command_line_retrieval(const extrap::testing::SweepDir& d, const ResultsStore& store) {
  using namespace extrap::testing;
  std::string out;
  std::string id;
  for (const auto& [name, r] : store.runs())
    if (r.position == "alibi" && store.point(name, "retrieval_passkey", 128)) id = name;
  REQUIRE(!id.empty());
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/tiny/" + id, "--length", "128", "--retrieval",
                      "passkey", "--samples", "3", "--depths", "0", "100", "--json", "r.json"},
                  &out) == 0);
  const auto rows = nlohmann::json::parse(read_text(d.root / "r.json"))["results"];
  REQUIRE(rows.size() == 1);
  const PointRecord* p = store.point(id, "retrieval_passkey", 128);
  REQUIRE(p != nullptr);
  for (size_t c = 0; c < 2; ++c)
    CHECK(rows[0]["cells"][c]["correct"].get<int64_t>() == p->retrieval[c].correct);
  REQUIRE(run_cli(d, {"task", "--length", "200", "--depth", "50", "--seed", "3", "--json", "t.json"},
                  &out) == 0);
  const auto task = nlohmann::json::parse(read_text(d.root / "t.json"));
  CHECK(task["key"] == 39054);
  CHECK(task["tokens"].size() == 200);
  CHECK(out.find("What is the pass key? The pass key is\n") != std::string::npos);
  // Refusals in one line.
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"task", "--length", "50"}, "too short"},
           {{"task", "--length", "200", "--depth", "101"}, "--depth 101"},
           {{"task", "--length", "200", "--task", "needle"}, "needle"},
           {{"eval", "--checkpoint", "runs/tiny/" + id, "--length", "128", "--retrieval", "passkey",
             "--stride", "8"}, "--stride has no meaning with --retrieval"},
           {{"eval", "--checkpoint", "runs/tiny/" + id, "--length", "128", "--samples", "3"},
            "--samples is a retrieval option"},
           {{"eval", "--checkpoint", "runs/tiny/" + id, "--length", "128", "--retrieval", "passkey",
             "--depths", "0", "0"}, "listed twice"}}) {
    CHECK(run_cli(d, args, &out) == 2);
    CHECK(out.find(expected) != std::string::npos);
  }
  // A length no instance fits is a failed row, exit 1.
  CHECK(run_cli(d, {"eval", "--checkpoint", "runs/tiny/" + id, "--length", "64", "128",
                    "--retrieval", "passkey", "--samples", "2"}, &out) == 1);
  CHECK(out.find("64         failed: retrieval task passkey at length 64: an instance needs at least 103 tokens") != std::string::npos);

}

}  // namespace

TEST_CASE("a sweep's eval.retrieval: causal points only, stored by depth, equal to an in-process "
          "evaluation, reported as a heat map",
          "[retrieval][sweep]") {
  using namespace extrap::testing;
  SweepDir d;
  std::string out;
  const std::vector<std::string> settings = {
      "--set", "grid.position=[{name: alibi}, {name: rotary}]",
      "--set", "grid.model.objective=[causal_lm, masked_lm]",
      "--set", "grid.train.seed=[1]",
      "--set", "eval.strides=[]",
      "--set", "eval.length_multiples=[1]",
      "--set", "eval.rope_scaling=[none, yarn]",
      "--set", "eval.attention_profile=false",
      "--set", "eval.retrieval={task: passkey, lengths: [128, 256], depths: [0, 100], samples: 3}"};
  REQUIRE(run_cli(d, sweep_args(/*list=*/true, settings), &out) == 0);
  CHECK(out.find("16/nonoverlapping 128/retrieval_passkey 256/retrieval_passkey\n") != std::string::npos);
  CHECK(out.find("128/retrieval_passkey 128/retrieval_passkey+yarn 256/retrieval_passkey "
                 "256/retrieval_passkey+yarn\n") != std::string::npos);

  // Refusals name the key.
  const auto refused = [&](const std::string& setting, const std::string& expected) {
    std::vector<std::string> args = {"sweep", "tiny.yaml", "--list", "--set", setting};
    CHECK(run_cli(d, args, &out) == 2);
    CHECK(out.find(expected) != std::string::npos);
  };
  refused("eval.retrieval={task: none, lengths: [128]}", "is none: name the task");
  refused("eval.retrieval={task: passkey}", "no instance lengths");
  refused("eval.retrieval={task: passkey, lengths: [128], depths: [0, 150]}", "[0, 100]");
  refused("eval.retrieval={task: passkey, lengths: [128], samples: 0}", "samples");
  refused("eval.retrieval={task: passkey, lengths: [128], dephts: [0]}", "dephts");

  REQUIRE(run_cli(d, sweep_args(/*list=*/false, settings), &out) == 0);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  int retrieval_points = 0;
  for (const auto& p : store.points()) {
    if (!is_retrieval_mode(p.mode)) {
      CHECK(p.retrieval.empty());
      continue;
    }
    ++retrieval_points;
    INFO(p.run_id << " " << p.mode << " " << p.eval_length << " " << p.status);
    CHECK(p.run_id.find("masked") == std::string::npos);
    REQUIRE(p.ok());
    REQUIRE(p.retrieval.size() == 2);
    CHECK(p.retrieval[0].depth == 0);
    CHECK(p.retrieval[1].depth == 100);
    double nll = 0;
    for (const auto& c : p.retrieval) {
      CHECK(c.trials == 3);
      CHECK(c.correct >= 0);
      CHECK(c.correct <= 3);
      nll += c.answer_nll;
    }
    CHECK(p.nll_sum == Approx(nll).epsilon(1e-12));
    CHECK(p.perplexity == Approx(std::exp(p.nll_sum / double(p.scored_tokens))));
  }
  CHECK(retrieval_points == 2 + 4);

  check_point_in_process(d, store);
  check_command_line_retrieval(d, store);

  REQUIRE(run_cli(d, {"report", "results/tiny.h5", "--out", "report"}, &out) == 0);
  const std::string md = read_text(d.root / "report/report.md");
  INFO(md);
  CHECK(md.find("### Retrieval accuracy, passkey") != std::string::npos);
  CHECK(fs::exists(d.root / "report/retrieval_L16_retrieval_passkey.png"));
  CHECK(fs::exists(d.root / "report/retrieval_L16_retrieval_passkey_yarn.png"));
  // The table's cell of each method at 256 without a variant: correct of trials over depths.
  for (const auto& [id, r] : store.runs()) {
    const PointRecord* p = store.point(id, "retrieval_passkey", 256);
    if (!p) continue;
    int64_t correct = 0, trials = 0;
    for (const auto& c : p->retrieval) {
      correct += c.correct;
      trials += c.trials;
    }
    const std::string cell = "(" + std::to_string(correct) + "/" + std::to_string(trials) + ") |";
    CHECK(md.find(cell) != std::string::npos);
  }
}

// A grid over the training length: each point's evaluation lengths, retrieval instance lengths
// and RoPE-scaling factors come from its own train.seq_len, not the base config's (16).
TEST_CASE("a sweep whose grid varies train.seq_len: every length and RoPE factor from the point's own L",
          "[retrieval][sweep]") {
  using namespace extrap::testing;
  SweepDir d;
  std::string out;
  const std::vector<std::string> settings = {
      "--set", "grid.position=[{name: alibi}, {name: rotary}]",
      "--set", "grid.train.seq_len=[16, 32]",
      "--set", "grid.train.seed=[1]",
      "--set", "base.train.steps=12",
      "--set", "eval.strides=[]",
      "--set", "eval.length_multiples=[2]",
      "--set", "eval.rope_scaling=[none, yarn]",
      "--set", "eval.attention_profile=false",
      "--set", "eval.retrieval={task: passkey, length_multiples: [8, 12], depths: [50], samples: 2}"};
  REQUIRE(run_cli(d, sweep_args(/*list=*/true, settings), &out) == 0);
  INFO(out);
  CHECK(out.find("evals: 32/nonoverlapping 128/retrieval_passkey 192/retrieval_passkey\n") !=
        std::string::npos);
  CHECK(out.find("evals: 64/nonoverlapping 256/retrieval_passkey 384/retrieval_passkey\n") !=
        std::string::npos);
  CHECK(out.find("evals: 64/nonoverlapping 64/nonoverlapping+yarn 256/retrieval_passkey "
                 "256/retrieval_passkey+yarn 384/retrieval_passkey 384/retrieval_passkey+yarn\n") !=
        std::string::npos);

  REQUIRE(run_cli(d, sweep_args(/*list=*/false, settings), &out) == 0);
  const ResultsStore store = ResultsStore::open((d.root / "results/tiny.h5").string());
  REQUIRE(store.runs().size() == 4);
  for (const auto& [id, record] : store.runs()) {
    INFO(id);
    const int64_t L = id.substr(id.size() - 4) == "-L32" ? 32 : 16;  // the grid's label
    CHECK(record.train_length == L);
    std::set<int64_t> plain, retrieval;
    for (const auto& p : store.points()) {
      if (p.run_id != id) continue;
      CHECK(p.train_length == L);
      (is_retrieval_mode(p.mode) ? retrieval : plain).insert(p.eval_length);
    }
    CHECK(plain == std::set<int64_t>{2 * L});
    CHECK(retrieval == std::set<int64_t>{8 * L, 12 * L});
  }

  // The rotary point trained at 32, evaluated here with instances and RoPE factors made from
  // its own length: the sweep's numbers must be these.
  std::string id;
  for (const auto& [name, r] : store.runs())
    if (r.position == "rotary" && r.train_length == 32) id = name;
  REQUIRE(!id.empty());
  auto [corpus, loaded] = load_cli_run(d, "runs/tiny/" + id);
  for (auto kind : {RopeScalingKind::none, RopeScalingKind::yarn}) {
    const std::string suffix = kind == RopeScalingKind::yarn ? "+yarn" : "";
    INFO(suffix);
    RetrievalSpec spec;
    spec.length = 384;
    spec.depths = {50};
    spec.samples = 2;
    spec.rope_scaling = rope_scaling_for(kind, 0, 32, 384);
    const RetrievalResult r = evaluate_retrieval(loaded.model, corpus, spec);
    const PointRecord* p = store.point(id, "retrieval_passkey" + suffix, 384);
    REQUIRE(p != nullptr);
    REQUIRE(p->retrieval.size() == 1);
    CHECK(p->retrieval[0].correct == r.cells[0].correct);
    CHECK(p->retrieval[0].answer_nll == Approx(r.cells[0].answer_nll).epsilon(1e-9));

    EvalSpec eval = eval_spec_for(loaded.config, 64);
    eval.rope_scaling = rope_scaling_for(kind, 0, 32, 64);
    const EvalResult e = evaluate(loaded.model, corpus, corpus.split(loaded.config.eval.split), eval);
    const PointRecord* q = store.point(id, "nonoverlapping" + suffix, 64);
    REQUIRE(q != nullptr);
    CHECK(q->nll_sum == Approx(e.nll_sum).epsilon(1e-6));
  }
}

// Trials are scored batch_tokens / length at a time: batches after the first must be fed, and
// credited with, their own instances.
TEST_CASE("retrieval in several batches, the last one partial, equals retrieval in one",
          "[retrieval]") {
  Config config = testing::tiny_config("alibi");
  torch::manual_seed(5);
  auto model = build_model(config, 257);
  model->eval();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.5);  // varied answers
  }
  const Corpus corpus = testing::tiny_byte_corpus();
  RetrievalSpec spec;
  spec.length = 110;
  spec.depths = {0, 50, 100};
  spec.samples = 5;  // 15 trials
  const RetrievalResult one = evaluate_retrieval(model, corpus, spec);
  spec.batch_tokens = 4 * spec.length;  // 4 trials a batch: 4 batches, the last with 3
  const RetrievalResult several = evaluate_retrieval(model, corpus, spec);
  REQUIRE(several.cells.size() == one.cells.size());
  for (size_t c = 0; c < one.cells.size(); ++c) {
    INFO("depth " << one.cells[c].depth);
    CHECK(several.cells[c].trials == 5);
    CHECK(several.cells[c].correct == one.cells[c].correct);
    CHECK(several.cells[c].answer_nll == Approx(one.cells[c].answer_nll).epsilon(1e-6));
  }
  CHECK(several.correct_by_trial == one.correct_by_trial);
  // The instances differ from each other, so a batch fed another batch's would show.
  double lowest = one.cells[0].answer_nll, highest = lowest;
  for (const auto& cell : one.cells) {
    lowest = std::min(lowest, cell.answer_nll);
    highest = std::max(highest, cell.answer_nll);
  }
  CHECK(highest > lowest);
}

// At 128 bytes the filler has few sentence boundaries and several asked depths put the key at one
// of them; at 2048 every default depth has its own. The evaluation records, for each depth, where
// its keys went and which earlier depth places them alike, checked here from the definition: two
// depths place alike when the same seed makes the same instance at both. A results file keeps
// both numbers, and one written before them reads as not recorded and takes them on its next point.
TEST_CASE("retrieval depths that place the key alike are recorded as one measurement", "[retrieval]") {
  const Corpus corpus = task_byte_corpus();
  Config config = tiny_config("alibi");
  torch::manual_seed(3);
  TransformerLM model = build_model(config, corpus.vocab_size);
  const TaskGenerator generator(RetrievalTask::passkey, corpus);
  RetrievalSpec spec;
  spec.depths = {0, 25, 50, 75, 100};
  spec.samples = 4;
  spec.seed = 5;
  std::map<int64_t, RetrievalResult> results;
  for (int64_t length : {int64_t(128), int64_t(2048)}) {
    CAPTURE(length);
    spec.length = length;
    const RetrievalResult r = evaluate_retrieval(model, corpus, spec);
    REQUIRE(r.cells.size() == spec.depths.size());
    for (size_t c = 0; c < r.cells.size(); ++c) {
      CAPTURE(c);
      double placed = 0;
      for (int64_t s = 0; s < spec.samples; ++s)
        placed += generator.make(length, spec.depths[c] / 100.0,
                                 retrieval_instance_seed(spec.seed, length, spec.depths[c], s)).depth * 100.0;
      CHECK(r.cells[c].placed_depth == Approx(placed / double(spec.samples)));
      // The first earlier depth at which every instance of both cells' seeds comes out the same.
      double expected = spec.depths[c];
      for (size_t e = 0; e < c && expected == spec.depths[c]; ++e) {
        bool alike = true;
        for (size_t cell : {c, e})
          for (int64_t s = 0; s < spec.samples; ++s) {
            const uint64_t seed = retrieval_instance_seed(spec.seed, length, spec.depths[cell], s);
            alike = alike && generator.make(length, spec.depths[c] / 100.0, seed).tokens ==
                                 generator.make(length, spec.depths[e] / 100.0, seed).tokens;
          }
        if (alike) expected = spec.depths[e];
      }
      CHECK(r.cells[c].same_as == expected);
    }
    results[length] = r;
  }
  // What the issue saw: at 128 bytes 0, 25 and 50 are one placement, and 75 and 100 another.
  const auto groups = retrieval_placement_groups(results[128].cells);
  REQUIRE(groups.size() == 2);
  CHECK(groups[0].depths == std::vector<double>{0, 25, 50});
  CHECK(groups[1].depths == std::vector<double>{75, 100});
  CHECK(groups[0].pooled.trials == 12);
  CHECK(groups[0].pooled.correct == results[128].cells[0].correct + results[128].cells[1].correct +
                                        results[128].cells[2].correct);
  CHECK(retrieval_placement_groups(results[2048].cells).size() == 5);

  // Through a results file, then one whose /retrieval predates the placement columns.
  TempDir dir("placement");
  const std::string path = (dir.root / "r.h5").string();
  SweepHeader header;
  header.sweep_name = "placement";
  RunRecord run;
  run.run_id = "alibi-seed1";
  run.position = "alibi";
  run.status = "complete";
  const auto point = [&](int64_t length) {
    PointRecord p;
    p.run_id = run.run_id;
    p.position = "alibi";
    p.mode = "retrieval_passkey";
    p.eval_length = p.stride = length;
    p.retrieval = results[length].cells;
    const RetrievalCell total = retrieval_totals(p.retrieval);
    p.nll_sum = total.answer_nll;
    p.scored_tokens = total.answer_tokens;
    p.perplexity = std::exp(p.nll_sum / double(p.scored_tokens));
    return p;
  };
  {
    const ResultsLock lock(path);
    ResultsStore::open_or_create(path, header).write({run}, {point(128)});
  }
  const auto same_cells = [](const std::vector<RetrievalCell>& got, const std::vector<RetrievalCell>& expected,
                             bool placement) {
    REQUIRE(got.size() == expected.size());
    for (size_t c = 0; c < got.size(); ++c) {
      CHECK(got[c].depth == expected[c].depth);
      CHECK(got[c].correct == expected[c].correct);
      if (placement) {
        CHECK(got[c].placed_depth == expected[c].placed_depth);
        CHECK(got[c].same_as == expected[c].same_as);
      } else {
        CHECK(std::isnan(got[c].placed_depth));
        CHECK(std::isnan(got[c].same_as));
        CHECK(got[c].distinct());
      }
    }
  };
  {
    const ResultsStore written = ResultsStore::open(path);
    same_cells(written.point(run.run_id, "retrieval_passkey", 128)->retrieval, results[128].cells, true);
  }
  write_text(dir.root / "strip.py",
             "import h5py, numpy as np\n"
             "with h5py.File('r.h5', 'r+') as f:\n"
             "    rows = f['retrieval'][...]\n"
             "    names = [n for n in rows.dtype.names if n not in ('placed_depth', 'same_as')]\n"
             "    old = np.array(rows[names].tolist(), dtype=[(n, rows.dtype[n]) for n in names])\n"
             "    del f['retrieval']\n"
             "    f.create_dataset('retrieval', data=old, maxshape=(None,), chunks=(64,))\n");
  std::string out;
  REQUIRE(run_python(dir, "strip.py", &out) == 0);
  {
    const ResultsStore older = ResultsStore::open(path);
    same_cells(older.point(run.run_id, "retrieval_passkey", 128)->retrieval, results[128].cells, false);
  }
  {
    const ResultsLock lock(path);
    ResultsStore::open_or_create(path, header).append_point(point(2048));
  }
  const ResultsStore grown = ResultsStore::open(path);
  same_cells(grown.point(run.run_id, "retrieval_passkey", 128)->retrieval, results[128].cells, false);
  same_cells(grown.point(run.run_id, "retrieval_passkey", 2048)->retrieval, results[2048].cells, true);
}

// A retrieval at millions of tokens on a small model passes the memory checks and would run for
// days: its cost is said before it starts. The operation count against a count written out here.
TEST_CASE("a retrieval that would take hours is said with its estimate before it starts", "[retrieval]") {
  Config config = tiny_config("alibi");
  const ModelConfig& m = config.model;
  // By the definition: per layer q, k, v and the output projection (2 T D D each), the FFN's two
  // products (2 T D F each), and per attended pair (i sees keys 0..i) q.k and the weighted value
  // (2 D each); then the output projection at the scored rows.
  double expected = 0;
  const int64_t T = 5, scored = 3, V = 257;
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    expected += 4 * (2.0 * T * m.d_model * m.d_model) + 2 * (2.0 * T * m.d_model * m.d_ffn);
    for (int64_t i = 0; i < T; ++i) expected += double(i + 1) * 2 * (2.0 * m.d_model);
  }
  expected += 2.0 * scored * m.d_model * V;
  CHECK(forward_flops(m, V, 1, T, scored) == Approx(expected).epsilon(1e-12));
  CHECK(forward_flops(m, V, 3, T, 3 * scored) == Approx(3 * expected).epsilon(1e-12));

  const Corpus corpus = task_byte_corpus();
  torch::manual_seed(1);
  TransformerLM model = build_model(config, corpus.vocab_size);
  RetrievalSpec spec;
  spec.length = 10'000'000;
  const RetrievalWork huge = estimate_retrieval_work(model, spec, torch::kCPU);
  CHECK(huge.instances == 100);
  CHECK(huge.flops > 1e17);
  CHECK(huge.seconds > 86400);
  const std::string warning = huge.warning("extrap eval: retrieval at length 10000000");
  CHECK_THAT(warning, Catch::StartsWith("extrap eval: retrieval at length 10000000: 100 instance(s), about ") &&
                          Catch::Contains("days at the rate this model computes here"));
  spec.length = 256;
  const RetrievalWork small = estimate_retrieval_work(model, spec, torch::kCPU);
  CHECK(small.seconds < 300);
  CHECK(small.warning("x").empty());
  CHECK(model->is_training());  // the probe left the model as it was
}
