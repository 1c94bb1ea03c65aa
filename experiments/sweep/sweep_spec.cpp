#include "experiments/sweep/sweep_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "core/base/files.h"
#include "core/base/hashing.h"
#include "core/eval/evaluator.h"
#include "core/model/model.h"
#include "core/run/checkpoint.h"
#include "core/run/import_run.h"
#include "core/runtime/sysinfo.h"
#include "positions/position.h"

namespace fs = std::filesystem;

namespace extrap {

namespace {

// The leaf keys of the config ("model.heads", ...), which a grid may vary.
const std::set<std::string>& config_leaf_keys() {
  static const std::set<std::string> keys = [] {
    std::set<std::string> all, leaves;
    for (const auto& doc : config_documentation()) all.insert(doc.key);
    for (const auto& key : all) {
      const auto next = all.upper_bound(key);
      if (next == all.end() || next->rfind(key + ".", 0) != 0) leaves.insert(key);
    }
    return leaves;
  }();
  return keys;
}

bool grid_key_known(const std::string& key) {
  // The position section and the layers section's kinds are free-form below their keys; a
  // whole `layers` section is one value too (a point per pattern, kinds and all).
  return key == "position" || key.rfind("position.", 0) == 0 || key == "layers" || key.rfind("layers.kinds.", 0) == 0 ||
         config_leaf_keys().count(key) > 0;
}

// A short label of a grid value for run ids: "alibi", "L64", "seed1", "layers3". `lossless`
// is cleared when the label does not tell the value apart from others of its axis (a method
// with options, a list, characters replaced).
std::string value_label(const std::string& key, const YAML::Node& value, bool& lossless) {
  const std::string last = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
  std::string text;
  if (value.IsScalar()) {
    text = value.Scalar();
  } else if (value.IsMap() && value["name"] && value["name"].IsScalar()) {
    text = value["name"].Scalar();
    lossless = lossless && value.size() == 1;
  } else if (key == "layers" && value.IsMap() && value["pattern"] && value["pattern"].IsSequence()) {
    // The kinds' names over one period, repeats counted ("local3+global"): the names are the
    // sweep author's, two patterns of the same names are refused as one run id.
    const YAML::Node pattern = value["pattern"];
    for (size_t i = 0; i < pattern.size();) {
      size_t j = i;
      while (j < pattern.size() && flow_text(pattern[j]) == flow_text(pattern[i])) ++j;
      text += (text.empty() ? "" : "+") + flow_text(pattern[i]) + (j - i > 1 ? std::to_string(j - i) : "");
      i = j;
    }
  } else {
    text = "v";
    lossless = false;
  }
  std::string label;
  if (key == "position.name" || key == "position" || key == "layers")
    label = text;
  else if (key == "train.seq_len")
    label = "L" + text;
  else if (key == "train.seed")
    label = "seed" + text;
  else
    label = last + text;
  for (char& c : label)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '+') {
      c = '_';
      lossless = false;
    }
  return label;
}

// A YAML value as text with map keys sorted at every level: equal values, equal text.
std::string sorted_text(const YAML::Node& node) {
  if (node.IsMap()) {
    std::map<std::string, std::string> entries;
    for (const auto& entry : node) entries[entry.first.Scalar()] = sorted_text(entry.second);
    std::string text = "{";
    for (const auto& [key, value] : entries) text += key + ": " + value + ", ";
    return text + "}";
  }
  if (node.IsSequence()) {
    std::string text = "[";
    for (const auto& item : node) text += sorted_text(item) + ", ";
    return text + "]";
  }
  return node.IsScalar() ? "'" + node.Scalar() + "'" : "~";
}

EvalPoint eval_point(int64_t length, int64_t stride, std::string mode, RopeScalingKind rope,
                     double rope_factor) {
  EvalPoint e;
  e.length = length;
  e.stride = stride;
  e.mode = std::move(mode);
  e.rope_scaling = rope;
  e.rope_factor = rope_factor;
  return e;
}

}  // namespace

// --- the spec ------------------------------------------------------------------------------

YAML::Node SweepSpec::canonical() const {
  YAML::Node out(YAML::NodeType::Map);
  out["name"] = name;
  // The keys that change results (their marks in core/model/config.cpp); the sweep's own eval section
  // replaces the base's lengths and strides; grid keys are set per point.
  if (!released.empty()) {
    YAML::Node r(YAML::NodeType::Map);
    r["data"] = released_data;
    for (const auto& m : released) {
      YAML::Node config = m.config.result_keys();
      for (const char* key : {"eval.lengths", "eval.strides"}) remove_key(config, key);
      r["models"][m.name]["path"] = m.path;
      r["models"][m.name]["config"] = config;
    }
    out["released"] = r;
  } else {
    YAML::Node base_yaml = base_config.result_keys();
    for (const char* key : {"eval.lengths", "eval.strides"}) remove_key(base_yaml, key);
    for (const auto& axis : grid) remove_key(base_yaml, axis.key);
    out["base"] = base_yaml;
  }
  YAML::Node grid_yaml(YAML::NodeType::Map);
  for (const auto& axis : grid) {
    YAML::Node values(YAML::NodeType::Sequence);
    for (const auto& v : axis.values) values.push_back(v);
    grid_yaml[axis.key] = values;
  }
  out["grid"] = grid_yaml;
  YAML::Node e(YAML::NodeType::Map);
  e["lengths"] = eval.lengths;
  e["length_multiples"] = eval.length_multiples;
  e["strides"] = eval.strides;
  e["nonoverlapping"] = eval.nonoverlapping;
  // Only when asked for, so that the hashes of sweeps without RoPE variants stay as they were.
  if (eval.rope_scaling != std::vector<RopeScalingKind>{RopeScalingKind::none}) {
    YAML::Node variants(YAML::NodeType::Sequence);
    for (auto kind : eval.rope_scaling) variants.push_back(rope_scaling_name(kind));
    e["rope_scaling"] = variants;
  }
  if (eval.rope_factor > 0) e["rope_factor"] = eval.rope_factor;
  if (!eval.streaming.empty()) {  // likewise
    e["streaming"] = eval.streaming;
    e["streaming_sinks"] = eval.streaming_sinks;
  }
  if (eval.longppl.enabled) {  // absent when off: the hash of a sweep before LongPPL
    YAML::Node l(YAML::NodeType::Map);
    l["short_length"] = eval.longppl.short_length;
    l["alpha"] = eval.longppl.alpha;
    l["beta"] = eval.longppl.beta;
    l["reference"] = eval.longppl.reference;
    l["max_tokens"] = eval.longppl.max_tokens;
    e["longppl"] = l;
  }
  if (eval.attention_profile.enabled) {  // absent when off: the hash of a sweep before profiles
    YAML::Node a(YAML::NodeType::Map);
    a["lengths"] = eval.attention_profile.lengths;
    a["length_multiples"] = eval.attention_profile.length_multiples;
    a["windows"] = eval.attention_profile.windows;
    e["attention_profile"] = a;
  }
  if (eval.retrieval.task != RetrievalTask::none) {  // likewise
    YAML::Node r(YAML::NodeType::Map);
    r["task"] = enum_name(eval.retrieval.task);
    r["lengths"] = eval.retrieval.lengths;
    r["length_multiples"] = eval.retrieval.length_multiples;
    r["depths"] = eval.retrieval.depths;
    r["samples"] = eval.retrieval.samples;
    r["seed"] = eval.retrieval.seed;
    e["retrieval"] = r;
  }
  out["eval"] = e;
  return plain_yaml(out);
}

YAML::Node SweepSpec::fresh_base() const {
  YAML::Node file = load_yaml_file(base_file);
  YAML::Node base = base_inline ? file["base"] : file;
  position_as_map(base);
  for (const auto& o : base_overrides) apply_override(base, o);
  return base;
}

std::string SweepSpec::canonical_yaml() const { return YAML::Dump(canonical()) + "\n"; }

std::string SweepSpec::hash() const {
  return hex64(content_hash(canonical_yaml()));
}

SweepHeader SweepSpec::header(const std::string& shard) const {
  SweepHeader h;
  h.sweep_name = name;
  h.sweep_spec = canonical_yaml();
  h.spec_hash = hash();
  h.sweep_file = source_text;
  h.shard = shard;
  h.created = iso_time_now();
  h.spec_time = iso_time_now_micro();
  return h;
}

std::string grid_point_key(const std::vector<std::pair<std::string, YAML::Node>>& values) {
  std::map<std::string, std::string> sorted;
  for (const auto& [key, value] : values) sorted[key] = sorted_text(value);
  std::string text;
  for (const auto& [key, value] : sorted) text += key + "=" + value + "\n";
  return hex64(content_hash(text));
}

std::string grid_point_key(const std::string& grid_yaml) {
  const YAML::Node map = YAML::Load(grid_yaml);
  std::vector<std::pair<std::string, YAML::Node>> values;
  if (map.IsMap())
    for (const auto& entry : map) values.emplace_back(entry.first.Scalar(), entry.second);
  return grid_point_key(values);
}

std::string SweepPoint::grid_yaml() const {
  YAML::Node map(YAML::NodeType::Map);
  for (const auto& [key, value] : values) map[key] = value;
  return yaml_to_string(map);
}

namespace {

// Reads a base given as a path into the document, so that --set base.KEY=... edits it.
void resolve_base(YAML::Node& doc, const std::string& path, SweepSpec& spec) {
  spec.base_file = path;
  spec.base_inline = true;
  if (doc["base"] && doc["base"].IsScalar()) {
    fs::path base_path = doc["base"].Scalar();
    if (!fs::exists(base_path) && base_path.is_relative())
      base_path = fs::path(path).parent_path() / base_path;
    spec.base_file = base_path.string();
    spec.base_inline = false;
    doc["base"] = load_yaml_file(spec.base_file);
  }
  if (doc["base"]) position_as_map(doc["base"]);
}

// Sets a grid axis from --set grid.KEY=[values]: grid keys are dotted themselves, so
// "grid.position.name=[a, b]" sets the axis "position.name".
void set_grid_axis(YAML::Node& doc, const std::string& o) {
  const auto eq = o.find('=');
  if (eq == std::string::npos || eq <= 5)
    throw ConfigError("--set '" + o + "': expected grid.KEY=[values]");
  YAML::Node value;
  try {
    value = without_marks(YAML::Load(o.substr(eq + 1)));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set '" + o + "': value is not valid YAML: " + e.msg);
  }
  if (!value.IsSequence())
    throw ConfigError("--set '" + o + "': a grid axis is a list of values, e.g. " +
                      o.substr(0, eq) + "=[" + o.substr(eq + 1) + "]");
  if (!doc["grid"] || !doc["grid"].IsMap()) doc["grid"] = YAML::Node(YAML::NodeType::Map);
  YAML::Node grid = doc["grid"];
  grid[o.substr(5, eq - 5)] = value;
}

// Routes each --set: base.KEY to the base's overrides (applied to each fresh base) and to the
// document, grid.KEY to a grid axis, anything else (eval, output, ...) to the document.
void apply_sweep_overrides(YAML::Node& doc, const std::string& path,
                           const std::vector<std::string>& overrides, SweepSpec& spec) {
  for (const auto& o : overrides) {
    if (o.rfind("base=", 0) == 0)
      throw ConfigError("--set '" + o + "': set keys of the base (base.train.steps=...), or " +
                        "change base in " + path);
    if (o.rfind("base.", 0) == 0) spec.base_overrides.push_back(o.substr(5));
    spec.source_text += "\n# --set " + o;
    if (o.rfind("grid.", 0) != 0) {
      apply_override(doc, o);
      continue;
    }
    set_grid_axis(doc, o);
  }
}

// Decodes the base config and loads the position plugins it names.
void read_base(const OptionReader& root, YAML::Node& doc, SweepSpec& spec) {
  if (!root.has("base"))
    root.fail("base", "missing: a full config (a map) or the path of a config file");
  YAML::Node base = doc["base"];
  if (!base.IsMap()) {
    root.fail("base", "expected a config (a map) or the path of a config file");
  }
  spec.base_config = config_from_yaml(spec.fresh_base(), spec.base_file);
  for (const auto& plugin : spec.base_config.plugins)
    PositionRegistry::instance().load_plugin(plugin);
}

// Reads released: the corpus, the keys set in every config, and each model's imported config.
void read_released(const OptionReader& root, SweepSpec& spec) {
  for (const char* other : {"base", "grid"})
    if (root.has(other))
      root.fail(other, "is not taken with released: a released sweep's points are its models, nothing is trained");
  const OptionReader r = root.section("released", "");
  r.read("data", spec.released_data, "");
  if (spec.released_data.empty()) r.fail("data", "missing: the corpus every model is evaluated on (a directory)");
  YAML::Node set;
  r.accept("set", "");
  if (r.has("set")) {
    set = r.node()["set"];
    if (!set.IsMap()) r.fail("set", "expected a map of dotted config keys to values");
    for (const auto& entry : set) {
      const std::string key = entry.first.as<std::string>();
      if (!entry.second || entry.second.IsNull())
        r.fail("set", "'" + key + "' has no value (in YAML, a space after the colon: {eval.max_tokens: 2048})");
      if (key.rfind("eval.", 0) != 0 && key != "train.threads" && key != "train.device")
        r.fail("set", "'" + key + "' cannot be set for a released model (eval.* keys, train.threads and "
                      "train.device only: the model is the checkpoint's)");
      spec.released_set.push_back(key + "=" + flow_text(entry.second));
    }
  }
  r.accept("models", "");
  const YAML::Node models = r.node()["models"];
  if (!models || !models.IsMap() || models.size() == 0)
    r.fail("models", "expected a map of names (run ids) to checkpoint folders (or {path, train_length, alibi_bias})");
  r.finish();
  const OptionReader each(models, root.source(), "released.models");
  for (const auto& entry : models) {
    ReleasedModel m;
    m.name = entry.first.as<std::string>();
    const bool plain_name = !m.name.empty() && m.name[0] != '.' &&
                            std::all_of(m.name.begin(), m.name.end(), [](char c) {
                              return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
                            });
    if (!plain_name)
      each.fail(m.name, "is not a run id (letters, digits, '-', '_' and '.'; not starting with '.')");
    if (entry.second.IsScalar()) {
      m.path = entry.second.Scalar();
    } else if (entry.second.IsMap()) {
      const OptionReader one(entry.second, root.source(), "released.models." + m.name);
      one.read("path", m.path, "");
      one.read("train_length", m.options.train_length, "");
      one.read("alibi_bias", m.options.alibi_bias, "");
      one.finish();
      one.at_least("train_length", m.options.train_length, 0, " (0: config.json's)");
    } else {
      each.fail(m.name, "expected a checkpoint folder or a map {path, train_length, alibi_bias}");
    }
    if (m.path.empty()) each.fail(m.name, "names no checkpoint folder (path)");
    // A relative folder is the sweep file's neighbour, as a base config path is.
    fs::path folder = m.path;
    if (folder.is_relative() && !fs::exists(folder)) {
      folder = fs::path(root.source()).parent_path() / folder;
      if (!fs::exists(folder))
        each.fail(m.name, "'" + m.path + "': no such folder in the working directory (" + fs::current_path().string() +
                              ") or beside the sweep file: name a Hugging Face checkpoint folder you have");
    }
    m.path = fs::absolute(folder).lexically_normal().string();
    m.options.data = spec.released_data;
    m.options.set = spec.released_set;
    try {
      m.config = imported_config(m.path, fs::path(spec.run_root.empty() ? "runs" : spec.run_root) / m.name, m.options);
    } catch (const ConfigError& e) {
      each.fail(m.name, e.what());
    }
    spec.released.push_back(std::move(m));
  }
  spec.base_config = spec.released.front().config;
}

// Reads the grid: each axis a known config key with a non-empty list of distinct values.
void read_grid(const OptionReader& root, YAML::Node& doc, const std::string& path,
               SweepSpec& spec) {
  if (!root.has("grid")) return;
  const YAML::Node grid = doc["grid"];
  if (!grid.IsMap()) root.fail("grid", "expected a map of dotted config keys to lists of values");
  const OptionReader grid_reader(grid, path, "grid");
  for (const auto& entry : grid) {
    const std::string key = entry.first.as<std::string>();
    if (!grid_key_known(key))
      grid_reader.fail(key,
                       "unknown config key (grid keys are dotted config keys such as "
                       "position.name, train.seq_len, model.layers; see `extrap keys`)");
    if (!entry.second.IsSequence() || entry.second.size() == 0)
      grid_reader.fail(
          key, "expected a non-empty list of values, got '" + yaml_to_string(entry.second) + "'");
    GridAxis axis;
    axis.key = key;
    std::set<std::string> seen;
    for (const auto& v : entry.second) {
      if (!seen.insert(flow_text(v)).second)
        grid_reader.fail(key, "the value " + flow_text(v) +
                                  " is listed twice: each grid point would run twice");
      axis.values.push_back(YAML::Clone(v));
    }
    spec.grid.push_back(std::move(axis));
  }
  // One axis inside another (position and position.name) would set one key twice, the inner
  // axis overriding the outer one's value in every point it labels.
  for (const auto& outer : spec.grid)
    for (const auto& inner : spec.grid)
      if (inner.key.rfind(outer.key + ".", 0) == 0)
        grid_reader.fail(inner.key, "lies inside the axis '" + outer.key +
                                        "': both would set it, and the points' labels would not say which value ran; "
                                        "keep one of them");
  // The points expand_grid lists, refused above a million (it would run out of memory first).
  if (spec.point_count() > kMostGridPoints)
    root.fail("grid", "more than " + std::to_string(kMostGridPoints) +
                          " points (the axes' sizes multiplied); split the sweep into several");
}

// Checks a given eval.retrieval plan: a task, instance lengths, and depths and samples that
// check_retrieval_spec accepts.
void check_retrieval_plan(const OptionReader& r, const SweepRetrieval& retrieval) {
  if (retrieval.task == RetrievalTask::none)
    r.fail("task", "is none: name the task (passkey, multikey, variable_tracking) or drop eval.retrieval");
  if (retrieval.lengths.empty() && retrieval.length_multiples.empty())
    r.fail("length_multiples", "no instance lengths (lengths and length_multiples are both "
                               "empty)");
  check_eval_lengths(r, retrieval.lengths, retrieval.length_multiples, {});
  RetrievalSpec check;
  check.task = retrieval.task;
  check.depths = retrieval.depths;
  check.samples = retrieval.samples;
  try {
    check_retrieval_spec(check);
  } catch (const ConfigError& error) {
    r.fail(retrieval.samples < 1 ? "samples" : "depths", error.what());
  }
}

// `key: false` (or true) is short for `key: {enabled: false}`: whether e's `key` is such a
// scalar (then read into `enabled`); another scalar is refused naming the key.
bool read_switch(const OptionReader& e, const char* key, bool& enabled) {
  if (!e.decoding() || !e.has(key) || !e.node()[key].IsScalar()) return false;
  const YAML::Node value = e.node()[key];
  if (!YAML::convert<bool>::decode(value, enabled))
    e.fail(key, "expected true, false or a map of key: value, got '" + value.Scalar() + "'");
  e.accept(key, "");
  return true;
}

// Reads eval.longppl; a reference run is checked (a causal model with a checkpoint) and its
// training length and data section kept for expand_grid.
void read_longppl(const OptionReader& e, SweepLongPpl& longppl) {
  if (read_switch(e, "longppl", longppl.enabled)) return;
  auto r = e.section("longppl",
                     "LongPPL (core/eval/longppl.h) beside perplexity in each non-overlapping "
                     "evaluation of a causal point past K (docs/evaluation.md)");
  r.read("enabled", longppl.enabled, "score LongPPL (the short evaluation reads K tokens a target)");
  r.read("short_length", longppl.short_length,
         "K, the short context (0: the key-token model's train.seq_len)");
  r.read("alpha", longppl.alpha, "a key token's log-probability gain over the short context, nats");
  r.read("beta", longppl.beta, "the floor on a key token's long log-probability, nats");
  r.read("reference", longppl.reference,
         "a run directory whose model selects the key tokens of every point (\"\": each point's own)");
  r.read("max_tokens", longppl.max_tokens,
         "key tokens among the targets of the first N tokens of the evaluated stream (0: all)");
  r.finish();
  if (!r.decoding()) return;
  r.at_least("short_length", longppl.short_length, 0, " (0: the key-token model's train.seq_len)");
  r.at_least("max_tokens", longppl.max_tokens, 0, " (0: all)");
  if (longppl.reference.empty()) return;
  if (!longppl.enabled) r.fail("reference", "is set but eval.longppl.enabled is false");
  VerifiedCheckpoint checkpoint;
  try {
    checkpoint = require_checkpoint(longppl.reference);
  } catch (const ConfigError& error) {
    r.fail("reference", one_line(error.what()));
  }
  if (!checkpoint.config.model.causal())
    r.fail("reference", longppl.reference + " is a masked LM; LongPPL's key tokens need a causal model");
  longppl.reference_length = checkpoint.config.train.seq_len;
  longppl.reference_data = checkpoint.config.model_keys()["data"];  // the keys that change tokens
}

// Reads eval.attention_profile.
void read_attention_profile(const OptionReader& e, SweepAttentionProfile& profile) {
  if (read_switch(e, "attention_profile", profile.enabled)) return;
  auto r = e.section("attention_profile",
                     "where each model looks: attention mass and entropy by query-key distance, "
                     "per layer and head (core/eval/attention_profile.h, docs/evaluation.md)");
  r.read("enabled", profile.enabled, "profile every point");
  r.read("lengths", profile.lengths,
         "absolute window lengths (with length_multiples empty: each point's train.seq_len and "
         "its longest evaluation length)");
  r.read("length_multiples", profile.length_multiples, "window lengths as multiples of train.seq_len");
  r.read("windows", profile.windows, "windows averaged over, from the start of the evaluated split");
  r.finish();
  if (!r.decoding()) return;
  check_eval_lengths(r, profile.lengths, profile.length_multiples, {});
  r.at_least("windows", profile.windows, 1);
}

// Reads eval.retrieval, checked only when the file (or a --set) gives it.
void read_retrieval(const OptionReader& e, SweepRetrieval& retrieval) {
  auto r = e.section("retrieval", "exact-match retrieval by length and depth (causal points)");
  r.read("task", retrieval.task, "the task: passkey or multikey (core/data/retrieval_task.h)");
  r.read("lengths", retrieval.lengths, "absolute instance lengths");
  r.read("length_multiples", retrieval.length_multiples,
         "instance lengths as multiples of train.seq_len");
  r.read("depths", retrieval.depths, "depths of the key, percent of the filler");
  r.read("samples", retrieval.samples, "instances per (length, depth)");
  r.read("seed", retrieval.seed, "instance seed (the same instances for every point)");
  r.finish();
  // e shares the reader's mode with the root: true while loading a sweep file.
  if (e.decoding() && e.has("retrieval")) check_retrieval_plan(r, retrieval);
}

// Parses eval.rope_scaling, when given, into distinct RoPE-scaling variants.
void read_rope_variants(const OptionReader& e, const std::vector<std::string>& rope_names,
                         SweepEval& eval) {
  if (!e.has("rope_scaling")) return;
  if (rope_names.empty()) e.fail("rope_scaling", "is empty: list at least none");
  try {
    eval.rope_scaling = parse_rope_variants(rope_names, "");
  } catch (const ConfigError& error) {
    e.fail("rope_scaling", error.what());
  }
}

// Fills the lengths and strides the eval section leaves out from the base config, and checks
// that the evaluation plan is valid and not empty.
void check_eval_plan(const OptionReader& e, SweepSpec& spec) {
  if (e.has("rope_factor")) e.at_least("rope_factor", spec.eval.rope_factor, 1.0);
  if (e.has("rope_factor") &&
      spec.eval.rope_scaling == std::vector<RopeScalingKind>{RopeScalingKind::none})
    e.fail("rope_factor", "is set but eval.rope_scaling lists no variant to scale");
  if (!e.has("lengths") && !e.has("length_multiples") && !spec.released.empty())
    spec.eval.length_multiples = {1, 2, 4};  // the models' training lengths differ
  else if (!e.has("lengths") && !e.has("length_multiples"))
    spec.eval.lengths = spec.base_config.eval.lengths;
  if (!e.has("strides")) spec.eval.strides = spec.base_config.eval.strides;
  check_eval_lengths(e, spec.eval.lengths, spec.eval.length_multiples, spec.eval.strides);
  if (!spec.eval.nonoverlapping && spec.eval.strides.empty())
    e.fail("nonoverlapping", "false, and no strides: nothing would be evaluated");
  if (spec.eval.lengths.empty() && spec.eval.length_multiples.empty())
    e.fail(e.has("lengths") ? "lengths" : "length_multiples",
           "no evaluation lengths (lengths and length_multiples are both empty): nothing would "
           "be evaluated");
}

// Reads the eval section: the sweep's own lengths/strides, else the base config's.
void read_eval(const OptionReader& root, SweepSpec& spec) {
  auto e = root.section("eval", "evaluation of every grid point");
  e.read("lengths", spec.eval.lengths, "absolute evaluation lengths");
  e.read("length_multiples", spec.eval.length_multiples,
         "evaluation lengths as multiples of train.seq_len");
  e.read("strides", spec.eval.strides, "sliding-window strides (each used at lengths above it)");
  e.read("nonoverlapping", spec.eval.nonoverlapping, "evaluate non-overlapping windows too");
  std::vector<std::string> rope_names;
  e.read("rope_scaling", rope_names,
         "RoPE-scaling variants for points whose method has rotary angles: none, linear, ntk, "
         "dynamic, yarn (as Hugging Face), yarn_paper, llama3, self_extend");
  e.read("rope_factor", spec.eval.rope_factor,
         "RoPE scaling factor s (default: each evaluation length / train.seq_len)");
  read_retrieval(e, spec.eval.retrieval);
  read_longppl(e, spec.eval.longppl);
  read_attention_profile(e, spec.eval.attention_profile);
  e.read("streaming", spec.eval.streaming,
         "StreamingLLM cache sizes W: each length above W is also read as streams through a "
         "cache of W tokens at cache slots (causal points; docs/evaluation.md)");
  e.read("streaming_sinks", spec.eval.streaming_sinks, "StreamingLLM: attention sinks kept in the cache");
  e.finish();
  if (!e.decoding()) return;  // listing the keys
  read_rope_variants(e, rope_names, spec.eval);
  check_eval_plan(e, spec);
  if (e.has("streaming_sinks") && spec.eval.streaming.empty())
    e.fail("streaming_sinks", "is set but eval.streaming lists no cache size");
  e.at_least("streaming_sinks", spec.eval.streaming_sinks, 0);
  for (const int64_t cache : spec.eval.streaming)
    if (cache <= spec.eval.streaming_sinks)
      e.fail("streaming", "cache size " + std::to_string(cache) + " must hold more than the " +
                              std::to_string(spec.eval.streaming_sinks) + " sinks (eval.streaming_sinks)");
}

// Reads the output section: where results and runs go (defaults filled in by load_sweep).
void read_output(const OptionReader& root, SweepSpec& spec) {
  auto o = root.section("output", "where results and runs go");
  o.read("path", spec.output, "results file (default results/NAME.h5)");
  o.read("run_root", spec.run_root,
         "run directories (default runs/NAME); each point in RUN_ROOT/<run id>");
  o.finish();
}

// The keys of a sweep file, read (or, from a documenter, listed) in order.
void read_sweep_keys(const OptionReader& root, YAML::Node& doc, SweepSpec& spec) {
  root.read("name", spec.name, "sweep name (default: the file's name)");
  // It names results/NAME.h5 and runs/NAME: a name, not a path that leads elsewhere.
  if (root.has("name") && (spec.name.empty() || spec.name[0] == '.' || spec.name.find('/') != std::string::npos))
    root.fail("name", "'" + spec.name + "' is not a file name (no '/', not empty, not starting with '.'); "
                      "output.path and output.run_root place the results elsewhere");
  root.accept("base", "the base config: a full `extrap train` config, or the path of one");
  root.accept("grid", "dotted config keys -> lists of values; every combination is a run "
                      "(grid.position: a list of methods, each a name or {name: ..., options})");
  root.accept("released",
              "instead of base and grid: released checkpoints evaluated with nothing trained: data (the "
              "corpus), set (eval.* keys, train.threads, train.device), models (run id -> Hugging Face "
              "checkpoint folder, or {path, train_length, alibi_bias}); docs/released.md");
  if (root.decoding() && root.has("released")) {
    read_released(root, spec);
  } else if (root.decoding()) {
    read_base(root, doc, spec);
    read_grid(root, doc, root.source(), spec);
  }
  read_eval(root, spec);
  root.read("jobs", spec.jobs,
            "grid points run at once, each in its own process (not part of the spec)");
  root.at_least("jobs", spec.jobs, 1);
  read_output(root, spec);
}

}  // namespace

std::vector<OptionDoc> sweep_documentation() {
  SweepSpec spec;
  const OptionReader root = OptionReader::documenter();
  YAML::Node none;
  read_sweep_keys(root, none, spec);
  return root.docs();
}

SweepSpec load_sweep(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node doc = load_yaml_file(path);
  if (!doc.IsMap())
    throw ConfigError(path + ": a sweep file is a map with base, grid, eval and output");
  SweepSpec spec;
  spec.source = path;
  spec.source_text = read_file(path);
  resolve_base(doc, path, spec);
  apply_sweep_overrides(doc, path, overrides, spec);

  OptionReader root(doc, path);
  spec.name = fs::path(path).stem().string();
  read_sweep_keys(root, doc, spec);
  spec.overrides = overrides;
  root.finish();
  if (spec.output.empty()) spec.output = "results/" + spec.name + ".h5";
  if (spec.run_root.empty()) spec.run_root = "runs/" + spec.name;
  return spec;
}

std::string SweepSpec::worker_identity() const {
  return hex64(ContentHasher().add_field(canonical_yaml()).add_field(run_root).digest());
}

int64_t SweepSpec::point_count() const {
  if (!released.empty()) return int64_t(released.size());
  int64_t total = 1;
  for (const auto& axis : grid) {
    total *= int64_t(axis.values.size());
    if (total > kMostGridPoints) return kMostGridPoints + 1;  // no product past 64 bits
  }
  return total;
}

namespace {

// Released point `index`: the model's name is its run id and its one grid value; its config is
// the import's, in RUN_ROOT/<name>.
SweepPoint released_point(const SweepSpec& spec, int64_t index) {
  const ReleasedModel& m = spec.released[size_t(index)];
  SweepPoint point;
  point.index = index;
  point.values.push_back({"released", YAML::Node(m.name)});
  point.key = grid_point_key(point.values);
  point.id = m.name;
  point.config = m.config;
  point.config.train.out_dir = (fs::path(spec.run_root) / point.id).string();
  return point;
}

// Grid point `index`: its values (mixed-radix digits of the index, the last axis varying
// fastest), its identity and run id, and its config decoded from the base with the values set.
SweepPoint grid_point(const SweepSpec& spec, int64_t index) {
  SweepPoint point;
  point.index = index;
  std::vector<size_t> digit(spec.grid.size());
  int64_t rest = index;
  for (size_t a = spec.grid.size(); a-- > 0;) {
    digit[a] = size_t(rest % int64_t(spec.grid[a].values.size()));
    rest /= int64_t(spec.grid[a].values.size());
  }
  YAML::Node root = spec.fresh_base();  // not a YAML::Clone: errors keep their file lines
  std::string labels;
  bool lossless = true;
  for (size_t a = 0; a < spec.grid.size(); ++a) {
    const YAML::Node& value = spec.grid[a].values[digit[a]];
    point.values.push_back({spec.grid[a].key, value});
    apply_override(root, spec.grid[a].key + "=" + yaml_to_string(value));
    labels += (labels.empty() ? "" : "-") + value_label(spec.grid[a].key, value, lossless);
  }
  // The id names the point by its grid values, not its place in the grid, so that values
  // added to an axis later leave every other point's id (and run directory) as it was.
  point.key = grid_point_key(point.values);
  if (labels.empty() && !spec.base_config.layer_pattern.empty())
    for (const auto& kind : spec.base_config.layer_pattern) labels += (labels.empty() ? "layers-" : "-") + kind;
  if (labels.empty()) labels = spec.base_config.position_name;
  if (!lossless || labels.size() > 100) labels = labels.substr(0, 100) + "-h" + point.key.substr(0, 8);
  point.id = labels;
  point.config = config_from_yaml(root, spec.source + " (grid point " + point.id + ")");
  check_position_method(point.config);  // a typo in its options fails before anything runs
  point.config.train.out_dir = (fs::path(spec.run_root) / point.id).string();
  return point;
}

// The RoPE variants a point is evaluated under: the sweep's where its method has rotary angles.
std::vector<RopeScalingKind> point_variants(const SweepSpec& spec, const SweepPoint& point) {
  return has_rotary_angles(point.config) ? spec.eval.rope_scaling : std::vector<RopeScalingKind>{RopeScalingKind::none};
}

// The point's window evaluations: each length non-overlapping and at each stride below it
// (each under every RoPE variant, LongPPL where it is scored), and StreamingLLM's caches below
// it. Returns the lengths.
std::set<int64_t> add_window_evals(const SweepSpec& spec, SweepPoint& point) {
  std::set<int64_t> lengths(spec.eval.lengths.begin(), spec.eval.lengths.end());
  for (auto m : spec.eval.length_multiples)
    lengths.insert(length_of_multiple(m, point.config.train.seq_len, spec.source, "eval.length_multiples"));
  const std::set<int64_t> strides(spec.eval.strides.begin(), spec.eval.strides.end());
  const std::vector<RopeScalingKind> variants = point_variants(spec, point);
  const SweepLongPpl& longppl = spec.eval.longppl;
  const int64_t short_length = longppl.short_for(point.config.train.seq_len);
  const bool scores_longppl = longppl.enabled && point.config.model.causal();
  if (scores_longppl && !longppl.reference.empty() &&
      yaml_to_string(longppl.reference_data) != yaml_to_string(point.config.model_keys()["data"]))
    throw ConfigError(spec.source + ": eval.longppl.reference " + longppl.reference +
                      " reads other data than grid point " + point.id +
                      " (its data section differs): key tokens are positions in one token stream");
  const auto add = [&](int64_t length, int64_t stride) {
    for (auto kind : variants) {
      EvalPoint e = eval_point(length, stride,
                               eval_mode_name(length, stride, rope_variant_label(kind, spec.eval.rope_factor)),
                               kind, spec.eval.rope_factor);
      e.longppl = scores_longppl && stride == 0 && length > short_length;
      e.longppl_short = e.longppl ? short_length : 0;
      point.evals.push_back(e);
    }
  };
  for (int64_t length : lengths) {
    if (spec.eval.nonoverlapping) add(length, 0);
    for (int64_t stride : strides)
      if (stride < length) add(length, stride);
    // A cache that holds the whole window evicts nothing: the non-overlapping evaluation.
    if (point.config.model.causal())
      for (int64_t cache : std::set<int64_t>(spec.eval.streaming.begin(), spec.eval.streaming.end()))
        if (cache < length) {
          EvalPoint e = eval_point(length, 0, streaming_mode_name(spec.eval.streaming_sinks, cache),
                                   RopeScalingKind::none, 0);
          e.streaming = {spec.eval.streaming_sinks, cache};
          point.evals.push_back(e);
        }
  }
  if (point.evals.empty())
    throw ConfigError(spec.source + ": eval: grid point " + point.id +
                      " has nothing to evaluate: eval.nonoverlapping is false and no stride is "
                      "below any of its evaluation lengths (a stride is used at lengths above it)");
  return lengths;
}

// A causal point's retrieval evaluations: each instance length under each RoPE variant.
void add_retrieval_evals(const SweepSpec& spec, SweepPoint& point) {
  const SweepRetrieval& retrieval = spec.eval.retrieval;
  if (retrieval.task == RetrievalTask::none || !point.config.model.causal()) return;
  std::set<int64_t> instance_sizes(retrieval.lengths.begin(), retrieval.lengths.end());
  for (auto m : retrieval.length_multiples)
    instance_sizes.insert(
        length_of_multiple(m, point.config.train.seq_len, spec.source, "eval.retrieval.length_multiples"));
  for (int64_t length : instance_sizes)
    for (auto kind : point_variants(spec, point)) {
      EvalPoint e = eval_point(length, 0,
                               retrieval_mode_name(retrieval.task, rope_variant_label(kind, spec.eval.rope_factor)),
                               kind, spec.eval.rope_factor);
      e.retrieval = true;
      e.retrieval_spec.task = retrieval.task;
      e.retrieval_spec.length = length;
      e.retrieval_spec.depths = retrieval.depths;
      e.retrieval_spec.samples = retrieval.samples;
      e.retrieval_spec.seed = retrieval.seed;
      e.retrieval_spec.batch_tokens = point.config.eval.batch_tokens;
      point.evals.push_back(e);
    }
}

// The point's attention profiles, at the profile lengths (by default L and its longest length).
void add_profile_evals(const SweepSpec& spec, SweepPoint& point, int64_t longest) {
  const SweepAttentionProfile& profile = spec.eval.attention_profile;
  if (!profile.enabled) return;
  for (int64_t length : profile.lengths_for(point.config.train.seq_len, longest, spec.source)) {
    EvalPoint e = eval_point(length, 0, kProfileMode, RopeScalingKind::none, 0);
    e.profile = true;
    e.profile_windows = profile.windows;
    point.evals.push_back(e);
  }
}

// The evaluation plan's options that no point takes are said, not silently left out: a K the
// user chose (or a reference's L) above every non-overlapping length, retrieval with no causal
// point, RoPE variants with no point of rotary angles.
void refuse_unused_options(const SweepSpec& spec, const std::vector<SweepPoint>& points) {
  const SweepLongPpl& longppl = spec.eval.longppl;
  const bool longppl_chosen = longppl.enabled && (longppl.short_length > 0 || !longppl.reference.empty());
  const auto scores = [](const SweepPoint& p) {
    return std::any_of(p.evals.begin(), p.evals.end(), [](const EvalPoint& e) { return e.longppl; });
  };
  const auto causal = [](const SweepPoint& p) { return p.config.model.causal(); };
  const bool causal_windows = spec.eval.nonoverlapping && std::any_of(points.begin(), points.end(), causal);
  if (longppl_chosen && causal_windows && std::none_of(points.begin(), points.end(), scores))
    throw ConfigError(spec.source + ": eval.longppl." +
                      (longppl.short_length > 0 ? "short_length " + std::to_string(longppl.short_length)
                                                : "reference " + longppl.reference + " (trained at " +
                                                      std::to_string(longppl.reference_length) + ")") +
                      ": K is not below any evaluation length of a causal point, so no point would "
                      "score LongPPL (give a smaller K or longer eval lengths)");
  if (spec.eval.retrieval.task != RetrievalTask::none && std::none_of(points.begin(), points.end(), causal))
    throw ConfigError(spec.source + ": eval.retrieval asks for a retrieval task, but every grid "
                      "point is a masked LM (the answer is generated by a causal model)");
  const bool variants_asked = std::any_of(spec.eval.rope_scaling.begin(), spec.eval.rope_scaling.end(),
                                          [](RopeScalingKind k) { return k != RopeScalingKind::none; });
  const auto scalable = [](const SweepPoint& p) { return has_rotary_angles(p.config); };
  if (variants_asked && std::none_of(points.begin(), points.end(), scalable))
    throw ConfigError(spec.source + ": eval.rope_scaling asks for RoPE variants, but no grid point "
                      "uses a method with rotary angles (rotary, xpos)");
}

}  // namespace

std::vector<SweepPoint> expand_grid(const SweepSpec& spec) {
  std::vector<SweepPoint> points;
  std::set<std::string> ids;
  std::map<std::string, std::string> id_of_config;  // each point's resolved config, for twins
  const int64_t total = spec.point_count();
  for (int64_t index = 0; index < total; ++index) {
    SweepPoint point = spec.released.empty() ? grid_point(spec, index) : released_point(spec, index);
    if (!ids.insert(point.id).second)
      throw ConfigError(spec.source + ": two grid points would have the run id " + point.id +
                        "; give the values distinct names");
    // Values spelt differently (seed 1 and 01, lr 0.001 and 1e-3) resolve to one config: such
    // points would train one model twice and a report would pool them as seeds.
    Config without_run_dir = point.config;
    without_run_dir.train.out_dir.clear();
    const auto [twin, fresh] = id_of_config.emplace(YAML::Dump(without_run_dir.to_yaml()), point.id);
    if (!fresh)
      throw ConfigError(spec.source + ": grid points " + twin->second + " and " + point.id +
                        " resolve to the same config (values that differ only in how they are written); "
                        "list each value once");
    const std::set<int64_t> lengths = add_window_evals(spec, point);
    add_retrieval_evals(spec, point);
    add_profile_evals(spec, point, *lengths.rbegin());
    points.push_back(std::move(point));
  }
  refuse_unused_options(spec, points);
  return points;
}

int64_t length_of_multiple(int64_t multiple, int64_t train_length, const std::string& source, const std::string& key) {
  int64_t length = 0;
  if (__builtin_mul_overflow(multiple, train_length, &length))
    throw ConfigError(source + ": " + key + ": " + std::to_string(multiple) + " x train.seq_len " +
                      std::to_string(train_length) + " is past a 64-bit token count");
  return length;
}

std::set<int64_t> SweepAttentionProfile::lengths_for(int64_t train_length, int64_t longest,
                                                     const std::string& source) const {
  std::set<int64_t> out(lengths.begin(), lengths.end());
  for (int64_t m : length_multiples)
    out.insert(length_of_multiple(m, train_length, source, "eval.attention_profile.length_multiples"));
  if (out.empty()) out = {train_length, longest};
  return out;
}

// --- shards, differences -------------------------------------------------------------------

std::string Shard::text() const {
  return whole() ? "" : std::to_string(index) + "/" + std::to_string(count);
}

Shard parse_shard(const std::string& text) {
  Shard shard;
  const auto slash = text.find('/');
  try {
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    size_t used = 0;
    shard.index = std::stoll(text.substr(0, slash), &used);
    if (used != slash) throw std::invalid_argument("index");
    shard.count = std::stoll(text.substr(slash + 1), &used);
    if (used != text.size() - slash - 1) throw std::invalid_argument("count");
  } catch (const std::exception&) {
    throw ConfigError("--shard '" + text + "': expected I/N, e.g. 0/4");
  }
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count)
    throw ConfigError("--shard '" + text + "': need 0 <= I < N");
  return shard;
}

std::string shard_output(const std::string& output, const Shard& shard) {
  if (shard.whole()) return output;
  const fs::path base = output;
  const std::string name = base.stem().string() + ".shard-" + std::to_string(shard.index) + "-of-" +
                           std::to_string(shard.count) + base.extension().string();
  return (base.parent_path() / name).string();
}

std::string describe_difference(const SweepHeader& first, const std::string& first_label,
                                const SweepHeader& second, const std::string& second_label) {
  if (first.spec_hash == second.spec_hash) return "";
  std::string text = "spec hash " + first.spec_hash + " in " + first_label + ", " +
                     second.spec_hash + " in " + second_label;
  try {
    if (auto d = first_difference(YAML::Load(first.sweep_spec), YAML::Load(second.sweep_spec)))
      text += "; first difference at '" + d->key + "': " + d->first + " in " + first_label + ", " +
              d->second + " in " + second_label;
  } catch (const YAML::Exception&) {
    // an unreadable stored spec: the hashes alone say it
  }
  return text;
}

namespace {

// What must stay for a sweep to grow: the spec without its grid values and the lists a sweep
// may grow (sweep_growth_difference).
YAML::Node growth_identity(const std::string& sweep_spec) {
  YAML::Node spec = YAML::Load(sweep_spec);
  YAML::Node out(YAML::NodeType::Map);
  out["name"] = spec["name"];
  // The grid keys before the base: a new axis takes its key out of the base, and the grid is
  // what changed.
  std::set<std::string> keys;
  if (spec["grid"] && spec["grid"].IsMap())
    for (const auto& axis : spec["grid"]) keys.insert(axis.first.Scalar());
  YAML::Node grid_keys(YAML::NodeType::Sequence);
  for (const auto& key : keys) grid_keys.push_back(key);
  out["grid keys"] = grid_keys;
  out["base"] = spec["base"];
  // A released sweep grows by its models; the corpus stays (each model's config is checked
  // against its run directory).
  if (spec["released"]) out["released data"] = spec["released"]["data"];
  YAML::Node eval(YAML::NodeType::Map);
  if (const YAML::Node e = spec["eval"]) {
    if (e["rope_factor"]) eval["rope_factor"] = e["rope_factor"];
    if (const YAML::Node r = e["retrieval"])
      for (const char* key : {"task", "depths", "samples", "seed"}) eval["retrieval"][key] = r[key];
    if (e["longppl"]) eval["longppl"] = e["longppl"];
    if (e["attention_profile"]) eval["attention_profile"]["windows"] = e["attention_profile"]["windows"];
  }
  out["eval"] = eval;
  return out;
}

}  // namespace

std::string sweep_growth_difference(const SweepHeader& recorded, const std::string& recorded_label,
                                    const SweepHeader& current, const std::string& current_label) {
  if (recorded.spec_hash == current.spec_hash) return "";
  try {
    const YAML::Node before = growth_identity(recorded.sweep_spec);
    YAML::Node after = growth_identity(current.sweep_spec);
    // A file without LongPPL (extrap 0.11 and before, or eval.longppl.enabled false) takes it for
    // the points still to come; once recorded, its settings stay.
    if (!before["eval"]["longppl"]) after["eval"].remove("longppl");
    if (!before["eval"]["attention_profile"]) after["eval"].remove("attention_profile");  // likewise
    const auto d = first_difference(before, after);
    if (!d) return "";
    return "first difference at '" + d->key + "': " + d->first + " in " + recorded_label + ", " +
           d->second + " in " + current_label +
           " (a sweep grows by the values of its grid axes and its evaluation lengths and modes; "
           "its base config, grid keys, retrieval, LongPPL and attention-profile windows stay)";
  } catch (const YAML::Exception&) {
    return describe_difference(recorded, recorded_label, current, current_label);
  }
}

}  // namespace extrap
