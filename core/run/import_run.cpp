#include "core/run/import_run.h"

#include "core/base/errors.h"
#include "core/base/files.h"
#include "core/base/hashing.h"
#include "core/hub/hf_checkpoint.h"
#include "core/run/checkpoint.h"
#include "core/run/run_dir.h"

namespace extrap {

namespace fs = std::filesystem;

namespace {

// The import's config, with the family's mapping it came from.
struct ImportPlan {
  HfModel hf;
  Config config;
};

// Both kinds of import end alike: trained length L, RUN as out_dir, evaluation at L, 2L and 4L,
// then the --set assignments over it all.
Config finish_config(YAML::Node root, int64_t length, const fs::path& folder, const fs::path& run,
                     const ImportOptions& options) {
  root["train"]["seq_len"] = length;
  // Nothing is trained: a step's tokens need only hold one sequence of L (a released model's L,
  // 32768 or 131072, is past the default's 8192; set only then, so other imports' identities stay).
  if (length > TrainConfig().batch_tokens) root["train"]["batch_tokens"] = length;
  root["train"]["out_dir"] = run.string();
  root["eval"]["lengths"] = std::vector<int64_t>{length, 2 * length, 4 * length};
  for (const auto& assignment : options.set) apply_override(root, assignment);
  return config_from_yaml(root, "extrap import " + folder.string());
}

// A folder of extrap's remote code: the exported run's config, evaluated on --data with the
// tokenizer it was trained with (a SentencePiece model or tokenizer.json from the folder).
Config extrap_import_config(const HfModel& hf, const fs::path& folder, const fs::path& run, const ImportOptions& options) {
  if (options.alibi_bias != "family")
    throw ConfigError("--alibi-bias " + options.alibi_bias + ": " + folder.string() + " is an extrap model, which "
                      "computes its ALiBi as it was trained");
  YAML::Node root = YAML::Clone(hf.extrap_config);
  YAML::Node data = root["data"];
  const std::string tokenizer = data["tokenizer"] ? data["tokenizer"].as<std::string>() : "byte";
  data["path"] = options.data;
  data.remove("cache_dir");
  const auto from_folder = [&](const std::string& name) {
    const fs::path file = folder / name;
    if (!fs::exists(file)) throw ConfigError(folder.string() + ": no " + name + " (the " + tokenizer + " tokenizer "
                                             "the model was trained with)");
    data["tokenizer_model"] = fs::absolute(file).lexically_normal().string();
  };
  if (tokenizer == "sentencepiece") from_folder("model.safetensors.tokenizer.model");
  if (tokenizer == "hf") from_folder("tokenizer.json");
  return finish_config(root, options.train_length > 0 ? options.train_length : hf.train_length, folder, run, options);
}

ImportPlan plan_import(const fs::path& folder, const fs::path& run, const ImportOptions& options) {
  if (options.data.empty()) throw ConfigError("--data: name the corpus the imported model is evaluated on");
  if (run.empty()) throw ConfigError("--out: name the run directory to write");
  HfModel hf = read_hf_model(folder);
  if (hf.family == "extrap") return {hf, extrap_import_config(hf, folder, run, options)};
  const std::string& rounding = options.alibi_bias;
  if (rounding != "family") {
    if (hf.position["name"].as<std::string>() != "alibi")
      throw ConfigError("--alibi-bias " + rounding + ": " + folder.string() + " is a " + hf.family +
                        " model, without ALiBi");
    if (rounding == "exact") {
      hf.position.remove("round_slopes");
      hf.position.remove("round_to");
    } else if (rounding == "bfloat16" || rounding == "float16") {
      hf.position.remove("round_slopes");
      hf.position["round_to"] = rounding;
    } else {
      throw ConfigError("--alibi-bias " + rounding + ": not one of family, exact, bfloat16, float16");
    }
  }
  const fs::path tokenizer = folder / "tokenizer.json";
  if (!fs::exists(tokenizer)) {
    // transformers itself reads a lone tokenizer.model by converting it to tokenizer.json's
    // form; extrap reads that form, so that its ids are transformers' ids.
    const std::string how = "python -c \"from transformers import AutoTokenizer as T; T.from_pretrained('" +
                            folder.string() + "').save_pretrained('" + folder.string() + "')\"";
    throw ConfigError(folder.string() + ": no tokenizer.json" +
                      (fs::exists(folder / "tokenizer.model")
                           ? " (only a SentencePiece tokenizer.model: write the tokenizer.json transformers converts it "
                             "to, with " + how + ")"
                           : " (extrap reads Hugging Face tokenizer.json files; save the tokenizer with "
                             "save_pretrained)"));
  }
  int64_t length = options.train_length > 0 ? options.train_length : hf.train_length;
  if (length <= 0)
    throw ConfigError((folder / "config.json").string() + ": gives no training length (max_position_embeddings); "
                      "pass --train-length N");
  if (hf.family == "gpt2" && length > hf.train_length)
    throw ConfigError("--train-length " + std::to_string(length) + ": GPT-2's learned positions end at n_positions " +
                      std::to_string(hf.train_length));

  YAML::Node root(YAML::NodeType::Map);
  root["data"]["path"] = options.data;
  root["data"]["tokenizer"] = "hf";
  root["data"]["tokenizer_model"] = fs::absolute(tokenizer).lexically_normal().string();
  root["data"]["vocab_size"] = hf.vocab_size;
  root["model"] = hf.model;
  root["position"] = hf.position;
  if (hf.attention.size() > 0) root["attention"] = hf.attention;
  if (hf.layers.size() > 0) root["layers"] = hf.layers;
  Config config = finish_config(root, length, folder, run, options);
  return {std::move(hf), std::move(config)};
}

}  // namespace

Config imported_config(const fs::path& folder, const fs::path& run, const ImportOptions& options) {
  return plan_import(folder, run, options).config;
}

ImportSummary import_checkpoint(const fs::path& folder, const fs::path& run, const ImportOptions& options) {
  if (!options.overwrite && (has_checkpoint(run) || fs::exists(run / "fingerprint.yaml")))
    throw ConfigError("--out " + run.string() + " already holds a run (--overwrite replaces it)");
  refuse_run_file(run, "--out");  // not among another run's own files
  const ImportPlan plan = plan_import(folder, run, options);
  const HfModel& hf = plan.hf;
  const Config& config = plan.config;
  const SafetensorsReader weights = SafetensorsReader::open(folder);
  const int64_t length = config.train.seq_len;

  const Corpus corpus = load_corpus(config.data);
  if (!hf.vocabulary_hash.empty() && hex64(corpus.vocabulary_hash()) != hf.vocabulary_hash)
    throw ConfigError("--data " + options.data + ": its " + enum_name(corpus.tokenizer) + " vocabulary (" +
                      std::to_string(corpus.vocab_size) + " ids, hash " + hex64(corpus.vocabulary_hash()) +
                      ") is not the one " + folder.string() + "'s model was trained with (hash " + hf.vocabulary_hash +
                      "): import it with that corpus");
  TransformerLM model = build_model(config, corpus.vocab_size);
  load_hf_weights(hf, weights, model);  // every tensor checked before RUN is written
  const nlohmann::json record = hf_weights_record(hf, weights);

  RunDirectory dir(config, corpus, options.overwrite ? RunStart::overwrite : RunStart::fresh);
  write_file_atomic(dir.path() / "config.yaml", YAML::Dump(config.to_yaml()) + "\n");
  CheckpointManifest manifest;
  manifest.step = 0;
  manifest.fingerprint = dir.fingerprint().hash;
  manifest.vocabulary = hex64(corpus.vocabulary_hash());
  save_imported_checkpoint(dir.path(), config, manifest, record);

  ImportSummary summary;
  summary.run = dir.path();
  summary.family = hf.family;
  for (const auto& p : model->parameters()) summary.parameters += p.numel();
  summary.vocab_size = corpus.vocab_size;
  summary.train_length = length;
  summary.weights_digest = hf_weights_digest(record);
  summary.position = hf.position["name"].as<std::string>();
  return summary;
}

}  // namespace extrap
