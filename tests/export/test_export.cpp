// `extrap export` and analysis/extrap_model.py: the file obeys the safetensors format (read
// here by a reader of the test's own), holds exactly the checkpoint's tensors, and the Python
// reference model rebuilt from it gives `extrap eval`'s perplexities for every built-in method.
#include "core/export/model_export.h"
#include "core/export/safetensors.h"
#include "tests/support/cli_harness.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

using namespace extrap;
using namespace extrap::testing;
using json = nlohmann::json;

namespace {

// --- an independent safetensors reader -------------------------------------------------------

struct StoredTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct SafetensorsFile {
  std::map<std::string, StoredTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string data;  // the byte buffer after the header
};

// Reads `path` and checks every rule of the format (and extrap's promises: names sorted,
// data in name order, 8-byte aligned data). Failures are Catch2 assertion failures.
SafetensorsFile read_safetensors_checked(const fs::path& path) {
  const std::string bytes = read_text(path);
  REQUIRE(bytes.size() >= 8);
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | uint8_t(bytes[size_t(b)]);  // little-endian
  REQUIRE(n <= bytes.size() - 8);
  REQUIRE((8 + n) % 8 == 0);
  const std::string header_text = bytes.substr(8, n);
  REQUIRE(header_text.front() == '{');
  const size_t last = header_text.find_last_not_of(' ');
  REQUIRE(header_text[last] == '}');  // only space padding after the JSON
  const json header = json::parse(header_text.substr(0, last + 1));
  REQUIRE(header.is_object());

  const std::map<std::string, size_t> item_size = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2},
                                                   {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
                                                   {"U8", 1},  {"BOOL", 1}};
  SafetensorsFile file;
  file.data = bytes.substr(8 + n);
  std::vector<std::string> order;  // the header's own key order
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [key, value] : entry.items()) {
        REQUIRE(value.is_string());
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    order.push_back(name);
    INFO("tensor " << name);
    REQUIRE(entry.size() == 3);
    StoredTensor t;
    t.dtype = entry.at("dtype").get<std::string>();
    REQUIRE(item_size.count(t.dtype) == 1);
    t.shape = entry.at("shape").get<std::vector<int64_t>>();
    const auto offsets = entry.at("data_offsets").get<std::vector<uint64_t>>();
    REQUIRE(offsets.size() == 2);
    t.begin = offsets[0];
    t.end = offsets[1];
    uint64_t count = 1;
    for (int64_t d : t.shape) {
      REQUIRE(d >= 0);
      count *= uint64_t(d);
    }
    REQUIRE(t.end - t.begin == count * item_size.at(t.dtype));
    file.tensors[name] = t;
  }
  // Names sorted, data in that order, back to back, covering the buffer exactly.
  REQUIRE(std::is_sorted(order.begin(), order.end()));
  uint64_t expected_begin = 0;
  for (const auto& [name, t] : file.tensors) {
    INFO("tensor " << name);
    REQUIRE(t.begin == expected_begin);
    expected_begin = t.end;
  }
  REQUIRE(expected_begin == file.data.size());
  return file;
}

// --- trained runs through the command line --------------------------------------------------

// Lines of a small English-like text; the word corpus's valid split has words the training
// split lacks (they become <unk>), and a blank line.
std::string corpus_text(int lines, int seed) {
  const std::vector<std::string> words = {"the",   "model", "trained", "on",    "short", "inputs",
                                          "is",    "then",  "tested",  "at",    "longer", "lengths",
                                          "where", "a",     "linear",  "bias",  "helps",  "it"};
  std::string text;
  uint64_t state = uint64_t(seed) * 2654435761u + 1;
  auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int l = 0; l < lines; ++l) {
    const int count = int(next() % 12);
    for (int w = 0; w < count; ++w) text += (w ? " " : "") + words[next() % words.size()];
    text += "\n";
  }
  return text;
}

struct ExportDir : TempDir {
  ExportDir() : TempDir("export") {
    for (const char* corpus : {"bytes", "words"}) {
      fs::create_directories(root / corpus);
      write_text(root / corpus / "train.txt", corpus_text(300, 1));
      write_text(root / corpus / "valid.txt", corpus_text(60, 2) + "\nunseen words here\n");
      write_text(root / corpus / "test.txt", corpus_text(60, 3));
    }
  }

  // The corpus directory a tokenizer's runs train on: bytes/, words/, or pieces/ (made by the
  // test that uses it, with its SentencePiece model pieces.model).
  static std::string corpus_of(const std::string& tokenizer) {
    return tokenizer == "byte" ? "bytes" : tokenizer == "word" ? "words" : "pieces";
  }

  // Trains a run named `name` (12 steps) and returns its directory, relative to root.
  std::string train(const std::string& name, const std::string& position, bool causal,
                    const std::string& tokenizer = "byte", const std::string& model_extra = "",
                    const std::string& top_extra = "", int layers = 2) {
    const std::string corpus = corpus_of(tokenizer);
    const std::string run = "runs/" + name;
    const std::string model_file = tokenizer == "sentencepiece" ? ", tokenizer_model: pieces.model" : "";
    // The model section: these defaults, each key of `model_extra` (", key: value, ...") in place of
    // its default (a key given twice is refused).
    std::vector<std::pair<std::string, std::string>> model = {
        {"layers", std::to_string(layers)}, {"d_model", "32"}, {"heads", "4"}, {"d_ffn", "64"},
        {"dropout", "0.0"}, {"objective", causal ? "causal_lm" : "masked_lm"}};
    const size_t first_extra = model_extra.find_first_not_of(", ");
    const YAML::Node extras =
        YAML::Load("{" + (first_extra == std::string::npos ? std::string() : model_extra.substr(first_extra)) + "}");
    for (const auto& entry : extras) {
      const std::string key = entry.first.Scalar(), value = entry.second.Scalar();
      INFO("model_extra key " << key << ": quote a list or map value ('[6, 12]'): its text is copied into the "
           "model's flow map");
      REQUIRE(entry.second.IsScalar());
      const auto found = std::find_if(model.begin(), model.end(), [&](const auto& kv) { return kv.first == key; });
      if (found != model.end()) found->second = value;
      else model.emplace_back(key, value);
    }
    std::string model_text;
    for (const auto& [key, value] : model) model_text.append(model_text.empty() ? "" : ", ").append(key + ": " + value);
    write_text(root / (name + ".yaml"),
               "data: {path: " + corpus + ", tokenizer: " + tokenizer + model_file + ", cache_dir: cache}\n"
               "model: {" + model_text + "}\n"
               "position: " + position + "\n"
               "train: {seq_len: 16, batch_tokens: 256, steps: 12, lr: 0.01, warmup: 2, "
               "validate_every: 0, checkpoint_every: 0, log_every: 100, threads: 1, out_dir: " +
                   run + "}\n" + top_extra);
    std::string out;
    const int code = run_cli(*this, {"train", "--config", name + ".yaml", "--no-eval"}, &out);
    INFO(out);
    REQUIRE(code == 0);
    return run;
  }
};

// One model of the Python comparison: its export, its `extrap eval --json`, its tokens, and
// extrap's logits for one window (a perplexity averages away small differences; logits do not).
struct Compared {
  std::string model, eval_json, tokens, logits;
};

// Writes extrap's logits for the first 40 tokens of the run's validation split (inputs as they
// are, unmasked) to NAME.logits.safetensors: {"tokens": (1, 40) I64, "logits": (1, 40, V) F32}.
std::string write_logits(const ExportDir& d, const std::string& run, const std::string& name) {
  CliRun loaded = load_cli_run(d, run);
  torch::NoGradGuard no_grad;
  const auto tokens = loaded.corpus.valid.slice(0, 40).to(torch::kLong).unsqueeze(0);  // (1, 40)
  const auto logits = loaded.run.model->forward(tokens);                               // (1, 40, V)
  const std::string file = name + ".logits.safetensors";
  write_text(d.root / file, encode_safetensors({{"tokens", tokens}, {"logits", logits}}, {}));
  return file;
}

// Trains, evaluates (L = 16 and 40, non-overlapping and stride 8) and exports one model.
Compared train_eval_export(ExportDir& d, const std::string& name, const std::string& position,
                           bool causal, const std::string& tokenizer = "byte",
                           const std::string& model_extra = "", const std::string& top_extra = "",
                           int layers = 2) {
  const std::string run = d.train(name, position, causal, tokenizer, model_extra, top_extra, layers);
  std::string out;
  int code = run_cli(d, {"eval", "--checkpoint", run, "--length", "16", "40", "--stride", "8",
                         "1000", "--max-tokens", "1200", "--json", name + ".eval.json"}, &out);
  INFO(out);
  REQUIRE(code == 0);
  code = run_cli(d, {"export", "--checkpoint", run, "--out", name + ".safetensors"}, &out);
  REQUIRE(code == 0);
  return {name + ".safetensors", name + ".eval.json", ExportDir::corpus_of(tokenizer) + "/valid.txt",
          write_logits(d, run, name)};
}

// Runs tests/export/check_export.py on the models: analysis/extrap_model.py (float64) reproduces every
// row of each eval JSON to 1e-5 relative, and extrap's logits.
void check_in_python(const ExportDir& d, const std::vector<Compared>& models) {
  std::string args = EXTRAP_SOURCE_DIR "/tests/export/check_export.py";
  for (const auto& m : models) args += " " + m.model + " " + m.eval_json + " " + m.tokens + " " + m.logits;
  std::string output;
  const int code = run_python(d, args, &output);
  INFO(output);
  REQUIRE(code == 0);
  for (const auto& m : models) CHECK(output.find("ok " + m.model) != std::string::npos);
}

}  // namespace

TEST_CASE("export: the file obeys the safetensors format and holds exactly the checkpoint's tensors",
          "[export]") {
  ExportDir d;
  for (const bool causal : {true, false}) {
    const std::string name = causal ? "learned_causal" : "learned_masked";
    const std::string run = d.train(name, "{name: alibi_learned, shared_across_layers: false}",
                                    causal, "word", ", tie_embeddings: false");
    std::string out;
    REQUIRE(run_cli(d, {"export", "--checkpoint", run, "--out", name + ".safetensors"}, &out) == 0);
    const SafetensorsFile file = read_safetensors_checked(d.root / (name + ".safetensors"));
    const CliRun loaded = load_cli_run(d, run);

    std::map<std::string, torch::Tensor> expected;
    for (const auto& p : loaded.run.model->named_parameters()) expected[p.key()] = p.value();
    for (const auto& b : loaded.run.model->named_buffers()) expected[b.key()] = b.value();
    REQUIRE(file.tensors.size() == expected.size());
    CHECK(file.tensors.count("head.weight") == 1);  // untied
    CHECK(file.tensors.count(causal ? "position.raw_slopes" : "position.raw_slopes_right") == 1);
    for (const auto& [name_, tensor] : expected) {
      INFO("tensor " << name_);
      REQUIRE(file.tensors.count(name_) == 1);
      const StoredTensor& t = file.tensors.at(name_);
      CHECK(t.dtype == "F32");
      CHECK(t.shape == tensor.sizes().vec());
      const auto values = tensor.contiguous();
      REQUIRE(t.end - t.begin == uint64_t(values.numel()) * 4);
      CHECK(std::memcmp(file.data.data() + t.begin, values.data_ptr(), t.end - t.begin) == 0);
    }

    const auto& meta = file.metadata;
    CHECK(meta.at("format") == "extrap-safetensors/2");
    CHECK(meta.at("position") == "alibi_learned");
    CHECK(json::parse(meta.at("position_options")) == json{{"shared_across_layers", false}});
    CHECK(meta.at("position_tensors").find("softplus") != std::string::npos);
    const json model = json::parse(meta.at("model"));
    CHECK(model.at("causal") == causal);
    CHECK(model.at("tie_embeddings") == false);
    CHECK(model.at("heads") == 4);
    CHECK(json::parse(meta.at("checkpoint")).at("step") == 12);
    CHECK(json::parse(meta.at("vocabulary")).get<std::vector<std::string>>() == loaded.corpus.vocabulary);
    CHECK(json::parse(meta.at("data")).at("vocab_size") == loaded.corpus.vocab_size);
  }
}

TEST_CASE("export: resolved options fill every default and keep given values", "[export]") {
  Config config;
  config.position_name = "t5_bias";
  config.position = YAML::Load("{name: t5_bias, buckets: 8, shared_across_layers: false}");
  CHECK(json::parse(resolved_position_options(config)) ==
        json{{"buckets", 8}, {"max_distance", 128}, {"shared_across_layers", false}, {"init_std", 0.02}});
  config.position_name = "rotary";
  config.position = YAML::Load("{name: rotary, base: 500}");
  CHECK(json::parse(resolved_position_options(config)) == json{{"base", 500}, {"fraction", 1.0}, {"pairing", "interleaved"}, {"scaling", "none"}, {"scaling_factor", 1.0},
                  {"scaling_length", 0}, {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0}, {"short_factor", json::array()}, {"long_factor", json::array()},
                  {"attention_factor", 0.0}});
}

TEST_CASE("export: refusals name the file and write nothing", "[export]") {
  ExportDir d;
  const std::string run = d.train("alibi", "alibi", true);
  std::string out;
  REQUIRE(run_cli(d, {"export", "--checkpoint", run, "--out", "model.safetensors"}, &out) == 0);
  const std::string first = read_text(d.root / "model.safetensors");

  // An existing output file is kept unless --overwrite.
  CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", "model.safetensors"}, &out) == 2);
  CHECK(out.find("model.safetensors exists (add --overwrite to replace it)") != std::string::npos);
  CHECK(read_text(d.root / "model.safetensors") == first);
  CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", "model.safetensors", "--overwrite"}, &out) == 0);
  CHECK(read_text(d.root / "model.safetensors") == first);  // the same checkpoint, byte for byte

  CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", "missing/model.safetensors"}, &out) == 2);
  require_one_line_error(out, "--out missing/model.safetensors: the directory ");
  CHECK(out.find("does not exist") != std::string::npos);
  if (geteuid() != 0) {  // root writes anywhere: said before the export, as --json's folder is
    fs::create_directories(d.root / "locked");
    fs::permissions(d.root / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", "locked/model.safetensors"}, &out) == 2);
    require_one_line_error(out, "is not writable (Permission denied)");
    fs::permissions(d.root / "locked", fs::perms::owner_all);
  }
  CHECK(run_cli(d, {"export", "--checkpoint", "runs/none", "--out", "x.safetensors"}, &out) == 2);
  CHECK(out.find("runs/none") != std::string::npos);
  CHECK_FALSE(fs::exists(d.root / "x.safetensors"));

  // The run's own files are refused even with --overwrite (it replaced the trained model); a
  // new file beside them is written.
  const std::string model_pt = read_text(d.root / run / "checkpoint" / "model.pt");
  for (const std::string& own : {run + "/checkpoint/model.pt", run + "/config.yaml", run + "/../" +
                                 fs::path(run).filename().string() + "/checkpoint.old/model.pt"}) {
    CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", own, "--overwrite"}, &out) == 2);
    CHECK(out.find("--out " + own + ": is a file of the run directory ") != std::string::npos);
  }
  CHECK(read_text(d.root / run / "checkpoint" / "model.pt") == model_pt);
  CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", run + "/model.safetensors"}, &out) == 0);
  CHECK(read_text(d.root / run / "model.safetensors") == first);

  // A damaged checkpoint is refused before anything is written.
  const fs::path model_file = d.root / run / "checkpoint" / "model.pt";
  fs::resize_file(model_file, fs::file_size(model_file) / 2);
  CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", "y.safetensors"}, &out) == 2);
  CHECK(out.find("model.pt") != std::string::npos);
  CHECK(out.find("Exception raised") == std::string::npos);
  CHECK_FALSE(fs::exists(d.root / "y.safetensors"));
  CHECK(std::count(out.begin(), out.end(), '\n') == 1);
}

TEST_CASE("export: a full disk leaves no file, and eval --json records failures with their reason",
          "[export]") {
  ExportDir d;
  const std::string run = d.train("alibi", "alibi", true);
  std::string out;
  CHECK(run_cli(d, {"export", "--checkpoint", run, "--out", "full.safetensors"}, &out, 20000) == 2);
  CHECK(out.find("file size limit exceeded") != std::string::npos);
  CHECK(out.find("full.safetensors is unchanged") != std::string::npos);
  for (const auto& entry : fs::directory_iterator(d.root))
    CHECK(entry.path().filename().string().rfind("full.safetensors", 0) == std::string::npos);

  // The split holds about 2400 tokens: L = 5000 cannot be filled.
  CHECK(run_cli(d, {"eval", "--checkpoint", run, "--length", "16", "5000", "--json", "e.json"}, &out) == 1);
  const json rows = json::parse(read_text(d.root / "e.json")).at("results");
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].at("status") == "ok");
  CHECK(rows[0].at("stride") == 16);
  CHECK(rows[1].at("status") == "failed");
  CHECK(rows[1].at("length") == 5000);
  CHECK(rows[1].at("error").get<std::string>().find("needs at least 5001 tokens") != std::string::npos);
}

TEST_CASE("export: Python's extrap_model.py reproduces extrap eval, causal methods", "[export][python]") {
  ExportDir d;
  std::vector<Compared> models;
  for (const std::string position :
       {"none", "{name: sinusoidal, base: 1000}", "{name: learned, max_length: 48}",
        "{name: rotary, base: 500, fraction: 0.5}", "alibi",
        "{name: alibi_learned, shared_across_layers: false}",
        "{name: t5_bias, buckets: 8, max_distance: 20, shared_across_layers: false}",
        "kerple_log", "{name: kerple_power, shared_across_layers: false}", "sandwich", "xpos",
        "{name: fire, init_L: 8, mlp_width: 8}", "{name: cope, npos: 9}", "fox", "{name: p_rope, keep: 0.5}", "path",
        "{name: path, rank: 0, conv_size: 2, forget_gate: true}", "stick_breaking",
        "{name: stick_breaking, attend_current: true}", "dape",
        "{name: dape, base: kerple_log, mlp_width: 8, base_options: {shared_across_layers: false}}"}) {
    const std::string name = "causal_" + std::to_string(models.size());
    models.push_back(train_eval_export(d, name, position, true));
  }
  // Untied output embeddings, ReLU, 6 heads (slopes for a head count that is no power of two),
  // a word-level vocabulary: inline, and in a side file.
  models.push_back(train_eval_export(d, "causal_words", "alibi", true, "word",
                                     ", heads: 6, d_model: 48, tie_embeddings: false, activation: relu"));
  {
    const InDirectory in_directory(d);
    ExportOptions options;
    options.inline_vocabulary_bytes = 16;
    const ExportSummary summary = export_run("runs/causal_words", "side.safetensors", options);
    CHECK(summary.vocabulary_file == "side.safetensors.vocab.json");
    CHECK(read_safetensors_checked("side.safetensors").metadata.at("vocabulary_file") ==
          "side.safetensors.vocab.json");
  }
  models.push_back({"side.safetensors", "causal_words.eval.json", "words/valid.txt",
                    "causal_words.logits.safetensors"});
  check_in_python(d, models);

  // A length past the learned positions' table (48) is refused before any output: one line, no
  // table header before it, whichever length comes first.
  std::string output;
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/analysis/extrap_model.py " + models[2].model +
                                     " --tokens-file bytes/valid.txt --length 16 64", &output);
  INFO(output);
  CHECK(code == 2);
  CHECK_THAT(output, Catch::StartsWith("extrap_model.py: error: learned positions end at 48"));
  CHECK(std::count(output.begin(), output.end(), '\n') == 1);
}

// The architectures of model.* (issue 77): each option, exported, gives extrap's logits and every
// evaluation in Python (analysis/extrap_model.py, float64 to 1e-5), causal and masked.
TEST_CASE("export: a model of each architecture option, Python reproduces extrap eval", "[export][python][architectures]") {
  ExportDir d;
  std::vector<Compared> models{
      train_eval_export(d, "llama", "{name: rotary, pairing: half}", true, "byte",
                        ", norm: rmsnorm, ffn: swiglu, d_ffn: 0, ffn_multiple: 16, bias: false, kv_heads: 2, "
                        "tie_embeddings: false"),
      train_eval_export(d, "neox", "{name: rotary, pairing: half, fraction: 0.5}", true, "byte", ", block: parallel"),
      train_eval_export(d, "gptj", "alibi", true, "byte", ", block: parallel_shared, ffn: geglu, kv_heads: 1"),
      train_eval_export(d, "bloom", "alibi", true, "byte", ", embedding_norm: true, bias: false"),
      // Falcon-7B's block: LayerNorms with biases beside linear layers without (format 4)
      train_eval_export(d, "falcon", "{name: rotary, pairing: half}", true, "byte",
                        ", bias: false, norm_bias: true, block: parallel_shared, kv_heads: 1, qk_norm: true"),
      train_eval_export(d, "qwen3", "{name: xpos, pairing: half, fraction: 0.5}", true, "byte",
                        ", qk_norm: true, norm: rmsnorm, norm_eps: 0.000001"),
      train_eval_export(d, "p_rope_half", "{name: p_rope, keep: 0.5, pairing: half}", true, "byte", ", kv_heads: 2"),
      train_eval_export(d, "masked_llama", "alibi_symmetric", false, "byte",
                        ", norm: rmsnorm, ffn: swiglu, d_ffn: 48, kv_heads: 2, block: parallel, qk_norm: true"),
      // Gemma's block: geglu with GELU's tanh form (format 6), the tied embedding scaled on input
      train_eval_export(d, "gemma", "{name: rotary, pairing: half}", true, "byte",
                        ", norm: rmsnorm, ffn: geglu, activation: gelu_tanh, d_ffn: 48, bias: false, kv_heads: 1"),
      // OLMo 2's block: norms after the sublayers, q and k normed over the projection (format 7);
      // Gemma 2's: norms before and after each sublayer
      train_eval_export(d, "olmo2", "{name: rotary, pairing: half}", true, "byte",
                        ", norm: rmsnorm, ffn: swiglu, d_ffn: 48, bias: false, kv_heads: 2, sublayer_norms: output, "
                        "qk_norm: true, qk_norm_over: projection"),
      train_eval_export(d, "sandwich", "alibi", true, "byte", ", norm: rmsnorm, sublayer_norms: both, qk_norm: true"),
      // Gemma 2's: soft-capped scores (before ALiBi's bias here) and logits, a score scale of its own,
      // windows on every other layer (format 8)
      train_eval_export(d, "gemma2", "alibi", true, "byte",
                        ", norm: rmsnorm, ffn: geglu, activation: gelu_tanh, d_ffn: 48, bias: false, kv_heads: 2, "
                        "sublayer_norms: both, logit_softcap: 1.5",
                        "attention: {softcap: 0.75, scale_dim: 6}\n"
                        "layers: {pattern: [sliding, full], kinds: {sliding: {attention: {window: 4}}, full: {}}}\n"),
      // OLMo's: LayerNorms without parameters, q, k and v clipped (format 9)
      train_eval_export(d, "olmo", "{name: rotary, pairing: half}", true, "byte",
                        ", ffn: swiglu, d_ffn: 48, bias: false, kv_heads: 2, norm_affine: false, clip_qkv: 0.5"),
      // heads wider than d_model / heads, as Qwen3-0.6B's (format 5)
      train_eval_export(d, "qwen3_hf", "{name: rotary, pairing: half}", true, "byte",
                        ", qk_norm: true, norm: rmsnorm, norm_eps: 0.000001, ffn: swiglu, d_ffn: 48, bias: false, "
                        "kv_heads: 2, tie_embeddings: false, head_dim: 16")};
  check_in_python(d, models);
  // Hugging Face's own parts (LlamaRMSNorm, LlamaMLP, repeat_kv, rotate_half) and whole models
  // (LlamaForCausalLM, Qwen3ForCausalLM) given extrap's weights give extrap's numbers.
  std::string output;
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/tests/export/check_hf_parts.py llama " + models[0].model + " " +
                                     models[0].logits + " qwen3 " + models.back().model + " " + models.back().logits,
                              &output);
  INFO(output);
  REQUIRE(code == 0);
  CHECK(output.find("ok " + models[0].model) != std::string::npos);
  CHECK(output.find("ok " + models.back().model) != std::string::npos);
  const SafetensorsFile llama = read_safetensors_checked(d.root / "llama.safetensors");
  const json model = json::parse(llama.metadata.at("model"));
  CHECK(model.at("kv_heads") == 2);
  CHECK(model.at("d_ffn") == 96);  // Llama's rule: 2/3 of 4 x 32, rounded up to a multiple of 16
  CHECK(model.at("norm") == "rmsnorm");
  CHECK(llama.tensors.at("blocks.0.attention.qkv.weight").shape == std::vector<int64_t>{(4 + 2 * 2) * 8, 32});
  CHECK(llama.tensors.at("blocks.0.ffn_in.weight").shape == std::vector<int64_t>{2 * 96, 32});
  CHECK(llama.tensors.count("blocks.0.ffn_in.bias") == 0);
  CHECK(read_safetensors_checked(d.root / "qwen3.safetensors").tensors.count("blocks.1.attention.k_norm.weight") == 1);
  const SafetensorsFile falcon = read_safetensors_checked(d.root / "falcon.safetensors");
  CHECK(falcon.metadata.at("format") == "extrap-safetensors/4");
  CHECK(json::parse(falcon.metadata.at("model")).at("norm_bias") == true);
  for (const char* name : {"blocks.0.ln_attention.bias", "blocks.0.attention.k_norm.bias", "ln_final.bias"})
    CHECK(falcon.tensors.count(name) == 1);
  for (const char* name : {"blocks.0.attention.qkv.bias", "blocks.0.ffn_in.bias", "blocks.0.ln_ffn.weight"})
    CHECK(falcon.tensors.count(name) == 0);
  CHECK(read_safetensors_checked(d.root / "bloom.safetensors").metadata.at("format") == "extrap-safetensors/2");
  const SafetensorsFile qwen3 = read_safetensors_checked(d.root / "qwen3_hf.safetensors");
  CHECK(qwen3.metadata.at("format") == "extrap-safetensors/5");
  CHECK(json::parse(qwen3.metadata.at("model")).at("d_head") == 16);
  CHECK(qwen3.tensors.at("blocks.0.attention.qkv.weight").shape == std::vector<int64_t>{(4 + 2 * 2) * 16, 32});
  CHECK(qwen3.tensors.at("blocks.0.attention.out.weight").shape == std::vector<int64_t>{32, 4 * 16});
  CHECK(json::parse(llama.metadata.at("model")).at("d_head") == 8);
  const SafetensorsFile gemma = read_safetensors_checked(d.root / "gemma.safetensors");
  CHECK(gemma.metadata.at("format") == "extrap-safetensors/6");
  CHECK(json::parse(gemma.metadata.at("model")).at("activation") == "gelu_tanh");
  CHECK(read_safetensors_checked(d.root / "gptj.safetensors").metadata.at("format") == "extrap-safetensors/2");
  const SafetensorsFile olmo2 = read_safetensors_checked(d.root / "olmo2.safetensors");
  CHECK(olmo2.metadata.at("format") == "extrap-safetensors/7");
  CHECK(olmo2.tensors.at("blocks.0.attention.q_norm.weight").shape == std::vector<int64_t>{4 * 8});
  CHECK(olmo2.tensors.at("blocks.0.attention.k_norm.weight").shape == std::vector<int64_t>{2 * 8});
  CHECK(olmo2.tensors.count("blocks.0.ln_attention.weight") == 0);
  CHECK(olmo2.tensors.count("blocks.0.ln_ffn_out.weight") == 1);
  const SafetensorsFile sandwich = read_safetensors_checked(d.root / "sandwich.safetensors");
  CHECK(sandwich.metadata.at("format") == "extrap-safetensors/7");
  for (const char* name : {"blocks.1.ln_attention.weight", "blocks.1.ln_attention_out.weight", "blocks.1.ln_ffn.weight",
                           "blocks.1.ln_ffn_out.bias"})
    CHECK(sandwich.tensors.count(name) == 1);
  // The caps and the score scale: format 8, each key written where set (the section's in a kind's
  // attention), none where not, so that format 7's readers still read every other file.
  const SafetensorsFile gemma2 = read_safetensors_checked(d.root / "gemma2.safetensors");
  CHECK(gemma2.metadata.at("format") == "extrap-safetensors/8");
  CHECK(json::parse(gemma2.metadata.at("model")).at("logit_softcap") == 1.5);
  const json kinds = json::parse(gemma2.metadata.at("layers")).at("kinds");
  for (const char* kind : {"sliding", "full"}) {
    CHECK(kinds.at(kind).at("attention").at("softcap") == 0.75);
    CHECK(kinds.at(kind).at("attention").at("scale_dim") == 6);
  }
  CHECK_FALSE(json::parse(olmo2.metadata.at("model")).contains("logit_softcap"));
  CHECK_FALSE(json::parse(olmo2.metadata.at("attention")).contains("softcap"));
  // Norms without parameters and the clip: format 9, the keys written where set alone.
  const SafetensorsFile olmo = read_safetensors_checked(d.root / "olmo.safetensors");
  CHECK(olmo.metadata.at("format") == "extrap-safetensors/9");
  const json olmo_model = json::parse(olmo.metadata.at("model"));
  CHECK(olmo_model.at("norm_affine") == false);
  CHECK(olmo_model.at("clip_qkv") == 0.5);
  for (const char* name : {"blocks.0.ln_attention.weight", "blocks.1.ln_ffn.weight", "ln_final.weight"})
    CHECK(olmo.tensors.count(name) == 0);
  for (const char* key : {"norm_affine", "clip_qkv"}) CHECK_FALSE(json::parse(olmo2.metadata.at("model")).contains(key));
}

TEST_CASE("export: a sentencepiece model carries its tokenizer, and Python tokenises and scores as "
          "extrap does",
          "[export][python][sentencepiece]") {
  ExportDir d;
  fs::create_directories(d.root / "pieces");
  write_text(d.root / "pieces" / "train.txt", synthetic_prose(30000, 1));
  write_text(d.root / "pieces" / "valid.txt", synthetic_prose(3000, 2) + "\n  caf\xC3\xA9 \xE2\x82\xAC\r\nlast");
  write_text(d.root / "pieces" / "test.txt", synthetic_prose(3000, 3));
  std::string out;
  REQUIRE(run_cli(d, {"tokenizer", "train", "--data", "pieces", "--vocab-size", "400", "--type", "bpe",
                      "--out", "pieces.model"},
                  &out) == 0);
  std::vector<Compared> models{train_eval_export(d, "causal_pieces", "rotary", true, "sentencepiece"),
                               train_eval_export(d, "masked_pieces", "alibi_symmetric", false, "sentencepiece")};
  CHECK(read_safetensors_checked(d.root / "causal_pieces.safetensors").metadata.at("tokenizer_model_file") ==
        "causal_pieces.safetensors.tokenizer.model");
  CHECK(read_text(d.root / "causal_pieces.safetensors.tokenizer.model") == read_text(d.root / "pieces.model"));
  check_in_python(d, models);

  // Python's sentencepiece (PyPI) and extrap's (Debian's library) give the same ids, split by
  // split.
  write_text(d.root / "ids.py",
             "import json, sys\nsys.path.insert(0, '" EXTRAP_SOURCE_DIR "/analysis')\n"
             "import extrap_model as em\nm = em.load('causal_pieces.safetensors')\n"
             "for split in ('train', 'valid', 'test'):\n"
             "    ids = em.tokens_of_file(m, f'pieces/{split}.txt')\n"
             "    print(json.dumps(ids))\n");
  REQUIRE(run_python(d, "ids.py", &out) == 0);
  std::istringstream lines(out);
  const CliRun run = load_cli_run(d, "runs/causal_pieces");
  for (const TokenStream* stream : {&run.corpus.train, &run.corpus.valid, &run.corpus.test}) {
    std::string line;
    REQUIRE(std::getline(lines, line));
    const auto ids = json::parse(line).get<std::vector<int32_t>>();
    REQUIRE(ids.size() == size_t(stream->size()));
    CHECK(std::equal(ids.begin(), ids.end(), stream->data()));
  }
}

TEST_CASE("export: Python's extrap_model.py reproduces extrap eval, masked-LM methods", "[export][python]") {
  ExportDir d;
  std::vector<Compared> models;
  for (const std::string position :
       {"none", "sinusoidal", "{name: learned, max_length: 40}", "rotary", "alibi_symmetric",
        "alibi_nonsymmetric", "{name: alibi_learned, shared_across_layers: false}",
        "{name: t5_bias, buckets: 8, max_distance: 20}", "kerple_log", "kerple_power",
        "{name: sandwich, scale: 4}", "{name: fire, init_L: 8, shared_across_layers: true}",
        "{name: dape, base: t5_bias, base_options: {buckets: 8, max_distance: 20}}"}) {
    const std::string name = "masked_" + std::to_string(models.size());
    models.push_back(train_eval_export(d, name, position, false));
  }
  models.push_back(train_eval_export(d, "masked_words", "t5_bias", false, "word"));
  check_in_python(d, models);
}

TEST_CASE("export: the attention options in Python equal extrap's, logits and every evaluation", "[export][options]") {
  // analysis/extrap_model.py computes each option from its definition: a sink column in the
  // softmax, SSMax's s_h ln n_i with n_i the row's finite scores, the temperature on q, the
  // gate on each head's output, and the window and chunk masks by index.
  ExportDir d;
  std::vector<Compared> models;
  models.push_back(train_eval_export(d, "options_causal", "alibi", true, "byte", "",
                                     "attention: {sink: true, ssmax: true, window: 8, gate: headwise, "
                                     "temperature: 0.3, temperature_floor: 4}\n"));
  models.push_back(train_eval_export(d, "options_chunk", "rotary", true, "byte", "",
                                     "attention: {chunk: 12, gate: elementwise, ssmax: true}\n"));
  models.push_back(train_eval_export(d, "options_masked", "alibi_nonsymmetric", false, "byte", "",
                                     "attention: {sink: true, ssmax: true, window: 6}\n"));
  const SafetensorsFile file = read_safetensors_checked(d.root / "options_causal.safetensors");
  CHECK(json::parse(file.metadata.at("attention")) ==
        json{{"sink", true}, {"ssmax", true}, {"temperature", 0.3}, {"temperature_floor", 4},
             {"gate", "headwise"}, {"window", 8}, {"chunk", 0}});
  CHECK(file.tensors.at("blocks.1.attention.gate.weight").shape == std::vector<int64_t>{4, 32});
  check_in_python(d, models);
}

TEST_CASE("export: an adaptive input and softmax, without a final LayerNorm, exports its bands, and Python "
          "reproduces extrap eval",
          "[export][adaptive][python]") {
  // The vocabulary of the ALiBi paper's WikiText-103 model (core/model/adaptive.h), on the word
  // corpus's 21 ids (<eos>, <unk>, <mask>, then its 18 words by descending count): bands [0, 6),
  // [6, 12) and [12, 21), d_model / 4^k = 32, 8 and 2 wide, tied input and output, and no final
  // LayerNorm. The activation and adaptive-softmax dropouts act in training only. Quoted lists:
  // train() copies each value's text into the model's flow map.
  ExportDir d;
  std::vector<Compared> models;
  models.push_back(train_eval_export(d, "adaptive_causal", "alibi", true, "word",
                                     ", adaptive_cutoffs: '[6, 12]', final_norm: false, activation: relu, "
                                     "activation_dropout: 0.1, adaptive_dropout: 0.1"));
  // Masked LM with the final LayerNorm: bands of 5 and 16 ids, 32 and 16 wide; the masked
  // inputs' random replacements are drawn over all V ids.
  models.push_back(train_eval_export(d, "adaptive_masked", "{name: t5_bias, buckets: 8, max_distance: 20}", false,
                                     "word", ", adaptive_cutoffs: '[5]', adaptive_factor: 2, activation_dropout: 0.1"));

  const SafetensorsFile file = read_safetensors_checked(d.root / "adaptive_causal.safetensors");
  const json model = json::parse(file.metadata.at("model"));
  CHECK(model.at("adaptive_cutoffs") == json::array({6, 12}));
  CHECK(model.at("adaptive_factor") == 4);
  CHECK(model.at("final_norm") == false);
  CHECK(json::parse(file.metadata.at("data")).at("vocab_size") == 21);
  CHECK(file.tensors.count("embedding.weight") == 0);
  CHECK(file.tensors.count("ln_final.weight") == 0);
  CHECK(file.tensors.at("adaptive.embedding_0").shape == std::vector<int64_t>{6, 32});
  CHECK(file.tensors.at("adaptive.embedding_1").shape == std::vector<int64_t>{6, 8});
  CHECK(file.tensors.at("adaptive.embedding_2").shape == std::vector<int64_t>{9, 2});
  CHECK(file.tensors.at("adaptive.projection_0").shape == std::vector<int64_t>{32, 32});
  CHECK(file.tensors.at("adaptive.projection_2").shape == std::vector<int64_t>{32, 2});
  CHECK(file.tensors.at("adaptive.clusters").shape == std::vector<int64_t>{2, 32});
  const SafetensorsFile masked = read_safetensors_checked(d.root / "adaptive_masked.safetensors");
  CHECK(json::parse(masked.metadata.at("model")).at("final_norm") == true);
  CHECK(masked.tensors.at("adaptive.embedding_1").shape == std::vector<int64_t>{16, 16});
  CHECK(masked.tensors.at("adaptive.clusters").shape == std::vector<int64_t>{1, 32});
  CHECK(masked.tensors.count("ln_final.weight") == 1);
  // Python's adaptive head, tails and embedding against extrap's log-probabilities and
  // perplexities (analysis/extrap_model.py's AdaptiveVocabulary).
  check_in_python(d, models);

  // Bands that disagree with the metadata's cutoffs are refused in one line that names the
  // tensor and the cutoffs.
  write_text(d.root / "bands.py",
             "import json\nfrom safetensors import safe_open\nfrom safetensors.torch import load_file, save_file\n"
             "with safe_open('adaptive_causal.safetensors', 'pt') as f:\n    meta = f.metadata()\n"
             "model = json.loads(meta['model'])\nmodel['adaptive_cutoffs'] = [6, 13]\nmeta['model'] = json.dumps(model)\n"
             "save_file(load_file('adaptive_causal.safetensors'), 'bands.safetensors', metadata=meta)\n");
  std::string output;
  REQUIRE(run_python(d, "bands.py", &output) == 0);
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/analysis/extrap_model.py bands.safetensors "
                                 "--tokens-file words/valid.txt --length 16", &output);
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("tensor adaptive.embedding_1 has shape (6, 8), expected (7, 8)") != std::string::npos);
  CHECK(output.find("adaptive_cutoffs [6, 13]") != std::string::npos);
  CHECK(output.find("Traceback") == std::string::npos);
  CHECK(std::count(output.begin(), output.end(), '\n') == 1);
}

TEST_CASE("export: a model with a layer pattern exports each kind, Python reproduces extrap eval, and inspect "
          "bias shows each layer's method",
          "[export][pattern][python]") {
  // analysis/extrap_model.py builds each kind of layer from the metadata "layers" and the
  // tensors position_KIND.NAME; a kind's per-layer tables hold a row per layer of the kind.
  ExportDir d;
  std::vector<Compared> models;
  struct Pattern {
    const char* name;
    bool causal;
    const char* layers;  // the config's `layers` section
    int depth;
  };
  const Pattern patterns[] = {
      // Pattern entries that name methods: a kind per method.
      {"pattern", true, "layers: {pattern: [rotary, alibi]}\n", 2},
      // iRoPE's shape: rotary with chunks and a sink, then no positions with the temperature,
      // SSMax and a gate.
      {"pattern_irope", true,
       "layers: {pattern: [rope_chunk, nope_temp], kinds: {rope_chunk: {position: {name: rotary, base: 500}, "
       "attention: {chunk: 12, sink: true}}, nope_temp: {position: none, attention: {temperature: 0.3, "
       "temperature_floor: 4, ssmax: true, gate: headwise}}}}\n",
       2},
      // Per-layer tables over 4 layers, each kind in layers 0, 2 or 1, 3: rows 0 and 1 of its tables.
      {"pattern_tables", true,
       "layers: {pattern: [fox_window, t5], kinds: {fox_window: {position: fox, attention: {window: 6}}, "
       "t5: {position: {name: t5_bias, buckets: 8, max_distance: 20, shared_across_layers: false}}}}\n",
       4},
      {"pattern_cope", true, "layers: {pattern: [cope, stick_breaking], kinds: {cope: {position: {name: cope, npos: 9}}}}\n",
       4},
      {"pattern_masked", false,
       "layers: {pattern: [kerple, local], kinds: {kerple: {position: {name: kerple_log, shared_across_layers: false}}, "
       "local: {position: alibi_symmetric, attention: {window: 5}}}}\n",
       4},
      // DAPE in a kind: its MLP and its base's tables per layer of the kind.
      {"pattern_dape", true,
       "layers: {pattern: [dape, rotary], kinds: {dape: {position: {name: dape, base: alibi_learned, mlp_width: 8, "
       "base_options: {shared_across_layers: false}}, attention: {window: 7}}}}\n",
       4},
  };
  for (const Pattern& p : patterns)
    models.push_back(train_eval_export(d, p.name, "alibi", p.causal, "byte", "", p.layers, p.depth));
  const std::string run = "runs/pattern";

  const SafetensorsFile irope = read_safetensors_checked(d.root / "pattern_irope.safetensors");
  CHECK(irope.metadata.at("position") == "pattern");
  CHECK(irope.metadata.count("position_options") == 0);
  CHECK(irope.metadata.count("attention") == 0);
  const json layers = json::parse(irope.metadata.at("layers"));
  CHECK(layers.at("pattern") == json{"rope_chunk", "nope_temp"});
  CHECK(layers.at("kinds").at("rope_chunk").at("position") == "rotary");
  CHECK(layers.at("kinds").at("rope_chunk").at("position_options") ==
        json{{"base", 500}, {"fraction", 1.0}, {"pairing", "interleaved"}, {"scaling", "none"}, {"scaling_factor", 1.0},
                  {"scaling_length", 0}, {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"low_freq_factor", 1.0},
                  {"high_freq_factor", 4.0}, {"short_factor", json::array()}, {"long_factor", json::array()},
                  {"attention_factor", 0.0}});
  CHECK(layers.at("kinds").at("rope_chunk").at("attention") ==
        json{{"sink", true}, {"ssmax", false}, {"temperature", 0.0}, {"temperature_floor", 8192},
             {"gate", "none"}, {"window", 0}, {"chunk", 12}});
  CHECK(layers.at("kinds").at("nope_temp").at("attention").at("gate") == "headwise");
  CHECK(irope.tensors.count("blocks.0.attention.sink") == 1);
  CHECK(irope.tensors.count("blocks.1.attention.sink") == 0);
  CHECK(irope.tensors.at("blocks.1.attention.gate.weight").shape == std::vector<int64_t>{4, 32});
  const SafetensorsFile tables = read_safetensors_checked(d.root / "pattern_tables.safetensors");
  CHECK(tables.tensors.at("position_t5.table").shape == std::vector<int64_t>{2, 8, 4});
  CHECK(tables.tensors.at("position_fox_window.gate_weight").shape == std::vector<int64_t>{2, 4, 32});
  CHECK(json::parse(tables.metadata.at("layers")).at("kinds").at("t5").at("position_tensors") ==
        PositionRegistry::instance().get("t5_bias").tensors);
  check_in_python(d, models);

  const SafetensorsFile dape = read_safetensors_checked(d.root / "pattern_dape.safetensors");
  CHECK(dape.tensors.at("position_dape.w1").shape == std::vector<int64_t>{2, 8, 8});
  CHECK(dape.tensors.at("position_dape.base.raw_slopes").shape == std::vector<int64_t>{2, 4});
  CHECK(json::parse(dape.metadata.at("layers")).at("kinds").at("dape").at("position_options") ==
        json{{"base", "alibi_learned"}, {"mlp_width", 8}, {"base_options", {{"shared_across_layers", false}}}});
  std::string out;

  // Layer 1 is ALiBi's: -m_h (i - j), with m_0 = 1/4 for 4 heads.
  CHECK(run_cli(d, {"inspect", "bias", "--checkpoint", run, "--layer", "1", "--length", "3"}, &out) == 0);
  INFO(out);
  CHECK(out.find("head 0\n0 -inf -inf\n-0.25 0 -inf\n-0.5 -0.25 0\n") != std::string::npos);
  CHECK(run_cli(d, {"inspect", "bias", "--checkpoint", run, "--layer", "2", "--length", "3"}, &out) != 0);
  require_one_line_error(out, "--layer 2: the checkpoint's layers are 0 to 1");
  CHECK(run_cli(d, {"inspect", "bias", "--checkpoint", run, "--layer", "0", "--position", "alibi", "--length", "3"}, &out) != 0);
  require_one_line_error(out, "--position alibi does not match the checkpoint's method rotary in layer 0");
  CHECK(run_cli(d, {"inspect", "bias", "--checkpoint", run, "--layer", "1", "--length", "3", "--window", "2"}, &out) != 0);
  require_one_line_error(out, "--window 2: the checkpoint's layer 1 has attention.window 0");
  // A layer's own window and chunk are drawn as the masks they are (-inf).
  const std::string masked = d.train("pattern_masks", "alibi", true, "byte", "",
                                     "layers: {pattern: [local, alibi], kinds: {local: {attention: {window: 2, chunk: 3}}}}\n");
  CHECK(run_cli(d, {"inspect", "bias", "--checkpoint", masked, "--layer", "0", "--length", "4"}, &out) == 0);
  CHECK(out.find("head 0\n0 -inf -inf -inf\n-0.25 0 -inf -inf\n-inf -0.25 0 -inf\n-inf -inf -inf 0\n") != std::string::npos);
  CHECK(run_cli(d, {"inspect", "bias", "--checkpoint", masked, "--layer", "1", "--length", "3"}, &out) == 0);
  CHECK(out.find("head 0\n0 -inf -inf\n-0.25 0 -inf\n-0.5 -0.25 0\n") != std::string::npos);
}

TEST_CASE("export: a plugin's model exports, and Python refuses it by name", "[export][python]") {
  ExportDir d;
  const std::string run =
      d.train("window", "{name: local_window, window: 8}", true, "byte", "",
              "plugins: [" EXTRAP_BINARY_DIR "/plugins/libextrap_local_window.so]\n");
  std::string out;
  REQUIRE(run_cli(d, {"export", "--checkpoint", run, "--out", "window.safetensors"}, &out) == 0);
  const SafetensorsFile file = read_safetensors_checked(d.root / "window.safetensors");
  CHECK(file.metadata.at("position") == "local_window");
  CHECK(file.tensors.count("position.windows") == 1);
  CHECK(file.metadata.at("position_tensors").find("windows[h]") != std::string::npos);

  std::string output;
  const int code = run_python(d, EXTRAP_SOURCE_DIR "/analysis/extrap_model.py window.safetensors "
                                 "--tokens-file bytes/valid.txt --length 16", &output);
  INFO(output);
  CHECK(code == 2);
  CHECK(output.find("local_window") != std::string::npos);
  CHECK(output.find("Traceback") == std::string::npos);
  CHECK(std::count(output.begin(), output.end(), '\n') == 1);
}
