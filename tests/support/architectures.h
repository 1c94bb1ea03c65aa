// The architectures the model tests build, one of each family's options (tiny: tests/support's
// tiny_config, d_model 32, 4 heads): tests/model/test_architectures.cpp on the CPU,
// tests/model/test_architectures_cuda.cpp on a GPU.
#pragma once

#include "core/model/config.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <vector>

namespace extrap::testing {

// A model config of each architecture, applied to tiny_config.
struct Architecture {
  const char* name;
  std::function<void(Config&)> apply;
};
inline std::vector<Architecture> architectures() {
  return {
      {"Llama: rmsnorm, swiglu by Llama's width, no biases, 2 key heads, rotary half pairs",
       [](Config& c) {
         c.model.norm = NormKind::rmsnorm;
         c.model.ffn = FfnKind::swiglu;
         c.model.d_ffn = 0;
         c.model.ffn_multiple = 16;
         c.model.bias = false;
         c.model.kv_heads = 2;
         c.model.tie_embeddings = false;
         c.position_name = "rotary";
         c.position = YAML::Load("{name: rotary, pairing: half}");
       }},
      {"GPT-NeoX: parallel block, rotary on a quarter of each head",
       [](Config& c) {
         c.model.block = BlockKind::parallel;
         c.position_name = "rotary";
         c.position = YAML::Load("{name: rotary, pairing: half, fraction: 0.25}");
       }},
      {"GPT-J/Falcon: one shared norm, geglu, multi-query attention, LayerNorms with biases beside linear layers "
       "without, alibi",
       [](Config& c) {
         c.model.block = BlockKind::parallel_shared;
         c.model.ffn = FfnKind::geglu;
         c.model.kv_heads = 1;
         c.model.bias = false;
         c.model.norm_bias = true;
       }},
      {"BLOOM: a norm after the embedding, alibi",
       [](Config& c) { c.model.embedding_norm = true; }},
      {"OLMo 2: norms after the sublayers, none before, q and k normed over the projection, 2 key heads, rmsnorm, "
       "xpos half pairs",
       [](Config& c) {
         c.model.sublayer_norms = SublayerNorms::output;
         c.model.qk_norm = true;
         c.model.qk_norm_over = QkNormOver::projection;
         c.model.kv_heads = 2;
         c.model.norm = NormKind::rmsnorm;
         c.model.norm_eps = 1e-6;
         c.position_name = "xpos";
         c.position = YAML::Load("{name: xpos, pairing: half}");
       }},
      {"OLMo: LayerNorms without parameters, q, k and v clipped at 0.5, swiglu, no biases, rotary half pairs",
       [](Config& c) {
         c.model.norm_affine = false;
         c.model.clip_qkv = 0.5;
         c.model.ffn = FfnKind::swiglu;
         c.model.bias = false;
         c.position_name = "rotary";
         c.position = YAML::Load("{name: rotary, pairing: half}");
       }},
      {"Gemma 2: norms before and after each sublayer, geglu with GELU's tanh form, rmsnorm, rotary half pairs, "
       "scores q.k / sqrt(6) soft-capped at 2, logits at 3",
       [](Config& c) {
         c.model.sublayer_norms = SublayerNorms::both;
         c.model.attention_options.softcap = 2;
         c.model.attention_options.scale_dim = 6;
         c.model.logit_softcap = 3;
         c.model.ffn = FfnKind::geglu;
         c.model.activation = Activation::gelu_tanh;
         c.model.norm = NormKind::rmsnorm;
         c.position_name = "rotary";
         c.position = YAML::Load("{name: rotary, pairing: half}");
       }},
      {"Qwen3-0.6B/Gemma: heads wider than d_model / heads (4 of 16 over d_model 32), 2 key heads, qk_norm, a "
       "gate per feature, rotary half pairs",
       [](Config& c) {
         c.model.head_dim = 16;
         c.model.kv_heads = 2;
         c.model.qk_norm = true;
         c.model.norm = NormKind::rmsnorm;
         c.model.attention_options.gate = AttentionGate::elementwise;
         c.position_name = "rotary";
         c.position = YAML::Load("{name: rotary, pairing: half}");
       }},
      {"heads narrower than d_model / heads, of a width no vector divides (3 of 6 over d_model 32, which 3 does not "
       "divide), alibi",
       [](Config& c) {
         c.model.heads = 3;
         c.model.head_dim = 6;
       }},
  };
}


}  // namespace extrap::testing
