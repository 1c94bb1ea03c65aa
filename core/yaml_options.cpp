#include "core/yaml_options.h"

#include <sstream>

namespace extrap {

namespace detail {
template <> std::string type_name<int>() { return "integer"; }
template <> std::string type_name<int64_t>() { return "integer"; }
template <> std::string type_name<double>() { return "number"; }
template <> std::string type_name<bool>() { return "true/false"; }
template <> std::string type_name<std::string>() { return "string"; }
template <> std::string type_name<std::vector<int64_t>>() { return "list of integers"; }
template <> std::string type_name<std::vector<double>>() { return "list of numbers"; }
template <> std::string type_name<std::vector<std::string>>() { return "list of strings"; }

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
                        const std::string& help) const {
  used_->insert(key);
  if (documenting()) state_->docs.push_back({full_key(key), default_value, help});
}

std::string OptionReader::locate(const std::string& key) const {
  // A node set with --set has no mark; a missing key is located at its enclosing map.
  YAML::Mark mark = YAML::Mark::null_mark();
  if (decoding() && node_ && node_.IsMap()) mark = node_[key] ? node_[key].Mark() : node_.Mark();
  std::ostringstream out;
  out << state_->source;
  if (!mark.is_null()) out << ":" << mark.line + 1;
  out << ": key '" << full_key(key) << "'";
  if (mark.is_null() && decoding()) out << " (set on the command line)";
  return out.str();
}

void OptionReader::fail(const std::string& key, const std::string& message) const {
  throw ConfigError(locate(key) + ": " + message);
}

void OptionReader::read_choice(const std::string& key, std::string& field,
                               const std::vector<std::string>& choices,
                               const std::string& help) const {
  std::string joined;
  for (const auto& c : choices) joined += (joined.empty() ? "" : " | ") + c;
  note(key, field, help + " (" + joined + ")");
  if (writing()) {
    YAML::Node out = node_;  // a handle on the same tree
    out[key] = field;
    return;
  }
  if (!has(key)) return;
  std::string value;
  try {
    value = node_[key].as<std::string>();
  } catch (const YAML::Exception&) {
    fail(key, "expected one of " + joined + ", got '" + yaml_to_string(node_[key]) + "'");
  }
  for (const auto& c : choices)
    if (c == value) {
      field = value;
      return;
    }
  fail(key, "'" + value + "' is not one of " + joined);
}

OptionReader OptionReader::section(const std::string& key, const std::string& help) const {
  note(key, "{}", help);
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

void OptionReader::accept(const std::string& key, const std::string& help) const {
  note(key, "", help);
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

namespace {
// A copy of `node` with no source marks, so that errors report it as set on the command line.
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
}  // namespace

void apply_override(YAML::Node& root, const std::string& assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set '" + assignment + "': expected key.path=value");
  const std::string path = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  YAML::Node value;
  try {
    value = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set '" + assignment + "': value is not valid YAML: " + e.msg);
  }
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

YAML::Node load_yaml_file(const std::string& path) {
  try {
    YAML::Node node = YAML::LoadFile(path);
    if (!node) node = YAML::Node(YAML::NodeType::Map);
    return node;
  } catch (const YAML::BadFile&) {
    throw ConfigError(path + ": cannot open the file");
  } catch (const YAML::ParserException& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
}

std::string yaml_to_string(const YAML::Node& node) {
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

}  // namespace extrap
