// Files that must be whole or absent: durable atomic writes, errors that name the file and
// say why (a full disk is "no space left on device", not an abort), and one-writer locks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <system_error>
#include <string>
#include <string_view>

namespace extrap {

// A ConfigError "PATH: cannot write: no space left on device" (or the system's reason for
// `error`, an errno value).
[[noreturn]] void throw_write_error(const std::string& path, int error);
// The reason for an errno value from a write, in words.
std::string write_error_reason(int error);

// Writes all of `bytes` to the open file `fd`: 0, or the errno value of the write that failed
// (ENOSPC for one that wrote nothing).
int write_all(int fd, std::string_view bytes);

// Writes `bytes` (or `parts`, one after the other) to `path` (created or truncated) and fsyncs it.
void write_file_durable(const std::filesystem::path& path, std::string_view bytes);
void write_file_durable(const std::filesystem::path& path,
                        std::initializer_list<std::string_view> parts);
// Writes `bytes` (or `parts`) to a temporary file beside `path`, fsyncs it, renames it over
// `path` and fsyncs the directory: readers see the old file or the new one, never a part.
// `tmp`: the temporary file's name (default PATH.tmp.<pid>). A failed write is a ConfigError
// "TMP: cannot write: REASON (PATH is unchanged)", and the temporary file is removed.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes,
                       const std::filesystem::path& tmp = {});
void write_file_atomic(const std::filesystem::path& path,
                       std::initializer_list<std::string_view> parts,
                       const std::filesystem::path& tmp = {});
// Removes the files write_file_atomic left in `directory` (its own entries, not below) when a
// process was killed between writing and renaming: NAME.tmp.<pid> where no process <pid> runs
// any more. Call it only while holding the directory's lock. Returns how many it removed.
int remove_stale_temporaries(const std::filesystem::path& directory);
void fsync_directory(const std::filesystem::path& directory);
// Makes `tmp` durable and moves it over `path` in one step (rename, then fsync the directory).
void publish_file(const std::filesystem::path& tmp, const std::filesystem::path& path);
std::string read_file(const std::filesystem::path& path);  // ConfigError naming it
// Refuses, before the work that would write it, a new file at `path` whose folder does not exist
// or cannot be written: ConfigError "WHO: the directory D does not exist" (or "is not writable
// (REASON)"). `who` names the option and path ("extrap eval --json out/r.json", "--out m.safetensors").
void check_output_folder(const std::filesystem::path& path, const std::string& who);

// Removes `path` and, where it is a directory, everything under it (a symbolic link itself,
// never what it points to): what std::filesystem::remove_all does, which extrap never calls.
// LibTorch 2.11's libtorch.so exports its own remove_all, which calls a symbol nothing defines
// (a call through a null pointer), and a program that loads libtorch.so before libstdc++ binds
// to it (issue 65; core/attention/cuda/NOTES.md). A missing path, or an entry another process
// removed meanwhile, is no error. Returns the number of entries removed; the first error
// stops it, set in `error` (or thrown as std::filesystem::filesystem_error).
std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& error);
std::uintmax_t remove_tree(const std::filesystem::path& path);

// An exclusive, non-blocking flock on `lock_path`, held for the object's lifetime (the kernel
// releases it when the process dies, kill -9 included). The holder's pid is written into the
// file. When another process holds it: ConfigError "SUBJECT is being ACTIVITY by another extrap
// process (pid N, lock LOCK_PATH); ADVICE".
class FileLock {
 public:
  FileLock(const std::filesystem::path& lock_path, const std::string& subject,
           const std::string& activity, const std::string& advice);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

// A blocking flock on `lock_path`, shared or exclusive, held for the object's lifetime: readers
// of a set of files that a writer swaps in by renames (a checkpoint) take it shared, the writer
// exclusive for the swap alone, so that no reader sees the set half-swapped. The lock file is
// created when missing; a reader that cannot create or open it (a read-only directory, where no
// writer can swap either) goes on without it.
class SharedFileLock {
 public:
  enum class Mode { shared, exclusive };
  SharedFileLock(const std::filesystem::path& lock_path, Mode mode);
  ~SharedFileLock();
  SharedFileLock(const SharedFileLock&) = delete;
  SharedFileLock& operator=(const SharedFileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace extrap
