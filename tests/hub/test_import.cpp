// `extrap import`: Hugging Face checkpoints of each family, built tiny and random by transformers
// itself (tests/import/make_checkpoints.py), evaluated by extrap. The oracle is transformers:
// its per-token log-probabilities (float32, written beside each folder) at lengths inside and
// beyond the model's training length must equal extrap's to 1e-5, relative (of at least 1).
#include "core/base/hashing.h"
#include "core/data/hf_tokenizer.h"
#include "core/data/sentencepiece.h"
#include "core/export/hf_export.h"
#include "core/export/safetensors.h"
#include "core/hub/hf_checkpoint.h"
#include "core/hub/safetensors_reader.h"
#include "core/results/results_store.h"
#include "core/run/checkpoint.h"
#include "core/run/import_run.h"
#include "core/run/run_dir.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"


#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

using namespace extrap;
using namespace extrap::testing;
using Catch::Matchers::Contains;

namespace {

constexpr double kTolerance = 1e-5;

// The families' tiny checkpoints. make_checkpoints.py takes about 10 s and every test process of
// this file needs its folders, so the first process makes them under the build tree, in a folder
// named by the hash of what they depend on (the script, the text it tokenises, the Python
// interpreter and the installed packages' versions), holding an exclusive lock meanwhile; the
// others wait for the lock and read them. The folder appears by a rename, complete or not at all,
// and replaces those of other keys. Tests copy a folder before changing it (copy_of).
const fs::path& checkpoints() {
  static const fs::path root = [] {
    const std::string script = EXTRAP_SOURCE_DIR "/tests/import/make_checkpoints.py";
    TempDir probe("hf-versions");
    std::string versions;
    const int probed = run_python(probe,
                                  "-c \"import importlib.metadata as m, sys; print(sys.version, sorted((str("
                                  "d.metadata['Name']), d.version) for d in m.distributions()))\"",
                                  &versions);
    if (probed != 0) FAIL("the Python packages' versions: " + versions);
    const std::string key =
        hex64(content_hash(read_text(script) + read_text(EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt") + versions));
    const fs::path cache = fs::path(EXTRAP_BINARY_DIR) / "tests" / "hf-checkpoints" / key;
    fs::create_directories(cache.parent_path());
    struct Lock {
      int fd;
      explicit Lock(const fs::path& path) : fd(::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)) {
        if (fd < 0 || ::flock(fd, LOCK_EX) != 0) FAIL("cannot lock " + path.string());
      }
      ~Lock() { ::close(fd); }  // releases the lock
    } lock(cache.string() + ".lock");
    if (!fs::exists(cache)) {
      const fs::path partial = cache.string() + ".partial";
      fs::remove_all(partial);  // a process killed while making it
      TempDir d("hf-checkpoints");
      const int code = run_python(d, script + " " + partial.string());
      if (code != 0) FAIL("make_checkpoints.py failed:\n" + read_text(d.root / "python.log"));
      fs::rename(partial, cache);
      for (const auto& entry : fs::directory_iterator(cache.parent_path()))  // older scripts' or packages'
        if (entry.is_directory() && entry.path() != cache) fs::remove_all(entry.path());
    }
    return cache;
  }();
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

// The model's log p(tokens[i+1] | tokens[..i]) for one sequence (T,) int64: (T - 1,) float64.
torch::Tensor next_token_logprobs(TransformerLM& model, const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const int64_t T = tokens.size(0);
  const auto logits = model->forward(tokens.unsqueeze(0)).to(torch::kFloat64).squeeze(0);  // (T, V)
  return logits.log_softmax(-1).narrow(0, 0, T - 1).gather(1, tokens.narrow(0, 1, T - 1).unsqueeze(1)).squeeze(1);
}

// extrap's log p(tokens[i+1] | tokens[..i]) for the reference's tokens, against transformers'.
void check_logprobs(const std::string& name, TransformerLM& model) {
  const SafetensorsReader reference = SafetensorsReader::open(checkpoints() / name / "reference.safetensors");
  const auto tokens = reference.tensor("tokens").to(torch::kLong);          // (T)
  const auto expected = reference.tensor("logprobs").to(torch::kFloat64);  // (T - 1)
  const auto T = tokens.size(0);
  const auto got = next_token_logprobs(model, tokens);
  REQUIRE(got.sizes() == expected.sizes());
  const double error = ((got - expected).abs() / expected.abs().clamp_min(1.0)).max().item<double>();
  INFO(name << ": " << T << " tokens, largest relative difference " << error);
  CHECK(error <= kTolerance);
}

}  // namespace

TEST_CASE("import: each family's log-probabilities equal transformers', inside and beyond its length",
          "[import][python]") {
  for (const std::string name :
       {"llama", "llama_tied", "mistral", "mistral_spm", "qwen2", "qwen2_windows", "qwen2_windows_hub", "qwen3", "qwen3_windows", "qwen3_wide_heads", "mistral_narrow_heads", "phi3", "gemma", "gemma2", "gemma2_uncapped", "gemma3", "gemma3_v5", "gemma3_multimodal", "gemma3_multimodal_v5", "olmo", "olmo2", "olmo3", "olmo3_v5", "gpt2", "bloom", "bloom_h8", "gpt_neox",
        "gpt_neox_seq", "mpt", "mpt_clip", "falcon_rw", "falcon_alibi_mq", "falcon_7b", "falcon_40b", "falcon_seq"}) {
    DYNAMIC_SECTION(name) {
      TempDir d("import");
      // BLOOM's config.json gives no training length: the fixtures' is 64.
      Imported m = import_and_load(checkpoints() / name, d.root / "run", name.rfind("bloom", 0) == 0 ? 64 : 0);
      check_logprobs(name, m.run.model);
      torch::NoGradGuard no_grad;
      check_causal_and_cached(m.run.model);  // generation's KV cache: the logits of one pass
    }
  }
}

TEST_CASE("import: a SentencePiece tokenizer as transformers converts it gives transformers' tokens",
          "[import][python]") {
  // mistral_spm's tokenizer.json is what transformers makes of a folder holding only a
  // SentencePiece tokenizer.model (Metaspace, byte fallback, BOS <s>); its reference tokens are
  // that tokenizer's ids for the first text_chars characters of the text.
  TempDir d("import-spm");
  const fs::path folder = checkpoints() / "mistral_spm";
  Imported m = import_and_load(folder, d.root / "run");
  REQUIRE(m.corpus.hf);
  const SafetensorsReader reference = SafetensorsReader::open(folder / "reference.safetensors");
  const auto tokens = reference.tensor("tokens").to(torch::kLong);
  const std::string text = read_text(EXTRAP_SOURCE_DIR "/data/pydoc/valid.txt");
  const auto chars = std::stoul(reference.metadata().at("text_chars"));
  size_t bytes = 0;  // the first `chars` characters, UTF-8
  for (size_t c = 0; c < chars; ++c) {
    bytes += 1;
    while (bytes < text.size() && (uint8_t(text[bytes]) & 0xC0) == 0x80) ++bytes;
  }
  const auto ids = m.corpus.hf->encode(text.substr(0, bytes)).ids;
  REQUIRE(int64_t(ids.size()) >= tokens.size(0));
  CHECK(std::equal(ids.begin(), ids.begin() + tokens.size(0), tokens.data_ptr<int64_t>()));
  CHECK(ids[0] == m.corpus.hf->bos().value());
  // A folder with only the tokenizer.model is refused with the command that converts it.
  const fs::path only_model = d.root / "only-model";
  fs::create_directories(only_model);
  for (const auto& entry : fs::directory_iterator(folder))
    if (entry.path().filename() != "tokenizer.json") fs::copy_file(entry.path(), only_model / entry.path().filename());
  write_text(only_model / "tokenizer.model", "not read");
  ImportOptions options;
  options.data = corpus_dir().string();
  CHECK_THROWS_WITH(import_checkpoint(only_model, d.root / "run2", options),
                    Contains("only a SentencePiece tokenizer.model: write the tokenizer.json transformers converts it "
                             "to, with python -c \"from transformers import AutoTokenizer"));
  CHECK_FALSE(fs::exists(d.root / "run2"));
}

TEST_CASE("import: RoPE scaling in config.json is built into the model, as transformers computes it",
          "[import][python]") {
  // (phi3_longrope: LongRoPE's long factors at 160 tokens, past the original 64; _short: its
  // short ones at 48.)
  for (const std::string name : {"llama_linear", "llama_dynamic", "llama_yarn", "llama_llama3", "llama_yarn_v5",
                                 "phi3_longrope", "phi3_longrope_short", "olmo_linear", "olmo2_yarn"}) {
    DYNAMIC_SECTION(name) {
      TempDir d("import");
      Imported m = import_and_load(checkpoints() / name, d.root / "run");
      check_logprobs(name, m.run.model);
      // Evaluation-time scaling on top would compound: refused; none keeps the built-in one.
      RopeScaling linear;
      linear.kind = RopeScalingKind::linear;
      linear.factor = 2;
      CHECK_THROWS_WITH(m.run.model->set_rope_scaling(linear), Contains("built in"));
      m.run.model->set_rope_scaling(RopeScaling{});
      check_logprobs(name, m.run.model);
      torch::NoGradGuard no_grad;
      check_causal_and_cached(m.run.model);
    }
  }
}

TEST_CASE("import: an ALiBi family's rounding is its own, and the exact bias a named option", "[import][python]") {
  TempDir d("import");
  // Falcon's bias, bfloat16(bfloat16(m) j) / sqrt(d_head), is what transformers computes (the
  // families' test above); the exact one differs, and by more at 16 heads than float32 noise.
  ImportOptions options;
  options.data = corpus_dir().string();
  options.alibi_bias = "exact";
  import_checkpoint(checkpoints() / "falcon_rw", d.root / "exact", options);
  const VerifiedCheckpoint checkpoint = require_checkpoint(d.root / "exact");
  CHECK(checkpoint.config.position["bias_scale"]);
  CHECK_FALSE(checkpoint.config.position["round_slopes"]);
  const Corpus corpus = load_corpus(checkpoint.config.data);
  LoadedRun exact = load_run(checkpoint, corpus);
  const SafetensorsReader reference = SafetensorsReader::open(checkpoints() / "falcon_rw" / "reference.safetensors");
  const auto got = next_token_logprobs(exact.model, reference.tensor("tokens").to(torch::kLong));
  const double difference = (got - reference.tensor("logprobs").to(torch::kFloat64)).abs().max().item<double>();
  CHECK(difference > 1e-3);
  // BLOOM in a bfloat16 run: m j rounded; the rounding shows against the exact bias.
  options.alibi_bias = "bfloat16";
  options.train_length = 64;  // BLOOM's config.json gives none
  import_checkpoint(checkpoints() / "bloom", d.root / "bf16", options);
  CHECK(require_checkpoint(d.root / "bf16").config.position["round_to"].as<std::string>() == "bfloat16");
  options.alibi_bias = "bfloat16";
  CHECK_THROWS_WITH(import_checkpoint(checkpoints() / "llama", d.root / "no", options), Contains("without ALiBi"));
}

TEST_CASE("import: every family extrap reads has its row in docs/released.md", "[import][docs]") {
  // The table's first column names each model_type in backticks; a family added without its row
  // (what it maps to, what it refuses) fails here.
  const std::string doc = read_text(EXTRAP_SOURCE_DIR "/docs/released.md");
  std::set<std::string> documented;
  std::istringstream lines(doc);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string first = line.substr(1, line.find(" | ") - 1);
    for (size_t at = first.find('`'); at != std::string::npos;) {  // each `name` in it
      const size_t end = first.find('`', at + 1);
      if (end == std::string::npos) break;
      documented.insert(first.substr(at + 1, end - at - 1));
      at = first.find('`', end + 1);
    }
  }
  for (const std::string& family : hf_families()) {
    INFO(family);
    CHECK(documented.count(family) == 1);
  }
}

TEST_CASE("import: Gemma 3's multimodal weights load under either layout, the vision tower's unread",
          "[import][python]") {
  // The fixture is stored as the Hub's folders and save_pretrained store it (language_model.model.*,
  // vision_tower.*); transformers' own module names put everything under model. (model.language_model.*,
  // model.vision_tower.*): the same weights, the same numbers.
  TempDir d("import-gemma3-layout");
  const fs::path from = checkpoints() / "gemma3_multimodal", to = d.root / "renamed";
  fs::create_directories(to);
  for (const auto& entry : fs::directory_iterator(from))
    if (entry.path().filename() != "model.safetensors") fs::copy_file(entry.path(), to / entry.path().filename());
  const SafetensorsReader stored = SafetensorsReader::open(from);
  std::vector<std::pair<std::string, torch::Tensor>> renamed;
  size_t vision = 0;
  for (const std::string& name : stored.names()) {
    std::string to_name = "model." + name;
    if (name.rfind("language_model.model.", 0) == 0) to_name = "model.language_model." + name.substr(21);
    vision += name.rfind("vision_tower.", 0) == 0 || name.rfind("multi_modal_projector.", 0) == 0;
    renamed.emplace_back(to_name, stored.tensor(name).clone());
  }
  CHECK(vision > 10);  // (the tower is there, and unread)
  write_text(to / "model.safetensors", encode_safetensors(renamed, {}));
  Imported m = import_and_load(to, d.root / "run");
  check_logprobs("gemma3_multimodal", m.run.model);
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
  SECTION("Gemma 2's caps, score scale and windows out of range") {
    const fs::path f = copy_of(d, "gemma2");
    edit_config(f, [](nlohmann::json& c) { c["sliding_window"] = nullptr; });  // and no layer_types: the even layers
    check_refused(f, run, "config.json: sliding_window is null while some layers slide (Gemma2Config's default: "
                          "the even layers): transformers' mask is undefined");
    edit_config(f, [](nlohmann::json& c) { c["sliding_window"] = 16; c["attn_logit_softcapping"] = -5; });
    check_refused(f, run, "config.json: attn_logit_softcapping -5 must be a finite number above 0, or null");
    edit_config(f, [](nlohmann::json& c) { c["attn_logit_softcapping"] = 50; c["query_pre_attn_scalar"] = 0; });
    check_refused(f, run, "config.json: query_pre_attn_scalar 0 must be a finite number above 0");
  }
  SECTION("Gemma 3's scores capped, which transformers' class ignores, and an older rope_scaling type") {
    const fs::path f = copy_of(d, "gemma3");
    edit_config(f, [](nlohmann::json& c) { c["attn_logit_softcapping"] = 50.0; });
    check_refused(f, run, "config.json: attn_logit_softcapping 50.0 is not imported: transformers 5.24's Gemma 3 "
                          "stores it and caps nothing with it");
    edit_config(f, [](nlohmann::json& c) {
      c["attn_logit_softcapping"] = nullptr;
      c["rope_scaling"] = {{"type", "linear"}, {"factor", 8.0}};
    });
    check_refused(f, run, "config.json: rope_scaling.type \"linear\" without rope_type: transformers 5.24's Gemma 3 "
                          "ignores it and scales nothing");
  }
  SECTION("Gemma 3's multimodal folders: what its class does not compute, or weights of another model") {
    const fs::path f = copy_of(d, "gemma3_multimodal");
    edit_config(f, [](nlohmann::json& c) { c["text_config"]["final_logit_softcapping"] = 30.0; });
    check_refused(f, run, "config.json text_config: final_logit_softcapping 30.0 is not imported: transformers "
                          "5.24's Gemma3ForConditionalGeneration caps no logits");
    edit_config(f, [](nlohmann::json& c) {
      c["text_config"].erase("final_logit_softcapping");
      c["tie_word_embeddings"] = false;
    });
    check_refused(f, run, "config.json: tie_word_embeddings false is not imported: Gemma 3's multimodal folders tie");
    edit_config(f, [](nlohmann::json& c) {
      c.erase("tie_word_embeddings");
      c["text_config"]["model_type"] = "gemma2";
    });
    check_refused(f, run, "config.json text_config: model_type \"gemma2\" is not Gemma 3's text model");
    edit_config(f, [](nlohmann::json& c) {
      c["text_config"]["model_type"] = "gemma3_text";
      c["text_config"]["num_attention_heads"] = 4;  // the weights are of 8 heads (Gemma3TextConfig's default)
    });
    check_refused(f, run, "self_attn.q_proj.weight");
    edit_config(f, [](nlohmann::json& c) { c["text_config"].erase("num_attention_heads"); c["text_config"]["clip_qkv"] = 8; });
    check_refused(f, run, "config.json text_config: clip_qkv 8 is not implemented by extrap's gemma3 (text_config) mapping");
    edit_config(f, [](nlohmann::json& c) { c["text_config"].erase("clip_qkv"); c.erase("text_config"); });
    check_refused(f, run, "config.json: text_config must be an object: Gemma 3's text model");
  }
  SECTION("OLMo's and MPT's clip_qkv: 0 where OLMo's class would clamp everything, below float32, negative; and "
          "biases in OLMo's attention") {
    const fs::path f = copy_of(d, "olmo");
    edit_config(f, [](nlohmann::json& c) { c["clip_qkv"] = 0; });
    check_refused(f, run, "config.json: clip_qkv 0 must be null (off) or a number within float32's normal range");
    edit_config(f, [](nlohmann::json& c) { c["clip_qkv"] = 1e-60; });
    check_refused(f, run, "config.json: clip_qkv 1e-60 must be null (off) or a number within float32's normal range");
    edit_config(f, [](nlohmann::json& c) { c["clip_qkv"] = "8"; });
    check_refused(f, run, "config.json: clip_qkv \"8\" must be a number or null");
    edit_config(f, [](nlohmann::json& c) { c["clip_qkv"] = 1.5; c["attention_bias"] = true; });
    check_refused(f, run, "config.json: attention_bias true is not imported (no biases in the attention projections)");
    const fs::path m = copy_of(d, "mpt_clip");
    edit_config(m, [](nlohmann::json& c) { c["attn_config"]["clip_qkv"] = -1.0; });
    check_refused(m, run, "config.json: attn_config.clip_qkv -1 must be null (off), 0 (off) or a number within");
  }
  SECTION("OLMo 3's top-level rope_theta, which transformers gives to the global layers alone") {
    const fs::path f = copy_of(d, "olmo3");
    edit_config(f, [](nlohmann::json& c) { c["rope_theta"] = 10000.0; });
    check_refused(f, run, "config.json: rope_theta 10000 at the top level: transformers 5.24's OLMo 3 gives it to "
                          "the full_attention layers alone and 500000 to the sliding ones; write "
                          "rope_parameters.sliding_attention.rope_theta to say which");
    edit_config(f, [](nlohmann::json& c) {
      c["rope_theta"] = 500000.0;
      c["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}};
    });
    check_refused(f, run, "config.json: rope_scaling.type \"yarn\" without rope_type: transformers 5.24's OLMo 3 "
                          "ignores it and scales nothing");
    edit_config(f, [](nlohmann::json& c) {
      c["rope_scaling"] = nullptr;
      c["sliding_window"] = nullptr;
    });
    check_refused(f, run, "config.json: sliding_window is null while some layers slide (Olmo3Config's default: 3 "
                          "of every 4 layers): transformers' mask is undefined");
    edit_config(f, [](nlohmann::json& c) { c["sliding_window"] = 16; c["rope_parameters"] = {{"global", {}}}; });
    check_refused(f, run, "config.json: rope_parameters.global is not one of OLMo 3's kinds of layer");
  }
  SECTION("RoPE scaling of another kind or meaning, and families not imported yet") {
    const fs::path f = copy_of(d, "llama_yarn");
    edit_config(f, [](nlohmann::json& c) { c["rope_scaling"]["mscale"] = 0.7; });
    check_refused(f, run, "config.json: rope_scaling.mscale 0.7 is not imported with rope_type yarn");
    edit_config(f, [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 4.0}}; });
    check_refused(f, run, "rope_scaling.short_factor must be a list of numbers, one for each rotated pair");
    edit_config(f, [](nlohmann::json& c) { c["rope_scaling"] = {{"rope_type", "mrope"}, {"factor", 4.0}}; });
    check_refused(f, run, "rope_type \"mrope\" is not imported (linear, dynamic, yarn, llama3 and longrope are)");
    // Falcon: what transformers' class cannot run, or runs otherwise than the original code.
    const fs::path g = copy_of(d, "falcon_40b");
    edit_config(g, [](nlohmann::json& c) { c["parallel_attn"] = false; });
    check_refused(g, run, "config.json: parallel_attn is false with new_decoder_architecture: transformers' Falcon cannot run it");
    edit_config(g, [](nlohmann::json& c) { c["parallel_attn"] = true; c["num_kv_heads"] = 3; });
    check_refused(g, run, "config.json: num_kv_heads 3 does not divide num_attention_heads 8");
    const fs::path s = copy_of(d, "falcon_seq");
    edit_config(s, [](nlohmann::json& c) { c["num_kv_heads"] = 2; });
    check_refused(s, run, "config.json: num_kv_heads 2 differs from num_attention_heads without the new decoder architecture or multi_query");
    const fs::path f7 = copy_of(d, "falcon_7b");
    edit_config(f7, [](nlohmann::json& c) { c["apply_residual_connection_post_layernorm"] = true; });
    check_refused(f7, run, "config.json: apply_residual_connection_post_layernorm true is not imported (the residual taken after the norm)");
    edit_config(f7, [](nlohmann::json& c) {
      c["apply_residual_connection_post_layernorm"] = false;
      c["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}};
    });
    check_refused(f7, run, "config.json: partial_rotary_factor 0.5 is not imported: Falcon's rotary turns the whole head");
    edit_config(f7, [](nlohmann::json& c) { c.erase("rope_parameters"); c["num_ln_in_parallel_attn"] = 2; });
    check_refused(f7, run, "config.json: num_ln_in_parallel_attn 2 without new_decoder_architecture: transformers' Falcon cannot run it");
    const fs::path q = copy_of(d, "qwen2_windows");
    edit_config(q, [](nlohmann::json& c) { c["layer_types"][1] = "chunked_attention"; });
    check_refused(q, run, "config.json: layer_types lists \"chunked_attention\": extrap imports full_attention and sliding_attention");
    edit_config(q, [](nlohmann::json& c) { c["layer_types"] = {"full_attention", "sliding_attention"}; });
    check_refused(q, run, "config.json: layer_types must list one of full_attention, sliding_attention for each of the 3 layers");
    edit_config(q, [](nlohmann::json& c) {
      c["layer_types"] = {"full_attention", "sliding_attention", "sliding_attention"};
      c["sliding_window"] = nullptr;
    });
    check_refused(q, run, "config.json: sliding_window is null while some layers slide (layer_types names "
                          "sliding_attention layers)");
    const fs::path q3 = copy_of(d, "qwen3");
    edit_config(q3, [](nlohmann::json& c) { c["head_dim"] = nullptr; });
    check_refused(q3, run, "config.json: head_dim is null, which Qwen3's attention would take as its heads' width");
    edit_config(q3, [](nlohmann::json& c) { c["head_dim"] = 0; });
    check_refused(q3, run, "config.json: head_dim 0 must be at least 1");
    edit_config(q3, [](nlohmann::json& c) { c["head_dim"] = 16; c["attention_bias"] = true; });
    check_refused(q3, run, "config.json: attention_bias true is not imported (no biases in the attention projections)");
    // Keys left out take Qwen2Config's defaults: a window of 4096 from layer 28 on (none of 3).
    edit_config(q, [](nlohmann::json& c) {
      for (const char* key : {"layer_types", "sliding_window", "max_window_layers"}) c.erase(key);
    });
    ImportOptions options;
    options.data = corpus_dir().string();
    import_checkpoint(q, d.root / "defaults", options);
    CHECK(require_checkpoint(d.root / "defaults").config.model.attention_options.window == 0);
    CHECK(require_checkpoint(d.root / "defaults").config.layer_pattern.empty());
    edit_config(q, [](nlohmann::json& c) { c["max_window_layers"] = 0; });
    import_checkpoint(q, d.root / "defaults", (options.overwrite = true, options));
    CHECK(require_checkpoint(d.root / "defaults").config.model.attention_options.window == 4096);
  }
  SECTION("a folder without tokenizer.json") {
    const fs::path f = copy_of(d, "llama");
    fs::remove(f / "tokenizer.json");
    check_refused(f, run, "no tokenizer.json");
  }
}

TEST_CASE("import: Phi-3's older rope types are LongRoPE, LongRoPE's factors are checked, and a partial rotary is "
          "Phi-3's alone",
          "[import][python]") {
  TempDir d("import");
  const fs::path run = d.root / "run";
  // Phi3Config reads rope_type su (and yarn) as longrope: the same numbers as the longrope folder.
  const fs::path su = copy_of(d, "phi3_longrope");
  edit_config(su, [](nlohmann::json& c) { c["rope_scaling"]["type"] = "su"; });
  {
    Imported m = import_and_load(su, d.root / "su");
    check_logprobs("phi3_longrope", m.run.model);
  }
  // A Llama config's su is no rope type of Llama's.
  edit_config(su, [](nlohmann::json& c) { c["model_type"] = "llama"; });
  check_refused(su, run, "config.json: rope_scaling rope_type \"su\" is not imported");
  const fs::path bad = su;
  edit_config(bad, [](nlohmann::json& c) {
    c["model_type"] = "phi3";
    c["rope_scaling"]["long_factor"].erase(0);
  });
  check_refused(bad, run, "config.json: rope_scaling.long_factor has 5 factors for the 6 rotated pairs of each head");
  edit_config(bad, [](nlohmann::json& c) { c["rope_scaling"]["long_factor"] = {1, 2, 3, 4, 5, -6}; });
  check_refused(bad, run, "config.json: rope_scaling.long_factor holds -6; each factor must be a number above 0");
  // Llama's class ignores a partial_rotary_factor without a scaling (its rotation takes the whole
  // head) and cannot run one with a scaling: extrap does the same, and refuses the other.
  const fs::path partial = copy_of(d, "llama");
  edit_config(partial, [](nlohmann::json& c) { c["partial_rotary_factor"] = 0.5; });
  {
    Imported m = import_and_load(partial, d.root / "partial");
    check_logprobs("llama", m.run.model);
  }
  const fs::path partial_yarn = copy_of(d, "llama_yarn");
  edit_config(partial_yarn, [](nlohmann::json& c) { c["partial_rotary_factor"] = 0.5; });
  check_refused(partial_yarn, run, "config.json: partial_rotary_factor 0.5 with rope_type yarn: transformers' llama "
                                   "class cannot run it");
  edit_config(bad, [](nlohmann::json& c) {
    c["rope_scaling"]["long_factor"] = {1, 2, 3, 4, 5, 6};
    c["max_position_embeddings"] = 32;  // below the original 64: a factor of 0.5
  });
  check_refused(bad, run, "config.json: rope_scaling.factor 0.5 (max_position_embeddings / the original length where "
                          "none is given) must be at least 1 for rope_type longrope");
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

TEST_CASE("export --format hf: transformers loads each family with its own class, and the round trip holds",
          "[import][python][export]") {
  TempDir d("hf-export");
  // (qwen2_windows: sliding windows on layers 1 and 2 of 3, a layer pattern in extrap, Qwen2's
  // layer_types again in the folder.)
  const std::vector<std::string> names = {"llama", "llama_tied", "mistral", "qwen2", "qwen2_windows", "qwen2_windows_hub",
                                          "qwen3", "qwen3_windows", "qwen3_wide_heads", "mistral_narrow_heads",
                                          "phi3", "phi3_longrope", "phi3_longrope_short", "gemma", "gemma2", "gemma2_uncapped", "gemma3", "gemma3_v5", "gemma3_multimodal", "olmo", "olmo_linear", "olmo2", "olmo3", "olmo3_v5", "gpt2", "bloom", "gpt_neox", "mpt", "mpt_clip", "falcon_rw", "falcon_alibi_mq", "falcon_7b", "falcon_40b",
                                          "falcon_seq", "llama_yarn"};
  std::string args;  // one Python process checks every folder
  for (const std::string& name : names) {
    INFO(name);
    import_and_load(checkpoints() / name, d.root / name, name == "bloom" ? 64 : 0);
    const HfExportSummary s = export_hf(d.root / name, d.root / (name + "-hf"), false);
    CHECK(s.family != "extrap");
    CHECK(s.tokenizer);
    CHECK_FALSE(fs::exists(d.root / (name + "-hf.tmp")));
    args += " " + (d.root / (name + "-hf")).string() + " " + (checkpoints() / name / "reference.safetensors").string();
    CHECK_THROWS_WITH(export_hf(d.root / name, d.root / (name + "-hf"), false), Contains("exists (add --overwrite"));
  }
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/import/check_hf_export.py" + args);
  INFO(read_text(d.root / "python.log"));
  CHECK(code == 0);
  for (const std::string& name : names) {  // extrap -> transformers' folder -> extrap gives the same numbers
    Imported again = import_and_load(d.root / (name + "-hf"), d.root / (name + "-again"), name == "bloom" ? 64 : 0);
    check_logprobs(name, again.run.model);
  }
  // What the remote code does not compute is refused before anything is written.
  CHECK_THROWS_WITH(export_hf(d.root / "llama_yarn", d.root / "remote", false, HfClass::remote),
                    Contains("extrap's remote code does not compute RoPE scaling yarn built in"));
  CHECK_FALSE(fs::exists(d.root / "remote"));
  CHECK_FALSE(fs::exists(d.root / "remote.tmp"));
}

namespace {

// tiny_config's rotary model in Llama's block: half pairing, RMSNorm, SwiGLU, no biases, untied.
Config llama_block_config() {
  Config c = tiny_config("rotary");
  c.position["pairing"] = "half";
  c.model.norm = NormKind::rmsnorm;
  c.model.ffn = FfnKind::swiglu;
  c.model.bias = false;
  c.model.tie_embeddings = false;
  return c;
}

}  // namespace

TEST_CASE("export --format hf: what each of Llama's kin computes picks its class, and the rest is refused by name",
          "[export][hf]") {
  // No weights needed: the class is the config's (hf_export_config), so each case is a config.
  Config llama = llama_block_config();
  const auto family = [](const Config& c) { return hf_export_config(c, 256).family; };
  const auto refused = [](const Config& c, const std::string& what) {
    CHECK_THROWS_WITH(hf_export_config(c, 256), Contains(what));
  };
  CHECK(family(llama) == "llama");
  Config olmo = llama;  // OLMo: norms after the sublayers, q and k normed over the projection
  olmo.model.sublayer_norms = SublayerNorms::output;
  olmo.model.qk_norm = true;
  olmo.model.qk_norm_over = QkNormOver::projection;
  CHECK(family(olmo) == "olmo2");
  Config olmo_window = olmo;  // a window on every layer: OLMo 3's class, every layer sliding
  olmo_window.model.attention_options.window = 4;
  const HfExportConfig windowed = hf_export_config(olmo_window, 256);
  CHECK(windowed.family == "olmo3");
  CHECK(windowed.config.at("layer_types") == nlohmann::json({"sliding_attention", "sliding_attention"}));
  CHECK(windowed.config.at("sliding_window") == 4);
  CHECK(windowed.config.at("rope_parameters").contains("sliding_attention"));
  Config olmo_unnormed = olmo;  // OLMo's classes norm q and k
  olmo_unnormed.model.qk_norm = false;
  olmo_unnormed.model.qk_norm_over = QkNormOver::head;
  refused(olmo_unnormed, "norms after the sublayers without qk_norm over the projection (OLMo 2's and 3's classes "
                         "have both) (the nearest family, olmo2, has no such option)");
  Config olmo_heads = olmo;  // q and k normed per head: Qwen3's and Gemma 3's, not OLMo's
  olmo_heads.model.qk_norm_over = QkNormOver::head;
  refused(olmo_heads, "qk_norm over each head (the nearest family, olmo2, has no such option; gemma3_text, qwen3 "
                      "have it)");
  Config qk_projection = llama;  // q and k normed over the projection with norms before the sublayers
  qk_projection.model.qk_norm = true;
  qk_projection.model.qk_norm_over = QkNormOver::projection;
  refused(qk_projection, "qk_norm over the projection (model.qk_norm_over projection) (the nearest family, qwen3, "
                         "has no such option; olmo2, olmo3 have it)");
  // Local and global kinds, each with a RoPE of its own: two local kinds rotating differently are
  // refused (the class has one RoPE for each), and so is a local kind pairing interleaved.
  Config olmo3 = olmo;
  olmo3.model.layers = 3;
  olmo3.layer_pattern = {"local", "global", "local2"};
  olmo3.layers.reset(YAML::Load("{pattern: [local, global, local2], kinds: {local: {attention: {window: 4}, position: "
                                "{name: rotary, pairing: half, base: 10000}}, global: {}, local2: {attention: {window: 4}, "
                                "position: {name: rotary, pairing: half, base: 20000}}}}"));
  refused(olmo3, "windowed layers, or unwindowed ones, with different rotary options (the class has one RoPE for its "
                 "local layers and one for its global ones) (the nearest family, olmo3, has no such option)");
  olmo3.layer_pattern = {"local", "global", "local"};
  olmo3.layers.reset(YAML::Load("{pattern: [local, global, local], kinds: {local: {attention: {window: 4}, position: "
                                "{name: rotary, pairing: interleaved, base: 10000}}, global: {}}}"));
  refused(olmo3, "a rotary with the interleaved pairing or a partial rotary (the class turns the whole head, "
                 "rotate_half) (the nearest family, olmo3, has no such option)");
  // OLMo (1): LayerNorms without parameters, q, k and v clipped (and MPT's clip); not elsewhere.
  Config olmo1 = llama;
  olmo1.model.norm = NormKind::layernorm;
  olmo1.model.norm_affine = false;
  olmo1.model.clip_qkv = 8;
  const HfExportConfig olmo1_hf = hf_export_config(olmo1, 256);
  CHECK(olmo1_hf.family == "olmo");
  CHECK(olmo1_hf.config.at("clip_qkv") == 8.0);
  CHECK(olmo1_hf.config.at("architectures") == nlohmann::json({"OlmoForCausalLM"}));
  olmo1.model.norm_eps = 1e-6;
  refused(olmo1, "a LayerNorm epsilon other than 1e-5 (OlmoLayerNorm's, fixed) (the nearest family, olmo, has no "
                 "such option)");
  Config clipped = llama;
  clipped.model.clip_qkv = 8;
  refused(clipped, "q, k and v clipped (model.clip_qkv) (the nearest family, llama, has no such option; mpt, olmo have it)");
  Config unweighted = llama;
  unweighted.model.norm_affine = false;
  refused(unweighted, "norms without parameters (model.norm_affine false) (the nearest family, llama, has no such "
                      "option; olmo has it)");
  // Gemma 2's and 3's classes: a score scale is a whole number there.
  Config gemma2 = llama;
  gemma2.model.sublayer_norms = SublayerNorms::both;
  gemma2.model.attention_options.scale_dim = 6;
  CHECK(family(gemma2) == "gemma2");
  gemma2.model.attention_options.scale_dim = 6.5;
  refused(gemma2, "attention.scale_dim 6.5, not a whole number (Gemma2Config's and Gemma3TextConfig's "
                  "query_pre_attn_scalar is an int) (the nearest family, gemma2, has no such option)");
  // What no class of Llama's kin has: named with no class beside it.
  Config interleaved = llama;
  interleaved.position.reset(YAML::Clone(llama.position));  // (its own node: assigning would change llama's)
  interleaved.position["pairing"] = "interleaved";
  refused(interleaved, "rotary with the interleaved pairing (the nearest family, llama, has no such option)");
}

TEST_CASE("export --format hf: an extrap model with a family's options, and one no class computes",
          "[import][python][export]") {
  TempDir d("hf-export-trained");
  Config config = tiny_config("rotary");
  config.position["pairing"] = "half";
  config.model.norm = NormKind::rmsnorm;
  config.model.ffn = FfnKind::swiglu;
  config.model.bias = false;
  config.model.kv_heads = 2;
  config.model.tie_embeddings = false;  // scale_embedding stays true: the export multiplies the embedding by sqrt(D)
  config.model.dropout = 0;
  config.data.path = corpus_dir().string();
  config.data.tokenizer = Tokenizer::byte;
  config.data.cache_dir = (d.root / "cache").string();
  const Corpus corpus = load_corpus(config.data);
  // Each model's family: Llama (SwiGLU; GeGLU), Qwen2 (q, k, v biases) with a sliding window of 4 on every layer
  // and, through a layer pattern, on the second of two, Qwen3 (qk_norm), Mistral, Phi-3 (a partial
  // rotary), Llama with LongRoPE, Gemma, OLMo 2, and two Falcons; Qwen3's and Mistral's heads not d_model /
  // heads wide (model.head_dim).
  std::map<std::string, std::pair<Config, std::string>> models;
  models["llama"] = {config, "llama"};
  Config qwen = config;
  qwen.model.qkv_bias = true;
  qwen.model.attention_options.window = 4;
  models["qwen"] = {qwen, "qwen2"};
  Config qwen_pattern = config;
  qwen_pattern.model.qkv_bias = true;
  qwen_pattern.model.layers = 2;
  qwen_pattern.layer_pattern = {"full", "sliding"};
  // (reset: assigning to the node the copy shares with `config` would change config's too)
  qwen_pattern.layers.reset(YAML::Load("{pattern: [full, sliding], kinds: {full: {}, sliding: {attention: {window: 4}}}}"));
  models["qwen_pattern"] = {qwen_pattern, "qwen2"};
  Config qwen3 = config;  // Qwen3: an RMSNorm of each head's q and k; heads wider than d_model / heads, as 0.6B's
  qwen3.model.qk_norm = true;
  qwen3.model.head_dim = 16;
  models["qwen3"] = {qwen3, "qwen3"};
  Config mistral = config;  // Mistral: a window on every layer; heads narrower than d_model / heads
  mistral.model.attention_options.window = 4;
  mistral.model.head_dim = 4;
  models["mistral"] = {mistral, "mistral"};
  Config phi3 = config;  // Phi-3: half of each head rotates, a window on every layer
  phi3.position.reset(YAML::Clone(config.position));  // (its own node: see qwen_pattern)
  phi3.position["fraction"] = 0.5;
  phi3.model.attention_options.window = 4;
  models["phi3"] = {phi3, "phi3"};
  Config longrope = config;  // LongRoPE built in: its long factors past 8 positions (96 scored)
  longrope.position.reset(YAML::Load("{name: rotary, pairing: half, scaling: longrope, scaling_factor: 4, scaling_length: 8, "
                                 "short_factor: [1.0, 1.1, 1.3, 1.6], long_factor: [1.0, 2.0, 5.0, 9.0]}"));
  models["longrope"] = {longrope, "llama"};
  // Gemma: geglu with GELU's tanh form, the tied embedding scaled by sqrt(d_model) on input (its
  // class alone has that), norms exported as w - 1; and Llama's class gating with GELU's erf form.
  Config gemma = config;
  gemma.model.ffn = FfnKind::geglu;
  gemma.model.activation = Activation::gelu_tanh;
  gemma.model.tie_embeddings = true;
  models["gemma"] = {gemma, "gemma"};
  Config geglu = config;
  geglu.model.ffn = FfnKind::geglu;
  models["llama_geglu"] = {geglu, "llama"};
  // OLMo 2: norms after the sublayers, none before, q and k normed over the projection.
  Config olmo2 = config;
  olmo2.model.sublayer_norms = SublayerNorms::output;
  olmo2.model.qk_norm = true;
  olmo2.model.qk_norm_over = QkNormOver::projection;
  models["olmo2"] = {olmo2, "olmo2"};
  // OLMo (1): LayerNorms without parameters, q, k and v clipped at 0.5 (the projections reach past it).
  Config olmo1 = config;
  olmo1.model.norm = NormKind::layernorm;
  olmo1.model.norm_affine = false;
  olmo1.model.clip_qkv = 0.5;
  models["olmo1"] = {olmo1, "olmo"};
  // OLMo 3: OLMo 2's block with local layers (window 4, RoPE base 1e4) and a global one (base 5e5,
  // YaRN from 8 positions by 4), each kind's RoPE its own; and with a window on every layer alone.
  Config olmo3 = olmo2;
  olmo3.model.layers = 3;
  olmo3.position.reset(YAML::Load("{name: rotary, pairing: half, base: 500000, scaling: yarn, scaling_factor: 4, "
                                  "scaling_length: 8}"));
  olmo3.layer_pattern = {"local", "global", "local"};
  olmo3.layers.reset(YAML::Load("{pattern: [local, global, local], kinds: {local: {attention: {window: 4}, position: "
                                "{name: rotary, pairing: half, base: 10000}}, global: {}}}"));
  models["olmo3"] = {olmo3, "olmo3"};
  Config olmo3_windowed = olmo2;
  olmo3_windowed.model.attention_options.window = 4;
  models["olmo3_windowed"] = {olmo3_windowed, "olmo3"};
  // Gemma 2: norms before and after the sublayers, scores q.k / sqrt(6) soft-capped at 0.75, logits at
  // 1.5, windows of 4 on the first of two layers; untied (the class scales the embedding on input
  // either way).
  Config gemma2 = gemma;
  gemma2.model.sublayer_norms = SublayerNorms::both;
  gemma2.model.tie_embeddings = false;
  gemma2.model.logit_softcap = 1.5;
  gemma2.model.attention_options.softcap = 0.75;
  gemma2.model.attention_options.scale_dim = 6;
  gemma2.model.layers = 2;
  gemma2.layer_pattern = {"sliding", "full"};
  gemma2.layers.reset(YAML::Load("{pattern: [sliding, full], kinds: {sliding: {attention: {window: 4}}, full: {}}}"));
  models["gemma2"] = {gemma2, "gemma2"};
  // Gemma 3: Gemma 2's block with q and k normed per head, local layers (window 4, RoPE base 1e4) and a
  // global one (base 1e6, scaled linearly by 2), each kind's RoPE its own, the logits capped.
  Config gemma3 = gemma2;  // (without the scores' cap: transformers' Gemma 3 has none)
  gemma3.model.qk_norm = true;
  gemma3.model.attention_options.softcap = 0;
  gemma3.model.layers = 3;
  gemma3.position.reset(YAML::Load("{name: rotary, pairing: half, base: 1000000, scaling: linear, scaling_factor: 2}"));
  gemma3.layer_pattern = {"local", "local", "global"};
  gemma3.layers.reset(YAML::Load("{pattern: [local, local, global], kinds: {local: {attention: {window: 4}, position: "
                                 "{name: rotary, pairing: half, base: 10000}}, global: {}}}"));
  models["gemma3"] = {gemma3, "gemma3_text"};
  // Falcon: LayerNorms with biases, exact GELU, no linear biases; Falcon-7B's block (one key-value
  // head, one shared norm), and the new decoder architecture's (2 groups, two norms).
  Config falcon7 = config;
  falcon7.model.norm = NormKind::layernorm;
  falcon7.model.ffn = FfnKind::mlp;
  falcon7.model.d_ffn = 64;
  falcon7.model.norm_bias = true;
  falcon7.model.kv_heads = 1;
  falcon7.model.block = BlockKind::parallel_shared;
  models["falcon7"] = {falcon7, "falcon"};
  Config falcon40 = falcon7;
  falcon40.model.kv_heads = 2;
  falcon40.model.block = BlockKind::parallel;
  models["falcon40"] = {falcon40, "falcon"};
  std::string args = "--text " + (corpus_dir() / "valid.txt").string();
  for (auto& [name, model] : models) {
    INFO(name);
    train_briefly(model.first, corpus, d.root / name, 10);
    // extrap's own log-probabilities, as the reference transformers must reproduce (96 tokens:
    // 24 windows of 4).
    LoadedRun run = load_run(require_checkpoint(d.root / name / "run"), corpus);
    const auto tokens = corpus.valid.slice(0, 96).to(torch::kLong);
    const auto logprobs = next_token_logprobs(run.model, tokens).to(torch::kFloat32);
    const fs::path reference = d.root / (name + ".reference.safetensors");
    write_text(reference, encode_safetensors({{"tokens", tokens}, {"logprobs", logprobs},
                                              {"text_ids", corpus.valid.slice(0, corpus.valid.size()).to(torch::kLong)}},
                                             {}));
    const HfExportSummary s = export_hf(d.root / name / "run", d.root / (name + "-hf"), false);
    CHECK(s.family == model.second);
    CHECK(s.tokenizer);  // byte level: a byte-level BPE whose ids are the bytes
    args += " " + (d.root / (name + "-hf")).string() + " " + reference.string();
  }
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/import/check_hf_export.py " + args);
  INFO(read_text(d.root / "python.log"));
  CHECK(code == 0);
  // Trains `refused` briefly under d.root / name, checks that --hf-class native is refused with
  // `refusal` and writes nothing, and (with `remote`) that the default export ships remote code.
  const auto native_refused = [&](const Config& refused, const std::string& name, int steps,
                                  const std::string& refusal, bool remote) {
    INFO(name);
    train_briefly(refused, corpus, d.root / name, steps);
    const fs::path out = d.root / (name + "-hf");
    CHECK_THROWS_WITH(export_hf(d.root / name / "run", out, false, HfClass::native), Contains(refusal));
    CHECK_FALSE(fs::exists(out));
    if (remote) CHECK(export_hf(d.root / name / "run", out, false).family == "extrap");
  };
  // GPT-2's block as extrap trains it by default: tied and scaled embedding, which no class has.
  Config plain = tiny_config("alibi");
  plain.data = config.data;
  native_refused(plain, "plain", 5, "no transformers class computes this model: its tied embedding is scaled by sqrt(d_model)",
                 false);
  // Gemma's block gating with GELU's erf form: GemmaConfig reads hidden_act gelu as the tanh form.
  Config gemma_erf = gemma;
  gemma_erf.model.activation = Activation::gelu;
  native_refused(gemma_erf, "gemma_erf", 2, "geglu with GELU's erf form (GemmaConfig reads hidden_act gelu as the tanh form)",
                 false);
  // Norms before and after the sublayers with an unscaled embedding: Gemma 2's class scales it, so
  // remote code; soft-capped scores in Llama's block: Gemma 2's class alone caps them.
  Config sandwich = config;
  sandwich.model.sublayer_norms = SublayerNorms::both;
  sandwich.model.scale_embedding = false;
  native_refused(sandwich, "sandwich", 2,
                 "norms before and after the sublayers (model.sublayer_norms both) without the embedding scaled by "
                 "sqrt(d_model)",
                 true);
  Config capped = config;
  capped.model.attention_options.softcap = 5;
  native_refused(capped, "capped", 2,
                 "soft-capped attention scores (attention.softcap) (the nearest family, llama, has no such option; "
                 "gemma2 has it)",
                 true);
  Config capped_gemma3 = gemma3;  // transformers' Gemma 3 caps no score
  capped_gemma3.model.attention_options.softcap = 0.5;
  native_refused(capped_gemma3, "capped_gemma3", 2,
                 "soft-capped attention scores (attention.softcap) (the nearest family, gemma3_text, has no such "
                 "option; gemma2 has it)",
                 false);
  Config capped_alibi = plain;  // outside Llama's kin: refused before any family is picked
  capped_alibi.model.logit_softcap = 4;
  native_refused(capped_alibi, "capped_alibi", 2,
                 "soft-capped attention scores or logits, or a score scale of their own, without a rotary RMSNorm "
                 "model (Gemma 2's)",
                 false);
  // Sliding windows on some layers: Qwen2's class has them, with its q, k, v biases; without the
  // biases no class does (Mistral's windows every layer), so the folder is remote code.
  Config partial = qwen_pattern;
  partial.model.qkv_bias = false;
  native_refused(partial, "partial", 2,
                 "sliding windows on some layers only (the nearest family, mistral, has no such option; gemma2, "
                 "gemma3_text, olmo3, qwen2, qwen3 have it)",
                 true);
  // Heads of their own width in Falcon's block: Falcon's class has none, so remote code.
  Config wide_falcon = falcon7;
  wide_falcon.model.head_dim = 16;
  native_refused(wide_falcon, "wide_falcon", 2, "heads other than d_model / heads wide (model.head_dim)", true);
}

namespace {

// log p(tokens[i] | tokens) at every position of one unmasked sequence (T,): (T,) float64.
torch::Tensor masked_logprobs(TransformerLM& model, const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const auto logits = model->forward(tokens.unsqueeze(0)).to(torch::kFloat64).squeeze(0);  // (T, V)
  return logits.log_softmax(-1).gather(1, tokens.unsqueeze(1)).squeeze(1);
}

}  // namespace

TEST_CASE("export --format hf: a model no class computes ships remote code that transformers runs exactly",
          "[import][python][export]") {
  TempDir d("hf-export-remote");
  CorpusOptions data;
  data.path = corpus_dir().string();
  data.tokenizer = Tokenizer::byte;
  data.cache_dir = (d.root / "cache").string();
  const Corpus corpus = load_corpus(data);
  std::map<std::string, Config> models;
  models["alibi"] = tiny_config("alibi");  // the paper's model: GPT-2's block, tied embedding scaled on input
  Config pattern = tiny_config("fire");  // a layer pattern, attention options, grouped-query attention
  pattern.model.layers = 4;
  pattern.model.kv_heads = 2;
  pattern.model.norm = NormKind::rmsnorm;
  pattern.model.ffn = FfnKind::swiglu;
  pattern.model.attention_options.sink = true;
  pattern.layer_pattern = {"local", "global"};
  pattern.model.head_dim = 12;  // heads wider than d_model / heads, a gate per feature of them
  pattern.layers = YAML::Load("{pattern: [local, global], kinds: {local: {position: alibi_learned, attention: "
                              "{window: 8, gate: headwise}}, global: {attention: {ssmax: true, gate: elementwise}}}}");
  models["pattern"] = pattern;
  models["cope"] = tiny_config("cope");  // a bias from the queries and the gated scores
  models["cope"].model.adaptive_cutoffs = {64, 128};  // adaptive input and softmax
  models["cope"].model.heads = 3;  // heads narrower than d_model / heads, which 3 does not divide
  models["cope"].model.head_dim = 6;
  models["unweighted"] = tiny_config("alibi");  // OLMo's norms without parameters and clip beside ALiBi
  models["unweighted"].model.norm_affine = false;
  models["unweighted"].model.clip_qkv = 0.5;
  models["masked"] = tiny_config("t5_bias");  // a bidirectional masked LM
  models["masked"].model.objective = Objective::masked_lm;
  for (auto& [name, config] : models) config.data = data;
  // Word-level and SentencePiece corpora: the folder's own tokenizer class.
  models["word"] = tiny_config("kerple_log");
  models["word"].data = data;
  models["word"].data.tokenizer = Tokenizer::word;
  // A unigram model, on whose valid text Python's sentencepiece 0.2 chooses other pieces than
  // the 0.1.97 extrap links in 8 places (ties of float32 path scores): the folder's tokenizer
  // must give extrap's ids all the same.
  SentencePieceTraining pieces;
  pieces.model_type = "unigram";
  pieces.vocab_size = 400;
  pieces.byte_fallback = false;
  pieces.threads = 1;
  write_text(d.root / "pieces.model", train_sentencepiece(read_text(corpus_dir() / "train.txt"), pieces, "train.txt"));
  models["spm"] = tiny_config("sandwich");
  models["spm"].data = data;
  models["spm"].data.tokenizer = Tokenizer::sentencepiece;
  models["spm"].data.tokenizer_model = (d.root / "pieces.model").string();

  std::string args = "--text " + (corpus_dir() / "valid.txt").string();
  std::map<std::string, torch::Tensor> tokens_of;  // 80 tokens of each model's corpus: beyond the trained 16
  for (auto& [name, config] : models) {
    INFO(name);
    const Corpus own = load_corpus(config.data);
    const auto tokens = tokens_of[name] = own.valid.slice(0, 80).to(torch::kLong);
    train_briefly(config, own, d.root / name, 5);
    LoadedRun run = load_run(require_checkpoint(d.root / name / "run"), own);
    const auto logprobs = name == "masked" ? masked_logprobs(run.model, tokens) : next_token_logprobs(run.model, tokens);
    const fs::path reference = d.root / (name + ".reference.safetensors");
    write_text(reference, encode_safetensors({{"tokens", tokens}, {"logprobs", logprobs.to(torch::kFloat32)},
                                              {"text_ids", own.valid.slice(0, own.valid.size()).to(torch::kLong)}}, {}));
    const HfExportSummary s = export_hf(d.root / name / "run", d.root / (name + "-hf"), false);
    CHECK(s.family == "extrap");
    CHECK(s.masked == (name == "masked"));
    CHECK(s.tokenizer);
    CHECK_FALSE(s.remote_reason.empty());
    const bool own_tokenizer = name == "word" || name == "spm";
    for (const char* file : {"config.json", "model.safetensors", "extrap_model.py", "modeling_extrap.py",
                             own_tokenizer ? "tokenization_extrap.py" : "tokenizer.json"})
      CHECK(fs::exists(d.root / (name + "-hf") / file));
    args += " " + (d.root / (name + "-hf")).string() + " " + reference.string();
  }
  // A model a family's class computes goes to remote code when asked to.
  Config llama = llama_block_config();
  llama.data = data;
  train_briefly(llama, corpus, d.root / "llama", 5);
  LoadedRun run = load_run(require_checkpoint(d.root / "llama" / "run"), corpus);
  const auto tokens = tokens_of["alibi"];
  write_text(d.root / "llama.reference.safetensors",
             encode_safetensors({{"tokens", tokens}, {"logprobs", next_token_logprobs(run.model, tokens).to(torch::kFloat32)}}, {}));
  CHECK(export_hf(d.root / "llama" / "run", d.root / "llama-native", false).family == "llama");
  const HfExportSummary forced = export_hf(d.root / "llama" / "run", d.root / "llama-hf", false, HfClass::remote);
  CHECK(forced.family == "extrap");
  CHECK(forced.remote_reason == "--hf-class remote");
  args += " " + (d.root / "llama-hf").string() + " " + (d.root / "llama.reference.safetensors").string();
  {  // A family's class with extrap's own tokenizer: the native folder of a SentencePiece corpus
     // carries tokenization_extrap.py and the extrap_model.py whose ids it gives.
    Config llama_spm = llama;
    llama_spm.data = models["spm"].data;
    const Corpus own = load_corpus(llama_spm.data);
    train_briefly(llama_spm, own, d.root / "llama_spm", 5);
    LoadedRun trained = load_run(require_checkpoint(d.root / "llama_spm" / "run"), own);
    const auto spm_tokens = own.valid.slice(0, 80).to(torch::kLong);
    write_text(d.root / "llama_spm.reference.safetensors",
               encode_safetensors({{"tokens", spm_tokens},
                                   {"logprobs", next_token_logprobs(trained.model, spm_tokens).to(torch::kFloat32)},
                                   {"text_ids", own.valid.slice(0, own.valid.size()).to(torch::kLong)}}, {}));
    CHECK(export_hf(d.root / "llama_spm" / "run", d.root / "llama_spm-hf", false).family == "llama");
    for (const char* file : {"tokenization_extrap.py", "extrap_model.py", "tokenizer.model"})
      CHECK(fs::exists(d.root / "llama_spm-hf" / file));
    args += " " + (d.root / "llama_spm-hf").string() + " " + (d.root / "llama_spm.reference.safetensors").string();
  }

  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/import/check_hf_export.py " + args);
  INFO(read_text(d.root / "python.log"));
  CHECK(code == 0);
  // extrap -> the remote-code folder -> extrap import gives the same numbers.
  for (const auto& [name, config] : models) {
    INFO(name);
    Imported again = import_and_load(d.root / (name + "-hf"), d.root / (name + "-again"));
    const auto expected = SafetensorsReader::open(d.root / (name + ".reference.safetensors")).tensor("logprobs");
    const auto& tokens = tokens_of[name];
    const auto got = name == "masked" ? masked_logprobs(again.run.model, tokens) : next_token_logprobs(again.run.model, tokens);
    CHECK(torch::equal(got.to(torch::kFloat32), expected.to(torch::kFloat32)));
  }
  {  // a config.json that disagrees with its extrap_metadata is refused, naming the key
    const fs::path bad = d.root / "bad-hf";
    fs::copy(d.root / "alibi-hf", bad);
    std::string text = read_text(bad / "config.json");
    const std::string key = "\"hidden_size\": 32";
    const auto at = text.find(key);
    REQUIRE(at != std::string::npos);
    write_text(bad / "config.json", text.replace(at, key.size(), "\"hidden_size\": 64"));
    ImportOptions options;
    options.data = corpus_dir().string();
    CHECK_THROWS_WITH(import_checkpoint(bad, d.root / "bad-run", options),
                      Contains("config.json: hidden_size 64 disagrees with extrap_metadata's 32"));
    CHECK_FALSE(fs::exists(d.root / "bad-run"));
    // and a corpus whose vocabulary is not the model's
    options.set = {"data.tokenizer=word"};
    CHECK_THROWS_WITH(import_checkpoint(d.root / "alibi-hf", d.root / "bad-run", options),
                      Contains("vocabulary") && Contains("is not the one " + (d.root / "alibi-hf").string() +
                                                         "'s model was trained with"));
    CHECK_FALSE(fs::exists(d.root / "bad-run"));
  }
  // The folder's model.safetensors is extrap's own export: the plain-PyTorch reader loads it too.
  CHECK(run_python(d, EXTRAP_SOURCE_DIR "/analysis/extrap_model.py " + (d.root / "pattern-hf/model.safetensors").string() +
                          " --tokens-file " + (corpus_dir() / "valid.txt").string() + " --length 16 --max-tokens 64") == 0);
}

TEST_CASE("import: configs/released.yaml evaluates released checkpoints side by side, nothing trained",
          "[import][python][sweep]") {
  TempDir d("released-sweep");
  const fs::path ck = checkpoints();
  const fs::path llama = copy_of(d, "llama");  // changed below
  // Three families, three tokenizers (Llama 3 style, GPT-2 style, SentencePiece), two methods.
  const std::string models = "{llama: " + llama.string() + ", bloom: {path: " + (ck / "bloom").string() +
                             ", train_length: 64}, mistral_spm: " + (ck / "mistral_spm").string() + "}";
  std::vector<std::string> args = {"sweep", EXTRAP_SOURCE_DIR "/configs/released.yaml",
                                   "--set", "released.data=" + corpus_dir().string(),
                                   "--set", "released.models=" + models,
                                   "--set", "released.set={eval.max_tokens: 2048, train.threads: 1}",
                                   "--set", "eval.length_multiples=[1, 2]",
                                   "--set", "eval.streaming=[32]",
                                   "--set", "eval.retrieval={task: passkey, length_multiples: [2], depths: [0, 100], samples: 2}",
                                   "--set", "output.path=" + (d.root / "released.h5").string(),
                                   "--set", "output.run_root=" + (d.root / "runs").string()};
  std::string out;
  REQUIRE(run_cli(d, args, &out) == 0);
  {
    const ResultsStore store = ResultsStore::open((d.root / "released.h5").string());
    REQUIRE(store.runs().size() == 3);
    for (const auto& [id, run] : store.runs()) {
      INFO(id);
      CHECK(run.status == "complete");
      CHECK(run.train_tokens == 0);
      CHECK(run.train_loss.empty());
      CHECK(run.train_length == 64);
      // The record names exactly what was read: the folder, config.json's hash, the weights.
      const VerifiedCheckpoint checkpoint = require_checkpoint(d.root / "runs" / id);
      REQUIRE(checkpoint.is_imported());
      const YAML::Node released = YAML::Load(run.released);
      CHECK(released["path"].as<std::string>() == (*checkpoint.imported)["source"].get<std::string>());
      CHECK(released["config_json"].as<std::string>() ==
            (*checkpoint.imported)["config_json"]["xxh3"].get<std::string>());
      CHECK(released["weights"].as<std::string>() == hf_weights_digest(*checkpoint.imported));
    }
    std::map<std::string, std::set<std::string>> modes;
    for (const auto& p : store.points()) {
      INFO(p.run_id << " " << p.mode << " " << p.eval_length << ": " << p.status);
      CHECK(p.ok());
      modes[p.run_id].insert(p.mode);
      if (p.mode.rfind("nonoverlapping", 0) == 0) {
        CHECK(std::isfinite(p.perplexity));
        CHECK(std::isfinite(p.bits_per_byte));  // every tokenizer credits its bytes
      }
    }
    // YaRN and Self-Extend for the RoPE models only; StreamingLLM and profiles for all.
    CHECK(modes["llama"].count("nonoverlapping+yarn"));
    CHECK(modes["mistral_spm"].count("nonoverlapping+self_extend"));
    CHECK_FALSE(modes["bloom"].count("nonoverlapping+yarn"));
    for (const char* id : {"llama", "bloom", "mistral_spm"}) {
      CHECK(modes[id].count("streaming_4_32"));
      CHECK(modes[id].count("attention_profile"));
      CHECK(modes[id].count("retrieval_passkey"));  // in each model's own tokens
    }
  }
  // Again: nothing to do.
  REQUIRE(run_cli(d, args, &out) == 0);
  CHECK_THAT(out, Contains("already complete"));
  // The report says which rows are released checkpoints, and compares them in bits per byte.
  std::string printed;
  REQUIRE(run_python(d, EXTRAP_SOURCE_DIR "/analysis/report.py released.h5 --out report", &printed) == 0);
  const std::string report = read_text(d.root / "report" / "report.md");
  CHECK_THAT(report, Contains("## Released checkpoints"));
  CHECK_THAT(report, Contains("| llama (rotary) | `" + llama.string() + "`"));
  CHECK_THAT(report, Contains("The runs tokenise the text differently"));
  CHECK_THAT(report, !Contains("## What was trained"));
  // A checkpoint whose weights changed after its import is refused at its next load, naming the file.
  {
    std::fstream file(llama / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-4, std::ios::end);
    file.write("\x01\x02\x03\x04", 4);
  }
  std::vector<std::string> longer = args;
  longer.insert(longer.end(), {"--set", "eval.length_multiples=[1, 2, 3]"});
  REQUIRE(run_cli(d, longer, &out) != 0);
  require_one_line_error(out, (llama / "model.safetensors").string() + " changed since it was imported");
  // A run directory holding another import than the model of that name is refused.
  args[5] = "released.models={llama: " + (ck / "mistral").string() + "}";
  args.insert(args.end(), {"--set", "eval.length_multiples=[1]", "--set", "eval.streaming=[]",
                           "--set", "output.path=" + (d.root / "other.h5").string()});
  REQUIRE(run_cli(d, args, &out) != 0);
  require_one_line_error(out, "holds another import than released model llama");
  // Released models with a base or a grid, or a key that would change the model: refused.
  args.insert(args.end(), {"--set", "released.set={model.layers: 1}"});
  REQUIRE(run_cli(d, args, &out) != 0);
  require_one_line_error(out, "'model.layers' cannot be set for a released model");
}
