// The fused CUDA attention benchmark: time (CUDA events, median after warm-up) and peak
// device memory of one attention call, forward and forward+backward, for
//   fused-alibi  the fused kernels, ALiBi slopes computed in the kernel
//   fused-none   the fused kernels, no bias (the cost of ALiBi is the difference)
//   sdpa-bias    torch's scaled_dot_product_attention with the ALiBi bias materialised as an
//                (H, T, T) tensor (LibTorch >= 2.0 only)
//   reference    attention_reference: matmul, materialised bias, softmax, matmul
// at a constant number of tokens per batch (B = tokens / T), causal (ALiBi) and
// bidirectional (symmetric ALiBi). FLOPs: forward 4 B H T^2 D, halved when causal; the
// backward pass counts 2.5 forwards, so forward+backward counts 3.5.
// Peak memory: the caching allocator's peak of allocated bytes during one untimed call.
// Each measurement is appended to --out as a JSON line.
#include "core/cuda/bench_fused_attention.h"

#include "core/attention.h"
#include "core/cuda/fused_attention.h"
#include "core/sysinfo.h"
#include "positions/alibi_slopes.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <boost/program_options.hpp>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace po = boost::program_options;

namespace extrap::cli {
namespace {

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) items.push_back(item);
  return items;
}

std::vector<int64_t> split_ints(const std::string& text, const char* what) {
  std::vector<int64_t> values;
  for (const auto& item : split(text)) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || value < 1)
      throw std::invalid_argument(std::string("--") + what + ": '" + item + "' is not a positive integer");
    values.push_back(value);
  }
  return values;
}

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

bool is_out_of_memory(const c10::Error& e) {
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

struct Timing {
  double ms = 0;
  int64_t peak_bytes = 0;
};

// One untimed call for the memory peak, `warmup` calls, then `repeats` calls each between
// two CUDA events on the current stream; the median of their times.
Timing time_call(const std::function<void()>& call, int warmup, int repeats) {
  const auto device = static_cast<c10::DeviceIndex>(at::cuda::current_device());
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream().stream();
  check_cuda(cudaDeviceSynchronize(), "synchronize");
  c10::cuda::CUDACachingAllocator::resetPeakStats(device);
  call();
  check_cuda(cudaDeviceSynchronize(), "synchronize");
  Timing timing;
  // Index 0 of the statistic arrays is the aggregate over all pools (StatType::AGGREGATE).
  timing.peak_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].peak;
  for (int i = 0; i < warmup; ++i) call();
  std::vector<cudaEvent_t> starts(repeats), stops(repeats);
  for (int i = 0; i < repeats; ++i) {
    check_cuda(cudaEventCreate(&starts[i]), "event");
    check_cuda(cudaEventCreate(&stops[i]), "event");
  }
  for (int i = 0; i < repeats; ++i) {
    check_cuda(cudaEventRecord(starts[i], stream), "event record");
    call();
    check_cuda(cudaEventRecord(stops[i], stream), "event record");
  }
  check_cuda(cudaEventSynchronize(stops.back()), "event synchronize");
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, starts[i], stops[i]), "elapsed time");
    times.push_back(ms);
    cudaEventDestroy(starts[i]);
    cudaEventDestroy(stops[i]);
  }
  std::sort(times.begin(), times.end());
  const size_t middle = times.size() / 2;
  timing.ms = times.size() % 2 ? times[middle] : (times[middle - 1] + times[middle]) / 2;
  return timing;
}

using AttentionFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&,
                                                const torch::Tensor&)>;

}  // namespace

int bench_attention_cuda(const std::vector<std::string>& args) {
  po::options_description options("extrap bench attention --device cuda");
  std::string device = "cuda", lengths_text = "512,1024,2048,4096,8192,16384";
  std::string head_dims_text = "64,128", impls_text = "fused-alibi,fused-none,sdpa-bias,reference";
  std::string passes_text = "forward,forward+backward", dtype_name = "bf16";
  std::string out_path = "benchmarks/results/attention_cuda.jsonl";
  int64_t tokens = 16384, heads = 16;
  int warmup = 3, repeats = 20;
  bool causal_only = false, bidirectional_only = false;
  options.add_options()
      ("help", "this text")
      ("device", po::value(&device)->default_value(device), "must be cuda")
      ("lengths", po::value(&lengths_text)->default_value(lengths_text), "comma-separated sequence lengths T")
      ("head-dims", po::value(&head_dims_text)->default_value(head_dims_text), "comma-separated head dimensions (64, 128)")
      ("tokens", po::value(&tokens)->default_value(tokens), "tokens per batch: B = max(1, tokens / T)")
      ("heads", po::value(&heads)->default_value(heads), "attention heads H")
      ("dtype", po::value(&dtype_name)->default_value(dtype_name), "bf16 or fp16")
      ("impls", po::value(&impls_text)->default_value(impls_text), "comma-separated implementations")
      ("passes", po::value(&passes_text)->default_value(passes_text), "forward and/or forward+backward")
      ("causal", po::bool_switch(&causal_only), "causal only (default: causal and bidirectional)")
      ("bidirectional", po::bool_switch(&bidirectional_only), "bidirectional only")
      ("warmup", po::value(&warmup)->default_value(warmup), "untimed calls before timing")
      ("repeats", po::value(&repeats)->default_value(repeats), "timed calls (median reported)")
      ("out", po::value(&out_path)->default_value(out_path), "JSON lines file to append to");
  po::variables_map values;
  std::vector<const char*> argv{"bench-attention-cuda"};
  for (const auto& a : args) argv.push_back(a.c_str());
  po::store(po::parse_command_line(int(argv.size()), argv.data(), options), values);
  po::notify(values);
  if (values.count("help")) {
    std::cout << "usage: extrap bench attention --device cuda [options]\n" << options << "\n";
    return 0;
  }
  if (device != "cuda") throw std::invalid_argument("--device must be cuda here, got '" + device + "'");
  if (!torch::cuda::is_available()) {
    std::cerr << "extrap bench attention: no CUDA device\n";
    return 1;
  }
  if (warmup < 0 || repeats < 1 || tokens < 1 || heads < 1)
    throw std::invalid_argument("--warmup >= 0, --repeats, --tokens and --heads >= 1 please");
  if (dtype_name != "bf16" && dtype_name != "fp16")
    throw std::invalid_argument("--dtype must be bf16 or fp16, got '" + dtype_name + "'");
  const auto dtype = dtype_name == "bf16" ? torch::kBFloat16 : torch::kHalf;
  const auto lengths = split_ints(lengths_text, "lengths");
  const auto head_dims = split_ints(head_dims_text, "head-dims");
  const auto impls = split(impls_text), passes = split(passes_text);
  const std::set<std::string> known_impls{"fused-alibi", "fused-none", "sdpa-bias", "reference"};
  for (const auto& impl : impls)
    if (!known_impls.count(impl)) throw std::invalid_argument("unknown --impls entry '" + impl + "'");
  for (const auto& pass : passes)
    if (pass != "forward" && pass != "forward+backward")
      throw std::invalid_argument("unknown --passes entry '" + pass + "'");
  std::vector<bool> modes;  // causal?
  if (!bidirectional_only) modes.push_back(true);
  if (!causal_only) modes.push_back(false);

  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, at::cuda::current_device()), "device properties");
  const std::string device_name = properties.name;
  const std::string date = iso_time_now();
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(out_path, std::ios::app);
  if (!out) throw std::runtime_error("cannot open " + out_path);

  std::printf("device: %s\ndate: %s\ntokens per batch %lld, H %lld, %s, median of %d calls after %d\n\n",
              device_name.c_str(), date.c_str(), (long long)tokens, (long long)heads, dtype_name.c_str(),
              repeats, warmup);
  std::printf("%-12s %-14s %4s %6s %-17s %10s %9s %10s\n", "impl", "mode", "D", "T", "pass", "ms",
              "TFLOP/s", "peak GB");

  const auto slopes = torch::tensor(alibi_slopes(int(heads)), torch::kFloat64)
                          .to(torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA));
  std::set<std::string> out_of_memory;  // impl|mode|D|pass that ran out at a shorter T

  for (const int64_t head_dim : head_dims) {
    for (const bool causal : modes) {
      const std::string mode = causal ? "causal" : "bidirectional";
      const AttentionBias alibi =
          causal ? AttentionBias::linear_causal(slopes) : AttentionBias::linear_symmetric(slopes);
      for (const int64_t length : lengths) {
        const int64_t batch = std::max<int64_t>(1, tokens / length);
        torch::manual_seed(uint64_t(length * 131 + head_dim));
        const auto tensor_options = torch::TensorOptions().dtype(dtype).device(torch::kCUDA);
        const auto q = torch::randn({batch, heads, length, head_dim}, tensor_options);  // (B, H, T, D)
        const auto k = torch::randn({batch, heads, length, head_dim}, tensor_options);
        const auto v = torch::randn({batch, heads, length, head_dim}, tensor_options);
        const auto dout = torch::randn({batch, heads, length, head_dim}, tensor_options);
        const double forward_flops =
            4.0 * batch * heads * double(length) * length * head_dim / (causal ? 2 : 1);

        for (const auto& impl : impls) {
          AttentionFn fn;
          torch::Tensor materialised;  // (H, T, T) ALiBi bias for sdpa-bias, built untimed
          if (impl == "fused-alibi") {
            const auto layout = causal ? FusedAlibiLayout::Causal : FusedAlibiLayout::Symmetric;
            fn = [layout, causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
              return fused_attention_alibi(a, b, c, layout, causal);
            };
          } else if (impl == "fused-none") {
            fn = [causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
              return fused_attention(a, b, c, AttentionBias::none(), causal);
            };
          } else if (impl == "reference") {
            AttentionOptions attention_options;
            attention_options.causal = causal;
            fn = [alibi, attention_options](const torch::Tensor& a, const torch::Tensor& b,
                                            const torch::Tensor& c) {
              return attention_reference(a, b, c, alibi, attention_options);
            };
          } else {  // sdpa-bias
#if TORCH_VERSION_MAJOR >= 2
            fn = [&materialised](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
              return at::scaled_dot_product_attention(a, b, c, materialised, 0.0, false);
            };
#endif
          }
          for (const auto& pass : passes) {
            const std::string key = impl + "|" + mode + "|" + std::to_string(head_dim) + "|" + pass;
            std::string status = "ok";
            Timing timing;
            if (!fn) {
              status = "unavailable (LibTorch < 2.0)";
            } else if (out_of_memory.count(key)) {
              status = "skipped (out of memory at a shorter length)";
            } else {
              try {
                if (impl == "sdpa-bias" && !materialised.defined())
                  materialised = materialize_bias(alibi, heads, length, length, causal, q.options());
                if (pass == "forward") {
                  timing = time_call(
                      [&] {
                        torch::NoGradGuard no_grad;
                        fn(q, k, v);
                      },
                      warmup, repeats);
                } else {
                  const auto qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
                             vg = v.detach().requires_grad_(true);
                  timing = time_call(
                      [&] { torch::autograd::grad({fn(qg, kg, vg)}, {qg, kg, vg}, {dout}); }, warmup,
                      repeats);
                }
              } catch (const c10::Error& e) {
                if (!is_out_of_memory(e)) throw;
                status = "out of memory";
                out_of_memory.insert(key);
              }
              c10::cuda::CUDACachingAllocator::emptyCache();
            }
            const bool ok = status == "ok";
            const double flops = forward_flops * (pass == "forward" ? 1.0 : 3.5);
            const double tflops = ok ? flops / (timing.ms * 1e-3) / 1e12 : 0.0;
            if (ok)
              std::printf("%-12s %-14s %4lld %6lld %-17s %10.3f %9.1f %10.2f\n", impl.c_str(), mode.c_str(),
                          (long long)head_dim, (long long)length, pass.c_str(), timing.ms, tflops,
                          timing.peak_bytes / 1e9);
            else
              std::printf("%-12s %-14s %4lld %6lld %-17s %s\n", impl.c_str(), mode.c_str(),
                          (long long)head_dim, (long long)length, pass.c_str(), status.c_str());
            std::fflush(stdout);
            out << "{\"device\": \"" << json_escape(device_name) << "\", \"date\": \"" << date
                << "\", \"impl\": \"" << impl << "\", \"mode\": \"" << mode << "\", \"dtype\": \""
                << dtype_name << "\", \"head_dim\": " << head_dim << ", \"seq_len\": " << length
                << ", \"batch\": " << batch << ", \"heads\": " << heads << ", \"pass\": \"" << pass
                << "\", \"status\": \"" << json_escape(status) << "\", \"ms\": ";
            if (ok)
              out << timing.ms << ", \"tflops\": " << tflops << ", \"peak_mem_bytes\": " << timing.peak_bytes;
            else
              out << "null, \"tflops\": null, \"peak_mem_bytes\": null";
            out << "}\n";
            out.flush();
          }
        }
      }
    }
  }
  std::printf("\nresults appended to %s\n", out_path.c_str());
  return 0;
}

}  // namespace extrap::cli
