// A run directory: what one training run owns.
//
//   RUN/fingerprint.yaml   the run's identity: every config key marked Affects::model (and the
//                          position method with its options) and the corpus identity
//                          (tokenizer, vocabulary hash, training tokens' count and hash)
//   RUN/config.yaml        the resolved config (for people; the fingerprint is what counts)
//   RUN/lock               held while a process trains in RUN (the file stays, with the last
//                          holder's pid)
//   RUN/checkpoint/        core/run/checkpoint.h
//   RUN/metrics.jsonl      the training log, a line per log or validation point (core/run/metrics_log.h)
//   RUN/eval.json          `extrap train`'s evaluation after training (removed when training
//                          changes the model again)
//
// Training into RUN is refused when RUN's fingerprint differs from the new run's (naming the
// first differing key), when another process holds the lock (naming its pid), and, unless
// resuming or overwriting, when RUN already holds a checkpoint. A refusal leaves no trace: a run
// directory that did not exist before is not left behind.
#pragma once

#include "core/base/files.h"
#include "core/data/corpus.h"
#include "core/model/config.h"
#include "core/run/checkpoint.h"

#include <filesystem>
#include <memory>
#include <optional>

namespace extrap {

struct RunFingerprint {
  YAML::Node node;   // {config: ..., corpus: ...}
  std::string hash;  // hex64 of its canonical text
};
RunFingerprint run_fingerprint(const Config& config, const Corpus& corpus);

enum class RunStart {
  fresh,      // RUN must hold no checkpoint
  resume,     // continue from RUN's checkpoint when there is one
  overwrite,  // remove RUN's checkpoint and identity first
};

class RunDirectory {
 public:
  // Locks RUN (config.train.out_dir) and checks or records its fingerprint (see above).
  RunDirectory(const Config& config, const Corpus& corpus, RunStart start);

  const std::filesystem::path& path() const { return path_; }
  const RunFingerprint& fingerprint() const { return fingerprint_; }
  // The verified checkpoint to continue from (resume only; nullopt when RUN has none).
  std::optional<VerifiedCheckpoint>& checkpoint() { return checkpoint_; }

 private:
  void check_existing(RunStart start) const;

  std::filesystem::path path_;
  std::unique_ptr<FileLock> lock_;
  RunFingerprint fingerprint_;
  std::optional<VerifiedCheckpoint> checkpoint_;
};

// The run directory `path` lies in (the nearest folder above it holding fingerprint.yaml), or an
// empty path: where another command's output would overwrite a run's own files.
std::filesystem::path enclosing_run_directory(const std::filesystem::path& path);
// Refuses (ConfigError naming `flag`) a path that is one of a run directory's own files, or lies
// in its checkpoint: what train writes and eval and --resume read (fingerprint.yaml, config.yaml,
// metrics.jsonl, eval.json, lock, checkpoint*/). Other files in a run directory are allowed.
void refuse_run_file(const std::filesystem::path& path, const std::string& flag);

// Refuses a checkpoint whose vocabulary differs from `corpus`'s (evaluating or resuming a model
// against another vocabulary gives meaningless numbers).
void check_vocabulary(const VerifiedCheckpoint& checkpoint, const Corpus& corpus);

// Refuses a checkpoint whose manifest names another run than its run directory's
// fingerprint.yaml (a checkpoint copied into another run's directory); a checkpoint directory
// without a fingerprint.yaml beside it is not checked.
void check_run_identity(const VerifiedCheckpoint& checkpoint);

// A trained model from a verified checkpoint (`extrap eval`, `extrap inspect`, export): it
// belongs to its run directory (check_run_identity), and its corpus must have the vocabulary it
// was trained with.
struct LoadedRun {
  Config config;
  TransformerLM model = nullptr;
  int64_t step = 0;
};
LoadedRun load_run(const VerifiedCheckpoint& checkpoint, const Corpus& corpus);

}  // namespace extrap
