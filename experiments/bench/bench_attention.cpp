// `extrap bench attention`: wall time and peak memory of one attention call (inference, no
// grad) over a range of lengths, on the same inputs and the same bias description: extrap's
// reference (materialised (B, H, T, T) scores and (H, T, T) bias), memory-efficient blockwise
// path and fused CPU kernel (where the bias is one it takes: none, ALiBi), beside what a
// PyTorch 2 user would call instead: scaled_dot_product_attention with the bias materialised as
// its mask, and without a bias (the speed ceiling). Paths are
// skipped where their estimated memory exceeds a budget. Peak memory is the resident-set
// increase during the call (experiments/bench/bench_util.h says how).
#include "core/attention/attention.h"
#include "core/attention/efficient_attention.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/base/yaml_options.h"
#include "core/runtime/sysinfo.h"
#include "experiments/bench/bench_util.h"
#include "experiments/cli/commands.h"
#ifdef EXTRAP_WITH_CUDA
#include "experiments/bench/bench_fused_attention.h"
#endif
#include "positions/alibi_slopes.h"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <sstream>

namespace po = boost::program_options;

namespace extrap::cli {
namespace {

std::vector<int64_t> parse_lengths(const std::string& text) {
  std::vector<int64_t> lengths;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    int64_t length = 0;
    try {
      length = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || length < 1)
      throw ConfigError("--lengths: '" + item + "' is not a positive integer (in '" + text + "')");
    lengths.push_back(length);
  }
  if (lengths.empty()) throw ConfigError("--lengths: no lengths given");
  return lengths;
}

constexpr int64_t kDenseMaxDistance = 128;

// The bias each --bias names, as a position method would describe it.
//   alibi: ALiBi slopes; causal ALiBi when causal, symmetric ALiBi when bidirectional.
//   dense: a T5-like table, one learned-looking value per head and clipped relative distance
//          (|i - j| up to 128), gathered tile by tile as a dense bias.
AttentionBias make_bias(const std::string& kind, int64_t heads, bool causal) {
  if (kind == "none") return AttentionBias::none();
  if (kind == "alibi") {
    auto slopes = torch::tensor(alibi_slopes(int(heads)), torch::kFloat64).to(torch::kFloat32);
    return causal ? AttentionBias::linear_causal(slopes) : AttentionBias::linear_symmetric(slopes);
  }
  if (kind == "dense") {
    auto table = torch::randn({heads, 2 * kDenseMaxDistance + 1});  // (H, 2R + 1)
    return AttentionBias::dense_blocks([table](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
      auto i = torch::arange(q0, q1, torch::kLong).view({-1, 1});
      auto j = torch::arange(k0, k1, torch::kLong).view({1, -1});
      auto index = (i - j).clamp(-kDenseMaxDistance, kDenseMaxDistance) + kDenseMaxDistance;  // (Tq, Tk)
      return table.index_select(1, index.flatten()).view({table.size(0), q1 - q0, k1 - k0});
    });
  }
  throw ConfigError("unknown --bias '" + kind + "' (known: alibi, none, dense)");
}

// What the reference holds at its peak, in multiples of the (B, H, T, T) fp32 score tensor:
// scores, biased scores and probabilities, plus the (H, T, T) bias and its temporaries.
// Each factor is this benchmark's own peak for that bias, rounded up so that the memory budget
// check errs on the safe side (the peaks are in benchmarks/RESULTS.md).
double reference_peak_factor(const std::string& bias, double softcap) {
  const double cap = softcap > 0 ? 2 : 0;  // the capped copy and tanh's output
  if (bias == "alibi") return 4.5 + cap;
  if (bias == "dense") return 3.5 + cap;
  return 2.5 + cap;
}

// Whether the command line asks for --device cuda, which the CUDA benchmark handles.
bool asks_for_cuda(const Args& args) {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i] == "--device=cuda" || (args[i] == "--device" && i + 1 < args.size() && args[i + 1] == "cuda"))
      return true;
  return false;
}

// The command line of `extrap bench attention` on the CPU.
struct AttentionBenchOptions {
  std::string device = "cpu", bias_kind = "alibi", lengths_text = "512,1024,2048,4096,8192,16384,32768";
  int64_t heads = 8, head_dim = 64, batch = 1, threads = 0;
  int repeats = 3;
  bool causal_flag = false, bidirectional = false;
  double budget_gb = 6.0, softcap = 0;
  EfficientAttentionBlocks blocks;
};

// Parses and checks the command line; false when --help was asked for (and printed).
bool parse_attention_bench_options(const Args& args, AttentionBenchOptions& o) {
  po::options_description options("extrap bench attention");
  options.add_options()
      ("device", po::value(&o.device)->default_value(o.device), "cpu or cuda")
      ("heads", po::value(&o.heads)->default_value(o.heads), "attention heads H")
      ("head-dim", po::value(&o.head_dim)->default_value(o.head_dim), "head dimension D")
      ("batch", po::value(&o.batch)->default_value(o.batch), "batch size B")
      ("lengths", po::value(&o.lengths_text)->default_value(o.lengths_text), "comma-separated sequence lengths T")
      ("bias", po::value(&o.bias_kind)->default_value(o.bias_kind), "alibi, none or dense (T5-like table, gathered per tile)")
      ("softcap", po::value(&o.softcap)->default_value(o.softcap),
       "attention.softcap C: each score capped as C tanh(s / C) before the bias (Gemma 2: 50; 0: off); "
       "sdpa-bias, which cannot cap, is then skipped")
      ("causal", po::bool_switch(&o.causal_flag), "causal attention (the default)")
      ("bidirectional", po::bool_switch(&o.bidirectional), "bidirectional attention (alibi: symmetric ALiBi)")
      ("repeats", po::value(&o.repeats)->default_value(o.repeats), "timed calls per path and length (median reported)")
      ("threads", po::value(&o.threads)->default_value(o.threads), "LibTorch intra-op threads (0: all available cores)")
      ("query-block", po::value(&o.blocks.query_block)->default_value(o.blocks.query_block), "efficient path: queries per tile")
      ("key-block", po::value(&o.blocks.key_block)->default_value(o.blocks.key_block), "efficient path: keys per tile")
      ("reference-budget-gb", po::value(&o.budget_gb)->default_value(o.budget_gb),
       "skip a path (reference, sdpa-bias) where its estimated peak memory exceeds this");
  po::variables_map values;
  if (!parse(args, "extrap bench attention [--device cpu|cuda] [--lengths 512,1024,...] [--bias alibi|none|dense] "
                   "[--softcap C] [--causal|--bidirectional]", options, values))
    return false;
  if (o.causal_flag && o.bidirectional) throw ConfigError("give --causal or --bidirectional, not both");
  if (o.device != "cpu") throw ConfigError("unknown --device '" + o.device + "' (known: cpu, cuda)");
  if (o.heads < 1 || o.head_dim < 1 || o.batch < 1 || o.repeats < 1)
    throw ConfigError("--heads, --head-dim, --batch and --repeats must be positive");
  if (o.blocks.query_block < 1 || o.blocks.key_block < 1)
    throw ConfigError("--query-block and --key-block must be positive");
  if (!(o.softcap >= 0) || !std::isfinite(o.softcap))
    throw ConfigError("--softcap must be a finite number at least 0, got " + std::to_string(o.softcap));
  return true;
}

// Prints the machine, the shapes, the paths and the table's header.
void print_header(const AttentionBenchOptions& o, const AttentionBias& bias, bool causal, int used_threads) {
  std::printf("machine: %s\ndate: %s\nruntime: %s\n", machine_description().c_str(), iso_time_now().c_str(),
              runtime_summary().c_str());
  std::printf("attention: B %lld, H %lld, D %lld, fp32, %s, bias %s, %d threads\n", (long long)o.batch,
              (long long)o.heads, (long long)o.head_dim, causal ? "causal" : "bidirectional",
              bias.describe().c_str(), used_threads);
  std::printf("paths: reference = extrap's materialised scores and bias; efficient = extrap's blockwise "
              "path (%lld x %lld tiles);\n"
              "       fused = extrap's fused CPU kernel (the path `auto` takes for this bias; skipped where it does not take it);\n"
              "       sdpa-bias = PyTorch's scaled_dot_product_attention with the (1, H, T, T) bias "
              "materialised as its mask, built before timing (its size: bias MB);\n"
              "       sdpa-none = scaled_dot_product_attention without a bias (%s), the no-bias ceiling\n",
              (long long)o.blocks.query_block, (long long)o.blocks.key_block,
              causal ? "is_causal" : "no mask");
  std::printf("paths whose estimated memory exceeds %.1f GB are skipped; time: median of %d calls; "
              "memory: peak resident increase during a call, output included\n"
              "|diff|: largest difference from the reference (from sdpa-bias where the reference is skipped)\n\n",
              o.budget_gb, o.repeats);
  std::printf("%7s %12s %10s %12s %10s %12s %10s %12s %10s %10s %12s %10s %10s %10s %10s\n", "T",
              "reference ms", "MB", "efficient ms", "MB", "fused ms", "MB", "sdpa-bias ms", "MB", "bias MB",
              "sdpa-none ms", "MB", "eff |diff|", "fused |diff|", "sdpa |diff|");
}

// The five paths at one length: each output and measurement (no measurement: skipped).
struct PathRuns {
  torch::Tensor reference_out, efficient_out, fused_out, sdpa_bias_out, sdpa_none_out;
  std::optional<bench::CallMeasurement> reference, efficient, fused, sdpa_bias, sdpa_none;
  double bias_bytes = 0;  // of the (H, T, T) fp32 bias sdpa-bias takes as its mask
};

// Measures each path on q, k and v of length t, skipping those over the memory budget.
PathRuns measure_paths(const AttentionBenchOptions& o, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t t, const AttentionBias& bias,
                       const AttentionOptions& attention_options, bool causal) {
  const double scores_bytes = double(o.batch) * o.heads * t * t * 4;
  PathRuns runs;
  runs.bias_bytes = double(o.heads) * t * t * 4;
  if (scores_bytes * reference_peak_factor(o.bias_kind, o.softcap) <= o.budget_gb * 1e9)
    runs.reference = bench::measure_call(
        [&] { runs.reference_out = attention_reference(q, k, v, bias, attention_options); }, o.repeats);
  runs.efficient = bench::measure_call(
      [&] { runs.efficient_out = attention_efficient(q, k, v, bias, attention_options, o.blocks); }, o.repeats);
  if (fused_cpu_attention_unsupported_reason(q, k, v, bias, attention_options).empty())
    runs.fused = bench::measure_call(
        [&] { runs.fused_out = fused_cpu_attention(q, k, v, bias, attention_options); }, o.repeats);
  // PyTorch's CPU kernel for a float mask works blockwise too: the mask is its extra memory. (It
  // has no soft cap: skipped with one.)
  if (!bias.is_none() && bias.softcap == 0 && runs.bias_bytes * 2 <= o.budget_gb * 1e9) {
    // (1, H, T, T), -inf where masked: with four dimensions PyTorch's CPU SDPA takes its flash
    // kernel; given (H, T, T) it would take its slower math path.
    const auto mask = materialize_bias(bias, o.heads, t, t, causal).unsqueeze(0);
    runs.sdpa_bias = bench::measure_call(
        [&] { runs.sdpa_bias_out = at::scaled_dot_product_attention(q, k, v, mask); }, o.repeats);
  }
  runs.sdpa_none = bench::measure_call(
      [&] { runs.sdpa_none_out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal); }, o.repeats);
  return runs;
}

// Prints one path's columns: its median time and peak memory, or "skipped".
void print_measurement(const std::optional<bench::CallMeasurement>& m) {
  if (m) std::printf(" %12.1f %10.1f", m->median_ms, m->peak_extra_bytes / 1e6);
  else std::printf(" %12s %10s", "skipped", "-");
}

// Prints one length's row: each path's columns, then the differences from the truth.
void print_row(int64_t t, const PathRuns& runs, const AttentionBias& bias) {
  std::printf("%7lld", (long long)t);
  print_measurement(runs.reference);
  print_measurement(runs.efficient);
  print_measurement(runs.fused);
  print_measurement(runs.sdpa_bias);
  if (runs.sdpa_bias) std::printf(" %10.1f", runs.bias_bytes / 1e6);
  else std::printf(" %10s", "-");
  print_measurement(runs.sdpa_none);
  const torch::Tensor& truth = runs.reference ? runs.reference_out : runs.sdpa_bias ? runs.sdpa_bias_out
                               : bias.is_none() && bias.softcap == 0 ? runs.sdpa_none_out : torch::Tensor();
  auto diff = [&](const torch::Tensor& out) {
    if (!truth.defined() || !out.defined() || out.is_same(truth)) return std::string("-");
    char text[32];
    std::snprintf(text, sizeof text, "%.2e", (out - truth).abs().max().item<double>());
    return std::string(text);
  };
  // (sdpa-none computes no cap: its difference means nothing beside one.)
  std::printf(" %10s %12s %10s\n", diff(runs.efficient_out).c_str(), diff(runs.fused_out).c_str(),
              bias.softcap > 0 ? "-" : diff(bias.is_none() ? runs.sdpa_none_out : runs.sdpa_bias_out).c_str());
  std::fflush(stdout);
}

}  // namespace

int bench_attention(const Args& args) {
  // The CUDA benchmark has options of its own: hand it the whole command line.
  if (asks_for_cuda(args)) {
#ifdef EXTRAP_WITH_CUDA
    return bench_attention_cuda(args);
#else
    std::cerr << "extrap bench attention: this binary was built without CUDA (needs nvcc and a "
                 "CUDA-enabled LibTorch; see core/attention/cuda/NOTES.md)\n";
    return 1;
#endif
  }
  AttentionBenchOptions o;
  if (!parse_attention_bench_options(args, o)) return 0;
  const std::vector<int64_t> lengths = parse_lengths(o.lengths_text);
  const bool causal = !o.bidirectional;
  const int used_threads = configure_threads(o.threads);
  AttentionBias bias = make_bias(o.bias_kind, o.heads, causal);
  bias.softcap = o.softcap;
  AttentionOptions attention_options;
  attention_options.causal = causal;
  torch::NoGradGuard no_grad;

  print_header(o, bias, causal, used_threads);
  for (const int64_t t : lengths) {
    torch::manual_seed(uint64_t(t));
    auto q = torch::randn({o.batch, o.heads, t, o.head_dim});  // (B, H, T, D)
    auto k = torch::randn({o.batch, o.heads, t, o.head_dim});
    auto v = torch::randn({o.batch, o.heads, t, o.head_dim});
    const PathRuns runs = measure_paths(o, q, k, v, t, bias, attention_options, causal);
    print_row(t, runs, bias);
  }
  return 0;
}

}  // namespace extrap::cli
