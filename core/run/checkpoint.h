// Checkpoints: save, find, verify and load, for training, `extrap eval` and sweeps alike.
//
// A checkpoint is a directory RUN/checkpoint holding
//   model.pt, optimizer.pt, rng.pt   LibTorch archives (model, AdamW state, CPU RNG state);
//                                    an imported run (`extrap import`, core/run/import_run.h)
//                                    has instead
//   weights.json                     where its weights are: a Hugging Face checkpoint folder,
//                                    each file's size and hash (core/hub/hf_checkpoint.h)
//   state.json                       step, data cursor, throughput, loss curves
//   config.yaml                      the resolved config it was trained with
//   manifest.json                    written last: format, step, the run's fingerprint hash,
//                                    the vocabulary hash, and each file's size and XXH3 hash
// It is written as RUN/checkpoint.tmp (every file fsynced, the manifest last), then swapped
// in by rename: RUN/checkpoint -> checkpoint.old, checkpoint.tmp -> checkpoint, old removed.
// A crash between the renames leaves only checkpoint.old, which is then used. The swap holds
// RUN/checkpoint.lock exclusively and readers hold it shared while they verify and read, so a
// reader (`extrap eval` of a run still training) gets the last complete checkpoint, whole.
//
// Nothing is loaded before the manifest verifies: a missing manifest, a truncated, missing or
// changed file is a ConfigError naming the file. No LibTorch backtrace, no NaN perplexity.
#pragma once

#include "core/model/config.h"
#include "core/model/model.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace extrap {

struct CurvePoint {
  int64_t step = 0;
  double loss = 0;
};

struct CheckpointState {
  int64_t step = 0;
  int64_t epoch = 0;  // data cursor: epoch and block index within it
  int64_t index = 0;
  double tokens_per_second = 0;
  double seconds = 0;  // training time so far (validation excluded)
  int64_t world_size = 1;  // data-parallel ranks that trained it (core/runtime/distributed.h)
  std::vector<CurvePoint> train_curve;
  std::vector<CurvePoint> valid_curve;
  // Training loss summed over the steps since the last log point, and their count: a log
  // point after a resumption averages the same steps as it would have without one.
  double pending_loss_sum = 0;
  int64_t pending_loss_count = 0;
  // The run's step-1 training loss (the untrained model's), which bounds a healthy loss (NaN
  // where unknown: checkpoints of 0.11 and before).
  double first_loss = NAN;
};

// A loss curve as JSON: [[step, loss], ...] (state.json, `train --json`).
nlohmann::json curve_json(const std::vector<CurvePoint>& curve);

struct CheckpointManifest {
  int64_t step = 0;
  std::string fingerprint;  // RunFingerprint::hash of the run it belongs to
  std::string vocabulary;   // hex64 of Corpus::vocabulary_hash()
  std::string extrap_version;
};

// Writes RUN/checkpoint of an imported model: step 0, no optimizer, weights.json = `record`.
void save_imported_checkpoint(const std::filesystem::path& run_dir, const Config& config,
                              const CheckpointManifest& manifest, const nlohmann::json& record);

// Writes RUN/checkpoint (see above). `optimizer` may be null (no optimizer.pt).
void save_checkpoint(const std::filesystem::path& run_dir, const Config& config,
                     const CheckpointManifest& manifest, const CheckpointState& state,
                     TransformerLM& model, torch::optim::Optimizer* optimizer);

// A checkpoint whose every file matched its manifest, read while no writer swapped it.
struct VerifiedCheckpoint {
  std::filesystem::path dir;
  CheckpointManifest manifest;
  Config config;
  CheckpointState state;
  // model.pt as it was verified: load_model reads these bytes, not the file, which a run still
  // training may have replaced since.
  std::shared_ptr<const std::string> model_bytes;
  // An imported run's weights.json (parsed); null for a trained run.
  std::shared_ptr<const nlohmann::json> imported;
  bool is_imported() const { return imported != nullptr; }
};

// Whether RUN holds a checkpoint at all (complete or not).
bool has_checkpoint(const std::filesystem::path& run_dir);
// The run's checkpoint, verified; nullopt when there is none. A damaged one is a ConfigError.
std::optional<VerifiedCheckpoint> find_checkpoint(const std::filesystem::path& run_dir);
// As find_checkpoint, but "no checkpoint" is a ConfigError too.
VerifiedCheckpoint require_checkpoint(const std::filesystem::path& run_dir);

// Loads the archives of a verified checkpoint (errors name the file).
void load_model(const VerifiedCheckpoint& checkpoint, TransformerLM& model);
void load_optimizer(const VerifiedCheckpoint& checkpoint, torch::optim::Optimizer& optimizer);
// Restores the CPU generator and, when `device` is a GPU, that GPU's generator. False when the
// GPU's is not in the checkpoint (saved by a CPU run, or by an older extrap): that
// stream then goes on from where the process seeded it.
bool load_rng(const VerifiedCheckpoint& checkpoint, const torch::Device& device);

}  // namespace extrap
