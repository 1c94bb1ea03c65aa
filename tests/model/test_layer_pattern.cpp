// Layer patterns (the `layers` section): each layer its kind's position method and attention
// options, the pattern repeated over depth (iRoPE, SWAN, RNoPE-SWA).
#include "core/model/memory_estimate.h"
#include "core/model/model.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

using namespace extrap;

namespace {

// The tests' tiny model (testing::tiny_config's sizes) of `layers` layers, with `yaml` (a
// document with layers:, attention:, position:) over it.
Config pattern_config(const std::string& yaml, int64_t layers = 4, bool causal = true) {
  const std::string model = "model: {layers: " + std::to_string(layers) +
                            ", d_model: 32, heads: 4, d_ffn: 64, dropout: 0.0, objective: " +
                            (causal ? "causal_lm" : "masked_lm") + "}\ntrain: {seq_len: 16}\n";
  return config_from_yaml(YAML::Load(model + yaml), "p.yaml");
}

const char* kIRoPE =
    "position: rotary\n"
    "layers:\n"
    "  pattern: [local, local, global]\n"
    "  kinds:\n"
    "    local: {attention: {window: 5, sink: true}}\n"
    "    global: {position: {name: alibi_learned, shared_across_layers: false}, attention: {temperature: 0.5, temperature_floor: 4}}\n";

}  // namespace

TEST_CASE("layer pattern: each layer's kind, method, options and number among its kind, from the config",
          "[pattern][config]") {
  const Config c = config_from_yaml(
      YAML::Load("model: {layers: 8}\nposition: rotary\nattention: {sink: true, window: 3}\n"
                 "layers:\n  pattern: [local, local, local, global]\n"
                 "  kinds:\n    local: {attention: {window: 16}}\n"
                 "    global: {position: none, attention: {window: 0, sink: false, gate: headwise}}\n"),
      "p.yaml");
  const LayerPlan plan = layer_plan(c);
  REQUIRE(plan.patterned());
  REQUIRE(plan.kinds.size() == 2);
  CHECK(plan.layer_kind == std::vector<int64_t>{0, 0, 0, 1, 0, 0, 0, 1});
  CHECK(plan.layer_index == std::vector<int64_t>{0, 1, 2, 0, 3, 4, 5, 1});
  CHECK(plan.layers_of(0) == 6);
  CHECK(plan.layers_of(1) == 2);
  const LayerKind& local = plan.kinds[0];
  const LayerKind& global = plan.kinds[1];
  CHECK(local.name == "local");
  CHECK(local.position_name == "rotary");  // the position section's
  CHECK(local.attention.window == 16);     // its own
  CHECK(local.attention.sink);             // the attention section's
  CHECK(global.position_name == "none");
  CHECK(global.position_key == "layers.kinds.global.position");
  CHECK(global.attention.window == 0);
  CHECK(!global.attention.sink);
  CHECK(global.attention.gate == AttentionGate::headwise);
  CHECK(position_label(c) == "rotary (sink, window 16) x3, none (headwise gate)");

  // A pattern entry that is no kind is a position method with the attention section.
  const Config short_form = config_from_yaml(YAML::Load("model: {layers: 4}\nlayers: {pattern: [rotary, none]}"), "p.yaml");
  const LayerPlan plan2 = layer_plan(short_form);
  REQUIRE(plan2.kinds.size() == 2);
  CHECK(plan2.kinds[0].position_name == "rotary");
  CHECK(plan2.kinds[1].position_name == "none");
  CHECK(plan2.layer_kind == std::vector<int64_t>{0, 1, 0, 1});
  CHECK(plan2.layer_index == std::vector<int64_t>{0, 0, 1, 1});
  CHECK(position_label(short_form) == "rotary, none");
  CHECK(has_rotary_angles(short_form));
  CHECK(!has_rotary_angles(config_from_yaml(YAML::Load("layers: {pattern: [alibi, none]}"), "p.yaml")));

  // Without a pattern: one kind, every layer, numbered by depth; the identity of earlier runs.
  const Config plain = config_from_yaml(YAML::Load("model: {layers: 3}\nposition: t5_bias"), "p.yaml");
  const LayerPlan one = layer_plan(plain);
  CHECK(!one.patterned());
  CHECK(one.kinds.size() == 1);
  CHECK(one.layer_index == std::vector<int64_t>{0, 1, 2});
  CHECK(!plain.model_keys()["layers"]);
  CHECK(position_label(plain) == "t5_bias");
  // With one: part of the identity, and a written config reads back to the same plan.
  CHECK(c.model_keys()["layers"]["pattern"].size() == 4);
  CHECK(c.model_keys()["layers"]["kinds"]["local"]["attention"]["window"].as<int64_t>() == 16);
  const Config again = config_from_yaml(YAML::Load(YAML::Dump(c.to_yaml())), "again.yaml");
  CHECK(position_label(again) == position_label(c));
  CHECK(layer_plan(again).layer_index == plan.layer_index);
  CHECK(yaml_to_string(again.model_keys()) == yaml_to_string(c.model_keys()));
}

TEST_CASE("layer pattern: bad patterns and kinds are refused in one line naming the key", "[pattern][config]") {
  const auto refuses = [](const std::string& text, const std::string& key, const std::string& words) {
    INFO(text);
    const auto check = [&] {
      const Config c = config_from_yaml(YAML::Load(text), "p.yaml");
      check_position_method(c);
    };
    CHECK_THROWS_WITH(check(), Catch::Contains(key) && Catch::Contains(words) && !Catch::Contains("\n"));
  };
  refuses("model: {layers: 4}\nlayers: {pattern: [a, b, c]}", "layers.pattern", "multiple");
  refuses("layers: {pattern: [rotary, none], kinds: {unused: {position: alibi}}}", "layers.kinds.unused", "not used");
  refuses("layers: {kinds: {local: {position: alibi}}}", "layers.kinds", "pattern is empty");
  refuses("layers: {pattern: [local, none], kinds: {local: {window: 8}}}", "layers.kinds.local.window", "unknown key");
  refuses("layers: {pattern: [local, none], kinds: {local: {attention: {window: -2}}}}",
          "layers.kinds.local.attention.window", "must not be negative");
  refuses("layers: {pattern: [local, none], kinds: {local: {attention: {ssmax_init: 0.5}}}}",
          "layers.kinds.local.attention.ssmax_init", "ssmax is false");
  refuses("layers: {pattern: [local, none], kinds: {local: 3}}", "layers.kinds.local", "expected a map");
  refuses("layers: {pattern: [local, none], kinds: {local: {position: [rotary]}}}", "layers.kinds.local.position",
          "method name");
  refuses("layers: {pattern: [lokal, local], kinds: {local: {position: alibi}}}", "layers.pattern",
          "neither a kind");
  refuses("layers: {pattern: [a-b, none]}", "layers.pattern", "not a kind name");
  refuses("layers: {pattern: rotary}", "layers.pattern", "");
  refuses("layers: {pattern: [local, none], kinds: {local: {position: rotory}}}", "layers.kinds.local.position",
          "unknown position method 'rotory'");
  refuses("layers: {pattern: [local, none], kinds: {local: {position: {name: rotary, base: -1}}}}",
          "layers.kinds.local.position.base", "");
  refuses("layers: {pattern: [sinusoidal, none]}", "layers.pattern", "token embeddings");
  refuses("layers: {pattern: [a, none], kinds: {a: {position: learned}}}", "layers.kinds.a.position", "token embeddings");
  refuses("layers: {pattern: [local, none], kinds: {local: {position: {name: rotary, randomize_max: 400}}}}",
          "layers.kinds.local.position.randomize_max", "not supported with layers.pattern");
}

TEST_CASE("layer pattern: a position section that no layer takes is refused, the default one is not",
          "[pattern][config]") {
  const auto refuses = [](const std::string& text, const std::string& key) {
    INFO(text);
    CHECK_THROWS_WITH(config_from_yaml(YAML::Load(text), "p.yaml"),
                      Catch::Contains("p.yaml") && Catch::Contains(key) && Catch::Contains("no layer takes") &&
                          !Catch::Contains("\n"));
  };
  // Every kind names its own method: the section would be ignored.
  refuses("position: rotary\nlayers: {pattern: [alibi, none]}", "position.name");
  refuses("position: {name: rotary, base: 500000}\nlayers: {pattern: [rotary, none]}", "position.base");
  refuses("position: {name: rotary}\nlayers: {pattern: [alibi, none]}", "position.name");
  refuses("position: {name: alibi, randomize_max: 512}\nlayers: {pattern: [local], kinds: {local: {position: rotary}}}",
          "position.randomize_max");
  // --set and a sweep's grid reach the section the same way.
  CHECK_THROWS_WITH(pattern_config("layers: {pattern: [alibi]}\nposition: {name: learned}"),
                    Catch::Contains("'learned'"));
  // Taken by a kind, or the default (alibi, no options) with nothing to take it: accepted.
  const Config used = pattern_config(
      "position: {name: rotary, base: 500}\nlayers: {pattern: [local, none], kinds: {local: {attention: {window: 4}}}}", 2);
  CHECK(layer_plan(used).kinds[0].position["base"].as<double>() == 500);
  CHECK_NOTHROW(pattern_config("position: alibi\nlayers: {pattern: [rotary, none]}", 2));
  CHECK_NOTHROW(pattern_config("layers: {pattern: [rotary, none]}", 2));
  CHECK_NOTHROW(pattern_config("position: none\nlayers: {pattern: [rotary, none]}", 2));  // what a layer takes
  // The resolved config (a run directory's config.yaml) loads again.
  const Config named = pattern_config("layers: {pattern: [rotary, none]}", 2);
  CHECK_NOTHROW(config_from_yaml(named.to_yaml(), "config.yaml"));
}

TEST_CASE("layer pattern: the model runs each layer with its kind's method and options", "[pattern][model]") {
  const Config c = pattern_config(kIRoPE, 6);
  torch::manual_seed(3);
  auto model = build_model(c, 257);
  const LayerPlan& plan = model->plan();
  // One method per kind, built for its own layers: alibi_learned keeps one slope set per global layer.
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& p : model->named_parameters())
    if (p.key().rfind("position", 0) == 0) shapes[p.key()] = p.value().sizes().vec();
  REQUIRE(shapes.size() == 1);
  CHECK(shapes.begin()->first.rfind("position_global.", 0) == 0);
  CHECK(shapes.begin()->second.at(0) == 2);
  CHECK(plan.layer_index == std::vector<int64_t>{0, 1, 0, 2, 3, 1});

  // Recomputed layer by layer with methods built here, each given the layer's options by hand:
  // rotary with a window of 5 and a sink in local layers, the learned ALiBi slopes of the
  // layer's own set and Llama 4's temperature in global ones.
  torch::NoGradGuard no_grad;
  model->eval();
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
  PositionContext context = position_context(c.model);
  const OptionReader empty(YAML::Node(YAML::NodeType::Map), "test", "position");
  auto rotary = PositionRegistry::instance().create("rotary", context, empty);
  context.num_layers = 2;
  auto slopes = PositionRegistry::instance().create(
      "alibi_learned", context, OptionReader(YAML::Load("{shared_across_layers: false}"), "test", "position"));
  for (const auto& p : slopes->named_parameters())
    p.value().copy_(model->kind_position(1).named_parameters()[p.key()]);
  const int64_t T = 23;
  const auto tokens = torch::randint(0, 256, {2, T}, torch::kLong);
  const auto& parameters = model->named_parameters();
  // `local[l]`: layer l is a local one; `set[l]`: its number among its kind's.
  const auto by_hand = [&](const std::vector<bool>& local, const std::vector<int64_t>& set) {
    const auto embedding = parameters["embedding.weight"];
    auto x = embedding.index_select(0, tokens.reshape({-1})).view({2, T, -1}) * std::sqrt(double(c.model.d_model));
    AttentionOptions options;
    options.backend = AttentionBackend::Reference;
    for (int64_t l = 0; l < 6; ++l) {
      AttentionConfig extras;
      if (local[l]) {
        extras.window = 5;
        extras.sink = true;
      } else {
        extras.temperature = 0.5;
        extras.temperature_floor = 4;
      }
      Block block(BlockOptions(c.model).layer_index(set[l]).extras(extras));
      block->eval();
      const auto mine = block->named_parameters();
      const std::string prefix = "blocks." + std::to_string(l) + ".";
      for (const auto& p : mine)
        if (parameters.contains(prefix + p.key())) p.value().copy_(parameters[prefix + p.key()]);
      x = block->forward(x, local[l] ? *rotary : *slopes, TokenPositions::window(T), options);
    }
    return torch::layer_norm(x, {c.model.d_model}, parameters["ln_final.weight"], parameters["ln_final.bias"]);
  };
  model->set_attention_backend(AttentionBackend::Reference);
  const auto actual = model->hidden(tokens);
  const auto expected = by_hand({true, true, false, true, true, false}, {0, 1, 0, 2, 3, 1});
  INFO("max |difference| " << (actual - expected).abs().max().item<double>());
  CHECK(torch::allclose(actual, expected, 1e-5, 1e-5));
  // Each difference shows: the last global layer with the first one's slopes, or a local layer
  // taken for a global one (its sink left at zero), gives other numbers.
  CHECK(!torch::allclose(actual, by_hand({true, true, false, true, true, false}, {0, 1, 0, 2, 3, 0}), 1e-4, 1e-4));
  CHECK(!torch::allclose(actual, by_hand({true, true, false, true, false, false}, {0, 1, 0, 2, 0, 1}), 1e-4, 1e-4));
}

TEST_CASE("layer pattern: one kind over every layer is the plain model", "[pattern][model]") {
  for (const std::string method : {"alibi", "fox", "t5_bias"}) {
    INFO(method);
    const Config plain = pattern_config("position: " + method + "\nattention: {window: 6}\n", 2);
    const Config one = pattern_config("position: " + method + "\nattention: {window: 6}\nlayers: {pattern: [all], kinds: {all: {}}}\n", 2);
    torch::manual_seed(5);
    auto a = build_model(plain, 257);
    torch::manual_seed(5);
    auto b = build_model(one, 257);
    a->eval();
    b->eval();
    torch::NoGradGuard no_grad;
    const auto tokens = torch::randint(0, 256, {2, 30}, torch::kLong);
    CHECK(torch::equal(a->forward(tokens), b->forward(tokens)));
    CHECK(a->num_parameters() == b->num_parameters());
    CHECK(b->named_parameters().size() == a->named_parameters().size());
  }
}

TEST_CASE("layer pattern: causal, cached decoding equals one forward pass, the parameters counted",
          "[pattern][generate]") {
  const std::vector<std::pair<std::string, bool>> cases = {  // the pattern, and whether it keeps more activations
      {kIRoPE, true},
      {"position: none\nlayers: {pattern: [rope, none], kinds: {rope: {position: rotary, attention: {chunk: 7}}}}\n"
       "attention: {ssmax: true}\n", true},
      {"layers: {pattern: [fox, swa], kinds: {swa: {position: rotary, attention: {window: 4, gate: elementwise}}}}\n",
       false}};
  for (const auto& [yaml, more_activations] : cases) {
    INFO(yaml);
    const Config config = pattern_config(yaml, 6);
    torch::manual_seed(4);
    auto model = build_model(config, 257);
    const Config plain6 = pattern_config("position: none\n", 6);
    CHECK(model->num_parameters() - build_model(plain6, 257)->num_parameters() ==
          parameter_count_estimate(config, 257) - parameter_count_estimate(plain6, 257) +
              [&] {  // the methods' own parameters, which the estimate leaves out
                int64_t n = 0;
                for (int64_t k = 0; k < int64_t(model->plan().kinds.size()); ++k)
                  for (const auto& p : model->kind_position(k).parameters()) n += p.numel();
                return n;
              }());
    if (more_activations)
      CHECK(estimate_training_memory(config, 257).activations > estimate_training_memory(plain6, 257).activations);
    model->eval();
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
    testing::check_causal_and_cached(model);
  }
}

TEST_CASE("layer pattern: a few training steps lower the loss and each kind's parameters learn, causal and masked LM",
          "[pattern][train]") {
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    const Config config = pattern_config(
        "layers: {pattern: [local, global], kinds: {local: {position: rotary, attention: {window: 6, sink: true}}, "
        "global: {position: alibi_learned}}}\n",
        4, causal);
    torch::manual_seed(8);
    auto model = build_model(config, 257);
    model->train();
    torch::optim::AdamW optimiser(model->parameters(), torch::optim::AdamWOptions(3e-3));
    auto tokens = torch::arange(0, 33, torch::kLong).remainder(11).repeat({4, 1}) + torch::randint(0, 3, {4, 1});
    const auto loss_of = [&] {
      const auto logits = model->forward(tokens.narrow(1, 0, 32));
      return torch::cross_entropy_loss(logits.reshape({-1, 257}), tokens.narrow(1, 1, 32).reshape({-1}));
    };
    const double first = loss_of().item<double>();
    const auto slopes = model->kind_position(1).parameters().at(0).detach().clone();
    std::vector<torch::Tensor> sinks;
    for (const auto& p : model->named_parameters())
      if (p.key().find("sink") != std::string::npos) sinks.push_back(p.value().detach().clone());
    CHECK(sinks.size() == 2);  // the two local layers'
    for (int step = 0; step < 15; ++step) {
      optimiser.zero_grad();
      loss_of().backward();
      optimiser.step();
    }
    CHECK(loss_of().item<double>() < first - 0.5);
    CHECK(!torch::equal(model->kind_position(1).parameters().at(0), slopes));
    size_t index = 0;
    for (const auto& p : model->named_parameters())
      if (p.key().find("sink") != std::string::npos) CHECK(!torch::equal(p.value(), sinks[index++]));
  }
}

TEST_CASE("layer pattern: RoPE scaling scales the rotary layers and refuses a pattern without one",
          "[pattern][rope]") {
  const Config config = pattern_config("layers: {pattern: [rotary, none]}\n", 2);
  torch::manual_seed(6);
  auto model = build_model(config, 257);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 256, {1, 48}, torch::kLong);
  const auto trained = model->forward(tokens);
  RopeScaling yarn;
  yarn.kind = RopeScalingKind::yarn;
  yarn.factor = 4;
  yarn.original_length = 16;
  model->set_rope_scaling(yarn);
  CHECK(!torch::allclose(model->forward(tokens), trained));
  model->set_rope_scaling(RopeScaling{});
  CHECK(torch::equal(model->forward(tokens), trained));

  // Every rotary kind is scaled: two rotary kinds, scaled, are the plain rotary model scaled.
  torch::manual_seed(6);
  auto two = build_model(pattern_config("layers: {pattern: [a, b], kinds: {a: {position: rotary}, b: {position: rotary}}}\n", 2), 257);
  torch::manual_seed(6);
  auto plain = build_model(pattern_config("position: rotary\n", 2), 257);
  two->eval();
  plain->eval();
  two->set_rope_scaling(yarn);
  plain->set_rope_scaling(yarn);
  CHECK(torch::equal(two->forward(tokens), plain->forward(tokens)));

  auto flat = build_model(pattern_config("layers: {pattern: [alibi, none]}\n", 2), 257);
  CHECK_THROWS_WITH(flat->set_rope_scaling(yarn), Catch::Contains("position methods 'alibi, none' have no rotary angles"));
}
