// YAML and command-line errors say what they should.
#include "core/base/files.h"
#include "core/model/config.h"
#include "tests/support/cli_harness.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

using namespace extrap;
namespace fs = std::filesystem;

namespace {
// Each test's files in a directory of their own (the messages name the file by its name).
const testing::TempDir& yaml_dir() {
  static const testing::TempDir dir("config");
  return dir;
}

std::string write_yaml(const std::string& name, const std::string& text) {
  const auto path = yaml_dir().root / name;
  testing::write_text(path, text);
  return path.string();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

struct Run {
  int status;
  std::string output;
};
Run run_cli(const std::vector<std::string>& args) {
  Run r{0, ""};
  r.status = testing::run_cli(yaml_dir(), args, &r.output);
  return r;
}
}  // namespace

TEST_CASE("config: values, defaults and --set overrides", "[config]") {
  const auto path = write_yaml("extrap-ok.yaml",
                               "model:\n  layers: 2\n  heads: 4\n  d_model: 64\nposition:\n  name: learned\n"
                               "  max_length: 99\ntrain:\n  seq_len: 32\n");
  Config c = load_config(path, {"train.seq_len=48", "eval.lengths=[1, 2]"});
  REQUIRE(c.model.layers == 2);
  REQUIRE(c.model.heads == 4);
  REQUIRE(c.model.d_model == 64);
  REQUIRE(c.train.seq_len == 48);
  REQUIRE(c.eval.lengths == std::vector<int64_t>{1, 2});
  REQUIRE(c.position_name == "learned");
  REQUIRE(c.position["max_length"].as<int>() == 99);
  REQUIRE(c.model.d_ffn == 1024);  // defaults
  REQUIRE(c.train.steps == 1000);
  REQUIRE(c.eval.strides.empty());
}

TEST_CASE("config: to_yaml and back gives every field again", "[config]") {
  // Every value differs from its default, so a key the serialiser drops or misnames fails.
  const auto path = write_yaml("extrap-all.yaml", R"(data: {path: some/corpus, tokenizer: byte, cache_dir: c}
model: {layers: 3, d_model: 48, heads: 6, d_ffn: 96, dropout: 0.25, attention_dropout: 0.125,
        activation: relu, tie_embeddings: false, objective: masked_lm, attention: efficient,
        efficient_threshold: 4096}
position: {name: t5_bias, buckets: 16, max_distance: 64}
train: {seq_len: 24, batch_tokens: 480, accumulation: 2, steps: 17, lr: 0.0025, min_lr: 0.0001,
        warmup: 3, schedule: inverse_sqrt, weight_decay: 0.5, beta1: 0.8, beta2: 0.9, eps: 1.0e-6,
        clip: 0.5, seed: 9, validate_every: 7, validate_tokens: 333, checkpoint_every: 5,
        log_every: 2, out_dir: runs/x, threads: 3, mask_prob: 0.3, cuda_graph: off}
eval: {lengths: [24, 96], strides: [8], split: test, batch_tokens: 777, max_tokens: 5000,
       mask_seed: 77}
)");
  const Config c = load_config(path, {});
  const Config again = config_from_yaml(c.to_yaml(), "again");
  for (const Config* x : {&c, &again}) {
    INFO((x == &c ? "as loaded" : "after to_yaml and back"));
    CHECK(x->data.path == "some/corpus");
    CHECK(x->data.tokenizer == Tokenizer::byte);
    CHECK(x->data.cache_dir == "c");
    CHECK(x->model.layers == 3);
    CHECK(x->model.d_model == 48);
    CHECK(x->model.heads == 6);
    CHECK(x->model.d_ffn == 96);
    CHECK(x->model.dropout == 0.25);
    CHECK(x->model.attention_dropout == 0.125);
    CHECK(x->model.activation == Activation::relu);
    CHECK(!x->model.tie_embeddings);
    CHECK(x->model.objective == Objective::masked_lm);
    CHECK(x->model.attention == AttentionBackend::Efficient);
    CHECK(x->model.efficient_threshold == 4096);
    CHECK(x->position_name == "t5_bias");
    CHECK(x->position["buckets"].as<int>() == 16);
    CHECK(x->position["max_distance"].as<int>() == 64);
    CHECK(x->train.seq_len == 24);
    CHECK(x->train.batch_tokens == 480);
    CHECK(x->train.accumulation == 2);
    CHECK(x->train.steps == 17);
    CHECK(x->train.lr == 0.0025);
    CHECK(x->train.min_lr == 0.0001);
    CHECK(x->train.warmup == 3);
    CHECK(x->train.schedule == Schedule::inverse_sqrt);
    CHECK(x->train.weight_decay == 0.5);
    CHECK(x->train.beta1 == 0.8);
    CHECK(x->train.beta2 == 0.9);
    CHECK(x->train.eps == 1.0e-6);
    CHECK(x->train.clip == 0.5);
    CHECK(x->train.seed == 9);
    CHECK(x->train.validate_every == 7);
    CHECK(x->train.validate_tokens == 333);
    CHECK(x->train.checkpoint_every == 5);
    CHECK(x->train.log_every == 2);
    CHECK(x->train.out_dir == "runs/x");
    CHECK(x->train.threads == 3);
    CHECK(x->train.mask_prob == 0.3);
    CHECK(x->train.cuda_graph == CudaGraphMode::off);
    CHECK(x->eval.lengths == std::vector<int64_t>{24, 96});
    CHECK(x->eval.strides == std::vector<int64_t>{8});
    CHECK(x->eval.split == Split::test);
    CHECK(x->eval.batch_tokens == 777);
    CHECK(x->eval.max_tokens == 5000);
    CHECK(x->eval.mask_seed == 77);
  }
}

TEST_CASE("config: an unknown key names the file, line and key", "[config]") {
  const auto path = write_yaml("extrap-typo.yaml", "model:\n  layers: 2\n  hedas: 4\n");
  const auto message = error_of([&] { load_config(path, {}); });
  REQUIRE_THAT(message, Catch::Contains("extrap-typo.yaml:3") && Catch::Contains("model.hedas") &&
                            Catch::Contains("unknown key"));
}

TEST_CASE("config: a wrong type names the file, line, key and value", "[config]") {
  const auto path = write_yaml("extrap-type.yaml", "train:\n  seq_len: 32\n  steps: many\n");
  const auto message = error_of([&] { load_config(path, {}); });
  REQUIRE_THAT(message, Catch::Contains("extrap-type.yaml:3") && Catch::Contains("train.steps") &&
                            Catch::Contains("integer") && Catch::Contains("many"));
  const auto choice = error_of([&] { load_config(path, {"train.steps=3", "model.activation=swish"}); });
  REQUIRE_THAT(choice, Catch::Contains("model.activation") && Catch::Contains("swish") &&
                           Catch::Contains("gelu | relu") && Catch::Contains("command line"));
}

TEST_CASE("config: bad --set and bad files are clear errors", "[config]") {
  REQUIRE_THAT(error_of([] { load_config("", {"train.seq_len"}); }), Catch::Contains("key.path=value"));
  REQUIRE_THAT(error_of([] { load_config("", {"trian.steps=3"}); }), Catch::Contains("trian"));
  REQUIRE_THAT(error_of([] { load_config("/nonexistent/x.yaml", {}); }), Catch::Contains("/nonexistent/x.yaml"));
  const auto bad = write_yaml("extrap-syntax.yaml", "model:\n  layers: [1, 2\n");
  REQUIRE_THAT(error_of([&] { load_config(bad, {}); }), Catch::Contains("extrap-syntax.yaml:") &&
                                                             Catch::Contains("syntax"));
  REQUIRE_THAT(error_of([] { load_config("", {"model.heads=3"}); }), Catch::Contains("multiple of heads"));
  // A key given twice in one map (yaml-cpp would keep one of them silently), in a file, in a
  // flow map, and in a --set value; the same key in two maps is no repetition.
  const auto twice = write_yaml("extrap-twice.yaml", "model:\n  layers: 2\n  heads: 4\n  layers: 3\n");
  REQUIRE_THAT(error_of([&] { load_config(twice, {}); }),
               Catch::Contains("extrap-twice.yaml:4: key 'layers' is given twice in one map (first on line 2)"));
  const auto flow = write_yaml("extrap-flow.yaml", "model: {heads: 4, d_model: 32, heads: 2}\n");
  REQUIRE_THAT(error_of([&] { load_config(flow, {}); }), Catch::Contains("key 'heads' is given twice"));
  REQUIRE_THAT(error_of([] { load_config("", {"position={name: alibi, name: rotary}"}); }),
               Catch::Contains("--set 'position={name: alibi, name: rotary}'") && Catch::Contains("given twice"));
  const auto apart = write_yaml("extrap-apart.yaml", "model: {layers: 2}\ntrain: {steps: 2}\nposition: {name: alibi}\n");
  REQUIRE(load_config(apart, {}).model.layers == 2);
  // A document or a key that is not what a config is: one line naming the file and line.
  REQUIRE(error_of([&] { load_config(write_yaml("extrap-scalar.yaml", "just a string\n"), {}); }) ==
          write_yaml("extrap-scalar.yaml", "just a string\n") +
              ":1: the document must be a map of key: value, got 'just a string'");
  REQUIRE_THAT(error_of([&] { load_config(write_yaml("extrap-list.yaml", "- a\n- b\n"), {}); }),
               Catch::EndsWith("extrap-list.yaml:1: the document must be a map of key: value, got a list"));
  REQUIRE_THAT(error_of([&] { load_config(write_yaml("extrap-listkey.yaml", "train:\n  [steps]: 20\n"), {}); }),
               Catch::EndsWith("extrap-listkey.yaml:2: a key is a name, got the list [steps]"));
  // Numbers as written: yaml-cpp reads 010 as octal 8 and 0x14 as 20, and takes quoted "20" and
  // "false" as a number and a boolean; each is refused, never trained as something else.
  for (const auto& [text, got] : std::vector<std::pair<std::string, std::string>>{
           {"steps: 010", "'010' (a leading zero"},
           {"steps: 0x14", "'0x14'"},
           {"steps: \"20\"", "the string '20' (numbers and true/false are written without quotes"},
           {"steps: !!str 20", "the string '20'"},
           {"lr: '0.002'", "the string '0.002'"}}) {
    INFO(text);
    const auto file = write_yaml("extrap-number.yaml", "train:\n  " + text + "\n");
    REQUIRE_THAT(error_of([&] { load_config(file, {}); }),
                 Catch::Contains("extrap-number.yaml:2: key 'train.") && Catch::Contains(": expected ") &&
                     Catch::Contains(", got " + got));
  }
  const auto quoted_bool = write_yaml("extrap-bool.yaml", "model:\n  tie_embeddings: \"false\"\n");
  REQUIRE_THAT(error_of([&] { load_config(quoted_bool, {}); }),
               Catch::Contains("key 'model.tie_embeddings': expected true/false, got the string 'false'"));
  for (const auto* plain : {"steps: 20", "steps: -0", "steps: +7", "steps: 0"}) {
    INFO(plain);
    const auto file = write_yaml("extrap-plain.yaml", std::string("train:\n  ") + plain + "\n");
    CHECK(error_of([&] { load_config(file, {}); }).find("expected integer") == std::string::npos);
  }
  REQUIRE(load_config(write_yaml("extrap-plain.yaml", "train:\n  steps: 20\n  seed: -3\n"), {}).train.steps == 20);
  REQUIRE_THAT(error_of([] { load_config("", {"train.seed=010"}); }),
               Catch::Contains("key 'train.seed' (set on the command line or by a sweep's grid): expected integer, got "
                               "'010' (a leading zero"));
  // A directory where a config file belongs.
  const std::string directory = (fs::temp_directory_path() / "extrap-config-directory").string();
  fs::create_directories(directory);
  REQUIRE_THAT(error_of([&] { load_config(directory, {}); }),
               Catch::Contains(directory + ": is a directory, not a file"));
  remove_tree(directory);
}

TEST_CASE("command line: wrong usage exits non-zero and says what was wrong", "[cli]") {
  auto r = run_cli({});
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("usage"));
  r = run_cli({"trian"});
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("unknown command 'trian'"));
  r = run_cli({"train"});
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("config"));
  r = run_cli({"inspect", "slopes", "--heads", "4", "--bogus", "1"});
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("bogus"));
  r = run_cli({"train", "--help"});
  REQUIRE(r.status == 0);
  REQUIRE_THAT(r.output, Catch::Contains("--resume"));
}

TEST_CASE("command line: inspect slopes and bias print exact values", "[cli]") {
  // 12 heads: the last four are slopes of the 16-head set, 2^-0.5 ... 2^-3.5, which need 17
  // significant digits to read back exactly; each printed value must parse to the double.
  auto r = run_cli({"inspect", "slopes", "--heads", "12"});
  REQUIRE(r.status == 0);
  std::istringstream printed(r.output);
  std::vector<std::string> lines;
  for (std::string line; std::getline(printed, line);) lines.push_back(line);
  REQUIRE(lines.size() == 12);
  for (int h = 0; h < 12; ++h) {
    INFO("head " << h << ": " << lines[size_t(h)]);
    const double expected = h < 8 ? std::ldexp(1.0, -(h + 1)) : std::pow(2.0, -0.5 - (h - 8));
    CHECK(std::strtod(lines[size_t(h)].c_str(), nullptr) == expected);
  }
  CHECK(lines[8] == "0.70710678118654757");  // 2^-0.5 to 17 digits
  r = run_cli({"inspect", "bias", "--position", "alibi", "--heads", "2", "--length", "3"});
  REQUIRE(r.status == 0);
  REQUIRE(r.output == "head 0\n0 -inf -inf\n-0.0625 0 -inf\n-0.125 -0.0625 0\n"
                      "head 1\n0 -inf -inf\n-0.00390625 0 -inf\n-0.0078125 -0.00390625 0\n");
  // attention.window and attention.chunk's masks, as the model applies them (-inf); one head's
  // slope is 2^-8.
  r = run_cli({"inspect", "bias", "--position", "alibi", "--heads", "1", "--length", "4", "--window", "2"});
  REQUIRE(r.status == 0);
  CHECK(r.output == "head 0\n0 -inf -inf -inf\n-0.00390625 0 -inf -inf\n-inf -0.00390625 0 -inf\n"
                    "-inf -inf -0.00390625 0\n");
  r = run_cli({"inspect", "bias", "--position", "alibi_symmetric", "--heads", "1", "--length", "4", "--chunk", "2",
               "--bidirectional"});
  REQUIRE(r.status == 0);
  CHECK(r.output == "head 0\n0 -0.00390625 -inf -inf\n-0.00390625 0 -inf -inf\n-inf -inf 0 -0.00390625\n"
                    "-inf -inf -0.00390625 0\n");
  r = run_cli({"inspect", "bias", "--position", "alibi", "--heads", "1", "--length", "4", "--chunk", "-3"});
  CHECK(r.status != 0);
  CHECK_THAT(r.output, Catch::Contains("--chunk -3: must not be negative"));
  for (const char* length : {"0", "100000"}) {
    r = run_cli({"inspect", "bias", "--position", "alibi", "--heads", "2", "--length", length});
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Catch::Contains(std::string("--length ") + length + ": must be 1 to 4096"));
  }
  r = run_cli({"inspect", "bias", "--position", "nope", "--heads", "2", "--length", "3"});
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("unknown position method 'nope'"));
}

TEST_CASE("config: impossible values are refused naming the key and the value", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.d_model=0", "key 'model.d_model' (set on the command line or by a sweep's grid): must be at least 1, got 0"},
      {"model.d_ffn=-1", "'model.d_ffn'"},
      {"model.layers=-1", "'model.layers'"},
      {"train.lr=0", "key 'train.lr' (set on the command line or by a sweep's grid): must be a positive number, got 0"},
      {"train.lr=-0.5", "got -0.5"},
      {"train.beta1=1", "key 'train.beta1' (set on the command line or by a sweep's grid): must be in [0, 1), got 1"},
      {"train.beta2=-0.1", "'train.beta2'"},
      {"train.clip=-1", "'train.clip'"},
      {"train.warmup=-3", "'train.warmup'"},
      {"train.eps=0", "'train.eps'"},
      {"train.mask_prob=1", "'train.mask_prob'"},
      {"train.cuda_graph=yes", "'train.cuda_graph'"},
      {"train.threads=-2", "'train.threads'"},
      {"eval.batch_tokens=0", "'eval.batch_tokens'"},
      {"eval.max_tokens=-1", "'eval.max_tokens'"},
      {"eval.strides=[0]", "'eval.strides'"},
      {"eval.lengths=[64, 0]", "key 'eval.lengths' (set on the command line or by a sweep's grid): must be at least 1, got 0"},
      {"eval.lengths=[64, 128, 64]", "key 'eval.lengths' (set on the command line or by a sweep's grid): 64 is listed twice"},
      {"eval.strides=[8, 8]", "'eval.strides' (set on the command line or by a sweep's grid): 8 is listed twice"},
      {"train.seq_len=0", "key 'train.seq_len' (set on the command line or by a sweep's grid): must be at least 1, got 0"},
      {"train.threads=-2", "must not be negative (0: all cores), got -2"},
      {"model.dropout=.nan", "'model.dropout' (set on the command line or by a sweep's grid): must be a finite number, got '.nan'"},
      {"data.task_fraction=1.5", "'data.task_fraction' (set on the command line or by a sweep's grid): must be in [0, 1], got 1.5"},
  };
  for (const auto& [assignment, expected] : cases) {
    INFO(assignment);
    CHECK_THAT(error_of([&] { load_config("", {assignment}); }), Catch::Contains(expected));
  }
  CHECK_THAT(error_of([] { load_config("", {"train.lr="}); }),
             Catch::Contains("--set 'train.lr=': no value after '='"));
  // A nested key in a file names its own line.
  const auto path = write_yaml("extrap-nested.yaml", "model:\n  layers: 2\n  d_ffn: -1\ntrain:\n  lr: 0.1\n");
  CHECK_THAT(error_of([&] { load_config(path, {}); }),
             Catch::Contains("extrap-nested.yaml:3: key 'model.d_ffn'"));
}

TEST_CASE("config: each key's mark decides the run fingerprint and what a sweep hash covers",
          "[config]") {
  Config c;
  // data.task and data.task_fraction are left out at their defaults (tests/eval/test_retrieval.cpp)
  c.task = RetrievalTask::passkey;
  c.task_fraction = 0.5;
  // and so is train.precision (fp32; tests/kernels/test_precision.cpp)
  c.train.precision = Precision::bf16;
  // and data.vocab_size and data.ids_dtype unless the tokenizer is ids, and data.token_bytes
  // unless given (tests/experiments/test_pretokenised.cpp), and data.tokenizer_model unless given
  c.data.tokenizer = Tokenizer::ids;
  c.data.vocab_size = 1000;
  c.data.token_bytes = "bytes.npy";
  CHECK(!c.model_keys()["data"]["tokenizer_model"]);  // the runs of 0.11 keep their fingerprints
  c.data.tokenizer_model = "spm.model";
  // and the attention section's keys at their defaults (tests/attention/test_attention_options.cpp)
  CHECK(!c.model_keys()["attention"]);  // the runs of 0.12 keep their fingerprints
  c.model.attention_options = {true, true, 0.2, 0.1, 64, AttentionGate::headwise, 32, 16, 50.0, 144.0};
  // and the layers section without a pattern (tests/model/test_layer_pattern.cpp)
  CHECK(!c.model_keys()["layers"]);  // the runs of 0.12 keep their fingerprints
  c.layer_pattern = {"a", "none"};
  c.layers = YAML::Load("{pattern: [a, none], kinds: {a: {position: rotary}}}");
  // and the paper's model and optimiser keys at their defaults (issue 67)
  for (const char* key : {"activation_dropout", "final_norm", "init", "adaptive_cutoffs"})
    CHECK(!c.model_keys()["model"][key]);  // older runs keep their fingerprints
  for (const char* key : {"optimizer", "momentum", "t_mult", "period"}) CHECK(!c.model_keys()["train"][key]);
  // and the architecture keys of issue 77 at their defaults (tests/model/test_architectures.cpp)
  for (const char* key : {"kv_heads", "ffn_multiple", "ffn", "norm", "norm_eps", "bias", "block", "qk_norm",
                          "embedding_norm"})
    CHECK(!c.model_keys()["model"][key]);  // older runs keep their fingerprints
  // and the released families' keys of issue 78 (tests/hub/test_import.cpp)
  for (const char* key : {"qkv_bias", "scale_embedding", "norm_bias", "sublayer_norms", "qk_norm_over", "logit_softcap",
                          "norm_affine", "clip_qkv"})
    CHECK(!c.model_keys()["model"][key]);
  // model.norm_bias follows model.bias unless given: absent where the two agree, read back so.
  {
    Config falcon = load_config("", {"model.bias=false", "model.norm_bias=true"});
    CHECK(falcon.model.norm_biased());
    CHECK(falcon.model_keys()["model"]["norm_bias"].as<bool>());
    CHECK(load_config("", {"model.bias=false"}).model.norm_biased() == false);
    CHECK(!load_config("", {"model.bias=false", "model.norm_bias=false"}).model_keys()["model"]["norm_bias"]);
    Config programmatic;
    programmatic.model.bias = false;  // no norm_bias set: the norms follow
    CHECK(!programmatic.model.norm_biased());
    CHECK_THAT(error_of([] { load_config("", {"model.norm_bias=3"}); }), Catch::Contains("model.norm_bias"));
  }
  c.model.norm_bias = true;
  c.model.qkv_bias = true;
  c.model.scale_embedding = false;
  c.model.kv_heads = 2;
  c.model.ffn_multiple = 128;
  c.model.ffn = FfnKind::swiglu;
  c.model.norm = NormKind::rmsnorm;
  c.model.norm_eps = 1e-6;
  c.model.bias = false;
  c.model.block = BlockKind::parallel;
  c.model.qk_norm = true;
  c.model.qk_norm_over = QkNormOver::projection;
  c.model.sublayer_norms = SublayerNorms::output;
  c.model.logit_softcap = 30;
  c.model.clip_qkv = 8;
  c.model.head_dim = 3 * c.model.d_head();  // not d_model / heads: kept in the identity
  c.model.embedding_norm = true;
  c.model.activation_dropout = 0.1;
  c.model.final_norm = false;
  c.model.init = InitKind::fairseq;
  c.model.adaptive_cutoffs = {100};
  c.train.optimizer = OptimizerKind::nag;
  c.train.schedule = Schedule::cosine_restarts;
  YAML::Node model = c.model_keys();
  CHECK(model["train"]["steps"]);
  CHECK(model["train"]["lr"]);
  CHECK(model["model"]["d_model"]);
  CHECK(model["position"]["name"]);
  CHECK(!model["train"]["threads"]);
  CHECK(!model["train"]["out_dir"]);
  CHECK(!model["train"]["validate_every"]);
  CHECK(!model["data"]["cache_dir"]);
  CHECK(!model["eval"]["lengths"]);
  CHECK(!model["plugins"]);
  YAML::Node result = c.result_keys();
  // model.norm_affine false takes the norms' biases with their weights (norm_bias goes): read off a copy.
  Config unweighted = c;
  unweighted.model.norm_affine = false;
  CHECK_FALSE(unweighted.model_keys()["model"]["norm_bias"]);  // no biases, as model.bias: absent
  model["model"]["norm_affine"] = unweighted.model_keys()["model"]["norm_affine"];
  result["model"]["norm_affine"] = unweighted.result_keys()["model"]["norm_affine"];
  CHECK(result["eval"]["lengths"]);
  CHECK(result["eval"]["split"]);
  CHECK(result["train"]["validate_every"]);
  CHECK(!result["eval"]["batch_tokens"]);
  CHECK(!result["train"]["threads"]);
  // Every documented key has exactly one mark, and the two views agree with them.
  for (const auto& doc : config_documentation()) {
    if (doc.section || doc.key == "position") continue;
    INFO(doc.key << " marked " << to_string(doc.affects));
    std::vector<std::string> parts;
    std::stringstream in(doc.key);
    for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
    YAML::Node m = model, r = result;
    bool in_model = true, in_result = true;
    for (const auto& part : parts) {
      in_model = in_model && m.IsMap() && m[part];
      in_result = in_result && r.IsMap() && r[part];
      if (in_model) m.reset(m[part]);
      if (in_result) r.reset(r[part]);
    }
    CHECK(in_model == (doc.affects == Affects::model));
    CHECK(in_result == (doc.affects != Affects::nothing));
  }
}

TEST_CASE("check_eval_lengths: one rule for lengths, multiples and strides, first offender named",
          "[config]") {
  struct Refusal {
    EvalLengthList list;
    int64_t value;
    EvalLengthProblem problem;
  };
  const auto first_refusal = [](const std::vector<int64_t>& lengths,
                                const std::vector<int64_t>& multiples,
                                const std::vector<int64_t>& strides) -> std::optional<Refusal> {
    try {
      check_eval_lengths(lengths, multiples, strides,
                         [](EvalLengthList list, int64_t value, EvalLengthProblem problem) {
                           throw Refusal{list, value, problem};
                         });
    } catch (const Refusal& refusal) {
      return refusal;
    }
    return std::nullopt;
  };
  CHECK(!first_refusal({64, 128}, {1, 2, 16}, {32}));
  CHECK(!first_refusal({}, {}, {}));
  auto r = first_refusal({64, 0, -5}, {}, {});
  REQUIRE(r);
  CHECK((r->list == EvalLengthList::lengths && r->value == 0 && r->problem == EvalLengthProblem::below_one));
  r = first_refusal({64}, {2, 4, 2}, {});
  REQUIRE(r);
  CHECK((r->list == EvalLengthList::length_multiples && r->value == 2 &&
         r->problem == EvalLengthProblem::listed_twice));
  r = first_refusal({64}, {2}, {16, -1});
  REQUIRE(r);
  CHECK((r->list == EvalLengthList::strides && r->value == -1 && r->problem == EvalLengthProblem::below_one));
  // The same value in two lists is no repetition: 64 tokens and 64 times L are different lengths.
  CHECK(!first_refusal({64}, {64}, {64}));
}
