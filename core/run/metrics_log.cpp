#include "core/run/metrics_log.h"

#include "core/base/errors.h"
#include "core/base/files.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>

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

// The lines of `text` a run continuing from `step` keeps: every whole record of a step up to
// `step`, in increasing step order. A line that is not a record, or whose step does not follow
// the last kept one (a duplicated or out-of-order line), is skipped and described in `skipped`;
// records of later steps (written after the checkpoint) and a torn last line are cut silently.
struct KeptLines {
  std::vector<std::pair<int64_t, std::string>> lines;  // (step, the line with its '\n')
  bool prefix = true;  // whether they are the file's first bytes (truncating keeps them)
  std::vector<std::string> skipped;
};

KeptLines kept_lines(const std::string& text, int64_t step) {
  KeptLines out;
  int64_t previous = -1;
  size_t begin = 0, kept_bytes = 0;
  for (int64_t number = 1; begin < text.size(); ++number) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // a torn last line
    const std::string_view line = std::string_view(text).substr(begin, end - begin);
    begin = end + 1;
    const int64_t line_step = record_step(line);
    const std::string where = "line " + std::to_string(number);
    if (line_step < 0) {
      out.skipped.push_back(where + " (" + (line.find_first_not_of(" \t\r") == std::string_view::npos
                                                ? std::string("blank")
                                                : std::string("not a metrics record")) + ")");
    } else if (line_step > step) {
      // written after the checkpoint: cut, as a resumption always does
    } else if (line_step <= previous) {
      out.skipped.push_back(where + " (step " + std::to_string(line_step) +
                            (line_step == previous ? " again" : " after step " + std::to_string(previous)) + ")");
    } else {
      out.prefix = out.prefix && kept_bytes == end - line.size();
      out.lines.push_back({line_step, std::string(line) + "\n"});
      kept_bytes += line.size() + 1;
      previous = line_step;
      continue;
    }
  }
  return out;
}

// The steps of `steps` (increasing) as ranges: "20-140, 200".
std::string step_ranges(const std::vector<int64_t>& steps, int64_t every) {
  std::string text;
  for (size_t i = 0; i < steps.size();) {
    size_t j = i;
    while (j + 1 < steps.size() && steps[j + 1] - steps[j] <= every) ++j;
    if (!text.empty()) text += ", ";
    text += std::to_string(steps[i]);
    if (j > i) (text += '-') += std::to_string(steps[j]);  // appended, not concatenated: GCC 12 misreads the
                                                           // temporary's bounds (-Wstringop-overflow)
    i = j + 1;
  }
  return text;
}

}  // namespace

MetricsLog::MetricsLog(const fs::path& path, int64_t step, const std::vector<nlohmann::ordered_json>& saved)
    : path_(path) {
  const std::string text = fs::exists(path) ? read_file(path) : std::string();
  KeptLines kept = step > 0 ? kept_lines(text, step) : KeptLines{};
  skipped_ = std::move(kept.skipped);
  // The checkpoint's records of steps the log lacks go back in, in step order.
  std::vector<int64_t> restored;
  if (step > 0) {
    std::vector<std::pair<int64_t, std::string>> merged;
    size_t k = 0;
    for (const auto& record : saved) {
      const int64_t at = record.at("step").get<int64_t>();
      if (at > step) break;
      for (; k < kept.lines.size() && kept.lines[k].first < at; ++k) merged.push_back(std::move(kept.lines[k]));
      if (k < kept.lines.size() && kept.lines[k].first == at) continue;
      merged.push_back({at, record.dump() + "\n"});
      restored.push_back(at);
    }
    for (; k < kept.lines.size(); ++k) merged.push_back(std::move(kept.lines[k]));
    kept.lines = std::move(merged);
  }
  if (!restored.empty()) {
    int64_t every = std::numeric_limits<int64_t>::max();  // the log's spacing, for the ranges
    for (size_t i = 1; i < saved.size(); ++i)
      every = std::min(every, saved[i].at("step").get<int64_t>() - saved[i - 1].at("step").get<int64_t>());
    restored_ = path.string() + ": the records of " + std::to_string(restored.size()) + " step(s) were missing (" +
                step_ranges(restored, every) + "): restored from the checkpoint's curves (loss, lr, tokens, "
                "validation loss), marked \"restored\": true, without their timing or the position method's values";
  }
  std::string kept_text;
  for (const auto& [at, line] : kept.lines) kept_text += line;
  if (!kept.prefix || !restored.empty()) {
    // Lines were skipped before kept ones, or restored among them: the kept lines replace the
    // file in one rename.
    write_file_atomic(path, kept_text);
  }
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_write_error(path.string(), errno);
  const off_t size = off_t(kept_text.size());
  if (::ftruncate(fd_, size) != 0 || ::lseek(fd_, size, SEEK_SET) < 0 || ::fdatasync(fd_) != 0) {
    const int error = errno;
    ::close(fd_);
    throw_write_error(path.string(), error);
  }
}

std::string MetricsLog::skipped_text() const {
  if (skipped_.empty()) return "";
  std::string text = path_.string() + ": skipped " + std::to_string(skipped_.size()) +
                     " line(s) that could not be kept:";
  for (size_t i = 0; i < skipped_.size() && i < 5; ++i) text += (i ? ", " : " ") + skipped_[i];
  if (skipped_.size() > 5) text += ", and " + std::to_string(skipped_.size() - 5) + " more";
  return text + "; every other line up to the checkpoint is kept";
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
