// Durable writes (core/base/files.h): the new contents reach the disk under a temporary name before
// the rename that publishes them, and the rename itself is made durable by syncing the
// directory. Checked by interposing fsync(2) for this test program: the library's calls
// resolve to the definition below, which records the path of each synced descriptor.
#include "core/base/files.h"
#include "tests/support/test_support.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <mutex>
#include <string>
#include <vector>

namespace {
std::mutex synced_mutex;
std::vector<std::string> synced;  // paths, in call order, while recording
bool recording = false;
}  // namespace

extern "C" int fsync(int fd) {
  {
    std::lock_guard<std::mutex> hold(synced_mutex);
    if (recording) {
      char target[4096];
      const std::string link = "/proc/self/fd/" + std::to_string(fd);
      const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
      synced.push_back(n > 0 ? std::string(target, size_t(n)) : "?");
    }
  }
  return int(::syscall(SYS_fsync, fd));
}

namespace {
std::vector<std::string> record_fsyncs(const std::function<void()>& f) {
  {
    std::lock_guard<std::mutex> hold(synced_mutex);
    synced.clear();
    recording = true;
  }
  f();
  std::lock_guard<std::mutex> hold(synced_mutex);
  recording = false;
  return synced;
}
}  // namespace

TEST_CASE("durable writes fsync the file before publishing it and the directory after", "[files]") {
  extrap::testing::TempDir dir("files");
  const auto root = std::filesystem::canonical(dir.root);
  const auto path = root / "results.h5";
  const auto calls = record_fsyncs([&] { extrap::write_file_atomic(path, "new contents", root / "results.h5.tmp"); });
  INFO([&] {
    std::string all;
    for (const auto& c : calls) all += c + "\n";
    return all;
  }());
  REQUIRE(calls.size() >= 2);
  // The temporary file is synced (under its own name: it is not yet renamed), then the
  // directory that holds the rename.
  const auto file_at = std::find(calls.begin(), calls.end(), (root / "results.h5.tmp").string());
  const auto dir_at = std::find(calls.begin(), calls.end(), root.string());
  CHECK(file_at != calls.end());
  CHECK(dir_at != calls.end());
  CHECK(file_at < dir_at);
  CHECK(extrap::testing::read_text(path) == "new contents");
  CHECK(!std::filesystem::exists(root / "results.h5.tmp"));

  // In place (write_file_durable): the file itself.
  const auto in_place = record_fsyncs([&] { extrap::write_file_durable(root / "log.txt", "x"); });
  CHECK(std::find(in_place.begin(), in_place.end(), (root / "log.txt").string()) != in_place.end());
}
