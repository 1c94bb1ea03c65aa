// PaTH's Householder-product scores (core/attention/householder.h) against the definition written
// here with explicit d x d matrices in float64 (REFERENCE.md, "The 2024-26 wave"):
//   H_t = I - beta_t w_t w_t^T,   logit(i, j) = q_i^T (H_i H_{i-1} ... H_{j+1}) k_j / sqrt(d), j <= i,
// then softmax with the causal mask. Every block size, queries that are the last keys (cached
// decoding), gradients into q, k, w and beta, the forget gates, the options every kind takes, the
// row-blocked evaluation and the refusals.
#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "core/attention/householder.h"
#include "tests/support/position_support.h"

#include <torch/torch.h>

#include <cmath>

using namespace extrap;

namespace {

// (B, H, Tq, Tk) logits by the definition, queries the last Tq of Tk positions; -inf for j > i.
// Differentiable in every input.
torch::Tensor logits_by_definition(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& w,
                                   const torch::Tensor& beta) {
  const int64_t B = q.size(0), H = q.size(1), tq = q.size(2), tk = k.size(2), D = q.size(3);
  std::vector<torch::Tensor> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t r = 0; r < tq; ++r) {
        const int64_t i = tk - tq + r;
        std::vector<torch::Tensor> row(static_cast<size_t>(tk));
        auto product = torch::eye(D, q.options());  // H_i ... H_{j+1}
        for (int64_t j = i; j >= 0; --j) {
          row[size_t(j)] = torch::dot(torch::mv(product.t(), q[b][h][r]), k[b][h][j]) / std::sqrt(double(D));
          const auto wj = w[b][h][j];
          product = torch::matmul(product, torch::eye(D, q.options()) - beta[b][h][j] * torch::outer(wj, wj));
        }
        for (int64_t j = i + 1; j < tk; ++j) row[size_t(j)] = torch::full({}, -INFINITY, q.options());
        out.push_back(torch::stack(row));
      }
  return torch::stack(out).view({B, H, tq, tk});
}

struct PathInputs {
  torch::Tensor q, k, v, w, beta;
};

// Reflections as PaTH makes them: w of unit norm, beta in (0, 2) (here up to 1.9, so that some
// H_t are nearly singular and others reverse sign along w).
PathInputs path_inputs(int64_t B, int64_t H, int64_t T, int64_t D, torch::Dtype dtype, uint64_t seed) {
  torch::manual_seed(seed);
  const auto o = torch::TensorOptions().dtype(dtype);
  PathInputs in;
  in.q = torch::randn({B, H, T, D}, o);
  in.k = torch::randn({B, H, T, D}, o);
  in.v = torch::randn({B, H, T, D}, o);
  in.w = torch::randn({B, H, T, D}, o);
  in.w = in.w / in.w.norm(2, -1, true);
  in.beta = torch::rand({B, H, T}, o) * 1.9;
  return in;
}

}  // namespace

TEST_CASE("householder scores equal the definition's products at every block size, and for the last queries only",
          "[attention][path]") {
  const auto in = path_inputs(2, 3, 23, 5, torch::kFloat64, 41);
  const auto expected = logits_by_definition(in.q, in.k, in.w, in.beta);
  const auto visible = expected.isfinite();
  for (const int64_t block : {0, 1, 2, 4, 8, 16, 32}) {
    INFO("block " << block);
    const auto actual = householder_scores(in.q / std::sqrt(5.0), in.k, in.w, in.beta, block);
    CHECK((actual.masked_select(visible) - expected.masked_select(visible)).abs().max().item<double>() < 1e-12);
    CHECK(actual.masked_select(visible.logical_not()).abs().max().item<double>() == 0);
    // The last 6 queries (decoding with a KV cache): the same rows.
    const auto last = householder_scores(in.q.narrow(2, 17, 6) / std::sqrt(5.0), in.k, in.w, in.beta, block);
    const auto rows = visible.narrow(2, 17, 6);
    CHECK((last.masked_select(rows) - expected.narrow(2, 17, 6).masked_select(rows)).abs().max().item<double>() <
          1e-12);
  }
  // beta = 0 or w = 0: no reflection, plain q.k.
  const auto plain = torch::matmul(in.q, in.k.transpose(-1, -2)).tril();
  CHECK((householder_scores(in.q, in.k, in.w, torch::zeros_like(in.beta)) - plain).abs().max().item<double>() < 1e-12);
  CHECK((householder_scores(in.q, in.k, torch::zeros_like(in.w), in.beta) - plain).abs().max().item<double>() < 1e-12);
}

TEST_CASE("householder attention: outputs and gradients in float32 against the definition's", "[attention][path]") {
  const auto in = path_inputs(1, 2, 19, 4, torch::kFloat32, 42);
  auto q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_(), v = in.v.clone().requires_grad_(),
       w = in.w.clone().requires_grad_(), beta = in.beta.clone().requires_grad_();
  const auto target = torch::randn({1, 2, 19, 4});
  auto out = attention(q, k, v, AttentionBias::householder(w, beta), testing::causal_attention_options());
  (out * target).sum().backward();
  auto q64 = in.q.to(torch::kFloat64).requires_grad_(), k64 = in.k.to(torch::kFloat64).requires_grad_(),
       v64 = in.v.to(torch::kFloat64).requires_grad_(), w64 = in.w.to(torch::kFloat64).requires_grad_(),
       beta64 = in.beta.to(torch::kFloat64).requires_grad_();
  const auto expected = torch::matmul(torch::softmax(logits_by_definition(q64, k64, w64, beta64), -1), v64);
  (expected * target.to(torch::kFloat64)).sum().backward();
  CHECK((out.detach().to(torch::kFloat64) - expected.detach()).abs().max().item<double>() < 1e-5);
  CHECK((q.grad().to(torch::kFloat64) - q64.grad()).abs().max().item<double>() < 1e-4);
  CHECK((k.grad().to(torch::kFloat64) - k64.grad()).abs().max().item<double>() < 1e-4);
  CHECK((v.grad().to(torch::kFloat64) - v64.grad()).abs().max().item<double>() < 1e-4);
  CHECK((w.grad().to(torch::kFloat64) - w64.grad()).abs().max().item<double>() < 1e-4);
  CHECK((beta.grad().to(torch::kFloat64) - beta64.grad()).abs().max().item<double>() < 1e-4);
  CHECK(w.grad().abs().sum().item<double>() > 0);
  CHECK(beta.grad().abs().sum().item<double>() > 0);
}

TEST_CASE("householder attention: forget gates, a window, a sink and a logit scale combine as for any kind",
          "[attention][path]") {
  const auto in = path_inputs(2, 2, 13, 4, torch::kFloat64, 43);
  const auto F = torch::log_sigmoid(torch::randn({2, 2, 13}, torch::kFloat64)).cumsum(-1);
  auto bias = AttentionBias::householder(in.w, in.beta, F);
  bias.window = 5;
  bias.sink = torch::tensor({0.5, -1.0}, torch::kFloat64);
  bias.logit_scale = torch::rand({2, 13}, torch::kFloat64) + 0.5;
  // By the definition: logits + F_i - F_j, masked outside the window, scaled per row, a sink column.
  auto z = logits_by_definition(in.q, in.k, in.w, in.beta) + (F.unsqueeze(-1) - F.unsqueeze(-2));
  const auto i = torch::arange(13).view({-1, 1}), j = torch::arange(13).view({1, -1});
  z = z.masked_fill(i - j >= 5, -INFINITY) * bias.logit_scale.unsqueeze(0).unsqueeze(-1);
  const auto sink = bias.sink.view({1, 2, 1, 1}).expand({2, 2, 13, 1});
  const auto probs = torch::softmax(torch::cat({z, sink}, -1), -1).narrow(-1, 0, 13);
  const auto expected = torch::matmul(probs, in.v);
  const auto actual = attention(in.q, in.k, in.v, bias, testing::causal_attention_options());
  CHECK((actual - expected).abs().max().item<double>() < 1e-12);
  // The efficient backend (what long evaluations take) in row blocks: the same numbers.
  torch::NoGradGuard no_grad;
  for (const int64_t rows : {1, 4, 13, 100}) {
    INFO("query block " << rows);
    CHECK((attention_reference_blocked(in.q, in.k, in.v, bias, testing::causal_attention_options(), rows) - expected)
              .abs()
              .max()
              .item<double>() < 1e-12);
  }
  AttentionOptions efficient = testing::causal_attention_options();
  efficient.backend = AttentionBackend::Efficient;
  CHECK((attention(in.q, in.k, in.v, bias, efficient) - expected).abs().max().item<double>() < 1e-12);
}

TEST_CASE("householder attention: refusals name what is wrong", "[attention][path]") {
  const auto in = path_inputs(1, 2, 6, 4, torch::kFloat32, 44);
  const auto bias = AttentionBias::householder(in.w, in.beta);
  AttentionOptions options = testing::causal_attention_options();
  options.causal = false;
  CHECK_THROWS_WITH(attention(in.q, in.k, in.v, bias, options), Catch::Contains("causal attention only"));
  options.causal = true;
  options.backend = AttentionBackend::Fused;
  CHECK_THROWS_WITH(attention(in.q, in.k, in.v, bias, options), Catch::Contains("fused CPU kernel"));
  CHECK_THROWS_WITH(materialize_bias(bias, 2, 6, 6, true), Catch::Contains("replace q.k"));
  CHECK_THROWS_WITH(AttentionBias::householder(in.w, in.beta.narrow(2, 0, 5)), Catch::Contains("beta"));
  const auto needs_grad = in.q.clone().requires_grad_();
  CHECK_THROWS_WITH(attention_reference_blocked(needs_grad, in.k, in.v, bias, testing::causal_attention_options()),
                    Catch::Contains("inference only"));
  CHECK_THROWS_WITH(householder_scores(in.q, in.k, in.w.narrow(2, 0, 5), in.beta), Catch::Contains("do not match"));
}
