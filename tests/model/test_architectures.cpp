// The architectures the field trains now (model.norm, bias, ffn, kv_heads, block, qk_norm,
// embedding_norm, and the rotary pairings): each part against a float64 computation written here
// from its definition (the fused CPU paths included), blocks of each residual pattern against
// their parts composed by hand, and whole models of each option: parameter counts, causality, the
// KV cache, the memory-efficient path and the refusals of keys that do not apply.
#include "core/attention/attention.h"
#include "core/attention/efficient_attention.h"
#include "core/kernels/bf16_gemm.h"
#include "core/kernels/glu_linear.h"
#include "core/kernels/precision.h"
#include "core/kernels/residual_norm.h"
#include "core/kernels/rotate_pairs.h"
#include "core/model/memory_estimate.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "positions/alibi_slopes.h"
#include "positions/rotation.h"
#include "tests/support/architectures.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <map>

using namespace extrap;
using namespace extrap::testing;

namespace {

constexpr double kEps = 1e-5;

// The norms from their definitions, in float64: LayerNorm (h - mean) / sqrt(var + eps) w + b,
// RMSNorm h / sqrt(mean(h^2) + eps) w + b (b undefined: none), over the last dimension.
torch::Tensor norm64(const torch::Tensor& h, const torch::Tensor& w, const torch::Tensor& b, bool rms) {
  torch::Tensor u;
  if (rms) {
    u = h / (h.pow(2).mean(-1, true) + kEps).sqrt();
  } else {
    const auto centred = h - h.mean(-1, true);
    u = centred / (centred.pow(2).mean(-1, true) + kEps).sqrt();
  }
  if (w.defined()) u = u * w;  // a norm without parameters (model.norm_affine false): none
  return b.defined() ? u + b : u;
}

// SiLU and GELU (erf) from their definitions.
// The gates from their definitions: SiLU g sigma(g), GELU g Phi(g) (erf), and GELU's tanh form
// g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) / 2.
torch::Tensor gate64(const torch::Tensor& g, GluGate gate) {
  if (gate == GluGate::gelu) return 0.5 * g * (1 + torch::erf(g / std::sqrt(2.0)));
  if (gate == GluGate::gelu_tanh) return 0.5 * g * (1 + torch::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g.pow(3))));
  return g / (1 + torch::exp(-g));
}

torch::Tensor to64(const torch::Tensor& t) { return t.detach().to(torch::kFloat64); }

// The position method "none" for blocks of tiny_config's shape (4 heads of 8, d_model 32).
std::shared_ptr<PositionMethod> no_position() {
  PositionContext context;
  context.num_heads = 4;
  context.d_head = 8;
  context.d_model = 32;
  return PositionRegistry::instance().create("none", context, OptionReader(YAML::Node(), "test", "position"));
}

// max |a - b| / max |b|: a relative error that a near-zero entry does not blow up.
double scaled_error(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>() /
         std::max(b.abs().max().item<double>(), 1e-30);
}

}  // namespace

TEST_CASE("RMSNorm and a norm without its bias: the fused residual add and norm equal float64's definitions",
          "[layer_norm][architectures]") {
  torch::manual_seed(31);
  const int64_t D = 96;
  for (const bool rms : {true, false})
    for (const bool bias : {true, false})
      for (const bool with_y : {true, false}) {
        INFO((rms ? "rmsnorm" : "layernorm") << (bias ? " with bias" : " without bias") << (with_y ? ", y" : ", no y"));
        const auto w = (1 + 0.5 * torch::randn({D})).requires_grad_();
        const auto b = bias ? (0.5 * torch::randn({D})).requires_grad_() : torch::Tensor();
        const RowNorm norm(w, b, kEps, rms);
        const auto x = (2 + 1.5 * torch::randn({3, 70, D})).requires_grad_();
        const auto y = with_y ? torch::randn({3, 70, D}).requires_grad_() : torch::Tensor();
        const auto gh = torch::randn({3, 70, D}), gu = torch::randn({3, 70, D});
        REQUIRE(add_layer_norm_fused_takes(x, y, norm));
        const auto [h, u] = add_layer_norm(x, y, norm);
        ((h * gh).sum() + (u * gu).sum()).backward();

        const auto x64 = to64(x).requires_grad_(), y64 = with_y ? to64(y).requires_grad_() : torch::Tensor();
        const auto w64 = to64(w).requires_grad_(), b64 = bias ? to64(b).requires_grad_() : torch::Tensor();
        const auto h64 = with_y ? x64 + y64 : x64;
        const auto u64 = norm64(h64, w64, b64, rms);
        ((h64 * to64(gh)).sum() + (u64 * to64(gu)).sum()).backward();
        CHECK(scaled_error(u, u64) < 2e-6);
        CHECK(scaled_error(x.grad(), x64.grad()) < 1e-5);
        if (with_y) CHECK(scaled_error(y.grad(), y64.grad()) < 1e-5);
        CHECK(scaled_error(w.grad(), w64.grad()) < 1e-5);
        if (bias) CHECK(scaled_error(b.grad(), b64.grad()) < 1e-5);
        // What evaluation runs (no gradient): the same norm with LibTorch's operators.
        torch::NoGradGuard no_grad;
        CHECK(scaled_error(add_layer_norm(x, y, norm).second, u64) < 2e-6);
      }
}

TEST_CASE("SwiGLU and GeGLU: the fused gate, its product and the second linear layer equal float64's definition",
          "[glu][architectures]") {
  torch::manual_seed(32);
  const int64_t F = 40, M = 24;
  for (const GluGate gate : {GluGate::silu, GluGate::gelu, GluGate::gelu_tanh})
    for (const bool bias : {true, false}) {
      INFO((gate == GluGate::silu ? "swiglu" : gate == GluGate::gelu ? "geglu" : "geglu (tanh)")
           << (bias ? " with bias" : " without bias"));
      const auto a = (2 * torch::randn({5, 33, 2 * F})).requires_grad_();
      const auto w = (0.2 * torch::randn({M, F})).requires_grad_();
      const auto b = bias ? (0.2 * torch::randn({M})).requires_grad_() : torch::Tensor();
      const auto gy = torch::randn({5, 33, M});
      REQUIRE(glu_linear_fused_takes(a, w));  // on every CPU: its products oneDNN's or MKL's
      const auto y = glu_linear(a, gate, w, b);
      (y * gy).sum().backward();

      const auto a64 = to64(a).requires_grad_(), w64 = to64(w).requires_grad_();
      const auto b64 = bias ? to64(b).requires_grad_() : torch::Tensor();
      const auto s64 = gate64(a64.narrow(-1, 0, F), gate) * a64.narrow(-1, F, F);
      auto y64 = torch::matmul(s64, w64.t());
      if (bias) y64 = y64 + b64;
      (y64 * to64(gy)).sum().backward();
      CHECK(scaled_error(y, y64) < 1e-5);
      CHECK(scaled_error(a.grad(), a64.grad()) < 1e-5);
      CHECK(scaled_error(w.grad(), w64.grad()) < 1e-5);
      if (bias) CHECK(scaled_error(b.grad(), b64.grad()) < 1e-5);
      {  // the unfused path (evaluation), and glu_reference, the definition too
        torch::NoGradGuard no_grad;
        CHECK(scaled_error(glu_linear(a, gate, w, b), y64) < 1e-5);
        CHECK(scaled_error(glu_reference(a, gate), s64) < 1e-6);
      }
      // Under bf16 autocast on a CPU with AVX512_BF16: a in bfloat16, the products in bfloat16.
      if (bf16_gemm::supported()) {
        a.mutable_grad() = torch::Tensor();
        ComputePrecision region(Precision::bf16, torch::kCPU);
        const auto a16 = a.detach().to(torch::kBFloat16).requires_grad_();
        REQUIRE(glu_linear_fused_takes(a16, w));
        const auto y16 = glu_linear(a16, gate, w, b);
        CHECK(y16.scalar_type() == torch::kBFloat16);
        (y16.to(torch::kFloat32) * gy).sum().backward();
        CHECK(scaled_error(y16, y64) < 0.03);
        CHECK(scaled_error(a16.grad(), a64.grad()) < 0.03);
      }
    }
}

namespace {

// Attention from its definition in float64: query head h reads key and value head h / (H / Hkv);
// scores q k^T / sqrt(d) plus the bias (masks included), softmax, times v.
torch::Tensor grouped_attention64(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const AttentionBias& bias, bool causal) {
  const int64_t H = q.size(1), G = H / k.size(1), T = q.size(2), D = q.size(3);
  const auto full_bias = materialize_bias(bias, H, T, T, causal, torch::TensorOptions().dtype(torch::kFloat64));
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < H; ++h) {
    const auto kh = k.select(1, h / G), vh = v.select(1, h / G);  // (B, T, D)
    const auto scores = torch::matmul(q.select(1, h), kh.transpose(1, 2)) / std::sqrt(double(D)) + full_bias[h];
    heads.push_back(torch::matmul(torch::softmax(scores, -1), vh));
  }
  return torch::stack(heads, 1);
}

}  // namespace

TEST_CASE("grouped-query attention on every CPU path equals float64's, each key head serving its group",
          "[attention][gqa][architectures]") {
  torch::manual_seed(33);
  const int64_t B = 2, H = 6, D = 16;
  const auto slopes = torch::tensor(alibi_slopes(int(H)), torch::kFloat32);
  // A bias of j - i alone (as T5's and KERPLE's), for either direction.
  const auto by_offset = AttentionBias::dense_by_offset([&](int64_t lo, int64_t hi) {
    const auto o = torch::arange(lo, hi, torch::kFloat32);
    return torch::stack({-0.3 * o.abs(), 0.2 * torch::sin(o), -0.05 * o.abs().sqrt(), 0.1 * torch::cos(o),
                         -0.01 * o.abs(), torch::zeros_like(o)});
  });
  struct Case {
    const char* name;
    AttentionBias bias;
    bool causal;
  };
  AttentionBias windowed = AttentionBias::linear_causal(slopes);
  windowed.window = 20;
  const std::vector<Case> cases = {{"no bias, causal", AttentionBias::none(), true},
                                   {"no bias, bidirectional", AttentionBias::none(), false},
                                   {"alibi", AttentionBias::linear_causal(slopes), true},
                                   {"alibi, window 20", windowed, true},
                                   {"symmetric alibi", AttentionBias::linear_symmetric(slopes), false},
                                   {"bias by offset, causal", by_offset, true},
                                   {"bias by offset, bidirectional", by_offset, false}};
  for (const int64_t Hkv : {1, 2, 3, 6})
    for (const int64_t T : {70, 150})
      for (const auto& c : cases) {
        INFO(c.name << ", " << Hkv << " key heads, T " << T);
        const auto q = torch::randn({B, H, T, D}), k = torch::randn({B, Hkv, T, D}), v = torch::randn({B, Hkv, T, D});
        const auto gy = torch::randn({B, H, T, D});
        const auto q64 = to64(q).requires_grad_(), k64 = to64(k).requires_grad_(), v64 = to64(v).requires_grad_();
        const auto expected = grouped_attention64(q64, k64, v64, c.bias, c.causal);
        (expected * to64(gy)).sum().backward();
        AttentionOptions options;
        options.causal = c.causal;
        for (const AttentionBackend backend : {AttentionBackend::Reference, AttentionBackend::Fused}) {
          INFO("backend " << to_string(backend) << ", training");
          options.backend = backend;
          options.training = true;
          const auto qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(), vg = v.clone().requires_grad_();
          const auto y = attention(qg, kg, vg, c.bias, options);
          (y * gy).sum().backward();
          CHECK(scaled_error(y, expected) < 1e-5);
          CHECK(scaled_error(qg.grad(), q64.grad()) < 1e-5);
          CHECK(scaled_error(kg.grad(), k64.grad()) < 1e-5);  // each key head's gradient summed over its group
          CHECK(scaled_error(vg.grad(), v64.grad()) < 1e-5);
        }
        torch::NoGradGuard no_grad;
        options.training = false;
        for (const AttentionBackend backend : {AttentionBackend::Auto, AttentionBackend::Efficient}) {
          INFO("backend " << to_string(backend) << ", evaluation");
          options.backend = backend;
          options.efficient_threshold = 64 * 64;  // Auto: the efficient path where the fused kernel does not go
          CHECK(scaled_error(attention(q, k, v, c.bias, options), expected) < 1e-5);
        }
        // The memory-efficient path's tiles, many of them, each taking a key head's group at once.
        CHECK(scaled_error(attention_efficient(q, k, v, c.bias, options, {32, 48}), expected) < 1e-5);
        // bfloat16 inputs (train.precision bf16) on the fused kernel, with its products in
        // bfloat16 where the CPU has AVX512_BF16: the same attention to bfloat16's resolution.
        options.backend = AttentionBackend::Fused;
        const auto y16 = attention(q.to(torch::kBFloat16), k.to(torch::kBFloat16), v.to(torch::kBFloat16), c.bias, options);
        CHECK(scaled_error(y16, expected) < 0.03);
      }
  // Key heads that do not divide the query heads are refused by name.
  AttentionOptions options;
  CHECK_THROWS_WITH(attention(torch::randn({1, 6, 8, 4}), torch::randn({1, 4, 8, 4}), torch::randn({1, 4, 8, 4}),
                              AttentionBias::none(), options),
                    Catch::Contains("6 query heads for 4 key and 4 value heads"));
}

TEST_CASE("the half rotary pairing rotates (i, i + d/2) as Hugging Face's rotate_half does", "[rope][architectures]") {
  torch::manual_seed(34);
  const int64_t T = 5, d = 8;
  const auto x = torch::randn({2, 3, T, d}, torch::kFloat64);
  const auto angles = torch::arange(T, torch::kFloat64).unsqueeze(1) * torch::rand({d / 2}, torch::kFloat64);
  const auto cos = angles.cos(), sin = angles.sin();  // (T, d/2)
  // Hugging Face's apply_rotary_pos_emb: x cos + rotate_half(x) sin, with cos and sin repeated
  // over both halves and rotate_half(x) = [-x2, x1].
  const auto rotate_half = [](const torch::Tensor& t) {
    const int64_t h = t.size(-1) / 2;
    return torch::cat({-t.narrow(-1, h, h), t.narrow(-1, 0, h)}, -1);
  };
  const auto hf = x * torch::cat({cos, cos}, -1) + rotate_half(x) * torch::cat({sin, sin}, -1);
  CHECK(torch::allclose(rotate_pairs(x, cos, sin, d, RotaryPairing::half), hf, 0, 1e-14));
  // The interleaved pairing is the same rotation of permuted dimensions: (2i, 2i+1) -> (i, i + d/2).
  std::vector<int64_t> order;
  for (int64_t i = 0; i < d / 2; ++i) order.push_back(2 * i);
  for (int64_t i = 0; i < d / 2; ++i) order.push_back(2 * i + 1);
  const auto perm = torch::tensor(order);
  CHECK(torch::allclose(rotate_pairs(x, cos, sin, d).index_select(-1, perm),
                        rotate_pairs(x.index_select(-1, perm), cos, sin, d, RotaryPairing::half), 0, 1e-14));
  // A partial rotation (GPT-NeoX's rotary_pct): the first 4 dimensions pair i with i + 2, the
  // rest pass through.
  const auto part = rotate_pairs(x, cos.narrow(1, 0, 2), sin.narrow(1, 0, 2), 4, RotaryPairing::half);
  const auto first = x.narrow(-1, 0, 4);
  const auto c2 = cos.narrow(1, 0, 2), s2 = sin.narrow(1, 0, 2);
  CHECK(torch::allclose(part.narrow(-1, 0, 4),
                        first * torch::cat({c2, c2}, -1) + rotate_half(first) * torch::cat({s2, s2}, -1), 0, 1e-14));
  CHECK(torch::equal(part.narrow(-1, 4, 4), x.narrow(-1, 4, 4)));
}

TEST_CASE("the fused rotation equals float64's rotation, forward and backward, for both pairings, a fraction and "
          "strided views",
          "[rope][architectures]") {
  torch::manual_seed(38);
  const int64_t B = 2, H = 3, T = 37, D = 24;
  // The rotation from its definition in float64: pair (a, b) -> (a c - b s, a s + b c), pairs
  // (i, i + P) or (2i, 2i + 1), the dimensions past 2P unchanged.
  const auto rotation64 = [](const torch::Tensor& x, const torch::Tensor& c, const torch::Tensor& s, int64_t rotated,
                             bool half) {
    const int64_t P = rotated / 2;
    auto out = x.clone();
    for (int64_t p = 0; p < P; ++p) {
      const int64_t i = half ? p : 2 * p, j = half ? p + P : 2 * p + 1;
      const auto a = x.select(-1, i), b = x.select(-1, j), cp = c.select(-1, p), sp = s.select(-1, p);
      out.select(-1, i).copy_(a * cp - b * sp);
      out.select(-1, j).copy_(a * sp + b * cp);
    }
    return out;
  };
  for (const bool half : {true, false})
    for (const int64_t rotated : {D, int64_t(8)}) {
      INFO((half ? "half" : "interleaved") << ", " << rotated << " of " << D << " dimensions rotated");
      const auto angles = torch::arange(T, torch::kFloat32).unsqueeze(1) * torch::rand({rotated / 2});
      const auto cos = angles.cos(), sin = angles.sin();
      // q as the projection's view: heads of a (B, T, 2H, D) tensor, the last dimension contiguous.
      const auto packed = torch::randn({B, T, 2 * H, D}).requires_grad_();
      const auto x = packed.narrow(2, H, H).transpose(1, 2);  // (B, H, T, D), strided
      REQUIRE(rotate_pairs_fused_takes(x, cos, sin, rotated));
      const auto y = rotate_pairs(x, cos, sin, rotated, half ? RotaryPairing::half : RotaryPairing::interleaved);
      const auto gy = torch::randn({B, H, T, D});
      (y * gy).sum().backward();
      const auto x64 = to64(x).requires_grad_();
      const auto y64 = rotation64(x64, to64(cos), to64(sin), rotated, half);
      (y64 * to64(gy)).sum().backward();
      CHECK(scaled_error(y, y64) < 1e-6);
      CHECK(scaled_error(packed.grad().narrow(2, H, H).transpose(1, 2), x64.grad()) < 1e-6);
      CHECK(torch::equal(packed.grad().narrow(2, 0, H), torch::zeros({B, T, H, D})));  // the other heads untouched
    }
  // Tables that need a gradient, per-sequence tables and bfloat16 go to LibTorch's operators.
  const auto x = torch::randn({1, 2, 4, 8});
  CHECK_FALSE(rotate_pairs_fused_takes(x, torch::ones({4, 4}).requires_grad_(), torch::ones({4, 4}), 8));
  CHECK_FALSE(rotate_pairs_fused_takes(x, torch::ones({1, 1, 4, 4}), torch::ones({1, 1, 4, 4}), 8));
  CHECK_FALSE(rotate_pairs_fused_takes(x.to(torch::kBFloat16), torch::ones({4, 4}, torch::kBFloat16),
                                       torch::ones({4, 4}, torch::kBFloat16), 8));
}

TEST_CASE("rotary methods with the half pairing: rotary, xpos and p_rope rotate the dimensions they say",
          "[rope][architectures]") {
  torch::manual_seed(35);
  PositionContext context;
  context.num_heads = 2;
  context.d_head = 8;
  context.d_model = 16;
  const auto make = [&](const std::string& yaml) {
    const YAML::Node node = YAML::Load(yaml);
    return PositionRegistry::instance().create(node["name"].as<std::string>(), context, OptionReader(node, "test", "position"));
  };
  const auto q0 = torch::randn({1, 2, 6, 8}), k0 = torch::randn({1, 2, 6, 8});
  const LayerInput at{0, TokenPositions::window(6), torch::Tensor()};
  // p_rope, keep 0.5 with the half pairing: pairs (i, i + 4) for i < 2 rotate, dimensions 2, 3,
  // 6 and 7 are left exactly as they were.
  {
    auto q = q0.clone(), k = k0.clone();
    make("{name: p_rope, keep: 0.5, pairing: half}")->rotate_qk(q, k, at);
    for (const int64_t j : {2, 3, 6, 7}) CHECK(torch::equal(q.select(-1, j), q0.select(-1, j)));
    CHECK(!torch::allclose(q.select(-1, 0).narrow(2, 1, 5), q0.select(-1, 0).narrow(2, 1, 5)));
    CHECK(!torch::allclose(q.select(-1, 4).narrow(2, 1, 5), q0.select(-1, 4).narrow(2, 1, 5)));
  }
  // xpos with fraction 0.5: the first 4 dimensions rotate and scale, the last 4 pass through.
  {
    auto q = q0.clone(), k = k0.clone();
    make("{name: xpos, fraction: 0.5, pairing: half}")->rotate_qk(q, k, at);
    CHECK(torch::equal(q.narrow(-1, 4, 4), q0.narrow(-1, 4, 4)));
    CHECK(torch::equal(k.narrow(-1, 4, 4), k0.narrow(-1, 4, 4)));
  }
  // rotary, half pairing: the scores depend on i - j alone, as with the interleaved pairing.
  {
    const auto method = make("{name: rotary, pairing: half, fraction: 0.5}");
    auto q = q0.narrow(2, 0, 1).expand({1, 2, 6, 8}).contiguous(), k = q.clone();
    method->rotate_qk(q, k, at);
    const auto scores = torch::matmul(q, k.transpose(-1, -2));  // (1, 2, 6, 6)
    for (int64_t i = 1; i < 6; ++i)
      CHECK(scores[0][0][i][i - 1].item<double>() == Approx(scores[0][0][1][0].item<double>()).epsilon(1e-5));
  }
  // A method without a rotation has no pairing to set: its options refuse the key.
  CHECK_THROWS_WITH(make("{name: alibi, pairing: half}"), Catch::Contains("pairing"));
}


TEST_CASE("a model of each architecture: its parameters and their estimate, causality, the KV cache, the efficient "
          "path and training",
          "[model][architectures]") {
  const auto corpus = tiny_byte_corpus();
  for (const auto& arch : architectures()) {
    INFO(arch.name);
    Config config = tiny_config("alibi");
    arch.apply(config);
    torch::manual_seed(36);
    auto model = build_model(config, 257);
    CHECK(model->num_parameters() == parameter_count_estimate(config, 257));
    model->eval();
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);  // norms off 1, biases off 0
      check_causal_and_cached(model);
      // The KV cache holds the key heads only: a quarter of the heads for 4:1 grouped-query attention.
      KVCache cache(8);
      model->hidden(torch::randint(0, 256, {1, 8}, torch::kLong), cache);
      CHECK(cache.layers[0].keys.size(1) == config.model.key_value_heads());
      // The memory-efficient path equals the reference over several tiles.
      const auto tokens = torch::randint(0, 256, {1, 600}, torch::kLong);
      model->set_attention_backend(AttentionBackend::Reference);
      const auto reference = model->forward(tokens);
      model->set_attention_backend(AttentionBackend::Efficient);
      CHECK(scaled_error(model->forward(tokens), reference) < 1e-5);
      model->set_attention_backend(AttentionBackend::Auto);
      CHECK(scaled_error(model->forward(tokens), reference) < 1e-5);
    }
    // Training lowers the loss (fused paths on: the norms, the gates, the grouped attention).
    TempDir dir("architecture");
    const auto summary = train_briefly(config, corpus, dir.root);
    CHECK(summary.train_curve.back().loss < 0.8 * summary.train_curve.front().loss);
  }
}

namespace {

// A block's forward from its own parts, composed here in float64 from the definitions: the
// norms (norm64), the attention (no position method: q k^T / sqrt(d), causal, grouped, each
// head's q and k normed where the block has qk_norm, or all heads' values together with
// qk_norm_over projection), the feed-forward (mlp with GELU, or a gated one), and the residual
// pattern with the sublayers' norms before, after or around them.
torch::Tensor block64(BlockImpl& block, const torch::Tensor& x) {
  const ModelConfig& m = block.options.model();
  const bool rms = m.norm == NormKind::rmsnorm;
  const auto norm = [&](const Norm& n, const torch::Tensor& h) {
    return norm64(h, n->weight.defined() ? to64(n->weight) : torch::Tensor(),
                  n->bias.defined() ? to64(n->bias) : torch::Tensor(), rms);
  };
  const auto lin = [](const torch::nn::Linear& l, const torch::Tensor& h) {
    auto y = torch::matmul(h, to64(l->weight).t());
    return l->bias.defined() ? y + to64(l->bias) : y;
  };
  const int64_t B = x.size(0), T = x.size(1), H = m.heads, Hkv = m.key_value_heads(), Dh = m.d_head();
  const auto attention = [&](const torch::Tensor& n) {
    auto qkv = lin(block.attention->qkv, n);  // (B, T, (H + 2 Hkv) Dh)
    if (m.clip_qkv > 0) qkv = torch::minimum(torch::maximum(qkv, torch::full_like(qkv, -m.clip_qkv)),
                                             torch::full_like(qkv, m.clip_qkv));
    auto q = qkv.narrow(-1, 0, H * Dh).view({B, T, H, Dh}).transpose(1, 2);
    auto k = qkv.narrow(-1, H * Dh, Hkv * Dh).view({B, T, Hkv, Dh}).transpose(1, 2);
    const auto v = qkv.narrow(-1, (H + Hkv) * Dh, Hkv * Dh).view({B, T, Hkv, Dh}).transpose(1, 2);
    if (m.qk_norm && m.qk_norm_over == QkNormOver::head) {
      q = norm(block.attention->q_norm, q);
      k = norm(block.attention->k_norm, k);
    } else if (m.qk_norm) {  // over (B, T, heads Dh)
      const auto whole = [&](const Norm& n, const torch::Tensor& t) {
        const int64_t heads = t.size(1);
        return norm(n, t.transpose(1, 2).reshape({B, T, heads * Dh})).view({B, T, heads, Dh}).transpose(1, 2);
      };
      q = whole(block.attention->q_norm, q);
      k = whole(block.attention->k_norm, k);
    }
    const auto y = grouped_attention64(q, k, v, AttentionBias::none(), true);  // (B, H, T, Dh)
    return lin(block.attention->out, y.transpose(1, 2).reshape({B, T, H * Dh}));
  };
  const auto ffn = [&](const torch::Tensor& n) {
    const auto a = lin(block.ffn_in, n);
    const int64_t F = m.ffn_width();
    const GluGate gelu = m.activation == Activation::gelu_tanh ? GluGate::gelu_tanh : GluGate::gelu;
    const auto hidden = m.ffn == FfnKind::mlp ? gate64(a, gelu)
                                              : gate64(a.narrow(-1, 0, F), m.ffn == FfnKind::geglu ? gelu : GluGate::silu) *
                                                    a.narrow(-1, F, F);
    return lin(block.ffn_out, hidden);
  };
  switch (m.block) {
    case BlockKind::sequential: {
      const bool before = m.sublayer_norms != SublayerNorms::output, after = m.sublayer_norms != SublayerNorms::input;
      const auto sublayer = [&](const auto& f, const Norm& in, const Norm& out, const torch::Tensor& h) {
        const auto y = f(before ? norm(in, h) : h);
        return after ? norm(out, y) : y;
      };
      const auto h = x + sublayer(attention, block.ln_attention, block.ln_attention_out, x);
      return h + sublayer(ffn, block.ln_ffn, block.ln_ffn_out, h);
    }
    case BlockKind::parallel:
      return x + attention(norm(block.ln_attention, x)) + ffn(norm(block.ln_ffn, x));
    case BlockKind::parallel_shared: {
      const auto n = norm(block.ln_attention, x);
      return x + attention(n) + ffn(n);
    }
  }
  return {};
}

}  // namespace

TEST_CASE("a block of each residual pattern and part equals its parts composed from their definitions",
          "[model][blocks][architectures]") {
  torch::manual_seed(37);
  const auto none = no_position();
  for (const BlockKind kind : {BlockKind::sequential, BlockKind::parallel, BlockKind::parallel_shared})
    for (const NormKind norm : {NormKind::layernorm, NormKind::rmsnorm})
      for (const FfnKind ffn : {FfnKind::mlp, FfnKind::swiglu, FfnKind::geglu})
        for (const bool grouped : {false, true}) {
          ModelConfig m = tiny_config().model;
          m.block = kind;
          m.norm = norm;
          m.ffn = ffn;
          m.kv_heads = grouped ? 2 : 0;
          m.bias = ffn != FfnKind::swiglu;  // SwiGLU blocks without biases, the others with
          m.qk_norm = grouped;
          m.head_dim = grouped && norm == NormKind::rmsnorm ? 12 : 0;  // 4 heads of 12 over d_model 32
          // GELU's tanh form for the rmsnorm blocks' mlp and geglu (GPT-2's, Gemma's), erf's for the rest
          if (ffn != FfnKind::swiglu && norm == NormKind::rmsnorm) m.activation = Activation::gelu_tanh;
          // Sequential blocks: the norms after the sublayers too (Gemma 2's, the gated ones) or
          // instead (OLMo 2's, the grouped ones, with q and k normed over the projection)
          if (kind == BlockKind::sequential && ffn != FfnKind::mlp)
            m.sublayer_norms = grouped ? SublayerNorms::output : SublayerNorms::both;
          if (m.sublayer_norms == SublayerNorms::output) m.qk_norm_over = QkNormOver::projection;
          // OLMo's: LayerNorms without parameters and q, k, v clipped (the SwiGLU LayerNorm blocks)
          m.norm_affine = !(ffn == FfnKind::swiglu && norm == NormKind::layernorm);
          m.clip_qkv = m.norm_affine ? 0.0 : 0.4;
          INFO(enum_name(kind) << ", " << enum_name(norm) << ", " << enum_name(ffn) << ", " << enum_name(m.activation)
                               << ", norms " << enum_name(m.sublayer_norms) << " of the sublayers"
                               << (grouped ? ", 2 key heads, qk_norm" : "") << (m.head_dim ? ", heads 12 wide" : "")
                               << (m.bias ? "" : ", no biases")
                               << (m.norm_affine ? "" : ", norms without parameters, q, k, v clipped at 0.4"));
          Block block{BlockOptions(m)};
          {
            torch::NoGradGuard no_grad;
            for (auto& p : block->parameters()) p.copy_(p + 0.2 * torch::randn_like(p));
          }
          const auto x = torch::randn({2, 11, 32});
          const auto expected = block64(*block, to64(x));
          if (m.clip_qkv > 0) {  // the clip bites: some of q, k, v lie beyond it
            const auto n = m.sublayer_norms == SublayerNorms::output ? x : block->ln_attention->forward(x);
            CHECK(block->attention->qkv->forward(n).abs().gt(m.clip_qkv).any().item<bool>());
          }
          // Training (the fused paths) and evaluation.
          AttentionOptions training = causal_attention_options();
          training.training = true;
          const auto trained = block->forward(x, *none, TokenPositions::window(11), training);
          CHECK(scaled_error(trained, expected) < 1e-5);
          block->eval();
          torch::NoGradGuard no_grad;
          AttentionOptions evaluation = causal_attention_options();
          evaluation.training = false;
          CHECK(scaled_error(block->forward(x, *none, TokenPositions::window(11), evaluation), expected) < 1e-5);
        }
}

TEST_CASE("evaluation runs a wide feed-forward in row chunks: the chunks, the last one short, equal float64's block",
          "[model][blocks][architectures]") {
  // BlockImpl::feed_forward without a gradient takes about 16 MiB of hidden activations at a
  // time, at least 256 rows: a hidden width of 16,384 makes that 256 rows, so 2 x 300 rows run
  // as 256, 256 and 88.
  torch::manual_seed(41);
  const auto none = no_position();
  for (const FfnKind ffn : {FfnKind::mlp, FfnKind::swiglu}) {
    ModelConfig m = tiny_config().model;
    m.ffn = ffn;
    m.d_ffn = ffn == FfnKind::mlp ? 16384 : 8192;
    INFO(enum_name(ffn));
    Block block{BlockOptions(m)};
    {
      torch::NoGradGuard no_grad;
      for (auto& p : block->parameters()) p.copy_(p + 0.2 * torch::randn_like(p));
    }
    REQUIRE(block->ffn_in->weight.size(0) == 16384);
    const auto x = torch::randn({2, 300, 32});
    const auto expected = block64(*block, to64(x));
    block->eval();
    torch::NoGradGuard no_grad;
    AttentionOptions evaluation = causal_attention_options();
    evaluation.training = false;
    const auto y = block->forward(x, *none, TokenPositions::window(300), evaluation);
    CHECK(scaled_error(y, expected) < 1e-5);
    // Position by position, both sequences: rows 255/256 and 511/512 are chunk borders, 512-599
    // the short last chunk.
    for (const int64_t t : {0, 211, 212, 255, 256, 299})
      CHECK(scaled_error(y.select(1, t), expected.select(1, t)) < 1e-5);
  }
}

TEST_CASE("architecture keys that do not apply are refused in one line, and their defaults leave a run's identity as it was",
          "[config][architectures]") {
  const auto refused = [](const std::string& yaml, const std::string& expected) {
    INFO(yaml);
    CHECK_THROWS_WITH(config_from_yaml(YAML::Load(yaml), "c.yaml"), Catch::Contains(expected));
  };
  refused("model: {heads: 8, kv_heads: 3}", "kv_heads': 3 does not divide heads 8");
  refused("model: {ffn: swiglu, activation: relu}", "activation': is the mlp's or geglu's; ffn swiglu gates with SiLU");
  refused("model: {ffn: swiglu, activation: gelu_tanh}", "ffn swiglu gates with SiLU (leave activation out)");
  refused("model: {ffn: geglu, activation: relu}", "activation': relu with ffn geglu, which gates with GELU");
  CHECK(config_from_yaml(YAML::Load("model: {ffn: geglu, activation: gelu_tanh}"), "c.yaml").model.activation ==
        Activation::gelu_tanh);
  refused("model: {ffn_multiple: 64}", "ffn_multiple': is set but d_ffn is not 0 with a gated ffn");
  refused("model: {norm_eps: 0}", "norm_eps': must be a finite number above 0");
  // A soft cap float32 cannot hold: 0 there (the cap dropped) or infinite (NaN scores).
  refused("attention: {softcap: 1e-60}", "softcap': must be 0 (off) or within float32's normal range");
  refused("attention: {softcap: 1e60}", "softcap': must be 0 (off) or within float32's normal range");
  refused("model: {logit_softcap: 1e-60}", "logit_softcap': must be 0 (off) or within float32's normal range");
  refused("model: {clip_qkv: 1e-60}", "clip_qkv': must be 0 (off) or within float32's normal range");
  refused("model: {clip_qkv: -1}", "clip_qkv': must be a finite number at least 0, got -1");
  refused("model: {norm_affine: false, norm_bias: true}", "norm_bias': is true with norm_affine false");
  refused("model: {bias: false, init: fairseq}", "with model.bias false there is none");
  refused("model: {norm: batchnorm}", "batchnorm");
  refused("model: {block: serial}", "serial");
  refused("model: {kv_heads: -1}", "kv_heads");
  refused("model: {head_dim: -4}", "head_dim");
  refused("model: {d_model: 32, heads: 3}", "d_model (32) must be a multiple of heads (3), or model.head_dim set");
  refused("model: {sublayer_norms: output, block: parallel}",
          "sublayer_norms': output with block parallel: only the sequential block has norms after its sublayers");
  refused("model: {sublayer_norms: after}", "after");
  refused("model: {qk_norm_over: projection}", "qk_norm_over': projection without qk_norm");
  // Llama's feed-forward width: 2/3 of 4 d_model, rounded up to a multiple of ffn_multiple.
  ModelConfig m;
  m.ffn = FfnKind::swiglu;
  m.d_ffn = 0;
  m.d_model = 4096;
  CHECK(m.ffn_width() == 11008);  // Llama 7B's
  m.d_model = 256;
  CHECK(m.ffn_width() == 768);
  m.ffn = FfnKind::mlp;
  CHECK(m.ffn_width() == 1024);
  m.d_ffn = 700;
  CHECK(m.ffn_width() == 700);
  // A config of the defaults writes none of the new keys into its identity (the runs before them
  // keep their fingerprints); one that sets a key has it.
  const YAML::Node plain = config_from_yaml(YAML::Load("model: {layers: 2}"), "c.yaml").model_keys()["model"];
  for (const char* key : {"kv_heads", "ffn_multiple", "ffn", "norm", "norm_eps", "bias", "block", "qk_norm",
                          "embedding_norm", "head_dim", "sublayer_norms", "qk_norm_over", "norm_affine", "clip_qkv"})
    CHECK(!plain[key]);
  // head_dim: d_model / heads written out is the same model, so the same identity.
  const auto identity = [](const std::string& yaml) {
    return YAML::Dump(config_from_yaml(YAML::Load(yaml), "c.yaml").model_keys());
  };
  CHECK(identity("model: {d_model: 64, heads: 4, head_dim: 16}") == identity("model: {d_model: 64, heads: 4}"));
  CHECK(identity("model: {d_model: 64, heads: 4, head_dim: 32}") != identity("model: {d_model: 64, heads: 4}"));
  const Config wide = config_from_yaml(YAML::Load("model: {d_model: 30, heads: 4, head_dim: 32}"), "c.yaml");
  CHECK(wide.model.d_head() == 32);
  CHECK(wide.model_keys()["model"]["head_dim"].as<int>() == 32);
  const YAML::Node llama =
      config_from_yaml(YAML::Load("model: {kv_heads: 2, norm: rmsnorm, ffn: swiglu}"), "c.yaml").model_keys()["model"];
  CHECK(llama["kv_heads"].as<int>() == 2);
  CHECK(llama["norm"].as<std::string>() == "rmsnorm");
  CHECK(llama["ffn"].as<std::string>() == "swiglu");
  const YAML::Node olmo2 = config_from_yaml(YAML::Load("model: {sublayer_norms: output, qk_norm: true, qk_norm_over: "
                                                       "projection}"),
                                            "c.yaml")
                               .model_keys()["model"];
  CHECK(olmo2["sublayer_norms"].as<std::string>() == "output");
  CHECK(olmo2["qk_norm_over"].as<std::string>() == "projection");
  const YAML::Node olmo = config_from_yaml(YAML::Load("model: {norm_affine: false, clip_qkv: 8}"), "c.yaml").model_keys()["model"];
  CHECK_FALSE(olmo["norm_affine"].as<bool>());
  CHECK(olmo["clip_qkv"].as<double>() == 8);
  CHECK_FALSE(olmo["norm_bias"].as<bool>());  // no parameters, no bias
}

TEST_CASE("EXTRAP_FUSED_GLU: 0 runs LibTorch's gated feed-forward, 1 the fused one, anything else is refused by value",
          "[glu][cli]") {
  TempDir d("glu-switch");
  require_environment_switch(d, "EXTRAP_FUSED_GLU", one_step_bench({"--set", "model.ffn=swiglu", "--set", "model.norm=rmsnorm"}),
                             "on",
                             "environment variable EXTRAP_FUSED_GLU=on: expected 0 (the gated feed-forward as LibTorch "
                             "runs it) or 1 (the gate and its product in one pass each way, the default)",
                             "SwiGLU as LibTorch runs it, residual adds fused with the RMSNorm after them,",
                             "SwiGLU gate and product in one pass each way,");
}

TEST_CASE("bench generate: the KV cache of 4:1 grouped-query attention is a quarter of full heads'", "[architectures][cli]") {
  TempDir d("gqa-cache");
  std::map<std::string, std::string> lines;
  for (const std::string kv : {"0", "1"}) {
    std::string out;
    REQUIRE(run_cli(d, {"bench", "generate", "--config", std::string(EXTRAP_SOURCE_DIR) + "/configs/train_quick.yaml",
                        "--set", "model.kv_heads=" + kv, "--prompt-tokens", "8", "--new", "8"},
                    &out) == 0);
    const auto at = out.find("KV cache at 16 tokens: ");
    REQUIRE(at != std::string::npos);
    lines[kv] = out.substr(at, out.find('\n', at) - at);
  }
  // 3 layers x 2 (keys, values) x 16 tokens x d_head 32 x 4 bytes x heads.
  CHECK(lines["0"] == "KV cache at 16 tokens: 48.0 KiB (4 key and value heads of 4)");
  CHECK(lines["1"] == "KV cache at 16 tokens: 12.0 KiB (1 key and value heads of 4)");
}

TEST_CASE("EXTRAP_FUSED_ROTATION: 0 and 1 train, anything else is refused by value", "[rope][cli]") {
  TempDir d("rotation-switch");
  require_environment_switch(d, "EXTRAP_FUSED_ROTATION", one_step_bench({"--set", "position.name=rotary"}), "yes",
                             "environment variable EXTRAP_FUSED_ROTATION=yes: expected 0 (the rotary rotation as "
                             "LibTorch runs it) or 1 (the rotation of q and k in one pass each way, the default)");
}
