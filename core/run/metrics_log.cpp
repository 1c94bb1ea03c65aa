#include "core/run/metrics_log.h"

#include "core/base/errors.h"
#include "core/base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace extrap {

namespace {

// The step of a whole line, or -1 when the line is not a record.
int64_t record_step(std::string_view line) {
  const json record = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
    return -1;
  return record["step"].get<int64_t>();
}

// The length of the prefix of `text` made of whole records of steps up to `step`, increasing.
size_t kept_prefix(const std::string& text, int64_t step) {
  size_t kept = 0;
  int64_t previous = -1;
  while (kept < text.size()) {
    const size_t end = text.find('\n', kept);
    if (end == std::string::npos) break;  // a torn last line
    const int64_t line_step = record_step(std::string_view(text).substr(kept, end - kept));
    if (line_step < 0 || line_step <= previous) break;  // not a record, or out of order
    if (line_step > step) break;                        // written after the checkpoint
    previous = line_step;
    kept = end + 1;
  }
  return kept;
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& path, int64_t step) : path_(path) {
  const std::string text = fs::exists(path) ? read_file(path) : std::string();
  const size_t kept = step > 0 ? kept_prefix(text, step) : 0;
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_write_error(path.string(), errno);
  if (::ftruncate(fd_, off_t(kept)) != 0 || ::lseek(fd_, off_t(kept), SEEK_SET) < 0 ||
      ::fdatasync(fd_) != 0) {
    const int error = errno;
    ::close(fd_);
    throw_write_error(path.string(), error);
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::append(const nlohmann::ordered_json& record) {
  const std::string line = record.dump() + "\n";
  const off_t start = ::lseek(fd_, 0, SEEK_CUR);
  if (const int error = write_all(fd_, line)) {
    // No torn line stays behind for a reader (a resumption would cut it anyway).
    if (start >= 0 && ::ftruncate(fd_, start) == 0) ::lseek(fd_, start, SEEK_SET);
    throw_write_error(path_.string(), error);
  }
  if (::fdatasync(fd_) != 0) throw_write_error(path_.string(), errno);
}

std::vector<json> read_metrics(const fs::path& path) {
  const std::string text = read_file(path);
  std::vector<json> records;
  size_t begin = 0;
  for (int line = 1; begin < text.size(); ++line) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    json record = json::parse(text.substr(begin, end - begin), nullptr, false);
    if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer())
      throw ConfigError(path.string() + ": line " + std::to_string(line) +
                        " is not a metrics record (a JSON object with an integer \"step\")");
    records.push_back(std::move(record));
    begin = end + 1;
  }
  return records;
}

}  // namespace extrap
