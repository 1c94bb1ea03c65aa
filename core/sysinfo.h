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
int available_cores();
// Sets LibTorch's intra-op threads (0: all available cores) and returns the count used.
int configure_threads(int64_t requested);
bool stderr_is_terminal();

// OpenBLAS 0.3.21 (Debian 12) does not recognise some current Xeons and falls back to its
// generic kernels; on this project's 2-core VMs that makes matrix products 2-4x slower. It
// reads OPENBLAS_CORETYPE only when it loads, so when the variable is unset and the CPU has
// AVX-512 (or AVX2) this sets it and re-executes the program once. A value the user set is
// left alone. Returns only if no re-execution happened.
void prefer_fast_blas_kernels(char** argv);

}  // namespace extrap
