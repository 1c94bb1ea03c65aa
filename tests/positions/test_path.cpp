// `path` (positions/path.cpp): the reflections it makes from a layer input, against the
// reference layer's recipe written here in float64 loops (fla's PaTHAttention, MHA setting):
//   w_t = l2norm per head of silu(sum_m conv[c][m] y[t - size + 1 + m][c]),  y = W_up W_down x,
//   l2norm(v) = v / sqrt(|v|^2 + 1e-6),  beta_t = 2 sigmoid(W_beta x_t + b_beta),
//   F = cumsum logsigmoid(W_g x + b_g) (forget_gate).
// Then: gradients reach every parameter, a zero input is plain NoPE, cached decoding keeps every
// key's projections, and the refusals.
#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "core/model/model.h"
#include "positions/position.h"
#include "tests/support/position_support.h"
#include "tests/support/test_support.h"

#include <torch/torch.h>

#include <cmath>

using namespace extrap;
using testing::make_method;
using testing::parameter;

namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

TEST_CASE("path: the reflections and gates of a layer input are the reference layer's", "[methods][path]") {
  const int64_t heads = 2, d_head = 4, T = 7, D = heads * d_head;
  for (const std::string yaml : {"{}", "{rank: 0, conv_size: 2, forget_gate: true}", "{conv_size: 0, rank: 3}"}) {
    INFO(yaml);
    torch::manual_seed(5);
    auto method = make_method("path", heads, true, yaml, d_head, /*layers=*/2);
    const auto node = YAML::Load(yaml);
    const int64_t rank = node["rank"] ? node["rank"].as<int64_t>() : 32;
    const int64_t size = node["conv_size"] ? node["conv_size"].as<int64_t>() : 3;
    const bool gate = node["forget_gate"] && node["forget_gate"].as<bool>();
    {  // the initial weights are large enough to matter here
      torch::NoGradGuard no_grad;
      for (auto& p : method->parameters()) p.copy_(torch::randn_like(p) * 0.5);
    }
    LayerInput at = layer_window(1, T);
    at.input = torch::randn({1, T, D});
    const AttentionBias bias = method->bias(at);
    REQUIRE(bias.kind == AttentionBias::Kind::Householder);
    CHECK(bias.cumulative.defined() == gate);
    const auto x = at.input[0].to(torch::kFloat64);
    const auto get = [&](const char* name) { return parameter(*method, name)[1].detach().to(torch::kFloat64); };
    const auto y = rank > 0 ? torch::matmul(torch::matmul(x, get("w_down").t()), get("w_up").t())
                            : torch::matmul(x, get("w_proj").t());  // (T, H d)
    std::vector<double> F(static_cast<size_t>(heads), 0.0);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> w(static_cast<size_t>(d_head));
        double norm2 = 0;
        for (int64_t e = 0; e < d_head; ++e) {
          const int64_t c = h * d_head + e;
          double s = 0;
          if (size == 0) {
            s = y[t][c].item<double>();
          } else {
            for (int64_t m = 0; m < size; ++m)
              if (t - size + 1 + m >= 0) s += get("w_conv")[c][m].item<double>() * y[t - size + 1 + m][c].item<double>();
            s = s * sigmoid(s);  // silu
          }
          w[size_t(e)] = s;
          norm2 += s * s;
        }
        for (int64_t e = 0; e < d_head; ++e)
          CHECK(bias.householder_w[0][h][t][e].item<double>() == Approx(w[size_t(e)] / std::sqrt(norm2 + 1e-6)).margin(1e-6));
        const double beta = 2 * sigmoid(get("beta_weight")[h].dot(x[t]).item<double>() + get("beta_bias")[h].item<double>());
        CHECK(bias.householder_beta[0][h][t].item<double>() == Approx(beta).epsilon(1e-5));
        if (gate) {
          const double g = get("gate_weight")[h].dot(x[t]).item<double>() + get("gate_bias")[h].item<double>();
          F[size_t(h)] += -std::log1p(std::exp(-g));
          CHECK(bias.cumulative[0][h][t].item<double>() == Approx(F[size_t(h)]).epsilon(1e-5));
        }
      }
  }
}

TEST_CASE("path: initialised as the reference, gradients reach every parameter, a zero input is NoPE",
          "[methods][path]") {
  torch::manual_seed(6);
  auto method = make_method("path", 2, true, "{forget_gate: true}", 8, 2);
  CHECK(parameter(*method, "w_down").size(1) == 32);
  CHECK(parameter(*method, "w_conv").size(2) == 3);
  CHECK(parameter(*method, "w_up").std().item<double>() == Approx(0.02).epsilon(0.1));
  CHECK(parameter(*method, "beta_bias").abs().max().item<double>() == 0);
  testing::backward_through_attention(*method, 2, 8, 12, true, /*layer=*/1);
  for (const auto& p : method->named_parameters()) {
    INFO(p.key());
    REQUIRE(p.value().grad().defined());
    CHECK(p.value().grad()[1].abs().sum().item<double>() > 0);  // layer 1's row
    CHECK(p.value().grad()[0].abs().sum().item<double>() == 0);
  }
  // Without a layer input (inspection): every reflection the identity, the scores plain q.k.
  const AttentionBias at_zero = method->bias(layer_window(0, 9));
  CHECK(at_zero.householder_w.abs().max().item<double>() == 0);
  CHECK(at_zero.householder_beta.sub(1).abs().max().item<double>() < 1e-7);
}

TEST_CASE("path: cached decoding keeps each key's projections, and the refusals", "[methods][path]") {
  torch::manual_seed(8);
  auto method = make_method("path", 2, true, "{forget_gate: true}", 4, 1);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : method->parameters()) p.copy_(torch::randn_like(p) * 0.5);
  }
  const auto x = torch::randn({2, 9, 8});
  LayerInput whole = layer_window(0, 9);
  whole.input = x;
  const AttentionBias full = method->bias(whole);
  torch::Tensor state;
  LayerInput first = layer_window(0, 5);
  first.input = x.narrow(1, 0, 5);
  first.state = &state;
  method->bias(first);
  LayerInput next = layer_window(0, 4, 5);
  next.input = x.narrow(1, 5, 4);
  next.keys = 9;
  next.state = &state;
  const AttentionBias cached = method->bias(next);
  CHECK(torch::allclose(cached.householder_w, full.householder_w, 1e-6, 1e-6));
  CHECK(torch::allclose(cached.householder_beta, full.householder_beta, 1e-6, 1e-6));
  CHECK(torch::allclose(cached.cumulative, full.cumulative, 1e-6, 1e-6));

  CHECK_THAT(testing::position_refusal("path", "model: {objective: masked_lm}\n"),
             Catch::Contains("path") && Catch::Contains("bidirectional"));
  CHECK_THAT(testing::position_refusal("{name: path, rank: -1}"), Catch::Contains("position.rank"));
  CHECK_THAT(testing::position_refusal("{name: path, conv_size: -2}"), Catch::Contains("position.conv_size"));
  CHECK_THAT(testing::position_refusal("{name: path, randomize_max: 256}"), Catch::Contains("randomize_max"));
  CHECK_THAT(testing::position_refusal("{name: path, pose_target: 256}"), Catch::Contains("pose_target"));
}
