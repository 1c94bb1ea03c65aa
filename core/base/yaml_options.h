// Strict YAML option decoding shared by configs and position methods.
//
// Every key is read through OptionReader::read(key, field, help), which (1) decodes the value
// with a type check, (2) marks the key as known and (3) records its documentation. finish()
// then rejects any key nobody read, so a typo is an error naming the file, the line and the
// key. The same read() calls run against a "documenter" (lists every key with its default and
// help text) and a "writer" (emits the current values as YAML), so documentation and
// serialisation can never drift from the decoding code.
#pragma once

#include "core/base/errors.h"

#include <yaml-cpp/yaml.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace extrap {

// What a key's value changes. Declared once, at the key (OptionReader::read); the run
// fingerprint (a trained model's identity), the sweep spec hash and the resume check are all
// derived from these marks.
enum class Affects {
  model,       // the trained model: part of the run fingerprint and of the spec hash
  evaluation,  // the recorded numbers but not the model (lengths, split, validation): spec hash
  nothing,     // where files go, threads, logging, implementation choices of equal maths
};
const char* to_string(Affects affects);

struct OptionDoc {
  std::string key;            // full dotted path, e.g. "model.heads"
  std::string default_value;  // as YAML text
  std::string help;
  Affects affects = Affects::model;
  bool section = false;  // a map of keys (each with its own mark)
};

// The names of an enum's values, for config keys and command-line options. Specialise with a
// static `table`: an array of {name, value} pairs (see core/model/config.h).
template <class E>
struct EnumNames;

template <class E>
std::string enum_name(E value) {
  for (const auto& [name, v] : EnumNames<E>::table)
    if (v == value) return name;
  return "?";
}
template <class E>
std::string enum_choices() {
  std::string joined;
  for (const auto& entry : EnumNames<E>::table) joined += (joined.empty() ? "" : " | ") + std::string(entry.first);
  return joined;
}
// The value called `text`; nullopt when none is.
template <class E>
std::optional<E> find_enum(const std::string& text) {
  for (const auto& [name, v] : EnumNames<E>::table)
    if (text == name) return v;
  return std::nullopt;
}
// The value called `text`, or a ConfigError "WHAT: 'text' is not one of a | b".
template <class E>
E parse_enum(const std::string& text, const std::string& what) {
  if (auto v = find_enum<E>(text)) return *v;
  throw ConfigError(what + ": '" + text + "' is not one of " + enum_choices<E>());
}

class OptionReader {
 public:
  // `source` names where `node` came from (a file path); `prefix` is the dotted path of node.
  OptionReader(YAML::Node node, std::string source, std::string prefix = "");
  // A reader with no values that records documentation only.
  static OptionReader documenter(std::string prefix = "");
  // A "reader" that writes each field it is asked for into `out` instead.
  static OptionReader writer(YAML::Node out);

  // Decodes `key` into `field` (kept when absent). An enum field reads one of its names
  // (EnumNames). `affects` says what a change of the value changes.
  template <class T>
  void read(const std::string& key, T& field, const std::string& help,
            Affects affects = Affects::model) const;
  // A nested map; missing or null reads as empty (all defaults).
  OptionReader section(const std::string& key, const std::string& help) const;
  // Marks a key as known without decoding it (its value is read elsewhere).
  void accept(const std::string& key, const std::string& help,
              Affects affects = Affects::model) const;

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

  // The shared range checks on decoded values (lists of evaluation lengths have theirs in
  // check_eval_lengths, core/model/config.h). Each fails at `key` with the
  // value in the message, and does nothing unless decoding (defaults are not re-checked).
  //   at_least:      "must be at least M, got V" ("must not be negative" for M = 0); `note`
  //                  goes before ", got", e.g. " (0: all cores)"
  //   above:         "must be greater than B, got V" ("must be positive" for B = 0)
  //   in_range:      "must be in [low, high), got V"; `ends` says which ends belong: "[)",
  //                  "(]", "[]" or "()"
  template <class T>
  void at_least(const std::string& key, T value, typename std::common_type<T>::type minimum,
                const std::string& note = "") const;
  void above(const std::string& key, double value, double bound,
             const std::string& note = "") const;
  void in_range(const std::string& key, double value, double low, double high,
                const std::string& ends = "[)") const;

 private:
  enum class Mode { Read, Document, Write };
  struct State {
    Mode mode = Mode::Read;
    std::string source;
    std::vector<OptionDoc> docs;
  };
  OptionReader(YAML::Node node, std::shared_ptr<State> state, std::string prefix);
  [[noreturn]] void fail_below(const std::string& key, const std::string& minimum, bool zero,
                               const std::string& note, const std::string& value) const;
  void note(const std::string& key, const std::string& default_value, const std::string& help,
            Affects affects) const;
  YAML::Node node_;
  std::shared_ptr<State> state_;
  std::string prefix_;
  std::shared_ptr<std::set<std::string>> used_ = std::make_shared<std::set<std::string>>();
};

// A copy of `node` with no source marks, so that errors report it as set on the command line.
YAML::Node without_marks(const YAML::Node& node);

// Applies "a.b.c=value" (value parsed as YAML) to `root`, creating maps as needed.
void apply_override(YAML::Node& root, const std::string& assignment);

// Parses YAML text read from `source` (a file's path, for messages). A syntax error, or a key
// given twice in one map (yaml-cpp would keep the first silently), is a ConfigError naming
// SOURCE:LINE. An empty document is an empty map.
YAML::Node parse_yaml_text(const std::string& text, const std::string& source);
// Reads and parses a YAML file as parse_yaml_text does; a file that cannot be read (missing, a
// directory) is a ConfigError naming it.
YAML::Node load_yaml_file(const std::string& path);

std::string yaml_to_string(const YAML::Node& node);
// One-line YAML of a node, whatever styles its collections were read with.
std::string flow_text(const YAML::Node& node);
// A copy with every collection in block style and every scalar a plain string, so that text
// (and a hash of it) does not depend on how the file happened to write a list.
YAML::Node plain_yaml(const YAML::Node& node);
// Removes the dotted key `dotted` from `root` (nothing when absent).
void remove_key(YAML::Node root, const std::string& dotted);

// The first key at which two documents differ, with both values as one-line YAML ("(absent)"
// when missing on that side).
struct YamlDifference {
  std::string key;  // dotted, e.g. "train.steps"
  std::string first;
  std::string second;
};
std::optional<YamlDifference> first_difference(const YAML::Node& first, const YAML::Node& second,
                                               const std::string& prefix = "");

// --- template definition ---------------------------------------------------------------

namespace detail {
template <class T>
std::string type_name();
template <class T>
std::string format_default(const T& value);

// Why a scalar cannot be read as written as a number, an integer or true/false ("" if it can):
// quoted or tagged a string ("20", !!str 0.5), or for an integer anything but plain decimal
// digits (yaml-cpp would read 010 as octal 8 and 0x14 as hexadecimal 20).
std::string scalar_problem(const YAML::Node& value, bool integer);

// The scalar problems of a value read as T: its own, or its first item's for a list.
template <class T>
std::string value_problem(const YAML::Node& value) {
  if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<double>>) {
    if (!value.IsSequence()) return "";
    for (const auto& item : value)
      if (auto problem = value_problem<typename T::value_type>(item); !problem.empty()) return problem;
    return "";
  } else if constexpr (std::is_arithmetic_v<T>) {
    return value.IsScalar() ? scalar_problem(value, std::is_integral_v<T> && !std::is_same_v<T, bool>) : "";
  } else {
    return "";
  }
}
}  // namespace detail

template <class T>
void OptionReader::read(const std::string& key, T& field, const std::string& help,
                        Affects affects) const {
  if constexpr (std::is_enum_v<T>) {
    const std::string choices = enum_choices<T>();
    note(key, enum_name(field), help + " (" + choices + ")", affects);
    if (writing()) {
      YAML::Node out = node_;  // a handle on the same tree
      out[key] = enum_name(field);
      return;
    }
    if (!has(key)) return;
    const YAML::Node value = node_[key];
    const auto found = value.IsScalar() ? find_enum<T>(value.Scalar()) : std::nullopt;
    if (!found) fail(key, "'" + yaml_to_string(value) + "' is not one of " + choices);
    field = *found;
  } else {
    note(key, detail::format_default(field), help + " (" + detail::type_name<T>() + ")", affects);
    if (writing()) {
      YAML::Node out = node_;  // a handle on the same tree
      out[key] = field;
      return;
    }
    if (!has(key)) return;
    const YAML::Node value = node_[key];
    if (auto problem = detail::value_problem<T>(value); !problem.empty())
      fail(key, "expected " + detail::type_name<T>() + ", got " + problem);
    try {
      field = value.as<T>();
    } catch (const YAML::Exception&) {
      fail(key, "expected " + detail::type_name<T>() + ", got '" + yaml_to_string(value) + "'");
    }
    // No key takes an infinity or a NaN (.inf, .nan): each would reach the maths as it is.
    if constexpr (std::is_floating_point_v<T>)
      if (!std::isfinite(field)) fail(key, "must be a finite number, got '" + yaml_to_string(value) + "'");
  }
}

template <class T>
void OptionReader::at_least(const std::string& key, T value,
                            typename std::common_type<T>::type minimum,
                            const std::string& note) const {
  static_assert(std::is_arithmetic_v<T>, "at_least checks numbers");
  // !(value >= minimum) also refuses NaN.
  if (!decoding() || value >= minimum) return;
  if constexpr (std::is_floating_point_v<T>)
    fail_below(key, number_text(minimum), minimum == 0, note, number_text(value));
  else
    fail_below(key, std::to_string(minimum), minimum == 0, note, std::to_string(value));
}

}  // namespace extrap
