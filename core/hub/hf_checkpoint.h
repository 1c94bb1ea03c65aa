// Released checkpoints: a Hugging Face checkpoint folder (config.json, safetensors weights,
// tokenizer.json) read as an extrap model (`extrap import`, docs/released.md).
//
// Each family maps onto extrap's position methods and architecture options, following the
// family's own modeling code in transformers 5.24 (../shared/REFERENCE.md, "Released families"):
//   llama, mistral, qwen2  RMSNorm, SwiGLU, no biases (qwen2: q, k and v's), grouped-query
//                          attention, rotary with the half pairing (rope_theta, partial_rotary_factor),
//                          an unscaled embedding; mistral's sliding_window as attention.window
//                          (query i sees keys j with i - j < W, as transformers' mask)
//   gpt2                   learned positions (n_positions), LayerNorm, GELU's tanh form
//                          (gelu_new), Conv1D weights stored (in, out): transposed on reading
//   bloom                  ALiBi with the paper's slopes (BLOOM's), a LayerNorm after the
//                          embedding, GELU's tanh form, q, k and v fused per head: (H, 3, Dh) rows
// The model is evaluated in float32 whatever the checkpoint's dtype (float32, float16 and
// bfloat16 weights are widened exactly), as transformers computes with dtype=torch.float32.
//
// Nothing is approximated: a config.json key this mapping does not implement, or implements only
// at another value, is a ConfigError naming the key and its value, as are a missing or surplus
// tensor, a shape that disagrees with the config, and a family not listed.
#pragma once

#include "core/hub/safetensors_reader.h"
#include "core/model/model.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>

namespace extrap {

// A checkpoint folder's config.json, mapped.
struct HfModel {
  std::filesystem::path dir;
  std::string family;       // config.json's model_type
  nlohmann::json config;    // config.json
  int64_t vocab_size = 0;   // the embedding's rows
  int64_t train_length = 0; // max_position_embeddings (or n_positions, seq_length); 0: unknown
  // The extrap config sections the family maps to: model, position, attention, and layers (a
  // pattern of layer kinds: Qwen2's full and sliding layers; empty for the others).
  YAML::Node model, position, attention, layers;
  // Family "extrap" (a folder `extrap export --format hf` wrote with remote code): the exported
  // run's resolved config (extrap_metadata's config) and its vocabulary's hash; the weights are
  // extrap's own tensors, by name. Empty for the other families.
  YAML::Node extrap_config;
  std::string vocabulary_hash;
};

// Reads DIR/config.json and maps it (ConfigError naming DIR/config.json and the key at fault).
HfModel read_hf_model(const std::filesystem::path& dir);

// The families read_hf_model maps, for messages and docs.
const std::vector<std::string>& hf_families();

// Fills every parameter of `model` (built from the mapped config) from the folder's weights:
// each tensor of the folder is used once, widened to the parameter's dtype and copied to its
// device. ConfigError for a missing or surplus tensor or a shape that disagrees.
void load_hf_weights(const HfModel& hf, const SafetensorsReader& weights, TransformerLM& model);

// Out: the transformers family whose own class computes `config`'s model exactly, and the
// config.json that describes it (the inverse of read_hf_model). NoTransformersClass naming the
// first option no family's class has (a method or attention option transformers does not
// compute, an embedding scaled by sqrt(d_model) with tied weights, a rounded ALiBi bias, ...):
// `extrap export --format hf` then ships remote code instead (core/export/hf_export.h).
struct NoTransformersClass : ConfigError {
  explicit NoTransformersClass(const std::string& what)
      : ConfigError("no transformers class computes this model: " + what), reason(what) {}
  std::string reason;  // the option, e.g. "a masked LM"
};
struct HfExportConfig {
  std::string family;
  nlohmann::json config;
  // The input embedding must be multiplied by this (sqrt(d_model) for an untied model with
  // model.scale_embedding; else 1) for the family's class, which does not scale it.
  double embedding_scale = 1.0;
};
HfExportConfig hf_export_config(const Config& config, int64_t vocab_size);

// The model's parameters as the family's class names and lays them out (float32, CPU), the
// input embedding times `embedding_scale` (HfExportConfig's).
std::vector<std::pair<std::string, torch::Tensor>> hf_tensors(const std::string& family, TransformerLM& model,
                                                              double embedding_scale = 1.0);

// An imported run's record of its weights (RUN/checkpoint/weights.json): the folder, and the
// size and XXH3 hash of its config.json and of every weights file. The weights stay in the
// folder; nothing is copied.
nlohmann::json hf_weights_record(const HfModel& hf, const SafetensorsReader& weights);
// A short digest of the record's weights files (hex64 over their hashes in order): the report's
// "weights digest".
std::string hf_weights_digest(const nlohmann::json& record);
// Verifies `record` against the folder as it is now (ConfigError naming the file that changed,
// moved or went missing, and `where`, the record's own file) and loads its weights into `model`.
void load_hf_record(const nlohmann::json& record, const std::string& where, TransformerLM& model);

}  // namespace extrap
