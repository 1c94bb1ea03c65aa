// Decoding with a KV cache: for every causal method, the logits of a sequence decoded block by
// block (one token at a time, and in uneven blocks) equal those of one forward pass over the
// whole sequence, well past the training length; the refusals of the cached path.
#include "core/eval/generate.h"
#include "core/model/model.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

#include <ATen/CPUGeneratorImpl.h>
#include <catch2/catch.hpp>

#include <vector>

using namespace extrap;

namespace {

using testing::perturbed_model;

// Logits of `tokens` (B, T) decoded in blocks of the given sizes (summing to T) with a cache.
torch::Tensor decode_in_blocks(TransformerLM& model, const torch::Tensor& tokens,
                               const std::vector<int64_t>& blocks) {
  KVCache cache(tokens.size(1));
  std::vector<torch::Tensor> logits;
  int64_t at = 0;
  for (int64_t size : blocks) {
    logits.push_back(model->logits(model->hidden(tokens.narrow(1, at, size), cache)));
    at += size;
    REQUIRE(cache.length == at);
  }
  REQUIRE(at == tokens.size(1));
  return torch::cat(logits, 1);
}

}  // namespace

TEST_CASE("decoding with a KV cache gives the full forward pass's logits, for every causal method",
          "[generate]") {
  const int64_t T = 48;  // three times the training length
  std::vector<int64_t> one_by_one(T - 5, 1);
  one_by_one.insert(one_by_one.begin(), 5);  // a prompt of 5, then one token at a time
  const std::vector<int64_t> uneven = {7, 1, 3, 16, 2, 19};
  for (const auto& name : testing::causal_methods()) {
    INFO(name);
    auto model = perturbed_model(name);
    torch::NoGradGuard no_grad;
    torch::manual_seed(5);
    auto tokens = torch::randint(0, 256, {2, T}, torch::kLong);
    const auto full = model->forward(tokens);  // (2, T, V)
    for (const auto& blocks : {one_by_one, uneven, std::vector<int64_t>{T}}) {
      const auto decoded = decode_in_blocks(model, tokens, blocks);
      REQUIRE(decoded.sizes() == full.sizes());
      const double difference = (decoded - full).abs().max().item<double>();
      INFO("blocks " << blocks.size() << ": max |difference| " << difference);
      REQUIRE(torch::allclose(decoded, full, 1e-5, 1e-5));
    }
  }
}

TEST_CASE("the cached path refuses what it cannot do right, in one line", "[generate]") {
  auto model = perturbed_model("alibi");
  torch::NoGradGuard no_grad;
  auto tokens = torch::randint(0, 256, {1, 8}, torch::kLong);
  {
    KVCache cache(6);
    REQUIRE_THROWS_WITH(model->hidden(tokens, cache),
                        Catch::Contains("the KV cache was planned for 6 tokens; 0 are cached and 8 "
                                        "more came"));
  }
  {
    KVCache cache(16);
    model->hidden(tokens, cache);
    model->set_attention_backend(AttentionBackend::Efficient);
    REQUIRE_THROWS_WITH(model->hidden(tokens.narrow(1, 0, 1), cache),
                        Catch::Contains("the efficient backend needs as many queries as keys"));
    model->set_attention_backend(AttentionBackend::Auto);
  }
  {
    Config config = testing::tiny_config("rotary");
    config.model.objective = Objective::masked_lm;
    auto masked = build_model(config, 257);
    masked->eval();
    KVCache cache(16);
    REQUIRE_THROWS_WITH(masked->hidden(tokens, cache),
                        Catch::Contains("a KV cache needs a causal model"));
  }
  {
    auto rotary = perturbed_model("rotary");
    RopeScaling yarn;
    yarn.kind = RopeScalingKind::yarn;
    yarn.factor = 2;
    yarn.original_length = 16;
    rotary->set_rope_scaling(yarn);
    KVCache cache(16);
    REQUIRE_THROWS_WITH(rotary->hidden(tokens, cache),
                        Catch::Contains("a KV cache with RoPE scaling is not supported"));
  }
}

TEST_CASE("sampling: greedy takes the largest logit, top-k never leaves the k largest, seeds repeat",
          "[generate]") {
  auto logits = torch::tensor({0.1, 2.0, -1.0, 1.9, 0.0});
  GenerateOptions greedy;
  greedy.temperature = 0;
  torch::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1);
  REQUIRE(sample_token(logits, greedy, generator) == 1);
  greedy.banned = {1};
  REQUIRE(sample_token(logits, greedy, generator) == 3);
  GenerateOptions top2;
  top2.top_k = 2;
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 400; ++i) counts[sample_token(logits, top2, generator)]++;
  REQUIRE(counts[0] + counts[2] + counts[4] == 0);
  // exp(2.0) : exp(1.9) = 0.525 : 0.475 of 400 draws; five standard deviations either side.
  REQUIRE(std::abs(counts[1] - 210) < 50);
  const auto draws = [&](uint64_t seed) {
    torch::Generator g = at::make_generator<at::CPUGeneratorImpl>(seed);
    std::vector<int32_t> out;
    for (int i = 0; i < 30; ++i) out.push_back(sample_token(logits, GenerateOptions{}, g));
    return out;
  };
  REQUIRE(draws(7) == draws(7));
  REQUIRE(draws(7) != draws(8));
}

TEST_CASE("extrap generate: greedy text with and without the cache agree, seeds repeat, refusals",
          "[generate][cli]") {
  testing::SweepDir d;
  testing::write_text(d.root / "train.yaml", R"(data: {path: corpus, tokenizer: byte, cache_dir: cache}
model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}
position: alibi
train: {seq_len: 16, batch_tokens: 256, steps: 30, lr: 0.003, warmup: 2, validate_every: 0,
        checkpoint_every: 30, threads: 1, out_dir: runs/a}
)");
  std::string out;
  REQUIRE(testing::run_cli(d, {"train", "--config", "train.yaml", "--no-eval"}, &out) == 0);
  // Past the training length (16): a prompt of 10 bytes and 40 new ones.
  const std::vector<std::string> greedy = {"generate", "--checkpoint", "runs/a", "--prompt",
                                           "A model t", "--max-new", "40", "--temperature", "0"};
  REQUIRE(testing::run_cli(d, greedy, &out) == 0);
  const std::string cached = out.substr(0, out.find("generate: "));
  CHECK(out.find("generate: 9 prompt tokens, 40 new in") != std::string::npos);
  CHECK(out.find("KV cache; trained at L = 16") != std::string::npos);
  std::vector<std::string> uncached = greedy;
  uncached.push_back("--no-cache");
  REQUIRE(testing::run_cli(d, uncached, &out) == 0);
  CHECK(out.substr(0, out.find("generate: ")) == cached);
  CHECK(cached.rfind("A model t", 0) == 0);
  CHECK(cached.size() == 9 + 40 + 1);  // prompt, 40 bytes, newline

  const auto sampled = [&](const std::string& seed) {
    std::string text;
    REQUIRE(testing::run_cli(d, {"generate", "--checkpoint", "runs/a", "--prompt", "A model t",
                                 "--max-new", "40", "--seed", seed, "--top-k", "20"},
                             &text) == 0);
    return text.substr(0, text.find("generate: "));
  };
  CHECK(sampled("3") == sampled("3"));
  CHECK(sampled("3") != sampled("4"));

  testing::write_text(d.root / "prompt.txt", "A model t");
  REQUIRE(testing::run_cli(d, {"generate", "--checkpoint", "runs/a", "--prompt-file", "prompt.txt",
                               "--max-new", "40", "--temperature", "0"},
                           &out) == 0);
  CHECK(out.substr(0, out.find("generate: ")) == cached);

  CHECK(testing::run_cli(d, {"generate", "--checkpoint", "runs/a", "--max-new", "4"}, &out) == 2);
  CHECK(out.find("exactly one of --prompt and --prompt-file") != std::string::npos);
  CHECK(testing::run_cli(d, {"generate", "--checkpoint", "runs/a", "--prompt", "x", "--max-new",
                             "4", "--temperature=-1"},
                         &out) == 2);
  CHECK(out.find("--temperature -1") != std::string::npos);
  CHECK(testing::run_cli(d, {"generate", "--checkpoint", "runs/a", "--prompt", "", "--max-new", "4"},
                         &out) == 2);
  CHECK(out.find("--prompt: the prompt has no tokens") != std::string::npos);
  CHECK(testing::run_cli(d, {"generate", "--checkpoint", "runs/a", "--prompt-file", "missing.txt",
                             "--max-new", "4"},
                         &out) == 2);
  CHECK(out.find("missing.txt") != std::string::npos);
}
