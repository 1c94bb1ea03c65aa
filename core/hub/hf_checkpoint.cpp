#include "core/hub/hf_checkpoint.h"

#include "core/base/errors.h"
#include "core/base/files.h"
#include "core/base/hashing.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace extrap {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Keys that change no number of a forward pass in evaluation: identity, generation, training
// and serving settings, dropout (off in evaluation).
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
      "tie_encoder_decoder", "is_decoder", "quantization_config_skip", "keys_to_ignore_at_inference"};
  return keys;
}

class ConfigReader {
 public:
  ConfigReader(const json& config, std::string where) : config_(config), where_(std::move(where)) {}

  bool has(const std::string& key) const { return config_.contains(key) && !config_.at(key).is_null(); }
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
// theta_key and fraction_key: where a family's older configs keep the base and the rotated
// share (GPT-NeoX: rotary_emb_base, rotary_pct); `fraction` is the family's default share.
void read_rope(const ConfigReader& c, YAML::Node& position, int64_t head_dim, double fraction = 1.0,
               const std::string& theta_key = "rope_theta", const std::string& fraction_key = "partial_rotary_factor") {
  double theta = 10000.0;
  std::string type = "default", where = "rope_parameters";
  if (c.has("rope_parameters")) {
    const json& p = c.at("rope_parameters");
    if (!p.is_object()) c.fail("rope_parameters", "must be an object");
    type = p.value("rope_type", p.value("type", std::string("default")));
    for (const auto& [key, value] : p.items()) {
      if (key == "rope_theta") theta = value.get<double>();
      else if (key == "partial_rotary_factor") fraction = value.get<double>();
      else if (key == "rope_type" || key == "type" || value.is_null() || type != "default") continue;
      else c.fail("rope_parameters." + key, value.dump() + " is not imported");
    }
  } else {
    theta = c.get<double>(c.has(theta_key) ? theta_key : "rope_theta", 10000.0);
    c.use("rope_theta");
    c.use(theta_key);
    if (c.has("rope_scaling")) {
      const json& s = c.at("rope_scaling");
      type = s.value("rope_type", s.value("type", std::string("default")));
      where = "rope_scaling";
    } else {
      c.use("rope_scaling");
    }
  }
  for (const std::string& key : {fraction_key, std::string("partial_rotary_factor")}) {
    if (c.has(key)) fraction = c.get<double>(key);
    c.use(key);
  }
  if (type != "default")
    c.fail(where, "rope_type \"" + type + "\": RoPE scaling written into config.json is not imported yet; "
           "import a checkpoint without it and pass `extrap eval --rope-scaling` instead");
  if (!(theta > 1) || !std::isfinite(theta)) c.fail("rope_theta", std::to_string(theta) + " must be above 1");
  const double rotated = std::floor(fraction * double(head_dim) / 2.0 + 1e-9) * 2.0;
  if (!(fraction > 0 && fraction <= 1) || rotated < 2)
    c.fail(fraction_key, std::to_string(fraction) + " rotates no pair of the head's dimensions");
  position["name"] = "rotary";
  position["base"] = theta;
  position["pairing"] = "half";
  if (fraction != 1.0) position["fraction"] = fraction;
}

void map_llama(const ConfigReader& c, HfModel& hf) {
  const int64_t D = positive(c, "hidden_size"), H = positive(c, "num_attention_heads");
  const int64_t Hkv = c.has("num_key_value_heads") ? positive(c, "num_key_value_heads") : H;
  c.use("num_key_value_heads");
  if (D % H != 0) c.fail("num_attention_heads", std::to_string(H) + " does not divide hidden_size " + std::to_string(D));
  if (H % Hkv != 0) c.fail("num_key_value_heads", std::to_string(Hkv) + " does not divide num_attention_heads");
  if (c.has("head_dim") && c.get<int64_t>("head_dim") != D / H)
    c.fail("head_dim", std::to_string(c.get<int64_t>("head_dim")) + " differs from hidden_size / num_attention_heads = " +
                           std::to_string(D / H) + ", which extrap's attention assumes");
  c.use("head_dim");
  c.require<std::string>("hidden_act", "silu", "SwiGLU gates with SiLU");
  c.require<bool>("mlp_bias", false, "no biases in the MLP");
  c.require<bool>("attention_bias", false, "no biases in the attention projections");
  c.require<int64_t>("pretraining_tp", 1, "tensor-parallel slicing");
  hf.model["layers"] = positive(c, "num_hidden_layers");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  if (Hkv != H) hf.model["kv_heads"] = Hkv;
  hf.model["d_ffn"] = positive(c, "intermediate_size");
  hf.model["ffn"] = "swiglu";
  hf.model["norm"] = "rmsnorm";
  hf.model["norm_eps"] = c.get<double>("rms_norm_eps", 1e-6);
  hf.model["bias"] = false;
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", false);
  hf.train_length = c.get<int64_t>("max_position_embeddings", 0);
  read_rope(c, hf.position, D / H);
  if (hf.family == "mistral") {
    if (c.has("sliding_window")) hf.attention["window"] = positive(c, "sliding_window");
    c.use("sliding_window");
  }
  if (hf.family == "qwen2") {
    hf.model["qkv_bias"] = true;
    c.require<bool>("use_sliding_window", false, "sliding windows in some layers");
    c.use("sliding_window");    // unused while use_sliding_window is false
    c.use("max_window_layers");
    if (c.has("layer_types"))
      for (const auto& kind : c.at("layer_types"))
        if (kind != "full_attention")
          c.fail("layer_types", "lists " + kind.dump() + ": only full_attention layers are imported");
    c.use("layer_types");
  }
}

void map_gpt2(const ConfigReader& c, HfModel& hf) {
  const int64_t D = positive(c, "n_embd"), H = positive(c, "n_head");
  if (D % H != 0) c.fail("n_head", std::to_string(H) + " does not divide n_embd " + std::to_string(D));
  const std::string act = c.get<std::string>("activation_function", "gelu_new");
  const std::map<std::string, std::string> acts = {
      {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"gelu", "gelu"}, {"relu", "relu"}};
  if (!acts.count(act)) c.fail("activation_function", "\"" + act + "\" is not imported (gelu_new, gelu, relu are)");
  c.require<bool>("scale_attn_weights", true, "scores divided by sqrt(head dim)");
  c.require<bool>("scale_attn_by_inverse_layer_idx", false, "scores divided by the layer's number");
  c.require<bool>("add_cross_attention", false, "cross-attention");
  hf.model["layers"] = positive(c, "n_layer");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  hf.model["d_ffn"] = c.has("n_inner") ? positive(c, "n_inner") : 4 * D;
  c.use("n_inner");
  hf.model["activation"] = acts.at(act);
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
  const std::string act = c.get<std::string>("hidden_act", "gelu");
  const std::map<std::string, std::string> acts = {
      {"gelu", "gelu"}, {"gelu_new", "gelu_tanh"}, {"gelu_pytorch_tanh", "gelu_tanh"}, {"relu", "relu"}};
  if (!acts.count(act)) c.fail("hidden_act", "\"" + act + "\" is not imported (gelu, gelu_new, relu are)");
  c.require<bool>("attention_bias", true, "attention projections without biases beside an MLP with them");
  hf.model["layers"] = positive(c, "num_hidden_layers");
  hf.model["d_model"] = D;
  hf.model["heads"] = H;
  hf.model["d_ffn"] = positive(c, "intermediate_size");
  hf.model["activation"] = acts.at(act);
  hf.model["norm_eps"] = c.get<double>("layer_norm_eps", 1e-5);
  hf.model["block"] = c.get<bool>("use_parallel_residual", true) ? "parallel" : "sequential";
  hf.model["tie_embeddings"] = c.get<bool>("tie_word_embeddings", false);
  hf.train_length = c.get<int64_t>("max_position_embeddings", 0);
  c.use("classifier_dropout");
  // transformers 5.24: rotary_pct absent means 0.25 (configuration_gpt_neox.py), not the whole head.
  read_rope(c, hf.position, D / H, 0.25, "rotary_emb_base", "rotary_pct");
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
  attn("clip_qkv", nullptr, "q, k and v clipped");
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

using Mapper = void (*)(const ConfigReader&, HfModel&);
const std::map<std::string, Mapper>& mappers() {
  static const std::map<std::string, Mapper> m = {
      {"llama", map_llama}, {"mistral", map_llama}, {"qwen2", map_llama}, {"gpt2", map_gpt2}, {"bloom", map_bloom},
      {"gpt_neox", map_gpt_neox}, {"mpt", map_mpt}};
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
  const auto it = mappers().find(hf.family);
  if (it == mappers().end()) {
    std::string known;
    for (const auto& name : hf_families()) known += (known.empty() ? "" : ", ") + name;
    c.fail("model_type", "\"" + hf.family + "\" is not a family extrap imports (" + known + ")");
  }
  hf.model = YAML::Node(YAML::NodeType::Map);
  hf.position = YAML::Node(YAML::NodeType::Map);
  hf.attention = YAML::Node(YAML::NodeType::Map);
  hf.model["scale_embedding"] = false;
  hf.model["dropout"] = 0.0;
  hf.vocab_size = positive(c, "vocab_size");
  it->second(c, hf);
  c.finish(hf.family);
  return hf;
}

// ----------------------------------------------------------------------------------- weights

namespace {

// Where each extrap parameter comes from: the folder's tensors and how they combine.
struct Source {
  std::vector<std::string> names;
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> combine;
};
using WeightPlan = std::map<std::string, Source>;

Source same(const std::string& name) {
  return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0]; }};
}
Source transposed(const std::string& name) {  // GPT-2's Conv1D: (in, out)
  return {{name}, [](const std::vector<torch::Tensor>& t) { return t[0].t(); }};
}
Source concatenated(std::vector<std::string> names) {
  return {std::move(names), [](const std::vector<torch::Tensor>& t) { return torch::cat(t, 0); }};
}
// BLOOM: rows (H, 3, Dh) -> extrap's (3, H, Dh).
Source per_head_qkv(const std::string& name, int64_t heads) {
  return {{name}, [heads](const std::vector<torch::Tensor>& t) {
            auto x = t[0];
            auto sizes = x.sizes().vec();
            auto rest = std::vector<int64_t>(sizes.begin() + 1, sizes.end());
            std::vector<int64_t> view = {heads, 3, sizes[0] / (3 * heads)};
            view.insert(view.end(), rest.begin(), rest.end());
            auto y = x.reshape(view).transpose(0, 1).contiguous();
            return y.reshape(sizes);
          }};
}

// The folder's names have a prefix (model., transformer.) or none, as the class saved them.
std::string find_prefix(const SafetensorsReader& w, const std::string& probe, const std::vector<std::string>& prefixes) {
  for (const auto& p : prefixes)
    if (w.contains(p + probe)) return p;
  throw ConfigError(w.where() + ": has no tensor " + prefixes.front() + probe +
                    " (nor without its prefix): not the weights of this config's family");
}

WeightPlan llama_plan(const HfModel& hf, const SafetensorsReader& w, const TransformerLM& model) {
  const std::string p = find_prefix(w, "embed_tokens.weight", {"model.", ""});
  const auto& m = model->config();
  const bool qkv_bias = m.qkv_bias;
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "embed_tokens.weight");
  plan["ln_final.weight"] = same(p + "norm.weight");
  if (!m.tie_embeddings) plan["head.weight"] = same("lm_head.weight");
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string s = p + "layers." + std::to_string(l) + ".", e = "blocks." + std::to_string(l) + ".";
    plan[e + "ln_attention.weight"] = same(s + "input_layernorm.weight");
    plan[e + "ln_ffn.weight"] = same(s + "post_attention_layernorm.weight");
    plan[e + "attention.qkv.weight"] =
        concatenated({s + "self_attn.q_proj.weight", s + "self_attn.k_proj.weight", s + "self_attn.v_proj.weight"});
    if (qkv_bias)
      plan[e + "attention.qkv.bias"] =
          concatenated({s + "self_attn.q_proj.bias", s + "self_attn.k_proj.bias", s + "self_attn.v_proj.bias"});
    plan[e + "attention.out.weight"] = same(s + "self_attn.o_proj.weight");
    plan[e + "ffn_in.weight"] = concatenated({s + "mlp.gate_proj.weight", s + "mlp.up_proj.weight"});
    plan[e + "ffn_out.weight"] = same(s + "mlp.down_proj.weight");
  }
  (void)hf;
  return plan;
}

WeightPlan gpt2_plan(const HfModel&, const SafetensorsReader& w, const TransformerLM& model) {
  const std::string p = find_prefix(w, "wte.weight", {"transformer.", ""});
  const auto& m = model->config();
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

// BLOOM's and GPT-NeoX's blocks: LayerNorms and linear layers with biases, q, k and v fused per
// head. `layers` is where layer l's tensors start ("h.", "layers."), `attention` its attention's.
void add_per_head_blocks(WeightPlan& plan, const std::string& layers, const std::string& attention,
                         const ModelConfig& m) {
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string s = layers + std::to_string(l) + ".", e = "blocks." + std::to_string(l) + ".";
    for (const std::string x : {"weight", "bias"}) {
      plan[e + "ln_attention." + x] = same(s + "input_layernorm." + x);
      plan[e + "ln_ffn." + x] = same(s + "post_attention_layernorm." + x);
      plan[e + "attention.qkv." + x] = per_head_qkv(s + attention + ".query_key_value." + x, m.heads);
      plan[e + "attention.out." + x] = same(s + attention + ".dense." + x);
      plan[e + "ffn_in." + x] = same(s + "mlp.dense_h_to_4h." + x);
      plan[e + "ffn_out." + x] = same(s + "mlp.dense_4h_to_h." + x);
    }
  }
}

WeightPlan bloom_plan(const HfModel&, const SafetensorsReader& w, const TransformerLM& model) {
  const std::string p = find_prefix(w, "word_embeddings.weight", {"transformer.", ""});
  const auto& m = model->config();
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "word_embeddings.weight");
  plan["embedding_norm.weight"] = same(p + "word_embeddings_layernorm.weight");
  plan["embedding_norm.bias"] = same(p + "word_embeddings_layernorm.bias");
  plan["ln_final.weight"] = same(p + "ln_f.weight");
  plan["ln_final.bias"] = same(p + "ln_f.bias");
  if (!m.tie_embeddings) plan["head.weight"] = same("lm_head.weight");
  add_per_head_blocks(plan, p + "h.", "self_attention", m);
  return plan;
}

WeightPlan gpt_neox_plan(const HfModel&, const SafetensorsReader& w, const TransformerLM& model) {
  const std::string p = find_prefix(w, "embed_in.weight", {"gpt_neox.", ""});
  const auto& m = model->config();
  WeightPlan plan;
  plan["embedding.weight"] = same(p + "embed_in.weight");
  plan["ln_final.weight"] = same(p + "final_layer_norm.weight");
  plan["ln_final.bias"] = same(p + "final_layer_norm.bias");
  if (!m.tie_embeddings) plan["head.weight"] = same("embed_out.weight");
  add_per_head_blocks(plan, p + "layers.", "attention", m);
  return plan;
}

WeightPlan mpt_plan(const HfModel&, const SafetensorsReader& w, const TransformerLM& model) {
  const std::string p = find_prefix(w, "wte.weight", {"transformer.", ""});
  const auto& m = model->config();
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

}  // namespace

void load_hf_weights(const HfModel& hf, const SafetensorsReader& weights, TransformerLM& model) {
  WeightPlan plan;
  if (hf.family == "llama" || hf.family == "mistral" || hf.family == "qwen2") plan = llama_plan(hf, weights, model);
  else if (hf.family == "gpt2") plan = gpt2_plan(hf, weights, model);
  else if (hf.family == "bloom") plan = bloom_plan(hf, weights, model);
  else if (hf.family == "gpt_neox") plan = gpt_neox_plan(hf, weights, model);
  else if (hf.family == "mpt") plan = mpt_plan(hf, weights, model);
  else throw ConfigError(hf.dir.string() + ": no weight mapping for family " + hf.family);

  std::set<std::string> used;
  torch::NoGradGuard no_grad;
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
  }
  // Tied embeddings: a saved copy of the head must be the embedding itself.
  for (const std::string head : {"lm_head.weight", "embed_out.weight"}) {
    if (!model->config().tie_embeddings || !weights.contains(head) || used.count(head)) continue;
    if (!weights.tensor(head).equal(weights.tensor(plan.at("embedding.weight").names.front())))
      throw ConfigError(weights.where() + ": " + head + " differs from the input embedding, but config.json ties "
                        "them (tie_word_embeddings)");
    used.insert(head);
  }
  for (const auto& name : weights.names())
    if (!used.count(name) && !computed_buffer(name))
      throw ConfigError(weights.where() + ": tensor " + name + " is not used by extrap's " + hf.family +
                        " model: config.json does not describe these weights, or the mapping lacks a part");
  for (const auto& item : model->named_parameters())
    if (!torch::isfinite(item.value()).all().item<bool>())
      throw ConfigError(weights.where() + ": non-finite values in the tensor(s) for " + item.key());
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
