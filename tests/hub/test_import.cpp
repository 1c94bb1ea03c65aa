// `extrap import`: Hugging Face checkpoints of each family, built tiny and random by transformers
// itself (tests/import/make_checkpoints.py), evaluated by extrap. The oracle is transformers:
// its per-token log-probabilities (float32, written beside each folder) at lengths inside and
// beyond the model's training length must equal extrap's to 1e-5, relative (of at least 1).
#include "core/hub/hf_checkpoint.h"
#include "core/hub/safetensors_reader.h"
#include "core/run/checkpoint.h"
#include "core/run/import_run.h"
#include "core/run/run_dir.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"


#include <fstream>
#include <functional>
#include <mutex>

using namespace extrap;
using namespace extrap::testing;
using Catch::Matchers::Contains;

namespace {

constexpr double kTolerance = 1e-5;

// The families' tiny checkpoints, made once per test process.
const fs::path& checkpoints() {
  static TempDir dir("hf-checkpoints");
  static std::once_flag made;
  std::call_once(made, [] {
    const int code = run_python(dir, EXTRAP_SOURCE_DIR "/tests/import/make_checkpoints.py " + dir.root.string() + "/ckpt");
    if (code != 0) FAIL("make_checkpoints.py failed:\n" + read_text(dir.root / "python.log"));
  });
  static const fs::path root = dir.root / "ckpt";
  return root;
}

// A small corpus of the default corpus's prose: imported models evaluate on it.
const fs::path& corpus_dir() {
  static TempDir dir("hf-corpus");
  static std::once_flag made;
  std::call_once(made, [] {
    const std::string text = read_text(EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt");
    fs::create_directories(dir.root / "prose");
    write_text(dir.root / "prose/train.txt", text.substr(0, 40000));
    write_text(dir.root / "prose/valid.txt", text.substr(40000, 20000));
    write_text(dir.root / "prose/test.txt", text.substr(60000, 20000));
  });
  static const fs::path root = dir.root / "prose";
  return root;
}

struct Imported {
  Corpus corpus;
  LoadedRun run;
};

Imported import_and_load(const fs::path& folder, const fs::path& run, int64_t train_length = 0) {
  ImportOptions options;
  options.data = corpus_dir().string();
  options.train_length = train_length;
  import_checkpoint(folder, run, options);
  const VerifiedCheckpoint checkpoint = require_checkpoint(run);
  Imported out;
  out.corpus = load_corpus(checkpoint.config.data);
  out.run = load_run(checkpoint, out.corpus);
  return out;
}

// extrap's log p(tokens[i+1] | tokens[..i]) for the reference's tokens, against transformers'.
void check_logprobs(const std::string& name, TransformerLM& model) {
  const SafetensorsReader reference = SafetensorsReader::open(checkpoints() / name / "reference.safetensors");
  const auto tokens = reference.tensor("tokens").to(torch::kLong).unsqueeze(0);  // (1, T)
  const auto expected = reference.tensor("logprobs").to(torch::kFloat64);       // (T - 1)
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(tokens).to(torch::kFloat64).squeeze(0);    // (T, V)
  const auto T = tokens.size(1);
  const auto got = logits.log_softmax(-1).narrow(0, 0, T - 1).gather(1, tokens.squeeze(0).narrow(0, 1, T - 1).unsqueeze(1)).squeeze(1);
  REQUIRE(got.sizes() == expected.sizes());
  const double error = ((got - expected).abs() / expected.abs().clamp_min(1.0)).max().item<double>();
  INFO(name << ": " << T << " tokens, largest relative difference " << error);
  CHECK(error <= kTolerance);
}

}  // namespace

TEST_CASE("import: each family's log-probabilities equal transformers', inside and beyond its length",
          "[import][python]") {
  for (const std::string name :
       {"llama", "llama_tied", "mistral", "qwen2", "gpt2", "bloom", "bloom_h8", "gpt_neox", "gpt_neox_seq", "mpt"}) {
    DYNAMIC_SECTION(name) {
      TempDir d("import");
      // BLOOM's config.json gives no training length: the fixtures' is 64.
      Imported m = import_and_load(checkpoints() / name, d.root / "run", name.rfind("bloom", 0) == 0 ? 64 : 0);
      check_logprobs(name, m.run.model);
    }
  }
}

TEST_CASE("import: float16, bfloat16 and sharded weights load exactly", "[import][python]") {
  for (const std::string name : {"llama_bf16", "llama_fp16", "llama_sharded"}) {
    DYNAMIC_SECTION(name) {
      TempDir d("import");
      Imported m = import_and_load(checkpoints() / name, d.root / "run");
      check_logprobs(name, m.run.model);
    }
  }
}

namespace {

// A copy of fixture `name` in `d`, to damage.
fs::path copy_of(const TempDir& d, const std::string& name) {
  const fs::path to = d.root / ("copy-" + name);
  fs::copy(checkpoints() / name, to, fs::copy_options::recursive);
  return to;
}

void edit_config(const fs::path& folder, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json config = read_json(folder / "config.json");
  edit(config);
  write_text(folder / "config.json", config.dump(1));
}

// Importing `folder` is refused with a message containing `what`, and nothing is written.
void check_refused(const fs::path& folder, const fs::path& run, const std::string& what) {
  ImportOptions options;
  options.data = corpus_dir().string();
  options.train_length = 64;
  CHECK_THROWS_WITH(import_checkpoint(folder, run, options), Contains(what));
  CHECK_FALSE(fs::exists(run));
}

}  // namespace

TEST_CASE("import: bad folders are refused in one line, nothing written", "[import][python]") {
  TempDir d("import-bad");
  const fs::path run = d.root / "run";
  SECTION("a missing shard") {
    const fs::path f = copy_of(d, "llama_sharded");
    const auto index = read_json(f / "model.safetensors.index.json");
    const std::string shard = index.at("weight_map").begin()->get<std::string>();
    fs::remove(f / shard);
    check_refused(f, run, (f / shard).string() + ": missing");
  }
  SECTION("a truncated weights file") {
    const fs::path f = copy_of(d, "llama");
    fs::resize_file(f / "model.safetensors", fs::file_size(f / "model.safetensors") - 1000);
    check_refused(f, run, "truncated");
  }
  SECTION("a config of another family") {
    const fs::path f = copy_of(d, "llama");
    fs::copy_file(checkpoints() / "gpt2" / "config.json", f / "config.json", fs::copy_options::overwrite_existing);
    check_refused(f, run, "not the weights of this config's family");
  }
  SECTION("a vocabulary that disagrees with the embedding") {
    const fs::path f = copy_of(d, "llama");
    edit_config(f, [](nlohmann::json& c) { c["vocab_size"] = 408; });
    check_refused(f, run, "model.embed_tokens.weight give [400, 128] for extrap's embedding.weight, which config.json makes [408, 128]");
  }
  SECTION("a tokenizer with more ids than the model has rows") {
    const fs::path f = copy_of(d, "gpt2");
    edit_config(f, [](nlohmann::json& c) { c["vocab_size"] = 300; });
    check_refused(f, run, "the tokenizer does not match the model");
  }
  SECTION("a config key extrap does not implement") {
    const fs::path f = copy_of(d, "llama");
    edit_config(f, [](nlohmann::json& c) { c["attn_logit_softcapping"] = 50.0; });
    check_refused(f, run, "config.json: attn_logit_softcapping 50.0 is not implemented by extrap's llama mapping");
  }
  SECTION("RoPE scaling in config.json, and families not imported yet") {
    check_refused(checkpoints() / "llama_linear", run, "rope_scaling rope_type \"linear\"");
    check_refused(checkpoints() / "llama_yarn_v5", run, "rope_parameters rope_type \"yarn\"");
    check_refused(checkpoints() / "falcon_rw", run, "model_type \"falcon\" is not a family extrap imports");
  }
  SECTION("a folder without tokenizer.json") {
    const fs::path f = copy_of(d, "llama");
    fs::remove(f / "tokenizer.json");
    check_refused(f, run, "no tokenizer.json");
  }
}

TEST_CASE("import: weights that change after the import are refused when loaded", "[import][python]") {
  TempDir d("import-changed");
  const fs::path f = copy_of(d, "llama");
  ImportOptions options;
  options.data = corpus_dir().string();
  import_checkpoint(f, d.root / "run", options);
  CHECK_THROWS_WITH(import_checkpoint(f, d.root / "run", options), Contains("already holds a run (--overwrite replaces it)"));
  const VerifiedCheckpoint checkpoint = require_checkpoint(d.root / "run");
  CHECK(checkpoint.is_imported());
  const Corpus corpus = load_corpus(checkpoint.config.data);
  {
    std::fstream file(f / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.write("\x01\x02\x03\x04", 4);
  }
  CHECK_THROWS_WITH(load_run(checkpoint, corpus),
                    Contains((f / "model.safetensors").string() + " changed since it was imported"));
}
