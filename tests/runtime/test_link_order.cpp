// Every extrap executable loads libstdc++ before any LibTorch library (extrap_libstdcxx_first in
// CMakeLists.txt). LibTorch 2.11's libtorch.so exports its own copy of std::filesystem whose
// remove_all calls a weak symbol nothing defines; an executable that loaded libtorch.so first
// bound remove_all there and crashed on a call through a null pointer (issue 65). The order is
// checked on the running test binary (the dynamic linker's search order is its load order)
// and on the command line's executable; and remove_all must resolve to libstdc++ itself (it is
// not called: extrap removes directories with remove_tree, core/base/files.h, since on the
// H100 the crash outlived this order, NOTES.md).
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <link.h>

#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace {

std::string base_name(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

bool is_libtorch(const std::string& name) { return name.rfind("libtorch", 0) == 0 || name.rfind("libc10", 0) == 0; }

// The position of libstdc++ and of the first LibTorch library in `names` (names.size() if absent).
std::pair<size_t, size_t> positions(const std::vector<std::string>& names) {
  size_t stdcxx = names.size(), torch = names.size();
  for (size_t i = 0; i < names.size(); ++i) {
    if (stdcxx == names.size() && names[i].rfind("libstdc++.so", 0) == 0) stdcxx = i;
    if (torch == names.size() && is_libtorch(names[i])) torch = i;
  }
  return {stdcxx, torch};
}

std::vector<std::string> loaded_objects() {
  std::vector<std::string> names;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        static_cast<std::vector<std::string>*>(out)->push_back(base_name(info->dlpi_name ? info->dlpi_name : ""));
        return 0;
      },
      &names);
  return names;
}

}  // namespace

TEST_CASE("libstdc++ comes before LibTorch in the load order, and std::filesystem resolves to it", "[runtime]") {
  const auto names = loaded_objects();
  const auto [stdcxx, torch] = positions(names);
  INFO("load order: " << Catch::Detail::stringify(names));
  REQUIRE(stdcxx < names.size());
  REQUIRE(torch < names.size());
  CHECK(stdcxx < torch);

  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);
  const RemoveAll remove_all = &std::filesystem::remove_all;
  Dl_info where{};
  REQUIRE(dladdr(reinterpret_cast<void*>(remove_all), &where) != 0);
  CHECK(base_name(where.dli_fname).rfind("libstdc++.so", 0) == 0);
}

#ifdef EXTRAP_CLI
TEST_CASE("the command line's executable names libstdc++ before LibTorch", "[runtime]") {
  std::FILE* pipe = popen(("readelf -d '" + std::string(EXTRAP_CLI) + "' 2>/dev/null").c_str(), "r");
  REQUIRE(pipe);
  std::vector<std::string> needed;
  char line[4096];
  while (std::fgets(line, sizeof line, pipe)) {
    const std::string text = line;
    if (text.find("(NEEDED)") == std::string::npos) continue;
    const auto open = text.find('['), close = text.find(']');
    if (open != std::string::npos && close > open) needed.push_back(text.substr(open + 1, close - open - 1));
  }
  const int status = pclose(pipe);
  if (needed.empty() && status != 0) {
    WARN("readelf is not available: the executable's libraries were not read");
    return;
  }
  INFO("NEEDED: " << Catch::Detail::stringify(needed));
  const auto [stdcxx, torch] = positions(needed);
  REQUIRE(stdcxx < needed.size());
  REQUIRE(torch < needed.size());
  CHECK(stdcxx < torch);
}
#endif
