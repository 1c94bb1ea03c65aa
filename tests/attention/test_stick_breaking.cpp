// Stick-breaking attention (core/attention/stick_breaking.h) against its definition written here
// as direct products in float64 (REFERENCE.md, "The 2024-26 wave"; the authors' reference model
// adds the remaining mass times the query's own value):
//   A_ij = sigmoid(z_ij) prod_{j < k < i, k visible} (1 - sigmoid(z_ik)),
//   o_i = sum_j A_ij v_j + (1 - sum_j A_ij) v_i.
// Then its gradients against the same products' autograd, the row-blocked evaluation, decoding
// with fewer queries than keys, and the refusals.
#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "core/attention/efficient_attention.h"
#include "core/attention/stick_breaking.h"
#include "tests/support/position_support.h"

#include <torch/torch.h>

#include <cmath>

using namespace extrap;

namespace {

// The definition for query rows that are the last Tq of Tk keys; visible(i, j) for j < i (or
// j <= i with the diagonal) decides which keys take part. Differentiable tensors, float64.
// With a logit scale c (H, Tq), z_ij = c_i q_i . k_j / sqrt(d); a chunk C keeps j with floor(i / C)
// == floor(j / C).
torch::Tensor by_definition(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool diagonal,
                            int64_t window = 0, int64_t chunk = 0, const torch::Tensor& logit_scale = {}) {
  const int64_t B = q.size(0), H = q.size(1), tq = q.size(2), tk = k.size(2), D = q.size(3);
  std::vector<torch::Tensor> rows;
  for (int64_t r = 0; r < tq; ++r) {
    const int64_t i = tk - tq + r;
    const auto visible = [&](int64_t j) {
      return (diagonal ? j <= i : j < i) && (window == 0 || i - j < window) && (chunk == 0 || i / chunk == j / chunk);
    };
    auto z = torch::matmul(q.narrow(2, r, 1), k.transpose(-2, -1)).squeeze(2) / std::sqrt(double(D));  // (B, H, tk)
    if (logit_scale.defined()) z = z * logit_scale.select(1, r).view({1, H, 1});
    auto beta = torch::sigmoid(z);
    auto out = torch::zeros({B, H, D}, q.options());
    auto total = torch::zeros({B, H, 1}, q.options());
    auto stay = torch::ones({B, H, 1}, q.options());  // prod over the visible keys between j and i
    for (int64_t j = diagonal ? i : i - 1; j >= 0; --j) {
      if (!visible(j)) continue;
      const auto a = beta.narrow(2, j, 1) * stay;  // (B, H, 1)
      out = out + a * v.select(2, j);
      total = total + a;
      stay = stay * (1 - beta.narrow(2, j, 1));
    }
    rows.push_back((out + (1 - total) * v.select(2, i)).unsqueeze(2));
  }
  return torch::cat(rows, 2);
}

}  // namespace

TEST_CASE("stick-breaking: weights and remaining mass as defined, with and without the diagonal and a window",
          "[attention][stick-breaking]") {
  torch::manual_seed(31);
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  const auto q = torch::randn({2, 3, 9, 4}, options) * 2, k = torch::randn({2, 3, 9, 4}, options),
             v = torch::randn({2, 3, 9, 4}, options);
  for (const bool diagonal : {false, true})
    for (const int64_t window : {int64_t(0), int64_t(3)}) {
      INFO("diagonal " << diagonal << ", window " << window);
      auto bias = AttentionBias::stick_breaking(diagonal);
      bias.window = window;
      const auto actual = attention(q, k, v, bias, testing::causal_attention_options());
      CHECK((actual - by_definition(q, k, v, diagonal, window)).abs().max().item<double>() < 1e-12);
    }
  // Logits far above 0: the nearest visible key takes the whole stick.
  const auto large = torch::ones({1, 1, 5, 4}, options) * 30;
  const auto values = torch::arange(5, options).view({1, 1, 5, 1}).expand({1, 1, 5, 4});
  const auto out = attention(large, large, values, AttentionBias::stick_breaking(false), testing::causal_attention_options());
  CHECK(out[0][0][0][0].item<double>() == 0);  // position 0 sees no key: its own value
  for (int64_t i = 1; i < 5; ++i) CHECK(std::abs(out[0][0][i][0].item<double>() - double(i - 1)) < 1e-9);
}

TEST_CASE("stick-breaking: gradients equal the definition's, in float32 as in training", "[attention][stick-breaking]") {
  torch::manual_seed(32);
  auto q = torch::randn({1, 2, 8, 4}, torch::requires_grad()), k = torch::randn({1, 2, 8, 4}, torch::requires_grad()),
       v = torch::randn({1, 2, 8, 4}, torch::requires_grad());
  const auto target = torch::randn({1, 2, 8, 4});
  (attention(q, k, v, AttentionBias::stick_breaking(false), testing::causal_attention_options()) * target).sum().backward();
  const auto dq = q.grad().clone(), dk = k.grad().clone(), dv = v.grad().clone();
  auto q64 = q.detach().to(torch::kFloat64).requires_grad_(), k64 = k.detach().to(torch::kFloat64).requires_grad_(),
       v64 = v.detach().to(torch::kFloat64).requires_grad_();
  (by_definition(q64, k64, v64, false) * target.to(torch::kFloat64)).sum().backward();
  CHECK((dq.to(torch::kFloat64) - q64.grad()).abs().max().item<double>() < 1e-5);
  CHECK((dk.to(torch::kFloat64) - k64.grad()).abs().max().item<double>() < 1e-5);
  CHECK((dv.to(torch::kFloat64) - v64.grad()).abs().max().item<double>() < 1e-5);
}

TEST_CASE("stick-breaking: row blocks and cached decoding give the reference's numbers", "[attention][stick-breaking]") {
  torch::manual_seed(33);
  const auto q = torch::randn({2, 2, 11, 8}), k = torch::randn({2, 2, 11, 8}), v = torch::randn({2, 2, 11, 8});
  const auto bias = AttentionBias::stick_breaking(false);
  const auto reference = stick_breaking_attention(q, k, v, bias, testing::causal_attention_options());
  torch::NoGradGuard no_grad;
  for (const int64_t block : {1, 3, 4, 11, 64}) {
    INFO("query block " << block);
    CHECK((attention_reference_blocked(q, k, v, bias, testing::causal_attention_options(), block) - reference).abs().max().item<double>() <
          1e-6);
    CHECK((attention_efficient(q, k, v, bias, testing::causal_attention_options(), {block, 512}) - reference).abs().max().item<double>() <
          1e-6);
  }
  // The last 4 queries against all 11 keys: the reference's last 4 rows.
  const auto last = attention(q.narrow(2, 7, 4), k, v, bias, testing::causal_attention_options());
  CHECK((last - reference.narrow(2, 7, 4)).abs().max().item<double>() < 1e-6);
}

TEST_CASE("stick-breaking in row blocks: outputs and every gradient equal the definition's, masks and blocks crossing",
          "[attention][stick-breaking]") {
  torch::manual_seed(34);
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const int64_t B = 2, H = 3, T = 13, D = 4;
  const auto q0 = torch::randn({B, H, T, D}, f64) * 1.5, k0 = torch::randn({B, H, T, D}, f64),
             v0 = torch::randn({B, H, T, D}, f64), target = torch::randn({B, H, T, D}, f64);
  const auto scale0 = 0.5 + torch::rand({H, T}, f64);  // an SSMax-like factor per head and row
  struct Case {
    bool diagonal;
    int64_t window, chunk, block, queries;  // the last `queries` of the T keys ask
    bool scaled;
  };
  for (const Case c : {Case{false, 0, 0, 4, T, false}, Case{true, 0, 0, 5, T, true}, Case{false, 4, 0, 3, T, true},
                       Case{true, 0, 5, 4, T, false}, Case{false, 3, 6, 1, T, true}, Case{false, 0, 0, 64, T, true},
                       Case{true, 5, 0, 2, 6, true}, Case{false, 0, 4, 3, 1, false},
                       Case{false, 0, 4, 3, 2, true}}) {
    INFO("diagonal " << c.diagonal << ", window " << c.window << ", chunk " << c.chunk << ", query block " << c.block
                     << ", queries " << c.queries << ", logit scale " << c.scaled);
    const int64_t first = T - c.queries;
    const auto run = [&](bool blocked) {
      auto q = q0.narrow(2, first, c.queries).clone().requires_grad_(), k = k0.clone().requires_grad_(),
           v = v0.clone().requires_grad_();
      auto scale = scale0.narrow(1, first, c.queries).clone().requires_grad_();
      torch::Tensor out;
      if (blocked) {
        auto bias = AttentionBias::stick_breaking(c.diagonal);
        bias.window = c.window;
        bias.chunk = c.chunk;
        if (c.scaled) bias.logit_scale = scale;
        out = stick_breaking_attention_blocked(q, k, v, bias, testing::causal_attention_options(), c.block);
      } else {
        out = by_definition(q, k, v, c.diagonal, c.window, c.chunk, c.scaled ? scale : torch::Tensor());
      }
      (out * target.narrow(2, first, c.queries)).sum().backward();
      // A row that sees no key (position 12 alone in its chunk) gives q and k no gradient at all.
      const auto grad = [](const torch::Tensor& x) { return x.grad().defined() ? x.grad() : torch::zeros_like(x); };
      return std::vector<torch::Tensor>{out.detach(), grad(q), grad(k), grad(v),
                                        c.scaled ? grad(scale) : torch::zeros_like(scale)};
    };
    const auto actual = run(true), expected = run(false);
    const char* names[] = {"output", "dq", "dk", "dv", "d logit scale"};
    for (size_t t = 0; t < actual.size(); ++t) {
      INFO(names[t]);
      REQUIRE(actual[t].defined());
      CHECK((actual[t] - expected[t]).abs().max().item<double>() < 1e-12);
    }
  }
}

TEST_CASE("stick-breaking in row blocks: float32 as in training, and the backends that take it",
          "[attention][stick-breaking]") {
  torch::manual_seed(35);
  const auto q0 = torch::randn({2, 2, 40, 8}) * 2, k0 = torch::randn({2, 2, 40, 8}), v0 = torch::randn({2, 2, 40, 8});
  const auto target = torch::randn({2, 2, 40, 8});
  auto q64 = q0.to(torch::kFloat64).requires_grad_(), k64 = k0.to(torch::kFloat64).requires_grad_(),
       v64 = v0.to(torch::kFloat64).requires_grad_();
  (by_definition(q64, k64, v64, false, 9) * target.to(torch::kFloat64)).sum().backward();
  auto bias = AttentionBias::stick_breaking(false);
  bias.window = 9;
  const auto expected = by_definition(q64, k64, v64, false, 9).detach();
  // Each backend in float32 (the reference path is autograd over whole score matrices, Auto and
  // Efficient the row blocks), and the reference path's autograd in float64 to rounding.
  // (The float32 reference path once gave outputs 2.6e-4 from the definition's, in 1 process in
  // 40 under load: MKL's first vector exp; core/runtime/vector_math_warmup.cpp.)
  const std::pair<AttentionBackend, torch::ScalarType> runs[] = {{AttentionBackend::Auto, torch::kFloat32},
                                                                 {AttentionBackend::Efficient, torch::kFloat32},
                                                                 {AttentionBackend::Reference, torch::kFloat32},
                                                                 {AttentionBackend::Reference, torch::kFloat64}};
  for (const auto& [backend, type] : runs) {
    INFO("backend " << enum_name(backend) << ", " << type);
    AttentionOptions options = testing::causal_attention_options();
    options.backend = backend;
    options.training = true;
    const bool exact = type == torch::kFloat64;
    const auto leaf = [&](const torch::Tensor& x) { return x.to(type).clone().requires_grad_(); };
    auto q = leaf(q0), k = leaf(k0), v = leaf(v0);
    const auto out = attention(q, k, v, bias, options);
    (out * target.to(type)).sum().backward();
    CHECK((out.to(torch::kFloat64) - expected).abs().max().item<double>() < (exact ? 1e-12 : 1e-5));
    CHECK((q.grad().to(torch::kFloat64) - q64.grad()).abs().max().item<double>() < (exact ? 1e-12 : 1e-4));
    CHECK((k.grad().to(torch::kFloat64) - k64.grad()).abs().max().item<double>() < (exact ? 1e-12 : 1e-4));
    CHECK((v.grad().to(torch::kFloat64) - v64.grad()).abs().max().item<double>() < (exact ? 1e-12 : 1e-5));
  }
  // Attention dropout stays on the reference path, which has it; the row blocks refuse it.
  AttentionOptions dropout = testing::causal_attention_options();
  dropout.training = true;
  dropout.dropout = 0.1;
  CHECK_THROWS_WITH(stick_breaking_attention_blocked(q0, k0, v0, bias, dropout), Catch::Contains("dropout"));
  CHECK(attention(q0, k0, v0, bias, dropout).sizes() == q0.sizes());
  auto wrong = bias;
  wrong.logit_scale = torch::ones({2, 39});
  CHECK_THROWS_WITH(stick_breaking_attention_blocked(q0, k0, v0, wrong, testing::causal_attention_options()),
                    Catch::Contains("logit_scale must be (2, 40)"));
}

TEST_CASE("stick-breaking: float32 weights on the CPU (a row at a time) equal float64's, every mask and large logits",
          "[attention][stick-breaking]") {
  torch::manual_seed(36);
  const auto q64 = torch::randn({2, 3, 70, 8}, torch::kFloat64) * 3, k64 = torch::randn({2, 3, 70, 8}, torch::kFloat64);
  struct Case {
    bool diagonal;
    int64_t window, chunk, queries;
  };
  for (const Case c : {Case{false, 0, 0, 70}, Case{true, 0, 0, 70}, Case{false, 9, 0, 70}, Case{true, 0, 16, 70},
                       Case{false, 5, 12, 70}, Case{true, 7, 0, 3}, Case{false, 0, 0, 1}}) {
    INFO("diagonal " << c.diagonal << ", window " << c.window << ", chunk " << c.chunk << ", queries " << c.queries);
    auto bias = AttentionBias::stick_breaking(c.diagonal);
    bias.window = c.window;
    bias.chunk = c.chunk;
    const auto q = q64.narrow(2, 70 - c.queries, c.queries);
    const auto expected = stick_breaking_weights(q, k64, bias);  // float64: the tensor form
    const auto actual = stick_breaking_weights(q.to(torch::kFloat32), k64.to(torch::kFloat32), bias);
    CHECK((actual.to(torch::kFloat64) - expected).abs().max().item<double>() < 2e-6);
    // Every hidden key 0 (float32 also rounds weights below e^-87 to 0).
    CHECK(actual.masked_select(expected == 0).abs().max().item<double>() == 0);
  }
  // The logits reach +-25 here: weights near 1 beside weights float32 cannot hold.
  const auto all = stick_breaking_weights(q64, k64, AttentionBias::stick_breaking(false));
  CHECK(all.max().item<double>() > 0.999);
  CHECK(all.masked_select(all > 0).min().item<double>() < 1e-38);
}

TEST_CASE("stick-breaking: refusals name what is wrong", "[attention][stick-breaking]") {
  const auto q = torch::randn({1, 2, 6, 4});
  auto bias = AttentionBias::stick_breaking(false);
  AttentionOptions options = testing::causal_attention_options();
  options.causal = false;
  CHECK_THROWS_WITH(attention(q, q, q, bias, options), Catch::Contains("causal attention only"));
  options.causal = true;
  options.backend = AttentionBackend::Fused;
  CHECK_THROWS_WITH(attention(q, q, q, bias, options), Catch::Contains("fused CPU kernel"));
  options.backend = AttentionBackend::Auto;
  bias.sink = torch::zeros({2});
  CHECK_THROWS_WITH(attention(q, q, q, bias, options), Catch::Contains("attention.sink"));
  CHECK_THROWS_WITH(materialize_bias(AttentionBias::stick_breaking(false), 2, 6, 6, true),
                    Catch::Contains("replace the softmax"));
  const auto needs_grad = torch::randn({1, 2, 6, 4}, torch::requires_grad());
  CHECK_THROWS_WITH(attention_reference_blocked(needs_grad, needs_grad, needs_grad, AttentionBias::stick_breaking(false),
                                                testing::causal_attention_options()),
                    Catch::Contains("inference only"));
  CHECK_THAT(testing::position_refusal("stick_breaking", "model: {objective: masked_lm}\n"),
             Catch::Contains("stick_breaking") && Catch::Contains("bidirectional"));
  CHECK_THAT(testing::position_refusal("stick_breaking", "attention: {sink: true}\n"),
             Catch::Contains("attention.sink") && Catch::Contains("stick_breaking"));
  CHECK_THAT(testing::position_refusal("{name: stick_breaking, attend_current: 3}"),
             Catch::Contains("position.attend_current"));
}
