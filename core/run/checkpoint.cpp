#include "core/run/checkpoint.h"

#include "core/hub/hf_checkpoint.h"

#include "core/base/files.h"
#include "core/base/hashing.h"
#include "core/base/version.h"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <sstream>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace extrap {

namespace {

constexpr int kManifestFormat = 1;
const char* const kArchives[] = {"model.pt", "optimizer.pt", "rng.pt"};

// The device of a module's or optimiser's first parameter (the CPU when it has none).
torch::Device device_of(const std::vector<torch::Tensor>& parameters) {
  return parameters.empty() ? torch::Device(torch::kCPU) : parameters.front().device();
}

std::vector<CurvePoint> curve_from(const json& j) {
  std::vector<CurvePoint> curve;
  for (const auto& p : j) curve.push_back({p.at(0).get<int64_t>(), p.at(1).get<double>()});
  return curve;
}

template <class T>
std::string archive_bytes(const T& value) {
  std::ostringstream out(std::ios::binary);
  torch::save(value, out);
  return out.str();
}

json parse_json(const std::string& text, const fs::path& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    throw ConfigError(path.string() + ": not valid JSON (" + e.what() +
                      "): the checkpoint is damaged");
  }
}

// RUN/checkpoint.lock: save_checkpoint holds it exclusively while it swaps the directories,
// readers hold it shared while they verify and read: `extrap eval` of a run that is training
// never sees a checkpoint half-swapped (and never calls a whole one corrupt).
fs::path swap_lock_path(const fs::path& run_dir) { return run_dir / "checkpoint.lock"; }

// Verifies `dir` against its manifest, reading each file once: what is verified is what is
// used (the small files parsed, model.pt's bytes kept for load_model).
VerifiedCheckpoint verify(const fs::path& dir) {
  const fs::path manifest_path = dir / "manifest.json";
  if (!fs::exists(manifest_path))
    throw ConfigError(dir.string() +
                      ": no manifest.json: the checkpoint is incomplete or was written by an "
                      "extrap older than 0.2; train again (extrap train --overwrite)");
  VerifiedCheckpoint c;
  c.dir = dir;
  std::map<std::string, std::string> contents;  // the small files and model.pt, verified
  try {
    const json m = parse_json(read_file(manifest_path), manifest_path);
    if (m.at("format").get<int>() != kManifestFormat)
      throw ConfigError(manifest_path.string() + ": manifest format " +
                        std::to_string(m.at("format").get<int>()) + ", this extrap reads " +
                        std::to_string(kManifestFormat));
    c.manifest.step = m.at("step").get<int64_t>();
    c.manifest.fingerprint = m.at("fingerprint").get<std::string>();
    c.manifest.vocabulary = m.at("vocabulary").get<std::string>();
    c.manifest.extrap_version = m.value("extrap_version", "");
    for (const auto& [name, entry] : m.at("files").items()) {
      const fs::path file = dir / name;
      if (!fs::exists(file)) throw ConfigError(file.string() + ": missing (listed in the manifest)");
      std::string bytes = read_file(file);
      const uint64_t expected = entry.at("bytes").get<uint64_t>();
      if (bytes.size() != expected)
        throw ConfigError(file.string() + ": " + std::to_string(bytes.size()) +
                          " bytes, the manifest says " + std::to_string(expected) +
                          ": the checkpoint is truncated or damaged");
      const std::string hash = hex64(content_hash(bytes));
      if (hash != entry.at("xxh3").get<std::string>())
        throw ConfigError(file.string() + ": checksum " + hash + " differs from the manifest's " +
                          entry.at("xxh3").get<std::string>() + ": the checkpoint is corrupt");
      if (name != "optimizer.pt" && name != "rng.pt" && name != "cuda_rng.pt") contents[name] = std::move(bytes);
    }
    for (const char* required : {"state.json", "config.yaml"})
      if (!m.at("files").contains(required))
        throw ConfigError(manifest_path.string() + ": lists no " + required);
    if (!m.at("files").contains("model.pt") && !m.at("files").contains("weights.json"))
      throw ConfigError(manifest_path.string() + ": lists no model.pt (nor an imported model's weights.json)");
    if (contents.count("weights.json"))
      c.imported = std::make_shared<const json>(parse_json(contents.at("weights.json"), dir / "weights.json"));
    const json state = parse_json(contents.at("state.json"), dir / "state.json");
    c.state.step = state.at("step").get<int64_t>();
    c.state.epoch = state.at("epoch").get<int64_t>();
    c.state.index = state.at("index").get<int64_t>();
    c.state.tokens_per_second = state.at("tokens_per_second").get<double>();
    c.state.seconds = state.at("seconds").get<double>();
    c.state.world_size = state.value("world_size", int64_t(1));  // absent before 0.5
    c.state.train_curve = curve_from(state.at("train_curve"));
    c.state.valid_curve = curve_from(state.at("valid_curve"));
    // Checkpoints of 0.11 and before saved no pending loss (their next log point averages
    // only the steps after the resumption, as they always did).
    c.state.pending_loss_sum = state.value("pending_loss_sum", 0.0);
    c.state.pending_loss_count = state.value("pending_loss_count", int64_t(0));
    if (const auto first = state.find("first_loss"); first != state.end() && first->is_number())
      c.state.first_loss = first->get<double>();
  } catch (const json::exception& e) {
    throw ConfigError(dir.string() + ": the manifest or state.json lacks a field (" + e.what() +
                      "): the checkpoint is damaged");
  }
  const fs::path config_path = dir / "config.yaml";
  c.config = config_from_yaml(parse_yaml_text(contents.at("config.yaml"), config_path.string()),
                              config_path.string());
  if (contents.count("model.pt"))
    c.model_bytes = std::make_shared<const std::string>(std::move(contents.at("model.pt")));
  return c;
}

template <class Load>
void load_archive(const fs::path& path, Load&& load) {
  try {
    load(path.string());
  } catch (const c10::Error& e) {
    throw ConfigError(path.string() + ": cannot be loaded (" + e.what_without_backtrace() + ")");
  }
}

}  // namespace

nlohmann::json curve_json(const std::vector<CurvePoint>& curve) {
  json out = json::array();
  for (const auto& p : curve) out.push_back({p.step, p.loss});
  return out;
}

namespace {

std::string state_text(const CheckpointState& state) {
  json s = {{"step", state.step},
            {"epoch", state.epoch},
            {"index", state.index},
            {"tokens_per_second", state.tokens_per_second},
            {"seconds", state.seconds},
            {"world_size", state.world_size},
            {"train_curve", curve_json(state.train_curve)},
            {"valid_curve", curve_json(state.valid_curve)},
            {"pending_loss_sum", state.pending_loss_sum},
            {"pending_loss_count", state.pending_loss_count}};
  if (std::isfinite(state.first_loss)) s["first_loss"] = state.first_loss;
  return s.dump(1) + "\n";
}

// Writes `files` as RUN/checkpoint: into checkpoint.tmp, the manifest last, then swapped in.
void write_checkpoint(const fs::path& run_dir, const CheckpointManifest& manifest,
                      const std::vector<std::pair<std::string, std::string>>& files) {
  const fs::path dir = run_dir / "checkpoint";
  const fs::path tmp = run_dir / "checkpoint.tmp";
  const fs::path old = run_dir / "checkpoint.old";
  std::error_code error;
  remove_tree(tmp, error);
  fs::create_directories(tmp, error);
  if (error) throw ConfigError(tmp.string() + ": cannot create: " + error.message());
  json m = {{"format", kManifestFormat},
            {"step", manifest.step},
            {"fingerprint", manifest.fingerprint},
            {"vocabulary", manifest.vocabulary},
            {"extrap_version", extrap_version()},
            {"files", json::object()}};
  try {
    for (const auto& [name, bytes] : files) {
      write_file_durable(tmp / name, bytes);
      m["files"][name] = {{"bytes", bytes.size()}, {"xxh3", hex64(content_hash(bytes))}};
    }
    write_file_durable(tmp / "manifest.json", m.dump(1) + "\n");
    fsync_directory(tmp);
  } catch (...) {
    remove_tree(tmp, error);  // the previous checkpoint stays whole
    throw;
  }
  // Swap in the new checkpoint: the old one stays whole until the new one is complete, and no
  // reader sees the directories between the renames.
  {
    const SharedFileLock swapping(swap_lock_path(run_dir), SharedFileLock::Mode::exclusive);
    remove_tree(old, error);
    if (fs::exists(dir)) fs::rename(dir, old);
    fs::rename(tmp, dir);
    fsync_directory(run_dir);
  }
  remove_tree(old, error);
}

}  // namespace

void save_checkpoint(const fs::path& run_dir, const Config& config,
                     const CheckpointManifest& manifest, const CheckpointState& state,
                     TransformerLM& model, torch::optim::Optimizer* optimizer) {
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("model.pt", archive_bytes(model));
  if (optimizer) files.emplace_back("optimizer.pt", archive_bytes(*optimizer));
  files.emplace_back("rng.pt", archive_bytes(at::detail::getDefaultCPUGenerator().get_state()));
  // Dropout on a GPU draws from that GPU's own generator (Philox: a seed and an offset, which a
  // CUDA graph's replays advance as eager steps do), so it is saved too: without it a resumed
  // run would start that stream again from train.seed. Data-parallel ranks are seeded alike and
  // draw alike (the same shapes), so the leader's state is every rank's.
  if (const torch::Device device = device_of(model->parameters()); device.is_cuda())
    files.emplace_back("cuda_rng.pt", archive_bytes(at::globalContext().defaultGenerator(device).get_state()));
  files.emplace_back("state.json", state_text(state));
  files.emplace_back("config.yaml", YAML::Dump(config.to_yaml()) + "\n");
  write_checkpoint(run_dir, manifest, files);
}

void save_imported_checkpoint(const fs::path& run_dir, const Config& config, const CheckpointManifest& manifest,
                              const json& record) {
  std::vector<std::pair<std::string, std::string>> files;
  files.emplace_back("weights.json", record.dump(1) + "\n");
  files.emplace_back("state.json", state_text(CheckpointState{}));
  files.emplace_back("config.yaml", YAML::Dump(config.to_yaml()) + "\n");
  write_checkpoint(run_dir, manifest, files);
}

bool has_checkpoint(const fs::path& run_dir) {
  return fs::exists(run_dir / "checkpoint") || fs::exists(run_dir / "checkpoint.old");
}

std::optional<VerifiedCheckpoint> find_checkpoint(const fs::path& run_dir) {
  const fs::path dir = run_dir / "checkpoint", old = run_dir / "checkpoint.old";
  if (!fs::exists(dir) && !fs::exists(old)) return std::nullopt;
  const SharedFileLock reading(swap_lock_path(run_dir), SharedFileLock::Mode::shared);
  // A crash between the two renames of save_checkpoint leaves only checkpoint.old.
  if (fs::exists(dir)) return verify(dir);
  if (fs::exists(old)) return verify(old);
  return std::nullopt;
}

VerifiedCheckpoint require_checkpoint(const fs::path& run_dir) {
  if (!fs::exists(run_dir)) throw ConfigError(run_dir.string() + ": no such run directory");
  auto found = find_checkpoint(run_dir);
  if (!found)
    throw ConfigError(run_dir.string() + ": no checkpoint (expected " +
                      (run_dir / "checkpoint").string() + ")");
  return std::move(*found);
}

// Checkpoints load onto the device the model is on now, not the one they were saved from: a
// run trained on a GPU evaluates on a CPU and the other way round.
void load_model(const VerifiedCheckpoint& c, TransformerLM& model) {
  if (c.imported) {  // a Hugging Face folder's weights, verified against the record as they are read
    load_hf_record(*c.imported, (c.dir / "weights.json").string(), model);
    return;
  }
  const torch::Device device = device_of(model->parameters());
  TORCH_CHECK(c.model_bytes, "load_model: ", c.dir.string(), " was not verified");
  load_archive(c.dir / "model.pt", [&](const std::string&) {
    std::istringstream bytes(*c.model_bytes, std::ios::binary);
    torch::load(model, bytes, device);
  });
}

void load_optimizer(const VerifiedCheckpoint& c, torch::optim::Optimizer& optimizer) {
  const fs::path path = c.dir / "optimizer.pt";
  if (!fs::exists(path)) throw ConfigError(path.string() + ": missing (needed to resume)");
  const torch::Device device =
      optimizer.param_groups().empty() ? torch::Device(torch::kCPU) : device_of(optimizer.param_groups().front().params());
  load_archive(path, [&](const std::string& p) { torch::load(optimizer, p, device); });
}

bool load_rng(const VerifiedCheckpoint& c, const torch::Device& device) {
  const auto restore = [&](const fs::path& path, at::Generator generator) {
    load_archive(path, [&](const std::string& p) {
      torch::Tensor rng;
      torch::load(rng, p);
      generator.set_state(rng);
    });
  };
  restore(c.dir / "rng.pt", at::detail::getDefaultCPUGenerator());
  if (!device.is_cuda()) return true;
  const fs::path cuda = c.dir / "cuda_rng.pt";
  if (!fs::exists(cuda)) return false;
  restore(cuda, at::globalContext().defaultGenerator(device));
  return true;
}

}  // namespace extrap
