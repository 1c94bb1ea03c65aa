#include "core/sysinfo.h"

#include <torch/torch.h>

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <thread>

namespace extrap {

namespace {
int64_t status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return std::stoll(line.substr(prefix.size()));
  return 0;
}
}  // namespace

int64_t current_rss_bytes() { return status_kb("VmRSS") * 1024; }
int64_t peak_rss_bytes() { return status_kb("VmHWM") * 1024; }

std::string hostname() {
  char buffer[256] = {0};
  gethostname(buffer, sizeof(buffer) - 1);
  return buffer;
}

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return int(std::thread::hardware_concurrency());
}

std::string machine_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  std::ostringstream out;
  out << hostname() << " (" << model << ", " << available_cores() << " cores)";
  return out.str();
}

std::string iso_time_now() {
  const std::time_t now = std::time(nullptr);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return buffer;
}

int configure_threads(int64_t requested) {
  const int threads = requested > 0 ? int(requested) : available_cores();
  torch::set_num_threads(threads);
  return threads;
}

bool stderr_is_terminal() { return isatty(fileno(stderr)) != 0; }

void prefer_fast_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE")) return;
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  auto has = [&](const char* flag) { return flags.find(" " + std::string(flag) + " ") != std::string::npos; };
  const char* core = nullptr;
  if (has("avx512f") && has("avx512bw") && has("avx512vl") && has("avx512dq")) core = "SkylakeX";
  else if (has("avx2") && has("fma")) core = "Haswell";
  if (!core) return;
  setenv("OPENBLAS_CORETYPE", core, 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run on as we are
}

}  // namespace extrap
