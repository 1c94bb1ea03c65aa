#include "core/export/hf_export.h"

#include "core/base/errors.h"
#include "core/base/files.h"
#include "core/data/hf_tokenizer.h"
#include "core/data/sentencepiece.h"
#include "core/export/model_export.h"
#include "core/export/safetensors.h"
#include "core/hub/hf_checkpoint.h"
#include "core/run/checkpoint.h"
#include "core/run/run_dir.h"
#include "extrap_python_files.h"  // generated at build time by cmake/embed_python.cmake

#include <nlohmann/json.hpp>

#include <optional>

namespace extrap {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Byte b's character in GPT-2's byte-to-unicode map (tokenizers' ByteLevel), as UTF-8: the
// printable bytes ! to ~, ¡ to ¬ and ® to ÿ are their own code points; the others take 256,
// 257, ... in byte order.
std::string byte_level_char(int b) {
  const auto printable = [](int c) { return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE); };
  int code = b;
  if (!printable(b)) {
    code = 256;
    for (int c = 0; c < b; ++c) code += printable(c) ? 0 : 1;
  }
  std::string out;
  if (code < 0x80) {
    out += char(code);
  } else {  // below 0x800: two bytes
    out += char(0xC0 | (code >> 6));
    out += char(0x80 | (code & 0x3F));
  }
  return out;
}

// A tokenizer.json whose ids are extrap's byte-level ids: id b for byte b of the text's UTF-8,
// whatever the text (a byte-level BPE with the 256 bytes and no merges, no regex split, no
// normaliser). <mask> (256) is an added special token only for a masked LM, where fill-mask
// needs it: there, the text "<mask>" is the mask token, where extrap reads its six bytes.
std::string byte_tokenizer_json(bool with_mask) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_char(b)] = b;
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                           {"use_regex", false}};
  json added = json::array();
  if (with_mask)
    added.push_back({{"id", 256}, {"content", "<mask>"}, {"single_word", false}, {"lstrip", false},
                     {"rstrip", false}, {"normalized", false}, {"special", true}});
  const json tokenizer = {
      {"version", "1.0"},       {"truncation", nullptr},   {"padding", nullptr},
      {"added_tokens", added},  {"normalizer", nullptr},   {"pre_tokenizer", byte_level},
      {"post_processor", nullptr}, {"decoder", byte_level},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                 {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false},
                 {"ignore_merges", false}, {"vocab", vocab}, {"merges", json::array()}}}};
  return tokenizer.dump(2) + "\n";
}

// What analysis/extrap_model.py, the remote code's model, refuses to compute (it names them too):
// refused here, before anything is written.
void require_reader_computes(const Config& config, const std::string& reason) {
  const auto refuse = [&](const std::string& what) {
    throw ConfigError("no transformers class computes this model (" + reason + "), and extrap's remote code does not "
                      "compute " + what + "; extrap eval computes it");
  };
  const auto check = [&](const std::string& method, const YAML::Node& p) {
    const auto text = [&](const char* key, const std::string& fallback) {
      return p[key] ? p[key].as<std::string>() : fallback;
    };
    if (method == "rotary" && text("scaling", "none") != "none") refuse("RoPE scaling " + text("scaling", "none") + " built in");
    if (method == "alibi" && (text("round_to", "none") != "none" || (p["round_slopes"] && p["round_slopes"].as<bool>()) ||
                              (p["bias_scale"] && p["bias_scale"].as<double>() != 1.0)))
      refuse("a released family's ALiBi rounding or scale (round_to, round_slopes, bias_scale)");
  };
  for (const LayerKind& kind : layer_plan(config).kinds) {
    check(kind.position_name, kind.position);
    const std::string& m = kind.position_name;  // (the reader forms these methods' scores apart from q.k + bias)
    if (kind.attention.softcap > 0 && (m == "cope" || m == "path" || m == "dape" || m == "stick_breaking"))
      refuse("attention.softcap with position method " + m);
  }
}

// The metadata the remote code builds the model from (config.json's extrap_metadata): the
// file's, less the vocabulary and side files, which the model does not need.
json remote_metadata(const std::map<std::string, std::string>& metadata) {
  json out = json::object();
  for (const auto& [key, value] : metadata)
    if (key != "vocabulary" && key != "vocabulary_file" && key != "tokenizer_json_file" &&
        key != "tokenizer_model_file")
      out[key] = value;
  return out;
}

}  // namespace

HfExportSummary export_hf(const fs::path& run_dir, const fs::path& out, bool overwrite, HfClass hf_class) {
  if (out.empty()) throw ConfigError("--out: name the folder to write");
  refuse_run_file(out, "--out");
  if (fs::exists(out) && !overwrite) throw ConfigError(out.string() + " exists (add --overwrite to replace it)");
  if (fs::exists(out) && !fs::is_directory(out))
    throw ConfigError("--out " + out.string() + ": is a file; --format hf writes a folder");
  const VerifiedCheckpoint checkpoint = require_checkpoint(run_dir);
  const Corpus corpus = load_corpus(checkpoint.config.data);
  LoadedRun run = load_run(checkpoint, corpus);
  const ModelConfig& m = run.config.model;

  // Everything is decided (and refused) before anything is written.
  HfExportSummary summary;
  summary.dir = out;
  summary.masked = !m.causal();
  std::optional<HfExportConfig> native;
  if (hf_class != HfClass::remote) {
    try {
      native = hf_export_config(run.config, corpus.vocab_size);
    } catch (const NoTransformersClass& e) {
      if (hf_class == HfClass::native) throw;
      summary.remote_reason = e.reason;
    }
  } else {
    summary.remote_reason = "--hf-class remote";
  }
  if (!native) require_reader_computes(run.config, summary.remote_reason);
  std::vector<std::pair<std::string, torch::Tensor>> tensors;  // native: the class's; remote code: write_export's
  json config;
  if (native) {
    tensors = hf_tensors(native->family, run.model, native->embedding_scale);
    for (const auto& [name, tensor] : tensors)
      if (!torch::isfinite(tensor).all().item<bool>())
        throw ConfigError(checkpoint.dir.string() + ": tensor " + name + " has non-finite values; refusing to export it");
    config = native->config;
    summary.family = native->family;
  } else {  // filled in below, from the metadata write_export writes
    const std::string cls = m.causal() ? "ExtrapForCausalLM" : "ExtrapForMaskedLM";
    config = {{"model_type", "extrap"},
              {"architectures", json::array({cls})},
              {"auto_map", {{"AutoConfig", "modeling_extrap.ExtrapConfig"},
                            {m.causal() ? "AutoModelForCausalLM" : "AutoModelForMaskedLM", "modeling_extrap." + cls}}},
              {"vocab_size", corpus.vocab_size}, {"hidden_size", m.d_model}, {"num_hidden_layers", m.layers},
              {"num_attention_heads", m.heads}, {"max_position_embeddings", run.config.train.seq_len},
              {"is_decoder", m.causal()}, {"tie_word_embeddings", false}, {"use_cache", false}, {"dtype", "float32"}};
    summary.family = "extrap";
  }
  if (corpus.hf) {
    if (const auto bos = corpus.hf->bos()) config["bos_token_id"] = *bos;
    if (const auto eos = corpus.hf->eos()) config["eos_token_id"] = *eos;
  }
  // The tokenizer: a tokenizer.json where one gives extrap's ids exactly, else (word level,
  // SentencePiece) the folder's own tokenizer class and its vocabulary file.
  std::string tokenizer_json;
  std::pair<std::string, std::string> tokenizer_file;  // word level, SentencePiece: {name, bytes}
  json tokenizer_config = {{"backend", "tokenizers"}, {"tokenizer_class", "TokenizersBackend"},
                           {"clean_up_tokenization_spaces", false}, {"model_max_length", 1000000}};
  if (corpus.hf_json) {
    tokenizer_json = *corpus.hf_json;
    if (const auto bos = corpus.hf->bos()) tokenizer_config["bos_token"] = corpus.hf->token_bytes(*bos);
    if (const auto eos = corpus.hf->eos()) tokenizer_config["eos_token"] = corpus.hf->token_bytes(*eos);
  } else if (corpus.tokenizer == Tokenizer::byte) {
    tokenizer_json = byte_tokenizer_json(!m.causal());
    if (!m.causal()) tokenizer_config["mask_token"] = "<mask>";
  } else if (corpus.word_level() || corpus.sentencepiece) {
    tokenizer_file = corpus.word_level() ? std::pair{std::string("vocabulary.json"), vocabulary_json(corpus)}
                                         : std::pair{std::string("tokenizer.model"), corpus.sentencepiece->bytes()};
    tokenizer_config = {{"tokenizer_class", "ExtrapTokenizer"},
                        {"auto_map", {{"AutoTokenizer", json::array({"tokenization_extrap.ExtrapTokenizer", nullptr})}}},
                        {"clean_up_tokenization_spaces", false}, {"model_max_length", 1000000}};
  }

  const fs::path tmp = fs::path(out.string() + ".tmp");
  std::error_code error;
  remove_tree(tmp, error);
  fs::create_directories(tmp, error);
  if (error) throw ConfigError(tmp.string() + ": cannot create: " + error.message());
  try {
    if (native) {
      write_file_durable(tmp / "model.safetensors", encode_safetensors(tensors, {{"format", "pt"}}));
      summary.tensors = tensors.size();
    } else {  // extrap's own file (analysis/extrap_model.py reads it too) and the code that runs it
      const ExportSummary written = write_export(checkpoint, corpus, run, tmp / "model.safetensors");
      summary.tensors = written.tensors;
      config["extrap_metadata"] = remote_metadata(written.metadata);
      write_file_durable(tmp / "extrap_model.py", embedded::kExtrapModelPy);
      write_file_durable(tmp / "modeling_extrap.py", embedded::kModelingExtrapPy);
    }
    write_file_durable(tmp / "config.json", config.dump(2) + "\n");
    if (!tokenizer_json.empty()) write_file_durable(tmp / "tokenizer.json", tokenizer_json);
    if (!tokenizer_file.first.empty()) {
      write_file_durable(tmp / tokenizer_file.first, tokenizer_file.second);
      write_file_durable(tmp / "tokenization_extrap.py", embedded::kTokenizationExtrapPy);
      // Its SentencePiece ids come from extrap_model.py's SentencePieceIds (one source).
      if (native) write_file_durable(tmp / "extrap_model.py", embedded::kExtrapModelPy);
    }
    if (!tokenizer_json.empty() || !tokenizer_file.first.empty())
      write_file_durable(tmp / "tokenizer_config.json", tokenizer_config.dump(2) + "\n");
    fsync_directory(tmp);
    remove_tree(out, error);
    fs::rename(tmp, out);
  } catch (...) {
    remove_tree(tmp, error);
    throw;
  }
  summary.tokenizer = !tokenizer_json.empty() || !tokenizer_file.first.empty();
  return summary;
}

}  // namespace extrap
