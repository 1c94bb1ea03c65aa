// `extrap import DIR --out RUN --data CORPUS`: a Hugging Face checkpoint folder as an extrap run
// directory, so that every command that takes a run (eval, inspect, export, generate, sweeps'
// checkpoint points) takes it unchanged.
//
// RUN holds what a trained run holds (fingerprint.yaml, config.yaml, checkpoint/ with its
// manifest) except the weights: checkpoint/weights.json records the folder, its config.json's
// and every weights file's size and hash (core/hub/hf_checkpoint.h), and each load reads the
// folder's safetensors memory-mapped and checks them against the record. The config is the
// family's mapping (model, position and attention sections), with data.path = CORPUS,
// data.tokenizer hf and data.tokenizer_model the folder's tokenizer.json, data.vocab_size the
// embedding's rows, train.seq_len the model's training length (config.json's, or
// --train-length), and eval.lengths 1x, 2x and 4x that.
//
// Everything is checked before RUN is written: the config mapped, the tokenizer read, CORPUS
// tokenised with it (ids below the embedding's rows), every weight mapped and finite. A refusal
// leaves nothing behind.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/model/config.h"

namespace extrap {

struct ImportOptions {
  std::string data;            // CORPUS: data.path, the text evaluations read
  int64_t train_length = 0;    // the model's training length; 0: config.json's
  bool overwrite = false;      // replace RUN if it holds a run
  // An ALiBi family's bias: family (its own rule: Falcon's bfloat16 rounding; BLOOM and MPT
  // exact, as in float32), exact (no rounding), bfloat16 or float16 (m j rounded to that dtype,
  // as BLOOM computes it in a half-precision run).
  std::string alibi_bias = "family";
  // KEY=VALUE settings applied to the config before it is decoded (a sweep's released.set:
  // eval.* keys, train.threads, train.device).
  std::vector<std::string> set;
};

struct ImportSummary {
  std::filesystem::path run;
  std::string family;
  int64_t parameters = 0;
  int64_t vocab_size = 0;
  int64_t train_length = 0;
  std::string weights_digest;
  std::string position;        // the mapped method
};

ImportSummary import_checkpoint(const std::filesystem::path& folder, const std::filesystem::path& run,
                                const ImportOptions& options);

// The config import_checkpoint would write for `folder` into `run` (config.json mapped and the
// tokenizer's presence checked; the weights and the corpus are not read): a sweep's released
// points are planned from it.
Config imported_config(const std::filesystem::path& folder, const std::filesystem::path& run,
                       const ImportOptions& options);

}  // namespace extrap
