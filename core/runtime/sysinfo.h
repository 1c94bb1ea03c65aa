// Process and machine facts for logs, benchmarks and results: memory, time, host.
#pragma once

#include <cstdint>
#include <string>

namespace extrap {

int64_t current_rss_bytes();   // resident set size now
int64_t peak_rss_bytes();      // VmHWM: the process's peak resident set size
std::string hostname();
std::string machine_description();  // host, CPU model and core count
std::string iso_time_now();         // UTC, e.g. 2026-11-21T10:00:00Z
std::string iso_time_now_micro();   // UTC to the microsecond, e.g. 2026-11-21T10:00:00.123456Z
int available_cores();
// Sets LibTorch's intra-op threads (0: all available cores, shared out among the
// data-parallel ranks on this machine) and returns the count used.
int configure_threads(int64_t requested);
bool stderr_is_terminal();

// What this binary runs on: for `extrap --version`, benchmark headers and results files.
struct RuntimeInfo {
  std::string extrap_version;    // e.g. 0.1.0
  std::string git_commit;        // of the source tree at build time
  std::string libtorch_version;  // TORCH_VERSION of the headers built against, e.g. 2.15.0
  std::string libtorch_loaded;   // the version the loaded libtorch_cpu reports (should be the same)
  bool cuda_loaded = false;      // extrap's CUDA half and LibTorch's are loaded (cuda_support.h)
  std::string cuda_support;      // describe_cuda_support(): loaded from where, or why not
  std::string cuda_version;      // the CUDA runtime LibTorch uses, e.g. 13.2; "" without CUDA
  int cuda_devices = 0;          // CUDA devices visible now
  std::string blas;              // e.g. "mkl (MKL 2024.2)"
  std::string onednn;            // e.g. "oneDNN v3.13.3", "none"
  std::string cpu_capability;    // the vector ISA LibTorch's CPU kernels use, e.g. AVX512
  std::string kernel_isa;        // the one extrap's own CPU kernels use (cpu_isa.h), e.g. avx512
  int threads = 0;               // LibTorch intra-op threads
  std::string allocator;         // malloc's settings (core/base/allocator.h)
};
RuntimeInfo runtime_info();
// One line per fact ("libtorch: 2.15.0", ...), as `extrap --version` prints them.
std::string describe_runtime(const RuntimeInfo& info);
// The same on one line, for benchmark headers and the results file's `runtime` attribute.
std::string runtime_summary(const RuntimeInfo& info);
inline std::string runtime_summary() { return runtime_summary(runtime_info()); }

}  // namespace extrap
