// `extrap export`: a trained run's model as one safetensors file (core/export/safetensors.h) that
// Python can run without extrap (analysis/extrap_model.py).
//
// Tensors: the model's parameters and buffers under their LibTorch names (docs/formats.md, "Tensors",
// lists them), as stored in the checkpoint: learned position
// parameters stay in their raw parametrisation (e.g. alibi_learned's raw_slopes, slope =
// softplus(raw)) and the metadata's "position_tensors" says how each maps.
//
// Metadata (string -> string; the values marked JSON are JSON text):
//   format            the lowest a reader needs: "extrap-safetensors/9" where the norms have no
//                     parameters or q, k and v are clipped (model keys norm_affine, clip_qkv, which a
//                     reader of format 8 would refuse); else "extrap-safetensors/8" where attention
//                     scores or logits are soft-capped or scaled by a width of their own (softcap,
//                     scale_dim, logit_softcap); else "extrap-safetensors/7" where the block has norms
//                     after its sublayers or qk_norm is over the projection (model keys
//                     sublayer_norms, qk_norm_over, which a reader of format 6 would ignore); else
//                     "extrap-safetensors/6" where geglu gates with
//                     GELU's tanh form (model activation gelu_tanh beside ffn geglu, which a reader
//                     of format 5 would read as the erf form); else "extrap-safetensors/5" where the
//                     heads are not d_model / heads wide (model key d_head, which a reader of format 4
//                     would ignore); else "extrap-safetensors/4" where the norms' biases differ from the
//                     linear layers' (model key norm_bias, which a reader of format 3 would
//                     ignore); else "extrap-safetensors/3" where the model has an unscaled
//                     embedding, q, k and v biases alone or GELU's tanh form (model keys
//                     scale_embedding, qkv_bias, activation gelu_tanh, which a reader of format 2
//                     would misread); else "extrap-safetensors/2" (2: the architecture keys of
//                     model and the rotary pairings; a reader of format 1 would ignore them, so
//                     refuses the file)
//   extrap_version    the exporting binary's version
//   position          the method's name; position_options (JSON): every option, defaults filled
//   position_tensors  the method's own description of its tensors (PositionInfo::tensors)
//   attention (JSON)  sink, ssmax, temperature, temperature_floor, gate, window, chunk
//   A model with a layer pattern has instead position "pattern" and
//   layers (JSON)     {"pattern": [KIND, ...] (one period, repeated over depth), "kinds": {KIND:
//                     {"position", "position_options", "position_tensors", "attention"}}}; kind
//                     K's tensors are position_K.NAME, a per-layer table holding a row per layer
//                     of the kind, in depth order
//   model (JSON)      layers, d_model, heads, kv_heads, d_head (each head's width, resolved), d_ffn
//                     (the hidden width, resolved), ffn,
//                     activation, norm, norm_eps, bias, norm_bias, block, qk_norm, qk_norm_over,
//                     sublayer_norms, embedding_norm, logit_softcap, norm_affine, clip_qkv (the
//                     last three only where set),
//                     tie_embeddings, final_norm, adaptive_cutoffs, adaptive_factor, objective,
//                     causal, layer_norm_eps (= norm_eps)
//   data (JSON)       path, name, tokenizer, vocab_size, mask_token, eos_token, unk_token
//   train (JSON)      seq_len, mask_prob, steps (the checkpoint's step)
//   eval (JSON)       mask_prob, mask_seed: masked-LM evaluation's fixed selection
//   vocabulary (JSON) word level: the list id -> token; a vocabulary whose JSON exceeds the
//                     inline limit goes to a side file FILE.vocab.json instead, named by
//                     "vocabulary_file" (relative to the .safetensors file's directory)
//   tokenizer_json_file  hf: the side file FILE.tokenizer.json, the Hugging Face tokenizer the
//                     corpus was tokenised with (relative, as below)
//   tokenizer_model_file  sentencepiece: the side file FILE.tokenizer.model, the SentencePiece
//                     model the corpus was tokenised with (relative, as above)
//   config            the resolved config as YAML; checkpoint (JSON): step, fingerprint,
//                     vocabulary_hash
#pragma once

#include "core/data/corpus.h"
#include "core/run/checkpoint.h"
#include "core/run/run_dir.h"

#include <filesystem>
#include <map>
#include <string>

namespace extrap {

struct ExportOptions {
  bool overwrite = false;                             // replace an existing output file
  size_t inline_vocabulary_bytes = size_t(16) << 20;  // larger vocabularies go to a side file
};

struct ExportSummary {
  std::filesystem::path file;
  std::filesystem::path vocabulary_file;  // the side file: a large word vocabulary, or the
                                          // SentencePiece model; empty when there is none
  size_t tensors = 0;
  size_t bytes = 0;
  int64_t step = 0;
  std::map<std::string, std::string> metadata;  // the file's metadata, as written
};

// Verifies RUN's checkpoint, loads it with its corpus (for the vocabulary) and writes `out`
// atomically (the side file first). ConfigError naming the file for: an existing `out` without
// overwrite, a missing directory, a damaged checkpoint, non-finite parameters.
ExportSummary export_run(const std::filesystem::path& run_dir, const std::filesystem::path& out,
                         const ExportOptions& options = {});

// export_run's writing half, for a run already loaded and `out` already checked: the file and its
// side file (export --format hf writes its remote-code model.safetensors with it).
ExportSummary write_export(const VerifiedCheckpoint& checkpoint, const Corpus& corpus, LoadedRun& run,
                           const std::filesystem::path& out, const ExportOptions& options = {});

// A word-level corpus's vocabulary as the JSON list id -> token. A word that is not valid UTF-8
// cannot be a JSON string: ConfigError rather than a vocabulary Python would tokenise differently.
std::string vocabulary_json(const Corpus& corpus);

// The position method's options with every default filled in, as JSON text: what the method
// was built with (its section, config.position or a kind's, plus its documented defaults).
std::string resolved_position_options(const std::string& method, const YAML::Node& options);
std::string resolved_position_options(const Config& config);

}  // namespace extrap
