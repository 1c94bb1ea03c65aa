#include "core/eval/attention_profile.h"

#include "core/attention/attention_observer.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/base/float_range.h"
#include "core/eval/evaluator.h"
#include "core/kernels/cpu_vector_math.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <chrono>
#include <string>

namespace extrap {

namespace {

// The logits of keys [lo, hi) of query position i, in place, for a bias of j - i alone read along
// the row: (s_j + by_offset[j]) * scale. Returns their maximum and `top`'s.
EXTRAP_ISA_KERNEL(float, offset_logits, (float* s, int64_t lo, int64_t hi, const float* by_offset, float scale, float top),
                  (s, lo, hi, by_offset, scale, top)) {
#pragma omp simd reduction(max : top)
  for (int64_t j = lo; j < hi; ++j) {
    const float z = (s[j] + by_offset[j]) * scale;
    s[j] = z;
    top = top > z ? top : z;
  }
  return top;
}

// The same with the linear bias -slope_left (i - j) left of i and -slope_right (j - i) right of
// it, plus cumulative[i] - cumulative[j] where kCumulative (forget gates). The distance counts in
// int32: AVX2 has no vector conversion of int64 to float, and an int64 one kept these loops scalar
// on AVX2 paths.
template <bool kCumulative>
[[gnu::always_inline]] inline float linear_logits_loop(float* s, int64_t lo, int64_t hi, int64_t i, float slope_left,
                                                      float slope_right, const float* cumulative, float scale,
                                                      float top) {
  const float ci = kCumulative ? cumulative[i] : 0.0f;
  const int32_t nearest = int32_t(i - lo), count = int32_t(hi - lo);  // d = i - j = nearest - t
  s += lo;
  if (kCumulative) cumulative += lo;
#pragma omp simd reduction(max : top)
  for (int32_t t = 0; t < count; ++t) {
    const float d = float(nearest - t);
    const float gate = kCumulative ? ci - cumulative[t] : 0.0f;
    const float z = (s[t] + (d >= 0 ? -slope_left * d : slope_right * d) + gate) * scale;
    s[t] = z;
    top = top > z ? top : z;
  }
  return top;
}
EXTRAP_ISA_KERNEL(float, linear_logits,
                  (float* s, int64_t lo, int64_t hi, int64_t i, float slope_left, float slope_right, float scale, float top),
                  (s, lo, hi, i, slope_left, slope_right, scale, top)) {
  return linear_logits_loop<false>(s, lo, hi, i, slope_left, slope_right, nullptr, scale, top);
}
EXTRAP_ISA_KERNEL(float, gated_linear_logits,
                  (float* s, int64_t lo, int64_t hi, int64_t i, float slope_left, float slope_right,
                   const float* cumulative, float scale, float top),
                  (s, lo, hi, i, slope_left, slope_right, cumulative, scale, top)) {
  return linear_logits_loop<true>(s, lo, hi, i, slope_left, slope_right, cumulative, scale, top);
}

// The logits of keys [lo, hi) of query position i, in place: the three kernels above by the bias
// (by_offset given: a bias of j - i alone; else linear, plus the forget gates' cumulative where
// given). Returns their maximum and `top`'s.
float profile_logits(float* s, int64_t lo, int64_t hi, int64_t i, float slope_left, float slope_right,
                     const float* cumulative, const float* by_offset, float scale, float top) {
  if (by_offset) return offset_logits(s, lo, hi, by_offset, scale, top);
  if (cumulative) return gated_linear_logits(s, lo, hi, i, slope_left, slope_right, cumulative, scale, top);
  return linear_logits(s, lo, hi, i, slope_left, slope_right, scale, top);
}

// Sums over keys [from, to) in float32, a block of kSumBlock keys at a time, each block's sum
// then added in float64 (GCC vectorises float32 sums, not float32 terms summed in float64): a
// block's rounding is at most a few units in the last place of float32, about 1e-7 relative.
constexpr int64_t kSumBlock = 256;

// With x_j = z_j - top: adds sum_j e^{x_j} to sums[0] and sum_j e^{x_j} x_j to sums[1].
EXTRAP_ISA_KERNEL(void, profile_exp_sums, (const float* z, int64_t from, int64_t to, float top, double* sums),
                  (z, from, to, top, sums)) {
  for (int64_t block = from; block < to; block += kSumBlock) {
    const int64_t end = std::min(to, block + kSumBlock);
    float e_sum = 0, ex_sum = 0;
#pragma omp simd reduction(+ : e_sum, ex_sum)
    for (int64_t j = block; j < end; ++j) {
      const float x = z[j] - top;
      const float e = exp_float(x);
      e_sum += e;
      ex_sum += e * x;
    }
    sums[0] += e_sum;
    sums[1] += ex_sum;
  }
}

// Adds sum_j p_j to sums[0] and sum_j p_j ln p_j to sums[1] over [from, to) (0 ln 0 = 0).
EXTRAP_ISA_KERNEL(void, weight_sums, (const float* p, int64_t from, int64_t to, double* sums), (p, from, to, sums)) {
  for (int64_t block = from; block < to; block += kSumBlock) {
    const int64_t end = std::min(to, block + kSumBlock);
    float p_sum = 0, plogp_sum = 0;
#pragma omp simd reduction(+ : p_sum, plogp_sum)
    for (int64_t j = block; j < end; ++j) {
      p_sum += p[j];
      plogp_sum += p[j] * log_float(p[j]);
    }
    sums[0] += p_sum;
    sums[1] += plogp_sum;
  }
}

// One row of the weights the profile computes itself (profile_computes()): query position i,
// its scaled scores q_i . k_j / sqrt(d) for keys [0, keys) in `s`, visible [lo, hi) (the causal,
// window, chunk and look-left/right masks leave one range of keys); the logits as
// profile_logits() makes them (by_offset: the row's biases, by_offset[j] at key j), and one more
// logit `sink` that weighs no value (has_sink).
// Writes mass[b] = sum_{j in bin b} p_ij and entropy[b] = -sum p_ij ln p_ij (with p_ij =
// e^{z_ij - m} / Z: -p_ij ln p_ij = p_ij (ln Z - (z_ij - m))); returns the row's total (1 less
// the sink's share).
double profile_logit_row(float* s, int64_t lo, int64_t hi, int64_t i, float slope_left, float slope_right,
                         const float* cumulative, const float* by_offset, float scale, bool has_sink, float sink,
                         bool causal, const int64_t* edges, int64_t bins, double* mass, double* entropy) {
  const float top = profile_logits(s, lo, hi, i, slope_left, slope_right, cumulative, by_offset, scale,
                                   has_sink ? sink : -std::numeric_limits<float>::infinity());
  double z_sum = has_sink ? std::exp(double(sink) - double(top)) : 0.0;
  for (int64_t b = 0; b < bins; ++b) {
    double sums[2] = {0, 0};
    // Keys at or before i, then (not causal) keys after it.
    profile_exp_sums(s, std::max(lo, i - edges[b + 1] + 1), std::min(hi, i - edges[b] + 1), top, sums);
    if (!causal)
      profile_exp_sums(s, std::max(lo, i + std::max<int64_t>(edges[b], 1)), std::min(hi, i + edges[b + 1]), top, sums);
    mass[b] = sums[0];
    entropy[b] = sums[1];
    z_sum += sums[0];
  }
  const double log_z = std::log(z_sum);
  double total = 0;
  for (int64_t b = 0; b < bins; ++b) {
    const double e_sum = mass[b], ex_sum = entropy[b];
    mass[b] = e_sum / z_sum;
    entropy[b] = (e_sum * log_z - ex_sum) / z_sum;
    total += mass[b];
  }
  return total;
}

// One row of weights summed into distance bins: query position i against keys [0, keys), bin b
// holding distances [edges[b], edges[b + 1]) (i - j when causal: keys after i have weight 0 and
// are skipped; |i - j| otherwise). Writes sum_j p_ij to mass[b] and -sum_j p_ij ln p_ij to
// entropy[b] and returns the row's sum. Each bin is one or two contiguous ranges of keys.
double bin_weight_row(const float* p, int64_t keys, int64_t i, bool causal, const int64_t* edges, int64_t bins,
                      double* mass, double* entropy) {
  double total = 0;
  for (int64_t b = 0; b < bins; ++b) {
    double sums[2] = {0, 0};
    // Keys at or before i, then (not causal) keys after it.
    weight_sums(p, std::max<int64_t>(0, i - edges[b + 1] + 1), std::min(keys, i - edges[b] + 1), sums);
    if (!causal) weight_sums(p, std::max<int64_t>(0, i + std::max<int64_t>(edges[b], 1)), std::min(keys, i + edges[b + 1]), sums);
    mass[b] = sums[0];
    entropy[b] = -sums[1];
    total += sums[0];
  }
  return total;
}

// Keys [lo, hi) of keys [0, keys) that rows first .. first + n - 1 do not skip, under a linear
// bias of -slope_left per unit of distance to the left and -slope_right to the right: the keys
// the fused kernel would not find negligible (negligible_distance, core/attention/
// fused_cpu_attention.h), key by key. q_norms and own_norms: the n rows' scaled |q_i| and |k_i|;
// k_max: the largest |k_j| of all keys; softcap: the scores' cap C (0: none), which bounds the
// reach by 2C as in the kernel.
std::pair<int64_t, int64_t> negligible_beyond(const float* q_norms, const float* own_norms, int64_t n,
                                              float k_max, int64_t first, float slope_left, float slope_right,
                                              int64_t keys, float softcap) {
  float q_max = 0, own = 0;
  for (int64_t t = 0; t < n; ++t) q_max = std::max(q_max, q_norms[t]), own = std::max(own, own_norms[t]);
  double reach = double(q_max) * (double(k_max) + double(own));
  if (softcap > 0) reach = std::min(reach, 2.0 * double(softcap));
  int64_t lo = 0, hi = keys;
  if (slope_left > 0)
    lo = std::clamp<int64_t>(int64_t(std::floor(double(first) - negligible_distance(reach, slope_left))), 0, first);
  if (slope_right > 0)
    hi = std::clamp<int64_t>(int64_t(std::ceil(double(first + n - 1) + negligible_distance(reach, slope_right))) + 1,
                             first + n, keys);
  return {lo, hi};
}

// Whether profile_logit_row computes this call's weights: no bias, a linear one (ALiBi family),
// forget gates or a bias of j - i alone (T5, KERPLE, Sandwich: by_offset), with any masks, logit
// scale, sink and soft cap, on the CPU. The rest (other dense biases such as FIRE's, CoPE, DAPE,
// PaTH, stick-breaking, Self-Extend, sampled positions) take attention_probabilities().
bool profile_computes(const torch::Tensor& q, const AttentionBias& bias) {
  using Kind = AttentionBias::Kind;
  return q.is_cpu() && !bias.far_queries.defined() && (bias.softcap == 0 || normal_float32(bias.softcap)) &&
         (bias.kind == Kind::None || (bias.kind == Kind::Linear && !bias.positions.defined()) ||
          bias.kind == Kind::Cumulative || (bias.kind == Kind::Dense && bias.by_offset));
}

// A (H,) or (H, n) tensor's float32 values on the CPU ({} when undefined).
std::vector<float> host_floats(const torch::Tensor& t) {
  if (!t.defined()) return {};
  const auto c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
  return std::vector<float>(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
}

// Sums each layer's weights into distance bins as the forward pass calls attention.
class ProfileObserver : public AttentionObserver {
 public:
  ProfileObserver(int64_t layers, const std::vector<int64_t>& edges, int64_t query_block)
      : layers_(layers), edges_(edges), query_block_(query_block) {}

  torch::Tensor observe(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const AttentionBias& bias, const AttentionOptions& options) override {
    TORCH_CHECK(layer_ < layers_, "attention profile: more attention calls than the model's ", layers_, " layers");
    const int64_t batch = q.size(0), heads = q.size(1), tk = k.size(2);
    const int64_t bins = int64_t(edges_.size()) - 1;
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
    if (mass_.empty())
      for (int64_t l = 0; l < layers_; ++l) {
        mass_.push_back(torch::zeros({heads, bins}, f64));
        entropy_.push_back(torch::zeros({heads, bins}, f64));
        sink_.push_back(torch::zeros({heads}, f64));
      }
    // Rows whose weights are held at once: at most query_block, and few enough that a block's
    // float32 scores stay near 32 MiB on the CPU (fewer rows cost more than they save: the
    // product packs every key for each block) and near 256 MiB on a GPU, each block copied to
    // the CPU for binning.
    const int64_t row_bytes = std::max<int64_t>(1, batch * heads * tk * 4);
    const int64_t target = int64_t(q.is_cpu() ? 32 : 256) << 20;
    const int64_t rows = std::clamp<int64_t>(target / row_bytes, 1, query_block_);
    torch::Tensor output;  // the call's output where computed here (see AttentionObserver)
    if (profile_computes(q, bias))
      bin_logit_rows(q.to(torch::kFloat32), k.to(torch::kFloat32), bias, options.causal, rows);
    else
      output = bin_probability_rows(q, k, v, bias, options, rows);
    ++layer_;
    return output.defined() ? output.to(q.scalar_type()) : output;
  }

  int64_t calls() const { return layer_; }
  void next_forward() { layer_ = 0; }
  std::vector<torch::Tensor> mass_, entropy_, sink_;  // per layer, on the CPU

 private:
  // A block of rows' sums (B, H, n, 2 bins + 1) into this layer's profile: per row the bins'
  // masses, the bins' entropies and the row's total, whose rest is a sink's (or with
  // stick-breaking, the query's own value's: distance 0).
  void accumulate(const torch::Tensor& sums, const AttentionBias& bias) {
    const int64_t bins = int64_t(edges_.size()) - 1;
    // An array, not a braced list: LibTorch 2.11 finds sum({0, 2}) ambiguous (IntArrayRef or
    // DimnameList).
    const std::array<int64_t, 2> batch_and_rows{0, 2};
    torch::Tensor& mass = mass_[layer_];
    torch::Tensor& entropy = entropy_[layer_];
    mass.add_(sums.narrow(3, 0, bins).sum(batch_and_rows));
    entropy.add_(sums.narrow(3, bins, bins).sum(batch_and_rows));
    const auto rest = (1.0 - sums.select(3, 2 * bins)).clamp_min(0.0);  // (B, H, n)
    if (bias.kind == AttentionBias::Kind::StickBreaking) {
      mass.select(1, 0).add_(rest.sum(batch_and_rows));
      entropy.select(1, 0).add_(torch::special_xlogy(rest, rest).neg().sum(batch_and_rows));
    } else if (bias.sink.defined()) {
      sink_[layer_].add_(rest.sum(batch_and_rows));
    }
  }

  // The biases profile_logit_row computes, on the host: a linear bias's slopes and directions,
  // forget gates' cumulative sums, a bias of j - i by offset, the logit scale and the sinks.
  struct RowBiases {
    bool linear = false;
    std::vector<float> slope_left, slope_right, look_left, look_right, scale, sinks;
    torch::Tensor cumulative;  // (B, H, Tk) float32
    torch::Tensor offsets;     // (H, R) float32: offsets -(tk - 1) .. R - tk
  };

  static RowBiases row_biases(const torch::Tensor& q, int64_t tk, const AttentionBias& bias, bool causal) {
    RowBiases out;
    const int64_t batch = q.size(0), heads = q.size(1);
    out.linear = bias.kind == AttentionBias::Kind::Linear;
    if (out.linear) {
      out.slope_left = host_floats(bias.slopes_left);
      out.slope_right = host_floats(bias.slopes_right);
      out.look_left = host_floats(bias.look_left);
      out.look_right = host_floats(bias.look_right);
    }
    out.scale = host_floats(bias.logit_scale);
    out.sinks = host_floats(bias.sink);
    if (bias.kind == AttentionBias::Kind::Cumulative) {
      TORCH_CHECK(causal, "a cumulative (forgetting-gate) bias is defined for causal attention only");
      out.cumulative = bias.cumulative.detach().to(torch::kFloat32).contiguous();
      TORCH_CHECK(out.cumulative.dim() == 3 && out.cumulative.size(0) == batch && out.cumulative.size(1) == heads &&
                      out.cumulative.size(2) >= tk,
                  "attention profile: cumulative bias ", out.cumulative.sizes(), " for q ", q.sizes(), " and ", tk, " keys");
    }
    if (bias.kind == AttentionBias::Kind::Dense) {
      const int64_t R = causal ? tk : 2 * tk - 1;
      out.offsets = bias.by_offset(-(tk - 1), R - (tk - 1)).detach().to(torch::kCPU, torch::kFloat32).contiguous();
      TORCH_CHECK(out.offsets.dim() == 2 && out.offsets.size(0) == heads && out.offsets.size(1) == R,
                  "attention profile: a bias by offset gave ", out.offsets.sizes(), " for ", heads, " heads and ", R,
                  " offsets");
    }
    return out;
  }

  // The weights of rows computed here from their logits (profile_computes), `rows` at a time:
  // under a linear bias without a logit scale, far keys are skipped where they are negligible.
  void bin_logit_rows(const torch::Tensor& qf, const torch::Tensor& kf, const AttentionBias& bias, bool causal,
                      int64_t rows) {
    const int64_t batch = qf.size(0), heads = qf.size(1), tq = qf.size(2), tk = kf.size(2);
    const int64_t bins = int64_t(edges_.size()) - 1;
    const RowBiases rb = row_biases(qf, tk, bias, causal);
    const float softcap = float(bias.softcap);
    const auto scaled = qf * (1.0 / std::sqrt(double(qf.size(3))));
    const bool bounded = rb.linear && rb.scale.empty();
    const torch::Tensor q_norms = bounded ? scaled.norm(2, -1).contiguous() : torch::Tensor(),  // (B, H, Tq)
        k_norms = bounded ? kf.norm(2, -1).contiguous() : torch::Tensor();                      // (B, H, Tk)
    const torch::Tensor k_max = bounded ? std::get<0>(k_norms.max(-1)).contiguous() : torch::Tensor();  // (B, H)
    std::vector<int64_t> key_lo(size_t(batch * heads)), key_hi(size_t(batch * heads));
    for (int64_t r = 0; r < tq; r += rows) {
      const int64_t n = std::min(rows, tq - r), first = tk - tq + r, keys = causal ? first + n : tk;
      bool skips = false;
      for (int64_t bh = 0; bh < batch * heads; ++bh) {
        const auto [lo, hi] = bounded ? negligible_beyond(q_norms.data_ptr<float>() + bh * tq + r,
                                                          k_norms.data_ptr<float>() + bh * tk + first, n,
                                                          k_max.data_ptr<float>()[bh], first,
                                                          rb.slope_left[size_t(bh % heads)],
                                                          rb.slope_right[size_t(bh % heads)], keys, softcap)
                                      : std::pair<int64_t, int64_t>{0, keys};
        key_lo[size_t(bh)] = lo;
        key_hi[size_t(bh)] = hi;
        skips = skips || lo > 0 || hi < keys;
      }
      torch::Tensor scores;
      if (!skips) {
        scores = torch::matmul(scaled.narrow(2, r, n), kf.narrow(2, 0, keys).transpose(-2, -1)).contiguous();
      } else {  // each (batch, head) against the keys it does not skip, in place in the rows
        scores = torch::empty({batch, heads, n, keys}, qf.options());
        for (int64_t bh = 0; bh < batch * heads; ++bh) {
          const int64_t b = bh / heads, h = bh % heads, lo = key_lo[size_t(bh)], hi = key_hi[size_t(bh)];
          auto destination = scores[b][h].narrow(1, lo, hi - lo);
          at::mm_out(destination, scaled[b][h].narrow(0, r, n), kf[b][h].narrow(0, lo, hi - lo).t());
        }
      }
      auto sums = torch::zeros({batch, heads, n, 2 * bins + 1}, torch::TensorOptions().dtype(torch::kFloat64));
      float* s = scores.data_ptr<float>();
      double* out = sums.data_ptr<double>();
      const int64_t* edges = edges_.data();
      at::parallel_for(0, batch * heads * n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const int64_t h = (row / n) % heads, t = row % n, i = first + t;
          const auto span = bias.option_span(i, tk, causal);  // window, chunk, causal
          int64_t lo = std::max(span.first, key_lo[size_t(row / n)]), hi = std::min(span.second + 1, key_hi[size_t(row / n)]);
          if (rb.linear && rb.look_left[size_t(h)] == 0) lo = std::max(lo, i);
          if (rb.linear && rb.look_right[size_t(h)] == 0) hi = std::min(hi, i + 1);
          const float* f =
              rb.cumulative.defined() ? rb.cumulative.data_ptr<float>() + (row / n) * rb.cumulative.size(2) : nullptr;
          // by_offset[j] = the bias at offset j - i, column j - i + tk - 1 of the head's row.
          const float* by_offset =
              rb.offsets.defined() ? rb.offsets.data_ptr<float>() + h * rb.offsets.size(1) + (tk - 1 - i) : nullptr;
          double* o = out + row * (2 * bins + 1);
          if (softcap > 0 && hi > lo) softcap_scores(s + row * keys + lo, 1, hi - lo, keys, softcap);  // before the bias
          o[2 * bins] = profile_logit_row(s + row * keys, lo, hi, i, rb.linear ? rb.slope_left[size_t(h)] : 0.0f,
                                          rb.linear ? rb.slope_right[size_t(h)] : 0.0f, f, by_offset,
                                          rb.scale.empty() ? 1.0f : rb.scale[size_t(h * tq + r + t)], !rb.sinks.empty(),
                                          rb.sinks.empty() ? 0.0f : rb.sinks[size_t(h)], causal, edges, bins, o, o + bins);
        }
      });
      accumulate(sums, bias);
    }
  }

  // The weights of rows the reference path computes (attention_probabilities), `rows` at a
  // time; outside autograd their product with v is the call's output (returned), which the
  // forward pass then does not compute again.
  torch::Tensor bin_probability_rows(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                     const AttentionBias& bias, const AttentionOptions& options, int64_t rows) {
    const int64_t batch = q.size(0), heads = q.size(1), tq = q.size(2), tk = k.size(2);
    const int64_t bins = int64_t(edges_.size()) - 1;
    const bool stick_breaking = bias.kind == AttentionBias::Kind::StickBreaking;
    const bool attend = !torch::GradMode::is_enabled();
    const auto vf = attend ? v.to(torch::kFloat32) : torch::Tensor();
    torch::Tensor output = attend ? torch::empty({batch, heads, tq, v.size(3)}, vf.options()) : torch::Tensor();
    const int64_t* edges = edges_.data();
    for_each_probability_block(q.to(torch::kFloat32), k.to(torch::kFloat32), bias, options, rows,
                               [&](int64_t r, const torch::Tensor& probs) {
      if (attend) {
        const int64_t n = probs.size(2);
        auto o = torch::matmul(probs, vf.narrow(2, 0, probs.size(3)));
        if (stick_breaking)  // the rest of each row goes to the query's own value
          o += (1 - probs.sum(-1, /*keepdim=*/true)) * vf.narrow(2, tk - tq + r, n);
        output.narrow(2, r, n).copy_(o);
      }
      const auto p = probs.to(torch::kCPU).contiguous();  // (B, H, n, keys)
      const int64_t n = p.size(2), keys = p.size(3), first = tk - tq + r;  // row 0's position
      auto sums = torch::zeros({batch, heads, n, 2 * bins + 1}, torch::TensorOptions().dtype(torch::kFloat64));
      const float* weights = p.data_ptr<float>();
      double* out = sums.data_ptr<double>();
      at::parallel_for(0, batch * heads * n, 1, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          double* o = out + row * (2 * bins + 1);
          o[2 * bins] = bin_weight_row(weights + row * keys, keys, first + row % n, options.causal, edges, bins, o, o + bins);
        }
      });
      accumulate(sums, bias);
    });
    return output;
  }

  int64_t layers_;
  std::vector<int64_t> edges_;
  int64_t query_block_;
  int64_t layer_ = 0;
};

}  // namespace

std::vector<int64_t> distance_bin_edges(int64_t length, int64_t split_at) {
  std::vector<int64_t> edges{0};
  for (int64_t e = 1; e < length; e *= 2) edges.push_back(e);
  if (split_at > 0 && split_at < length) edges.push_back(split_at);
  std::sort(edges.begin(), edges.end());
  edges.erase(std::unique(edges.begin(), edges.end()), edges.end());
  edges.push_back(length);
  return edges;
}

AttentionProfile attention_profile(TransformerLM& model, const TokenStream& stream,
                                   const AttentionProfileSpec& spec, torch::Device device) {
  const auto start = std::chrono::steady_clock::now();
  const std::string what = "attention profile at length " + std::to_string(spec.length);
  if (spec.length < 1) throw EvalFailure(what + ": the length must be at least 1");
  if (spec.query_block < 1) throw EvalFailure(what + ": query block " + std::to_string(spec.query_block));
  if (model->streaming().active())
    throw EvalFailure(what + ": the model reads streams through a StreamingLLM cache; the profile reads whole windows");
  const int64_t available = spec.max_tokens > 0 ? std::min(stream.size(), spec.max_tokens) : stream.size();
  int64_t windows = available / spec.length;
  if (windows == 0)
    throw EvalFailure(what + ": " +
                      (available < stream.size()
                           ? "the first " + std::to_string(available) + " tokens of the stream's " +
                                 std::to_string(stream.size()) + " (max_tokens)"
                           : "the stream's " + std::to_string(available) + " tokens") +
                      " cannot fill one window (give a shorter length or more tokens)");
  if (spec.windows > 0) windows = std::min(windows, spec.windows);

  AttentionProfile out;
  out.length = spec.length;
  out.windows = windows;
  out.causal = model->config().causal();
  out.edges = distance_bin_edges(spec.length, spec.split_at);
  const int64_t layers = model->config().layers;
  ProfileObserver observer(layers, out.edges, spec.query_block);
  {
    EvaluationScope scope(model, RopeScaling());
    torch::NoGradGuard no_grad;
    ObservedAttention observed(observer);
    // A few windows a pass while they are short, one at a time when long.
    const int64_t per_pass = std::max<int64_t>(1, 16384 / spec.length);
    for (int64_t w = 0; w < windows; w += per_pass) {
      const int64_t count = std::min(per_pass, windows - w);
      check_window_memory(model, count, spec.length);  // the forward pass itself
      const auto tokens = stream.slice(w * spec.length, count * spec.length)
                              .to(torch::kLong).view({count, spec.length}).to(device);
      observer.next_forward();
      model->hidden(tokens);
      if (observer.calls() != layers)
        throw EvalFailure(what + ": " + std::to_string(observer.calls()) + " attention calls for " +
                          std::to_string(layers) + " layers");
    }
  }
  const double queries = double(windows) * double(spec.length);
  out.mass = torch::stack(observer.mass_).cpu() / queries;
  out.entropy = torch::stack(observer.entropy_).cpu() / queries;
  out.sink = torch::stack(observer.sink_).cpu() / queries;
  if (!out.mass.isfinite().all().item<bool>() || !out.entropy.isfinite().all().item<bool>())
    throw EvalFailure(what + ": an attention weight is not finite");
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace extrap
