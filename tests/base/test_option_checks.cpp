// The options reader's shared range checks: each names the key and the value,
// refuses NaN, and does nothing while documenting or writing.
#include "core/base/yaml_options.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace extrap;

namespace {
// The message of the ConfigError `check` throws against a reader of `yaml`; "" when none.
template <class Check>
std::string refusal(const std::string& yaml, Check check) {
  const OptionReader r(YAML::Load(yaml), "opts.yaml", "sec");
  try {
    check(r);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}
const double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace

TEST_CASE("options: at_least names the key, the bound and the value", "[config]") {
  CHECK(refusal("n: 0", [](auto& r) { r.at_least("n", int64_t{0}, 1); }) ==
        "opts.yaml:1: key 'sec.n': must be at least 1, got 0");
  CHECK(refusal("n: 1", [](auto& r) { r.at_least("n", int64_t{1}, 1); }).empty());
  CHECK(refusal("n: -3", [](auto& r) { r.at_least("n", -3, 0, " (0: off)"); }) ==
        "opts.yaml:1: key 'sec.n': must not be negative (0: off), got -3");
  CHECK(refusal("x: 0.5", [](auto& r) { r.at_least("x", 0.5, 1.0); }) ==
        "opts.yaml:1: key 'sec.x': must be at least 1, got 0.5");
  CHECK(refusal("x: .nan", [](auto& r) { r.at_least("x", kNaN, 1.0); }) ==
        "opts.yaml:1: key 'sec.x': must be at least 1, got nan");
  // A key the document does not give is located at its section.
  CHECK(refusal("other: 1", [](auto& r) { r.at_least("n", int64_t{0}, 1); }) ==
        "opts.yaml:1: key 'sec.n': must be at least 1, got 0");
}

TEST_CASE("options: above and in_range include or exclude their ends as asked", "[config]") {
  CHECK(refusal("x: 0", [](auto& r) { r.above("x", 0.0, 0); }) ==
        "opts.yaml:1: key 'sec.x': must be positive, got 0");
  CHECK(refusal("x: 1", [](auto& r) { r.above("x", 1.0, 1); }) ==
        "opts.yaml:1: key 'sec.x': must be greater than 1, got 1");
  CHECK(refusal("x: 1.5", [](auto& r) { r.above("x", 1.5, 1); }).empty());
  CHECK(!refusal("x: .nan", [](auto& r) { r.above("x", kNaN, 0); }).empty());

  struct Case {
    double value;
    const char* ends;
    bool refused;
  };
  for (const Case& c : std::vector<Case>{{0, "[)", false}, {1, "[)", true}, {0, "()", true},
                                        {1, "(]", false}, {0, "(]", true}, {1, "[]", false},
                                        {0.5, "()", false}, {-0.1, "[]", true}, {kNaN, "[]", true},
                                        {std::numeric_limits<double>::infinity(), "[]", true}}) {
    INFO(c.value << " in " << c.ends);
    const std::string message = refusal("x: 0", [&](auto& r) { r.in_range("x", c.value, 0, 1, c.ends); });
    CHECK(message.empty() == !c.refused);
  }
  CHECK(refusal("x: 1", [](auto& r) { r.in_range("x", 1.0, 0, 1); }) ==
        "opts.yaml:1: key 'sec.x': must be in [0, 1), got 1");
  CHECK(refusal("x: 0", [](auto& r) { r.in_range("x", 0.0, 0, 20, "(]"); }) ==
        "opts.yaml:1: key 'sec.x': must be in (0, 20], got 0");
  // A malformed `ends` is a programming error, not a user's.
  CHECK_THROWS_AS(refusal("x: 0", [](auto& r) { r.in_range("x", 0.5, 0, 1, "[["); }), std::logic_error);
}

TEST_CASE("options: the checks are silent while documenting or writing", "[config]") {
  const OptionReader documenter = OptionReader::documenter("sec");
  CHECK_NOTHROW(documenter.at_least("n", int64_t{0}, 1));
  CHECK_NOTHROW(documenter.above("x", 0.0, 0));
  CHECK_NOTHROW(documenter.in_range("x", 2.0, 0, 1));
  YAML::Node out;
  const OptionReader writer = OptionReader::writer(out);
  CHECK_NOTHROW(writer.at_least("n", int64_t{0}, 1));
}
