// Durable writes (core/base/files.h): the new contents reach the disk under a temporary name before
// the rename that publishes them, and the rename itself is made durable by syncing the
// directory. Checked by interposing fsync(2) for this test program: the library's calls
// resolve to the definition below, which records the path of each synced descriptor.
#include "core/base/files.h"
#include "tests/support/test_support.h"

#include <sys/syscall.h>
#include <sys/wait.h>
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

TEST_CASE("remove_tree removes a directory and what is under it, a link but not its target", "[files]") {
  namespace fs = std::filesystem;
  extrap::testing::TempDir d("remove-tree");
  const fs::path tree = d.root / "tree", kept = d.root / "kept";
  fs::create_directories(tree / "a" / "b" / "c");
  fs::create_directories(tree / "empty");
  fs::create_directories(kept);
  for (const fs::path& file : {tree / "top.txt", tree / "a" / "one", tree / "a" / "b" / "c" / "deep"})
    extrap::write_file_durable(file, "x");
  extrap::write_file_durable(kept / "target", "stays");
  fs::create_symlink(kept, tree / "a" / "link-to-dir");
  fs::create_symlink(kept / "target", tree / "link-to-file");
  // tree, a, b, c, empty, 3 files, 2 links.
  std::error_code error;
  CHECK(extrap::remove_tree(tree, error) == 10);
  CHECK(!error);
  CHECK(!fs::exists(fs::symlink_status(tree)));
  CHECK(extrap::read_file(kept / "target") == "stays");  // the links' targets stay

  CHECK(extrap::remove_tree(tree, error) == 0);  // missing: nothing to do, no error
  CHECK(!error);
  CHECK(extrap::remove_tree(kept / "target") == 1);  // a file
  CHECK(!fs::exists(kept / "target"));

  if (geteuid() != 0) {  // root may remove from a read-only directory
    fs::create_directories(kept / "locked" / "inside");
    fs::permissions(kept / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    CHECK(extrap::remove_tree(kept / "locked", error) == 0);
    CHECK(error == std::errc::permission_denied);
    CHECK_THROWS_AS(extrap::remove_tree(kept / "locked"), fs::filesystem_error);
    fs::permissions(kept / "locked", fs::perms::owner_all);
  }
}

TEST_CASE("remove_stale_temporaries removes what a killed writer left, nothing a live one writes",
          "[files]") {
  namespace fs = std::filesystem;
  extrap::testing::TempDir d("stale-temporaries");
  const pid_t child = fork();  // a pid that ran and is gone
  if (child == 0) _exit(0);
  REQUIRE(child > 0);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  const std::string dead = std::to_string(child), alive = std::to_string(getpid());
  for (const std::string& name : {"config.yaml.tmp." + dead, "config.yaml.tmp." + alive, "eval.json.tmp." + dead,
                                 "notes.tmp.x" + dead, ".tmp." + dead, std::string("config.yaml")})
    extrap::write_file_durable(d.root / name, "x");
  fs::create_directories(d.root / "checkpoint");
  extrap::write_file_durable(d.root / "checkpoint" / ("model.pt.tmp." + dead), "x");  // not below
  CHECK(extrap::remove_stale_temporaries(d.root) == 2);
  CHECK(!fs::exists(d.root / ("config.yaml.tmp." + dead)));
  CHECK(!fs::exists(d.root / ("eval.json.tmp." + dead)));
  for (const std::string& name : {"config.yaml.tmp." + alive, "notes.tmp.x" + dead, ".tmp." + dead, std::string("config.yaml"),
                                 "checkpoint/model.pt.tmp." + dead})
    CHECK(fs::exists(d.root / name));
}
