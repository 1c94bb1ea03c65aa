// Strict YAML option decoding shared by configs and position methods.
//
// Every key is read through OptionReader::read(key, field, help), which (1) decodes the value
// with a type check, (2) marks the key as known and (3) records its documentation. finish()
// then rejects any key nobody read, so a typo is an error naming the file, the line and the
// key. The same read() calls run against a "documenter" (lists every key with its default and
// help text) and a "writer" (emits the current values as YAML), so documentation and
// serialisation can never drift from the decoding code.
#pragma once

#include <yaml-cpp/yaml.h>

#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace extrap {

// A user-facing error in a config, a command line or an input file. The message is complete.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OptionDoc {
  std::string key;            // full dotted path, e.g. "model.heads"
  std::string default_value;  // as YAML text
  std::string help;
};

class OptionReader {
 public:
  // `source` names where `node` came from (a file path); `prefix` is the dotted path of node.
  OptionReader(YAML::Node node, std::string source, std::string prefix = "");
  // A reader with no values that records documentation only.
  static OptionReader documenter(std::string prefix = "");
  // A "reader" that writes each field it is asked for into `out` instead.
  static OptionReader writer(YAML::Node out);

  template <class T>
  void read(const std::string& key, T& field, const std::string& help) const;
  // A string that must be one of `choices`.
  void read_choice(const std::string& key, std::string& field,
                   const std::vector<std::string>& choices, const std::string& help) const;
  // A nested map; missing or null reads as empty (all defaults).
  OptionReader section(const std::string& key, const std::string& help) const;
  // Marks a key as known without decoding it (its value is read elsewhere).
  void accept(const std::string& key, const std::string& help) const;

  // Throws ConfigError for the first key that no read() asked for.
  void finish() const;

  bool has(const std::string& key) const;
  bool documenting() const { return state_->mode == Mode::Document; }
  bool writing() const { return state_->mode == Mode::Write; }
  bool decoding() const { return state_->mode == Mode::Read; }
  const std::string& source() const { return state_->source; }
  const std::string& prefix() const { return prefix_; }
  YAML::Node node() const { return node_; }
  std::vector<OptionDoc> docs() const { return state_->docs; }
  std::string full_key(const std::string& key) const;
  // "file.yaml:12: key 'model.heads'" (or "... (set on the command line)").
  std::string locate(const std::string& key) const;
  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  enum class Mode { Read, Document, Write };
  struct State {
    Mode mode = Mode::Read;
    std::string source;
    std::vector<OptionDoc> docs;
  };
  OptionReader(YAML::Node node, std::shared_ptr<State> state, std::string prefix);
  void note(const std::string& key, const std::string& default_value,
            const std::string& help) const;
  YAML::Node node_;
  std::shared_ptr<State> state_;
  std::string prefix_;
  std::shared_ptr<std::set<std::string>> used_ = std::make_shared<std::set<std::string>>();
};

// Applies "a.b.c=value" (value parsed as YAML) to `root`, creating maps as needed.
void apply_override(YAML::Node& root, const std::string& assignment);

// Loads a YAML file; a parse error names the file and line.
YAML::Node load_yaml_file(const std::string& path);

std::string yaml_to_string(const YAML::Node& node);

// --- template definition ---------------------------------------------------------------

namespace detail {
template <class T>
std::string type_name();
template <class T>
std::string format_default(const T& value);
}  // namespace detail

template <class T>
void OptionReader::read(const std::string& key, T& field, const std::string& help) const {
  note(key, detail::format_default(field), help + " (" + detail::type_name<T>() + ")");
  if (writing()) {
    YAML::Node out = node_;  // a handle on the same tree
    out[key] = field;
    return;
  }
  if (!has(key)) return;
  const YAML::Node value = node_[key];
  try {
    field = value.as<T>();
  } catch (const YAML::Exception&) {
    fail(key, "expected " + detail::type_name<T>() + ", got '" + yaml_to_string(value) + "'");
  }
}

}  // namespace extrap
