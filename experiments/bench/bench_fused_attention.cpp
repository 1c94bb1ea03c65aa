// The fused CUDA attention benchmark: time (CUDA events, median after warm-up) and peak
// device memory of one attention call, forward and forward+backward, for
//   fused-alibi  the fused kernels, ALiBi slopes computed in the kernel
//   fused-none   the fused kernels, no bias (the cost of ALiBi is the difference)
//   fused-learned the fused kernels with the slopes as a tensor that requires grad (learned
//                slopes: per-head direction bits, and the backward also sums the slope gradients)
//   cudnn-alibi  cuDNN's fused attention with its ALiBi mask (causal only; where libextrap_cuda.so
//                was built with the cuDNN frontend, core/attention/cuda/cudnn_attention.h)
//   auto         extrap's attention() with the paper's ALiBi as the alibi method describes it: the
//                route the GPU table picks (core/attention/gpu_routes.h), named in the line
//   offsets      the fused kernels with a learned per-head table of offsets j - i (T5's kind of
//                bias: by_offset, BiasMode::Offsets), the table's gradient included
//   reference-offsets  attention_reference with the same table (what T5, KERPLE and Sandwich ran
//                on a GPU before the Offsets mode)
//   sdpa         torch's scaled_dot_product_attention without a bias (is_causal when causal) on
//                the backend LibTorch picks (flash on sm_80+): the no-bias ceiling
//   sdpa-bias    torch's scaled_dot_product_attention with the ALiBi bias materialised as an
//                (H, T, T) tensor (LibTorch >= 2.0 only)
//   reference    attention_reference: matmul, materialised bias, softmax, matmul
// at a constant number of tokens per batch (B = tokens / T), causal (ALiBi) and
// bidirectional (symmetric ALiBi). FLOPs: forward 4 B H T^2 D, halved when causal; the
// backward pass counts 2.5 forwards, so forward+backward counts 3.5.
// Peak memory: the caching allocator's peak of allocated bytes during one untimed call.
// Each measurement is appended to --out as a JSON line.
#include "experiments/bench/bench_fused_attention.h"

#include "core/attention/attention.h"
#include "core/attention/cuda_attention.h"
#include "core/attention/gpu_routes.h"
#include "core/runtime/cuda_support.h"
#include "core/runtime/sysinfo.h"
#include "positions/alibi_slopes.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <boost/program_options.hpp>
#include <cuda_runtime_api.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
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
  const auto device = static_cast<c10::DeviceIndex>(c10::cuda::current_device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
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

// The command line of `extrap bench attention --device cuda`.
struct CudaBenchOptions {
  std::string device = "cuda", lengths_text = "512,1024,2048,4096,8192,16384";
  std::string head_dims_text = "64,128",
              impls_text = "auto,cudnn-alibi,fused-alibi,fused-none,fused-learned,offsets,sdpa,sdpa-bias,reference";
  std::string passes_text = "forward,forward+backward", dtype_name = "bf16";
  std::string out_path = "benchmarks/results/attention_cuda.jsonl";
  int64_t tokens = 16384, heads = 16;
  int warmup = 3, repeats = 20;
  bool causal_only = false, bidirectional_only = false;
};

// Parses the command line; false when --help was asked for (and printed).
bool parse_cuda_bench_options(const std::vector<std::string>& args, CudaBenchOptions& o) {
  po::options_description options("extrap bench attention --device cuda");
  options.add_options()
      ("help", "this text")
      ("device", po::value(&o.device)->default_value(o.device), "must be cuda")
      ("lengths", po::value(&o.lengths_text)->default_value(o.lengths_text), "comma-separated sequence lengths T")
      ("head-dims", po::value(&o.head_dims_text)->default_value(o.head_dims_text), "comma-separated head dimensions (64, 128)")
      ("tokens", po::value(&o.tokens)->default_value(o.tokens), "tokens per batch: B = max(1, tokens / T)")
      ("heads", po::value(&o.heads)->default_value(o.heads), "attention heads H")
      ("dtype", po::value(&o.dtype_name)->default_value(o.dtype_name), "bf16 or fp16")
      ("impls", po::value(&o.impls_text)->default_value(o.impls_text), "comma-separated implementations")
      ("passes", po::value(&o.passes_text)->default_value(o.passes_text), "forward and/or forward+backward")
      ("causal", po::bool_switch(&o.causal_only), "causal only (default: causal and bidirectional)")
      ("bidirectional", po::bool_switch(&o.bidirectional_only), "bidirectional only")
      ("warmup", po::value(&o.warmup)->default_value(o.warmup), "untimed calls before timing")
      ("repeats", po::value(&o.repeats)->default_value(o.repeats), "timed calls (median reported)")
      ("out", po::value(&o.out_path)->default_value(o.out_path), "JSON lines file to append to");
  po::variables_map values;
  std::vector<const char*> argv{"bench-attention-cuda"};
  for (const auto& a : args) argv.push_back(a.c_str());
  po::store(po::parse_command_line(int(argv.size()), argv.data(), options), values);
  po::notify(values);
  if (values.count("help")) {
    std::cout << "usage: extrap bench attention --device cuda [options]\n" << options << "\n";
    return false;
  }
  return true;
}

// The options checked and split into what the loops run over.
struct CudaBenchPlan {
  torch::Dtype dtype;
  std::vector<int64_t> lengths, head_dims;
  std::vector<std::string> impls, passes;
  std::vector<bool> modes;  // causal?
};

// Checks the numbers, the dtype and the --impls and --passes entries, and splits the lists.
CudaBenchPlan plan_from_options(const CudaBenchOptions& o) {
  if (o.warmup < 0 || o.repeats < 1 || o.tokens < 1 || o.heads < 1)
    throw std::invalid_argument("--warmup >= 0, --repeats, --tokens and --heads >= 1 please");
  if (o.dtype_name != "bf16" && o.dtype_name != "fp16")
    throw std::invalid_argument("--dtype must be bf16 or fp16, got '" + o.dtype_name + "'");
  CudaBenchPlan plan;
  plan.dtype = o.dtype_name == "bf16" ? torch::kBFloat16 : torch::kHalf;
  plan.lengths = split_ints(o.lengths_text, "lengths");
  plan.head_dims = split_ints(o.head_dims_text, "head-dims");
  plan.impls = split(o.impls_text);
  plan.passes = split(o.passes_text);
  const std::set<std::string> known_impls{"auto", "cudnn-alibi", "fused-alibi", "fused-none", "fused-learned",
                                          "offsets", "reference-offsets", "sdpa", "sdpa-bias", "reference"};
  for (const auto& impl : plan.impls)
    if (!known_impls.count(impl)) throw std::invalid_argument("unknown --impls entry '" + impl + "'");
  for (const auto& pass : plan.passes)
    if (pass != "forward" && pass != "forward+backward")
      throw std::invalid_argument("unknown --passes entry '" + pass + "'");
  if (!o.bidirectional_only) plan.modes.push_back(true);
  if (!o.causal_only) plan.modes.push_back(false);
  return plan;
}

// The device and date every JSON line names, and the --out file the lines are appended to.
struct ResultsLog {
  std::string device_name;
  std::string date;
  std::string kernel_shapes;  // extrap's fused kernels' tile shapes in force
  std::ofstream out;
};

// Names the device, stamps the date and opens --out for appending (creating its folder).
ResultsLog open_results(const std::string& out_path) {
  cudaDeviceProp properties{};
  check_cuda(cudaGetDeviceProperties(&properties, c10::cuda::current_device()), "device properties");
  const std::string device_name = properties.name;
  const std::string date = iso_time_now();
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  std::ofstream out(out_path, std::ios::app);
  if (!out) throw std::runtime_error("cannot open " + out_path);
  return ResultsLog{device_name, date, cuda_attention()->kernel_shapes(), std::move(out)};
}

// One shape the implementations run at: random inputs and the forward pass's FLOPs.
struct Shape {
  std::string mode;  // "causal" or "bidirectional"
  bool causal = true;
  int64_t head_dim = 0, length = 0, batch = 0;
  torch::Tensor q, k, v, dout;  // (B, H, T, D)
  double forward_flops = 0;
};

// What `auto` hands attention(): the paper's ALiBi as the alibi method describes it (its slopes
// marked as the paper's where causal), and training's options.
std::pair<AttentionBias, AttentionOptions> auto_call(const AttentionBias& alibi, bool causal) {
  AttentionBias paper = alibi;
  paper.paper_slopes = causal;  // what positions/alibi.cpp says of its slopes
  AttentionOptions options;
  options.causal = causal;
  options.training = true;
  return {paper, options};
}

// The call an implementation makes on (q, k, v); empty where this build lacks it, with the
// reason in `unavailable`. sdpa-bias reads `materialised`, the (H, T, T) ALiBi bias, which the
// caller builds untimed.
AttentionFn attention_fn(const std::string& impl, bool causal, const AttentionBias& alibi,
                         torch::Tensor& materialised, std::string& unavailable) {
  AttentionFn fn;
  unavailable = "unavailable (LibTorch < 2.0)";
  if (impl == "auto") {
    const auto [paper, attention_options] = auto_call(alibi, causal);
    fn = [paper = paper, attention_options = attention_options](const torch::Tensor& a, const torch::Tensor& b,
                                                                const torch::Tensor& c) {
      return attention(a, b, c, paper, attention_options);
    };
  } else if (impl == "cudnn-alibi") {
    if (!cuda_attention()->cudnn)
      unavailable = "unavailable (built without the cuDNN frontend)";
    else if (!causal)
      unavailable = "unavailable (cuDNN's ALiBi is causal only)";
    else
      fn = [](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
        return cuda_attention()->cudnn(a, b, c, /*alibi=*/true, /*window=*/0);
      };
  } else if (impl == "offsets" || impl == "reference-offsets") {
    // A learned table over the offsets of 2^24 tokens would be large: it covers the call's
    // own (by_offset asks for -(T-1) .. T-1 at most), made on the first call.
    const int64_t heads = alibi.slopes_left.size(0);
    auto table = std::make_shared<torch::Tensor>();
    const auto bias = AttentionBias::dense_by_offset([table, heads](int64_t lo, int64_t hi) {
      const int64_t reach = std::max(-lo, hi);
      if (!table->defined() || table->size(1) < 2 * reach + 1)
        *table = (torch::randn({heads, 2 * reach + 1}, torch::TensorOptions().device(torch::kCUDA)) * 0.1)
                     .requires_grad_(true);
      return table->narrow(1, lo + (table->size(1) - 1) / 2, hi - lo);
    });
    AttentionOptions attention_options;
    attention_options.causal = causal;
    if (impl == "offsets")
      fn = [bias, causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
        return cuda_attention()->attention(a, b, c, bias, causal);
      };
    else
      fn = [bias, attention_options](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
        return attention_reference(a, b, c, bias, attention_options);
      };
  } else if (impl == "fused-alibi") {
    const auto layout = causal ? FusedAlibiLayout::Causal : FusedAlibiLayout::Symmetric;
    fn = [layout, causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
      return cuda_attention()->alibi(a, b, c, layout, causal);
    };
  } else if (impl == "fused-none") {
    fn = [causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
      return cuda_attention()->attention(a, b, c, AttentionBias::none(), causal);
    };
  } else if (impl == "fused-learned") {
    // Slopes as a leaf that requires grad: the kernels take per-head bits and sum dslope.
    const auto learned = alibi.slopes_left.detach().clone().requires_grad_(true);
    const AttentionBias bias =
        causal ? AttentionBias::linear_causal(learned) : AttentionBias::linear_symmetric(learned);
    fn = [bias, causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
      return cuda_attention()->attention(a, b, c, bias, causal);
    };
  } else if (impl == "sdpa") {
#if TORCH_VERSION_MAJOR >= 2
    fn = [causal](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& c) {
      return at::scaled_dot_product_attention(a, b, c, {}, 0.0, causal);
    };
#endif
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
  return fn;
}

// Times one pass of `fn` on the shape's inputs: the forward alone (no grad), or forward and
// backward to the gradients of q, k and v.
Timing time_pass(const AttentionFn& fn, const std::string& pass, const Shape& shape, int warmup,
                 int repeats) {
  const auto& q = shape.q;
  const auto& k = shape.k;
  const auto& v = shape.v;
  const auto& dout = shape.dout;
  if (pass == "forward") {
    return time_call(
        [&] {
          torch::NoGradGuard no_grad;
          fn(q, k, v);
        },
        warmup, repeats);
  }
  const auto qg = q.detach().requires_grad_(true), kg = k.detach().requires_grad_(true),
             vg = v.detach().requires_grad_(true);
  return time_call(
      [&] { torch::autograd::grad({fn(qg, kg, vg)}, {qg, kg, vg}, {dout}); }, warmup,
      repeats);
}

// Prints one measurement's table row and appends its JSON line to --out.
void report_measurement(ResultsLog& log, const CudaBenchOptions& o, const Shape& shape,
                        const std::string& impl, const std::string& pass, const std::string& status,
                        const Timing& timing) {
  const std::string& mode = shape.mode;
  const int64_t head_dim = shape.head_dim, length = shape.length, batch = shape.batch;
  const bool ok = status == "ok";
  const double flops = shape.forward_flops * (pass == "forward" ? 1.0 : 3.5);
  const double tflops = ok ? flops / (timing.ms * 1e-3) / 1e12 : 0.0;
  if (ok)
    std::printf("%-18s %-14s %4lld %6lld %-17s %10.3f %9.1f %10.2f\n", impl.c_str(), mode.c_str(),
                (long long)head_dim, (long long)length, pass.c_str(), timing.ms, tflops,
                timing.peak_bytes / 1e9);
  else
    std::printf("%-18s %-14s %4lld %6lld %-17s %s\n", impl.c_str(), mode.c_str(),
                (long long)head_dim, (long long)length, pass.c_str(), status.c_str());
  std::fflush(stdout);
  std::ofstream& out = log.out;
  out << "{\"device\": \"" << json_escape(log.device_name) << "\", \"date\": \"" << log.date
      << "\", \"kernel_shapes\": \"" << log.kernel_shapes << "\", \"impl\": \"" << impl << "\", \"mode\": \"" << mode << "\", \"dtype\": \""
      << o.dtype_name << "\", \"head_dim\": " << head_dim << ", \"seq_len\": " << length
      << ", \"batch\": " << batch << ", \"heads\": " << o.heads << ", \"pass\": \"" << pass
      << "\", \"status\": \"" << json_escape(status) << "\", \"ms\": ";
  if (ok)
    out << timing.ms << ", \"tflops\": " << tflops << ", \"peak_mem_bytes\": " << timing.peak_bytes;
  else
    out << "null, \"tflops\": null, \"peak_mem_bytes\": null";
  out << "}\n";
  out.flush();
}

// Runs every implementation and pass at one shape; a case that ran out of memory is skipped
// at the longer lengths after it (`out_of_memory` holds impl|mode|D|pass).
void bench_shape(const CudaBenchOptions& o, const CudaBenchPlan& plan, const Shape& shape,
                 const AttentionBias& alibi, std::set<std::string>& out_of_memory, ResultsLog& log) {
  for (const auto& impl : plan.impls) {
    torch::Tensor materialised;  // (H, T, T) ALiBi bias for sdpa-bias, built untimed
    std::string unavailable;
    const AttentionFn fn = attention_fn(impl, shape.causal, alibi, materialised, unavailable);
    // What `auto` runs: the route of the GPU table for this shape (its line names it).
    std::string shown = impl;
    if (impl == "auto") {
      const auto [paper, attention_options] = auto_call(alibi, shape.causal);
      shown = std::string("auto:") +
              to_string(choose_gpu_route(shape.q.detach().requires_grad_(true), shape.k, shape.v, paper,
                                         attention_options, gpu_kernels_present())
                            .route);
    }
    for (const auto& pass : plan.passes) {
      const std::string key = impl + "|" + shape.mode + "|" + std::to_string(shape.head_dim) + "|" + pass;
      std::string status = "ok";
      Timing timing;
      if (!fn) {
        status = unavailable;
      } else if (out_of_memory.count(key)) {
        status = "skipped (out of memory at a shorter length)";
      } else {
        try {
          if (impl == "sdpa-bias" && !materialised.defined())
            materialised = materialize_bias(alibi, o.heads, shape.length, shape.length, shape.causal,
                                            shape.q.options());
          timing = time_pass(fn, pass, shape, o.warmup, o.repeats);
        } catch (const c10::Error& e) {
          if (!is_out_of_memory(e)) throw;
          status = "out of memory";
          out_of_memory.insert(key);
        }
        c10::cuda::CUDACachingAllocator::emptyCache();
      }
      report_measurement(log, o, shape, shown, pass, status, timing);
    }
  }
}

// Draws a shape's random inputs (seeded by length and head dimension) and counts its FLOPs.
Shape make_shape(const CudaBenchOptions& o, const CudaBenchPlan& plan, bool causal, const std::string& mode,
                 int64_t head_dim, int64_t length) {
  Shape shape;
  shape.mode = mode;
  shape.causal = causal;
  shape.head_dim = head_dim;
  shape.length = length;
  const int64_t batch = std::max<int64_t>(1, o.tokens / length);
  shape.batch = batch;
  const int64_t heads = o.heads;
  torch::manual_seed(uint64_t(length * 131 + head_dim));
  const auto tensor_options = torch::TensorOptions().dtype(plan.dtype).device(torch::kCUDA);
  shape.q = torch::randn({batch, heads, length, head_dim}, tensor_options);  // (B, H, T, D)
  shape.k = torch::randn({batch, heads, length, head_dim}, tensor_options);
  shape.v = torch::randn({batch, heads, length, head_dim}, tensor_options);
  shape.dout = torch::randn({batch, heads, length, head_dim}, tensor_options);
  shape.forward_flops =
      4.0 * batch * heads * double(length) * length * head_dim / (causal ? 2 : 1);
  return shape;
}

}  // namespace

int bench_attention_cuda(const std::vector<std::string>& args) {
  CudaBenchOptions o;
  if (!parse_cuda_bench_options(args, o)) return 0;
  if (o.device != "cuda") throw std::invalid_argument("--device must be cuda here, got '" + o.device + "'");
  const std::string why_not = cuda_unavailable_reason();
  if (!why_not.empty() || !cuda_attention()) {
    std::cerr << "extrap bench attention: no CUDA here: "
              << (why_not.empty() ? "libextrap_cuda.so registered no fused attention" : why_not) << "\n";
    return 1;
  }
  const CudaBenchPlan plan = plan_from_options(o);
  ResultsLog log = open_results(o.out_path);

  std::printf("device: %s\ndate: %s\nextrap kernels: %s\ntokens per batch %lld, H %lld, %s, median of %d calls after %d\n\n",
              log.device_name.c_str(), log.date.c_str(), log.kernel_shapes.c_str(), (long long)o.tokens, (long long)o.heads,
              o.dtype_name.c_str(), o.repeats, o.warmup);
  std::printf("%-18s %-14s %4s %6s %-17s %10s %9s %10s\n", "impl", "mode", "D", "T", "pass", "ms",
              "TFLOP/s", "peak GB");

  const auto slopes = torch::tensor(alibi_slopes(int(o.heads)), torch::kFloat64)
                          .to(torch::TensorOptions().dtype(torch::kFloat32).device(torch::kCUDA));
  std::set<std::string> out_of_memory;  // impl|mode|D|pass that ran out at a shorter T

  for (const int64_t head_dim : plan.head_dims) {
    for (const bool causal : plan.modes) {
      const std::string mode = causal ? "causal" : "bidirectional";
      const AttentionBias alibi =
          causal ? AttentionBias::linear_causal(slopes) : AttentionBias::linear_symmetric(slopes);
      for (const int64_t length : plan.lengths)
        bench_shape(o, plan, make_shape(o, plan, causal, mode, head_dim, length), alibi, out_of_memory, log);
    }
  }
  std::printf("\nresults appended to %s\n", o.out_path.c_str());
  return 0;
}

}  // namespace extrap::cli
