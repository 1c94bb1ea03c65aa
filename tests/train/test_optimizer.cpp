// NAG and fairseq's cosine schedule against their definitions, and the ALiBi paper's recipe
// (adaptive softmax, NAG, cosine with restarts) training at small scale.
#include "core/data/tokenizer.h"
#include "core/eval/evaluator.h"
#include "core/train/optimizer.h"
#include "core/train/trainer.h"
#include "experiments/sweep/sweep_spec.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace extrap;
using testing::TempDir;

TEST_CASE("train.schedule cosine_restarts: the paper's learning rate at its warm-up, its peak and each restart",
          "[train][optimizer]") {
  const TrainConfig c = load_sweep(EXTRAP_SOURCE_DIR "/configs/wikitext103-paper.yaml", {}).base_config.train;
  REQUIRE(c.schedule == Schedule::cosine_restarts);
  // fairseq sets the rate of update n + 1 after n updates: lr(n) below, from fairseq's formula
  // with --max-lr 1 --lr 1e-4 --warmup-updates 16000 --warmup-init-lr 1e-7
  // --lr-period-updates 270000 --t-mult 2 --lr-shrink 0.75, worked out by hand.
  const std::vector<std::pair<int64_t, double>> expected{
      {0, 1e-7},                          // the warm-up's start
      {8000, 0.50000005},                 // half-way: 1e-7 + (1 - 1e-7) / 2
      {16000, 1.0},                       // the peak, the first period's start
      {16001, 0.999999999966157},         // 1e-4 + (1 - 1e-4) (1 + cos(pi / 270000)) / 2
      {151000, 0.50005},                  // half the first period: (1 + 1e-4) / 2
      {285999, 1.0000003384e-4},          // the first period's last update: 1e-4 + 0.49995 (pi / 270000)^2 / 2
      {286000, 0.75},                     // the first restart: lr x 0.75, a period of 540000
      {826000, 0.5625},                   // the second: x 0.75^2
      {1366000, 0.5625 * 0.50005},        // half of the third period
  };
  for (const auto& [n, lr] : expected) {
    INFO("after " << n << " updates");
    CHECK(learning_rate(c, n + 1) == Approx(lr).epsilon(1e-9));
  }
  // t_mult 1: equal periods, each restarting at lr x shrink^i.
  TrainConfig flat = c;
  flat.t_mult = 1;
  flat.period = 100;
  flat.warmup = 0;
  CHECK(learning_rate(flat, 1) == Approx(1.0));
  CHECK(learning_rate(flat, 51) == Approx(0.50005));
  CHECK(learning_rate(flat, 101) == Approx(0.75));
  CHECK(learning_rate(flat, 201) == Approx(0.5625));
}

// fairseq's NAG (fairseq/optim/nag.py) as written there, in double: a buffer b of -lr-scaled
// velocity, corrected by lr / lr_old when the rate changes, and decoupled weight decay.
struct FairseqNag {
  double momentum, weight_decay, lr_old;
  std::vector<torch::Tensor> buffers;
  void step(std::vector<torch::Tensor>& params, const std::vector<torch::Tensor>& grads, double lr) {
    if (buffers.empty())
      for (const auto& g : grads) buffers.push_back(torch::zeros_like(g));
    const double correct = lr / lr_old;
    for (size_t i = 0; i < params.size(); ++i) {
      if (weight_decay != 0) params[i] = params[i] * (1 - lr * weight_decay);
      params[i] = params[i] + momentum * momentum * correct * buffers[i] - (1 + momentum) * lr * grads[i];
      buffers[i] = buffers[i] * (momentum * correct) - lr * grads[i];
    }
    lr_old = lr;
  }
};

TEST_CASE("train.optimizer nag: each step equals fairseq's NAG, with its clipping and weight decay", "[train][optimizer]") {
  for (const double weight_decay : {0.0, 0.05}) {
    for (const double clip : {0.0, 0.1}) {
      INFO("weight decay " << weight_decay << ", clip " << clip);
      Config config = testing::tiny_config("alibi");
      config.train.optimizer = OptimizerKind::nag;
      config.train.momentum = 0.99;
      config.train.weight_decay = weight_decay;
      config.train.clip = clip;
      torch::manual_seed(8);
      auto model = build_model(config, 257);
      auto optimizer = make_training_optimizer(model, config.train);
      auto params = model->parameters();
      std::vector<torch::Tensor> reference;
      for (const auto& p : params) reference.push_back(p.detach().to(torch::kFloat64).clone());
      FairseqNag nag{0.99, weight_decay, 1e-4, {}};
      for (const double lr : {1e-7, 0.3, 0.3, 1.0, 0.05, 0.75}) {
        std::vector<torch::Tensor> grads;
        double norm = 0;
        for (auto& p : params) {
          p.mutable_grad() = torch::randn_like(p) * 0.2;
          grads.push_back(p.grad().to(torch::kFloat64));
          norm += grads.back().pow(2).sum().item<double>();
        }
        norm = std::sqrt(norm);
        if (clip > 0 && clip / (norm + 1e-6) < 1)  // fairseq's --clip-norm, as torch's clip_grad_norm_
          for (auto& g : grads) g = g * (clip / (norm + 1e-6));
        training_step(*optimizer, config.train, lr);
        nag.step(reference, grads, lr);
        double worst = 0;
        for (size_t i = 0; i < params.size(); ++i)
          worst = std::max(worst, (params[i].detach().to(torch::kFloat64) - reference[i]).abs().max().item<double>());
        INFO("lr " << lr << ": largest difference " << worst);
        CHECK(worst < 2e-6);
      }
    }
  }
}

TEST_CASE("train.optimizer and the schedule's keys are refused where nothing reads them", "[train][optimizer]") {
  const auto refused = [](const std::vector<std::string>& sets, const std::string& key) {
    INFO(key);
    CHECK_THROWS_WITH(load_config("", sets), Catch::Contains("train." + key));
  };
  refused({"train.momentum=0.9"}, "momentum");
  refused({"train.optimizer=nag", "train.beta2=0.95"}, "beta2");
  refused({"train.t_mult=2"}, "t_mult");
  refused({"train.schedule=constant", "train.warmup_init_lr=1e-7"}, "warmup_init_lr");
  refused({"train.schedule=cosine_restarts", "train.lr_shrink=0"}, "lr_shrink");
  refused({"train.schedule=cosine_restarts", "train.t_mult=0.5"}, "t_mult");
  CHECK_THROWS_WITH(load_config("", {"model.adaptive_factor=2"}), Catch::Contains("model.adaptive_factor"));
  CHECK_THROWS_WITH(load_config("", {"model.adaptive_cutoffs=[100, 50]"}), Catch::Contains("model.adaptive_cutoffs"));
  CHECK_THROWS_WITH(load_config("", {"model.adaptive_cutoffs=[10]", "model.tie_embeddings=false"}),
                    Catch::Contains("model.tie_embeddings"));
  CHECK_THROWS_WITH(load_config("", {"model.adaptive_cutoffs=[10, 20, 30, 40, 50]", "model.d_model=64"}),
                    Catch::Contains("0 wide"));
  // A resolved config (every key written) reads back.
  const Config nag = load_config("", {"train.optimizer=nag", "train.schedule=cosine_restarts", "train.t_mult=2",
                                      "model.adaptive_cutoffs=[100]"});
  CHECK(config_from_yaml(nag.to_yaml(), "resolved").train.t_mult == 2);
}

namespace {
// Pseudo-English as a word-level corpus, ids by descending count (as fairseq's dictionary).
Corpus synthetic_word_corpus() {
  const std::string text = testing::synthetic_prose(120000, 11);
  WordVocabulary vocabulary = WordVocabulary::from_text(text);
  const auto ids = vocabulary.encode(text);
  Corpus c;
  c.name = "words";
  c.tokenizer = Tokenizer::word;
  c.vocab_size = vocabulary.size();
  c.eos_token = kWordEos;
  c.unk_token = kWordUnk;
  c.mask_token = kWordMask;
  c.vocabulary = vocabulary.words();
  const size_t cut = ids.size() * 9 / 10;
  c.train = TokenStream::from_tokens(std::vector<int32_t>(ids.begin(), ids.begin() + cut));
  c.valid = TokenStream::from_tokens(std::vector<int32_t>(ids.begin() + cut, ids.end()));
  c.test = c.valid;
  return c;
}
}  // namespace

TEST_CASE("the paper's recipe at small scale: adaptive softmax, NAG and its schedule train, resume bit for bit "
          "and evaluate at 2L",
          "[train][optimizer][adaptive]") {
  const Corpus corpus = synthetic_word_corpus();
  REQUIRE(corpus.vocab_size > 300);
  Config config = testing::tiny_config("alibi");
  config.model.adaptive_cutoffs = {20, 200};
  config.model.adaptive_factor = 2;
  config.model.adaptive_dropout = 0.1;
  config.model.final_norm = false;
  config.model.init = InitKind::fairseq;
  config.model.activation = Activation::relu;
  config.model.dropout = 0.1;
  config.model.attention_dropout = 0.1;
  config.model.activation_dropout = 0.1;
  config.train.optimizer = OptimizerKind::nag;
  config.train.weight_decay = 0;
  config.train.schedule = Schedule::cosine_restarts;
  config.train.lr = 0.5;
  config.train.min_lr = 1e-4;
  config.train.warmup = 5;
  config.train.warmup_init_lr = 1e-7;
  config.train.period = 10;
  config.train.t_mult = 2;
  config.train.lr_shrink = 0.75;
  config.train.clip = 0.1;
  config.train.steps = 24;
  config.train.checkpoint_every = 8;
  TempDir dir("paper_recipe");
  const auto weights = testing::require_resume_bit_for_bit(config, corpus, dir.root, 16);

  auto model = build_model(config, corpus.vocab_size);  // the trained weights, evaluated
  {
    torch::NoGradGuard no_grad;
    auto params = model->parameters();
    REQUIRE(params.size() == weights.size());
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(weights[i]);
  }
  model->eval();
  // Below a uniform guess's loss (ln V) at L and as good at 2L, as ALiBi extrapolates.
  const double uniform = std::log(double(corpus.vocab_size));
  std::vector<double> losses;
  for (const int64_t length : {int64_t(16), int64_t(32)}) {
    EvalSpec spec;
    spec.length = length;
    const EvalResult result = evaluate(model, corpus, corpus.valid, spec);
    losses.push_back(result.nll_sum / double(result.scored_tokens));
    INFO("length " << length << ": nll " << losses.back() << ", ln V " << uniform);
    CHECK(std::isfinite(result.nll_sum));
    CHECK(losses.back() < 0.9 * uniform);
  }
  CHECK(losses[1] < losses[0] * 1.02);
}
