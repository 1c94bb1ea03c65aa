// What the tests share: the skip marker, temporary directories, small file helpers, an
// in-memory byte-level corpus of real-looking text and a tiny model config. Running the
// `extrap` command line is in tests/cli_harness.h.
#pragma once

#include "core/base/files.h"
#include "core/data/corpus.h"
#include "core/model/config.h"
#include "core/train/trainer.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <random>
#include <string>

namespace extrap::testing {

namespace fs = std::filesystem;

// A check that cannot run here (no GPU, no ../shared/data) is reported by ctest as skipped,
// never as passed: the test calls this and returns, and ctest's SKIP_REGULAR_EXPRESSION turns
// the marker (EXTRAP_SKIP_MARKER, set once in the top-level CMakeLists.txt) into "Skipped".
inline void skip_test(const std::string& reason) {
  std::cout << EXTRAP_SKIP_MARKER << " " << reason << std::endl;
}

// Whether a CUDA device can be used; if not, the calling GPU test is reported skipped.
inline bool have_cuda() {
  if (torch::cuda::is_available()) return true;
  skip_test("no CUDA device");
  return false;
}

// A fresh directory, removed with everything in it at scope exit.
struct TempDir {
  fs::path root;
  explicit TempDir(const std::string& tag = "tmp") {
    static std::atomic<int> counter{0};
    root = fs::temp_directory_path() /
           ("extrap-test-" + tag + "-" + std::to_string(::getpid()) + "-" +
            std::to_string(counter++) + "-" + std::to_string(std::random_device{}()));
    remove_tree(root);
    fs::create_directories(root);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    remove_tree(root, ignored);
  }
};

inline void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

inline std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(read_text(path)); }

// max |got - expected| / max |expected|, in float64 (`expected` is the float64 reference).
inline double max_relative_error(const torch::Tensor& got, const torch::Tensor& expected) {
  return ((got.to(torch::kFloat64) - expected).abs().max() / expected.abs().max()).item<double>();
}

// max |got - expected| over the larger of max |expected| and 1e-6: max_relative_error, except
// where the reference is zero but for float64's rounding (the loss of a single class, LayerNorm's
// gradients along a row of one value), whose scale would make any rounding a relative error of 1.
inline double max_scaled_error(const torch::Tensor& got, const torch::Tensor& expected) {
  const double scale = std::max(expected.abs().max().item<double>(), 1e-6);
  return (got.detach().cpu().to(torch::kFloat64) - expected).abs().max().item<double>() / scale;
}

// Causal attention with every other option at its default.
inline AttentionOptions causal_attention_options() {
  AttentionOptions options;
  options.causal = true;
  return options;
}

// The environment variable `name` is `value` for the object's lifetime (the CLI runs the tests
// spawn inherit it), then what it was before, or unset.
struct ScopedVariable {
  ScopedVariable(std::string name, const std::string& value) : name(std::move(name)) {
    if (const char* old = std::getenv(this->name.c_str())) previous = old;
    setenv(this->name.c_str(), value.c_str(), 1);
  }
  ~ScopedVariable() {
    if (previous) setenv(name.c_str(), previous->c_str(), 1);
    else unsetenv(name.c_str());
  }
  ScopedVariable(const ScopedVariable&) = delete;
  ScopedVariable& operator=(const ScopedVariable&) = delete;
  std::string name;
  std::optional<std::string> previous;
};

// English prose (a few paragraphs, repeated with variation) as a byte-level corpus.
inline Corpus tiny_byte_corpus(int repeats = 40) {
  const std::string paragraph =
      "The quick brown fox jumps over the lazy dog. A language model trained on short inputs "
      "can be evaluated on much longer ones if the attention scores get a penalty that is "
      "linear in the distance between the query and the key.\n";
  std::string text;
  for (int r = 0; r < repeats; ++r) text += std::to_string(r % 7) + " " + paragraph;
  auto bytes = [](const std::string& s) {
    std::vector<int32_t> ids(s.begin(), s.end());
    for (auto& id : ids) id &= 0xff;
    return ids;
  };
  Corpus c;
  c.name = "tiny";
  c.tokenizer = Tokenizer::byte;
  c.vocab_size = 257;
  c.mask_token = 256;
  const size_t cut = text.size() * 8 / 10;
  c.train = TokenStream::from_tokens(bytes(text.substr(0, cut)));
  c.valid = TokenStream::from_tokens(bytes(text.substr(cut)));
  c.test = c.valid;
  return c;
}

// Deterministic pseudo-English of about `bytes` bytes: sentences of words drawn by an LCG from a
// fixed list, now and then a number, a line break after every few sentences. Enough variety to
// train a subword tokenizer on.
inline std::string synthetic_prose(size_t bytes, uint64_t seed) {
  static const char* const kWords[] = {
      "the", "model", "was", "trained", "on", "short", "inputs", "and", "evaluated", "at",
      "longer", "lengths", "attention", "scores", "get", "a", "penalty", "linear", "in",
      "distance", "while", "rotary", "embeddings", "degrade", "quickly", "beyond", "training",
      "window", "perplexity", "stays", "flat", "for", "every", "head", "slope", "is", "fixed",
      "geometric", "sequence", "researchers", "compare", "methods", "with", "one", "trainer",
      "position", "bias", "kernel", "learned", "sinusoidal", "of", "to", "it", "we", "report"};
  std::string out;
  uint64_t state = seed;
  const auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % n;
  };
  while (out.size() < bytes) {
    const uint64_t words = 4 + next(12);
    for (uint64_t w = 0; w < words; ++w) {
      std::string word = kWords[next(std::size(kWords))];
      if (w == 0) word[0] = char(word[0] - 'a' + 'A');
      out += word;
      if (next(17) == 0) out.append(" ").append(std::to_string(next(2000)));
      out += w + 1 < words ? " " : ". ";
    }
    if (next(4) == 0) out.back() = '\n';
  }
  return out;
}

// A causal model's two promises, on random tokens below 256 (the model in eval mode, no grad):
// changing token 25 of 40 leaves every earlier position's logits as they were and changes its
// own, and decoding in uneven blocks with a KV cache gives the logits of one forward pass.
inline void check_causal_and_cached(TransformerLM& model) {
  const int64_t T = 40;
  auto tokens = torch::randint(0, 256, {2, T}, torch::kLong);
  const auto full = model->forward(tokens);
  auto changed = tokens.clone();
  changed.select(1, 25).add_(1).remainder_(256);
  const auto after = model->forward(changed);
  CHECK(torch::equal(after.narrow(1, 0, 25), full.narrow(1, 0, 25)));
  CHECK(!torch::allclose(after.narrow(1, 25, 1), full.narrow(1, 25, 1)));
  KVCache cache(T);
  std::vector<torch::Tensor> logits;
  int64_t at = 0;
  for (int64_t size : {5, 1, 1, 9, 3, 21}) {
    logits.push_back(model->logits(model->hidden(tokens.narrow(1, at, size), cache)));
    at += size;
  }
  const auto decoded = torch::cat(logits, 1);
  INFO("max |difference| " << (decoded - full).abs().max().item<double>());
  CHECK(torch::allclose(decoded, full, 1e-5, 1e-5));
}

inline Config tiny_config(const std::string& position = "alibi") {
  Config c;
  c.model.layers = 2;
  c.model.d_model = 32;
  c.model.heads = 4;
  c.model.d_ffn = 64;
  c.model.dropout = 0.0;
  c.position_name = position;
  c.train.seq_len = 16;
  c.train.batch_tokens = 256;
  c.train.steps = 30;
  c.train.lr = 3e-3;
  c.train.warmup = 5;
  c.train.validate_every = 0;
  c.train.validate_tokens = 0;
  c.train.checkpoint_every = 0;
  c.train.log_every = 1000;
  c.train.threads = 1;
  return c;
}

// Every registered position method that supports causal attention, by name (at least the 14
// built-in ones, or the calling test fails).
inline std::vector<std::string> causal_methods() {
  std::vector<std::string> names;
  for (const auto& name : PositionRegistry::instance().names())
    if (PositionRegistry::instance().get(name).modes & kCausal) names.push_back(name);
  REQUIRE(names.size() >= 14);
  return names;
}

// The tiny model of a method (trained length 16, 2 layers, 4 heads; `layers` to change that)
// in eval mode with every parameter moved off its initial value, so that zero-initialised
// tables (CoPE's embeddings, learned slopes at their init) take part.
inline TransformerLM perturbed_model(const std::string& method, int64_t layers = 2) {
  Config config = tiny_config(method);
  config.model.layers = layers;
  torch::manual_seed(21);
  auto model = build_model(config, 257);
  model->eval();
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
  return model;
}

// One micro-batch through the training loss (`tokens`: (B, T + 1), every target scored) and
// back: the loss and every parameter's gradient, flattened into one vector.
inline std::pair<double, torch::Tensor> loss_and_gradients(TransformerLM& model, const torch::Tensor& tokens,
                                                           Precision precision) {
  const int64_t length = tokens.size(1) - 1;
  model->zero_grad();
  const auto loss = training_loss(model, tokens.narrow(1, 0, length), tokens.narrow(1, 1, length),
                                  tokens.size(0) * length, precision);
  loss.backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : model->parameters()) grads.push_back(p.grad().flatten().clone());
  return {loss.item<double>(), torch::cat(grads)};
}

// A fresh run of `config` for `steps` steps (logging every 5) in DIR/run, quietly: its summary.
inline TrainSummary train_briefly(Config config, const Corpus& corpus, const fs::path& dir, int64_t steps = 40) {
  config.train.steps = steps;
  config.train.log_every = 5;
  config.train.out_dir = (dir / "run").string();
  Trainer trainer(config, corpus);
  trainer.quiet = true;
  return trainer.run(RunStart::fresh);
}

// Trains `config` to its steps twice: straight through in DIR/straight, and in DIR/resumed
// stopped after step `stop_after` (a checkpoint) and resumed by a fresh trainer. Requires the
// two models to be bit-for-bit equal; returns the straight run's parameters. The resumed run's
// directory is DIR/resumed.
inline std::vector<torch::Tensor> require_resume_bit_for_bit(Config config, const Corpus& corpus,
                                                             const fs::path& dir,
                                                             int64_t stop_after) {
  config.train.out_dir = (dir / "straight").string();
  Trainer straight(config, corpus);
  straight.quiet = true;
  straight.run(RunStart::fresh);

  config.train.out_dir = (dir / "resumed").string();
  {
    Trainer interrupted(config, corpus);
    interrupted.quiet = true;
    interrupted.stop_after_step = stop_after;
    REQUIRE(interrupted.run(RunStart::fresh).steps == stop_after);
  }
  Trainer resumed(config, corpus);
  resumed.quiet = true;
  const TrainSummary summary = resumed.run(RunStart::resume);
  REQUIRE(summary.resumed_from == stop_after);
  REQUIRE(summary.steps == config.train.steps);

  auto a = straight.model()->parameters(), b = resumed.model()->parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(torch::equal(a[i], b[i]));
  return a;
}

}  // namespace extrap::testing
