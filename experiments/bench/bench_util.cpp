#include "experiments/bench/bench_util.h"

#include "core/kernels/cpu_linear.h"

#include <torch/cuda.h>

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>

namespace extrap::bench {

double median(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median of no values");
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  if (values.size() % 2 == 1) return values[middle];
  const double upper = values[middle];
  return (upper + *std::max_element(values.begin(), values.begin() + middle)) / 2;
}

int64_t resident_bytes() {
  static const int64_t page_size = sysconf(_SC_PAGESIZE);
  long long total_pages = 0, resident_pages = 0;
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (!statm) return 0;
  const int read = std::fscanf(statm, "%lld %lld", &total_pages, &resident_pages);
  std::fclose(statm);
  return read == 2 ? resident_pages * page_size : 0;
}

PeakMemorySampler::PeakMemorySampler(std::chrono::microseconds period) : period_(period) {
  malloc_trim(0);  // freed memory kept by the C library would hide part of the next peak
  baseline_ = resident_bytes();
  peak_ = baseline_;
  thread_ = std::thread([this] { sample(); });
}

PeakMemorySampler::~PeakMemorySampler() {
  if (thread_.joinable()) stop();
}

void PeakMemorySampler::sample() {
  while (running_.load(std::memory_order_relaxed)) {
    const int64_t now = resident_bytes();
    int64_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    std::this_thread::sleep_for(period_);
  }
}

int64_t PeakMemorySampler::stop() {
  const int64_t now = resident_bytes();  // a last sample, for calls shorter than a period
  running_ = false;
  if (thread_.joinable()) thread_.join();
  return std::max<int64_t>(0, std::max(peak_.load(), now) - baseline_);
}

CallMeasurement measure_call(const std::function<void()>& call, int repeats) {
  if (repeats < 1) throw std::invalid_argument("measure_call: repeats must be >= 1");
  CallMeasurement result;
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    PeakMemorySampler sampler;
    const auto start = std::chrono::steady_clock::now();
    call();
    times.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    result.peak_extra_bytes = std::max(result.peak_extra_bytes, sampler.stop());
  }
  result.median_ms = median(times);
  return result;
}

MatrixProductRate matrix_product_gflops(torch::Dtype dtype, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  // On a GPU a size that fills it; random data either way (zeros run faster on some parts).
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  const auto a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  // On the CPU through the path training's linear layers take (core/kernels/cpu_linear.h):
  // oneDNN for float32.
  const bool onednn = device.is_cpu() && onednn_linear_takes(a, b);
  const auto product = [&] {
    onednn ? extrap::linear(a, b, {}) : torch::mm(a, b);
    if (device.is_cuda()) torch::cuda::synchronize();
  };
  for (int i = 0; i < 3; ++i) product();
  std::vector<double> seconds;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    product();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  const char* library = device.is_cuda() ? "cuBLAS" : onednn ? "oneDNN" : "LibTorch's mm";
  return {2.0 * double(n) * double(n) * double(n) / median(seconds) / 1e9, library, n};
}

}  // namespace extrap::bench
