// StreamingLLM evaluation (Xiao et al., ICLR 2024; REFERENCE.md): each query sees the stream's
// first S tokens (sinks) and its last W - S, at cache slots (sinks 0 .. S - 1, the recent tokens
// right after). Checked against the definition written here: an attention layer's scores with
// explicit slot distances (ALiBi, rotary), and, for every causal method, the model layer by layer
// with each token's cache gathered by the test and run as a window of its own; then the
// evaluator, the command line and the refusals.
#include "core/eval/evaluator.h"
#include "core/model/model.h"
#include "tests/support/architectures.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace extrap;
using testing::perturbed_model;

namespace {

// The stream positions in query t's cache, in slot order: all of 0 .. t while t < W, else the
// first S and the last W - S.
std::vector<int64_t> cache_of(int64_t t, int64_t S, int64_t W) {
  std::vector<int64_t> rows;
  if (t < W) {
    for (int64_t j = 0; j <= t; ++j) rows.push_back(j);
    return rows;
  }
  for (int64_t j = 0; j < S; ++j) rows.push_back(j);
  for (int64_t j = t - (W - S) + 1; j <= t; ++j) rows.push_back(j);
  return rows;
}

torch::Tensor index_tensor(const std::vector<int64_t>& rows) {
  return torch::tensor(rows, torch::kLong);
}

// Rotary as the paper writes it, in float64: pairs (2i, 2i+1) of one row turned by p theta_i,
// theta_i = 10000^(-2i/d).
torch::Tensor rotated(const torch::Tensor& row, double p) {
  auto out = row.to(torch::kFloat64).clone();
  const int64_t d = row.size(-1);
  for (int64_t i = 0; i < d / 2; ++i) {
    const double angle = p * std::pow(10000.0, -2.0 * double(i) / double(d));
    const auto a = row.select(-1, 2 * i).to(torch::kFloat64), b = row.select(-1, 2 * i + 1).to(torch::kFloat64);
    out.select(-1, 2 * i).copy_(a * std::cos(angle) - b * std::sin(angle));
    out.select(-1, 2 * i + 1).copy_(a * std::sin(angle) + b * std::cos(angle));
  }
  return out;
}

// A module of the model by its name ("blocks.1", "ln_final", "embedding").
template <class Module>
Module& module_of(TransformerLM& model, const std::string& name) {
  const auto modules = model->named_modules();
  REQUIRE(modules.contains(name));
  return *modules[name]->as<Module>();
}

// The model's logits under StreamingLLM by the definition: layer by layer over the stream, the
// output of token t is the last row of its block run over t's cache (gathered here) as a window
// at positions 0 .. |cache| - 1; an absolute method embeds token t at min(t, W - 1).
torch::Tensor streaming_by_definition(TransformerLM& model, const torch::Tensor& tokens, int64_t S, int64_t W) {
  const int64_t T = tokens.size(1);
  auto x = module_of<torch::nn::EmbeddingImpl>(model, "embedding").forward(tokens) *
           std::sqrt(double(model->config().d_model));
  if (model->config().embedding_norm) x = module_of<NormImpl>(model, "embedding_norm").forward(x);
  TokenPositions slots = TokenPositions::window(T);
  slots.sampled = torch::arange(T, torch::kLong).clamp_max(W - 1);
  x = model->position().embed(x, slots);
  AttentionOptions options;
  options.causal = true;
  options.efficient_threshold = model->config().efficient_threshold;
  for (int64_t l = 0; l < model->config().layers; ++l) {
    auto& block = module_of<BlockImpl>(model, "blocks." + std::to_string(l));
    PositionMethod& method = model->kind_position(model->plan().layer_kind[size_t(l)]);
    std::vector<torch::Tensor> rows;
    for (int64_t t = 0; t < T; ++t) {
      const auto cache = index_tensor(cache_of(t, S, W));
      const auto window = block.forward(x.index_select(1, cache), method, TokenPositions::window(cache.size(0)), options);
      rows.push_back(window.select(1, -1));  // (B, D)
    }
    x = torch::stack(rows, 1);
  }
  return model->logits(module_of<NormImpl>(model, "ln_final").forward(x));
}

}  // namespace

TEST_CASE("streaming attention: sinks at slots 0 .. S - 1, the recent keys right after, the query at "
          "min(t, W - 1), for ALiBi and rotary by their formulas",
          "[streaming]") {
  const int64_t T = 23, D = 32, H = 4, Dh = D / H, S = 2, W = 7;
  torch::manual_seed(33);
  PositionContext context;
  context.num_heads = H;
  context.d_head = Dh;
  context.d_model = D;
  SelfAttention attention(SelfAttentionOptions(D, H));
  attention->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, T, D});
  TokenPositions positions = TokenPositions::window(T);
  positions.stream_sinks = S;
  positions.stream_cache = W;
  AttentionOptions options;
  options.causal = true;
  const auto qkv = torch::linear(x.to(torch::kFloat64), attention->qkv->weight.to(torch::kFloat64),
                                 attention->qkv->bias.to(torch::kFloat64))
                       .view({2, T, 3, H, Dh})
                       .permute({2, 0, 3, 1, 4});  // (3, B, H, T, Dh)
  const std::vector<double> slopes = {std::pow(2.0, -2), std::pow(2.0, -4), std::pow(2.0, -6), std::pow(2.0, -8)};
  for (const std::string name : {"alibi", "rotary"}) {
    INFO(name);
    const auto method =
        PositionRegistry::instance().create(name, context, OptionReader(YAML::Load("{}"), "test", "position"));
    const auto actual = attention->forward(x, *method, positions, options);  // (B, T, D)
    auto context_rows = torch::zeros({2, H, T, Dh}, torch::kFloat64);
    for (int64_t t = 0; t < T; ++t) {
      const auto cache = cache_of(t, S, W);
      const double query_slot = double(std::min(t, W - 1));
      const auto keys = index_tensor(cache);
      for (int64_t h = 0; h < H; ++h) {
        const auto q = qkv[0].select(1, h).select(1, t);                   // (B, Dh)
        const auto k = qkv[1].select(1, h).index_select(1, keys);         // (B, C, Dh)
        const auto v = qkv[2].select(1, h).index_select(1, keys);
        std::vector<torch::Tensor> scores;
        for (size_t c = 0; c < cache.size(); ++c) {
          const double key_slot = double(c);  // slot order: sinks first, then the recent keys
          torch::Tensor s;
          if (name == "rotary") {
            s = (rotated(q, query_slot) * rotated(k.select(1, int64_t(c)), key_slot)).sum(-1) / std::sqrt(double(Dh));
          } else {
            s = (q * k.select(1, int64_t(c))).sum(-1) / std::sqrt(double(Dh)) - slopes[size_t(h)] * (query_slot - key_slot);
          }
          scores.push_back(s);
        }
        const auto p = torch::softmax(torch::stack(scores, 1), 1);  // (B, C)
        context_rows.select(1, h).select(1, t).copy_(torch::matmul(p.unsqueeze(1), v).squeeze(1));
      }
    }
    const auto expected = torch::linear(context_rows.transpose(1, 2).reshape({2, T, D}),
                                        attention->out->weight.to(torch::kFloat64),
                                        attention->out->bias.to(torch::kFloat64));
    CHECK((actual.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-5);
    // A plain pass differs past W (sinks farther, evicted keys seen).
    CHECK_FALSE(torch::allclose(attention->forward(x, *method, TokenPositions::window(T), options), actual, 1e-4, 1e-4));
  }
}

TEST_CASE("StreamingLLM equals the definition layer by layer for every causal method, the plain pass "
          "where nothing is evicted",
          "[streaming]") {
  const int64_t T = 40, S = 3, W = 11;
  // Every causal method, and the attention options on two of them (a sink, SSMax's per-row
  // scale, the temperature by slot, a gate, a window), each window's last query alone attending.
  std::vector<std::pair<std::string, TransformerLM>> models;
  for (const auto& name : testing::causal_methods()) models.emplace_back(name, perturbed_model(name));
  for (const std::string method : {"alibi", "rotary"}) {
    Config config = testing::tiny_config(method);
    config.model.attention_options.sink = true;
    config.model.attention_options.ssmax = true;
    config.model.attention_options.temperature = 0.5;
    config.model.attention_options.temperature_floor = 4;
    config.model.attention_options.window = method == "rotary" ? 7 : 0;  // alibi's queries see the sinks
    config.model.attention_options.gate = AttentionGate::headwise;
    torch::manual_seed(22);
    auto model = build_model(config, 257);
    model->eval();
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    models.emplace_back(method + " + sink, ssmax, temperature, gate" + (method == "rotary" ? ", window 7" : ""), model);
  }
  // Each architecture (grouped-query attention's windows gather the key heads alone).
  for (const auto& arch : testing::architectures()) {
    Config config = testing::tiny_config("alibi");
    arch.apply(config);
    torch::manual_seed(23);
    auto model = build_model(config, 257);
    model->eval();
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    models.emplace_back(std::string("architecture ") + arch.name, model);
  }
  for (auto& [name, model] : models) {
    INFO(name);
    torch::NoGradGuard no_grad;
    torch::manual_seed(6);
    const auto tokens = torch::randint(0, 256, {2, T}, torch::kLong);
    const auto plain = model->forward(tokens);
    model->set_streaming({S, W});
    const auto streamed = model->forward(tokens);
    const auto expected = streaming_by_definition(model, tokens, S, W);
    INFO("max |difference| " << (streamed - expected).abs().max().item<double>());
    REQUIRE(torch::allclose(streamed, expected, 1e-5, 1e-5));
    // Until the cache is full nothing is evicted and every slot is the token's position.
    CHECK(torch::allclose(streamed.narrow(1, 0, W), plain.narrow(1, 0, W), 1e-5, 1e-5));
    CHECK_FALSE(torch::allclose(streamed, plain, 1e-4, 1e-4));
    // A cache that holds the whole stream is the plain pass.
    model->set_streaming({S, T});
    CHECK(torch::allclose(model->forward(tokens), plain, 1e-5, 1e-5));
    model->set_streaming({});
    CHECK(torch::equal(model->forward(tokens), plain));
  }
}

TEST_CASE("StreamingLLM in the evaluator: the plain evaluation while the cache holds the window, "
          "recorded in the result, refusals in one line",
          "[streaming][eval]") {
  const Corpus corpus = testing::tiny_byte_corpus();
  auto model = perturbed_model("alibi");
  EvalSpec spec;
  spec.length = 48;
  spec.max_tokens = 600;
  const EvalResult plain = evaluate(model, corpus, corpus.valid, spec);
  spec.streaming = {4, 48};
  const EvalResult whole = evaluate(model, corpus, corpus.valid, spec);
  CHECK(whole.nll_sum == Approx(plain.nll_sum).epsilon(1e-9));
  CHECK(whole.streaming.cache == 48);
  spec.streaming = {4, 12};
  const EvalResult streamed = evaluate(model, corpus, corpus.valid, spec);
  CHECK(streamed.scored_tokens == plain.scored_tokens);
  CHECK(std::isfinite(streamed.nll_sum));
  CHECK(streamed.nll_sum != Approx(plain.nll_sum).epsilon(1e-6));
  CHECK(streamed.streaming.sinks == 4);
  CHECK_FALSE(model->streaming().active());  // the scope restores the model

  // By the definition: the NLL of every target from the definition's logits.
  {
    torch::NoGradGuard no_grad;
    double nll = 0;
    int64_t scored = 0;
    for (int64_t begin = 0; begin + 1 < 600; begin += 48) {
      const int64_t size = std::min<int64_t>(48, 600 - 1 - begin);
      const auto inputs = corpus.valid.slice(begin, size).to(torch::kLong).unsqueeze(0);
      const auto targets = corpus.valid.slice(begin + 1, size).to(torch::kLong);
      const auto logits = streaming_by_definition(model, inputs, 4, 12).squeeze(0).to(torch::kFloat64);
      nll += -torch::log_softmax(logits, -1).gather(1, targets.unsqueeze(1)).sum().item<double>();
      scored += size;
    }
    CHECK(scored == streamed.scored_tokens);
    CHECK(streamed.nll_sum == Approx(nll).epsilon(1e-6));
  }

  // Refusals.
  spec.streaming = {4, 12};
  spec.stride = 8;
  REQUIRE_THROWS_WITH(evaluate(model, corpus, corpus.valid, spec), Catch::Contains("sliding stride (8)"));
  spec.stride = 0;
  spec.rope_scaling.kind = RopeScalingKind::linear;
  spec.rope_scaling.factor = 2;
  REQUIRE_THROWS_WITH(evaluate(model, corpus, corpus.valid, spec), Catch::Contains("RoPE scaling (linear)"));
  spec.rope_scaling = RopeScaling{};
  spec.streaming = {12, 12};
  REQUIRE_THROWS_WITH(evaluate(model, corpus, corpus.valid, spec), Catch::Contains("12 sinks in a cache of 12"));
  Config masked = testing::tiny_config("sinusoidal");
  masked.model.objective = Objective::masked_lm;
  auto bidirectional = build_model(masked, 257);
  spec.streaming = {4, 12};
  REQUIRE_THROWS_WITH(evaluate(bidirectional, corpus, corpus.valid, spec), Catch::Contains("needs a causal model"));
  // A cache past a learned table's positions: the table's own refusal, not an indexing error.
  Config learned = testing::tiny_config("learned");
  learned.position = YAML::Load("{name: learned, max_length: 10}");
  auto table = build_model(learned, 257);
  spec.streaming = {4, 12};
  REQUIRE_THROWS_WITH(evaluate(table, corpus, corpus.valid, spec),
                      Catch::Contains("asked for positions up to 12 but max_length is 10"));
}

TEST_CASE("extrap eval --streaming: rows with their cache, refusals in one line", "[streaming][cli]") {
  using namespace extrap::testing;
  SweepDir d;
  write_text(d.root / "train.yaml",
             "data: {path: corpus, tokenizer: byte, cache_dir: cache}\n"
             "model: {layers: 1, d_model: 32, heads: 2, d_ffn: 64, dropout: 0.0}\n"
             "position: alibi\n"
             "train: {seq_len: 16, batch_tokens: 256, steps: 20, lr: 0.003, warmup: 2, validate_every: 0,\n"
             "        validate_tokens: 0, checkpoint_every: 0, log_every: 10, threads: 1, out_dir: runs/a}\n"
             "eval: {lengths: [16], max_tokens: 512}\n");
  std::string out;
  REQUIRE(run_cli(d, {"train", "--config", "train.yaml"}, &out) == 0);
  REQUIRE(run_cli(d, {"eval", "--checkpoint", "runs/a", "--length", "64", "--max-tokens", "400",
                      "--streaming", "16", "--sinks", "2", "--json", "s.json"},
                  &out) == 0);
  CHECK_THAT(out, Catch::Contains("a cache of 16 tokens, the first 2 of them sinks"));
  const auto document = nlohmann::json::parse(read_text(d.root / "s.json"));
  CHECK(document["streaming"]["cache"] == 16);
  REQUIRE(document["results"].size() == 1);
  const auto& row = document["results"][0];
  CHECK(row["status"] == "ok");
  CHECK(row["streaming"]["sinks"] == 2);
  auto a = load_cli_run(d, "runs/a");
  EvalSpec spec;
  spec.length = 64;
  spec.max_tokens = 400;
  spec.streaming = {2, 16};
  CHECK(row["nll_sum"].get<double>() == Approx(evaluate(a.run.model, a.corpus, a.corpus.valid, spec).nll_sum).epsilon(1e-9));
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"eval", "--checkpoint", "runs/a", "--length", "64", "--sinks", "2"}, "add --streaming W"},
           {{"eval", "--checkpoint", "runs/a", "--length", "64", "--streaming", "0"}, "--streaming 0"},
           {{"eval", "--checkpoint", "runs/a", "--length", "64", "--streaming", "8", "--sinks", "8"},
            "--sinks 8: must be at least 0 and fewer than the cache"},
           {{"eval", "--checkpoint", "runs/a", "--length", "64", "--streaming", "8", "--stride", "4"},
            "--stride is not taken with --streaming"},
           {{"eval", "--checkpoint", "runs/a", "--length", "64", "--streaming", "8", "--longppl"},
            "not with --retrieval or --longppl"}}) {
    CHECK(run_cli(d, args, &out) == 2);
    require_one_line_error(out, expected);
  }
}
