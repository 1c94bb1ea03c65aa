// Building one position method on its own, outside a model, for the position-method tests.
#pragma once

#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "core/model/model.h"
#include "positions/position.h"
#include "tests/support/test_support.h"

#include <memory>
#include <string>

namespace extrap::testing {

// The example plugin (plugins/local_window.cpp), built beside the tests.
inline const std::string kPlugin = EXTRAP_BINARY_DIR "/plugins/libextrap_local_window.so";

// `name` with its YAML options, for `heads` heads of size d_head in a model of `layers` layers.
inline std::shared_ptr<PositionMethod> make_method(const std::string& name, int64_t heads,
                                                   bool causal, const std::string& yaml = "{}",
                                                   int64_t d_head = 8, int64_t layers = 2) {
  PositionContext context;
  context.num_layers = layers;
  context.num_heads = heads;
  context.d_head = d_head;
  context.d_model = heads * d_head;
  context.causal = causal;
  return PositionRegistry::instance().create(name, context,
                                             OptionReader(YAML::Load(yaml), "test options"));
}

// What loading a config file with `position: POSITION` and train.seq_len 64 (then the YAML
// lines `extra`) and building its model says: the ConfigError's message, or "(accepted)".
inline std::string position_refusal(const std::string& position, const std::string& extra = "") {
  TempDir dir("refusal");
  write_text(dir.root / "c.yaml", "position: " + position + "\ntrain: {seq_len: 64}\n" + extra);
  try {
    Config c = load_config((dir.root / "c.yaml").string(), {});
    build_model(c, 257);
  } catch (const ConfigError& e) {
    return std::string(e.what());
  }
  return std::string("(accepted)");
}

// A tiny rotary model with `position` (sampled training positions) draws new positions at each
// training forward pass, and evaluates exactly as the same weights without the option; in
// training (dropout 0) the plain model differs from the draws. Returns the model.
inline TransformerLM check_samples_in_training_only(const std::string& position) {
  Config config = tiny_config("rotary");
  config.position = YAML::Load(position);
  torch::manual_seed(7);
  auto model = build_model(config, 257);
  const auto tokens = torch::randint(0, 256, {2, 16}, torch::kLong);
  torch::NoGradGuard no_grad;
  model->train();
  const auto a = model->forward(tokens), b = model->forward(tokens);
  model->eval();
  const auto c = model->forward(tokens), e = model->forward(tokens);
  CHECK_FALSE(torch::allclose(a, b));  // two draws of positions
  CHECK(torch::equal(c, e));           // evaluation: positions 0..T-1
  Config plain = config;
  plain.position = YAML::Load("{name: rotary}");
  torch::manual_seed(7);
  auto twin = build_model(plain, 257);
  twin->eval();
  CHECK(torch::equal(twin->forward(tokens), c));
  twin->train();
  CHECK_FALSE(torch::allclose(twin->forward(tokens), a));
  return model;
}

// The method's parameter `name` (the test fails if it has none of that name).
inline torch::Tensor parameter(const PositionMethod& method, const std::string& name) {
  auto* found = method.named_parameters().find(name);
  REQUIRE(found != nullptr);
  return *found;
}

// A random loss through the reference attention with the method's rotation and bias of layer
// `layer`, back-propagated into its parameters. Inputs (2, heads, t, d_head), a random layer
// input (2, t, heads * d_head), all from seed 3.
inline void backward_through_attention(PositionMethod& method, int64_t heads, int64_t d_head,
                                       int64_t t, bool causal, int64_t layer = 0) {
  AttentionOptions options;
  options.causal = causal;
  torch::manual_seed(3);
  auto q = torch::randn({2, heads, t, d_head}), k = torch::randn({2, heads, t, d_head});
  const auto v = torch::randn({2, heads, t, d_head}), target = torch::randn({2, heads, t, d_head});
  LayerInput at = layer_window(layer, t);
  at.input = torch::randn({2, t, heads * d_head});
  method.rotate_qk(q, k, at);
  auto out = attention_reference(q, k, v, method.bias(at), options);
  (out * target).sum().backward();
}

}  // namespace extrap::testing
