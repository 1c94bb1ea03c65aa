#include "core/hub/hf_checkpoint.h"

#include "core/base/errors.h"
#include "core/base/files.h"
#include "core/base/float_range.h"
#include "core/base/hashing.h"
#include "positions/rotation.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

namespace extrap {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Keys that change no number of a forward pass in evaluation: identity, generation, training
// and serving settings, dropout (off in evaluation); auto_map, the remote code some Hub folders
// of a family transformers has natively also ship (Phi-3's, MPT's), which transformers runs only
// with trust_remote_code: extrap follows the native class.
const std::set<std::string>& neutral_keys() {
  static const std::set<std::string> keys = {
      "architectures", "model_type", "transformers_version", "dtype", "torch_dtype", "bos_token_id",
      "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id", "use_cache",
      "initializer_range", "output_attentions", "output_hidden_states", "return_dict", "_name_or_path",
      "id2label", "label2id", "problem_type", "tokenizer_class", "task_specific_params", "torchscript",
      "pruned_heads", "chunk_size_feed_forward", "finetuning_task", "prefix", "is_encoder_decoder",
      "_attn_implementation_autoset", "attn_implementation", "use_return_dict", "max_length",
      "attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout", "summary_type",
      "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
      "n_ctx", "reorder_and_upcast_attn", "masked_softmax_fusion", "slow_but_exact", "pretraining_tp",
      "tie_encoder_decoder", "is_decoder", "quantization_config_skip", "keys_to_ignore_at_inference", "auto_map",
      "cache_implementation"};
  return keys;
}

class ConfigReader {
 public:
  ConfigReader(const json& config, std::string where) : config_(config), where_(std::move(where)) {}

  bool has(const std::string& key) const { return config_.contains(key) && !config_.at(key).is_null(); }
  bool present(const std::string& key) const { return config_.contains(key); }  // null included
  const json& at(const std::string& key) const {
    used_.insert(key);
    if (!has(key)) fail(key, "is missing");
    return config_.at(key);
  }
  template <class T>
  T get(const std::string& key) const {
    const json& value = at(key);
    try {
      return value.get<T>();
    } catch (const json::exception&) {
      fail(key, value.dump() + " has the wrong type");
    }
    return T();
  }
  template <class T>
  T get(const std::string& key, T fallback) const {
    used_.insert(key);
    return has(key) ? get<T>(key) : fallback;
  }
  // A key this mapping implements at one value only (absent or null counts as `expected`).
  template <class T>
  void require(const std::string& key, const T& expected, const std::string& why) const {
    used_.insert(key);
    if (!has(key)) return;
    if (get<T>(key) != expected) fail(key, config_.at(key).dump() + " is not imported (" + why + ")");
  }
  void use(const std::string& key) const { used_.insert(key); }
  const std::string& where() const { return where_; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(where_ + ": " + key + " " + what);
  }
  // Refuses every key neither used nor neutral.
  void finish(const std::string& family) const {
    for (const auto& [key, value] : config_.items()) {
      if (used_.count(key) || neutral_keys().count(key)) continue;
      if (value.is_null()) continue;
      throw ConfigError(where_ + ": " + key + " " + value.dump() + " is not implemented by extrap's " + family +
                        " mapping; refusing rather than computing another model");
    }
  }

 private:
  const json& config_;
  std::string where_;
  mutable std::set<std::string> used_;
};

int64_t positive(const ConfigReader& c, const std::string& key) {
  const int64_t v = c.get<int64_t>(key);
  if (v < 1) c.fail(key, std::to_string(v) + " must be at least 1");
  return v;
}

// RoPE: rope_parameters (transformers 5) or rope_theta / rope_scaling (older files).
// A RoPE scaling of config.json (rope_parameters in transformers 5, rope_scaling before) as
// rotary's built-in scaling (positions/rotary.cpp), with transformers' defaults: yarn's beta_fast
// 32 and beta_slow 1 (0 meaning the default, as transformers' `or`), its attention factor 0.1 ln s
// + 1, longrope's factor max_position_embeddings / the original length and attention factor
// sqrt(1 + ln factor / ln original) where the config gives none. The original length (llama3,
// yarn, longrope) is a top-level original_max_position_embeddings where the config has one
// (transformers gives it priority: Phi-3 keeps it there, and Phi3Config's default, 4096, is
// `original_default`), else the scaling's own, else max_position_embeddings. Keys of another
// meaning (yarn's mscale or truncate false, an attention_factor of its own) are refused.
void read_rope_scaling(const ConfigReader& c, const std::string& where, const std::string& type, const json& p,
                       YAML::Node& position, int64_t original_default) {
  static const std::map<std::string, std::set<std::string>> kinds = {
      {"linear", {"factor"}},
      {"dynamic", {"factor", "original_max_position_embeddings"}},  // the latter unread, as transformers
      {"yarn", {"factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor",
                "truncate"}},
      {"llama3", {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}},
      {"longrope", {"factor", "original_max_position_embeddings", "short_factor", "long_factor", "attention_factor"}}};
  const auto kind = kinds.find(type);
  if (kind == kinds.end())
    c.fail(where, "rope_type \"" + type + "\" is not imported (linear, dynamic, yarn, llama3 and longrope are)");
  for (const auto& [key, value] : p.items()) {
    if (value.is_null() || key == "rope_type" || key == "type" || key == "rope_theta" ||
        key == "partial_rotary_factor" || kind->second.count(key))
      continue;
    c.fail(where + "." + key, value.dump() + " is not imported with rope_type " + type);
  }
  const auto number = [&](const std::string& key, double fallback) {
    if (!p.contains(key) || p.at(key).is_null()) return fallback;
    if (!p.at(key).is_number()) c.fail(where + "." + key, p.at(key).dump() + " is not a number");
    return p.at(key).get<double>();
  };
  const double max_positions = double(c.get<int64_t>("max_position_embeddings", 0));
  double length = 0;
  if (type != "linear") {
    // dynamic: transformers measures from max_position_embeddings (an original length is not read).
    length = type == "dynamic"                              ? max_positions
             : c.has("original_max_position_embeddings") ? double(positive(c, "original_max_position_embeddings"))
             : original_default > 0                       ? double(original_default)
                                                          : number("original_max_position_embeddings", max_positions);
    if (!(length >= 1)) c.fail(where + ".original_max_position_embeddings", "is needed by rope_type " + type);
    position["scaling_length"] = int64_t(length);
  }
  // longrope without a factor: max_position_embeddings over the original length, as transformers.
  const double factor = number("factor", type == "longrope" ? max_positions / length : 0);
  if (!(factor >= 1))
    c.fail(where + ".factor", (type == "longrope" ? number_text(factor) + " (max_position_embeddings / the original "
                                                                          "length where none is given) " : "") +
                                  "must be at least 1 for rope_type " + type);
  position["scaling"] = type;
  position["scaling_factor"] = factor;
  if (type == "longrope") {
    for (const char* key : {"short_factor", "long_factor"}) {
      if (!p.contains(key) || !p.at(key).is_array() || p.at(key).empty())
        c.fail(where + "." + key, "must be a list of numbers, one for each rotated pair, for rope_type longrope");
      for (const auto& f : p.at(key)) {
        if (!f.is_number() || !(f.get<double>() > 0) || !std::isfinite(f.get<double>()))
          c.fail(where + "." + key, "holds " + f.dump() + "; each factor must be a number above 0");
        position[key].push_back(f.get<double>());
      }
    }
    const double attention = number("attention_factor", 0);
    if (attention < 0) c.fail(where + ".attention_factor", number_text(attention) + " must be at least 0");
    if (attention > 0) position["attention_factor"] = attention;
  }
  if (type == "yarn") {
    const double fast = number("beta_fast", 0), slow = number("beta_slow", 0);
    position["beta_fast"] = fast != 0 ? fast : 32.0;
    position["beta_slow"] = slow != 0 ? slow : 1.0;
    if (p.contains("truncate") && !p.at("truncate").is_null() && p.at("truncate") != true)
      c.fail(where + ".truncate", p.at("truncate").dump() + " is not imported (yarn's ramp ends floored and ceiled)");
    const double attention = number("attention_factor", 0), expected = 0.1 * std::log(factor) + 1.0;
    if (attention != 0 && std::abs(attention - expected) > 1e-12 * expected)
      c.fail(where + ".attention_factor", std::to_string(attention) + " differs from 0.1 ln(factor) + 1 = " +
                                             std::to_string(expected) + ", the only one imported");
  }
  if (type == "llama3") {
    position["low_freq_factor"] = number("low_freq_factor", 1.0);
    position["high_freq_factor"] = number("high_freq_factor", 4.0);
  }
}

// How a family's config spells its RoPE, where it differs from Llama's.
struct RopeRules {
  double fraction = 1.0;                                // the rotated share where the config gives none
  std::string theta_key = "rope_theta";                 // older configs' base (GPT-NeoX: rotary_emb_base)
  std::string fraction_key = "partial_rotary_factor";   // and share (GPT-NeoX: rotary_pct)
  bool su_and_yarn_are_longrope = false;                // Phi-3's class reads rope_type su and yarn as longrope
  int64_t original_length = 0;  // a scaling's original length where config.json has no top-level one (Phi-3:
                                // 4096; 0: the scaling's own, else max_position_embeddings)
};

void read_rope(const ConfigReader& c, YAML::Node& position, int64_t head_dim, const RopeRules& rules = {}) {
  const std::string& theta_key = rules.theta_key;
  const std::string& fraction_key = rules.fraction_key;
  double fraction = rules.fraction;
  double theta = 10000.0;
  std::string where = "rope_parameters";
  json scaling = json::object();
  if (c.has("rope_parameters")) {
    scaling = c.at("rope_parameters");
    if (!scaling.is_object()) c.fail("rope_parameters", "must be an object");
    if (scaling.contains("rope_theta")) theta = scaling.at("rope_theta").get<double>();
    if (scaling.contains("partial_rotary_factor")) fraction = scaling.at("partial_rotary_factor").get<double>();
  } else {
    theta = c.get<double>(c.has(theta_key) ? theta_key : "rope_theta", 10000.0);
    c.use("rope_theta");
    c.use(theta_key);
    if (c.has("rope_scaling")) {
      scaling = c.at("rope_scaling");
      if (!scaling.is_object()) c.fail("rope_scaling", "must be an object");
      where = "rope_scaling";
    } else {
      c.use("rope_scaling");
    }
  }
  for (const std::string& key : {fraction_key, std::string("partial_rotary_factor")}) {
    if (c.has(key)) fraction = c.get<double>(key);
    c.use(key);
  }
  std::string type = scaling.value("rope_type", scaling.value("type", std::string("default")));
  if (rules.su_and_yarn_are_longrope && (type == "su" || type == "yarn")) type = "longrope";
  c.use("original_max_position_embeddings");  // read by llama3, yarn and longrope alone, as transformers
  if (type == "default") {
    for (const auto& [key, value] : scaling.items())
      if (!value.is_null() && key != "rope_type" && key != "type" && key != "rope_theta" && key != "partial_rotary_factor")
        c.fail(where + "." + key, value.dump() + " is not imported with rope_type default");
  } else {
    read_rope_scaling(c, where, type, scaling, position, rules.original_length);
  }
  if (!(theta > 1) || !std::isfinite(theta)) c.fail("rope_theta", std::to_string(theta) + " must be above 1");
  const int64_t rotated = rotated_dimensions(fraction, head_dim);
  if (!(fraction > 0 && fraction <= 1) || rotated < 2)
    c.fail(fraction_key, std::to_string(fraction) + " rotates no pair of the head's dimensions");
  for (const char* key : {"short_factor", "long_factor"})
    if (position[key] && int64_t(position[key].size()) * 2 != rotated)
      c.fail(where + "." + key, "has " + std::to_string(position[key].size()) + " factors for the " +
                                    std::to_string(rotated / 2) + " rotated pairs of each head");
  position["name"] = "rotary";
  position["base"] = theta;
  position["pairing"] = "half";
  if (fraction != 1.0) position["fraction"] = fraction;
}

// How a family's config.json names its sliding-window layers (Mistral's and Phi-3's window every
// layer: attention.window, read in map_llama).
enum class LayerWindows {
  none,
  qwen,    // Qwen2, Qwen3: with use_sliding_window, layer_types, or without it the layers from max_window_layers on
  gemma2,  // Gemma 2: layer_types, or without it the even layers (0, 2, ...)
  gemma3,  // Gemma 3: layer_types, or without it all but every sliding_window_pattern-th (6: five local, one global)
  olmo3    // OLMo 3: layer_types, or without it three of every four (each fourth layer is full)
};

// Qwen2's, Qwen3's and Gemma 2's sliding windows, as transformers reads them. Qwen: with
// use_sliding_window, the layers that layer_types names sliding_attention (a config without
// layer_types: those from max_window_layers on, 28 where it is absent) see the last sliding_window
// keys (4096 where it is absent; query i sees j with i - j < W, as Mistral's); without it, none
// does, whatever sliding_window says, and none where sliding_window is null and layer_types absent.
// Gemma 2: always on, layer_types' sliding_attention layers or, without it, Gemma2Config's default,
// the even layers; Gemma 3 likewise, its default every layer but each sliding_window_pattern-th
// (layers 5, 11, ... of the default 6 are full); OLMo 3's, every layer but each fourth (3, 7, ...).
// Every layer windowed is attention.window; some of them, a layer pattern of two kinds, `full` and
// `sliding`.
void map_layer_windows(const ConfigReader& c, HfModel& hf, LayerWindows rule) {
  const int64_t layers = hf.model["layers"].as<int64_t>();
  const bool null_window = c.present("sliding_window") && !c.has("sliding_window");
  const bool qwen = rule == LayerWindows::qwen;
  const bool on = !qwen || (c.get<bool>("use_sliding_window", false) && !(null_window && !c.has("layer_types")));
  std::vector<bool> sliding(size_t(layers), false);
  if (c.has("layer_types")) {
    const nlohmann::json& types = c.at("layer_types");
    if (!types.is_array() || int64_t(types.size()) != layers)
      c.fail("layer_types", "must list one of full_attention, sliding_attention for each of the " +
                                std::to_string(layers) + " layers");
    for (size_t l = 0; l < types.size(); ++l) {
      if (types[l] != "full_attention" && types[l] != "sliding_attention")
        c.fail("layer_types", "lists " + types[l].dump() + ": extrap imports full_attention and sliding_attention");
      sliding[l] = on && types[l] == "sliding_attention";
    }
  } else if (on && qwen) {
    const int64_t from = c.get<int64_t>("max_window_layers", 28);
    for (int64_t l = std::max<int64_t>(from, 0); l < layers; ++l) sliding[size_t(l)] = true;
  } else if (on && rule == LayerWindows::gemma2) {
    for (int64_t l = 0; l < layers; l += 2) sliding[size_t(l)] = true;
  } else if (on && rule == LayerWindows::olmo3) {
    for (int64_t l = 0; l < layers; ++l) sliding[size_t(l)] = (l + 1) % 4 != 0;
  } else if (on) {
    const int64_t period = c.has("sliding_window_pattern") ? positive(c, "sliding_window_pattern") : 6;
    for (int64_t l = 0; l < layers; ++l) sliding[size_t(l)] = (l + 1) % period != 0;
  }
  if (rule == LayerWindows::gemma3) {
    c.use("sliding_window_pattern");
    c.use("_sliding_window_pattern");  // the class's private copy to_dict() writes; its loading reads the other
  }
  c.use("layer_types");
  if (qwen) {
    c.use("max_window_layers");
    c.use("use_sliding_window");
  }
  const int64_t windowed = std::count(sliding.begin(), sliding.end(), true);
  if (windowed == 0) {
    c.use("sliding_window");  // unused: no layer slides
    return;
  }
  if (null_window)
    c.fail("sliding_window", "is null while some layers slide (" +
                                 std::string(c.has("layer_types")            ? "layer_types names sliding_attention layers"
                                             : rule == LayerWindows::gemma2 ? "Gemma2Config's default: the even layers"
                                             : rule == LayerWindows::olmo3  ? "Olmo3Config's default: 3 of every 4 layers"
                                                                            : "Gemma3TextConfig's default") +
                                 "): transformers' mask is undefined");
  const int64_t window = c.has("sliding_window") ? positive(c, "sliding_window") : 4096;
  if (windowed == layers) {
    hf.attention["window"] = window;
    return;
  }
  YAML::Node layers_section(YAML::NodeType::Map);
  for (const bool s : sliding) layers_section["pattern"].push_back(s ? "sliding" : "full");
  layers_section["kinds"]["full"] = YAML::Node(YAML::NodeType::Map);
  layers_section["kinds"]["sliding"]["attention"]["window"] = window;
  hf.layers = layers_section;
}

// A family with a RoPE for each kind of layer (Gemma 3, OLMo 3): where config.json's older keys put
// each kind's base, and the bases where they are absent.
struct KindRopes {
  bool on = false;
  double full_theta = 0;                     // the global (full_attention) layers' base: rope_theta
  const char* sliding_theta_key = nullptr;   // the local layers' own key (nullptr: none, see read_kind_ropes)
  double sliding_theta = 0;                  // their base where neither gives one
};

// How a family of Llama's kin stores its tensors.
enum class LlamaLayout {
  separate,  // Llama, Mistral, Qwen2, Qwen3
  fused,     // Phi-3: q, k and v in one projection (qkv_proj: H query heads, then Hkv key, then Hkv
             // value heads, extrap's own layout), gate and up in one (gate_up_proj: the gate's rows
             // first, as extrap's ffn_in)
  gemma,     // Llama's names, each norm's weight stored minus 1 (plus_one)
  gemma2,    // Gemma's, with norms before and after each sublayer (input_layernorm, post_attention_layernorm,
             // pre_feedforward_layernorm, post_feedforward_layernorm)
  olmo2,     // norms after the sublayers (post_attention_layernorm, post_feedforward_layernorm),
             // none before; q_norm and k_norm over the projections
};

// Gemma 2's and 3's soft caps (attn_logit_softcapping, final_logit_softcapping) and score scale
// (query_pre_attn_scalar): the caps where config.json has no key (0: off), and whether the class
// drops the scores' cap (transformers 5.24's Gemma 3 stores it and passes it to nothing).
struct GemmaCaps {
  bool on = false;
  double scores = 0, logits = 0;
  bool scores_dropped = false;
};

// What each of Llama's kin (modeling_*.py and configuration_*.py, transformers 5.24) reads or
// defaults differently from Llama: one entry per family, read by map_llama.
struct LlamaKin {
  std::string title;                          // its name in messages
  int64_t head_dim = 0;                       // the heads' width where config.json gives none (0: hidden_size / heads)
  double rms_norm_eps = 1e-6;                 // the class's default
  bool tied = false;                          // tie_word_embeddings' default
  std::string activation_key = "hidden_act";  // ACT2FN[this] on the gate
  std::string activation = "silu";            // its default
  bool gelu_is_tanh = false;                  // "gelu" read as gelu_pytorch_tanh (GemmaConfig)
  bool gemma = false;                         // norms of 1 + w; the embedding times sqrt(hidden_size) on input
  bool llama_keys = true;                     // reads mlp_bias and pretraining_tp (refused other than plain)
  bool qkv_bias = false;                      // q, k and v projections with biases (Qwen2)
  bool qk_norm = false;                       // an RMSNorm of q and k before the rotation (Qwen3: each head's)
  bool qk_norm_over_projection = false;       // ... over the whole projection (OLMo 2 and 3)
  std::string sublayer_norms = "input";       // where the block's norms are (OLMo 2 and 3: output; Gemma 2 and 3: both)
  bool plain_layernorm = false;               // LayerNorms without parameters, epsilon 1e-5 (OlmoLayerNorm)
  bool clip_qkv = false;                      // reads clip_qkv: q, k and v clamped after the projections (OLMo)
  GemmaCaps caps;                             // Gemma 2's and 3's caps and score scale (map_gemma2)
  bool every_layer_window = false;            // sliding_window in every layer (Mistral, Phi-3)
  LayerWindows layer_windows = LayerWindows::none;
  RopeRules rope;
  bool partial_rotary = false;                // the class rotates partial_rotary_factor of each head (Phi-3)
  KindRopes kind_ropes;                       // a RoPE for each kind of layer (read_kind_ropes)
  LlamaLayout layout = LlamaLayout::separate;  // how its folder stores the tensors
};

const std::map<std::string, LlamaKin>& llama_kin_table() {
  static const std::map<std::string, LlamaKin> kin = [] {
    std::map<std::string, LlamaKin> k;
    k["llama"].title = "Llama";
    k["mistral"].title = "Mistral";
    k["mistral"].every_layer_window = true;
    k["qwen2"].title = "Qwen2";
    k["qwen2"].qkv_bias = true;
    k["qwen2"].layer_windows = LayerWindows::qwen;
    LlamaKin& qwen3 = k["qwen3"];
    qwen3.title = "Qwen3";
    qwen3.head_dim = 128;
    qwen3.qk_norm = true;
    qwen3.layer_windows = LayerWindows::qwen;
    LlamaKin& phi3 = k["phi3"];
    phi3.title = "Phi-3";
    phi3.every_layer_window = true;
    phi3.rope.su_and_yarn_are_longrope = true;  // Phi3Config's readings
    phi3.rope.original_length = 4096;
    phi3.partial_rotary = true;
    phi3.layout = LlamaLayout::fused;
    LlamaKin& gemma = k["gemma"];
    gemma.title = "Gemma";
    gemma.head_dim = 256;
    gemma.tied = true;
    gemma.activation = "gelu_pytorch_tanh";
    gemma.gelu_is_tanh = true;
    gemma.gemma = true;
    gemma.llama_keys = false;
    gemma.layout = LlamaLayout::gemma;
    LlamaKin& gemma2 = k["gemma2"] = gemma;  // and the norms around the sublayers, the softcaps, windows
    gemma2.title = "Gemma 2";
    gemma2.activation_key = "hidden_activation";
    gemma2.gelu_is_tanh = false;
    gemma2.sublayer_norms = "both";
    gemma2.caps = {true, 50.0, 30.0, false};
    gemma2.layout = LlamaLayout::gemma2;
    gemma2.layer_windows = LayerWindows::gemma2;
    LlamaKin& gemma3 = k["gemma3_text"] = gemma2;  // and q and k normed, a RoPE for each kind of layer
    gemma3.title = "Gemma 3";
    gemma3.qk_norm = true;
    gemma3.layer_windows = LayerWindows::gemma3;
    gemma3.caps = {true, 0.0, 0.0, true};
    gemma3.kind_ropes = {true, 1e6, "rope_local_base_freq", 1e4};
    k["gemma3"] = gemma3;  // Gemma 3 4B and up: the same text model, under language_model beside a vision tower
    LlamaKin& olmo = k["olmo"];
    olmo.title = "OLMo";
    olmo.llama_keys = false;
    olmo.plain_layernorm = true;
    olmo.clip_qkv = true;
    LlamaKin& olmo2 = k["olmo2"];
    olmo2.title = "OLMo 2";
    olmo2.rms_norm_eps = 1e-5;
    olmo2.llama_keys = false;
    olmo2.qk_norm = true;
    olmo2.qk_norm_over_projection = true;
    olmo2.sublayer_norms = "output";
    olmo2.layout = LlamaLayout::olmo2;
    LlamaKin& olmo3 = k["olmo3"] = olmo2;  // and windows, a RoPE for each kind of layer
    olmo3.title = "OLMo 3";
    olmo3.layer_windows = LayerWindows::olmo3;
    olmo3.kind_ropes = {true, 5e5, nullptr, 5e5};
    return k;
  }();
  return kin;
}

const LlamaKin& llama_kin(const std::string& family) { return llama_kin_table().at(family); }

// The gated MLP, ACT2FN[activation_key] on the gate (LlamaMLP and its copies): SiLU is SwiGLU,
// GELU (erf) and its tanh forms GeGLU. Gemma's default is the tanh form, and GemmaConfig reads
// "gelu" as it too (the Hub's Gemma configs say "gelu" and mean it); Gemma 2 reads
// hidden_activation (its configs' hidden_act, read by nothing, beside it).
void read_gated_activation(const ConfigReader& c, const LlamaKin& kin, HfModel& hf) {
  const std::string& key = kin.activation_key;
  std::string act = c.get<std::string>(key, kin.activation);
  if (kin.gelu_is_tanh && act == "gelu") act = "gelu_pytorch_tanh";
  if (act == "silu") {
    hf.model["ffn"] = "swiglu";
    return;
  }
  if (act != "gelu" && act != "gelu_pytorch_tanh" && act != "gelu_new")
    c.fail(key, "\"" + act + "\" is not imported (silu, gelu, gelu_pytorch_tanh, gelu_new are)");
  hf.model["ffn"] = "geglu";
  if (act != "gelu") hf.model["activation"] = "gelu_tanh";
}

// Gemma 2's and 3's own (modeling_gemma2.py, modeling_gemma3.py): the attention's scores
// q.k / sqrt(query_pre_attn_scalar) capped as C tanh(s / C) (attn_logit_softcapping), the output
// logits capped likewise (final_logit_softcapping); null turns either cap off, and absence gives
// the class's default (GemmaCaps). A config capping the scores of a class that drops the cap is
// refused, since transformers computes it uncapped.
void map_gemma2(const ConfigReader& c, const LlamaKin& kin, HfModel& hf) {
  if (kin.caps.scores_dropped && c.has("attn_logit_softcapping"))
    c.fail("attn_logit_softcapping", c.at("attn_logit_softcapping").dump() + " is not imported: transformers 5.24's " +
           kin.title + " stores it and caps nothing with it; refusing rather than computing another model");
  const auto cap = [&](const char* key, double fallback) {
    c.use(key);
    if (c.present(key) && !c.has(key)) return 0.0;  // null: off
    if (!c.has(key)) return fallback;
    const double v = c.get<double>(key, fallback);
    if (!(v > 0) || !std::isfinite(v)) c.fail(key, number_text(v) + " must be a finite number above 0, or null");
    return v;
  };
  if (const double a = cap("attn_logit_softcapping", kin.caps.scores); a > 0) hf.attention["softcap"] = a;
  if (const double f = cap("final_logit_softcapping", kin.caps.logits); f > 0) hf.model["logit_softcap"] = f;
  const double scalar = c.get<double>("query_pre_attn_scalar", 256.0);
  if (!(scalar > 0) || !std::isfinite(scalar))
    c.fail("query_pre_attn_scalar", number_text(scalar) + " must be a finite number above 0");
  const int64_t head_dim = hf.model["head_dim"] ? hf.model["head_dim"].as<int64_t>()
                                                 : hf.model["d_model"].as<int64_t>() / hf.model["heads"].as<int64_t>();
  if (scalar != double(head_dim)) hf.attention["scale_dim"] = scalar;
  c.use("hidden_act");  // Gemma2MLP reads hidden_activation
}

// Gemma 3's and OLMo 3's RoPE, one for each kind of layer (Gemma3RotaryEmbedding,
// Olmo3RotaryEmbedding): rope_parameters keyed by full_attention and sliding_attention
// (transformers 5), or older configs' rope_theta and rope_scaling, the full layers' (Gemma 3's base
// 1e6 where absent, OLMo 3's 5e5), and Gemma 3's rope_local_base_freq, the sliding layers' (1e4
// where absent; OLMo 3's 5e5). The full layers' goes to `full`; the sliding layers' is returned.
// Each kind's is read as read_rope reads a config's, and neither may rotate part of a head.
YAML::Node read_kind_ropes(const ConfigReader& c, const LlamaKin& kin, YAML::Node& full, int64_t head_dim) {
  json kinds = {{"full_attention", {{"rope_type", "default"}}}, {"sliding_attention", {{"rope_type", "default"}}}};
  if (c.has("rope_parameters")) {
    const json& p = c.at("rope_parameters");
    if (!p.is_object()) c.fail("rope_parameters", "must be an object, keyed by full_attention and sliding_attention");
    for (const auto& [key, value] : p.items()) {
      if (!kinds.contains(key))
        c.fail("rope_parameters." + key,
               "is not one of " + kin.title + "'s kinds of layer (full_attention, sliding_attention)");
      if (!value.is_null()) kinds[key] = value;
    }
  }
  if (c.has("rope_scaling")) {  // the full layers' (Gemma3TextConfig, Olmo3Config)
    const json& scaling = c.at("rope_scaling");
    if (!scaling.is_object()) c.fail("rope_scaling", "must be an object");
    // Both merge it into {"rope_type": "default"}: an older `type` alone leaves the layers
    // unscaled in transformers 5.24, which is not what such a config means. Refused.
    if (scaling.contains("type") && !scaling.contains("rope_type"))
      c.fail("rope_scaling.type", scaling.at("type").dump() + " without rope_type: transformers 5.24's " + kin.title +
             " ignores it and scales nothing; write rope_type " + scaling.at("type").dump() + " for the scaling");
    kinds["full_attention"].update(scaling);
  }
  if (!kinds["full_attention"].contains("rope_theta"))
    kinds["full_attention"]["rope_theta"] = c.get<double>("rope_theta", kin.kind_ropes.full_theta);
  if (!kinds["sliding_attention"].contains("rope_theta")) {
    const char* key = kin.kind_ropes.sliding_theta_key;
    double theta = kin.kind_ropes.sliding_theta;
    if (key) theta = c.get<double>(key, theta);
    // Olmo3Config gives a top-level rope_theta to the full layers alone: the sliding ones take
    // 5e5 whatever it says. A config whose rope_theta is another base is refused rather than
    // computed either way.
    else if (const double top = c.get<double>("rope_theta", theta); top != theta)
      c.fail("rope_theta", number_text(top) + " at the top level: transformers 5.24's " +
             kin.title + " gives it to the full_attention layers alone and " + number_text(theta) +
             " to the sliding ones; write rope_parameters.sliding_attention.rope_theta to say which");
    kinds["sliding_attention"]["rope_theta"] = theta;
  }
  for (const char* key : {"rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings"}) c.use(key);
  if (kin.kind_ropes.sliding_theta_key) c.use(kin.kind_ropes.sliding_theta_key);
  YAML::Node sliding;
  for (const char* kind : {"full_attention", "sliding_attention"}) {
    json config = {{"rope_parameters", kinds[kind]}};
    for (const char* key : {"max_position_embeddings", "original_max_position_embeddings"})
      if (c.has(key)) config[key] = c.at(key);
    const ConfigReader each(config, c.where() + " (" + kin.title + "'s " + kind + " layers)");
    YAML::Node& node = std::string(kind) == "full_attention" ? full : sliding;
    read_rope(each, node, head_dim);
    if (node["fraction"])
      c.fail("rope_parameters." + std::string(kind) + ".partial_rotary_factor",
             node["fraction"].as<std::string>() + " is not imported: " + kin.title +
                 "'s rotary turns the whole head");
  }
  return sliding;
}

// OLMo's and MPT's clip_qkv (`key`, its value `value`): q, k and v clamped to [-C, C] right after
// their projections. Null is off, and 0 where the class reads it so (`zero_is_off`: MPT's `if
// self.clip_qkv`; OLMo's `is not None` would clamp everything to 0: refused); a negative or
// non-finite C is refused, and so is one float32 cannot hold (the class clamps float32 values with it).
void read_clip_qkv(const ConfigReader& c, const std::string& key, const json& value, bool zero_is_off, HfModel& hf) {
  if (value.is_null()) return;
  if (!value.is_number()) c.fail(key, value.dump() + " must be a number or null");
  const double clip = value.get<double>();
  if (clip == 0 && zero_is_off) return;
  if (!(clip > 0) || !std::isfinite(clip) || !normal_float32(clip))
    c.fail(key, number_text(clip) + " must be null (off)" + (zero_is_off ? ", 0 (off)" : "") +
                    " or a number within float32's normal range (1.2e-38 to 3.4e38)");
  hf.model["clip_qkv"] = clip;
}

// Llama, Mistral, Qwen2, Qwen3, Phi-3, Gemma, Gemma 2 and 3, OLMo 1, 2 and 3 (modeling_*.py,
// transformers 5.24): RMSNorm, a gated MLP, RoPE, grouped-query attention, each family's own
// (LlamaKin) beside. Gemma's: the embedding times sqrt(hidden_size) (on input; the head ties to it
// unscaled), each norm's weight w stored as w - 1 (GemmaRMSNorm multiplies by 1 + w: the weight plan
// adds the 1), heads 256 wide unless given; Gemma 2's and 3's norms before and after the sublayers.
// OLMo's: the norms after the sublayers (x + n(f(x)), none before), q and k normed over the whole
// projection (H d_head and Hkv d_head values) before they split into heads.
void map_llama_kin(const ConfigReader& c, HfModel& hf, const LlamaKin& kin) {
  const int64_t D = positive(c, "hidden_size"), H = positive(c, "num_attention_heads");
  const int64_t Hkv = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : H;
  c.use("num_key_value_heads");
  if (H % Hkv != 0) c.fail("num_key_value_heads", std::to_string(Hkv) + " does not divide num_attention_heads");
  // Each head's width: the class's default where the family has one (Qwen3Config's 128,
  // GemmaConfig's 256), else hidden_size / num_attention_heads (null too: LlamaConfig and
  // MistralConfig read null as unset; Qwen3's and Gemma's attention would take None for a width).
  int64_t head_dim = kin.head_dim;
  if (c.has("head_dim")) head_dim = positive(c, "head_dim");
  else if (c.present("head_dim") && kin.head_dim > 0)
    c.fail("head_dim", "is null, which " + kin.title + "'s attention would take as its heads' width (give a number, "
                       "or leave the key out for " + std::to_string(kin.head_dim) + ")");
  c.use("head_dim");
  if (head_dim == 0 && D % H != 0)
    c.fail("num_attention_heads", std::to_string(H) + " does not divide hidden_size " + std::to_string(D));
  if (head_dim == 0) head_dim = D / H;
  read_gated_activation(c, kin, hf);
  if (kin.gemma) {
    // Gemma 1.1's configs also carry hidden_activation, which transformers 5.24's Gemma reads nowhere.
    c.use("hidden_activation");
    c.require<bool>("use_bidirectional_attention", false, "causal attention");
    hf.model["scale_embedding"] = true;  // times sqrt(hidden_size), in the dtype of the weights (float32 here)
  }
  if (kin.sublayer_norms != "input") hf.model["sublayer_norms"] = kin.sublayer_norms;
  if (kin.qk_norm_over_projection) hf.model["qk_norm_over"] = "projection";
  if (kin.llama_keys) {
    c.require<bool>("mlp_bias", false, "no biases in the MLP");
    c.require<int64_t>("pretraining_tp", 1, "tensor-parallel slicing");
  }
  c.require<bool>("attention_bias", false, "no biases in the attention projections");
  hf.model["layers"] = positive(c, "num_hidden_layers");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  if (Hkv != H) hf.model["kv_heads"] = Hkv;
  if (head_dim * H != D) hf.model["head_dim"] = head_dim;
  hf.model["d_ffn"] = positive(c, "intermediate_size");
  if (kin.plain_layernorm) {  // OlmoLayerNorm: F.layer_norm with no weight or bias, eps 1e-5 whatever config.json says
    hf.model["norm"] = "layernorm";
    hf.model["norm_eps"] = 1e-5;
    hf.model["norm_affine"] = false;
  } else {
    hf.model["norm"] = "rmsnorm";
    hf.model["norm_eps"] = c.get<double>("rms_norm_eps", kin.rms_norm_eps);
  }
  hf.model["bias"] = false;
  if (kin.clip_qkv) {  // (other families' configs carrying it are refused: their classes clip nothing)
    c.use("clip_qkv");
    if (c.has("clip_qkv")) read_clip_qkv(c, "clip_qkv", c.at("clip_qkv"), false, hf);
  }
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", kin.tied);
  hf.train_length = c.get<int64_t>("max_position_embeddings", 0);
  YAML::Node sliding_rope;
  if (kin.kind_ropes.on) sliding_rope = read_kind_ropes(c, kin, hf.position, head_dim);
  else read_rope(c, hf.position, head_dim, kin.rope);
  if (!kin.partial_rotary && hf.position["fraction"]) {
    // Llama's, Mistral's and Qwen's classes rotate the whole head (rotate_half of all of it): their
    // plain frequencies read no partial_rotary_factor, and a scaling's, which read it, leave the
    // class unable to run (cos and sin narrower than the head). Phi-3's class alone takes it.
    if (hf.position["scaling"])
      c.fail("partial_rotary_factor", hf.position["fraction"].as<std::string>() + " with rope_type " +
                                          hf.position["scaling"].as<std::string>() + ": transformers' " + hf.family +
                                          " class cannot run it (its rotation takes the whole head)");
    hf.position.remove("fraction");  // as transformers: ignored
  }
  if (kin.every_layer_window) {  // every layer's window (Phi3Model's mask: the same)
    if (c.has("sliding_window")) hf.attention["window"] = positive(c, "sliding_window");
    c.use("sliding_window");
  }
  if (kin.qkv_bias) hf.model["qkv_bias"] = true;
  if (kin.qk_norm) hf.model["qk_norm"] = true;
  if (kin.layer_windows != LayerWindows::none) map_layer_windows(c, hf, kin.layer_windows);
  if (kin.caps.on) map_gemma2(c, kin, hf);
  if (kin.kind_ropes.on) {  // the sliding layers' own RoPE, wherever they are
    if (hf.layers.size() > 0) hf.layers["kinds"]["sliding"]["position"] = sliding_rope;
    else if (hf.attention["window"]) hf.position = sliding_rope;
  }
}

void map_llama(const ConfigReader& c, HfModel& hf) { map_llama_kin(c, hf, llama_kin(hf.family)); }

// Gemma 3 4B, 12B and 27B (Gemma3ForConditionalGeneration, model_type gemma3): a SigLIP vision
// tower and its projector beside Gemma 3's text model, whose config is text_config (with
// Gemma3TextConfig's defaults where a key is absent: the Hub's configs give few) and whose tensors
// are under language_model (language_model.model.*, as the Hub's folders and transformers 5.24's
// save_pretrained store them; model.language_model.*, its own names, too). Text in: the text
// model's logits (no image, so nothing else of the class takes part); the vision tensors stay
// unread. transformers 5.24's class caps no logits (its forward never reads
// final_logit_softcapping) and ties its head to the embedding: a config that says otherwise is
// refused.
void map_gemma3_multimodal(const ConfigReader& c, HfModel& hf) {
  if (!c.has("text_config") || !c.at("text_config").is_object())
    c.fail("text_config", "must be an object: Gemma 3's text model, the part extrap imports");
  json text = c.at("text_config");
  static const json defaults = {{"vocab_size", 262208},        {"hidden_size", 2304},         {"intermediate_size", 9216},
                                {"num_hidden_layers", 26},       {"num_attention_heads", 8},    {"num_key_value_heads", 4},
                                {"max_position_embeddings", 131072}};
  for (const auto& [key, value] : defaults.items())
    if (!text.contains(key)) text[key] = value;
  const ConfigReader t(text, c.where() + " text_config");
  if (t.get<std::string>("model_type", "gemma3_text") != "gemma3_text")
    t.fail("model_type", "\"" + t.get<std::string>("model_type") + "\" is not Gemma 3's text model (gemma3_text)");
  if (t.has("final_logit_softcapping"))
    t.fail("final_logit_softcapping", t.at("final_logit_softcapping").dump() + " is not imported: transformers 5.24's "
           "Gemma3ForConditionalGeneration caps no logits; refusing rather than computing another model");
  for (const ConfigReader* r : {&c, &t})
    if (!r->get<bool>("tie_word_embeddings", true))
      r->fail("tie_word_embeddings", "false is not imported: Gemma 3's multimodal folders tie the head to the embedding");
  hf.vocab_size = positive(t, "vocab_size");
  map_llama_kin(t, hf, llama_kin("gemma3_text"));
  t.finish("gemma3 (text_config)");
  c.use("vision_config");  // unread: no image goes in
  for (const char* key : {"mm_tokens_per_image", "boi_token_index", "eoi_token_index", "image_token_index",
                          "boi_token_id", "eoi_token_id", "image_token_id"})
    c.use(key);
}

// The MLP activations of GPT-2's and GPT-NeoX's configs and extrap's for each; the first entry
// of an extrap activation is the name an export writes.
const std::vector<std::pair<std::string, std::string>> kHfActivations = {
    {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"gelu", "gelu"}, {"relu", "relu"}};

// extrap's activation for config.json's `key` (default `fallback`), refusing one not listed.
std::string read_activation(const ConfigReader& c, const std::string& key, const std::string& fallback) {
  const std::string act = c.get<std::string>(key, fallback);
  for (const auto& [hf, extrap] : kHfActivations)
    if (hf == act) return extrap;
  c.fail(key, "\"" + act + "\" is not imported (gelu_new, gelu_pytorch_tanh, gelu, relu are)");
}

void map_gpt2(const ConfigReader& c, HfModel& hf) {
  const int64_t D = positive(c, "n_embd"), H = positive(c, "n_head");
  if (D % H != 0) c.fail("n_head", std::to_string(H) + " does not divide n_embd " + std::to_string(D));
  const std::string activation = read_activation(c, "activation_function", "gelu_new");
  c.require<bool>("scale_attn_weights", true, "scores divided by sqrt(head dim)");
  c.require<bool>("scale_attn_by_inverse_layer_idx", false, "scores divided by the layer's number");
  c.require<bool>("add_cross_attention", false, "cross-attention");
  hf.model["layers"] = positive(c, "n_layer");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  hf.model["d_ffn"] = c.has("n_inner") ? positive(c, "n_inner") : 4 * D;
  c.use("n_inner");
  hf.model["activation"] = activation;
  hf.model["norm_eps"] = c.get<double>("layer_norm_epsilon", 1e-5);
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", true);
  hf.train_length = positive(c, "n_positions");
  hf.position["name"] = "learned";
  hf.position["max_length"] = hf.train_length;
}

void map_bloom(const ConfigReader& c, HfModel& hf) {
  const int64_t D = c.has("hidden_size") ? positive(c, "hidden_size") : positive(c, "n_embed");
  c.use("hidden_size");
  c.use("n_embed");
  const int64_t H = positive(c, "n_head");
  if (D % H != 0) c.fail("n_head", std::to_string(H) + " does not divide hidden_size " + std::to_string(D));
  c.require<bool>("apply_residual_connection_post_layernorm", false, "the residual taken after the norm");
  hf.model["layers"] = positive(c, "n_layer");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  hf.model["d_ffn"] = 4 * D;
  hf.model["activation"] = "gelu_tanh";
  hf.model["norm_eps"] = c.get<double>("layer_norm_epsilon", 1e-5);
  hf.model["embedding_norm"] = true;
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", true);
  hf.train_length = c.get<int64_t>("seq_length", 0);
  c.use("offset_alibi");  // only shifts every score of a row alike
  hf.position["name"] = "alibi";
}

void map_gpt_neox(const ConfigReader& c, HfModel& hf) {
  const int64_t D = positive(c, "hidden_size"), H = positive(c, "num_attention_heads");
  if (D % H != 0) c.fail("num_attention_heads", std::to_string(H) + " does not divide hidden_size " + std::to_string(D));
  const std::string activation = read_activation(c, "hidden_act", "gelu");
  c.require<bool>("attention_bias", true, "attention projections without biases beside an MLP with them");
  hf.model["layers"] = positive(c, "num_hidden_layers");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  hf.model["d_ffn"] = positive(c, "intermediate_size");
  hf.model["activation"] = activation;
  hf.model["norm_eps"] = c.get<double>("layer_norm_eps", 1e-5);
  hf.model["block"] = c.get<bool>("use_parallel_residual", true) ? "parallel" : "sequential";
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", false);
  hf.train_length = c.get<int64_t>("max_position_embeddings", 0);
  c.use("classifier_dropout");
  // transformers 5.24: rotary_pct absent means 0.25 (configuration_gpt_neox.py), not the whole head.
  RopeRules rope;
  rope.fraction = 0.25;
  rope.theta_key = "rotary_emb_base";
  rope.fraction_key = "rotary_pct";
  read_rope(c, hf.position, D / H, rope);
}

void map_mpt(const ConfigReader& c, HfModel& hf) {
  const int64_t D = positive(c, "d_model"), H = positive(c, "n_heads");
  if (D % H != 0) c.fail("n_heads", std::to_string(H) + " does not divide d_model " + std::to_string(D));
  c.require<bool>("no_bias", true, "MPT with biases");
  c.require<int64_t>("expansion_ratio", 4, "transformers' MPT builds 4 d_model whatever it says");
  c.require<bool>("learned_pos_emb", false, "learned positions beside ALiBi");
  c.require<std::string>("norm_type", "low_precision_layernorm", "another norm");
  c.use("embedding_fraction");  // scales the embedding's gradient only
  c.use("init_device");
  c.use("emb_pdrop");
  c.use("logit_scale");
  if (c.has("logit_scale")) c.fail("logit_scale", c.at("logit_scale").dump() + " is not imported");
  // attn_config: the parts that change the numbers; transformers ignores alibi_bias_max (8).
  const json& a = c.at("attn_config");
  const auto attn = [&](const std::string& key, const json& expected, const std::string& why) {
    if (a.contains(key) && !a.at(key).is_null() && a.at(key) != expected)
      c.fail("attn_config." + key, a.at(key).dump() + " is not imported (" + why + ")");
  };
  if (!a.value("alibi", false)) c.fail("attn_config.alibi", "is not true: MPT without ALiBi is not imported");
  attn("alibi_bias_max", 8, "transformers computes MPT's slopes with 8 whatever it says");
  attn("qk_ln", false, "a norm of q and k");
  if (a.contains("clip_qkv")) read_clip_qkv(c, "attn_config.clip_qkv", a.at("clip_qkv"), true, hf);
  attn("softmax_scale", nullptr, "another softmax scale than 1/sqrt(head dim)");
  attn("prefix_lm", false, "prefix-LM masks");
  attn("attn_uses_sequence_id", false, "sequence-id masks");
  attn("attn_type", "multihead_attention", "another attention");
  hf.model["layers"] = positive(c, "n_layers");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  hf.model["d_ffn"] = 4 * D;
  hf.model["bias"] = false;
  hf.model["norm_eps"] = c.get<double>("layer_norm_epsilon", 1e-5);
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", true);
  hf.train_length = c.get<int64_t>("max_seq_len", 0);
  // MPT's slopes, 2^(-8k / P) for P = 2^ceil(log2 H) reordered odd terms first and cut to H, are
  // the paper's for every H; its bias m (j - (max_seq_len - 1)) differs from -m (i - j) by a
  // constant per query, which the softmax removes.
  hf.position["name"] = "alibi";
}

// Falcon (modeling_falcon.py, transformers 5.24). A flag config.json leaves out takes
// FalconConfig's default (multi_query and parallel_attn true: Falcon-7B's); one given as null is
// false, as the class tests it.
bool falcon_flag(const ConfigReader& c, const std::string& key, bool fallback) {
  c.use(key);
  if (!c.present(key)) return fallback;
  return c.has(key) && c.get<bool>(key);
}

void map_falcon(const ConfigReader& c, HfModel& hf) {
  const int64_t D = c.has("hidden_size") ? positive(c, "hidden_size") : positive(c, "n_embed");
  c.use("hidden_size");
  c.use("n_embed");
  const int64_t H = positive(c, "num_attention_heads");
  if (D % H != 0) c.fail("num_attention_heads", std::to_string(H) + " does not divide hidden_size " + std::to_string(D));
  const bool alibi = falcon_flag(c, "alibi", false), new_decoder = falcon_flag(c, "new_decoder_architecture", false),
             multi_query = falcon_flag(c, "multi_query", true), parallel = falcon_flag(c, "parallel_attn", true),
             bias = falcon_flag(c, "bias", false);
  const std::string act = c.get<std::string>("activation", "gelu");
  if (act != "gelu") c.fail("activation", "\"" + act + "\" is not imported (gelu is)");
  // The original RW code's option (the Hub's configs write it false); transformers' Falcon ignores it.
  c.require<bool>("apply_residual_connection_post_layernorm", false, "the residual taken after the norm");
  // Key and value heads: num_kv_heads in the new decoder architecture (Falcon-40B, 180B), one with
  // multi_query (Falcon-7B), else every head's own (num_kv_heads must then be the head count).
  const int64_t kv = c.has("num_kv_heads") ? positive(c, "num_kv_heads") : H;
  int64_t Hkv = H;
  if (new_decoder) {
    if (H % kv != 0) c.fail("num_kv_heads", std::to_string(kv) + " does not divide num_attention_heads " + std::to_string(H));
    Hkv = kv;
  } else if (multi_query) {
    Hkv = 1;
  } else if (kv != H) {
    c.fail("num_kv_heads", std::to_string(kv) + " differs from num_attention_heads without the new decoder "
                           "architecture or multi_query: transformers' Falcon cannot run it");
  }
  // The block. The new decoder architecture is parallel, with two norms (ln_attn, ln_mlp) or, with
  // num_ln_in_parallel_attn 1, one; the old one is sequential or parallel with one norm. Other
  // combinations fail inside transformers' FalconDecoderLayer.
  const int64_t norms = c.has("num_ln_in_parallel_attn") ? c.get<int64_t>("num_ln_in_parallel_attn") : (new_decoder ? 2 : 0);
  BlockKind block = BlockKind::sequential;
  if (new_decoder) {
    if (!parallel) c.fail("parallel_attn", "is false with new_decoder_architecture: transformers' Falcon cannot run it");
    if (norms != 1 && norms != 2)
      c.fail("num_ln_in_parallel_attn", std::to_string(norms) + " is not 1 or 2: transformers' Falcon cannot run it");
    block = norms == 2 ? BlockKind::parallel : BlockKind::parallel_shared;
  } else if (parallel) {
    if (norms == 2)
      c.fail("num_ln_in_parallel_attn", "2 without new_decoder_architecture: transformers' Falcon cannot run it");
    block = BlockKind::parallel_shared;
  }
  hf.model["layers"] = positive(c, "num_hidden_layers");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  if (Hkv != H) hf.model["kv_heads"] = Hkv;
  hf.model["d_ffn"] = c.has("ffn_hidden_size") ? positive(c, "ffn_hidden_size") : 4 * D;
  c.use("ffn_hidden_size");
  hf.model["norm_eps"] = c.get<double>("layer_norm_epsilon", 1e-5);
  hf.model["bias"] = bias;
  hf.model["norm_bias"] = true;  // LayerNorms with biases whatever `bias` says
  if (block != BlockKind::sequential) hf.model["block"] = enum_name(block);
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", true);
  hf.train_length = c.get<int64_t>("max_position_embeddings", 0);
  if (alibi) {
    c.use("rope_theta");  // no rotation with ALiBi
    c.use("rope_scaling");
    c.use("rope_parameters");
    // Falcon's own rule (modeling_falcon.py, build_alibi_tensor and the SDPA path): the slopes
    // rounded to bfloat16, each m j rounded to bfloat16, the bias divided by sqrt(d_head).
    hf.position["name"] = "alibi";
    hf.position["round_slopes"] = true;
    hf.position["bias_scale"] = 1.0 / std::sqrt(double(D / H));
    return;
  }
  // Rotary over the whole head, rotate_half's pairing (FalconRotaryEmbedding reads no
  // partial_rotary_factor: a share read_rope found is refused).
  read_rope(c, hf.position, D / H);
  if (hf.position["fraction"])
    c.fail("partial_rotary_factor",
           hf.position["fraction"].Scalar() + " is not imported: Falcon's rotary turns the whole head");
}

// A folder extrap wrote with remote code (core/export/hf_export.h): the model is the exported
// run's, given whole by extrap_metadata; config.json's other keys must agree with it.
void map_extrap(const ConfigReader& c, HfModel& hf) {
  const json metadata = c.get<json>("extrap_metadata");
  const auto field = [&](const char* key) -> std::string {
    if (!metadata.is_object() || !metadata.contains(key) || !metadata.at(key).is_string())
      c.fail("extrap_metadata", "has no " + std::string(key) + ": not written by `extrap export --format hf`");
    return metadata.at(key).get<std::string>();
  };
  const auto agree = [&](const char* key, int64_t expected) {
    if (c.get<int64_t>(key) != expected)
      c.fail(key, std::to_string(c.get<int64_t>(key)) + " disagrees with extrap_metadata's " + std::to_string(expected));
  };
  try {
    hf.extrap_config = YAML::Load(field("config"));
    const YAML::Node& config = hf.extrap_config;
    if (!config.IsMap() || !config["model"] || !config["position"] || !config["train"] || !config["data"])
      c.fail("extrap_metadata", "config lacks the model, position, train or data section");
    hf.vocabulary_hash = json::parse(field("checkpoint")).at("vocabulary_hash").get<std::string>();
    hf.model = config["model"];
    hf.position = config["position"];
    if (config["attention"]) hf.attention = config["attention"];
    hf.train_length = config["train"]["seq_len"].as<int64_t>();
    agree("hidden_size", config["model"]["d_model"].as<int64_t>());
    agree("num_hidden_layers", config["model"]["layers"].as<int64_t>());
    agree("num_attention_heads", config["model"]["heads"].as<int64_t>());
    agree("max_position_embeddings", hf.train_length);
    agree("vocab_size", json::parse(field("data")).at("vocab_size").get<int64_t>());
  } catch (const YAML::Exception& e) {
    c.fail("extrap_metadata", "config is not an extrap run's (" + std::string(e.what()) + ")");
  } catch (const json::exception& e) {
    c.fail("extrap_metadata", "is not extrap's (" + std::string(e.what()) + ")");
  }
  c.require("tie_word_embeddings", false, "extrap's remote code ties nothing itself");
  for (const char* key : {"auto_map", "extrap_metadata"}) c.use(key);
}

using Mapper = void (*)(const ConfigReader&, HfModel&);
const std::map<std::string, Mapper>& mappers() {
  static const std::map<std::string, Mapper> m = {
      {"llama", map_llama}, {"mistral", map_llama}, {"qwen2", map_llama}, {"qwen3", map_llama}, {"phi3", map_llama},
      {"gemma", map_llama}, {"gemma2", map_llama}, {"gemma3_text", map_llama}, {"olmo", map_llama},
      {"olmo2", map_llama}, {"olmo3", map_llama},  {"gemma3", map_gemma3_multimodal},
      {"gpt2", map_gpt2}, {"bloom", map_bloom},
      {"gpt_neox", map_gpt_neox}, {"mpt", map_mpt}, {"falcon", map_falcon}};
  return m;
}

}  // namespace

const std::vector<std::string>& hf_families() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const auto& [name, mapper] : mappers()) out.push_back(name);
    return out;
  }();
  return names;
}

HfModel read_hf_model(const fs::path& dir) {
  const fs::path path = dir / "config.json";
  if (!fs::is_directory(dir)) throw ConfigError(dir.string() + ": not a checkpoint folder (no such directory)");
  if (!fs::exists(path)) throw ConfigError(path.string() + ": missing: not a Hugging Face checkpoint folder");
  HfModel hf;
  hf.dir = dir;
  try {
    hf.config = json::parse(read_file(path));
  } catch (const json::exception& e) {
    throw ConfigError(path.string() + ": not JSON (" + std::string(e.what()) + ")");
  }
  if (!hf.config.is_object()) throw ConfigError(path.string() + ": not a JSON object");
  const ConfigReader c(hf.config, path.string());
  hf.family = c.get<std::string>("model_type");
  if (hf.family == "extrap") {
    hf.vocab_size = positive(c, "vocab_size");
    map_extrap(c, hf);
    c.finish(hf.family);
    return hf;
  }
  const auto it = mappers().find(hf.family);
  if (it == mappers().end()) {
    std::string known;
    for (const auto& name : hf_families()) known += (known.empty() ? "" : ", ") + name;
    c.fail("model_type", "\"" + hf.family + "\" is not a family extrap imports (" + known +
                             ", or extrap's own remote code)");
  }
  hf.model = YAML::Node(YAML::NodeType::Map);
  hf.position = YAML::Node(YAML::NodeType::Map);
  hf.attention = YAML::Node(YAML::NodeType::Map);
  hf.layers = YAML::Node(YAML::NodeType::Map);
  hf.model["scale_embedding"] = false;
  hf.model["dropout"] = 0.0;
  it->second(c, hf);
  if (hf.vocab_size == 0) hf.vocab_size = positive(c, "vocab_size");  // (Gemma 3's multimodal: text_config's)
  c.finish(hf.family);
  return hf;
}

// ----------------------------------------------------------------------------------- weights

namespace {

// Where each extrap parameter comes from: the folder's tensors and how they combine.
struct Source {
  std::vector<std::string> names;
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> combine;  // the folder's -> extrap's
  std::function<std::vector<torch::Tensor>(const torch::Tensor&)> split;     // extrap's -> the folder's
};
using WeightPlan = std::map<std::string, Source>;

Source same(const std::string& name) {
  return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0]; },
          [](const torch::Tensor& x) { return std::vector<torch::Tensor>{x}; }};
}
Source transposed(const std::string& name) {  // GPT-2's Conv1D: (in, out)
  return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0].t(); },
          [](const torch::Tensor& x) { return std::vector<torch::Tensor>{x.t().contiguous()}; }};
}
// Gemma's norm weights: the folder holds w, its RMSNorm multiplies by 1 + w (in float32, as
// GemmaRMSNorm adds the 1 after widening w), extrap's by its weight.
Source plus_one(const std::string& name) {
  return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0].to(torch::kFloat32) + 1.0; },
          [](const torch::Tensor& x) { return std::vector<torch::Tensor>{x - 1.0}; }};
}
// Rows of the parts, one after another (`rows`: each part's, for splitting).
Source concatenated(std::vector<std::string> names, std::vector<int64_t> rows) {
  return {std::move(names), [](const std::vector<torch::Tensor>& t) { return torch::cat(t, 0); },
          [rows](const torch::Tensor& x) {
            std::vector<torch::Tensor> parts;
            int64_t at = 0;
            for (int64_t r : rows) {
              parts.push_back(x.narrow(0, at, r).contiguous());
              at += r;
            }
            return parts;
          }};
}
// q, k and v fused in groups, one per key-value head: its `group` query heads, then its key, then
// its value (rows (Hkv, group + 2, Dh)); extrap's rows are every query head, every key head,
// every value head. BLOOM, GPT-NeoX and Falcon's multi-head attention: Hkv = H, group 1; Falcon's
// multi-query: Hkv 1, group H; its new decoder architecture: num_kv_heads groups.
Source grouped_qkv(const std::string& name, int64_t kv_heads, int64_t group) {
  const auto view = [kv_heads, group](const torch::Tensor& x) {
    std::vector<int64_t> shape = {kv_heads, group + 2, x.size(0) / (kv_heads * (group + 2))};
    shape.insert(shape.end(), x.sizes().begin() + 1, x.sizes().end());
    return shape;
  };
  return {{name},
          [=](const std::vector<torch::Tensor>& t) {
            const auto x = t[0].reshape(view(t[0]));
            const auto rows = [&](const torch::Tensor& part) { return part.flatten(0, 2); };
            return torch::cat({rows(x.narrow(1, 0, group)), rows(x.narrow(1, group, 1)), rows(x.narrow(1, group + 1, 1))}, 0);
          },
          [=](const torch::Tensor& x) {
            auto shape = view(x);
            const int64_t q = kv_heads * group * shape[2], k = kv_heads * shape[2];
            auto part = [&](int64_t at, int64_t n, int64_t heads) {
              auto s = shape;
              s[1] = heads;
              return x.narrow(0, at, n).reshape(s);
            };
            const auto grouped = torch::cat({part(0, q, group), part(q, k, 1), part(q + k, k, 1)}, 1);
            return std::vector<torch::Tensor>{grouped.reshape(x.sizes()).contiguous()};
          }};
}

// The folder's names have a prefix (model., transformer.) or none, as the class saved them.
std::string find_prefix(const SafetensorsReader& w, const std::string& probe, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (w.contains(p + probe)) return p;
  throw ConfigError(w.where() + ": has no tensor " + prefixes.front() + probe +
                    " (nor without its prefix): not the weights of this config's family");
}


WeightPlan llama_plan(const std::string& p, const ModelConfig& m, LlamaLayout layout) {
  const bool qkv_bias = m.qkv_bias, fused = layout == LlamaLayout::fused;
  const int64_t Dh = m.d_head(), q = m.heads * Dh, kv = m.key_value_heads() * Dh, F = m.ffn_width();
  const auto norm = layout == LlamaLayout::gemma || layout == LlamaLayout::gemma2 ? plus_one : same;
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "embed_tokens.weight");
  plan["ln_final.weight"] = norm(p + "norm.weight");
  if (!m.tie_embeddings) plan["head.weight"] = same("lm_head.weight");
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string s = p + "layers." + std::to_string(l) + ".", e = "blocks." + std::to_string(l) + ".";
    if (layout == LlamaLayout::olmo2) {
      plan[e + "ln_attention_out.weight"] = same(s + "post_attention_layernorm.weight");
      plan[e + "ln_ffn_out.weight"] = same(s + "post_feedforward_layernorm.weight");
    } else if (layout == LlamaLayout::gemma2) {
      plan[e + "ln_attention.weight"] = norm(s + "input_layernorm.weight");
      plan[e + "ln_attention_out.weight"] = norm(s + "post_attention_layernorm.weight");
      plan[e + "ln_ffn.weight"] = norm(s + "pre_feedforward_layernorm.weight");
      plan[e + "ln_ffn_out.weight"] = norm(s + "post_feedforward_layernorm.weight");
    } else {
      plan[e + "ln_attention.weight"] = norm(s + "input_layernorm.weight");
      plan[e + "ln_ffn.weight"] = norm(s + "post_attention_layernorm.weight");
    }
    plan[e + "attention.qkv.weight"] =
        fused ? same(s + "self_attn.qkv_proj.weight")
              : concatenated({s + "self_attn.q_proj.weight", s + "self_attn.k_proj.weight", s + "self_attn.v_proj.weight"},
                             {q, kv, kv});
    if (qkv_bias)
      plan[e + "attention.qkv.bias"] = concatenated(
          {s + "self_attn.q_proj.bias", s + "self_attn.k_proj.bias", s + "self_attn.v_proj.bias"}, {q, kv, kv});
    plan[e + "attention.out.weight"] = same(s + "self_attn.o_proj.weight");
    if (m.qk_norm) {  // Qwen3
      plan[e + "attention.q_norm.weight"] = norm(s + "self_attn.q_norm.weight");
      plan[e + "attention.k_norm.weight"] = norm(s + "self_attn.k_norm.weight");
    }
    plan[e + "ffn_in.weight"] = fused ? same(s + "mlp.gate_up_proj.weight")
                                      : concatenated({s + "mlp.gate_proj.weight", s + "mlp.up_proj.weight"}, {F, F});
    plan[e + "ffn_out.weight"] = same(s + "mlp.down_proj.weight");
  }
  return plan;
}

WeightPlan gpt2_plan(const std::string& p, const ModelConfig& m) {
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "wte.weight");
  plan["position.table"] = same(p + "wpe.weight");
  plan["ln_final.weight"] = same(p + "ln_f.weight");
  plan["ln_final.bias"] = same(p + "ln_f.bias");
  if (!m.tie_embeddings) plan["head.weight"] = same("lm_head.weight");
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string s = p + "h." + std::to_string(l) + ".", e = "blocks." + std::to_string(l) + ".";
    for (const char* part : {"weight", "bias"}) {
      const std::string x = part;
      plan[e + "ln_attention." + x] = same(s + "ln_1." + x);
      plan[e + "ln_ffn." + x] = same(s + "ln_2." + x);
    }
    plan[e + "attention.qkv.weight"] = transposed(s + "attn.c_attn.weight");
    plan[e + "attention.qkv.bias"] = same(s + "attn.c_attn.bias");
    plan[e + "attention.out.weight"] = transposed(s + "attn.c_proj.weight");
    plan[e + "attention.out.bias"] = same(s + "attn.c_proj.bias");
    plan[e + "ffn_in.weight"] = transposed(s + "mlp.c_fc.weight");
    plan[e + "ffn_in.bias"] = same(s + "mlp.c_fc.bias");
    plan[e + "ffn_out.weight"] = transposed(s + "mlp.c_proj.weight");
    plan[e + "ffn_out.bias"] = same(s + "mlp.c_proj.bias");
  }
  return plan;
}

// BLOOM's, GPT-NeoX's and Falcon's blocks: LayerNorms, linear layers, q, k and v fused in groups
// (grouped_qkv). `layers` is where layer l's tensors start ("h.", "layers."), `attention` its
// attention's. The norms: input_layernorm and post_attention_layernorm; one shared,
// input_layernorm; Falcon's new decoder architecture's two, ln_attn and ln_mlp (`falcon`).
void add_fused_blocks(WeightPlan& plan, const std::string& layers, const std::string& attention,
                      const ModelConfig& m, bool falcon) {
  const int64_t Hkv = m.key_value_heads();
  const bool two = falcon && m.block == BlockKind::parallel;
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string s = layers + std::to_string(l) + ".", e = "blocks." + std::to_string(l) + ".";
    for (const std::string x : {"weight", "bias"}) {
      if (x == "weight" || m.norm_biased()) {
        plan[e + "ln_attention." + x] = same(s + (two ? "ln_attn." : "input_layernorm.") + x);
        if (m.block != BlockKind::parallel_shared)
          plan[e + "ln_ffn." + x] = same(s + (two ? "ln_mlp." : "post_attention_layernorm.") + x);
      }
      if (x == "weight" || m.bias) {
        plan[e + "attention.qkv." + x] = grouped_qkv(s + attention + ".query_key_value." + x, Hkv, m.heads / Hkv);
        plan[e + "attention.out." + x] = same(s + attention + ".dense." + x);
        plan[e + "ffn_in." + x] = same(s + "mlp.dense_h_to_4h." + x);
        plan[e + "ffn_out." + x] = same(s + "mlp.dense_4h_to_h." + x);
      }
    }
  }
}

WeightPlan gpt_neox_plan(const std::string& p, const ModelConfig& m) {
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "embed_in.weight");
  plan["ln_final.weight"] = same(p + "final_layer_norm.weight");
  plan["ln_final.bias"] = same(p + "final_layer_norm.bias");
  if (!m.tie_embeddings) plan["head.weight"] = same("embed_out.weight");
  add_fused_blocks(plan, p + "layers.", "attention", m, false);
  return plan;
}

WeightPlan falcon_plan(const std::string& p, const ModelConfig& m) {
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "word_embeddings.weight");
  plan["ln_final.weight"] = same(p + "ln_f.weight");
  if (m.norm_biased()) plan["ln_final.bias"] = same(p + "ln_f.bias");
  if (!m.tie_embeddings) plan["head.weight"] = same("lm_head.weight");
  add_fused_blocks(plan, p + "h.", "self_attention", m, true);
  return plan;
}

// BLOOM: Falcon-RW's layout with a LayerNorm after the embedding.
WeightPlan bloom_plan(const std::string& p, const ModelConfig& m) {
  WeightPlan plan = falcon_plan(p, m);
  plan["embedding_norm.weight"] = same(p + "word_embeddings_layernorm.weight");
  plan["embedding_norm.bias"] = same(p + "word_embeddings_layernorm.bias");
  return plan;
}

WeightPlan mpt_plan(const std::string& p, const ModelConfig& m) {
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "wte.weight");
  plan["ln_final.weight"] = same(p + "norm_f.weight");
  if (!m.tie_embeddings) plan["head.weight"] = same("lm_head.weight");
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string s = p + "blocks." + std::to_string(l) + ".", e = "blocks." + std::to_string(l) + ".";
    plan[e + "ln_attention.weight"] = same(s + "norm_1.weight");
    plan[e + "ln_ffn.weight"] = same(s + "norm_2.weight");
    plan[e + "attention.qkv.weight"] = same(s + "attn.Wqkv.weight");  // [q; k; v] blocks, as extrap's
    plan[e + "attention.out.weight"] = same(s + "attn.out_proj.weight");
    plan[e + "ffn_in.weight"] = same(s + "ffn.up_proj.weight");
    plan[e + "ffn_out.weight"] = same(s + "ffn.down_proj.weight");
  }
  return plan;
}

// Tensors a folder may hold that the model computes itself (buffers older classes saved).
bool computed_buffer(const std::string& name) {
  auto ends_with = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || ends_with(".attention.bias") ||
         ends_with(".attention.masked_bias") || ends_with("rotary_emb.inv_freq");
}

// The tensors' prefix each family's class saves under, the probe that finds it in a folder, and
// the prefixes older files use (none).
struct FamilyPrefix {
  const char* family;
  const char* prefix;
  const char* probe;
  const char* other = "";       // the prefix of the family's other layout (default: none)
  const char* unread[2] = {};   // tensors of parts extrap does not compute (Gemma 3's vision tower)
};
constexpr FamilyPrefix kPrefixes[] = {
    {"llama", "model.", "embed_tokens.weight"},    {"mistral", "model.", "embed_tokens.weight"},
    {"qwen2", "model.", "embed_tokens.weight"},    {"qwen3", "model.", "embed_tokens.weight"},
    {"phi3", "model.", "embed_tokens.weight"},     {"gemma", "model.", "embed_tokens.weight"},
    {"gemma2", "model.", "embed_tokens.weight"},    {"gemma3_text", "model.", "embed_tokens.weight"},
    {"olmo", "model.", "embed_tokens.weight"},      {"olmo2", "model.", "embed_tokens.weight"},
    {"olmo3", "model.", "embed_tokens.weight"},
    {"gemma3", "language_model.model.", "embed_tokens.weight", "model.language_model.",
     {"vision_tower.", "multi_modal_projector."}},
    {"gpt2", "transformer.", "wte.weight"},
    {"bloom", "transformer.", "word_embeddings.weight"}, {"gpt_neox", "gpt_neox.", "embed_in.weight"},
    {"mpt", "transformer.", "wte.weight"},         {"falcon", "transformer.", "word_embeddings.weight"}};

const FamilyPrefix& prefix_of(const std::string& family) {
  for (const auto& p : kPrefixes)
    if (family == p.family) return p;
  throw ConfigError("no weight mapping for family " + family);
}

std::string folder_prefix(const std::string& family, const SafetensorsReader& weights) {
  const FamilyPrefix& p = prefix_of(family);
  return find_prefix(weights, p.probe, {p.prefix, p.other});
}

// extrap's own tensors, by their own names (a folder of remote code).
WeightPlan extrap_plan(TransformerLM& model) {
  WeightPlan plan;
  for (const auto& item : model->named_parameters()) plan.emplace(item.key(), same(item.key()));
  return plan;
}

WeightPlan family_plan(const std::string& family, const std::string& prefix, const ModelConfig& m) {
  if (llama_kin_table().count(family)) return llama_plan(prefix, m, llama_kin(family).layout);
  if (family == "gpt2") return gpt2_plan(prefix, m);
  if (family == "bloom") return bloom_plan(prefix, m);
  if (family == "gpt_neox") return gpt_neox_plan(prefix, m);
  if (family == "mpt") return mpt_plan(prefix, m);
  if (family == "falcon") return falcon_plan(prefix, m);
  throw ConfigError("no weight mapping for family " + family);
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(const std::string& family, TransformerLM& model,
                                                              double embedding_scale) {
  const WeightPlan plan = family_plan(family, prefix_of(family).prefix, model->config());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    const auto it = plan.find(item.key());
    if (it == plan.end())
      throw ConfigError("the model's parameter " + item.key() + " has no place in transformers' " + family + " model");
    auto value = item.value().detach().to(torch::kCPU, torch::kFloat32);
    if (item.key() == "embedding.weight" && embedding_scale != 1.0) value = value * embedding_scale;
    const auto parts = it->second.split(value);
    for (size_t i = 0; i < parts.size(); ++i) out.emplace_back(it->second.names[i], parts[i].contiguous());
  }
  return out;
}

void load_hf_weights(const HfModel& hf, const SafetensorsReader& weights, TransformerLM& model) {
  const bool own = hf.family == "extrap";
  const WeightPlan plan = own ? extrap_plan(model) : family_plan(hf.family, folder_prefix(hf.family, weights), model->config());
  std::set<std::string> used;
  torch::NoGradGuard no_grad;
  if (own)  // extrap's export holds the buffers too (ALiBi's slopes, ...): they must be this config's
    for (const auto& item : model->named_buffers()) {
      if (!weights.contains(item.key())) continue;
      const auto stored = weights.tensor(item.key());
      if (stored.sizes() != item.value().sizes() ||
          !stored.to(item.value().scalar_type()).equal(item.value().detach().cpu()))
        throw ConfigError(weights.where() + ": tensor " + item.key() + " is not what extrap_metadata's config "
                          "computes: the weights are not this config's model");
      used.insert(item.key());
    }
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const auto it = plan.find(name);
    if (it == plan.end())
      throw ConfigError(hf.dir.string() + ": extrap's " + hf.family + " model has a parameter " + name +
                        " that no tensor of the folder maps to (a config.json key the mapping missed?)");
    std::vector<torch::Tensor> parts;
    for (const auto& source : it->second.names) {
      if (!weights.contains(source))
        throw ConfigError(weights.where() + ": has no tensor " + source + " (for extrap's " + name +
                          "): the weights are not this config's " + hf.family + " model");
      parts.push_back(weights.tensor(source));
      used.insert(source);
    }
    torch::Tensor value;
    try {
      value = it->second.combine(parts);
    } catch (const c10::Error& e) {
      throw ConfigError(weights.where() + ": tensors of " + name + " do not combine (" + e.what_without_backtrace() + ")");
    }
    torch::Tensor& target = item.value();
    if (value.sizes() != target.sizes()) {
      std::ostringstream message;
      message << weights.where() << ": " << it->second.names.front() << (parts.size() > 1 ? " and the rest" : "")
              << " give " << value.sizes() << " for extrap's " << name << ", which config.json makes "
              << target.sizes();
      throw ConfigError(message.str());
    }
    if (!value.is_floating_point()) throw ConfigError(weights.where() + ": " + it->second.names.front() + " is not floating point");
    target.copy_(value.to(target.scalar_type()));
    for (const auto& source : it->second.names) weights.release(source);  // one copy of the weights at a time
  }
  // Tied embeddings: a saved copy of the head must be the embedding itself.
  for (const std::string head : {"lm_head.weight", "embed_out.weight"}) {
    if (!model->config().tie_embeddings || !weights.contains(head) || used.count(head)) continue;
    if (!weights.tensor(head).equal(weights.tensor(plan.at("embedding.weight").names.front())))
      throw ConfigError(weights.where() + ": " + head + " differs from the input embedding, but config.json ties "
                        "them (tie_word_embeddings)");
    used.insert(head);
  }
  // Parts of the folder's model that extrap does not compute, in either of its layouts.
  const auto unread = [&](const std::string& name) {
    if (own) return false;
    for (const char* part : prefix_of(hf.family).unread)
      if (part && (name.rfind(part, 0) == 0 || name.rfind(std::string("model.") + part, 0) == 0)) return true;
    return false;
  };
  for (const auto& name : weights.names())
    if (!used.count(name) && !computed_buffer(name) && !unread(name))
      throw ConfigError(weights.where() + ": tensor " + name + " is not used by extrap's " + hf.family +
                        " model: config.json does not describe these weights, or the mapping lacks a part");
  for (const auto& item : model->named_parameters())
    if (!torch::isfinite(item.value()).all().item<bool>())
      throw ConfigError(weights.where() + ": non-finite values in the tensor(s) for " + item.key());
}

}  // namespace extrap

// ----------------------------------------------------------------------------------- out

namespace extrap {

namespace {

// Refuses the first of `checks` that fails: {holds, what no class computes}.
void require_all(const std::string& family, const std::vector<std::pair<bool, std::string>>& checks) {
  for (const auto& [holds, what] : checks)
    if (!holds)
      throw NoTransformersClass(what + " (the nearest family, " + family + ", has no such option)");
}

// An option a model has (`used`), the families whose classes compute it, and its name.
struct ClassOption {
  bool used;
  std::set<std::string> families;
  std::string what;
};

// Refuses the first option `family`'s class does not compute, naming those that do.
void require_classes(const std::string& family, const std::vector<ClassOption>& options) {
  for (const ClassOption& o : options) {
    if (!o.used || o.families.count(family)) continue;
    std::string others;
    for (const std::string& f : o.families) others += (others.empty() ? "" : ", ") + f;
    throw NoTransformersClass(o.what + " (the nearest family, " + family + ", has no such option" +
                              (others.empty() ? "" : "; " + others + (o.families.size() == 1 ? " has it" : " have it")) +
                              ")");
  }
}

// config.json's name for extrap's MLP activation: the first of kHfActivations.
std::string hf_activation(const std::string& extrap) {
  for (const auto& [hf, ours] : kHfActivations)
    if (ours == extrap) return hf;
  throw NoTransformersClass("activation " + extrap);
}

json rope_json(const YAML::Node& position, const Config& config) {
  const auto get = [&](const char* key, double fallback) {
    return position[key] ? position[key].as<double>() : fallback;
  };
  json rope = {{"rope_type", "default"}, {"rope_theta", get("base", 10000.0)}};
  if (get("fraction", 1.0) != 1.0) rope["partial_rotary_factor"] = get("fraction", 1.0);
  const std::string scaling = position["scaling"] ? position["scaling"].as<std::string>() : "none";
  if (scaling == "none") return rope;
  if (scaling != "linear" && scaling != "dynamic" && scaling != "yarn" && scaling != "llama3" && scaling != "longrope")
    throw NoTransformersClass("RoPE scaling " + scaling + " built in");
  rope["rope_type"] = scaling;
  rope["factor"] = get("scaling_factor", 1.0);
  if (scaling == "yarn" || scaling == "llama3" || scaling == "longrope")
    rope["original_max_position_embeddings"] = int64_t(get("scaling_length", 0));
  if (scaling == "longrope") {  // the attention factor written out: transformers' default reads the factor
    RopeScaling s;
    s.kind = RopeScalingKind::longrope;
    s.factor = get("scaling_factor", 1.0);
    s.original_length = int64_t(get("scaling_length", 0));
    s.attention_factor = get("attention_factor", 0.0);
    rope["attention_factor"] = rope_attention_factor(s);
    for (const char* key : {"short_factor", "long_factor"}) rope[key] = position[key].as<std::vector<double>>();
  }
  if (scaling == "dynamic" && int64_t(get("scaling_length", 0)) != config.train.seq_len)
    throw NoTransformersClass("dynamic RoPE scaling from length " + std::to_string(int64_t(get("scaling_length", 0))) +
                              ", which transformers takes from max_position_embeddings (train.seq_len " +
                              std::to_string(config.train.seq_len) + ")");
  if (scaling == "yarn") {
    rope["beta_fast"] = get("beta_fast", 32.0);
    rope["beta_slow"] = get("beta_slow", 1.0);
  }
  if (scaling == "llama3") {
    rope["low_freq_factor"] = get("low_freq_factor", 1.0);
    rope["high_freq_factor"] = get("high_freq_factor", 4.0);
  }
  return rope;
}

// Each layer's sliding window and position method, where the `attention` section and every layer
// (without a layer pattern, one kind: `position` and `attention`) take no attention option but the
// window and the section's softcap and score scale (Gemma 2's and 3's, checked by the family), and
// every layer the model's `position` section or a rotary of its own (a pattern whose kinds differ in
// attention.window alone: Qwen2's and Gemma 2's full and sliding layers; and in their RoPE too:
// Gemma 3's, checked by the family); nullopt otherwise, which no family's class computes.
struct LayerShapes {
  std::vector<int64_t> windows;       // each layer's window (0: none)
  std::vector<YAML::Node> positions;  // each layer's position options
  bool own_positions = false;         // some kind has a rotary of its own
};

std::optional<LayerShapes> layer_shapes(const Config& config) {
  const AttentionConfig& section = config.model.attention_options;
  const auto window_alone = [&](AttentionConfig a) {
    if (a.softcap != section.softcap || a.scale_dim != section.scale_dim) return false;
    a.window = 0;
    a.softcap = a.scale_dim = 0;
    return !a.active();
  };
  if (!window_alone(section)) return std::nullopt;
  const LayerPlan plan = layer_plan(config);
  LayerShapes out;
  for (const int64_t k : plan.layer_kind) {
    const LayerKind& kind = plan.kinds[size_t(k)];
    const bool own = kind.position_key != "position";
    if ((own && kind.position_name != "rotary") || !window_alone(kind.attention)) return std::nullopt;
    out.own_positions = out.own_positions || own;
    out.windows.push_back(kind.attention.window);
    out.positions.push_back(kind.position);
  }
  return out;
}

// Falcon's config.json keys for the block of `config` (transformers' FalconDecoderLayer): LayerNorms
// with biases, an exact-GELU mlp of any width, linear layers with biases or without; one
// key-value head (multi_query), every head's own, or groups in the new decoder architecture, which
// is parallel (two norms: ln_attn and ln_mlp; one: num_ln_in_parallel_attn 1); the old one
// sequential or parallel with one norm. Refuses what the class does not compute, by name.
json falcon_block(const Config& config, int64_t window) {
  const ModelConfig& m = config.model;
  const int64_t H = m.heads, Hkv = m.key_value_heads();
  const bool new_decoder = m.block == BlockKind::parallel || (Hkv != H && Hkv != 1);
  require_all("falcon", {{m.norm == NormKind::layernorm && m.norm_biased(), "RMSNorm, or LayerNorms without biases"},
                         {m.ffn == FfnKind::mlp && m.activation == Activation::gelu,
                          "a gated ffn, or an activation other than exact GELU"},
                         {!m.qkv_bias, "biases on q, k and v alone"},
                         {!m.embedding_norm, "an embedding norm"},
                         {window == 0, "a sliding window"},
                         {m.d_head() * H == m.d_model, "heads other than d_model / heads wide (model.head_dim)"},
                         {!new_decoder || m.block != BlockKind::sequential,
                          "grouped-query attention in a sequential block (Falcon's new decoder architecture is "
                          "parallel)"}});
  return {{"hidden_size", m.d_model}, {"num_attention_heads", H}, {"num_hidden_layers", m.layers},
          {"new_decoder_architecture", new_decoder}, {"parallel_attn", m.block != BlockKind::sequential},
          {"bias", m.bias}, {"multi_query", !new_decoder && Hkv == 1}, {"num_kv_heads", Hkv},
          {"num_ln_in_parallel_attn", new_decoder ? json(m.block == BlockKind::parallel ? 2 : 1) : json(nullptr)},
          {"layer_norm_epsilon", m.norm_eps}, {"ffn_hidden_size", m.ffn_width()}, {"activation", "gelu"},
          {"max_position_embeddings", config.train.seq_len}};
}

// A rotary model of LayerNorms and a GELU mlp that Falcon's class computes and GPT-NeoX's does
// not (GPT-NeoX keeps the models it computes).
bool falcon_rotary(const Config& config) {
  const ModelConfig& m = config.model;
  const bool scaled = config.position["scaling"] && config.position["scaling"].as<std::string>() != "none";
  const bool neox = m.bias && m.norm_biased() && m.key_value_heads() == m.heads && m.block != BlockKind::parallel_shared &&
                    !scaled;
  return !neox && m.norm == NormKind::layernorm && m.norm_biased() && m.ffn == FfnKind::mlp &&
         m.activation == Activation::gelu;
}

}  // namespace

HfExportConfig hf_export_config(const Config& config, int64_t vocab_size) {
  const ModelConfig& m = config.model;
  const YAML::Node& position = config.position;
  const std::string method = config.position_name;
  const auto option = [&](const char* key, const std::string& fallback) {
    return position[key] ? position[key].as<std::string>() : fallback;
  };
  const auto number = [&](const char* key, double fallback) {
    return position[key] ? position[key].as<double>() : fallback;
  };
  const AttentionConfig& a = m.attention_options;
  const std::optional<LayerShapes> shapes = layer_shapes(config);
  const std::optional<std::vector<int64_t>> windows =
      shapes ? std::optional<std::vector<int64_t>>(shapes->windows) : std::nullopt;
  const bool own_positions = shapes && shapes->own_positions;  // Gemma 3's alone (checked there)
  const bool patterned = !config.layer_pattern.empty();
  const bool rms_rotary = method == "rotary" && m.norm == NormKind::rmsnorm;  // Llama's and its kin's
  // Soft-capped scores or logits, or a score scale of their own: Gemma 2's class alone (checked there).
  const bool capped = a.softcap > 0 || a.scale_dim > 0 || m.logit_softcap > 0;
  const bool common = m.causal() && !m.adaptive() && windows && m.final_norm && (!m.qk_norm || rms_rotary) &&
                      (m.sublayer_norms == SublayerNorms::input || rms_rotary) && (!capped || rms_rotary) &&
                      (!own_positions || rms_rotary);
  const int64_t D = m.d_model, H = m.heads, F = m.ffn_width();
  const bool standard_heads = m.d_head() * H == D;  // Llama's kin alone write head_dim
  HfExportConfig out;
  if (!common)
    throw NoTransformersClass(!m.causal()                ? "a masked LM"
                              : m.adaptive()              ? "adaptive input and softmax"
                              : !windows && patterned     ? "a layer pattern (other than of full and sliding-window layers)"
                              : !m.final_norm             ? "no final norm"
                              : m.qk_norm                 ? "qk_norm"
                              : m.sublayer_norms != SublayerNorms::input
                                  ? "norms after the sublayers (model.sublayer_norms " + enum_name(m.sublayer_norms) + ")"
                              : capped && windows ? "soft-capped attention scores or logits, or a score scale of their "
                                                    "own, without a rotary RMSNorm model (Gemma 2's)"
                              : own_positions ? "a layer pattern whose kinds have rotary positions of their own, "
                                                "without a rotary RMSNorm model (Gemma 3's, OLMo 3's)"
                                              : "the attention options " + a.describe());
  json c = {{"vocab_size", vocab_size}, {"tie_word_embeddings", m.tie_embeddings}, {"dtype", "float32"},
            {"use_cache", true}};
  // A tied embedding scaled on input only: Gemma's class alone (a rotary RMSNorm model), which
  // scales it itself; an untied one has the scale multiplied into its weights for the others.
  if (m.scale_embedding && m.tie_embeddings && !rms_rotary)
    throw NoTransformersClass("its tied embedding is scaled by sqrt(d_model) on input only (model.scale_embedding)");
  out.embedding_scale = m.scale_embedding && !m.tie_embeddings ? std::sqrt(double(D)) : 1.0;
  const std::string act = enum_name(m.activation);
  // Llama's kin's and OLMo's gated block: ACT2FN[hidden_act] on the gate (SiLU, or GELU's erf or
  // tanh form, torch's own, as extrap's), the heads and the RoPE.
  const std::string hidden_act = m.ffn == FfnKind::swiglu                ? "silu"
                                 : m.activation == Activation::gelu_tanh ? "gelu_pytorch_tanh"
                                                                         : "gelu";
  const auto gated_block = [&] {
    return json{{"hidden_size", D}, {"intermediate_size", F}, {"num_hidden_layers", m.layers},
                {"num_attention_heads", H}, {"num_key_value_heads", m.key_value_heads()}, {"head_dim", m.d_head()},
                {"hidden_act", hidden_act}, {"max_position_embeddings", config.train.seq_len},
                {"rope_parameters", rope_json(position, config)}};
  };
  // The layers' windows: the largest (0: none), and whether every layer has it.
  const int64_t window = *std::max_element(windows->begin(), windows->end());
  const bool every_layer = std::all_of(windows->begin(), windows->end(), [&](int64_t w) { return w == window; });
  const bool one_window = std::all_of(windows->begin(), windows->end(), [&](int64_t w) { return w == 0 || w == window; });
  if (rms_rotary) {
    // Mistral windows every layer; Qwen2 (q, k, v biases) and Qwen3 (qk_norm) the layers their
    // layer_types name; Phi-3's class alone rotates part of each head (the others' rotate_half
    // takes the whole head), and windows every layer too; Gemma's alone scales a tied embedding
    // on input (an untied scaled one goes to the others with the scale in its weights).
    const double fraction = number("fraction", 1.0);
    const int64_t rotated = rotated_dimensions(fraction, m.d_head());
    const auto layer_types = [&] {  // each layer's kind, as transformers 5's configs name them
      json types = json::array();
      for (const int64_t w : *windows) types.push_back(w > 0 ? "sliding_attention" : "full_attention");
      return types;
    };
    const std::string scaling = option("scaling", "none");
    // Which of Llama's kin: the options only some classes compute pick it. OLMo 2's and 3's
    // classes have norms after the sublayers (and no others), with q and k normed over the
    // projection, OLMo 3's windows and a RoPE for its local (windowed) and its global layers; Gemma
    // 2's and 3's norms before and after them, a score scale of their own, the logits capped and
    // windows on any layers, Gemma 2's the scores capped, Gemma 3's q and k normed per head and a
    // RoPE for each kind of layer, as OLMo 3's.
    const bool olmo = m.sublayer_norms == SublayerNorms::output, gemmas = m.sublayer_norms == SublayerNorms::both;
    const bool gemma = m.scale_embedding && m.tie_embeddings && !olmo && !gemmas;
    out.family = olmo     ? (window > 0 || own_positions ? "olmo3" : "olmo2")
                 : gemmas ? (m.qk_norm ? "gemma3_text" : "gemma2")
                 : gemma  ? "gemma"
                 : m.qk_norm     ? "qwen3"
                 : m.qkv_bias    ? "qwen2"
                 : fraction != 1 ? "phi3"
                 : window > 0    ? "mistral"
                                 : "llama";
    const std::string& family = out.family;
    const bool gemma3 = family == "gemma3_text", kind_ropes = gemma3 || family == "olmo3";
    // The two RoPEs of Gemma 3's and OLMo 3's classes: the global layers' and the local ones', each
    // the same on every layer of its kind (where no layer is of one kind, the other's stands for it).
    // (The first layer of each kind stands for the kind; indices, not nodes: a YAML::Node assigned
    // to another becomes it.)
    std::optional<size_t> first_global, first_local;
    bool one_rope_each = true;
    for (size_t l = 0; l < windows->size(); ++l) {
      std::optional<size_t>& first = (*windows)[l] > 0 ? first_local : first_global;
      if (!first) first = l;
      else one_rope_each = one_rope_each && YAML::Dump(shapes->positions[*first]) == YAML::Dump(shapes->positions[l]);
    }
    const YAML::Node global_rope = shapes->positions[first_global.value_or(first_local.value_or(0))];
    const YAML::Node local_rope = shapes->positions[first_local.value_or(first_global.value_or(0))];
    const auto whole_half = [](const YAML::Node& rope) {  // rotate_half over the whole head
      return rope["pairing"] && rope["pairing"].as<std::string>() == "half" &&
             (!rope["fraction"] || rope["fraction"].as<double>() == 1.0);
    };
    // Each option beyond Llama's block that the model has, and the classes that compute it.
    const std::set<std::string> windowed = {"mistral", "phi3", "qwen2", "qwen3", "gemma2", "gemma3_text", "olmo3"};
    require_classes(family, {{m.qkv_bias, {"qwen2"}, "biases on q, k and v"},
                             {m.qk_norm && m.qk_norm_over == QkNormOver::head, {"qwen3", "gemma3_text"},
                              "qk_norm over each head"},
                             {m.qk_norm_over == QkNormOver::projection, {"olmo2", "olmo3"},
                              "qk_norm over the projection (model.qk_norm_over projection)"},
                             {olmo, {"olmo2", "olmo3"}, "norms after the sublayers (model.sublayer_norms output)"},
                             {gemmas, {"gemma2", "gemma3_text"},
                              "norms before and after the sublayers (model.sublayer_norms both)"},
                             {m.scale_embedding && m.tie_embeddings, {"gemma", "gemma2", "gemma3_text"},
                              "a tied embedding scaled by sqrt(d_model) on input"},
                             {fraction != 1, {"phi3"}, "a partial rotary"},
                             {window > 0, windowed, "a sliding window"},
                             {!every_layer, {"qwen2", "qwen3", "gemma2", "gemma3_text", "olmo3"},
                              "sliding windows on some layers only"},
                             {own_positions, {"gemma3_text", "olmo3"},
                              "a layer pattern whose kinds have rotary positions of their own"},
                             {a.softcap > 0, {"gemma2"}, "soft-capped attention scores (attention.softcap)"},
                             {m.logit_softcap > 0, {"gemma2", "gemma3_text"}, "soft-capped logits (model.logit_softcap)"},
                             {a.scale_dim > 0, {"gemma2", "gemma3_text"}, "a score scale of its own (attention.scale_dim)"},
                             {!m.gated_ffn(), {}, "the mlp (Llama's kin gate theirs: swiglu or geglu)"},
                             {m.bias || m.norm_biased(), {}, "biases"},
                             {option("pairing", "interleaved") != "half", {}, "rotary with the interleaved pairing"},
                             {!one_window, {}, "sliding windows of different widths"},
                             {m.block != BlockKind::sequential, {}, "a parallel block"},
                             {m.embedding_norm, {}, "an embedding norm"}});
    // What the chosen class always computes, or cannot take, beside those.
    if (gemmas)
      require_all(family, {{m.scale_embedding, "norms before and after the sublayers (model.sublayer_norms both) "
                                               "without the embedding scaled by sqrt(d_model) (Gemma 2's and 3's "
                                               "classes have both)"},
                           {a.scale_dim == std::floor(a.scale_dim),
                            "attention.scale_dim " + number_text(a.scale_dim) + ", not a whole number (Gemma2Config's "
                            "and Gemma3TextConfig's query_pre_attn_scalar is an int)"}});
    if (olmo)
      require_all(family, {{m.qk_norm && m.qk_norm_over == QkNormOver::projection,
                            "norms after the sublayers without qk_norm over the projection (OLMo 2's and 3's classes "
                            "have both)"}});
    if (kind_ropes)
      require_all(family, {{one_rope_each, "windowed layers, or unwindowed ones, with different rotary options (the "
                                           "class has one RoPE for its local layers and one for its global ones)"},
                           {whole_half(global_rope) && whole_half(local_rope),
                            "a rotary with the interleaved pairing or a partial rotary (the class turns the whole "
                            "head, rotate_half)"}});
    if (gemma)
      require_all(family, {{hidden_act != "gelu",
                            "geglu with GELU's erf form (GemmaConfig reads hidden_act gelu as the tanh form)"}});
    if (family == "phi3")
      require_all(family, {{int64_t(double(m.d_head()) * fraction) == rotated,
                            "a rotated share whose int(d_head x fraction) is not the even count extrap rotates"},
                           {scaling == "none" || scaling == "longrope",
                            "a partial rotary with RoPE scaling " + scaling + " (Phi-3's class takes longrope alone)"},
                           {standard_heads, "a partial rotary with heads other than d_model / heads wide "
                                            "(model.head_dim)"}});
    c.update(gated_block());
    c["rms_norm_eps"] = m.norm_eps;
    if (out.family == "llama") c.update({{"attention_bias", false}, {"mlp_bias", false}});
    if (out.family == "mistral") c["sliding_window"] = window;
    if (out.family == "phi3") {  // its class's own defaults (original length 4096, pad 32000) set
      c["sliding_window"] = window > 0 ? json(window) : json(nullptr);
      c["original_max_position_embeddings"] =
          scaling == "longrope" ? int64_t(number("scaling_length", 0)) : config.train.seq_len;
      c.update({{"pad_token_id", nullptr}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}});
    }
    if (family == "qwen3" || gemma || gemmas || olmo) c["attention_bias"] = false;
    // GemmaConfig's, Gemma2Config's and Gemma3TextConfig's ids (pad 0, eos 1, bos 2) and
    // Olmo2Config's and Olmo3Config's (pad 1, eos 50279) are their tokenizers', not this one's
    if (gemma || gemmas || olmo)
      c.update({{"pad_token_id", nullptr}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}});
    // Gemma 3's and OLMo 3's RoPE for each kind of layer, every layer's kind named, and a width for
    // sliding_window even where no layer slides (their classes build that mask whatever).
    if (kind_ropes)
      c["rope_parameters"] = {{"full_attention", rope_json(global_rope, config)},
                              {"sliding_attention", rope_json(local_rope, config)}};
    if (gemmas || family == "olmo3") {
      c["sliding_window"] = window > 0 ? window : config.train.seq_len;
      c["layer_types"] = layer_types();
    }
    if (gemmas) {
      // Gemma2MLP and Gemma3MLP read hidden_activation (GELU's erf form is "gelu" there: their
      // configs do not read it as the tanh form, as GemmaConfig does); a null cap is off.
      out.embedding_scale = 1.0;  // the class scales the embedding on input, tied or not
      c.erase("hidden_act");
      c["hidden_activation"] = hidden_act;
      c["query_pre_attn_scalar"] = a.scale_dim > 0 ? int64_t(a.scale_dim) : m.d_head();
      c["attn_logit_softcapping"] = a.softcap > 0 ? json(a.softcap) : json(nullptr);
      c["final_logit_softcapping"] = m.logit_softcap > 0 ? json(m.logit_softcap) : json(nullptr);
      c["use_bidirectional_attention"] = false;
    }
    if (out.family == "qwen2" || out.family == "qwen3") {
      c["use_sliding_window"] = window > 0;
      if (window > 0) {
        // layer_types decides (transformers 5); max_window_layers, which older readers use
        // instead, is the first windowed layer (exact where the windowed layers are the last).
        c["sliding_window"] = window;
        c["layer_types"] = layer_types();
        c["max_window_layers"] = std::find(windows->begin(), windows->end(), window) - windows->begin();
      }
    }
  } else if (method == "rotary" && m.norm == NormKind::layernorm && !m.norm_affine) {
    // OLMo's class (modeling_olmo.py): Llama's block with LayerNorms without parameters
    // (OlmoLayerNorm, epsilon 1e-5 always), q, k and v clipped where clip_qkv is set.
    out.family = "olmo";
    require_all(out.family, {{m.norm_eps == 1e-5, "a LayerNorm epsilon other than 1e-5 (OlmoLayerNorm's, fixed)"},
                             {m.gated_ffn(), "the mlp (OLMo's MLP gates: swiglu or geglu)"},
                             {!m.bias && !m.qkv_bias, "biases"},
                             {option("pairing", "interleaved") == "half", "rotary with the interleaved pairing"},
                             {number("fraction", 1.0) == 1.0, "a partial rotary (OLMo's turns the whole head)"},
                             {window == 0, "a sliding window"},
                             {m.block == BlockKind::sequential, "a parallel block"},
                             {!m.embedding_norm, "an embedding norm"}});
    c.update(gated_block());
    c.update({{"attention_bias", false}, {"clip_qkv", m.clip_qkv > 0 ? json(m.clip_qkv) : json(nullptr)},
              // OlmoConfig's ids (pad 1, eos 50279) are its tokenizer's, not this one's
              {"pad_token_id", nullptr}, {"bos_token_id", nullptr}, {"eos_token_id", nullptr}});
  } else if (method == "rotary" && falcon_rotary(config)) {
    // Falcon's class: what GPT-NeoX's lacks (one key-value head or groups, one norm shared by a
    // parallel block, linear layers without biases, a RoPE scaling built in).
    out.family = "falcon";
    require_all(out.family, {{option("pairing", "interleaved") == "half", "rotary with the interleaved pairing"},
                             {number("fraction", 1.0) == 1.0, "a partial rotary (Falcon's turns the whole head)"}});
    c.update(falcon_block(config, window));
    c.update({{"alibi", false}, {"rope_parameters", rope_json(position, config)}});
  } else if (method == "rotary") {
    out.family = "gpt_neox";
    require_all(out.family, {{option("pairing", "interleaved") == "half", "rotary with the interleaved pairing"},
                             {m.ffn == FfnKind::mlp, "a gated ffn"}, {m.bias && m.norm_biased(), "no biases"},
                             {m.key_value_heads() == H, "grouped-query attention"},
                             {m.block != BlockKind::parallel_shared, "one norm shared by attention and ffn"},
                             {!m.embedding_norm, "an embedding norm"}, {window == 0, "a sliding window"},
                             {option("scaling", "none") == "none", "a RoPE scaling built in"},
                             {standard_heads, "heads other than d_model / heads wide (model.head_dim)"}});
    c.update({{"hidden_size", D}, {"num_attention_heads", H}, {"num_hidden_layers", m.layers},
              {"intermediate_size", F}, {"hidden_act", hf_activation(act)}, {"layer_norm_eps", m.norm_eps},
              {"max_position_embeddings", config.train.seq_len}, {"rope_parameters", rope_json(position, config)},
              {"use_parallel_residual", m.block == BlockKind::parallel}, {"attention_bias", true}});
  } else if (method == "learned") {
    out.family = "gpt2";
    require_all(out.family, {{m.norm == NormKind::layernorm && m.bias && m.norm_biased(), "RMSNorm or no biases"},
                             {m.ffn == FfnKind::mlp, "a gated ffn"}, {m.key_value_heads() == H, "grouped-query attention"},
                             {m.block == BlockKind::sequential, "a parallel block"},
                             {!m.embedding_norm, "an embedding norm"}, {window == 0, "a sliding window"},
                             {!m.scale_embedding, "an embedding scaled by sqrt(d_model) beside learned positions"},
                             {standard_heads, "heads other than d_model / heads wide (model.head_dim)"}});
    c.update({{"n_embd", D}, {"n_layer", m.layers}, {"n_head", H}, {"n_inner", F},
              {"n_positions", int64_t(number("max_length", 1024))}, {"activation_function", hf_activation(act)},
              {"layer_norm_epsilon", m.norm_eps}, {"scale_attn_weights", true}});
  } else if (method == "alibi") {
    const bool falcon = position["round_slopes"] && position["round_slopes"].as<bool>();
    require_all("alibi", {{option("round_to", "none") == "none",
                           "ALiBi rounded to " + option("round_to", "none") + " (transformers rounds it only in a "
                           "half-precision run)"}});
    if (falcon) {
      out.family = "falcon";
      require_all(out.family, {{std::abs(number("bias_scale", 1.0) * std::sqrt(double(m.d_head())) - 1) < 1e-12,
                                "bias_scale other than 1/sqrt(d_head) with rounded slopes"}});
      c.update(falcon_block(config, window));
      c["alibi"] = true;
    } else {  // BLOOM's and MPT's blocks
      require_all("alibi", {{m.norm == NormKind::layernorm && m.ffn == FfnKind::mlp && m.block == BlockKind::sequential &&
                                 m.key_value_heads() == H && window == 0,
                             "RMSNorm, a gated ffn, a parallel block, grouped-query attention or a window beside ALiBi"},
                            {F == 4 * D, "a feed-forward width other than 4 d_model"},
                            {standard_heads, "heads other than d_model / heads wide (model.head_dim)"}});
      out.family = m.embedding_norm ? "bloom" : "mpt";
      require_all(out.family, {{number("bias_scale", 1.0) == 1.0, "a scaled ALiBi bias"}});
      if (m.embedding_norm) {
        require_all(out.family, {{m.bias && m.norm_biased() && act == "gelu_tanh",
                                  "no biases, or an activation other than GELU's tanh form"}});
        c.update({{"hidden_size", D}, {"n_layer", m.layers}, {"n_head", H}, {"layer_norm_epsilon", m.norm_eps}});
      } else {
        require_all(out.family, {{!m.bias && !m.norm_biased() && act == "gelu",
                                  "biases, or an activation other than exact GELU"}});
        c.update({{"d_model", D}, {"n_heads", H}, {"n_layers", m.layers}, {"expansion_ratio", 4},
                  {"max_seq_len", config.train.seq_len}, {"no_bias", true}, {"learned_pos_emb", false},
                  {"layer_norm_epsilon", m.norm_eps}, {"norm_type", "low_precision_layernorm"},
                  {"attn_config", {{"alibi", true}, {"alibi_bias_max", 8}, {"attn_impl", "torch"},
                                   {"clip_qkv", m.clip_qkv > 0 ? json(m.clip_qkv) : json(nullptr)}}}});
      }
    }
  } else {
    throw NoTransformersClass("position method " + method);
  }
  // Norms without parameters and clipped q, k, v: OLMo's class, and MPT's the clip.
  require_classes(out.family, {{!m.norm_affine, {"olmo"}, "norms without parameters (model.norm_affine false)"},
                               {m.clip_qkv > 0, {"olmo", "mpt"}, "q, k and v clipped (model.clip_qkv)"}});
  const std::map<std::string, std::string> classes = {
      {"olmo", "OlmoForCausalLM"},     {"llama", "LlamaForCausalLM"},   {"mistral", "MistralForCausalLM"}, {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},   {"phi3", "Phi3ForCausalLM"}, {"gemma", "GemmaForCausalLM"},
      {"gemma2", "Gemma2ForCausalLM"}, {"gemma3_text", "Gemma3ForCausalLM"},
      {"olmo2", "Olmo2ForCausalLM"},   {"olmo3", "Olmo3ForCausalLM"},
      {"gpt2", "GPT2LMHeadModel"},     {"bloom", "BloomForCausalLM"},     {"gpt_neox", "GPTNeoXForCausalLM"},
      {"mpt", "MptForCausalLM"},       {"falcon", "FalconForCausalLM"}};
  c["model_type"] = out.family;
  c["architectures"] = json::array({classes.at(out.family)});
  out.config = c;
  return out;
}

}  // namespace extrap

// ------------------------------------------------------------------------------ the record

namespace extrap {

namespace {

json file_entry(const fs::path& path) {
  const FileDigest d = file_digest(path.string());
  return {{"file", fs::absolute(path).lexically_normal().string()}, {"bytes", d.bytes}, {"xxh3", hex64(d.hash)}};
}

void check_entry(const json& entry, const std::string& where, const std::string& what) {
  const fs::path file = entry.at("file").get<std::string>();
  if (!fs::exists(file))
    throw ConfigError(where + ": the imported " + what + " " + file.string() +
                      " is missing (the checkpoint folder moved or was removed; import it again)");
  const FileDigest d = file_digest(file.string());
  if (d.bytes != entry.at("bytes").get<uint64_t>() || hex64(d.hash) != entry.at("xxh3").get<std::string>())
    throw ConfigError(where + ": the imported " + what + " " + file.string() +
                      " changed since it was imported (" + std::to_string(d.bytes) + " bytes, hash " + hex64(d.hash) +
                      "; recorded " + std::to_string(entry.at("bytes").get<uint64_t>()) + " bytes, " +
                      entry.at("xxh3").get<std::string>() + "); import it again");
}

}  // namespace

json hf_weights_record(const HfModel& hf, const SafetensorsReader& weights) {
  json files = json::array();
  for (const auto& path : weights.files()) files.push_back(file_entry(path));
  return {{"format", 1},
          {"family", hf.family},
          {"source", fs::absolute(hf.dir).lexically_normal().string()},
          {"config_json", file_entry(hf.dir / "config.json")},
          {"weights", files}};
}

std::string hf_weights_digest(const json& record) {
  std::string joined;
  for (const auto& entry : record.at("weights")) joined += entry.at("xxh3").get<std::string>();
  return hex64(content_hash(joined));
}

void load_hf_record(const json& record, const std::string& where, TransformerLM& model) {
  fs::path source;
  try {
    if (record.at("format").get<int>() != 1)
      throw ConfigError(where + ": format " + record.at("format").dump() + ", this extrap reads 1");
    source = record.at("source").get<std::string>();
    check_entry(record.at("config_json"), where, "config");
    for (const auto& entry : record.at("weights")) check_entry(entry, where, "weights file");
  } catch (const json::exception& e) {
    throw ConfigError(where + ": lacks a field (" + std::string(e.what()) + "): damaged");
  }
  const HfModel hf = read_hf_model(source);
  const SafetensorsReader weights = SafetensorsReader::open(source);
  std::vector<std::string> recorded, now;
  for (const auto& entry : record.at("weights")) recorded.push_back(entry.at("file").get<std::string>());
  for (const auto& path : weights.files()) now.push_back(fs::absolute(path).lexically_normal().string());
  if (recorded != now)
    throw ConfigError(where + ": " + source.string() + " now holds other weights files than when it was imported; "
                      "import it again");
  load_hf_weights(hf, weights, model);
}

}  // namespace extrap
