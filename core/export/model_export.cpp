#include "core/export/model_export.h"

#include "core/base/files.h"
#include "core/base/version.h"
#include "core/data/sentencepiece.h"
#include "core/export/safetensors.h"
#include "core/run/run_dir.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace extrap {
namespace {

// A YAML value as typed JSON: true/false, integers and numbers become JSON booleans and
// numbers (YAML's own reading of a plain scalar), anything else a string.
json yaml_to_json(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      json out = json::object();
      for (const auto& item : node) out[item.first.as<std::string>()] = yaml_to_json(item.second);
      return out;
    }
    case YAML::NodeType::Sequence: {
      json out = json::array();
      for (const auto& item : node) out.push_back(yaml_to_json(item));
      return out;
    }
    case YAML::NodeType::Scalar: {
      const std::string text = node.Scalar();
      if (node.Tag() != "!") {  // a plain (unquoted) scalar
        bool b;
        if (YAML::convert<bool>::decode(node, b)) return b;
        char* end = nullptr;
        const long long i = std::strtoll(text.c_str(), &end, 10);
        if (!text.empty() && *end == '\0') return int64_t(i);
        const double d = std::strtod(text.c_str(), &end);
        if (!text.empty() && *end == '\0' && std::isfinite(d)) return d;
      }
      return text;
    }
    default:
      return nullptr;
  }
}

// Format 8's key only where it is set, so that a file without it stays readable by format 7's readers.
json model_json(const ModelConfig& m) {
  json out = {{"layers", m.layers},
              {"d_model", m.d_model},
              {"heads", m.heads},
              {"kv_heads", m.key_value_heads()},  // resolved: heads without grouped-query attention
              {"d_head", m.d_head()},             // resolved: d_model / heads without model.head_dim
              {"d_ffn", m.ffn_width()},           // resolved: the hidden width, also where d_ffn 0 asked for the rule
              {"ffn", enum_name(m.ffn)},
              {"activation", enum_name(m.activation)},
              {"norm", enum_name(m.norm)},
              {"norm_eps", m.norm_eps},
              {"bias", m.bias},
              {"norm_bias", m.norm_biased()},
              {"qkv_bias", m.qkv_bias},
              {"scale_embedding", m.scale_embedding},
              {"block", enum_name(m.block)},
              {"qk_norm", m.qk_norm},
              {"qk_norm_over", enum_name(m.qk_norm_over)},
              {"sublayer_norms", enum_name(m.sublayer_norms)},
              {"embedding_norm", m.embedding_norm},
              {"tie_embeddings", m.tie_embeddings},
              {"final_norm", m.final_norm},
              {"adaptive_cutoffs", m.adaptive_cutoffs},  // [] without adaptive bands (core/model/adaptive.h)
              {"adaptive_factor", m.adaptive_factor},
              {"objective", enum_name(m.objective)},
              {"causal", m.causal()},
              {"layer_norm_eps", m.norm_eps}};  // norm_eps under format 1's name
  if (m.logit_softcap > 0) out["logit_softcap"] = m.logit_softcap;
  // Format 9's keys only where they differ from the defaults (format 8's readers refuse unknown keys).
  if (!m.norm_affine) out["norm_affine"] = false;
  if (m.clip_qkv > 0) out["clip_qkv"] = m.clip_qkv;
  return out;
}

// The attention options every layer takes (their tensors: blocks.L.attention.sink, .ssmax and
// .gate.weight).
json attention_json(const AttentionConfig& a) {
  json out = {{"sink", a.sink},
              {"ssmax", a.ssmax},
              {"temperature", a.temperature},
              {"temperature_floor", a.temperature_floor},
              {"gate", enum_name(a.gate)},
              {"window", a.window},
              {"chunk", a.chunk}};
  // Format 8's keys only where they are set (format 7's readers refuse unknown keys).
  if (a.softcap > 0) out["softcap"] = a.softcap;
  if (a.scale_dim > 0) out["scale_dim"] = a.scale_dim;
  return out;
}

json data_json(const Config& config, const Corpus& corpus) {
  return {{"path", config.data.path},
          {"name", corpus.name},
          {"tokenizer", enum_name(corpus.tokenizer)},
          {"vocab_size", corpus.vocab_size},
          {"mask_token", corpus.mask_token},
          {"eos_token", corpus.eos_token},
          {"unk_token", corpus.unk_token}};
}

}  // namespace

std::string vocabulary_json(const Corpus& corpus) {
  json list = json::array();
  for (const auto& word : corpus.vocabulary) list.push_back(word);
  try {
    return list.dump();
  } catch (const json::exception&) {
    for (size_t id = 0; id < corpus.vocabulary.size(); ++id) {
      try {
        (void)json(corpus.vocabulary[id]).dump();
      } catch (const json::exception&) {
        throw ConfigError("the vocabulary's token " + std::to_string(id) +
                          " is not valid UTF-8, so it cannot be exported as JSON text");
      }
    }
    throw;
  }
}

std::string resolved_position_options(const std::string& method, const YAML::Node& options) {
  const PositionInfo& info = PositionRegistry::instance().get(method);
  json out = json::object();
  for (const OptionDoc& doc : info.options) {
    const YAML::Node given = options.IsMap() ? options[doc.key] : YAML::Node();
    if (doc.section)  // a section of another method's options (dape's base_options): as given
      out[doc.key] = given && given.IsMap() ? yaml_to_json(given) : json::object();
    else
      out[doc.key] = yaml_to_json(given ? given : YAML::Load(doc.default_value));
  }
  return out.dump();
}

std::string resolved_position_options(const Config& config) {
  return resolved_position_options(config.position_name, config.position);
}

ExportSummary export_run(const fs::path& run_dir, const fs::path& out, const ExportOptions& options) {
  if (out.empty() || !out.has_filename())
    throw ConfigError("--out '" + out.string() + "': name the .safetensors file to write");
  if (fs::is_directory(out))
    throw ConfigError("--out " + out.string() + ": is a directory; name the .safetensors file to write");
  refuse_run_file(out, "--out");
  refuse_run_file(out.string() + ".tokenizer.model", "--out");  // the companions written beside it
  refuse_run_file(out.string() + ".vocab.json", "--out");
  refuse_run_file(out.string() + ".tokenizer.json", "--out");
  if (fs::exists(out) && !options.overwrite)
    throw ConfigError(out.string() + " exists (add --overwrite to replace it)");
  check_output_folder(out, "--out " + out.string());

  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  const Corpus corpus = load_corpus(checkpoint.config.data);
  LoadedRun run = load_run(checkpoint, corpus);  // loads the config's plugins, if any
  return write_export(checkpoint, corpus, run, out, options);
}

ExportSummary write_export(const VerifiedCheckpoint& checkpoint, const Corpus& corpus, LoadedRun& run,
                           const fs::path& out, const ExportOptions& options) {
  const Config& config = checkpoint.config;
  const LayerPlan plan = layer_plan(config);

  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (const auto& item : run.model->named_parameters()) tensors.emplace_back(item.key(), item.value());
  for (const auto& item : run.model->named_buffers()) tensors.emplace_back(item.key(), item.value());
  for (const auto& [name, tensor] : tensors)
    if (tensor.is_floating_point() && !torch::isfinite(tensor).all().item<bool>())
      throw ConfigError(checkpoint.dir.string() + ": tensor " + name +
                        " has non-finite values; refusing to export it");

  std::map<std::string, std::string> metadata;
  // Format 3 only where a reader of format 2 would misread the model: an unscaled embedding, q, k
  // and v biases alone, GELU's tanh form; format 4 where a reader of 3 would: norms whose biases
  // differ from the linear layers'; format 5 where a reader of 4 would: heads other than d_model /
  // heads wide; format 6 where a reader of 5 would: geglu gating with GELU's tanh form; format 7
  // where a reader of 6 would: norms after the sublayers, qk_norm over the projection; format 8
  // where a reader of 7 would: soft-capped attention or output logits, a score scale of its own;
  // format 9 where a reader of 8 would: norms without parameters, q, k and v clipped.
  // Other files stay format 2, readable as before.
  const ModelConfig& m = config.model;
  const bool format3 = !m.scale_embedding || m.qkv_bias || m.activation == Activation::gelu_tanh;
  const bool format7 = m.sublayer_norms != SublayerNorms::input || m.qk_norm_over != QkNormOver::head;
  bool format8 = m.logit_softcap > 0;
  for (const LayerKind& kind : plan.kinds) format8 = format8 || kind.attention.softcap > 0 || kind.attention.scale_dim > 0;
  const bool format9 = !m.norm_affine || m.clip_qkv > 0;
  metadata["format"] = format9   ? "extrap-safetensors/9"
                       : format8 ? "extrap-safetensors/8"
                       : format7 ? "extrap-safetensors/7"
                       : m.ffn == FfnKind::geglu && m.activation == Activation::gelu_tanh ? "extrap-safetensors/6"
                       : m.d_head() * m.heads != m.d_model ? "extrap-safetensors/5"
                       : m.norm_biased() != m.bias       ? "extrap-safetensors/4"
                       : format3                  ? "extrap-safetensors/3"
                                                  : "extrap-safetensors/2";
  metadata["extrap_version"] = extrap_version();
  if (plan.patterned()) {  // each kind's method, options, tensors' description and attention options
    json kinds = json::object();
    for (const LayerKind& kind : plan.kinds)
      kinds[kind.name] = {{"position", kind.position_name},
                          {"position_options", json::parse(resolved_position_options(kind.position_name, kind.position))},
                          {"position_tensors", PositionRegistry::instance().get(kind.position_name).tensors},
                          {"attention", attention_json(kind.attention)}};
    metadata["position"] = "pattern";
    metadata["layers"] = json{{"pattern", config.layer_pattern}, {"kinds", kinds}}.dump();
  } else {
    metadata["position"] = config.position_name;
    metadata["position_options"] = resolved_position_options(config);
    metadata["position_tensors"] = PositionRegistry::instance().get(config.position_name).tensors;
    metadata["attention"] = attention_json(config.model.attention_options).dump();
  }
  metadata["model"] = model_json(config.model).dump();
  metadata["data"] = data_json(config, corpus).dump();
  metadata["train"] = json{{"seq_len", config.train.seq_len},
                           {"mask_prob", config.train.mask_prob},
                           {"steps", run.step}}.dump();
  metadata["eval"] = json{{"mask_prob", config.train.mask_prob},
                          {"mask_seed", config.eval.mask_seed}}.dump();
  metadata["checkpoint"] = json{{"step", checkpoint.manifest.step},
                                {"fingerprint", checkpoint.manifest.fingerprint},
                                {"vocabulary_hash", checkpoint.manifest.vocabulary}}.dump();
  YAML::Emitter yaml;
  yaml << config.to_yaml();
  metadata["config"] = yaml.c_str();

  ExportSummary summary;
  summary.file = out;
  summary.step = run.step;
  summary.tensors = tensors.size();
  if (corpus.sentencepiece) {  // the .model file itself, which Python's sentencepiece reads
    summary.vocabulary_file = fs::path(out.string() + ".tokenizer.model");
    write_file_atomic(summary.vocabulary_file, corpus.sentencepiece->bytes());
    metadata["tokenizer_model_file"] = summary.vocabulary_file.filename().string();
  }
  if (corpus.hf_json) {  // the tokenizer.json itself, which Python's tokenizers reads
    summary.vocabulary_file = fs::path(out.string() + ".tokenizer.json");
    write_file_atomic(summary.vocabulary_file, *corpus.hf_json);
    metadata["tokenizer_json_file"] = summary.vocabulary_file.filename().string();
  }
  if (corpus.word_level()) {
    std::string words = vocabulary_json(corpus);
    if (words.size() <= options.inline_vocabulary_bytes) {
      metadata["vocabulary"] = std::move(words);
    } else {
      summary.vocabulary_file = fs::path(out.string() + ".vocab.json");
      write_file_atomic(summary.vocabulary_file, words);
      metadata["vocabulary_file"] = summary.vocabulary_file.filename().string();
    }
  }
  const std::string bytes = encode_safetensors(tensors, metadata);
  write_file_atomic(out, bytes);
  summary.bytes = bytes.size();
  summary.metadata = std::move(metadata);
  return summary;
}

}  // namespace extrap
