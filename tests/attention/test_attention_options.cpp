// The attention options of 2024-26 (core/attention/attention.h: window, chunk, sink, logit scale;
// the config's `attention` section in the model: SSMax, Llama 4's temperature, the output gate).
//
// Each is checked against the definition in REFERENCE.md ("The 2024-26 wave") written out in
// this file in float64, loop by loop, not through the code under test: which keys a query sees,
// the softmax with a sink column, SSMax's s_h ln n_i with n_i counted here. The sink's and SSMax's
// gradients against central differences; the memory-efficient path against the reference with
// tiles that split windows and chunks; the fused CPU kernel (float32 and bfloat16, training and
// inference) against the float64 reference with every gradient; and models with each option:
// causal, equal under a KV cache to one forward pass, trainable.
#include "core/attention/attention.h"
#include "core/attention/efficient_attention.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/kernels/bf16_gemm.h"
#include "core/model/memory_estimate.h"
#include "core/model/model.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace extrap;

namespace {

constexpr int64_t kOptionHeads = 4;

// Whether query i sees key j: the causal half, the window |i - j| < W, the chunk of C tokens.
bool visible(int64_t i, int64_t j, bool causal, int64_t window, int64_t chunk) {
  if (causal && j > i) return false;
  if (window > 0 && std::abs(i - j) >= window) return false;
  if (chunk > 0 && i / chunk != j / chunk) return false;
  return true;
}

struct Definition {
  bool causal = true;
  int64_t window = 0, chunk = 0;
  std::vector<double> slopes;      // ALiBi, symmetric |i - j| (empty: no bias)
  std::vector<double> sink;        // per head (empty: none)
  std::vector<double> ssmax;       // s_h (empty: plain softmax)
  double softcap = 0;              // C: q.k / sqrt(d) becomes C tanh(q.k / (sqrt(d) C)) before the bias (0: off)
};

// o_i = sum_j e^{z_ij} v_j / ([e^{s_h}] + sum_j e^{z_ij}) over the keys i sees, with
// z_ij = c_i (cap(q_i . k_j / sqrt(d)) - m_h |i - j|), c_i = s_h ln n_i under SSMax (else 1) and
// cap(x) = C tanh(x / C) with a softcap C (else x).
torch::Tensor defined_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const Definition& def) {
  const auto q64 = q.to(torch::kFloat64), k64 = k.to(torch::kFloat64), v64 = v.to(torch::kFloat64);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3);
  auto out = torch::zeros({B, H, T, D}, torch::kFloat64);
  auto qa = q64.accessor<double, 4>(), ka = k64.accessor<double, 4>(), va = v64.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        int64_t n = 0;
        for (int64_t j = 0; j < T; ++j) n += visible(i, j, def.causal, def.window, def.chunk);
        const double c = def.ssmax.empty() ? 1.0 : def.ssmax[size_t(h)] * std::log(double(n));
        std::vector<double> z(size_t(T), -std::numeric_limits<double>::infinity());
        double max = def.sink.empty() ? -std::numeric_limits<double>::infinity() : def.sink[size_t(h)];
        for (int64_t j = 0; j < T; ++j) {
          if (!visible(i, j, def.causal, def.window, def.chunk)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += qa[b][h][i][d] * ka[b][h][j][d];
          double logit = dot / std::sqrt(double(D));
          if (def.softcap > 0) logit = def.softcap * std::tanh(logit / def.softcap);
          if (!def.slopes.empty()) logit -= def.slopes[size_t(h)] * double(std::abs(i - j));
          z[size_t(j)] = c * logit;
          max = std::max(max, z[size_t(j)]);
        }
        double denominator = def.sink.empty() ? 0.0 : std::exp(def.sink[size_t(h)] - max);
        for (int64_t j = 0; j < T; ++j)
          if (z[size_t(j)] > -std::numeric_limits<double>::infinity()) denominator += std::exp(z[size_t(j)] - max);
        for (int64_t j = 0; j < T; ++j) {
          if (!(z[size_t(j)] > -std::numeric_limits<double>::infinity())) continue;
          const double p = std::exp(z[size_t(j)] - max) / denominator;
          for (int64_t d = 0; d < D; ++d) oa[b][h][i][d] += p * va[b][h][j][d];
        }
      }
  return out;
}

// The description extrap's attention takes for a definition; SSMax's factors from n_i counted
// here (not AttentionBias::visible_keys, which has its own test below).
AttentionBias described(const Definition& def, int64_t T, torch::Dtype dtype = torch::kFloat64) {
  AttentionBias bias = AttentionBias::none();
  if (!def.slopes.empty()) {
    const auto slopes = torch::tensor(def.slopes, torch::kFloat64).to(dtype);
    bias = AttentionBias::linear_symmetric(slopes);
  }
  bias.window = def.window;
  bias.chunk = def.chunk;
  bias.softcap = def.softcap;
  if (!def.sink.empty()) bias.sink = torch::tensor(def.sink, torch::kFloat64).to(dtype);
  if (!def.ssmax.empty()) {
    auto scale = torch::zeros({kOptionHeads, T}, torch::kFloat64);
    for (int64_t h = 0; h < kOptionHeads; ++h)
      for (int64_t i = 0; i < T; ++i) {
        int64_t n = 0;
        for (int64_t j = 0; j < T; ++j) n += visible(i, j, def.causal, def.window, def.chunk);
        scale[h][i] = def.ssmax[size_t(h)] * std::log(double(n));
      }
    bias.logit_scale = scale.to(dtype);
  }
  return bias;
}

std::vector<Definition> definitions() {
  const std::vector<double> slopes = {0.5, 0.25, 0.125, 0.0625}, sink = {0.3, -1.0, 2.0, 0.0},
                            ssmax = {0.4, 0.9, 1.3, 0.05};
  std::vector<Definition> out;
  for (bool causal : {true, false})
    for (int64_t window : {0, 1, 5, 19})
      for (int64_t chunk : {0, 7, 16}) {
        if (window == 19 && chunk == 16) continue;
        for (int variant = 0; variant < 4; ++variant) {
          Definition d;
          d.causal = causal;
          d.window = window;
          d.chunk = chunk;
          if (variant & 1) d.slopes = slopes;
          if (variant >= 2) d.sink = sink;
          if (variant == 1 || variant == 3) d.ssmax = ssmax;
          if ((window + chunk + variant) % 2 == 1) d.softcap = 1.5;  // half of them, every option beside it
          out.push_back(d);
        }
      }
  return out;
}

std::string name_of(const Definition& d) {
  return std::string(d.causal ? "causal" : "bidirectional") + ", window " + std::to_string(d.window) + ", chunk " +
         std::to_string(d.chunk) + (d.slopes.empty() ? "" : ", alibi") + (d.sink.empty() ? "" : ", sink") +
         (d.ssmax.empty() ? "" : ", ssmax") + (d.softcap > 0 ? ", softcap" : "");
}

struct OptionInputs {
  torch::Tensor q, k, v;
};

OptionInputs option_inputs(int64_t B, int64_t T, int64_t D, uint64_t seed, torch::Dtype dtype) {
  torch::manual_seed(seed);
  const auto o = torch::TensorOptions().dtype(dtype);
  return {2 * torch::randn({B, kOptionHeads, T, D}, o), 2 * torch::randn({B, kOptionHeads, T, D}, o), torch::randn({B, kOptionHeads, T, D}, o)};
}

}  // namespace

TEST_CASE("attention options: the reference path computes the definitions (float64)", "[attention][options]") {
  const int64_t T = 37;
  const auto in = option_inputs(2, T, 8, 3, torch::kFloat64);
  int cases = 0;
  for (const auto& def : definitions()) {
    INFO(name_of(def));
    AttentionOptions options;
    options.causal = def.causal;
    options.backend = AttentionBackend::Reference;
    const auto expected = defined_attention(in.q, in.k, in.v, def);
    const auto actual = attention(in.q, in.k, in.v, described(def, T), options);
    CHECK((actual - expected).abs().max().item<double>() < 1e-10);
    ++cases;
  }
  REQUIRE(cases == 2 * (4 * 3 - 1) * 4);
}

TEST_CASE("attention options: the masks' counts n_i and tile tests agree with the definition", "[attention][options]") {
  for (bool causal : {true, false})
    for (int64_t window : {0, 1, 3, 10})
      for (int64_t chunk : {0, 4, 9}) {
        INFO((causal ? "causal" : "bidirectional") << ", window " << window << ", chunk " << chunk);
        AttentionBias bias = AttentionBias::none();
        bias.window = window;
        bias.chunk = chunk;
        const int64_t T = 23;
        // n_i for the last 11 queries of 23 keys (a KV cache's rows), per head.
        const auto n = bias.visible_keys(kOptionHeads, 11, T, causal);
        for (int64_t r = 0; r < 11; ++r) {
          int64_t count = 0;
          for (int64_t j = 0; j < T; ++j) count += visible(T - 11 + r, j, causal, window, chunk);
          CHECK(n[0][r].item<float>() == float(count));
          CHECK(n[kOptionHeads - 1][r].item<float>() == float(count));
        }
        // Every tile of rows [q0, q1) x columns [k0, k1): masks_some / masks_all / option_mask.
        for (int64_t q0 = 0; q0 < 20; q0 += 3)
          for (int64_t q1 = q0 + 1; q1 <= 23; q1 += 5)
            for (int64_t k0 = 0; k0 < 20; k0 += 4)
              for (int64_t k1 = k0 + 1; k1 <= 23; k1 += 6) {
                int64_t masked = 0;
                const auto mask = bias.option_mask(q0, q1, k0, k1);
                for (int64_t i = q0; i < q1; ++i)
                  for (int64_t j = k0; j < k1; ++j) {
                    const bool hidden = !visible(i, j, false, window, chunk);
                    masked += hidden;
                    REQUIRE(mask[i - q0][j - k0].item<bool>() == hidden);
                  }
                const int64_t entries = (q1 - q0) * (k1 - k0);
                REQUIRE(bias.masks_some(q0, q1, k0, k1) == (masked > 0));
                REQUIRE(bias.masks_all(q0, q1, k0, k1) == (masked == entries));
              }
      }
  // A direction-masked linear bias: a head that may not look right sees the diagonal there only.
  auto left_only = AttentionBias::linear(torch::ones({2}), torch::ones({2}), torch::tensor({true, false}),
                                         torch::tensor({false, true}));
  left_only.window = 4;
  const auto n = left_only.visible_keys(2, 10, 10, /*causal=*/false);
  CHECK(n[0][5].item<float>() == 4.0f);  // keys 2..5
  CHECK(n[1][5].item<float>() == 4.0f);  // keys 5..8
  CHECK(n[0][0].item<float>() == 1.0f);
  CHECK(n[1][9].item<float>() == 1.0f);
}

TEST_CASE("attention options: the memory-efficient path equals the reference, tiles splitting windows and chunks",
          "[attention][options][efficient]") {
  const std::vector<EfficientAttentionBlocks> blocks = {{16, 32}, {32, 16}, {8, 8}};
  for (int64_t T : {9, 50, 97}) {
    const auto in = option_inputs(2, T, 8, uint64_t(T), torch::kFloat32);
    torch::manual_seed(7);
    const auto table = torch::randn({kOptionHeads, T, T});
    const auto F = -torch::rand({2, kOptionHeads, T}).cumsum(-1);  // forgetting gates' running sums
    const auto E = torch::randn({kOptionHeads, 8, 12}) * 0.3;       // CoPE's embeddings
    for (const auto& def : definitions()) {
      for (int kind = 0; kind < 4; ++kind) {  // the definition's bias, then dense, cumulative, contextual
        AttentionBias bias = described(def, T, torch::kFloat32);
        if (kind > 0 && !def.slopes.empty()) continue;
        if (kind >= 2 && !def.causal) continue;
        if (kind > 0) {
          AttentionBias other = kind == 1   ? AttentionBias::dense_blocks([table](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
                                                return table.slice(1, q0, q1).slice(2, k0, k1);
                                              })
                                : kind == 2 ? AttentionBias::cumulative_sum(F)
                                            : AttentionBias::contextual(E);
          other.window = bias.window;
          other.chunk = bias.chunk;
          other.softcap = bias.softcap;
          other.sink = bias.sink;
          other.logit_scale = bias.logit_scale;
          bias = other;
        }
        AttentionOptions options;
        options.causal = def.causal;
        const auto expected = attention_reference(in.q, in.k, in.v, bias, options);
        for (const auto& b : blocks) {
          INFO(name_of(def) << ", kind " << kind << ", T " << T << ", blocks " << b.query_block << " x " << b.key_block);
          const auto actual = attention_efficient(in.q, in.k, in.v, bias, options, b);
          REQUIRE(actual.isfinite().all().item<bool>());
          CHECK((actual - expected).abs().max().item<double>() < 2e-5);
        }
      }
    }
  }
}

TEST_CASE("attention options: the softcap's paths: Auto trains it on the fused CPU kernel, as defined",
          "[attention][options]") {
  const int64_t T = 160;  // past the fused kernel's training threshold
  auto in = option_inputs(1, T, 8, 11, torch::kFloat32);
  Definition def;
  def.slopes = {0.5, 0.25, 0.125, 0.0625};
  def.softcap = 1.5;
  const auto bias = described(def, T, torch::kFloat32);
  const auto expected = defined_attention(in.q, in.k, in.v, def);
  AttentionOptions options;
  options.training = true;
  for (auto* t : {&in.q, &in.k, &in.v}) t->requires_grad_(true);
  const auto trained = attention(in.q, in.k, in.v, bias, options);  // Auto, training, float32
  CHECK((trained.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-5);
  if (fused_cpu_attention_unsupported_reason(in.q, in.k, in.v, bias, options).empty()) {
    CHECK(torch::equal(trained, fused_cpu_attention(in.q, in.k, in.v, bias, options)));
    AttentionBias uncapped = bias;  // and the cap matters at this scale
    uncapped.softcap = 0;
    CHECK((fused_cpu_attention(in.q, in.k, in.v, uncapped, options).to(torch::kFloat64) - expected).abs().max().item<double>() > 1e-2);
  }
  CHECK_THAT(bias.describe(), Catch::Contains("softcap 1.5"));
  // A cap the kernel's float32 cannot hold (0 or infinite there) is refused by name (the config
  // refuses it too: tests/model/test_architectures.cpp).
  for (double cap : {1e-60, 1e60}) {
    INFO("softcap " << cap);
    AttentionBias far = bias;
    far.softcap = cap;
    CHECK_THAT(fused_cpu_attention_unsupported_reason(in.q, in.k, in.v, far, options),
               Catch::Contains("outside float32's normal range"));
  }
  AttentionBias stick = AttentionBias::stick_breaking(false);
  stick.softcap = 2;
  options.backend = AttentionBackend::Auto;
  CHECK_THROWS_WITH(attention(in.q, in.k, in.v, stick, options), Catch::Contains("attention.softcap"));
}

TEST_CASE("attention options: the sink's and SSMax's gradients equal central differences", "[attention][options]") {
  const int64_t T = 13;
  const auto in = option_inputs(1, T, 4, 11, torch::kFloat64);
  const auto weights = torch::randn({1, kOptionHeads, T, 4}, torch::kFloat64);
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    AttentionOptions options;
    options.causal = causal;
    options.backend = AttentionBackend::Reference;
    auto sink = torch::tensor({0.3, -1.0, 2.0, 0.0}, torch::kFloat64).requires_grad_();
    auto s = torch::tensor({0.4, 0.9, 1.3, 0.05}, torch::kFloat64).requires_grad_();
    AttentionBias base = AttentionBias::linear_symmetric(torch::tensor({0.5, 0.25, 0.125, 0.0625}, torch::kFloat64));
    base.window = 6;
    const auto log_n = base.visible_keys(kOptionHeads, T, T, causal).to(torch::kFloat64).log();
    const auto loss_at = [&](const torch::Tensor& sink_value, const torch::Tensor& s_value) {
      AttentionBias bias = base;
      bias.sink = sink_value;
      bias.logit_scale = s_value.view({-1, 1}) * log_n;
      return (attention(in.q, in.k, in.v, bias, options) * weights).sum();
    };
    loss_at(sink, s).backward();
    torch::NoGradGuard no_grad;
    const double h = 1e-6;
    for (int64_t head = 0; head < kOptionHeads; ++head) {
      auto up = sink.detach().clone(), down = sink.detach().clone();
      up[head] += h;
      down[head] -= h;
      const double numeric = (loss_at(up, s.detach()) - loss_at(down, s.detach())).item<double>() / (2 * h);
      CHECK(sink.grad()[head].item<double>() == Approx(numeric).epsilon(1e-6).margin(1e-9));
      auto s_up = s.detach().clone(), s_down = s.detach().clone();
      s_up[head] += h;
      s_down[head] -= h;
      const double numeric_s = (loss_at(sink.detach(), s_up) - loss_at(sink.detach(), s_down)).item<double>() / (2 * h);
      CHECK(s.grad()[head].item<double>() == Approx(numeric_s).epsilon(1e-6).margin(1e-9));
      CHECK(std::abs(numeric) > 1e-6);  // each head's parameter matters
    }
  }
}

namespace {

// The fused CPU kernel on inputs of `dtype` with every option, against attention_reference in
// float64 on the same values: output and the gradients of q, k, v, the sink and the logit scale,
// the largest difference relative to the largest value (or to 1). The bias's softcap, where set,
// is computed by both.
void check_fused_against_float64(torch::Dtype dtype, int64_t T, bool causal, AttentionBias bias, bool sink,
                                 bool scale, double tolerance) {
  INFO("softcap " << bias.softcap);
  const int64_t B = 2, D = 8;
  const auto parts = torch::randn({B, T, 3, kOptionHeads, D}).to(dtype).permute({2, 0, 3, 1, 4}).unbind(0);
  auto q = parts[0].detach().requires_grad_(), k = parts[1].detach().requires_grad_(),
       v = parts[2].detach().requires_grad_();
  torch::Tensor sink_values, scale_values;
  if (sink) bias.sink = sink_values = torch::tensor({0.5f, -1.0f, 2.5f, 0.0f}).requires_grad_();
  if (scale)  // SSMax-like factors, with rows at 0 (n = 1) and a negative one
    bias.logit_scale = scale_values = (torch::rand({kOptionHeads, T}) * 2.5 - 0.5).index_put_({0, 0}, 0.0).requires_grad_();
  AttentionOptions options;
  options.causal = causal;
  options.training = true;
  REQUIRE(fused_cpu_attention_unsupported_reason(q, k, v, bias, options).empty());
  const auto y = fused_cpu_attention(q, k, v, bias, options);
  const auto grad_y = torch::randn(y.sizes()).to(dtype);
  y.backward(grad_y);

  auto q64 = q.detach().to(torch::kFloat64).requires_grad_(), k64 = k.detach().to(torch::kFloat64).requires_grad_(),
       v64 = v.detach().to(torch::kFloat64).requires_grad_();
  AttentionBias bias64 = bias;
  torch::Tensor sink64, scale64;
  if (sink) bias64.sink = sink64 = sink_values.detach().to(torch::kFloat64).requires_grad_();
  if (scale) bias64.logit_scale = scale64 = scale_values.detach().to(torch::kFloat64).requires_grad_();
  const auto expected = attention_reference(q64, k64, v64, bias64, options);
  expected.backward(grad_y.to(torch::kFloat64));
  const auto relative = [](const torch::Tensor& got, const torch::Tensor& want) {
    return ((got.to(torch::kFloat64) - want).abs().max() / want.abs().max().clamp_min(1.0)).item<double>();
  };
  CHECK(relative(y.detach(), expected.detach()) < tolerance);
  CHECK(relative(q.grad(), q64.grad()) < tolerance);
  CHECK(relative(k.grad(), k64.grad()) < tolerance);
  CHECK(relative(v.grad(), v64.grad()) < tolerance);
  if (sink) CHECK(relative(sink_values.grad(), sink64.grad()) < tolerance);
  if (scale) CHECK(relative(scale_values.grad(), scale64.grad()) < tolerance);
}

}  // namespace

TEST_CASE("attention options: the fused CPU kernel equals the float64 reference, outputs and every gradient",
          "[attention][options][fused_cpu]") {
  if (fused_cpu_attention_unsupported_reason(torch::zeros({1, 1, 1, 1}), torch::zeros({1, 1, 1, 1}),
                                             torch::zeros({1, 1, 1, 1}), AttentionBias::none(), {}) != "") {
    testing::skip_test("this LibTorch exports no sgemm_: the fused CPU attention is not available");
    return;
  }
  torch::manual_seed(13);
  const auto slopes = torch::tensor({0.5f, 0.25f, 0.125f, 0.0625f});
  const std::vector<std::pair<std::string, AttentionBias>> biases = {
      {"none", AttentionBias::none()},
      {"alibi", AttentionBias::linear_symmetric(slopes)},
      {"directions", AttentionBias::linear(slopes, torch::tensor({0.3f, 0.2f, 0.1f, 0.05f}),
                                           torch::tensor({true, true, false, false}),
                                           torch::tensor({true, false, true, false}))}};
  // float32 products, then (with AVX512_BF16) bfloat16 ones on bfloat16 inputs, and bfloat16
  // inputs widened to float32 products: tolerances as tests/attention/test_fused_cpu_attention.cpp.
  struct Path {
    torch::Dtype dtype;
    bool bf16_products;
    double tolerance;
  };
  std::vector<Path> paths = {{torch::kFloat32, false, 1e-4}, {torch::kBFloat16, false, 6e-3}};
  if (bf16_gemm::available()) paths.push_back({torch::kBFloat16, true, 2e-2});
  int cases = 0;
  for (const auto& path : paths) {
    bf16_gemm::set_enabled(path.bf16_products);
    for (int64_t T : {17, 65, 150})
      for (bool causal : {true, false})
        for (const auto& [name, base] : biases)
          for (auto [window, chunk] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {5, 0}, {40, 0}, {0, 24}, {9, 64}})
            for (int options = 0; options < 4; ++options) {
              const bool sink = options & 1, scale = options & 2;
              INFO(torch::toString(path.dtype) << (path.bf16_products ? " (bfloat16 products)" : "") << ", T " << T
                                               << (causal ? ", causal, " : ", bidirectional, ") << name << ", window "
                                               << window << ", chunk " << chunk << (sink ? ", sink" : "")
                                               << (scale ? ", logit scale" : ""));
              AttentionBias bias = base;
              bias.window = window;
              bias.chunk = chunk;
              // A soft cap on half the cases, each option and bias among them; 1.5 bends these
              // scores (q.k / sqrt(d) of unit Gaussians: most within 3).
              if ((T + window + chunk + options) % 2 == 1) bias.softcap = 1.5;
              check_fused_against_float64(path.dtype, T, causal, bias, sink, scale, path.tolerance);
              ++cases;
            }
  }
  bf16_gemm::set_enabled(true);
  CHECK(cases >= 2 * 3 * 2 * 3 * 5 * 4);
}

TEST_CASE("attention options: the fused CPU inference kernel equals the reference across key tiles",
          "[attention][options][fused_cpu]") {
  // Long enough for several 256-key tiles, with windows and chunks that start and end inside them.
  torch::manual_seed(14);
  const int64_t T = 700;
  const auto in = option_inputs(1, T, 16, 15, torch::kFloat32);
  for (bool causal : {true, false})
    for (auto [window, chunk] : std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {300, 0}, {0, 200}, {100, 333}})
      for (int options = 0; options < 8; ++options) {
        INFO((causal ? "causal" : "bidirectional") << ", window " << window << ", chunk " << chunk << ", options " << options);
        AttentionBias bias = AttentionBias::linear_symmetric(torch::tensor({0.5f, 0.05f, 0.005f, 0.0f}));
        bias.window = window;
        bias.chunk = chunk;
        // A soft cap, which also bounds the scores' spread by 2C for the tiles the kernel skips.
        if (options & 4) bias.softcap = 3;
        if (options & 1) bias.sink = torch::tensor({0.5f, -1.0f, 2.5f, 0.0f});
        if (options & 2) bias.logit_scale = torch::rand({kOptionHeads, T}) * 2;
        AttentionOptions opts;
        opts.causal = causal;
        torch::NoGradGuard no_grad;
        const auto actual = fused_cpu_attention(in.q, in.k, in.v, bias, opts);  // the inference kernel
        AttentionBias bias64 = bias;
        if (bias.sink.defined()) bias64.sink = bias.sink.to(torch::kFloat64);
        if (bias.logit_scale.defined()) bias64.logit_scale = bias.logit_scale.to(torch::kFloat64);
        const auto expected = attention_reference(in.q.to(torch::kFloat64), in.k.to(torch::kFloat64),
                                                  in.v.to(torch::kFloat64), bias64, opts);
        CHECK((actual.to(torch::kFloat64) - expected).abs().max().item<double>() < 2e-5);
      }
}

TEST_CASE("attention options: Auto trains on the fused CPU kernel where it takes them", "[attention][options][fused_cpu]") {
  const int64_t T = 160;  // past fused_cpu_min_length
  const auto in = option_inputs(1, T, 16, 5, torch::kFloat32);
  AttentionBias bias = AttentionBias::linear_causal(torch::full({kOptionHeads}, 0.25f));
  bias.window = 32;
  bias.sink = torch::zeros({kOptionHeads}).requires_grad_();
  AttentionOptions options;
  options.training = true;
  const auto y = attention(in.q, in.k, in.v, bias, options);
  CHECK(torch::equal(y, fused_cpu_attention(in.q, in.k, in.v, bias, options)));
  // A sink of another shape is refused by name, and goes to the reference.
  bias.sink = torch::zeros({kOptionHeads + 1});
  CHECK_THAT(fused_cpu_attention_unsupported_reason(in.q, in.k, in.v, bias, options), Catch::Contains("sink"));
}

namespace {

Config options_config(const std::string& method, const std::function<void(AttentionConfig&)>& set) {
  Config config = testing::tiny_config(method);  // trained length 16, 2 layers, 4 heads
  set(config.model.attention_options);
  return config;
}

const std::vector<std::pair<std::string, std::function<void(AttentionConfig&)>>>& model_options() {
  static const std::vector<std::pair<std::string, std::function<void(AttentionConfig&)>>> all = {
      {"sink", [](AttentionConfig& a) { a.sink = true; }},
      {"ssmax", [](AttentionConfig& a) { a.ssmax = true; }},
      {"temperature", [](AttentionConfig& a) {
         a.temperature = 0.5;
         a.temperature_floor = 4;
       }},
      {"headwise gate", [](AttentionConfig& a) { a.gate = AttentionGate::headwise; }},
      {"elementwise gate", [](AttentionConfig& a) { a.gate = AttentionGate::elementwise; }},
      {"window", [](AttentionConfig& a) { a.window = 5; }},
      {"chunk", [](AttentionConfig& a) { a.chunk = 8; }},
      {"all", [](AttentionConfig& a) {
         a.sink = a.ssmax = true;
         a.temperature = 0.5;
         a.temperature_floor = 4;
         a.gate = AttentionGate::headwise;
         a.window = 6;
         a.chunk = 16;
       }},
  };
  return all;
}

}  // namespace

TEST_CASE("attention options in a model: causal, a KV cache equal to one forward pass, the parameters counted",
          "[attention][options][generate]") {
  for (const std::string method : {"alibi", "rotary", "none", "fox"}) {
    for (const auto& [name, set] : model_options()) {
      INFO(method << " + " << name);
      const Config config = options_config(method, set);
      torch::manual_seed(4);
      auto model = build_model(config, 257);
      {  // the options' own parameters, counted by the estimate (which leaves out the position method's)
        const Config plain = testing::tiny_config(method);
        CHECK(model->num_parameters() - build_model(plain, 257)->num_parameters() ==
              parameter_count_estimate(config, 257) - parameter_count_estimate(plain, 257));
      }
      model->eval();
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
      testing::check_causal_and_cached(model);
    }
  }
}

TEST_CASE("attention options in a model: a few training steps lower the loss, the options' parameters learn",
          "[attention][options][train]") {
  for (const auto& [name, set] : model_options()) {
    INFO(name);
    const Config config = options_config("rotary", set);
    torch::manual_seed(8);
    auto model = build_model(config, 257);
    model->train();
    torch::optim::AdamW optimiser(model->parameters(), torch::optim::AdamWOptions(3e-3));
    torch::manual_seed(9);
    // A repeated pattern, learnable in a few steps.
    auto tokens = torch::arange(0, 33, torch::kLong).remainder(11).repeat({4, 1}) + torch::randint(0, 3, {4, 1});
    const auto loss_of = [&] {
      const auto logits = model->forward(tokens.narrow(1, 0, 32));
      return torch::cross_entropy_loss(logits.reshape({-1, 257}), tokens.narrow(1, 1, 32).reshape({-1}));
    };
    const double first = loss_of().item<double>();
    std::vector<torch::Tensor> initial;
    for (const auto& p : model->named_parameters())
      if (p.key().find("sink") != std::string::npos || p.key().find("ssmax") != std::string::npos ||
          p.key().find("gate") != std::string::npos)
        initial.push_back(p.value().detach().clone());
    for (int step = 0; step < 15; ++step) {
      optimiser.zero_grad();
      auto loss = loss_of();
      loss.backward();
      optimiser.step();
    }
    CHECK(loss_of().item<double>() < first - 0.5);
    size_t moved = 0, index = 0;
    for (const auto& p : model->named_parameters())
      if (p.key().find("sink") != std::string::npos || p.key().find("ssmax") != std::string::npos ||
          p.key().find("gate") != std::string::npos)
        moved += !torch::equal(p.value(), initial[index++]);
    CHECK(moved == initial.size());
    if (name == "window" || name == "chunk" || name == "temperature") CHECK(initial.empty());
    else CHECK(!initial.empty());
  }
}

TEST_CASE("attention options in a model: the gate and the temperature as defined", "[attention][options]") {
  // One layer's attention computed by hand from its weights: q, k, v, rotary-free (position none),
  // softmax over causal keys, each head's output times sigmoid(x W_g), q times Llama 4's factor.
  for (AttentionGate gate : {AttentionGate::headwise, AttentionGate::elementwise}) {
    INFO(enum_name(gate));
    AttentionConfig extras;
    extras.gate = gate;
    extras.temperature = 0.7;
    extras.temperature_floor = 3;
    const int64_t D = 16, H = 4, T = 11, Dh = D / H;
    torch::manual_seed(2);
    SelfAttention layer(SelfAttentionOptions(D, H).extras(extras));
    auto none = PositionRegistry::instance().create("none", PositionContext{1, H, D, Dh, true, {}},
                                                     OptionReader(YAML::Node(YAML::NodeType::Map), "test", "position"));
    torch::NoGradGuard no_grad;
    const auto x = torch::randn({1, T, D}, torch::kFloat64).to(torch::kFloat32);
    AttentionOptions options;
    options.backend = AttentionBackend::Reference;
    const auto actual = layer->forward(x, *none, TokenPositions::window(T), options);

    const auto x64 = x.to(torch::kFloat64)[0];  // (T, D)
    const auto w = layer->qkv->weight.to(torch::kFloat64), b = layer->qkv->bias.to(torch::kFloat64);
    const auto qkv = x64.matmul(w.t()) + b;  // (T, 3D)
    const auto wg = layer->gate->weight.to(torch::kFloat64);
    auto heads = torch::zeros({T, D}, torch::kFloat64);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double factor = 1 + 0.7 * std::log(std::floor(double(i + 1) / 3.0) + 1);
        const auto q = qkv[i].slice(0, h * Dh, (h + 1) * Dh) * factor;
        std::vector<double> logits;
        double max = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          const auto k = qkv[j].slice(0, D + h * Dh, D + (h + 1) * Dh);
          logits.push_back((q * k).sum().item<double>() / std::sqrt(double(Dh)));
          max = std::max(max, logits.back());
        }
        double sum = 0;
        for (double l : logits) sum += std::exp(l - max);
        auto o = torch::zeros({Dh}, torch::kFloat64);
        for (int64_t j = 0; j <= i; ++j)
          o += std::exp(logits[size_t(j)] - max) / sum * qkv[j].slice(0, 2 * D + h * Dh, 2 * D + (h + 1) * Dh);
        const auto g = torch::sigmoid(x64[i].matmul(wg.t()));  // (H) or (D)
        o = gate == AttentionGate::headwise ? o * g[h] : o * g.slice(0, h * Dh, (h + 1) * Dh);
        heads[i].slice(0, h * Dh, (h + 1) * Dh).copy_(o);
      }
    const auto expected = heads.matmul(layer->out->weight.to(torch::kFloat64).t()) + layer->out->bias.to(torch::kFloat64);
    CHECK((actual[0].to(torch::kFloat64) - expected).abs().max().item<double>() < 2e-5);
  }
}

TEST_CASE("attention options: the config refuses bad values by key, and leaves plain runs' identity alone",
          "[attention][options][config]") {
  const auto refuses = [](const std::string& text, const std::string& expected) {
    INFO(text);
    CHECK_THROWS_WITH(config_from_yaml(YAML::Load(text), "c.yaml"), Catch::Contains(expected));
  };
  refuses("attention: {window: -1}", "attention.window");
  refuses("attention: {chunk: -3}", "attention.chunk");
  refuses("attention: {temperature: -0.1}", "attention.temperature");
  refuses("attention: {temperature: .nan}", "attention.temperature");
  refuses("attention: {temperature_floor: 100}", "temperature_floor");
  refuses("attention: {ssmax_init: 0.3}", "ssmax_init");
  refuses("attention: {gate: sometimes}", "attention.gate");
  refuses("attention: {sinks: true}", "sinks");

  const Config plain = config_from_yaml(YAML::Load("model: {layers: 2}"), "c.yaml");
  CHECK(!plain.model_keys()["attention"]);
  const Config windowed = config_from_yaml(YAML::Load("attention: {window: 64, sink: true}"), "c.yaml");
  CHECK(windowed.model_keys()["attention"]["window"].as<int64_t>() == 64);
  CHECK(windowed.model_keys()["attention"]["sink"].as<bool>());
  CHECK(!windowed.model_keys()["attention"]["chunk"]);
  CHECK(windowed.model.attention_options.describe() == "sink, window 64");
  // SSMax's s starts at 1 / ln L: plain softmax for a row that sees L keys.
  Config ssmax = testing::tiny_config("none");
  ssmax.model.attention_options.ssmax = true;
  auto model = build_model(ssmax, 257);
  bool found = false;
  for (const auto& p : model->named_parameters())
    if (p.key().find("ssmax") != std::string::npos) {
      found = true;
      CHECK(p.value()[0].item<double>() == Approx(1.0 / std::log(16.0)));
    }
  CHECK(found);
}
