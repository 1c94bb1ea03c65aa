#include "core/base/files.h"

#include "core/base/errors.h"
#include "core/base/fault.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace fs = std::filesystem;

namespace extrap {

std::string write_error_reason(int error) {
  switch (error) {
    case ENOSPC: return "no space left on device";
    case EDQUOT: return "disk quota exceeded";
    case EFBIG: return "file size limit exceeded";
    default: return std::strerror(error);
  }
}

void throw_write_error(const std::string& path, int error) {
  throw ConfigError(path + ": cannot write: " + write_error_reason(error));
}

int write_all(int fd, std::string_view bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 ? errno : ENOSPC;
    done += size_t(n);
  }
  return 0;
}

void write_file_durable(const fs::path& path, std::initializer_list<std::string_view> parts) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_write_error(path.string(), errno);
  for (std::string_view bytes : parts) {
    if (const int error = write_all(fd, bytes)) {
      ::close(fd);
      throw_write_error(path.string(), error);
    }
  }
  if (::fsync(fd) != 0) {
    const int error = errno;
    ::close(fd);
    throw_write_error(path.string(), error);
  }
  if (::close(fd) != 0) throw_write_error(path.string(), errno);
}

void write_file_durable(const fs::path& path, std::string_view bytes) {
  write_file_durable(path, {bytes});
}

void fsync_directory(const fs::path& directory) {
  const int fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // not fatal: the rename itself happened
  ::fsync(fd);
  ::close(fd);
}

void publish_file(const fs::path& tmp, const fs::path& path) {
  const int fd = ::open(tmp.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_write_error(tmp.string(), errno);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) throw_write_error(tmp.string(), error);
  std::error_code failed;
  fs::rename(tmp, path, failed);
  if (failed)
    throw ConfigError(path.string() + ": cannot replace: " + failed.message() + " (" +
                      path.string() + " is unchanged)");
  fsync_directory(fs::absolute(path).parent_path());
}

void write_file_atomic(const fs::path& path, std::initializer_list<std::string_view> parts,
                       const fs::path& tmp_name) {
  const fs::path tmp =
      tmp_name.empty() ? fs::path(path.string() + ".tmp." + std::to_string(::getpid())) : tmp_name;
  try {
    write_file_durable(tmp, parts);
  } catch (const ConfigError& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw ConfigError(std::string(e.what()) + " (" + path.string() + " is unchanged)");
  }
  fault_point("publish", path.string());
  try {
    publish_file(tmp, path);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

int remove_stale_temporaries(const fs::path& directory) {
  int removed = 0;
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const auto at = name.rfind(".tmp.");
    if (at == std::string::npos || at == 0) continue;
    const std::string digits = name.substr(at + 5);
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = pid_t(std::stol(digits));
    if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (this process too), or not ours to judge
    std::error_code ignored;
    if (it->is_regular_file(ignored) && fs::remove(it->path(), ignored)) ++removed;
  }
  return removed;
}

void write_file_atomic(const fs::path& path, std::string_view bytes, const fs::path& tmp_name) {
  write_file_atomic(path, {bytes}, tmp_name);
}

void check_output_folder(const std::filesystem::path& path, const std::string& who) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path folder = fs::absolute(path, error).parent_path();
  if (!fs::is_directory(folder, error))
    throw ConfigError(who + ": the directory " + folder.string() + " does not exist");
  if (::access(folder.c_str(), W_OK | X_OK) != 0)
    throw ConfigError(who + ": the directory " + folder.string() + " is not writable (" + std::strerror(errno) + ")");
}

std::string read_file(const fs::path& path) {
  std::error_code error;
  if (fs::is_directory(path, error)) throw ConfigError(path.string() + ": is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError(path.string() + ": cannot read (" + std::strerror(errno) + ")");
  std::ostringstream out;
  if (in.peek() != std::ifstream::traits_type::eof()) out << in.rdbuf();
  if (in.bad() || out.bad()) throw ConfigError(path.string() + ": cannot read (" + std::strerror(errno) + ")");
  return out.str();
}

FileLock::FileLock(const fs::path& lock_path, const std::string& subject,
                   const std::string& activity, const std::string& advice) {
  std::error_code ignored;
  if (lock_path.has_parent_path()) fs::create_directories(lock_path.parent_path(), ignored);
  fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw ConfigError("cannot open the lock file " + lock_path.string() + ": " +
                      std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[64] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof(holder) - 1, 0);
    ::close(fd_);
    fd_ = -1;
    if (error != EWOULDBLOCK)
      throw ConfigError("cannot lock " + lock_path.string() + ": " + std::strerror(error));
    std::string pid = n > 0 ? std::string(holder, size_t(n)) : "unknown";
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    throw ConfigError(subject + " is being " + activity + " by another extrap process (pid " + pid +
                      ", lock " + lock_path.string() + "); " + advice);
  }
  // Best effort: the pid is for the message above, the flock is the lock.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t n = ::pwrite(fd_, pid.data(), pid.size(), 0);
  }
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

SharedFileLock::SharedFileLock(const fs::path& lock_path, Mode mode) {
  fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0 && mode == Mode::shared) fd_ = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    if (mode == Mode::shared) return;  // read-only: nobody swaps files here
    throw ConfigError("cannot open the lock file " + lock_path.string() + ": " + std::strerror(errno));
  }
  while (::flock(fd_, mode == Mode::shared ? LOCK_SH : LOCK_EX) != 0) {
    if (errno == EINTR) continue;
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    throw ConfigError("cannot lock " + lock_path.string() + ": " + std::strerror(error));
  }
}

SharedFileLock::~SharedFileLock() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// Removes the entry `name` of the directory open as `dir` (AT_FDCWD: the working directory),
// depth first; the count of entries removed. ENOENT anywhere means another remover was first.
std::uintmax_t remove_entry(int dir, const char* name, std::error_code& error) {
  const auto fail = [&](std::uintmax_t removed) {
    if (errno != ENOENT) error.assign(errno, std::generic_category());
    return removed;
  };
  struct stat status {};
  if (fstatat(dir, name, &status, AT_SYMLINK_NOFOLLOW) != 0) return fail(0);
  std::uintmax_t removed = 0;
  if (S_ISDIR(status.st_mode)) {
    const int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return fail(0);
    DIR* stream = fdopendir(fd);
    if (!stream) {
      const int reason = errno;
      close(fd);
      errno = reason;
      return fail(0);
    }
    // The names first: a directory is not changed while it is being read.
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const dirent* entry = readdir(stream);
      if (!entry) break;
      if (std::strcmp(entry->d_name, ".") != 0 && std::strcmp(entry->d_name, "..") != 0) names.push_back(entry->d_name);
    }
    if (errno != 0) {
      const int reason = errno;
      closedir(stream);
      errno = reason;
      return fail(0);
    }
    for (const std::string& child : names) {
      removed += remove_entry(dirfd(stream), child.c_str(), error);
      if (error) break;
    }
    closedir(stream);
    if (error) return removed;
    if (unlinkat(dir, name, AT_REMOVEDIR) != 0) return fail(removed);
  } else if (unlinkat(dir, name, 0) != 0) {
    return fail(removed);
  }
  return removed + 1;
}

}  // namespace

std::uintmax_t remove_tree(const fs::path& path, std::error_code& error) {
  error.clear();
  return remove_entry(AT_FDCWD, path.c_str(), error);
}

std::uintmax_t remove_tree(const fs::path& path) {
  std::error_code error;
  const std::uintmax_t removed = remove_tree(path, error);
  if (error) throw fs::filesystem_error("cannot remove", path, error);
  return removed;
}

}  // namespace extrap
