#include "core/runtime/sysinfo.h"

#include "core/base/allocator.h"
#include "core/base/errors.h"
#include "core/runtime/block_cache.h"
#include "core/runtime/cpu_isa.h"
#include "core/runtime/cuda_support.h"
#include "core/runtime/distributed.h"

#include "core/base/version.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
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

std::string iso_time_now_micro() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto micro = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  char buffer[40];
  const size_t n = std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%S", std::gmtime(&seconds));
  std::snprintf(buffer + n, sizeof(buffer) - n, ".%06lldZ", (long long)micro);
  return buffer;
}

namespace {
constexpr int64_t kMostThreads = 1024;
}  // namespace

int configure_threads(int64_t requested) {
  // Thousands of threads crash inside the thread pools (100,000 segfaulted) long before they
  // could help: no CPU has that many cores.
  if (requested < 0 || requested > kMostThreads)
    throw ConfigError("CPU threads " + std::to_string(requested) + ": must be 0 (all cores) to " +
                      std::to_string(kMostThreads) + " (this machine has " + std::to_string(available_cores()) +
                      " cores)");
  // Data-parallel ranks on one machine share its cores.
  const auto& ranks = ProcessGroup::environment();
  const int cores = available_cores();
  const int threads = requested > 0 ? int(requested) : std::max(1, cores / (ranks ? ranks->local_world_size : 1));
  // More threads than cores take turns on them: slower than one a core, never faster. Said once.
  static bool warned = false;
  if (requested > cores && !warned) {
    warned = true;
    std::cerr << "extrap: warning: " << requested << " CPU threads on " << cores
              << " cores: threads beyond one a core take turns and slow the run (0: one a core)\n";
  }
  torch::set_num_threads(threads);
  return threads;
}

bool stderr_is_terminal() { return isatty(fileno(stderr)) != 0; }

namespace {

// The value after "KEY=" in at::show_config()'s build settings, "" if absent.
std::string build_setting(const std::string& config, const std::string& key) {
  const auto at = config.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const auto begin = at + key.size() + 2;
  return config.substr(begin, config.find_first_of(",\n", begin) - begin);
}

// The text after `prefix` on the line of at::show_config() that starts with it, "" if none.
std::string config_line(const std::string& config, const std::string& prefix) {
  const auto at = config.find(prefix);
  if (at == std::string::npos) return "";
  const auto begin = at + prefix.size();
  return config.substr(begin, config.find('\n', begin) - begin);
}

}  // namespace

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.extrap_version = extrap_version();
  info.git_commit = extrap_git_commit();
  info.libtorch_version = TORCH_VERSION;
  info.cuda_support = describe_cuda_support();
  info.cuda_loaded = load_cuda_support().state == CudaSupport::State::loaded;
  if (info.cuda_loaded) {  // LibTorch's CUDA hooks are then the real ones (cuda_support.cpp checks)
    const auto& cuda = at::detail::getCUDAHooks();
    const long version = cuda.versionCUDART();  // e.g. 13020
    info.cuda_version = std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
    info.cuda_devices = cuda.getNumGPUs();
  }
  const std::string config = at::show_config();
  info.libtorch_loaded = build_setting(config, "TORCH_VERSION");
  const std::string blas = build_setting(config, "BLAS_INFO");
  info.blas = blas.empty() ? "unknown" : blas;
  const std::string mkl = at::get_mkl_version();  // "Intel(R) oneAPI ... Version 2024.2-Product ..."
  const auto version = mkl.find("Version ");
  if (blas == "mkl" && version != std::string::npos)
    info.blas += " (MKL " + mkl.substr(version + 8, mkl.find_first_of("- ", version + 8) - version - 8) + ")";
  const std::string onednn = at::get_mkldnn_version();  // "Intel(R) MKL-DNN v3.13.3 (Git Hash ...)"
  const auto v = onednn.find(" v");
  info.onednn = onednn.empty() ? "none"
                : v == std::string::npos ? onednn
                : "oneDNN" + onednn.substr(v, onednn.find(' ', v + 1) - v);
  info.cpu_capability = config_line(config, "CPU capability usage: ");
  if (info.cpu_capability.empty()) info.cpu_capability = "unknown";
  info.kernel_isa = cpu_isa_name(cpu_isa());
  info.threads = at::get_num_threads();
  info.allocator = allocator_summary();
  if (block_cache_installed()) info.allocator += "; blocks of 1 MiB+ in extrap's block cache";
  return info;
}

std::string describe_runtime(const RuntimeInfo& info) {
  std::ostringstream out;
  out << "extrap " << info.extrap_version << " (commit " << info.git_commit << ")\n"
      << "libtorch: " << info.libtorch_version
      << (info.libtorch_loaded == info.libtorch_version
              ? std::string()
              : " (but the loaded library reports " + info.libtorch_loaded + ")")
      << "\n"
      << "cuda: "
      << (info.cuda_loaded ? "CUDA " + info.cuda_version + ", " + std::to_string(info.cuda_devices) +
                                 " device(s) visible; " + info.cuda_support
                           : info.cuda_support)
      << "\n"
      << "blas: " << info.blas << "\n"
      << "onednn: " << info.onednn << "\n"
      << "cpu capability: " << info.cpu_capability << " (extrap's kernels: " << info.kernel_isa
      << "; ATEN_CPU_CAPABILITY=avx2 caps both)\n"
      << "threads: " << info.threads << "\n"
      << "malloc: " << info.allocator << "\n";
  return out.str();
}

std::string runtime_summary(const RuntimeInfo& info) {
  std::ostringstream out;
  out << "extrap " << info.extrap_version << " (" << info.git_commit << "), LibTorch "
      << info.libtorch_version
      << (info.libtorch_loaded == info.libtorch_version ? "" : " (loaded " + info.libtorch_loaded + ")")
      << ", "
      << (info.cuda_loaded ? "CUDA " + info.cuda_version + " with " +
                                 std::to_string(info.cuda_devices) + " device(s)"
                           : std::string("CUDA not loaded"))
      << ", BLAS " << info.blas << ", "
      << info.onednn << ", " << info.cpu_capability << " (extrap " << info.kernel_isa << "), " << info.threads << " threads, malloc (" << info.allocator << ")";
  return out.str();
}

}  // namespace extrap
