// The position methods since ALiBi (kerple_log, kerple_power, sandwich, xpos, fire, cope, fox)
// and randomized positions: each bias or rotation against an independent computation from the
// published definition (plain loops in double precision), translation invariance where the
// method is relative, gradients into every parameter, the two new bias descriptions
// (cumulative, contextual) on the memory-efficient path against the reference, and the
// refusals. Training, causality and efficient == reference inside a whole model are in
// test_every_method.cpp, which takes every registered method.
#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "core/attention/efficient_attention.h"
#include "core/model/config.h"
#include "core/model/memory_estimate.h"
#include "core/model/model.h"
#include "positions/alibi_slopes.h"
#include "positions/position.h"
#include "tests/support/position_support.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <cmath>
#include <complex>
#include <limits>

using namespace extrap;

namespace {

const double kInfinity = std::numeric_limits<double>::infinity();

using testing::make_method;
using testing::backward_through_attention;
using testing::parameter;

void set_parameter(PositionMethod& method, const std::string& name, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  auto p = parameter(method, name);
  REQUIRE(p.sizes() == value.sizes());
  p.copy_(value);
}

// bias (H, T, T) against expected(h, i, j) for the visible entries, -inf for the masked ones.
template <class Expected>
void check_bias(const torch::Tensor& bias, bool causal, Expected expected, double tolerance = 1e-5) {
  auto b = bias.to(torch::kFloat64);
  for (int64_t h = 0; h < b.size(0); ++h)
    for (int64_t i = 0; i < b.size(1); ++i)
      for (int64_t j = 0; j < b.size(2); ++j) {
        INFO("head " << h << ", i " << i << ", j " << j);
        const double v = b[h][i][j].item<double>();
        if (causal && j > i) {
          CHECK(v == -kInfinity);
          continue;
        }
        const double e = expected(h, i, j);
        CHECK(v == Approx(e).margin(tolerance).epsilon(tolerance));
      }
}

void check_every_parameter_has_gradient(const PositionMethod& method) {
  for (const auto& p : method.named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(p.value().grad().abs().sum().item<double>() > 0);
  }
}

}  // namespace

TEST_CASE("kerple_log and kerple_power: the bias from r1 and r2, clamped into range",
          "[positions][since-alibi]") {
  const int64_t heads = 3, t = 7;
  // Row values chosen to exercise the clamps: r1 -1 -> 0.01, power's exponent 3 -> 2.
  const auto r1 = torch::tensor({{0.7, -1.0, 1.9}}, torch::kFloat32);
  const auto r2 = torch::tensor({{0.3, 1.2, 3.0}}, torch::kFloat32);
  for (bool causal : {true, false})
    for (const std::string name : {"kerple_log", "kerple_power"}) {
      INFO(name << (causal ? " (causal)" : " (bidirectional)"));
      auto method = make_method(name, heads, causal);
      // Fresh parameters start in range: r ~ U[0, max), clamped at 0.01 (and 2 for the exponent).
      for (const char* p : {"r1", "r2"}) {
        auto value = parameter(*method, p);
        CHECK(value.sizes() == torch::IntArrayRef{1, heads});
        CHECK(value.min().item<float>() >= 0.01f);
        CHECK(value.max().item<double>() <= 2.0);
      }
      set_parameter(*method, "r1", r1);
      set_parameter(*method, "r2", r2);
      const auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, causal);
      check_bias(bias, causal, [&](int64_t h, int64_t i, int64_t j) {
        const double a = std::max(0.01, r1[0][h].item<double>());
        const double d = std::abs(double(i - j));
        if (name == "kerple_log") return -a * std::log(1.0 + std::max(0.01, r2[0][h].item<double>()) * d);
        const double p = std::min(2.0, std::max(0.01, r2[0][h].item<double>()));
        return d == 0 ? 0.0 : -a * std::pow(d, p);
      });
      // The parameters themselves were projected into range, as the reference does.
      CHECK(parameter(*method, "r1")[0][1].item<float>() == Approx(0.01));
      if (name == "kerple_power") CHECK(parameter(*method, "r2")[0][2].item<float>() == 2.0f);
      else CHECK(parameter(*method, "r2")[0][2].item<float>() == 3.0f);
    }
}

TEST_CASE("kerple: gradients reach every head, per layer when asked, and r stays positive",
          "[positions][since-alibi]") {
  const int64_t heads = 3, t = 6;
  for (const std::string name : {"kerple_log", "kerple_power"}) {
    INFO(name);
    auto method = make_method(name, heads, true, "{shared_across_layers: false}", 8, 3);
    CHECK(parameter(*method, "r1").size(0) == 3);
    backward_through_attention(*method, heads, 8, t, true, /*layer=*/2);
    for (const char* p : {"r1", "r2"}) {
      auto grad = parameter(*method, p).grad();
      CHECK((grad[2].abs() > 0).all().item<bool>());  // every head of the layer used
      CHECK((grad.narrow(0, 0, 2) == 0).all().item<bool>());  // the other layers' rows untouched
    }
    // A loss rewarding ever larger biases pushes r1 down; it stops at 0.01.
    torch::optim::SGD optimizer(method->parameters(), torch::optim::SGDOptions(10.0));
    for (int step = 0; step < 5; ++step) {
      optimizer.zero_grad();
      auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, false);
      bias.sum().neg().backward();
      optimizer.step();
    }
    method->bias(layer_window(0, t));
    CHECK(parameter(*method, "r1").min().item<double>() == Approx(0.01));
    for (const auto& [key, value] : method->log_values()) CHECK(value >= 0.01 - 1e-7);
  }
}

TEST_CASE("sandwich: the bias of Chi et al. 2023 from its definition", "[positions][since-alibi]") {
  const int64_t heads = 3, d_head = 8, t = 9;
  for (bool causal : {true, false}) {
    auto method = make_method("sandwich", heads, causal, "{}", d_head);
    CHECK(method->parameters().empty());
    const auto bias = materialize_bias(method->bias(layer_window(1, t)), heads, t, t, causal);
    check_bias(bias, causal, [&](int64_t h, int64_t i, int64_t j) {
      double sum = 0;
      for (int64_t k = 1; k <= d_head / 2; ++k)
        sum += std::cos(std::abs(double(i - j)) * std::pow(10000.0, -2.0 * double(k) / double(d_head)));
      return (sum - double(d_head) / 2.0) / (8.0 * double(h + 1) / double(heads));
    });
    // Zero on the diagonal, negative elsewhere, the same in every layer.
    CHECK(bias[0][4][4].item<float>() == 0.0f);
    CHECK(bias[0][8][0].item<float>() < 0.0f);
    CHECK(torch::equal(bias, materialize_bias(method->bias(layer_window(0, t)), heads, t, t, causal)));
  }
}

TEST_CASE("xpos: rotary times zeta^(n / 512) against complex arithmetic", "[positions][since-alibi]") {
  const int64_t heads = 2, d_head = 8, t = 6;
  auto method = make_method("xpos", heads, true, "{}", d_head);
  const auto q_in = torch::randn({1, heads, t, d_head}, torch::kFloat64);
  const auto k_in = torch::randn({1, heads, t, d_head}, torch::kFloat64);
  for (int64_t offset : {0, 700}) {
    INFO("offset " << offset);
    auto q = q_in.clone(), k = k_in.clone();
    method->rotate_qk(q, k, layer_window(0, t, offset));
    // The scores: sum over pairs m of Re(conj-free product) with scale zeta_m^((i - j) / 512).
    auto scores = torch::matmul(q, k.transpose(-2, -1));
    auto x = q_in.accessor<double, 4>(), y = k_in.accessor<double, 4>();
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          double expected = 0;
          for (int64_t m = 0; m < d_head / 2; ++m) {
            const double theta = std::pow(10000.0, -2.0 * double(m) / double(d_head));
            const double zeta = (2.0 * double(m) + 0.4 * double(d_head)) / (1.4 * double(d_head));
            const auto a = std::complex<double>(x[0][h][i][2 * m], x[0][h][i][2 * m + 1]) *
                           std::polar(1.0, double(offset + i) * theta);
            const auto b = std::complex<double>(y[0][h][j][2 * m], y[0][h][j][2 * m + 1]) *
                           std::polar(1.0, double(offset + j) * theta);
            // Real dot product of the two rotated pairs, scaled.
            expected += (a.real() * b.real() + a.imag() * b.imag()) *
                        std::pow(zeta, double(i - j) / 512.0);
          }
          INFO("head " << h << ", i " << i << ", j " << j);
          CHECK(scores[0][h][i][j].item<double>() == Approx(expected).margin(1e-9));
        }
  }
  // Bidirectional is refused, with the reason and the alternative.
  CHECK_THROWS_WITH(make_method("xpos", heads, false),
                    Catch::Contains("bidirectional") && Catch::Contains("grow") &&
                        Catch::Contains("use 'rotary'"));
  CHECK_THROWS_WITH(make_method("xpos", heads, true, "{}", 7), Catch::Contains("odd"));
}

TEST_CASE("fire: the MLP of the normalised log distance, from the paper's definition",
          "[positions][since-alibi]") {
  const int64_t heads = 2, t = 12, width = 4;
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    auto method = make_method("fire", heads, causal, "{mlp_width: 4, init_L: 8}", 8, 2);
    torch::manual_seed(1);
    set_parameter(*method, "w1", torch::randn({2, width}));
    set_parameter(*method, "b1", torch::randn({2, width}));
    set_parameter(*method, "w2", torch::randn({2, heads, width}));
    set_parameter(*method, "b2", torch::randn({2, heads}));
    set_parameter(*method, "c", torch::tensor({0.1, -0.3}));  // |c| is used
    set_parameter(*method, "L_multiplier", torch::tensor({1.0, -0.75}));
    for (int64_t layer : {0, 1}) {
      INFO("layer " << layer);
      const double c = layer == 0 ? 0.1 : 0.3, L = layer == 0 ? 8.0 : 6.0;
      auto w1 = parameter(*method, "w1")[layer], b1 = parameter(*method, "b1")[layer];
      auto w2 = parameter(*method, "w2")[layer], b2 = parameter(*method, "b2")[layer];
      const auto bias = materialize_bias(method->bias(layer_window(layer, t)), heads, t, t, causal);
      check_bias(bias, causal, [&](int64_t h, int64_t i, int64_t j) {
        const double x = std::log(1.0 + c * std::abs(double(i - j))) /
                         (std::log(1.0 + c * std::max(double(i), L)) + 1e-6);
        double out = b2[h].item<double>();
        for (int64_t w = 0; w < width; ++w)
          out += w2[h][w].item<double>() * std::max(0.0, x * w1[w].item<double>() + b1[w].item<double>());
        return out;
      }, 1e-4);
    }
    // Past L every query's distances are normalised into [0, 1]: rows far apart agree at the
    // same relative depth (x = 1 at the window start), which is how FIRE extrapolates.
    backward_through_attention(*method, heads, 8, t, causal);
    check_every_parameter_has_gradient(*method);
  }
}

TEST_CASE("cope: contextual positions from the gates of q.k, by hand", "[positions][since-alibi]") {
  const int64_t heads = 2, d = 4, t = 6, npos = 4;  // npos 4 < t: positions clamp at 3
  auto method = make_method("cope", heads, true, "{npos: 4}", d);
  torch::manual_seed(2);
  set_parameter(*method, "embeddings", torch::randn({2, 1, d, npos}));
  const auto q = torch::randn({1, heads, t, d}, torch::kFloat64);
  const auto k = torch::randn({1, heads, t, d}, torch::kFloat64);
  const auto E = parameter(*method, "embeddings")[1][0].to(torch::kFloat64);  // layer 1: (d, npos)
  auto description = method->bias(layer_window(1, t));
  REQUIRE(description.kind == AttentionBias::Kind::Contextual);
  auto scores = torch::matmul(q / std::sqrt(double(d)), k.transpose(-2, -1));
  const auto plain = scores.clone();
  add_bias_(scores, description, q, /*causal=*/true);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < t; ++i) {
      // Gates of row i, then each key's position: the gates from j to i.
      std::vector<double> gate(t, 0.0);
      for (int64_t j = 0; j <= i; ++j) gate[j] = 1.0 / (1.0 + std::exp(-plain[0][h][i][j].item<double>()));
      for (int64_t j = 0; j < t; ++j) {
        INFO("head " << h << ", i " << i << ", j " << j);
        const double got = scores[0][h][i][j].item<double>();
        if (j > i) {
          CHECK(got == -kInfinity);
          continue;
        }
        double p = 0;
        for (int64_t s = j; s <= i; ++s) p += gate[s];
        p = std::min(p, double(npos - 1));
        const auto lo = int64_t(std::floor(p)), hi = int64_t(std::ceil(p));
        double z_lo = 0, z_hi = 0;
        for (int64_t c = 0; c < d; ++c) {
          z_lo += q[0][h][i][c].item<double>() * E[c][lo].item<double>();
          z_hi += q[0][h][i][c].item<double>() * E[c][hi].item<double>();
        }
        const double w = p - double(lo);
        CHECK(got == Approx(plain[0][h][i][j].item<double>() + (1 - w) * z_lo + w * z_hi).margin(1e-5));
      }
    }
  CHECK_THROWS_WITH(make_method("cope", heads, false),
                    Catch::Contains("bidirectional") && Catch::Contains("counted"));
  // Gradients reach the embeddings of the layer used.
  backward_through_attention(*method, heads, d, t, true, /*layer=*/1);
  CHECK(parameter(*method, "embeddings").grad()[1].abs().sum().item<double>() > 0);
}

TEST_CASE("fox: sums of log forget gates of the layer input, fixed gates are ALiBi",
          "[positions][since-alibi]") {
  const int64_t heads = 3, d_head = 4, t = 7, d_model = heads * d_head;
  auto method = make_method("fox", heads, true, "{}", d_head);
  torch::manual_seed(4);
  set_parameter(*method, "gate_weight", torch::randn({2, heads, d_model}) * 0.5);
  set_parameter(*method, "gate_bias", torch::randn({2, heads}));
  LayerInput at = layer_window(1, t);
  at.input = torch::randn({2, t, d_model});
  const auto description = method->bias(at);
  REQUIRE(description.kind == AttentionBias::Kind::Cumulative);
  const auto bias = materialize_bias(description, heads, t, t, true);  // (B, H, T, T)
  REQUIRE(bias.sizes() == torch::IntArrayRef{2, heads, t, t});
  const auto W = parameter(*method, "gate_weight")[1], b = parameter(*method, "gate_bias")[1];
  for (int64_t batch = 0; batch < 2; ++batch) {
    INFO("batch " << batch);
    check_bias(bias[batch], true, [&](int64_t h, int64_t i, int64_t j) {
      double sum = 0;  // log f_l for l = j + 1 .. i
      for (int64_t l = j + 1; l <= i; ++l) {
        double logit = b[h].item<double>();
        for (int64_t c = 0; c < d_model; ++c)
          logit += W[h][c].item<double>() * at.input[batch][l][c].item<double>();
        sum += -std::log1p(std::exp(-logit));  // log sigmoid
      }
      return sum;
    });
  }
  // Zero weights and log sigmoid(b_h) = -m_h: exactly causal ALiBi.
  const auto slopes = alibi_slopes(int(heads));
  std::vector<double> b_alibi;
  for (double m : slopes) b_alibi.push_back(-std::log(std::expm1(m)));  // logsigmoid(b) = -m
  set_parameter(*method, "gate_weight", torch::zeros({2, heads, d_model}));
  set_parameter(*method, "gate_bias", torch::tensor(b_alibi, torch::kFloat64).to(torch::kFloat32).repeat({2, 1}));
  const auto as_alibi = materialize_bias(method->bias(at), heads, t, t, true)[0];
  const auto alibi = materialize_bias(AttentionBias::linear_causal(torch::tensor(slopes).to(torch::kFloat32)),
                                      heads, t, t, true);
  CHECK(torch::allclose(as_alibi, alibi, 1e-5, 1e-6));
  // Gradients reach the gate weights and biases; bidirectional is refused.
  set_parameter(*method, "gate_weight", torch::randn({2, heads, d_model}) * 0.1);
  backward_through_attention(*method, heads, d_head, t, true, /*layer=*/0);
  CHECK(parameter(*method, "gate_weight").grad()[0].abs().sum().item<double>() > 0);
  CHECK(parameter(*method, "gate_bias").grad()[0].abs().sum().item<double>() > 0);
  CHECK_THROWS_WITH(make_method("fox", heads, false), Catch::Contains("bidirectional"));
}

TEST_CASE("cumulative and contextual biases: the efficient path equals the reference across tiles",
          "[positions][since-alibi][efficient]") {
  torch::NoGradGuard no_grad;
  torch::manual_seed(6);
  const int64_t batch = 2, heads = 3, t = 333, d = 8;
  const auto q = torch::randn({batch, heads, t, d}), k = torch::randn({batch, heads, t, d});
  const auto v = torch::randn({batch, heads, t, d});
  AttentionOptions options;
  options.causal = true;
  // Forget gates as the Forgetting Transformer makes them; CoPE embeddings per head and shared.
  const auto F = torch::log_sigmoid(torch::randn({batch, heads, t}) + 2).cumsum(-1);
  const AttentionBias biases[] = {AttentionBias::cumulative_sum(F),
                                  AttentionBias::contextual(torch::randn({1, d, 40})),
                                  AttentionBias::contextual(torch::randn({heads, d, 400}))};
  // Both paths round in fp32, in different orders (CoPE's positions are sums of up to T gates,
  // summed tile by tile on the efficient path): each is held to the float64 reference, the
  // efficient one within a small multiple of the fp32 reference's own error.
  const auto in64 = [](const AttentionBias& b) {
    if (b.kind == AttentionBias::Kind::Cumulative) return AttentionBias::cumulative_sum(b.cumulative.to(torch::kFloat64));
    return AttentionBias::contextual(b.position_embeddings.to(torch::kFloat64));
  };
  for (const auto& bias : biases) {
    INFO(bias.describe());
    const auto exact = attention_reference(q.to(torch::kFloat64), k.to(torch::kFloat64),
                                           v.to(torch::kFloat64), in64(bias), options);
    const double reference_error =
        (attention_reference(q, k, v, bias, options) - exact).abs().max().item<double>();
    for (const EfficientAttentionBlocks blocks : {EfficientAttentionBlocks{64, 128}, EfficientAttentionBlocks{}}) {
      INFO("blocks " << blocks.query_block << " x " << blocks.key_block << ", fp32 reference error "
                     << reference_error);
      const auto efficient = attention_efficient(q, k, v, bias, options, blocks);
      CHECK((efficient - exact).abs().max().item<double>() < std::max(1e-5, 3 * reference_error));
    }
  }
  options.causal = false;
  CHECK_THROWS_WITH(attention_efficient(q, k, v, biases[0], options), Catch::Contains("causal"));
  CHECK_THROWS_WITH(attention_reference(q, k, v, biases[1], options), Catch::Contains("causal"));
}

TEST_CASE("randomized positions: sampled positions reach every hook that uses them",
          "[positions][since-alibi][randomize]") {
  const int64_t heads = 2, d_head = 8, t = 5;
  TokenPositions sampled = TokenPositions::window(t);
  sampled.sampled = torch::tensor({3, 10, 11, 40, 97}, torch::kLong);
  const auto contiguous = [&](int64_t p) { return TokenPositions::window(1, p); };

  // Embeddings: row n of the sampled window is the embedding of position sampled[n].
  for (const std::string name : {"sinusoidal", "learned"}) {
    INFO(name);
    auto method = make_method(name, heads, true, name == "learned" ? "{max_length: 100}" : "{}", d_head);
    const auto x = torch::randn({1, t, heads * d_head});
    const auto out = method->embed(x, sampled);
    for (int64_t n = 0; n < t; ++n) {
      const auto one = method->embed(x.narrow(1, n, 1), contiguous(sampled.sampled[n].item<int64_t>()));
      CHECK(torch::allclose(out.narrow(1, n, 1), one, 1e-6, 1e-6));
    }
  }
  // Rotations: the same, per token.
  for (const std::string name : {"rotary", "xpos"}) {
    INFO(name);
    auto method = make_method(name, heads, true, "{}", d_head);
    const auto q = torch::randn({1, heads, t, d_head}), k = torch::randn({1, heads, t, d_head});
    auto q_s = q.clone(), k_s = k.clone();
    LayerInput at = layer_window(0, t);
    at.positions = sampled;
    method->rotate_qk(q_s, k_s, at);
    const auto scores = torch::matmul(q_s, k_s.transpose(-2, -1));
    // Against the contiguous window 0..97, picking the sampled rows and columns.
    auto q_full = torch::zeros({1, heads, 98, d_head}), k_full = torch::zeros({1, heads, 98, d_head});
    q_full.index_copy_(2, sampled.sampled, q);
    k_full.index_copy_(2, sampled.sampled, k);
    method->rotate_qk(q_full, k_full, layer_window(0, 98));
    const auto full = torch::matmul(q_full, k_full.transpose(-2, -1))
                          .index_select(2, sampled.sampled).index_select(3, sampled.sampled);
    CHECK(torch::allclose(scores, full, 1e-4, 1e-5));
  }
  // ALiBi: distances between the sampled positions.
  for (const std::string name : {"alibi", "alibi_learned"}) {
    INFO(name);
    auto method = make_method(name, heads, true, "{}", d_head);
    LayerInput at = layer_window(0, t);
    at.positions = sampled;
    const auto bias = materialize_bias(method->bias(at), heads, t, t, true);
    const auto slopes = alibi_slopes(int(heads));
    check_bias(bias, true, [&](int64_t h, int64_t i, int64_t j) {
      return -slopes[size_t(h)] *
             double(sampled.sampled[i].item<int64_t>() - sampled.sampled[j].item<int64_t>());
    });
  }
}

TEST_CASE("randomized positions: a model samples in training only, refusals name the key",
          "[positions][since-alibi][randomize]") {
  auto model = testing::check_samples_in_training_only("{name: rotary, randomize_max: 200}");
  CHECK(model->position().sampling().kind == PositionSampling::Kind::random);
  CHECK(model->position().sampling().range == 200);

  CHECK_THAT(testing::position_refusal("{name: t5_bias, randomize_max: 500}"),
             Catch::Contains("randomize_max") && Catch::Contains("t5_bias") && Catch::Contains("rotary"));
  CHECK_THAT(testing::position_refusal("{name: rotary, randomize_max: -1}"), Catch::Contains("randomize_max"));
  CHECK_THAT(testing::position_refusal("{name: rotary, randomize_max: 32}"),
             Catch::Contains("randomize_max") && Catch::Contains("seq_len 64"));
  CHECK_THAT(testing::position_refusal("{name: learned, max_length: 100, randomize_max: 500}"),
             Catch::Contains("randomize_max 500") && Catch::Contains("max_length 100"));
  CHECK(testing::position_refusal("{name: alibi, randomize_max: 500}") == "(accepted)");
}

TEST_CASE("the training-memory estimate counts CoPE's and FIRE's own tensors", "[positions][since-alibi]") {
  Config config = testing::tiny_config("alibi");
  config.train.seq_len = 512;
  config.train.batch_tokens = 8192;  // 16 sequences
  const int64_t alibi = estimate_training_memory(config, 257).activations;
  config.position_name = "cope";
  const int64_t cope = estimate_training_memory(config, 257).activations;
  config.position_name = "fire";
  const int64_t fire = estimate_training_memory(config, 257).activations;
  // 2 layers; 12 float tensors of 16 x 4 heads x 512 x 512 a layer; 32 of 512 x 512.
  CHECK(cope - alibi == 2 * 12 * int64_t(16 * 4 * 512 * 512) * 4);
  CHECK(fire - alibi == 2 * 32 * int64_t(512 * 512) * 4);
}
