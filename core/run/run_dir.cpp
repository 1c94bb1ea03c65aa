#include "core/run/run_dir.h"

#include "core/base/files.h"
#include "core/base/hashing.h"

namespace fs = std::filesystem;

namespace extrap {

RunFingerprint run_fingerprint(const Config& config, const Corpus& corpus) {
  RunFingerprint f;
  f.node = YAML::Node(YAML::NodeType::Map);
  f.node["config"] = plain_yaml(config.model_keys());
  f.node["corpus"] = plain_yaml(corpus.identity());
  f.hash = hex64(content_hash(YAML::Dump(f.node)));
  return f;
}

// The refusals that only read RUN: a trained run without --resume or --overwrite, another run's
// fingerprint, a checkpoint without one. Run before RUN is created and again under its lock.
void RunDirectory::check_existing(RunStart start) const {
  const fs::path identity = path_ / "fingerprint.yaml";
  if (start == RunStart::fresh && has_checkpoint(path_))
    throw ConfigError(path_.string() +
                      " already holds a trained run (a checkpoint); --resume continues it, "
                      "--overwrite replaces it, or choose another train.out_dir");
  if (fs::exists(identity)) {
    const YAML::Node recorded = load_yaml_file(identity.string());
    if (const auto d = first_difference(recorded, fingerprint_.node))
      throw ConfigError(path_.string() + " belongs to another run: first difference at '" + d->key +
                        "': " + d->first + " in " + identity.string() + ", " + d->second +
                        " now; use another run directory (train.out_dir, or a sweep's "
                        "output.run_root)");
  } else if (has_checkpoint(path_)) {
    throw ConfigError(path_.string() +
                      " holds a checkpoint but no fingerprint.yaml (written by an extrap older "
                      "than 0.2, or damaged): its identity cannot be checked; train again with "
                      "--overwrite or use another run directory");
  }
}

RunDirectory::RunDirectory(const Config& config, const Corpus& corpus, RunStart start)
    : path_(config.train.out_dir), fingerprint_(run_fingerprint(config, corpus)) {
  // A refused run leaves nothing behind: the checks come before RUN is made, and a directory
  // this process made is removed again if a refusal comes later.
  if (start != RunStart::overwrite) check_existing(start);
  std::error_code error;
  const bool created = fs::create_directories(path_, error);
  if (error) throw ConfigError(path_.string() + ": cannot create the run directory: " + error.message());
  try {
    lock_ = std::make_unique<FileLock>(path_ / "lock", path_.string(), "trained",
                                       "wait for it to finish or use another train.out_dir");
    remove_stale_temporaries(path_);  // of a process killed mid-write (config.yaml.tmp.<pid>)
    const fs::path identity = path_ / "fingerprint.yaml";
    if (start == RunStart::overwrite) {
      for (const char* name : {"checkpoint", "checkpoint.old", "checkpoint.tmp", "fingerprint.yaml",
                               "metrics.jsonl", "eval.json"})
        remove_tree(path_ / name, error);
    } else {
      check_existing(start);  // again, now that no other process can change RUN
    }
    if (!fs::exists(identity)) write_file_atomic(identity, YAML::Dump(fingerprint_.node) + "\n");
    if (start == RunStart::resume) {
      checkpoint_ = find_checkpoint(path_);
      if (checkpoint_ && checkpoint_->manifest.fingerprint != fingerprint_.hash)
        throw ConfigError(checkpoint_->dir.string() + " was written by another run (fingerprint " +
                          checkpoint_->manifest.fingerprint + ", " + identity.string() + " says " +
                          fingerprint_.hash + ")");
    }
  } catch (...) {
    // Only under its lock: where another process holds it (two starts at once, each seeing a part
    // of RUN's path made), RUN is that process's run, whoever made the directory.
    if (created && lock_) {
      remove_tree(path_, error);  // still locked: no other start gets in between
      lock_.reset();
    }
    throw;
  }
}

fs::path enclosing_run_directory(const fs::path& path) {
  std::error_code error;
  for (fs::path dir = fs::absolute(path, error).parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (fs::exists(dir / "fingerprint.yaml", error)) return dir;
    if (dir == dir.root_path()) break;
  }
  return {};
}

void refuse_run_file(const fs::path& path, const std::string& flag) {
  const fs::path run = enclosing_run_directory(path);
  if (run.empty()) return;
  std::error_code error;
  const fs::path inside = fs::absolute(path, error).lexically_normal().lexically_relative(run.lexically_normal());
  const std::string first = inside.empty() ? std::string() : inside.begin()->string();
  const bool owned = first.rfind("checkpoint", 0) == 0 ||
                     (inside == first && (first == "fingerprint.yaml" || first == "config.yaml" ||
                                          first == "metrics.jsonl" || first == "eval.json" || first == "lock"));
  if (owned)
    throw ConfigError(flag + " " + path.string() + ": is a file of the run directory " + run.string() +
                      " (" + inside.string() + "), which training, evaluation and --resume read; "
                      "write it beside them under another name");
}

void check_vocabulary(const VerifiedCheckpoint& checkpoint, const Corpus& corpus) {
  const std::string now = hex64(corpus.vocabulary_hash());
  if (checkpoint.manifest.vocabulary != now)
    throw ConfigError(checkpoint.dir.string() + " was trained with another vocabulary (hash " +
                      checkpoint.manifest.vocabulary + ") than corpus '" + corpus.name +
                      "' has now (" + now + ", " + enum_name(corpus.tokenizer) + ", " +
                      std::to_string(corpus.vocab_size) + " tokens)");
}

void check_run_identity(const VerifiedCheckpoint& checkpoint) {
  const fs::path run_dir = checkpoint.dir.parent_path();
  const fs::path identity = run_dir / "fingerprint.yaml";
  if (!fs::exists(identity)) return;  // a checkpoint directory on its own: nothing to check against
  std::string text = read_file(identity);
  if (!text.empty() && text.back() == '\n') text.pop_back();  // written as the node's YAML and a newline
  const std::string recorded = hex64(content_hash(text));
  if (recorded != checkpoint.manifest.fingerprint)
    throw ConfigError(checkpoint.dir.string() + " was written by another run than " + run_dir.string() +
                      "'s (fingerprint " + checkpoint.manifest.fingerprint + ", " + identity.string() +
                      " says " + recorded + "): the checkpoint was copied in or the run directory edited; "
                      "evaluate the run directory it came from");
}

LoadedRun load_run(const VerifiedCheckpoint& checkpoint, const Corpus& corpus) {
  check_run_identity(checkpoint);
  check_vocabulary(checkpoint, corpus);
  LoadedRun run;
  run.config = checkpoint.config;
  run.model = build_model(run.config, corpus.vocab_size);
  load_model(checkpoint, run.model);
  run.step = checkpoint.state.step;
  run.model->eval();
  return run;
}

}  // namespace extrap
