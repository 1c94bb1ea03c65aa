// Every registered position method (the built-ins and the example plugin) in every mode it
// supports, inside a whole model, GPT-2's block and a Llama-style one (RMSNorm, SwiGLU, no biases,
// grouped-query attention, qk_norm, the half rotary pairing): a few training steps lower the
// loss; a causal model never sees the future and a bidirectional one does; the memory-efficient
// attention path equals the reference over windows several tiles long.
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "positions/position.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <string>
#include <vector>

using namespace extrap;
using torch::indexing::Slice;

namespace {

struct MethodMode {
  std::string name;
  bool causal;
  bool modern = false;  // the Llama-style block (modern_block) instead of GPT-2's
  std::string label() const {
    return name + (causal ? " (causal)" : " (bidirectional)") + (modern ? " on a Llama-style block" : "");
  }
};

// Every (method, mode) the registry offers, the example plugin loaded.
std::vector<MethodMode> every_method_and_mode() {
  auto& registry = PositionRegistry::instance();
  registry.load_plugin(EXTRAP_BINARY_DIR "/plugins/libextrap_local_window.so");
  std::vector<MethodMode> all;
  for (const auto& name : registry.names()) {
    const PositionInfo& info = registry.get(name);
    if (info.modes & kCausal) all.push_back({name, true});
    if (info.modes & kBidirectional) all.push_back({name, false});
  }
  return all;
}

// Each (method, mode) once more on a Llama-style block.
std::vector<MethodMode> on_both_blocks(std::vector<MethodMode> all) {
  const size_t n = all.size();
  for (size_t i = 0; i < n; ++i) all.push_back({all[i].name, all[i].causal, true});
  return all;
}

// RMSNorm, SwiGLU by Llama's width, no biases, 2 key heads for 4 query heads, a norm of q and k,
// and the rotary methods' half pairing.
void modern_block(Config& config) {
  ModelConfig& m = config.model;
  m.norm = NormKind::rmsnorm;
  m.ffn = FfnKind::swiglu;
  m.d_ffn = 0;
  m.ffn_multiple = 16;
  m.bias = false;
  m.kv_heads = 2;
  m.qk_norm = true;
  for (const char* rotating : {"rotary", "xpos", "p_rope"})
    if (config.position_name == rotating) config.position["pairing"] = "half";
}

Config config_for(const MethodMode& m) {
  Config config = testing::tiny_config(m.name);
  config.position = YAML::Node(YAML::NodeType::Map);
  config.position["name"] = m.name;
  if (m.name == "learned") config.position["max_length"] = 2048;
  if (!m.causal) config.model.objective = Objective::masked_lm;
  if (m.modern) modern_block(config);
  return config;
}

// The model in eval mode. Its position parameters are moved away from their initial values
// (CoPE's embeddings start at zero, which would hide its bias from the comparisons below).
TransformerLM model_for(const MethodMode& m) {
  torch::manual_seed(11);
  auto model = build_model(config_for(m), 257);
  model->eval();
  torch::NoGradGuard no_grad;
  for (auto& p : model->position().parameters()) p.add_(torch::randn_like(p) * 0.1);
  return model;
}

}  // namespace

TEST_CASE("every method and mode: the registry offers each built-in in the modes README lists",
          "[methods]") {
  const auto all = every_method_and_mode();
  std::vector<std::string> labels;
  for (const auto& m : all) labels.push_back(m.label());
  for (const char* expected :
       {"none (causal)", "none (bidirectional)", "sinusoidal (causal)", "learned (causal)",
        "rotary (causal)", "rotary (bidirectional)", "p_rope (causal)", "p_rope (bidirectional)",
        "t5_bias (causal)", "t5_bias (bidirectional)",
        "alibi (causal)", "alibi_symmetric (bidirectional)", "alibi_nonsymmetric (bidirectional)",
        "alibi_learned (causal)", "alibi_learned (bidirectional)", "kerple_log (causal)",
        "kerple_log (bidirectional)", "kerple_power (causal)", "kerple_power (bidirectional)",
        "sandwich (causal)", "sandwich (bidirectional)", "xpos (causal)", "fire (causal)",
        "fire (bidirectional)", "cope (causal)", "fox (causal)", "dape (causal)", "dape (bidirectional)", "stick_breaking (causal)", "path (causal)",
        "local_window (causal)",
        "local_window (bidirectional)"}) {
    INFO(expected);
    CHECK(std::count(labels.begin(), labels.end(), expected) == 1);
  }
}

TEST_CASE("every method and mode trains: a few steps lower the training loss", "[methods]") {
  const auto corpus = testing::tiny_byte_corpus();
  for (const auto& m : on_both_blocks(every_method_and_mode())) {
    INFO(m.label());
    testing::TempDir dir("every-method");
    const auto summary = testing::train_briefly(config_for(m), corpus, dir.root);
    REQUIRE(summary.train_curve.size() == 8);
    // Byte-level text starts near log(257) = 5.55 nats; 40 steps reach well under 80% of it.
    CHECK(summary.train_curve.back().loss < 0.8 * summary.train_curve.front().loss);
  }
}

TEST_CASE("every method and mode: causal models never see the future, bidirectional ones do",
          "[methods]") {
  torch::NoGradGuard no_grad;
  for (const auto& m : on_both_blocks(every_method_and_mode())) {
    INFO(m.label());
    auto model = model_for(m);
    torch::manual_seed(5);
    const auto tokens = torch::randint(0, 256, {2, 12}, torch::kLong);
    auto changed = tokens.clone();
    changed.index_put_({Slice(), 7}, (tokens.index({Slice(), 7}) + 1) % 256);
    const auto a = model->forward(tokens), b = model->forward(changed);
    const auto before_a = a.index({Slice(), Slice(0, 7)}), before_b = b.index({Slice(), Slice(0, 7)});
    if (m.causal) {
      CHECK(torch::equal(before_a, before_b));  // bit for bit: no path from token 7 backwards
    } else {
      // Every earlier position's output moves when token 7 changes.
      const auto moved = (before_a - before_b).abs().amax({0, 2});  // (7,)
      for (int64_t p = 0; p < 7; ++p) {
        INFO("position " << p);
        CHECK(moved[p].item<double>() > 1e-6);
      }
    }
    CHECK((a.index({Slice(), Slice(7)}) - b.index({Slice(), Slice(7)})).abs().max().item<double>() > 1e-6);
  }
}

TEST_CASE("every method and mode: the efficient attention path equals the reference across tiles",
          "[methods][efficient]") {
  // 1100 tokens: five 256-query tiles and three 512-key tiles, ragged at both ends.
  torch::NoGradGuard no_grad;
  torch::manual_seed(9);
  const auto tokens = torch::randint(0, 256, {1, 1100}, torch::kLong);
  for (const auto& m : on_both_blocks(every_method_and_mode())) {
    INFO(m.label());
    auto model = model_for(m);
    model->set_attention_backend(AttentionBackend::Reference);
    const auto reference = model->forward(tokens);
    model->set_attention_backend(AttentionBackend::Efficient);
    if (const std::string& reason = PositionRegistry::instance().get(m.name).reference_only; !reason.empty()) {
      CHECK_THROWS_WITH(model->forward(tokens), Catch::Contains("reference backend takes it"));
      model->set_attention_backend(AttentionBackend::Auto);  // long evaluation: Auto takes the reference path
      CHECK(torch::equal(model->forward(tokens), reference));
      continue;
    }
    const auto efficient = model->forward(tokens);
    const double scale = reference.abs().max().item<double>();
    CHECK((efficient - reference).abs().max().item<double>() < 1e-5 * scale);
  }
}
