#include "core/export/hf_export.h"

#include "core/base/errors.h"
#include "core/base/files.h"
#include "core/data/hf_tokenizer.h"
#include "core/export/safetensors.h"
#include "core/hub/hf_checkpoint.h"
#include "core/run/checkpoint.h"
#include "core/run/run_dir.h"

#include <nlohmann/json.hpp>

namespace extrap {

namespace fs = std::filesystem;
using json = nlohmann::json;

HfExportSummary export_hf(const fs::path& run_dir, const fs::path& out, bool overwrite) {
  if (out.empty()) throw ConfigError("--out: name the folder to write");
  refuse_run_file(out, "--out");
  if (fs::exists(out) && !overwrite) throw ConfigError(out.string() + " exists (add --overwrite to replace it)");
  if (fs::exists(out) && !fs::is_directory(out))
    throw ConfigError("--out " + out.string() + ": is a file; --format hf writes a folder");
  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  const Corpus corpus = load_corpus(checkpoint.config.data);
  LoadedRun run = load_run(checkpoint, corpus);
  const HfExportConfig hf = hf_export_config(run.config, corpus.vocab_size);  // refuses before writing
  const auto tensors = hf_tensors(hf.family, run.model, hf.embedding_scale);
  for (const auto& [name, tensor] : tensors)
    if (!torch::isfinite(tensor).all().item<bool>())
      throw ConfigError(checkpoint.dir.string() + ": tensor " + name + " has non-finite values; refusing to export it");

  json config = hf.config;
  if (corpus.hf) {
    if (const auto bos = corpus.hf->bos()) config["bos_token_id"] = *bos;
    if (const auto eos = corpus.hf->eos()) config["eos_token_id"] = *eos;
  }
  const fs::path tmp = fs::path(out.string() + ".tmp");
  std::error_code error;
  remove_tree(tmp, error);
  fs::create_directories(tmp, error);
  if (error) throw ConfigError(tmp.string() + ": cannot create: " + error.message());
  try {
    write_file_durable(tmp / "config.json", config.dump(2) + "\n");
    write_file_durable(tmp / "model.safetensors", encode_safetensors(tensors, {{"format", "pt"}}));
    if (corpus.hf_json) {
      write_file_durable(tmp / "tokenizer.json", *corpus.hf_json);
      json t = {{"backend", "tokenizers"}, {"tokenizer_class", "TokenizersBackend"},
                {"clean_up_tokenization_spaces", false}, {"model_max_length", 1000000}};
      if (const auto bos = corpus.hf->bos()) t["bos_token"] = corpus.hf->token_bytes(*bos);
      if (const auto eos = corpus.hf->eos()) t["eos_token"] = corpus.hf->token_bytes(*eos);
      write_file_durable(tmp / "tokenizer_config.json", t.dump(2) + "\n");
    }
    fsync_directory(tmp);
    remove_tree(out, error);
    fs::rename(tmp, out);
  } catch (...) {
    remove_tree(tmp, error);
    throw;
  }
  HfExportSummary summary;
  summary.dir = out;
  summary.family = hf.family;
  summary.tensors = tensors.size();
  summary.tokenizer = corpus.hf_json != nullptr;
  return summary;
}

}  // namespace extrap
