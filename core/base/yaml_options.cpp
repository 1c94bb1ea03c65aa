#include "core/base/yaml_options.h"

#include "core/base/files.h"

#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

namespace extrap {

const char* to_string(Affects affects) {
  switch (affects) {
    case Affects::model: return "model";
    case Affects::evaluation: return "evaluation";
    case Affects::nothing: return "nothing";
  }
  return "?";
}

namespace detail {
template <> std::string type_name<int>() { return "integer"; }
template <> std::string type_name<int64_t>() { return "integer"; }
template <> std::string type_name<double>() { return "number"; }
template <> std::string type_name<bool>() { return "true/false"; }
template <> std::string type_name<std::string>() { return "string"; }
template <> std::string type_name<std::vector<int64_t>>() { return "list of integers"; }
template <> std::string type_name<std::vector<double>>() { return "list of numbers"; }
template <> std::string type_name<std::vector<std::string>>() { return "list of strings"; }

std::string scalar_problem(const YAML::Node& value, bool integer) {
  const std::string& text = value.Scalar();
  // A parsed plain scalar is tagged "?", a quoted one "!", an explicit string !!str; nodes made in
  // code (--set values, sweep grids) have no tag.
  const std::string& tag = value.Tag();
  if (tag == "!" || tag == "tag:yaml.org,2002:str")
    return "the string '" + text + "' (numbers and true/false are written without quotes or tags)";
  if (!integer) return "";
  size_t digits = text.size() > 1 && (text[0] == '-' || text[0] == '+') ? 1 : 0;
  const bool decimal = digits < text.size() && text.find_first_not_of("0123456789", digits) == std::string::npos;
  if (decimal && (text[digits] != '0' || text.size() == digits + 1)) return "";
  if (decimal) return "'" + text + "' (a leading zero: integers are written in decimal without one)";
  return "'" + text + "'";  // 0x14, 1e3, 2.5, abc: not a decimal integer
}

template <class T>
std::string format_default(const T& value) {
  YAML::Emitter out;
  out.SetDoublePrecision(15);  // 0.1, not 0.10000000000000001
  out << YAML::Flow << value;
  return out.c_str();
}
template std::string format_default<int>(const int&);
template std::string format_default<int64_t>(const int64_t&);
template std::string format_default<double>(const double&);
template std::string format_default<bool>(const bool&);
template std::string format_default<std::string>(const std::string&);
template std::string format_default<std::vector<int64_t>>(const std::vector<int64_t>&);
template std::string format_default<std::vector<double>>(const std::vector<double>&);
template std::string format_default<std::vector<std::string>>(const std::vector<std::string>&);
}  // namespace detail

OptionReader::OptionReader(YAML::Node node, std::string source, std::string prefix)
    : node_(std::move(node)), state_(std::make_shared<State>()), prefix_(std::move(prefix)) {
  state_->source = std::move(source);
  if (node_ && !node_.IsNull() && !node_.IsMap()) {
    throw ConfigError(state_->source + ": " + (prefix_.empty() ? "the document" : "'" + prefix_ + "'") +
                      " must be a map of key: value");
  }
}

OptionReader::OptionReader(YAML::Node node, std::shared_ptr<State> state, std::string prefix)
    : node_(std::move(node)), state_(std::move(state)), prefix_(std::move(prefix)) {}

OptionReader OptionReader::documenter(std::string prefix) {
  auto state = std::make_shared<State>();
  state->mode = Mode::Document;
  state->source = "(documentation)";
  return OptionReader(YAML::Node(), state, std::move(prefix));
}

OptionReader OptionReader::writer(YAML::Node out) {
  auto state = std::make_shared<State>();
  state->mode = Mode::Write;
  state->source = "(writer)";
  return OptionReader(std::move(out), state, "");
}

std::string OptionReader::full_key(const std::string& key) const {
  return prefix_.empty() ? key : prefix_ + "." + key;
}

bool OptionReader::has(const std::string& key) const {
  return decoding() && node_ && node_.IsMap() && node_[key] && !node_[key].IsNull();
}

void OptionReader::note(const std::string& key, const std::string& default_value,
                        const std::string& help, Affects affects) const {
  used_->insert(key);
  if (documenting()) state_->docs.push_back({full_key(key), default_value, help, affects});
}

std::string OptionReader::locate(const std::string& key) const {
  // A node set with --set has no mark; a missing key is located at its enclosing map.
  YAML::Mark mark = YAML::Mark::null_mark();
  if (decoding() && node_ && node_.IsMap()) mark = node_[key] ? node_[key].Mark() : node_.Mark();
  std::ostringstream out;
  out << state_->source;
  if (!mark.is_null()) out << ":" << mark.line + 1;
  out << ": key '" << full_key(key) << "'";
  if (mark.is_null() && decoding()) out << " (set on the command line or by a sweep's grid)";
  return out.str();
}

void OptionReader::fail(const std::string& key, const std::string& message) const {
  throw ConfigError(locate(key) + ": " + message);
}

void OptionReader::fail_below(const std::string& key, const std::string& minimum, bool zero,
                              const std::string& note, const std::string& value) const {
  fail(key, (zero ? "must not be negative" : "must be at least " + minimum) + note + ", got " +
                value);
}

void OptionReader::above(const std::string& key, double value, double bound,
                         const std::string& note) const {
  // !(value > bound) also refuses NaN.
  if (!decoding() || value > bound) return;
  fail(key, (bound == 0 ? std::string("must be positive") : "must be greater than " + number_text(bound)) +
                note + ", got " + number_text(value));
}

void OptionReader::in_range(const std::string& key, double value, double low, double high,
                            const std::string& ends) const {
  if (ends.size() != 2 || (ends[0] != '[' && ends[0] != '(') || (ends[1] != ']' && ends[1] != ')'))
    throw std::logic_error("OptionReader::in_range: ends must be one of [) (] [] (), got " + ends);
  const bool low_ok = ends[0] == '[' ? value >= low : value > low;
  const bool high_ok = ends[1] == ']' ? value <= high : value < high;
  if (!decoding() || (low_ok && high_ok)) return;  // NaN fails both comparisons
  fail(key, "must be in " + ends.substr(0, 1) + number_text(low) + ", " + number_text(high) +
                ends.substr(1) + ", got " + number_text(value));
}

OptionReader OptionReader::section(const std::string& key, const std::string& help) const {
  note(key, "{}", help, Affects::model);
  if (documenting()) state_->docs.back().section = true;  // its keys carry their own marks
  YAML::Node child;
  if (writing()) {
    YAML::Node out = node_;  // a handle on the same tree
    out[key] = YAML::Node(YAML::NodeType::Map);
    child = out[key];
  } else if (has(key)) {
    child = node_[key];
    if (!child.IsMap()) fail(key, "expected a map of key: value, got '" + yaml_to_string(child) + "'");
  }
  return OptionReader(child, state_, full_key(key));
}

void OptionReader::accept(const std::string& key, const std::string& help, Affects affects) const {
  note(key, "", help, affects);
}

void OptionReader::finish() const {
  if (!decoding() || !node_ || !node_.IsMap()) return;
  for (const auto& entry : node_) {
    const std::string key = entry.first.as<std::string>();
    if (used_->count(key)) continue;
    std::string known;
    for (const auto& k : *used_) known += (known.empty() ? "" : ", ") + k;
    fail(key, "unknown key" + (known.empty() ? std::string() : " (known here: " + known + ")"));
  }
}

YAML::Node without_marks(const YAML::Node& node) {
  if (node.IsScalar()) return YAML::Node(node.Scalar());
  if (node.IsSequence()) {
    YAML::Node out(YAML::NodeType::Sequence);
    for (const auto& item : node) out.push_back(without_marks(item));
    return out;
  }
  if (node.IsMap()) {
    YAML::Node out(YAML::NodeType::Map);
    for (const auto& item : node) out[item.first.Scalar()] = without_marks(item.second);
    return out;
  }
  return YAML::Node();
}

namespace {

// Refuses a key given twice in one map, and a key that is a list or a map, anywhere under `node`.
void refuse_repeated_keys(const YAML::Node& node, const std::string& source) {
  if (node.IsSequence())
    for (const auto& item : node) refuse_repeated_keys(item, source);
  if (!node.IsMap()) return;
  std::map<std::string, int> first_line;
  for (const auto& entry : node) {
    if (entry.first.IsSequence() || entry.first.IsMap())
      throw ConfigError(source + ":" + std::to_string(entry.first.Mark().line + 1) + ": a key is a name, got " +
                        (entry.first.IsSequence() ? "the list " : "the map ") + flow_text(entry.first));
    if (entry.first.IsScalar()) {
      const int line = entry.first.Mark().line + 1;
      const auto [found, added] = first_line.emplace(entry.first.Scalar(), line);
      if (!added)
        throw ConfigError(source + ":" + std::to_string(line) + ": key '" + entry.first.Scalar() +
                          "' is given twice in one map (first on line " + std::to_string(found->second) +
                          "); remove one of them");
    }
    refuse_repeated_keys(entry.second, source);
  }
}

}  // namespace

void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected key.path=value");
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  if (text.find_first_not_of(" \t") == std::string::npos)
    throw ConfigError("--set '" + assignment + "': no value after '=' (write " + path +
                      "=null to unset a key)");
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set '" + assignment + "': value is not valid YAML: " + e.msg);
  }
  refuse_repeated_keys(value, "--set '" + assignment + "'");
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(path);
  while (std::getline(in, part, '.')) {
    if (part.empty()) throw ConfigError("--set '" + assignment + "': empty key in '" + path + "'");
    parts.push_back(part);
  }
  // yaml-cpp nodes are handles: walk with reset() so that assignment edits the tree.
  YAML::Node cursor;
  cursor.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = cursor[parts[i]];
    if (next && !next.IsMap() && !next.IsNull())
      throw ConfigError("--set '" + assignment + "': '" + parts[i] + "' is not a map");
    if (!next || next.IsNull()) cursor[parts[i]] = YAML::Node(YAML::NodeType::Map);
    YAML::Node child = cursor[parts[i]];
    cursor.reset(child);
  }
  cursor[parts.back()] = without_marks(value);
}

YAML::Node parse_yaml_text(const std::string& text, const std::string& source) {
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(source + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
  if (!node || node.IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!node.IsMap())
    throw ConfigError(source + ":" + std::to_string(node.Mark().line + 1) + ": the document must be a map of key: value, got " +
                      (node.IsSequence() ? "a list" : "'" + flow_text(node) + "'"));
  refuse_repeated_keys(node, source);
  return node;
}

YAML::Node load_yaml_file(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) throw ConfigError(path + ": cannot open the file (no such file)");
  return parse_yaml_text(read_file(path), path);
}

std::string yaml_to_string(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

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

YAML::Node plain_yaml(const YAML::Node& node) {
  if (node.IsMap()) {
    YAML::Node out(YAML::NodeType::Map);
    for (const auto& entry : node) out[entry.first.Scalar()] = plain_yaml(entry.second);
    return out;
  }
  if (node.IsSequence()) {
    YAML::Node out(YAML::NodeType::Sequence);
    for (const auto& item : node) out.push_back(plain_yaml(item));
    return out;
  }
  if (node.IsScalar()) return YAML::Node(node.Scalar());
  return YAML::Node();
}

void remove_key(YAML::Node root, const std::string& dotted) {
  std::vector<std::string> parts;
  std::istringstream in(dotted);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  if (parts.empty()) return;
  YAML::Node cursor;
  cursor.reset(root);
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (!cursor.IsMap() || !cursor[parts[i]]) return;
    YAML::Node next = cursor[parts[i]];
    cursor.reset(next);
  }
  if (cursor.IsMap()) cursor.remove(parts.back());
}

std::optional<YamlDifference> first_difference(const YAML::Node& first, const YAML::Node& second,
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
    return YamlDifference{prefix, text(first), text(second)};
  if (first.IsScalar()) {
    if (first.Scalar() == second.Scalar()) return std::nullopt;
    return YamlDifference{prefix, text(first), text(second)};
  }
  if (first.IsSequence()) {
    bool same = first.size() == second.size();
    for (size_t i = 0; same && i < first.size(); ++i) same = !first_difference(first[i], second[i]);
    if (same) return std::nullopt;
    return YamlDifference{prefix, text(first), text(second)};
  }
  for (const auto& entry : first) {
    const std::string key = entry.first.Scalar();
    if (auto d = first_difference(entry.second, second[key], child(key))) return d;
  }
  for (const auto& entry : second) {
    const std::string key = entry.first.Scalar();
    if (!first[key]) return YamlDifference{child(key), "(absent)", text(entry.second)};
  }
  return std::nullopt;
}

}  // namespace extrap
