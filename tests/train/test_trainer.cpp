// Training: the loss goes down, schedules are right, and resumption is bit-for-bit.
#include "core/eval/evaluator.h"
#include "core/train/trainer.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>
#include <unistd.h>

#include <filesystem>

using namespace extrap;
namespace fs = std::filesystem;

using testing::TempDir;

TEST_CASE("learning-rate schedules", "[train]") {
  TrainConfig c;
  c.lr = 1.0;
  c.min_lr = 0.1;
  c.warmup = 10;
  c.steps = 110;
  REQUIRE(learning_rate(c, 5) == Approx(0.5));
  REQUIRE(learning_rate(c, 10) == Approx(1.0));
  REQUIRE(learning_rate(c, 60) == Approx(0.55));   // half-way through the cosine
  REQUIRE(learning_rate(c, 110) == Approx(0.1));
  c.schedule = Schedule::inverse_sqrt;
  REQUIRE(learning_rate(c, 40) == Approx(std::sqrt(10.0 / 40.0)));
  c.schedule = Schedule::constant;
  REQUIRE(learning_rate(c, 99) == 1.0);
}

TEST_CASE("a short training run lowers the validation loss", "[train]") {
  auto corpus = testing::tiny_byte_corpus();
  for (const char* position : {"alibi", "sinusoidal", "none", "learned"}) {
    INFO(position);
    Config config = testing::tiny_config(position);
    TempDir dir("loss");
    config.train.out_dir = (dir.root / "run").string();
    config.train.validate_every = 30;
    config.train.steps = 60;
    Trainer trainer(config, corpus);
    trainer.quiet = true;
    EvalSpec spec;
    spec.length = 16;
    const double before = evaluate(trainer.model(), corpus, corpus.valid, spec).nll_sum;
    auto summary = trainer.run(RunStart::fresh);
    const double after = evaluate(trainer.model(), corpus, corpus.valid, spec).nll_sum;
    REQUIRE(after < 0.8 * before);
    REQUIRE(summary.valid_curve.size() == 2);
    REQUIRE(summary.valid_curve[1].loss < summary.valid_curve[0].loss);
  }
}

TEST_CASE("resuming from a checkpoint continues bit-for-bit", "[train]") {
  auto corpus = testing::tiny_byte_corpus();
  Config config = testing::tiny_config("alibi");
  config.model.dropout = 0.1;  // the RNG state must be restored too
  config.train.steps = 20;
  config.train.accumulation = 2;
  config.train.batch_tokens = 16 * 8;
  config.train.checkpoint_every = 7;

  TempDir dir("resume");
  testing::require_resume_bit_for_bit(config, corpus, dir.root, 14);  // stopped at a checkpoint
  Config second = config;
  second.train.out_dir = (dir.root / "resumed").string();

  // A validation measured on other tokens would mix the curve: refused, naming the key.
  Config revalidated = second;
  revalidated.train.validate_tokens = 96;
  Trainer mixed(revalidated, corpus);
  mixed.quiet = true;
  REQUIRE_THROWS_WITH(mixed.run(RunStart::resume), Catch::Contains("train.validate_tokens is 96") &&
                                                       Catch::Contains("validated on 0") &&
                                                       Catch::Contains("would mix"));

  // A changed config is refused, naming what differs.
  Config changed = second;
  changed.model.d_ffn = 128;
  changed.train.steps = 30;
  Trainer other(changed, corpus);
  other.quiet = true;
  REQUIRE_THROWS_WITH(other.run(RunStart::resume),
                      Catch::Contains("belongs to another run") &&
                          Catch::Contains("first difference at 'config.model.d_ffn'") &&
                          Catch::Contains("64") && Catch::Contains("128"));
}

TEST_CASE("a masked-LM model trains and its loss goes down", "[train]") {
  auto corpus = testing::tiny_byte_corpus();
  Config config = testing::tiny_config("alibi_symmetric");
  config.model.objective = Objective::masked_lm;
  config.train.steps = 60;
  config.train.log_every = 10;
  TempDir dir("mlm");
  config.train.out_dir = (dir.root / "run").string();
  Trainer trainer(config, corpus);
  trainer.quiet = true;
  auto summary = trainer.run(RunStart::fresh);
  REQUIRE(summary.train_curve.back().loss < 0.7 * summary.train_curve.front().loss);
}

// A step of accumulation 2 draws the same 256 tokens as a step of accumulation 1 (two
// micro-batches of 128, in cursor order) and must take the same gradient: the mean over all
// of them, not over the first micro-batch.
TEST_CASE("gradient accumulation: two micro-batches step as the whole batch does", "[train]") {
  auto corpus = testing::tiny_byte_corpus();
  std::vector<std::vector<torch::Tensor>> parameters;
  std::vector<std::vector<CurvePoint>> curves;
  for (int64_t accumulation : {1, 2}) {
    INFO("accumulation " << accumulation);
    Config config = testing::tiny_config("alibi");
    config.train.steps = 6;
    config.train.log_every = 1;
    config.train.accumulation = accumulation;
    TempDir dir("accumulation");
    config.train.out_dir = (dir.root / "run").string();
    torch::manual_seed(1);
    Trainer trainer(config, corpus);
    trainer.quiet = true;
    const TrainSummary summary = trainer.run(RunStart::fresh);
    curves.push_back(summary.train_curve);
    std::vector<torch::Tensor> p;
    for (const auto& t : trainer.model()->parameters()) p.push_back(t.detach().clone());
    parameters.push_back(p);
  }
  REQUIRE(curves[0].size() == curves[1].size());
  REQUIRE(curves[0].size() >= 6);
  for (size_t i = 0; i < curves[0].size(); ++i)
    CHECK(curves[1][i].loss == Approx(curves[0][i].loss).epsilon(1e-5));
  REQUIRE(parameters[0].size() == parameters[1].size());
  for (size_t i = 0; i < parameters[0].size(); ++i) {
    INFO("parameter " << i);
    // Adam divides by sqrt(v): where a gradient is near 0, summation-order differences grow.
    CHECK(torch::allclose(parameters[1][i], parameters[0][i], /*rtol=*/1e-3, /*atol=*/1e-3));
  }
}

// The step's gradient itself, not only where AdamW takes it (AdamW is nearly blind to a constant
// factor on the gradient; NAG and SGD step by it): the gradient of one batch's summed NLL over
// its scored tokens, computed here from the logits, equals the accumulated one whether the batch
// comes as 1, 2 or 4 micro-batches, also when they score different numbers of targets (a masked
// LM's do). A mean of the micro-batches' means would weigh a micro-batch's tokens by its count.
TEST_CASE("gradient accumulation: the accumulated gradient is one large batch's, whatever each micro-batch scores",
          "[train]") {
  for (const std::string objective : {"causal_lm", "masked_lm"}) {
    CAPTURE(objective);
    Config config = testing::tiny_config(objective == "causal_lm" ? "alibi" : "alibi_symmetric");
    config.model.objective = objective == "causal_lm" ? Objective::causal_lm : Objective::masked_lm;
    torch::manual_seed(4);
    TransformerLM model = build_model(config, 257);
    model->train();
    const auto inputs = torch::randint(0, 256, {4, 16}, torch::kLong);
    auto targets = torch::randint(0, 256, {4, 16}, torch::kLong);
    // Rows scoring 16, 12, 3 and 9 targets: every split's micro-batches score differently.
    const int64_t kept[] = {16, 12, 3, 9};
    for (int64_t r = 0; r < 4; ++r) targets[r].narrow(0, kept[r], 16 - kept[r]).fill_(-100);
    const int64_t scored = 16 + 12 + 3 + 9;

    model->zero_grad();
    const auto logits = model->forward(inputs).reshape({-1, 257}).to(torch::kFloat64);
    const auto expected_loss = torch::nn::functional::cross_entropy(
                                   logits, targets.reshape({-1}),
                                   torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum)) /
                               double(scored);
    expected_loss.backward();
    std::vector<torch::Tensor> expected;
    for (const auto& p : model->parameters()) expected.push_back(p.grad().clone());

    for (int64_t count : {1, 2, 4}) {
      CAPTURE(count);
      std::vector<MicroBatch> batches;
      const int64_t rows = 4 / count;
      for (int64_t a = 0; a < count; ++a) {
        const auto t = targets.narrow(0, a * rows, rows);
        batches.push_back({inputs.narrow(0, a * rows, rows), t, t.ne(-100).sum().item<int64_t>()});
      }
      model->zero_grad();
      const double loss = accumulate_gradients(model, batches, Precision::fp32).item<double>();
      CHECK(loss == Approx(expected_loss.item<double>()).epsilon(1e-6));
      const auto parameters = model->parameters();
      for (size_t i = 0; i < parameters.size(); ++i) {
        CAPTURE(i);
        const auto got = parameters[i].grad().to(torch::kFloat64);
        const double scale = expected[i].abs().max().item<double>();
        CHECK((got - expected[i]).abs().max().item<double>() <= 1e-5 * std::max(scale, 1e-3));
      }
    }
  }
}

TEST_CASE("train.cuda_graph: auto trains eagerly on the CPU, on refuses naming why", "[train]") {
  auto corpus = testing::tiny_byte_corpus();
  Config config = testing::tiny_config("alibi");
  config.train.steps = 2;
  TempDir dir("graph");
  config.train.out_dir = (dir.root / "auto").string();
  Trainer automatic(config, corpus);  // cuda_graph: auto, the default
  automatic.quiet = true;
  REQUIRE(automatic.run(RunStart::fresh).steps == 2);

  config.train.cuda_graph = CudaGraphMode::on;
  config.train.out_dir = (dir.root / "on").string();
  Trainer on(config, corpus);
  on.quiet = true;
  REQUIRE_THROWS_WITH(on.run(RunStart::fresh),
                      Catch::Contains("train.cuda_graph is on, but train.device is cpu"));
  REQUIRE_FALSE(find_checkpoint(config.train.out_dir));
}
