#include "experiments/sweep.h"

#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "core/evaluator.h"
#include "core/sysinfo.h"
#include "core/trainer.h"
#include "positions/position.h"

namespace fs = std::filesystem;

namespace extrap {

namespace {

// --- spec helpers --------------------------------------------------------------------------

// A copy of `node` with every collection in block style, so that the spec text (and its hash)
// does not depend on how the sweep file happened to write a list.
YAML::Node plain(const YAML::Node& node) {
  if (node.IsMap()) {
    YAML::Node out(YAML::NodeType::Map);
    for (const auto& entry : node) out[entry.first.Scalar()] = plain(entry.second);
    return out;
  }
  if (node.IsSequence()) {
    YAML::Node out(YAML::NodeType::Sequence);
    for (const auto& item : node) out.push_back(plain(item));
    return out;
  }
  if (node.IsScalar()) return YAML::Node(node.Scalar());
  return YAML::Node();
}

void remove_path(YAML::Node root, const std::string& dotted) {
  std::vector<std::string> parts;
  std::istringstream in(dotted);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  YAML::Node cursor;
  cursor.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!cursor.IsMap() || !cursor[parts[i]]) return;
    YAML::Node next = cursor[parts[i]];
    cursor.reset(next);
  }
  if (cursor.IsMap()) cursor.remove(parts.back());
}

// One-line YAML of a node, whatever styles its collections were read with.
std::string flow_text(const YAML::Node& node) {
  YAML::Node copy = YAML::Clone(node);
  std::function<void(YAML::Node)> flow = [&](YAML::Node n) {
    if (n.IsMap() || n.IsSequence()) n.SetStyle(YAML::EmitterStyle::Flow);
    if (n.IsMap())
      for (auto entry : n) flow(entry.second);
    if (n.IsSequence())
      for (auto item : n) flow(item);
  };
  flow(copy);
  return yaml_to_string(copy);
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

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
  return key == "position" || key.rfind("position.", 0) == 0 || config_leaf_keys().count(key) > 0;
}

// A short label of a grid value for run ids: "alibi", "L64", "seed1", "layers3".
std::string value_label(const std::string& key, const YAML::Node& value, size_t index) {
  const std::string last = key.substr(key.rfind('.') == std::string::npos ? 0 : key.rfind('.') + 1);
  std::string text;
  if (value.IsScalar())
    text = value.Scalar();
  else if (value.IsMap() && value["name"] && value["name"].IsScalar())
    text = value["name"].Scalar();
  else
    text = "v" + std::to_string(index);
  std::string label;
  if (key == "position.name" || key == "position")
    label = text;
  else if (key == "train.seq_len")
    label = "L" + text;
  else if (key == "train.seed")
    label = "seed" + text;
  else
    label = last + text;
  for (char& c : label)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '+' &&
        c != '-')
      c = '_';
  return label;
}

// Builds the position method once, so that a typo in its options fails before anything runs.
// A method that does not support the objective's attention mode is left to fail (and be
// recorded) when its point runs.
void check_position(const Config& config) {
  const PositionInfo& info = PositionRegistry::instance().get(config.position_name);
  const unsigned mode = config.model.causal() ? kCausal : kBidirectional;
  if (!(info.modes & mode)) return;
  PositionContext context;
  context.num_layers = config.model.layers;
  context.num_heads = config.model.heads;
  context.d_model = config.model.d_model;
  context.d_head = config.model.d_model / config.model.heads;
  context.causal = config.model.causal();
  PositionRegistry::instance().create(config.position_name, context,
                                      OptionReader(config.position, config.source, "position"));
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  char buffer[32];
  const int64_t s = int64_t(seconds + 0.5);
  if (s >= 3600)
    std::snprintf(buffer, sizeof buffer, "%" PRId64 "h%02dm", s / 3600, int(s / 60 % 60));
  else
    std::snprintf(buffer, sizeof buffer, "%dm%02ds", int(s / 60), int(s % 60));
  return buffer;
}

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

// Tokens trained per optimiser step (as the trainer computes them).
int64_t tokens_per_step(const TrainConfig& t) {
  const int64_t sequences = std::max<int64_t>(t.accumulation, t.batch_tokens / t.seq_len);
  return sequences / t.accumulation * t.accumulation * t.seq_len;
}

// Resets the kernel's peak-RSS mark (VmHWM), so that each run's peak is its own.
void reset_peak_memory() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
}

// --- the progress display ------------------------------------------------------------------

// On a terminal: one status line redrawn in place (run k of n, step, loss, tokens/s, sweep
// ETA) with finished evaluations printed above it. Elsewhere: plain log lines.
class SweepDisplay {
 public:
  // `worker`: "K/N" when this process runs point K of N for a parallel sweep; it then writes
  // log lines only (the terminal is shared) and its ETA is that of its own run.
  SweepDisplay(std::string name, int64_t runs, bool enabled, std::string worker)
      : name_(std::move(name)),
        runs_(runs),
        worker_(std::move(worker)),
        enabled_(enabled),
        terminal_(enabled && worker_.empty() && stderr_is_terminal()) {}

  // `remaining_tokens`: training tokens of the runs after this one.
  void start_run(int64_t ordinal, const std::string& id, int64_t remaining_tokens) {
    ordinal_ = ordinal;
    id_ = id;
    later_tokens_ = remaining_tokens;
    run_started_ = now();
  }

  void training(const TrainProgress& p, int64_t tokens_per_step) {
    if (!enabled_) return;
    const double remaining =
        double(p.total_steps - p.step) * double(tokens_per_step) + double(later_tokens_);
    // Wall time per pure-training second: validation, evaluation and saving on top of it.
    const double overhead = trained_seconds_ > 0 ? wall_seconds_ / trained_seconds_ : 1.3;
    const double eta = p.tokens_per_second > 0 ? remaining / p.tokens_per_second * overhead : NAN;
    char text[256];
    std::snprintf(text, sizeof text,
                  "step %" PRId64 "/%" PRId64 "  loss %.4f  %.0f tok/s  %s ETA %s", p.step,
                  p.total_steps, p.loss, p.tokens_per_second, worker_.empty() ? "sweep" : "run",
                  format_duration(eta).c_str());
    if (terminal_) {
      const double t = now();
      if (t - last_draw_ < 0.2 && p.step != p.total_steps) return;
      last_draw_ = t;
      std::string line = prefix() + "  " + text;
      const size_t width = terminal_width();
      if (line.size() >= width) line.resize(width - 1);
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      std::fflush(stderr);
    } else {
      std::fprintf(stderr, "%s: %s\n", prefix().c_str(), text);
    }
  }

  // Training finished after `train_seconds` of pure training (tokens / tokens-per-second).
  void trained(double train_seconds) { run_train_seconds_ = train_seconds; }

  void finish_run() {
    wall_seconds_ += now() - run_started_;
    trained_seconds_ += run_train_seconds_;
    run_train_seconds_ = 0;
  }

  void line(const std::string& text) {
    if (!enabled_) return;
    if (terminal_) std::fputs("\r\033[K", stderr);
    std::fprintf(stderr, "%s: %s\n", prefix().c_str(), text.c_str());
    std::fflush(stderr);
  }

 private:
  static double now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  static size_t terminal_width() {
    winsize size{};
    if (ioctl(fileno(stderr), TIOCGWINSZ, &size) == 0 && size.ws_col > 20) return size.ws_col;
    return 120;
  }
  std::string prefix() const {
    const std::string position =
        worker_.empty() ? std::to_string(ordinal_) + "/" + std::to_string(runs_) : worker_;
    return "sweep " + name_ + " [" + position + "] " + id_;
  }

  std::string name_;
  int64_t runs_;
  std::string worker_;
  bool enabled_, terminal_;
  int64_t ordinal_ = 0;
  std::string id_;
  int64_t later_tokens_ = 0;
  double run_started_ = 0, last_draw_ = 0;
  double wall_seconds_ = 0, trained_seconds_ = 0, run_train_seconds_ = 0;
};

RunRecord new_run_record(const SweepPoint& point) {
  RunRecord r;
  r.run_id = point.id;
  r.config = YAML::Dump(point.config.to_yaml());
  r.grid_point = point.grid_yaml();
  r.point_index = point.index;
  r.position = point.config.position_name;
  r.train_length = point.config.train.seq_len;
  r.seed = point.config.train.seed;
  r.machine = machine_description();
  RuntimeInfo runtime = runtime_info();
  const int64_t threads = point.config.train.threads;
  runtime.threads = threads > 0 ? int(threads) : available_cores();  // what the trainer sets
  r.runtime = runtime_summary(runtime);
  r.start_time = iso_time_now();
  r.status = "training";
  return r;
}

PointRecord new_point_record(const RunRecord& run, const EvalPoint& e) {
  PointRecord p;
  p.run_id = run.run_id;
  p.position = run.position;
  p.train_length = run.train_length;
  p.seed = run.seed;
  p.mode = e.mode;
  p.stride = e.stride > 0 ? e.stride : e.length;
  p.eval_length = e.length;
  return p;
}

int status_rank(const std::string& status) {
  if (status == "training") return 0;
  if (status == "trained") return 1;
  return 2;  // complete, failed
}

}  // namespace

// --- the spec ------------------------------------------------------------------------------

YAML::Node SweepSpec::canonical() const {
  YAML::Node out(YAML::NodeType::Map);
  out["name"] = name;
  YAML::Node base_yaml = base_config.to_yaml();
  // Where files go and how many threads run do not change results; the sweep's own eval
  // section replaces the base's lengths and strides; grid keys are set per point.
  for (const char* key : {"train.out_dir", "train.threads", "train.log_every", "data.cache_dir",
                          "eval.lengths", "eval.strides", "eval.batch_tokens"})
    remove_path(base_yaml, key);
  for (const auto& axis : grid) remove_path(base_yaml, axis.key);
  out["base"] = base_yaml;
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
  out["eval"] = e;
  return plain(out);
}

std::string SweepSpec::canonical_yaml() const { return YAML::Dump(canonical()) + "\n"; }

std::string SweepSpec::hash() const {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%016" PRIx64, fnv1a64(canonical_yaml()));
  return buffer;
}

SweepHeader SweepSpec::header(const std::string& shard) const {
  SweepHeader h;
  h.sweep_name = name;
  h.sweep_spec = canonical_yaml();
  h.spec_hash = hash();
  h.sweep_file = source_text;
  h.shard = shard;
  h.created = iso_time_now();
  return h;
}

std::string SweepPoint::grid_yaml() const {
  YAML::Node map(YAML::NodeType::Map);
  for (const auto& [key, value] : values) map[key] = value;
  return yaml_to_string(map);
}

SweepSpec load_sweep(const std::string& path, const std::vector<std::string>& overrides) {
  YAML::Node doc = load_yaml_file(path);
  if (!doc.IsMap())
    throw ConfigError(path + ": a sweep file is a map with base, grid, eval and output");
  SweepSpec spec;
  spec.source = path;
  spec.source_text = read_text(path);
  for (const auto& o : overrides) {
    spec.source_text += "\n# --set " + o;
    if (o.rfind("grid.", 0) != 0) {
      apply_override(doc, o);
      continue;
    }
    // Grid keys are dotted themselves: "grid.position.name=[a, b]" sets the axis "position.name".
    const auto eq = o.find('=');
    if (eq == std::string::npos || eq <= 5)
      throw ConfigError("--set '" + o + "': expected grid.KEY=[values]");
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      throw ConfigError("--set '" + o + "': value is not valid YAML: " + e.msg);
    }
    if (!value.IsSequence()) {
      YAML::Node list(YAML::NodeType::Sequence);
      list.push_back(value);
      value = list;
    }
    if (!doc["grid"] || !doc["grid"].IsMap()) doc["grid"] = YAML::Node(YAML::NodeType::Map);
    YAML::Node grid = doc["grid"];
    grid[o.substr(5, eq - 5)] = value;
  }

  OptionReader root(doc, path);
  spec.name = fs::path(path).stem().string();
  root.read("name", spec.name, "sweep name (default: the file's name)");
  root.accept("base", "the base config: a full `extrap train` config, or the path of one");
  root.accept("grid", "dotted config keys -> lists of values; every combination is a run");

  // The base config.
  if (!root.has("base"))
    root.fail("base", "missing: a full config (a map) or the path of a config file");
  std::string base_source = path;
  YAML::Node base = doc["base"];
  if (base.IsScalar()) {
    fs::path base_path = base.Scalar();
    if (!fs::exists(base_path) && base_path.is_relative())
      base_path = fs::path(path).parent_path() / base_path;
    base_source = base_path.string();
    base = load_yaml_file(base_source);
  } else if (!base.IsMap()) {
    root.fail("base", "expected a config (a map) or the path of a config file");
  }
  spec.base = YAML::Clone(base);
  if (spec.base["position"] && spec.base["position"].IsScalar()) {
    const std::string name = spec.base["position"].Scalar();
    spec.base["position"] = YAML::Node(YAML::NodeType::Map);
    spec.base["position"]["name"] = name;
  }
  spec.base_config = config_from_yaml(spec.base, base_source);
  for (const auto& plugin : spec.base_config.plugins)
    PositionRegistry::instance().load_plugin(plugin);

  // The grid.
  if (root.has("grid")) {
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
      for (const auto& v : entry.second) axis.values.push_back(YAML::Clone(v));
      spec.grid.push_back(std::move(axis));
    }
  }

  // Evaluation: the sweep's own lengths/strides, else the base config's.
  {
    auto e = root.section("eval", "evaluation of every grid point");
    e.read("lengths", spec.eval.lengths, "absolute evaluation lengths");
    e.read("length_multiples", spec.eval.length_multiples,
           "evaluation lengths as multiples of train.seq_len");
    e.read("strides", spec.eval.strides, "sliding-window strides (each used at lengths above it)");
    e.read("nonoverlapping", spec.eval.nonoverlapping, "evaluate non-overlapping windows too");
    e.finish();
    if (!e.has("lengths") && !e.has("length_multiples"))
      spec.eval.lengths = spec.base_config.eval.lengths;
    if (!e.has("strides")) spec.eval.strides = spec.base_config.eval.strides;
    for (auto l : spec.eval.lengths)
      if (l < 1) e.fail("lengths", "lengths must be at least 1, got " + std::to_string(l));
    for (auto m : spec.eval.length_multiples)
      if (m < 1)
        e.fail("length_multiples", "multiples must be at least 1, got " + std::to_string(m));
    for (auto s : spec.eval.strides)
      if (s < 1) e.fail("strides", "strides must be at least 1, got " + std::to_string(s));
    if (!spec.eval.nonoverlapping && spec.eval.strides.empty())
      e.fail("nonoverlapping", "false, and no strides: nothing would be evaluated");
  }
  root.read("jobs", spec.jobs,
            "grid points run at once, each in its own process (not part of the spec)");
  if (spec.jobs < 1) root.fail("jobs", "must be at least 1");
  spec.overrides = overrides;
  {
    auto o = root.section("output", "where results and runs go");
    o.read("path", spec.output, "results file (default results/NAME.h5)");
    o.read("run_root", spec.run_root,
           "run directories (default runs/NAME); each point in RUN_ROOT/<run id>");
    o.finish();
  }
  root.finish();
  if (spec.output.empty()) spec.output = "results/" + spec.name + ".h5";
  if (spec.run_root.empty()) spec.run_root = "runs/" + spec.name;
  return spec;
}

std::vector<SweepPoint> expand_grid(const SweepSpec& spec) {
  int64_t total = 1;
  for (const auto& axis : spec.grid) total *= int64_t(axis.values.size());
  const int width = std::max<int>(2, int(std::to_string(std::max<int64_t>(total - 1, 0)).size()));

  std::vector<SweepPoint> points;
  for (int64_t index = 0; index < total; ++index) {
    SweepPoint point;
    point.index = index;
    // Mixed-radix digits of the index, the last axis varying fastest.
    std::vector<size_t> digit(spec.grid.size());
    int64_t rest = index;
    for (size_t a = spec.grid.size(); a-- > 0;) {
      digit[a] = size_t(rest % int64_t(spec.grid[a].values.size()));
      rest /= int64_t(spec.grid[a].values.size());
    }
    YAML::Node root = YAML::Clone(spec.base);
    std::string labels;
    for (size_t a = 0; a < spec.grid.size(); ++a) {
      const YAML::Node& value = spec.grid[a].values[digit[a]];
      point.values.push_back({spec.grid[a].key, value});
      apply_override(root, spec.grid[a].key + "=" + yaml_to_string(value));
      labels += "-" + value_label(spec.grid[a].key, value, digit[a]);
    }
    std::string number = std::to_string(index);
    number.insert(0, size_t(std::max<int>(0, width - int(number.size()))), '0');
    point.id = number + (labels.empty() ? "-" + spec.base_config.position_name : labels);

    point.config = config_from_yaml(root, spec.source + " (grid point " + point.id + ")");
    point.config.train.out_dir = (fs::path(spec.run_root) / point.id).string();
    check_position(point.config);

    std::set<int64_t> lengths(spec.eval.lengths.begin(), spec.eval.lengths.end());
    for (auto m : spec.eval.length_multiples) lengths.insert(m * point.config.train.seq_len);
    std::set<int64_t> strides(spec.eval.strides.begin(), spec.eval.strides.end());
    for (int64_t length : lengths) {
      if (spec.eval.nonoverlapping) point.evals.push_back({length, 0, eval_mode_name(length, 0)});
      for (int64_t stride : strides)
        if (stride < length)
          point.evals.push_back({length, stride, eval_mode_name(length, stride)});
    }
    points.push_back(std::move(point));
  }
  return points;
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

std::string default_output(const SweepSpec& spec, const Shard& shard) {
  if (shard.whole()) return spec.output;
  const fs::path base = spec.output;
  const std::string name = base.stem().string() + ".shard-" + std::to_string(shard.index) + "-of-" +
                           std::to_string(shard.count) + base.extension().string();
  return (base.parent_path() / name).string();
}

std::optional<SpecDifference> first_difference(const YAML::Node& first, const YAML::Node& second,
                                               const std::string& prefix) {
  const auto text = [](const YAML::Node& n) {
    return n && !n.IsNull() ? flow_text(n) : "(absent)";
  };
  const auto child = [&](const std::string& key) {
    return prefix.empty() ? key : prefix + "." + key;
  };
  const bool a = first && !first.IsNull(), b = second && !second.IsNull();
  if (!a && !b) return std::nullopt;
  if (a != b || first.Type() != second.Type())
    return SpecDifference{prefix, text(first), text(second)};
  if (first.IsScalar()) {
    if (first.Scalar() == second.Scalar()) return std::nullopt;
    return SpecDifference{prefix, text(first), text(second)};
  }
  if (first.IsSequence()) {
    bool same = first.size() == second.size();
    for (size_t i = 0; same && i < first.size(); ++i) same = !first_difference(first[i], second[i]);
    if (same) return std::nullopt;
    return SpecDifference{prefix, text(first), text(second)};
  }
  for (const auto& entry : first) {
    const std::string key = entry.first.Scalar();
    if (auto d = first_difference(entry.second, second[key], child(key))) return d;
  }
  for (const auto& entry : second) {
    const std::string key = entry.first.Scalar();
    if (!first[key]) return SpecDifference{child(key), "(absent)", text(entry.second)};
  }
  return std::nullopt;
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

// --- running -------------------------------------------------------------------------------

namespace {

// What counts as done: the points of the file being written, and those of a read-only
// `known` file (a parallel sweep's main output, when this process is one of its workers).
struct DoneSet {
  const ResultsStore& store;
  const ResultsStore* known;
  bool has_point(const std::string& id, const std::string& mode, int64_t length) const {
    return store.has_point(id, mode, length) || (known && known->has_point(id, mode, length));
  }
  const RunRecord* run(const std::string& id) const {
    if (const RunRecord* r = store.run(id)) return r;
    return known ? known->run(id) : nullptr;
  }
  bool complete(const SweepPoint& point) const {
    if (!run(point.id)) return false;
    for (const auto& e : point.evals)
      if (!has_point(point.id, e.mode, e.length)) return false;
    return true;
  }
};

// Trains and evaluates `points` in order, appending every finished point to `store`.
void run_points(const SweepSpec& spec, const std::vector<const SweepPoint*>& points,
                ResultsStore& store, const ResultsStore* known, const SweepOptions& options,
                SweepOutcome& outcome) {
  const DoneSet done{store, known};
  SweepDisplay display(spec.name, int64_t(points.size()), options.progress, options.worker);
  std::map<std::string, Corpus> corpora;  // by data section
  for (size_t k = 0; k < points.size(); ++k) {
    const SweepPoint& point = *points[k];
    std::vector<EvalPoint> pending;
    for (const auto& e : point.evals)
      if (!done.has_point(point.id, e.mode, e.length)) pending.push_back(e);
    const RunRecord* existing = done.run(point.id);
    int64_t later_tokens = 0;
    for (size_t j = k + 1; j < points.size(); ++j)
      later_tokens += points[j]->config.train.steps * tokens_per_step(points[j]->config.train);
    display.start_run(int64_t(k) + 1, point.id, later_tokens);

    if (existing && pending.empty()) {
      if (existing->status == "trained") {
        RunRecord finished = *existing;
        finished.status = "complete";
        store.put_run(finished);
      }
      ++outcome.skipped;
      display.line("already complete");
      continue;
    }
    RunRecord record = existing ? *existing : new_run_record(point);
    if (!store.run(point.id)) store.put_run(record);

    const Config& config = point.config;
    const std::string data_key = yaml_to_string(config.to_yaml()["data"]);
    if (!corpora.count(data_key)) corpora.emplace(data_key, load_corpus(config.data));
    const Corpus& corpus = corpora.at(data_key);

    // Train (or resume from the run directory's checkpoint).
    std::unique_ptr<Trainer> trainer;
    std::string failure;
    try {
      reset_peak_memory();
      trainer = std::make_unique<Trainer>(config, corpus);
    } catch (const c10::Error& e) {
      failure = one_line(e.what_without_backtrace());
    } catch (const std::exception& e) {
      failure = one_line(e.what());  // e.g. a method that does not support this objective
    }
    if (trainer) {
      const int64_t step_tokens = tokens_per_step(config.train);
      trainer->on_progress = [&](const TrainProgress& p) { display.training(p, step_tokens); };
      // Workers share the terminal: the trainer's own (unlabelled) lines would interleave.
      trainer->quiet = !options.progress || !options.worker.empty();
      try {
        const TrainSummary summary = trainer->run(true);
        ++outcome.trained;
        char text[160];
        std::snprintf(
            text, sizeof text, "trained %" PRId64 " steps%s: valid loss %.4f, %.0f tok/s",
            summary.steps,
            summary.resumed_from > 0
                ? (" (resumed from step " + std::to_string(summary.resumed_from) + ")").c_str()
                : "",
            summary.valid_curve.empty() ? NAN : summary.valid_curve.back().loss,
            summary.tokens_per_second);
        display.line(text);
        display.trained(summary.tokens_per_second > 0
                            ? double(summary.steps - summary.resumed_from) * double(step_tokens) /
                                  summary.tokens_per_second
                            : 0.0);
        if (record.status == "training") {
          record.end_time = iso_time_now();
          record.tokens_per_second = summary.tokens_per_second;
          record.peak_memory_bytes = summary.peak_memory_bytes;
          record.num_parameters = summary.num_parameters;
          record.train_loss = summary.train_curve;
          record.valid_loss = summary.valid_curve;
          record.status = "trained";
          store.put_run(record);
        }
      } catch (const ConfigError&) {
        throw;  // e.g. a checkpoint of another config in the run directory: the user must look
      } catch (const c10::Error& e) {
        failure = one_line(e.what_without_backtrace());
      } catch (const std::exception& e) {
        failure = one_line(e.what());  // divergence, out of memory
      }
    }
    if (!failure.empty()) {
      record.status = "failed: " + failure;
      record.end_time = iso_time_now();
      std::vector<PointRecord> failed;
      for (const auto& e : pending) {
        failed.push_back(new_point_record(record, e));
        failed.back().status = "failed: training: " + failure;
      }
      store.write({record}, failed);
      outcome.evaluated += int64_t(failed.size());
      outcome.failed += int64_t(failed.size());
      display.line("failed: " + failure);
      display.finish_run();
      continue;
    }

    // Evaluate every pending point; each is on disk before the next starts.
    const TokenStream& stream = corpus.split(config.eval.split);
    const torch::Device device = config.train.device == "cuda" ? torch::kCUDA : torch::kCPU;
    for (const auto& e : pending) {
      const EvalSpec eval_spec = eval_spec_for(config, e.length, e.stride);
      PointRecord p = new_point_record(record, e);
      try {
        const EvalResult r = evaluate(trainer->model(), corpus, stream, eval_spec, device);
        p.perplexity = r.perplexity;
        p.nll_sum = r.nll_sum;
        p.scored_tokens = r.scored_tokens;
        p.bits_per_byte = r.bits_per_byte;
        p.seconds = r.seconds;
      } catch (const c10::Error& ex) {
        p.status = "failed: " + one_line(ex.what_without_backtrace());
      } catch (const std::exception& ex) {
        p.status = "failed: " + one_line(ex.what());
      }
      store.append_point(p);
      ++outcome.evaluated;
      char text[160];
      if (p.ok()) {
        std::snprintf(text, sizeof text, "L=%" PRId64 " %s: perplexity %.4f (%.1f s)", e.length,
                      e.mode.c_str(), p.perplexity, p.seconds);
        display.line(text);
      } else {
        ++outcome.failed;
        display.line("L=" + std::to_string(e.length) + " " + e.mode + ": " + p.status);
      }
    }
    record.status = "complete";
    store.put_run(record);
    display.finish_run();
  }
}

// Adds to `store` every run and point of `source` that it lacks, in one atomic change. A run
// already present is replaced only by a more finished record of it.
void absorb(ResultsStore& store, const ResultsStore& source, MergeOutcome& outcome) {
  std::vector<RunRecord> runs;
  for (const auto& [id, run] : source.runs()) {
    const RunRecord* existing = store.run(id);
    if (!existing) ++outcome.runs_added;
    if (!existing || status_rank(run.status) > status_rank(existing->status)) runs.push_back(run);
  }
  std::vector<PointRecord> points;
  std::set<std::tuple<std::string, std::string, int64_t>> adding;
  for (const auto& p : source.points()) {
    if (store.has_point(p.run_id, p.mode, p.eval_length) ||
        !adding.insert({p.run_id, p.mode, p.eval_length}).second) {
      ++outcome.points_already_present;
      continue;
    }
    points.push_back(p);
  }
  outcome.points_added += int64_t(points.size());
  if (!runs.empty() || !points.empty()) store.write(runs, points);
}

std::string part_path(const std::string& output, int64_t point_index) {
  return output + ".part-" + std::to_string(point_index) + ".h5";
}

// Merges one part file of a parallel sweep into `store` and removes it. A part still being
// written is an error naming its writer.
void absorb_part(ResultsStore& store, const std::string& output, const fs::path& part) {
  if (!fs::exists(part)) return;  // the worker failed before creating it
  {
    ResultsLock part_lock(part.string());
    const ResultsStore source = ResultsStore::open(part.string());
    const std::string difference =
        describe_difference(store.header(), output, source.header(), part.string());
    if (!difference.empty())
      throw ConfigError(part.string() + " is a part of a different sweep (" + difference +
                        "); remove it");
    MergeOutcome ignored;
    absorb(store, source, ignored);
    fs::remove(part);
  }
  fs::remove(part.string() + ".lock");
}

// Merges the part files that an interrupted parallel sweep left beside `output`.
void absorb_parts(ResultsStore& store, const std::string& output) {
  const fs::path out_path = fs::absolute(output);
  const std::string prefix = out_path.filename().string() + ".part-";
  std::vector<fs::path> parts;
  for (const auto& entry : fs::directory_iterator(out_path.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > 3 &&
        name.compare(name.size() - 3, 3, ".h5") == 0)
      parts.push_back(entry.path());
  }
  std::sort(parts.begin(), parts.end());
  for (const auto& part : parts) absorb_part(store, output, part);
}

// Starts `extrap sweep` as a worker process that runs grid point `index` into `part`, skipping
// what `output` already holds; it dies with this process.
pid_t start_worker(const SweepSpec& spec, int64_t index, const std::string& label,
                   const std::string& part, const std::string& output, bool progress) {
  std::vector<std::string> args = {"extrap", "sweep", spec.source};
  for (const auto& o : spec.overrides) {
    args.push_back("--set");
    args.push_back(o);
  }
  for (const std::string& a :
       {std::string("--worker"), label, std::string("--points"), std::to_string(index),
        std::string("--out"), part, std::string("--known"), output})
    args.push_back(a);
  if (!progress) args.push_back("--quiet");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0)
    throw std::runtime_error(std::string("cannot start a worker process: ") + std::strerror(errno));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a killed sweep takes its workers with it
    if (::getppid() != parent) ::_exit(1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  return pid;
}

// jobs > 1: every pending point runs in a fresh worker process (so its memory and speed are
// its own), up to `jobs` at a time; each finished part is merged into the output at once.
void run_parallel(const SweepSpec& spec, const std::vector<const SweepPoint*>& points,
                  ResultsStore& store, int64_t jobs, const SweepOptions& options,
                  SweepOutcome& outcome) {
  absorb_parts(store, outcome.output);
  const DoneSet done{store, nullptr};
  std::vector<const SweepPoint*> pending;
  for (const auto* p : points)
    if (!done.complete(*p)) pending.push_back(p);
  outcome.skipped = int64_t(points.size() - pending.size());
  const size_t points_before = store.points().size();
  // Tokenise (and cache) each corpus once here, not in every worker at the same time.
  std::set<std::string> loaded;
  for (const auto* p : pending)
    if (loaded.insert(yaml_to_string(p->config.to_yaml()["data"])).second)
      load_corpus(p->config.data);
  if (options.progress)
    std::fprintf(stderr, "sweep %s: %zu of %zu points to run, %lld at a time\n", spec.name.c_str(),
                 pending.size(), points.size(), (long long)jobs);

  const auto now = [] { return std::chrono::steady_clock::now(); };
  struct Running {
    const SweepPoint* point;
    std::chrono::steady_clock::time_point started;
  };
  std::map<pid_t, Running> running;
  size_t next = 0, finished = 0;
  double finished_seconds = 0;  // wall time of the finished workers, summed
  std::string failures;
  while (next < pending.size() || !running.empty()) {
    while (next < pending.size() && int64_t(running.size()) < jobs) {
      const SweepPoint* p = pending[next];
      const std::string label =
          std::to_string(outcome.skipped + int64_t(next) + 1) + "/" + std::to_string(points.size());
      running[start_worker(spec, p->index, label, part_path(outcome.output, p->index),
                           outcome.output, options.progress)] = {p, now()};
      ++next;
    }
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("waiting for worker processes: ") +
                               std::strerror(errno));
    }
    const auto found = running.find(pid);
    if (found == running.end()) continue;
    const SweepPoint* p = found->second.point;
    finished_seconds += std::chrono::duration<double>(now() - found->second.started).count();
    running.erase(found);
    ++finished;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      failures += " " + p->id +
                  (WIFEXITED(status) ? " (exit code " + std::to_string(WEXITSTATUS(status)) + ")"
                                     : " (signal " + std::to_string(WTERMSIG(status)) + ")") +
                  ";";
    absorb_part(store, outcome.output, part_path(outcome.output, p->index));
    if (options.progress) {
      // Points are assumed to cost alike: the running ones need what is left of the average,
      // the waiting ones all of it, spread over the jobs.
      const double average = finished_seconds / double(finished);
      double work = double(pending.size() - next) * average;
      for (const auto& [other, r] : running)
        work += std::max(0.0, average - std::chrono::duration<double>(now() - r.started).count());
      std::fprintf(stderr, "sweep %s: %zu of %zu points to run done, sweep ETA %s\n",
                   spec.name.c_str(), finished, pending.size(),
                   format_duration(work / double(jobs)).c_str());
    }
  }
  outcome.trained = int64_t(pending.size());
  for (size_t i = points_before; i < store.points().size(); ++i) {
    ++outcome.evaluated;
    outcome.failed += !store.points()[i].ok();
  }
  if (!failures.empty())
    throw std::runtime_error("sweep " + spec.name + ": workers failed for" + failures +
                             " (their messages are above); "
                             "finished points are in " +
                             outcome.output + ": run the same command again to continue");
}

}  // namespace

SweepOutcome run_sweep(const SweepSpec& spec, const SweepOptions& options) {
  SweepOutcome outcome;
  outcome.output = options.output.empty() ? default_output(spec, options.shard) : options.output;
  const std::vector<SweepPoint> all = expand_grid(spec);
  const std::set<int64_t> chosen(options.points.begin(), options.points.end());
  std::vector<const SweepPoint*> points;
  for (const auto& p : all)
    if (options.shard.contains(p.index) && (chosen.empty() || chosen.count(p.index)))
      points.push_back(&p);
  outcome.points = int64_t(points.size());
  for (const auto* p : points)
    if (p->config.train.device == "cuda" && !torch::cuda::is_available())
      throw ConfigError(spec.source + ": point " + p->id +
                        " trains on cuda but no CUDA device is available");

  ResultsLock lock(outcome.output);
  const bool worker = !options.worker.empty();
  const SweepHeader header = spec.header(worker ? "part" : options.shard.text());
  ResultsStore store = ResultsStore::open_or_create(outcome.output, header);
  const std::string difference =
      describe_difference(store.header(), outcome.output, header, spec.source);
  if (!difference.empty())
    throw ConfigError(outcome.output + " holds the results of a different sweep (" + difference +
                      "). Use another --out, or delete " + outcome.output + " to start over.");

  const int64_t jobs = options.jobs > 0 ? options.jobs : spec.jobs;
  if (!worker && jobs > 1) {
    run_parallel(spec, points, store, jobs, options, outcome);
    return outcome;
  }
  if (!worker) absorb_parts(store, outcome.output);  // left by an interrupted parallel sweep
  std::optional<ResultsStore> known;
  if (!options.known.empty() && fs::exists(options.known))
    known.emplace(ResultsStore::open(options.known));
  run_points(spec, points, store, known ? &*known : nullptr, options, outcome);
  return outcome;
}

MergeOutcome merge_results(const std::string& output, const std::vector<std::string>& inputs) {
  if (inputs.empty()) throw ConfigError("no input files");
  std::vector<ResultsStore> sources;
  for (const auto& path : inputs) {
    if (fs::exists(output) && fs::equivalent(path, output))
      throw ConfigError("input " + path + " is the output file");
    sources.push_back(ResultsStore::open(path));
  }
  for (size_t i = 1; i < sources.size(); ++i) {
    const std::string difference =
        describe_difference(sources[0].header(), inputs[0], sources[i].header(), inputs[i]);
    if (!difference.empty())
      throw ConfigError(inputs[i] + " is not from the same sweep as " + inputs[0] + " (" +
                        difference + "); only shards of one sweep can be merged");
  }

  ResultsLock lock(output);
  SweepHeader header = sources[0].header();
  header.shard = "merged";
  header.created = iso_time_now();
  ResultsStore store = ResultsStore::open_or_create(output, header);
  const std::string difference = describe_difference(store.header(), output, header, inputs[0]);
  if (!difference.empty())
    throw ConfigError(output + " holds the results of a different sweep (" + difference + ")");
  MergeOutcome outcome;
  for (const auto& source : sources) absorb(store, source, outcome);
  return outcome;
}

}  // namespace extrap
