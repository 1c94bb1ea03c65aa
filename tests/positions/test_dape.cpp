// DAPE (positions/dape.cpp) against its definition (REFERENCE.md, "The 2024-26 wave"), written
// here in float64 loops: logits A + B + f([A; B]), f = Linear(2H, W) -> LeakyReLU(0.01) ->
// Linear(W, H) per (i, j), B the base bias (ALiBi: -m_h (i - j) below the diagonal and 0 above
// it inside f; KERPLE-log: -r1 log(1 + r2 |i - j|)), the masks after. Then gradients, the
// evaluation path that computes f in row blocks, and the refusals.
#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "core/attention/fused_cpu_attention.h"
#include "core/model/model.h"
#include "positions/alibi_slopes.h"
#include "positions/position.h"
#include "tests/support/position_support.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <limits>

using namespace extrap;
using testing::make_method;
using testing::parameter;

namespace {

// softmax(A + B + f([A; B]), masked) v for one batch row, from the definition. base(h, i, j)
// is B as f reads it; visible(i, j) the mask.
torch::Tensor dape_by_definition(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 PositionMethod& method, int64_t layer,
                                 const std::function<double(int64_t, int64_t, int64_t)>& base,
                                 const std::function<bool(int64_t, int64_t)>& visible) {
  const int64_t H = q.size(1), T = q.size(2), D = q.size(3);
  const auto w1 = parameter(method, "w1")[layer].to(torch::kFloat64), b1 = parameter(method, "b1")[layer].to(torch::kFloat64);
  const auto w2 = parameter(method, "w2")[layer].to(torch::kFloat64), b2 = parameter(method, "b2")[layer].to(torch::kFloat64);
  const int64_t W = w1.size(0);
  auto out = torch::zeros({H, T, D}, torch::kFloat64);
  const auto qd = q[0].to(torch::kFloat64), kd = k[0].to(torch::kFloat64), vd = v[0].to(torch::kFloat64);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<std::vector<double>> logits(static_cast<size_t>(H), std::vector<double>(static_cast<size_t>(T)));
    for (int64_t j = 0; j < T; ++j) {
      std::vector<double> x(static_cast<size_t>(2 * H));
      for (int64_t h = 0; h < H; ++h) {
        x[size_t(h)] = qd[h][i].dot(kd[h][j]).item<double>() / std::sqrt(double(D));
        x[size_t(H + h)] = base(h, i, j);
      }
      std::vector<double> hidden(static_cast<size_t>(W));
      for (int64_t w = 0; w < W; ++w) {
        double s = b1[w].item<double>();
        for (int64_t c = 0; c < 2 * H; ++c) s += w1[w][c].item<double>() * x[size_t(c)];
        hidden[size_t(w)] = s > 0 ? s : 0.01 * s;
      }
      for (int64_t h = 0; h < H; ++h) {
        double f = b2[h].item<double>();
        for (int64_t w = 0; w < W; ++w) f += w2[h][w].item<double>() * hidden[size_t(w)];
        logits[size_t(h)][size_t(j)] = visible(i, j) ? x[size_t(h)] + x[size_t(H + h)] + f
                                                     : -std::numeric_limits<double>::infinity();
      }
    }
    for (int64_t h = 0; h < H; ++h) {
      const auto row = torch::softmax(torch::tensor(logits[size_t(h)], torch::kFloat64), 0);
      out[h][i] = row.matmul(vd[h]);
    }
  }
  return out.unsqueeze(0);
}

}  // namespace

TEST_CASE("dape: logits A + B + MLP(A and B stacked) as defined, over ALiBi and KERPLE bases", "[positions][dape]") {
  const int64_t H = 2, T = 7, D = 4, layer = 1;
  torch::manual_seed(21);
  const auto q = torch::randn({1, H, T, D}), k = torch::randn({1, H, T, D}), v = torch::randn({1, H, T, D});
  SECTION("causal, base alibi (the reference's AliBi_DAPE)") {
    auto method = make_method("dape", H, true, "{mlp_width: 5}", D, 2);
    const auto slopes = alibi_slopes(int(H));
    const auto expected = dape_by_definition(
        q, k, v, *method, layer,
        [&](int64_t h, int64_t i, int64_t j) { return j <= i ? -slopes[size_t(h)] * double(i - j) : 0.0; },
        [](int64_t i, int64_t j) { return j <= i; });
    AttentionOptions options;
    const auto actual = attention_reference(q, k, v, method->bias(layer_window(layer, T)), options);
    CHECK((actual.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-5);
  }
  SECTION("bidirectional, base kerple_log with its own options") {
    auto method = make_method("dape", H, false, "{mlp_width: 3, base: kerple_log, base_options: {shared_across_layers: false}}",
                              D, 2);
    const auto r1 = parameter(*method, "base.r1").clamp_min(0.01), r2 = parameter(*method, "base.r2").clamp_min(0.01);
    REQUIRE(r1.size(0) == 2);  // one set per layer: base_options reached the base
    const auto expected = dape_by_definition(
        q, k, v, *method, layer,
        [&](int64_t h, int64_t i, int64_t j) {
          return -r1[layer][h].item<double>() * std::log1p(r2[layer][h].item<double>() * double(std::abs(i - j)));
        },
        [](int64_t, int64_t) { return true; });
    AttentionOptions options;
    options.causal = false;
    const auto actual = attention_reference(q, k, v, method->bias(layer_window(layer, T)), options);
    CHECK((actual.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-5);
  }
}

TEST_CASE("dape: gradients reach the MLP and the base's parameters", "[positions][dape]") {
  auto method = make_method("dape", 2, true, "{mlp_width: 4, base: kerple_log}", 8, 2);
  testing::backward_through_attention(*method, 2, 8, 6, true, 1);
  for (const char* name : {"w1", "b1", "w2", "base.r1", "base.r2"}) {
    INFO(name);
    const auto grad = parameter(*method, name).grad();
    REQUIRE(grad.defined());
    CHECK(grad.abs().sum().item<double>() > 0);
  }
  // b2 adds one constant to every score of its head, which the softmax cancels: its gradient is
  // 0 but for rounding (it was exactly 0 in some runs, so "> 0" passed on rounding noise alone).
  // Rounding: a float32 sum of the 2 x 8 x 8 score gradients of each head, about 256 x 1.2e-7 of
  // their size at worst (9.5e-7 of w2's was seen once, above the 1e-6 this bound first had); a
  // gradient that the softmax did not cancel would be of w2's own size.
  const auto b2 = parameter(*method, "b2").grad();
  REQUIRE(b2.defined());
  CHECK(b2.abs().max().item<double>() < 1e-4 * parameter(*method, "w2").grad().abs().max().item<double>() + 1e-12);
  // Layer 1 only: layer 0's MLP has no gradient.
  CHECK(parameter(*method, "w1").grad()[0].abs().sum().item<double>() == 0);
}

TEST_CASE("dape: evaluation computes the MLP in row blocks, with the same numbers", "[positions][dape]") {
  // 192 rows x 192 keys x width 2048 is above the 2^26 floats of one block: two blocks.
  const int64_t H = 2, T = 192, D = 4;
  auto method = make_method("dape", H, true, "{mlp_width: 2048}", D, 1);
  torch::manual_seed(22);
  const auto q = torch::randn({1, H, T, D}), k = torch::randn({1, H, T, D}), v = torch::randn({1, H, T, D});
  AttentionOptions options;
  const auto whole = attention_reference(q, k, v, method->bias(layer_window(0, T)), options).detach();
  torch::NoGradGuard no_grad;
  const auto blocks = attention_reference(q, k, v, method->bias(layer_window(0, T)), options);
  CHECK((blocks - whole).abs().max().item<double>() < 1e-6);
}

TEST_CASE("dape: the fused and efficient paths refuse it by name, bad bases are refused at their key",
          "[positions][dape]") {
  auto method = make_method("dape", 2, true, "{}", 8, 1);
  const auto q = torch::randn({1, 2, 16, 8});
  AttentionOptions options;
  options.backend = AttentionBackend::Fused;
  CHECK_THROWS_WITH(attention(q, q, q, method->bias(layer_window(0, 16)), options), Catch::Contains("fused CPU kernel"));
  CHECK_THAT(fused_cpu_attention_unsupported_reason(q, q, q, method->bias(layer_window(0, 16)), options),
             Catch::Contains("DAPE"));
  options.backend = AttentionBackend::Efficient;
  CHECK_THROWS_WITH(attention(q, q, q, method->bias(layer_window(0, 16)), options), Catch::Contains("DAPE"));

  CHECK_THAT(testing::position_refusal("{name: dape, base: rotary}"),
             Catch::Contains("position.base") && Catch::Contains("'rotary' is not a bias of positions alone"));
  CHECK_THAT(testing::position_refusal("{name: dape, base: fox}"),
             Catch::Contains("position.base") && Catch::Contains("'fox' depends on the layer input"));
  CHECK_THAT(testing::position_refusal("{name: dape, base: dape}"), Catch::Contains("position.base"));
  CHECK_THAT(testing::position_refusal("{name: dape, base: alibbi}"),
             Catch::Contains("position.base") && Catch::Contains("alibbi"));
  CHECK_THAT(testing::position_refusal("{name: dape, base_options: {randomize_max: 500}}"),
             Catch::Contains("position.base_options"));
  CHECK_THAT(testing::position_refusal("{name: dape, base_options: {slopes: 3}}"),
             Catch::Contains("position.base_options.slopes"));
  CHECK_THAT(testing::position_refusal("{name: dape, mlp_width: 0}"), Catch::Contains("position.mlp_width"));
  CHECK_THAT(testing::position_refusal("{name: dape, randomize_max: 500}"), Catch::Contains("dape"));
  CHECK_THAT(testing::position_refusal("{name: dape, base: alibi}", "model: {objective: masked_lm}\n"),
             Catch::Contains("position.base") && Catch::Contains("bidirectional"));
  CHECK(testing::position_refusal("{name: dape, base: fire, base_options: {init_L: 64}}") == "(accepted)");
}
