// YAML and command-line errors say what they should.
#include "core/config.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace extrap;
namespace fs = std::filesystem;

namespace {
std::string write_yaml(const std::string& name, const std::string& text) {
  const auto path = fs::temp_directory_path() / name;
  std::ofstream(path) << text;
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
Run run_cli(const std::string& args) {
  Run r{0, ""};
  FILE* pipe = popen((std::string(EXTRAP_CLI) + " " + args + " 2>&1").c_str(), "r");
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof buffer, pipe)) r.output.append(buffer, n);
  r.status = WEXITSTATUS(pclose(pipe));
  return r;
}
}  // namespace

TEST_CASE("config: values, defaults and --set overrides", "[config]") {
  const auto path = write_yaml("extrap-ok.yaml",
                               "model:\n  layers: 2\n  heads: 4\n  d_model: 64\nposition:\n  name: learned\n"
                               "  max_length: 99\ntrain:\n  seq_len: 32\n");
  Config c = load_config(path, {"train.seq_len=48", "eval.lengths=[1, 2]"});
  REQUIRE(c.model.layers == 2);
  REQUIRE(c.train.seq_len == 48);
  REQUIRE(c.eval.lengths == std::vector<int64_t>{1, 2});
  REQUIRE(c.position_name == "learned");
  REQUIRE(c.position["max_length"].as<int>() == 99);
  REQUIRE(c.model.d_ffn == 1024);  // default
  // to_yaml round-trips.
  Config again = config_from_yaml(c.to_yaml(), "again");
  REQUIRE(YAML::Dump(again.to_yaml()) == YAML::Dump(c.to_yaml()));
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
}

TEST_CASE("command line: wrong usage exits non-zero and says what was wrong", "[cli]") {
  auto r = run_cli("");
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("usage"));
  r = run_cli("trian");
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("unknown command 'trian'"));
  r = run_cli("train");
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("config"));
  r = run_cli("inspect slopes --heads 4 --bogus 1");
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("bogus"));
  r = run_cli("train --help");
  REQUIRE(r.status == 0);
  REQUIRE_THAT(r.output, Catch::Contains("--resume"));
}

TEST_CASE("command line: inspect slopes and bias print exact values", "[cli]") {
  auto r = run_cli("inspect slopes --heads 8");
  REQUIRE(r.status == 0);
  REQUIRE(r.output == "0.5\n0.25\n0.125\n0.0625\n0.03125\n0.015625\n0.0078125\n0.00390625\n");
  r = run_cli("inspect bias --position alibi --heads 2 --length 3");
  REQUIRE(r.status == 0);
  REQUIRE(r.output == "head 0\n0 -inf -inf\n-0.0625 0 -inf\n-0.125 -0.0625 0\n"
                      "head 1\n0 -inf -inf\n-0.00390625 0 -inf\n-0.0078125 -0.00390625 0\n");
  r = run_cli("inspect bias --position nope --heads 2 --length 3");
  REQUIRE(r.status == 2);
  REQUIRE_THAT(r.output, Catch::Contains("unknown position method 'nope'"));
}

TEST_CASE("config: impossible values are refused naming the key and the value", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.d_model=0", "key 'model.d_model' (set on the command line or by a sweep's grid): must be at least 1, got 0"},
      {"model.d_ffn=0", "'model.d_ffn'"},
      {"model.layers=-1", "'model.layers'"},
      {"train.lr=0", "key 'train.lr' (set on the command line or by a sweep's grid): must be a positive number, got 0"},
      {"train.lr=-0.5", "got -0.5"},
      {"train.beta1=1", "key 'train.beta1' (set on the command line or by a sweep's grid): must be in [0, 1), got 1"},
      {"train.beta2=-0.1", "'train.beta2'"},
      {"train.clip=-1", "'train.clip'"},
      {"train.warmup=-3", "'train.warmup'"},
      {"train.eps=0", "'train.eps'"},
      {"train.mask_prob=1", "'train.mask_prob'"},
      {"train.threads=-2", "'train.threads'"},
      {"eval.batch_tokens=0", "'eval.batch_tokens'"},
      {"eval.max_tokens=-1", "'eval.max_tokens'"},
      {"eval.strides=[0]", "'eval.strides'"},
  };
  for (const auto& [assignment, expected] : cases) {
    INFO(assignment);
    CHECK_THAT(error_of([&] { load_config("", {assignment}); }), Catch::Contains(expected));
  }
  CHECK_THAT(error_of([] { load_config("", {"train.lr="}); }),
             Catch::Contains("--set 'train.lr=': no value after '='"));
  // A nested key in a file names its own line.
  const auto path = write_yaml("extrap-nested.yaml", "model:\n  layers: 2\n  d_ffn: 0\ntrain:\n  lr: 0.1\n");
  CHECK_THAT(error_of([&] { load_config(path, {}); }),
             Catch::Contains("extrap-nested.yaml:3: key 'model.d_ffn'"));
}

TEST_CASE("config: each key's mark decides the run fingerprint and what a sweep hash covers",
          "[config]") {
  Config c;
  const YAML::Node model = c.model_keys();
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
  const YAML::Node result = c.result_keys();
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
