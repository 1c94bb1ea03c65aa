// One switch caps the CPU: ATEN_CPU_CAPABILITY picks the instruction set of extrap's own kernels
// (core/runtime/cpu_isa.h) as it picks ATen's, and never one the CPU lacks. The expectation is
// read from /proc/cpuinfo's flags, not from the code under test.
#include "core/runtime/cpu_isa.h"
#include "tests/support/cli_harness.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

using namespace extrap;
using namespace extrap::testing;

namespace {
std::set<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::set<std::string> flags;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string flag; words >> flag;) flags.insert(flag);
    break;
  }
  return flags;
}

bool has_all(const std::set<std::string>& flags, std::initializer_list<const char*> wanted) {
  for (const char* f : wanted)
    if (!flags.count(f)) return false;
  return true;
}

struct Isas {
  std::string aten;     // ATen's own report: "AVX512", "AVX2", "NO AVX"
  std::string kernels;  // extrap's kernels: "avx512", "avx2", "baseline"
};

// What `extrap --version` reports with ATEN_CPU_CAPABILITY=`cap` ("" leaves it as is).
Isas isas_under(const TempDir& d, const std::string& cap) {
  const fs::path log = d.root / ("version-" + cap + ".log");
  const std::vector<std::string> env =
      cap.empty() ? std::vector<std::string>{} : std::vector<std::string>{"ATEN_CPU_CAPABILITY=" + cap};
  REQUIRE(wait_exit(spawn(d.root, {"--version"}, log, 0, env)) == 0);
  const std::string text = read_text(log);
  INFO(text);
  const auto field = [&](const std::string& label, const std::string& ends) {
    const auto at = text.find(label);
    REQUIRE(at != std::string::npos);
    const auto begin = at + label.size();
    std::string value = text.substr(begin, text.find_first_of(ends, begin) - begin);
    while (!value.empty() && value.back() == ' ') value.pop_back();
    return value;
  };
  return {field("cpu capability: ", "(\n"), field("extrap's kernels: ", ";")};
}
}  // namespace

TEST_CASE("ATEN_CPU_CAPABILITY caps extrap's kernels with ATen's, never past the CPU", "[isa]") {
#if !(defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__))
  skip_test("extrap's kernels have one variant off x86-64 with GCC");
#else
  const auto flags = cpu_flags();
  if (flags.empty()) {
    skip_test("no /proc/cpuinfo flags to compare with");
    return;
  }
  const bool v3 = has_all(flags, {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "abm"});
  const bool v4 = v3 && has_all(flags, {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"});
  // The kernels take ATen's capability, lowered to what the CPU has.
  const auto expected = [&](const std::string& aten) -> std::string {
    if (aten == "AVX512" && v4) return "avx512";
    if ((aten == "AVX512" || aten == "AVX2") && v3) return "avx2";
    return "baseline";
  };
  TempDir d("isa");
  for (const std::string cap : {"default", "avx2", "avx512", ""}) {
    INFO("ATEN_CPU_CAPABILITY=" << cap);
    const Isas isas = isas_under(d, cap);
    CHECK(isas.kernels == expected(isas.aten));
    if (cap == "default") CHECK(isas.kernels == "baseline");
    if (cap == "avx2") CHECK(isas.kernels == (v3 ? "avx2" : "baseline"));
  }
  // In this process: what the switch in force picks, as the CLI reports it.
  const char* in_force = std::getenv("ATEN_CPU_CAPABILITY");
  CHECK(cpu_isa_name(cpu_isa()) == isas_under(d, in_force ? in_force : "").kernels);
#endif
}
