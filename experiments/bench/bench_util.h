// Timing and memory helpers shared by the benchmarks (`extrap bench ...`).
//
// Peak memory of one call is measured as resident memory, not as allocator statistics, so that
// it counts every allocator (LibTorch's, BLAS's, the C library's) the same way:
// PeakMemorySampler first returns freed heap memory to the system (malloc_trim), records the
// process's resident set size as a baseline, then a background thread reads it from
// /proc/self/statm about every millisecond until stop(). The result is the largest increase
// over the baseline. An allocation that lives less than a sampling period can be missed;
// everything a benchmarked call holds for longer (score matrices, tiles, the output) is seen.
// VmHWM (/proc/self/status) is not used: it is process-wide and never decreases, so it
// cannot separate one call from the calls before it.
#pragma once

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace extrap::bench {

// The median (mean of the middle two for an even count). Throws for an empty vector.
double median(std::vector<double> values);

// Resident set size of this process now, in bytes (/proc/self/statm: cheap enough to poll).
int64_t resident_bytes();

class PeakMemorySampler {
 public:
  explicit PeakMemorySampler(std::chrono::microseconds period = std::chrono::milliseconds(1));
  ~PeakMemorySampler();  // stops the thread if stop() was not called
  PeakMemorySampler(const PeakMemorySampler&) = delete;
  PeakMemorySampler& operator=(const PeakMemorySampler&) = delete;

  // Stops sampling; returns the largest resident size seen minus the baseline (>= 0).
  int64_t stop();

 private:
  void sample();
  int64_t baseline_ = 0;
  std::atomic<int64_t> peak_{0};
  std::atomic<bool> running_{true};
  std::chrono::microseconds period_;
  std::thread thread_;
};

// One benchmarked call repeated: its median wall time and the largest peak extra memory.
struct CallMeasurement {
  double median_ms = 0;
  int64_t peak_extra_bytes = 0;
};

// Runs `call` `repeats` times (>= 1), each timed and sampled on its own.
CallMeasurement measure_call(const std::function<void()>& call, int repeats);

// The machine's large-matrix-product rate in GFLOP/s: the median of 10 products of two
// 1024 x 1024 matrices of `dtype` on the CPU, after 3 untimed (LibTorch's current threads),
// through the library training's linear layers use (oneDNN for float32, core/kernels/cpu_linear.h).
// The denominator of model FLOPs utilisation.
struct MatrixProductRate {
  double gflops;
  std::string library;  // "oneDNN", "LibTorch's mm" or "cuBLAS"
  int64_t size = 1024;  // n of the n x n x n product
};
// On a CUDA device: 8192 x 8192 x 8192 through LibTorch's mm (cuBLAS), on random data.
MatrixProductRate matrix_product_gflops(torch::Dtype dtype, const torch::Device& device = torch::kCPU);

}  // namespace extrap::bench
