#include "core/base/fault.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

namespace extrap {
namespace {

struct Target {
  std::string moment, detail_part;  // the moment, and text its detail must contain
  long occurrence = 0;
  long seen = 0;
};

struct Plan {
  std::vector<Target> targets;
  std::string file;
  std::mutex mutex;
};

Plan* plan() {
  static Plan* const parsed = []() -> Plan* {
    const char* spec = std::getenv("EXTRAP_TEST_STOP_AT");
    if (!spec || !*spec) return nullptr;
    auto* p = new Plan;
    std::stringstream in(spec);
    for (std::string item; std::getline(in, item, ',');) {
      const auto colon = item.rfind(':');
      if (colon == std::string::npos) continue;
      Target t;
      t.moment = item.substr(0, colon);
      t.occurrence = std::atol(item.c_str() + colon + 1);
      const auto at = t.moment.find('@');
      if (at != std::string::npos) {
        t.detail_part = t.moment.substr(at + 1);
        t.moment.erase(at);
      }
      p->targets.push_back(t);
    }
    if (const char* file = std::getenv("EXTRAP_TEST_STOP_FILE")) p->file = file;
    return p;
  }();
  return parsed;
}

}  // namespace

void fault_point(const char* moment, const std::string& detail) {
  Plan* p = plan();
  if (!p) return;
  std::lock_guard<std::mutex> hold(p->mutex);
  const Target* hit = nullptr;
  for (auto& t : p->targets)
    if (t.moment == moment && detail.find(t.detail_part) != std::string::npos &&
        ++t.seen == t.occurrence)
      hit = &t;
  if (!hit) return;
  if (!p->file.empty()) {
    const std::string line = std::to_string(::getpid()) + " " + moment + " " +
                             std::to_string(hit->occurrence) + " " + detail + "\n";
    const int fd = ::open(p->file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      [[maybe_unused]] const ssize_t written = ::write(fd, line.data(), line.size());
      ::fsync(fd);
      ::close(fd);
    }
  }
  ::raise(SIGSTOP);
}

}  // namespace extrap
