// train.precision bf16: the key's parsing and run identity, autocast's reach (matrix products
// only; attention stays float32), the loss and gradients against fp32, and training with it.
#include "core/attention/attention.h"
#include "core/eval/evaluator.h"
#include "core/kernels/precision.h"
#include "core/run/run_dir.h"
#include "core/train/trainer.h"
#include "tests/support/test_support.h"

#include <ATen/autocast_mode.h>

#include <catch2/catch.hpp>

using namespace extrap;
using testing::TempDir;

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("train.precision: fp32 by default, bf16 on request, anything else refused by name", "[precision]") {
  REQUIRE(load_config("", {}).train.precision == Precision::fp32);
  REQUIRE(load_config("", {"train.precision=bf16"}).train.precision == Precision::bf16);
  const auto message = message_of([] { load_config("", {"train.precision=fp16"}); });
  REQUIRE_THAT(message, Catch::Contains("train.precision") && Catch::Contains("fp16") &&
                            Catch::Contains("bf16"));
  // fp32 leaves the key out of the run's identity (runs of earlier versions keep theirs);
  // bf16 trains another model, so it is part of it.
  const Config fp32 = load_config("", {});
  const Config bf16 = load_config("", {"train.precision=bf16"});
  REQUIRE(!fp32.model_keys()["train"]["precision"]);
  REQUIRE(bf16.model_keys()["train"]["precision"].as<std::string>() == "bf16");
  const auto corpus = testing::tiny_byte_corpus(4);
  REQUIRE(run_fingerprint(fp32, corpus).hash != run_fingerprint(bf16, corpus).hash);
}

TEST_CASE("bf16: matrix products in bfloat16 inside the region only, attention in float32", "[precision]") {
  torch::manual_seed(3);
  const auto x = torch::randn({8, 16}), w = torch::randn({16, 16});
  {
    ComputePrecision region(Precision::fp32, torch::kCPU);
    REQUIRE(torch::matmul(x, w).scalar_type() == torch::kFloat32);
  }
  {
    ComputePrecision region(Precision::bf16, torch::kCPU);
    REQUIRE(torch::matmul(x, w).scalar_type() == torch::kBFloat16);
  }
  REQUIRE(torch::matmul(x, w).scalar_type() == torch::kFloat32);  // restored

  // Attention under the region is the float32 attention of the same inputs, bit for bit:
  // its products, bias and softmax never see bfloat16.
  const auto q = torch::randn({2, 4, 33, 8}), k = torch::randn({2, 4, 33, 8}), v = torch::randn({2, 4, 33, 8});
  const auto bias = AttentionBias::linear_causal(torch::tensor({0.5f, 0.25f, 0.125f, 0.0625f}));
  AttentionOptions options;
  options.training = true;
  const auto expected = attention(q, k, v, bias, options);
  torch::Tensor got;
  {
    ComputePrecision region(Precision::bf16, torch::kCPU);
    got = attention(q, k, v, bias, options);
  }
  REQUIRE(got.scalar_type() == torch::kFloat32);
  REQUIRE(torch::equal(got, expected));
}

TEST_CASE("bf16: the loss and gradients of a batch agree with fp32 to bfloat16's precision", "[precision]") {
  const auto corpus = testing::tiny_byte_corpus();
  for (const char* position : {"alibi", "rotary", "t5_bias"}) {
    INFO(position);
    Config config = testing::tiny_config(position);
    torch::manual_seed(5);
    TransformerLM model = build_model(config, corpus.vocab_size);
    model->train();
    const auto tokens = torch::randint(0, 256, {4, 17}, torch::kLong);
    const auto [loss32, grad32] = testing::loss_and_gradients(model, tokens, Precision::fp32);
    const auto [loss16, grad16] = testing::loss_and_gradients(model, tokens, Precision::bf16);
    REQUIRE(grad16.scalar_type() == torch::kFloat32);  // master weights and gradients stay fp32
    // bfloat16 keeps 8 significant bits (relative rounding 2^-9); a few products deep, the loss
    // moves by well under 1%, and the gradient keeps its direction.
    REQUIRE(loss16 != loss32);  // the products did run in bfloat16
    REQUIRE(std::abs(loss16 - loss32) < 1e-2 * loss32);
    const double cosine = (grad16 * grad32).sum().item<double>() /
                          (grad16.norm().item<double>() * grad32.norm().item<double>());
    REQUIRE(cosine > 0.999);
    REQUIRE((grad16 - grad32).norm().item<double>() < 0.05 * grad32.norm().item<double>());
  }
}

TEST_CASE("bf16 training lowers the loss, resumes bit-for-bit, and evaluates in float32", "[precision]") {
  const auto corpus = testing::tiny_byte_corpus();
  Config config = testing::tiny_config("alibi");
  config.train.precision = Precision::bf16;
  config.train.steps = 40;
  config.train.checkpoint_every = 10;
  TempDir dir("bf16");
  const auto params = testing::require_resume_bit_for_bit(config, corpus, dir.root, 20);
  for (const auto& p : params) REQUIRE(p.scalar_type() == torch::kFloat32);

  config.train.out_dir = (dir.root / "straight").string();
  const VerifiedCheckpoint checkpoint = require_checkpoint(config.train.out_dir);
  LoadedRun run = load_run(checkpoint, corpus);
  REQUIRE(run.config.train.precision == Precision::bf16);
  EvalSpec spec;
  spec.length = 16;
  const auto trained = evaluate(run.model, corpus, corpus.valid, spec);
  Config untrained = testing::tiny_config("alibi");
  torch::manual_seed(1);
  TransformerLM fresh = build_model(untrained, corpus.vocab_size);
  const auto before = evaluate(fresh, corpus, corpus.valid, spec);
  REQUIRE(trained.nll_sum < 0.8 * before.nll_sum);
  // Evaluation is float32 whatever the training precision: no autocast region is open.
  REQUIRE(!at::autocast::is_autocast_enabled(torch::kCPU));
}
