// train.cuda_graph (core/train/graphed_step.h, core/runtime/cuda_graph.h) on a GPU: the captured
// step trains as the eager step does (losses, parameter changes and AdamW's state, with the
// learning rate and the scored-token count changing between steps, in fp32 and bf16, with
// gradient accumulation), dropout draws new masks at every replay, a run stopped and resumed
// through a checkpoint continues as the run that was not stopped (dropout's masks included,
// eager and graphed), and a capture that reads back to the host fails with CUDA's reason
// (after which the process captures nothing more; after a copy LibTorch refuses, captures go
// on). Without a CUDA device every test warns and returns.
#include "core/kernels/fused_adamw.h"
#include "core/runtime/cuda_graph.h"
#include "core/train/graphed_step.h"
#include "core/train/trainer.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>
#include <torch/cuda.h>

#include <filesystem>
#include <map>
#include <optional>

using namespace extrap;
using namespace extrap::testing;

namespace {

Config graph_config(Precision precision, int64_t accumulation, double dropout) {
  Config config = tiny_config("alibi");
  config.model.dropout = dropout;
  config.train.device = Device::cuda;
  config.train.precision = precision;
  config.train.accumulation = accumulation;
  config.train.batch_tokens = 8 * 16 * accumulation;  // 8 sequences of 16 a micro-batch
  return config;
}

using Batch = std::vector<MicroBatch>;  // one optimiser step's micro-batches

// Step `step`'s micro-batches on the CPU; from the third step on, a varying share of each
// micro-batch's targets is not scored (-100), as a masked-LM batch's is.
Batch make_batch(const TrainConfig& t, int64_t micro, int step) {
  torch::manual_seed(500 + step);
  Batch b;
  for (int64_t a = 0; a < t.accumulation; ++a) {
    const auto tokens = torch::randint(0, 257, {micro, t.seq_len + 1}, torch::kLong);
    auto targets = tokens.narrow(1, 1, t.seq_len).clone();
    if (step >= 2) targets.masked_fill_(torch::rand(targets.sizes()) < 0.2 * double(step % 3 + 1), -100);
    const int64_t scored = targets.ne(-100).sum().item<int64_t>();
    b.push_back({tokens.narrow(1, 0, t.seq_len).clone(), targets, scored});
  }
  return b;
}

// The trainer's eager step (Trainer::forward_backward, optimizer_step) on one batch.
double eager_step(TransformerLM& model, torch::optim::AdamW& optimizer, const TrainConfig& t, const Batch& b,
                  double lr) {
  for (auto& group : optimizer.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  optimizer.zero_grad();
  double loss = 0;
  for (size_t a = 0; a < b.size(); ++a) {
    const MicroBatch& m = b[a];
    const auto part = training_loss(model, m.inputs.to(torch::kCUDA), m.targets.to(torch::kCUDA), m.scored, t.precision);
    (part / micro_batch_divisor(b, a)).backward();
    loss += part.item<double>() / micro_batch_divisor(b, a);
  }
  optimizer_step(optimizer, t.clip);
  return loss;
}

TransformerLM cuda_model(const Config& config, int64_t vocab = 257) {
  torch::manual_seed(uint64_t(config.train.seed));
  auto model = build_model(config, vocab);
  model->to(torch::kCUDA);
  model->train();
  return model;
}

// max |(a - start) - (b - start)| over max |b - start|: how far two runs' parameter changes differ.
double change_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b,
                         const std::vector<torch::Tensor>& start) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto da = a[i].detach().cpu() - start[i], db = b[i].detach().cpu() - start[i];
    worst = std::max(worst, (da - db).abs().max().item<double>());
    scale = std::max(scale, db.abs().max().item<double>());
  }
  return worst / std::max(scale, 1e-30);
}

std::vector<torch::Tensor> cpu_copies(const TransformerLM& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().cpu().clone());
  return out;
}

}  // namespace

namespace {
// `config` trained in this process until `stop` steps, then resumed from that checkpoint by a
// second Trainer, which is returned with its run's summary.
struct ResumedRun {
  std::unique_ptr<Trainer> trainer;
  TrainSummary summary;
  Trainer* operator->() const { return trainer.get(); }
};
ResumedRun stopped_and_resumed(const Config& config, const Corpus& corpus, int64_t stop) {
  {
    Trainer first(config, corpus);
    first.quiet = true;
    first.stop_after_step = stop;
    first.run(RunStart::fresh);
  }
  ResumedRun resumed{std::make_unique<Trainer>(config, corpus), {}};
  resumed.trainer->quiet = true;
  resumed.summary = resumed.trainer->run(RunStart::resume);
  REQUIRE(resumed.summary.resumed_from == stop);
  return resumed;
}
}  // namespace

TEST_CASE("a CUDA graph of the training step trains as the eager step does", "[cuda][graph]") {
  if (!have_cuda()) return;
  for (const auto precision : {Precision::fp32, Precision::bf16})
    for (const int64_t accumulation : {1, 2}) {
      INFO(enum_name(precision) << ", accumulation " << accumulation);
      const Config config = graph_config(precision, accumulation, 0.0);
      const TrainConfig& t = config.train;
      auto eager = cuda_model(config), graphed_model = cuda_model(config);
      const auto start = cpu_copies(eager);
      auto eager_optimizer = make_optimizer(eager, t), graphed_optimizer = make_optimizer(graphed_model, t);
      REQUIRE(GraphedTrainingStep::unsupported_reason(graphed_model, *graphed_optimizer, t, torch::kCUDA, false) == "");
      GraphedTrainingStep graphed(graphed_model, *graphed_optimizer, t, 8);
      const double tolerance = precision == Precision::fp32 ? 1e-4 : 2e-2;
      for (int step = 0; step < 7; ++step) {
        INFO("step " << step);
        const Batch batch = make_batch(t, 8, step);
        const double lr = learning_rate(t, step + 1);  // warm-up: a different rate at every step
        const double expected = eager_step(eager, *eager_optimizer, t, batch, lr);
        const double got = graphed.step(batch, lr);
        REQUIRE(graphed.failure() == "");
        REQUIRE(graphed.captured());
        CHECK(got == Approx(expected).epsilon(precision == Precision::fp32 ? 1e-5 : 1e-3));
      }
      CHECK(change_difference(graphed_model->parameters(), eager->parameters(), start) < tolerance);
      const auto e = eager->parameters(), g = graphed_model->parameters();
      for (size_t i = 0; i < e.size(); ++i) {
        const auto& es = static_cast<torch::optim::AdamWParamState&>(*eager_optimizer->state().at(e[i].unsafeGetTensorImpl()));
        const auto& gs = static_cast<torch::optim::AdamWParamState&>(*graphed_optimizer->state().at(g[i].unsafeGetTensorImpl()));
        CHECK(gs.step() == es.step());
        CHECK(gs.step() == 7);
        CHECK((gs.exp_avg_sq() - es.exp_avg_sq()).abs().max().item<double>() <=
              tolerance * es.exp_avg_sq().abs().max().item<double>() + 1e-30);
      }
    }
}

TEST_CASE("a CUDA graph of the training step: fresh dropout masks, and the rate and token count read at each replay", "[cuda][graph]") {
  if (!have_cuda()) return;
  for (const double dropout : {0.0, 0.1}) {
    INFO("dropout " << dropout);
    const Config config = graph_config(Precision::fp32, 1, dropout);
    auto model = cuda_model(config);
    auto optimizer = make_optimizer(model, config.train);
    GraphedTrainingStep graphed(model, *optimizer, config.train, 8);
    const Batch batch = make_batch(config.train, 8, 0);
    std::vector<double> losses;
    for (int replay = 0; replay < 4; ++replay) losses.push_back(graphed.step(batch, 0.0));
    REQUIRE(graphed.captured());
    // lr 0: nothing moves, so the same batch scores the same, but for dropout's masks.
    if (dropout == 0) {
      CHECK(losses[2] == losses[1]);
      CHECK(losses[3] == losses[1]);
      const auto before = cpu_copies(model);
      auto twice = batch;
      twice[0].scored *= 2;
      CHECK(graphed.step(twice, 0.0) == Approx(losses[1] / 2).epsilon(1e-6));
      for (size_t i = 0; i < before.size(); ++i) REQUIRE(torch::equal(before[i], model->parameters()[i].cpu()));
      graphed.step(batch, 1e-2);
      CHECK((cpu_copies(model)[0] - before[0]).abs().max().item<double>() > 1e-4);
    } else {
      CHECK(losses[2] != losses[1]);
      CHECK(losses[3] != losses[2]);
    }
  }
}

TEST_CASE("a training run on a CUDA graph, stopped and resumed, continues as the run that was not stopped", "[cuda][graph]") {
  if (!have_cuda()) return;
  auto corpus = tiny_byte_corpus();
  Config config = graph_config(Precision::fp32, 1, 0.0);
  config.train.steps = 12;
  config.train.checkpoint_every = 6;
  config.train.cuda_graph = CudaGraphMode::on;
  TempDir dir("graph-resume");
  const auto start = cpu_copies(cuda_model(config, corpus.vocab_size));

  config.train.out_dir = (dir.root / "whole").string();
  Trainer whole(config, corpus);
  whole.quiet = true;
  whole.run(RunStart::fresh);

  config.train.out_dir = (dir.root / "resumed").string();
  const auto second = stopped_and_resumed(config, corpus, 6);
  // AdamW's step counts in the checkpoint are the graph's: a count left at the eager step's
  // would change the bias correction of every later step by far more than this.
  CHECK(change_difference(second->model()->parameters(), whole.model()->parameters(), start) < 1e-3);

  config.train.cuda_graph = CudaGraphMode::off;
  config.train.out_dir = (dir.root / "eager").string();
  Trainer eager(config, corpus);
  eager.quiet = true;
  eager.run(RunStart::fresh);
  CHECK(change_difference(whole.model()->parameters(), eager.model()->parameters(), start) < 1e-3);
}

TEST_CASE("two models trained one after the other in one process on CUDA graphs train as without graphs",
          "[cuda][graph]") {
  // A sweep's points in one process (run_points, --jobs 1): different widths and position
  // methods, each captured in turn; then a graphed run stopped and resumed in the same process.
  if (!have_cuda()) return;
  auto corpus = tiny_byte_corpus();
  TempDir dir("graph-two-models");
  struct Point {
    std::string position;
    int64_t d_model;
  };
  const std::vector<Point> points{{"alibi", 32}, {"rotary", 64}, {"t5_bias", 32}};
  std::map<std::string, std::vector<double>> losses;  // "mode/position" -> the validation curve
  for (const CudaGraphMode mode : {CudaGraphMode::on, CudaGraphMode::off}) {
    for (const Point& point : points) {
      Config config = graph_config(Precision::fp32, 1, 0.0);
      config.position_name = point.position;
      config.model.d_model = point.d_model;
      config.train.steps = 12;
      config.train.validate_every = 4;
      config.train.cuda_graph = mode;
      const std::string name = enum_name(mode) + "/" + point.position;
      config.train.out_dir = (dir.root / name).string();
      Trainer trainer(config, corpus);
      trainer.quiet = true;
      const TrainSummary summary = trainer.run(RunStart::fresh);
      for (const auto& v : summary.valid_curve) losses[name].push_back(v.loss);
    }
  }
  for (const Point& point : points) {
    INFO(point.position);
    const auto& graphed = losses["on/" + point.position];
    const auto& eager = losses["off/" + point.position];
    REQUIRE(graphed.size() == eager.size());
    for (size_t i = 0; i < graphed.size(); ++i) CHECK(graphed[i] == Approx(eager[i]).epsilon(1e-4));
  }

  // Stopped and resumed in this process, after the models above were captured.
  Config config = graph_config(Precision::fp32, 1, 0.0);
  config.train.steps = 12;
  config.train.checkpoint_every = 6;
  config.train.validate_every = 6;
  config.train.cuda_graph = CudaGraphMode::on;
  config.train.out_dir = (dir.root / "resumed").string();
  const TrainSummary resumed = stopped_and_resumed(config, corpus, 6).summary;
  config.train.cuda_graph = CudaGraphMode::off;
  config.train.out_dir = (dir.root / "eager").string();
  Trainer eager(config, corpus);
  eager.quiet = true;
  const TrainSummary straight = eager.run(RunStart::fresh);
  REQUIRE(!straight.valid_curve.empty());
  CHECK(resumed.valid_curve.back().loss == Approx(straight.valid_curve.back().loss).epsilon(1e-4));
}

TEST_CASE("a GPU run with dropout, stopped and resumed, draws the masks the run that was not stopped draws",
          "[cuda][graph]") {
  // The checkpoint holds the GPU's generator (cuda_rng.pt) as well as the CPU's: dropout's masks
  // on a GPU come from the GPU's, which a resumed run would otherwise start again from the seed.
  if (!have_cuda()) return;
  auto corpus = tiny_byte_corpus();
  TempDir dir("dropout-resume");
  for (const CudaGraphMode mode : {CudaGraphMode::off, CudaGraphMode::on}) {
    INFO("train.cuda_graph " << enum_name(mode));
    Config config = graph_config(Precision::fp32, 1, 0.1);
    config.model.attention_dropout = 0.1;
    config.train.steps = 12;
    config.train.checkpoint_every = 6;
    config.train.cuda_graph = mode;
    const auto start = cpu_copies(cuda_model(config, corpus.vocab_size));
    const auto trained = [&](const std::string& name, std::optional<uint64_t> gpu_seed) {
      config.train.out_dir = (dir.root / (enum_name(mode) + "-" + name)).string();
      auto trainer = std::make_unique<Trainer>(config, corpus);
      trainer->quiet = true;
      if (gpu_seed) torch::cuda::manual_seed_all(*gpu_seed);  // after the model's initialisation
      trainer->run(RunStart::fresh);
      return trainer;
    };
    const auto whole = trained("whole", std::nullopt);
    REQUIRE(std::filesystem::exists(dir.root / (enum_name(mode) + "-whole") / "checkpoint" / "cuda_rng.pt"));
    config.train.out_dir = (dir.root / (enum_name(mode) + "-resumed")).string();
    const auto resumed = stopped_and_resumed(config, corpus, 6);
    CHECK(change_difference(resumed->model()->parameters(), whole->model()->parameters(), start) < 1e-3);
    // The control: the same run on another GPU stream (masks differ from the first step) is
    // far outside that bound, so the bound tells the streams apart.
    const auto other = trained("other-masks", 987654321);
    CHECK(change_difference(other->model()->parameters(), whole->model()->parameters(), start) > 1e-2);
  }
}

// Last in the file: after a capture CUDA invalidated, the process captures nothing more.
TEST_CASE("a CUDA graph capture that reads back to the host fails with CUDA's reason, and none is captured after; one LibTorch refuses does not stop later ones", "[cuda][graph]") {
  if (!have_cuda()) return;
  Config sampled = graph_config(Precision::fp32, 1, 0.0);
  sampled.position = YAML::Load("{name: alibi, randomize_max: 64}");
  auto model = cuda_model(sampled);
  auto optimizer = make_optimizer(model, sampled.train);
  REQUIRE_THAT(GraphedTrainingStep::unsupported_reason(model, *optimizer, sampled.train, torch::kCUDA, false),
               Catch::Contains("position.randomize_max"));
  REQUIRE_THAT(GraphedTrainingStep::unsupported_reason(model, *optimizer, sampled.train, torch::kCUDA, true),
               Catch::Contains("data-parallel"));

  const CudaGraphCapture capture = cuda_graph_capture();
  REQUIRE(capture != nullptr);
  const auto x = torch::zeros({4}, torch::kCUDA);
  auto graph = capture([&] { x.add_(10); }, [&] { x.add_(1); });  // the warm-up runs, the work is recorded
  REQUIRE(x.sum().item<float>() == 40);
  graph->replay();
  graph->replay();
  REQUIRE(x.sum().item<float>() == 48);

  // A copy from pageable host memory: LibTorch refuses it before CUDA sees it, the capture
  // ends cleanly, and the next one goes ahead.
  const auto host = torch::ones({4});
  REQUIRE_THROWS_WITH(capture([] {}, [&] { x.add_(host.to(torch::kCUDA)); }), Catch::Contains("captur"));
  REQUIRE(x.sum().item<float>() == 48);
  auto again = capture([] {}, [&] { x.mul_(2); });
  again->replay();
  REQUIRE(x.sum().item<float>() == 96);
  x.fill_(12);  // 48 again

  // A synchronisation with the host: CUDA invalidates the capture, and none follows.
  REQUIRE_THROWS_WITH(capture([] {}, [&] { (x + 1).sum().item<float>(); }), Catch::Contains("captur"));
  x.add_(1);  // the stream works
  REQUIRE(x.sum().item<float>() == 52);
  graph->replay();  // and a graph captured before
  REQUIRE(x.sum().item<float>() == 56);
  REQUIRE_THROWS_WITH(capture([&] { x.add_(10); }, [&] { x.add_(1); }),
                      Catch::Contains("an earlier CUDA graph capture in this process was invalidated"));
  REQUIRE(x.sum().item<float>() == 96);  // its warm-up ran
}
