// The memory-efficient CPU attention against the reference, for every kind of bias, both
// masking modes and awkward lengths. Small explicit blocks (16 / 32) make short sequences
// cross many tiles. Tolerance: |efficient - reference| <= 1e-5 + 1e-4 * |reference| (fp32).
#include "core/attention/attention.h"
#include "core/attention/attention_observer.h"
#include "core/attention/efficient_attention.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

using extrap::AttentionBias;
using extrap::AttentionOptions;
using extrap::EfficientAttentionBlocks;

constexpr double kAtol = 1e-5, kRtol = 1e-4;
constexpr int64_t kHeads = 4;

struct Inputs {
  torch::Tensor q, k, v;  // (B, H, T, D)
};

Inputs random_inputs(int64_t batch, int64_t t, int64_t d, uint64_t seed,
                     torch::Dtype dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  auto options = torch::TensorOptions().dtype(dtype);
  // Scaled up so that softmax rows are far from uniform and the bias matters.
  return {3 * torch::randn({batch, kHeads, t, d}, options),
          3 * torch::randn({batch, kHeads, t, d}, options),
          torch::randn({batch, kHeads, t, d}, options)};
}

// The largest |a - b| / (atol + rtol * |b|): <= 1 means within tolerance.
double tolerance_ratio(const torch::Tensor& actual, const torch::Tensor& expected) {
  REQUIRE(actual.sizes() == expected.sizes());
  REQUIRE(actual.isfinite().all().item<bool>());
  REQUIRE(expected.isfinite().all().item<bool>());
  auto a = actual.to(torch::kFloat64), b = expected.to(torch::kFloat64);
  return ((a - b).abs() / (kAtol + kRtol * b.abs())).max().item<double>();
}

torch::Tensor alibi_slopes_for(int64_t heads) {  // 2^(-8/n), geometric; exact values do not matter here
  return torch::pow(2.0, -8.0 * torch::arange(1, heads + 1, torch::kFloat64) / double(heads))
      .to(torch::kFloat32);
}

// Every bias kind the models produce. Dense biases read tiles of a fixed random table.
std::vector<std::pair<std::string, AttentionBias>> all_biases(int64_t t) {
  const auto h = kHeads;
  std::vector<std::pair<std::string, AttentionBias>> biases;
  biases.emplace_back("none", AttentionBias::none());
  biases.emplace_back("linear causal", AttentionBias::linear_causal(alibi_slopes_for(h)));
  biases.emplace_back("linear symmetric", AttentionBias::linear_symmetric(alibi_slopes_for(h)));
  {  // nonsymmetric: slopes for H/2 used twice; first half left only, second half right only
    auto half = alibi_slopes_for(h / 2);
    auto left_only = torch::cat({torch::ones({h / 2}), torch::zeros({h / 2})}).to(torch::kBool);
    biases.emplace_back("linear nonsymmetric",
                        AttentionBias::linear(torch::cat({half, half}), torch::cat({half, half}),
                                              left_only, left_only.logical_not()));
  }
  biases.emplace_back("linear left/right slopes",
                      AttentionBias::linear(torch::tensor({0.5f, 0.25f, 0.01f, 0.125f}),
                                            torch::tensor({0.03f, 0.7f, 0.2f, 0.0625f}),
                                            torch::ones({h}, torch::kBool),
                                            torch::ones({h}, torch::kBool)));
  torch::manual_seed(99);
  auto table = torch::randn({h, t, t});  // (H, T, T)
  biases.emplace_back("dense", AttentionBias::dense_blocks([table](int64_t q0, int64_t q1,
                                                                    int64_t k0, int64_t k1) {
                        return table.slice(1, q0, q1).slice(2, k0, k1);
                      }));
  return biases;
}

}  // namespace

TEST_CASE("efficient attention equals the reference for every bias, mask and length",
          "[efficient]") {
  const std::vector<EfficientAttentionBlocks> block_sizes = {{16, 32}, {32, 16}, {16, 16}};
  for (int64_t t : {1, 7, 16, 50, 97}) {
    auto in = random_inputs(2, t, 8, uint64_t(t));
    for (const auto& [name, bias] : all_biases(t)) {
      for (bool causal : {true, false}) {
        AttentionOptions options;
        options.causal = causal;
        auto expected = extrap::attention_reference(in.q, in.k, in.v, bias, options);
        for (const auto& blocks : block_sizes) {
          INFO(name << (causal ? ", causal" : ", bidirectional") << ", T = " << t
                    << ", blocks " << blocks.query_block << " x " << blocks.key_block);
          auto actual = extrap::attention_efficient(in.q, in.k, in.v, bias, options, blocks);
          CHECK(tolerance_ratio(actual, expected) <= 1.0);
        }
      }
    }
  }
}

TEST_CASE("efficient attention's fp32 error is no worse than twice the reference's",
          "[efficient]") {
  // Both fp32 paths against the reference computed in fp64 on the same inputs.
  const int64_t t = 97;
  auto in = random_inputs(2, t, 16, 21);
  for (const auto& [name, bias] : all_biases(t)) {
    for (bool causal : {true, false}) {
      INFO(name << (causal ? ", causal" : ", bidirectional"));
      AttentionOptions options;
      options.causal = causal;
      auto exact = extrap::attention_reference(in.q.to(torch::kFloat64), in.k.to(torch::kFloat64),
                                               in.v.to(torch::kFloat64), bias, options);
      auto reference = extrap::attention_reference(in.q, in.k, in.v, bias, options);
      auto efficient = extrap::attention_efficient(in.q, in.k, in.v, bias, options, {16, 32});
      const double reference_error = (reference.to(torch::kFloat64) - exact).abs().max().item<double>();
      const double efficient_error = (efficient.to(torch::kFloat64) - exact).abs().max().item<double>();
      CHECK(efficient_error <= 2 * reference_error + 1e-7);
    }
  }
}

TEST_CASE("efficient attention handles rows that see nothing in the first tiles", "[efficient]") {
  // Rows from 40 on may not see keys 0..31, so with 16 x 16 tiles their first tiles are fully
  // masked (rows 40..47 only partly in their query block) and the running max stays -inf
  // until a visible key arrives. Row 5 sees no key at all: NaN, as in the reference.
  const int64_t t = 80;
  auto in = random_inputs(1, t, 8, 7);
  const auto inf = std::numeric_limits<float>::infinity();
  auto table = torch::zeros({kHeads, t, t});
  table.slice(1, 40, t).slice(2, 0, 32).fill_(-inf);
  table.select(1, 5).fill_(-inf);
  auto bias = AttentionBias::dense_blocks([table](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    return table.slice(1, q0, q1).slice(2, k0, k1);
  });
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    AttentionOptions options;
    options.causal = causal;
    auto expected = extrap::attention_reference(in.q, in.k, in.v, bias, options);
    auto actual = extrap::attention_efficient(in.q, in.k, in.v, bias, options, {16, 16});
    CHECK(expected.select(2, 5).isnan().all().item<bool>());
    CHECK(actual.select(2, 5).isnan().all().item<bool>());
    auto seen = torch::cat({torch::arange(0, 5), torch::arange(6, t)});
    CHECK(tolerance_ratio(actual.index_select(2, seen), expected.index_select(2, seen)) <= 1.0);
  }
}

TEST_CASE("efficient attention computes other float types in fp32", "[efficient]") {
  auto in = random_inputs(1, 40, 8, 3, torch::kFloat64);
  auto bias = AttentionBias::linear_symmetric(alibi_slopes_for(kHeads));
  AttentionOptions options;
  options.causal = false;
  auto expected = extrap::attention_reference(in.q, in.k, in.v, bias, options);  // fp64
  auto actual = extrap::attention_efficient(in.q, in.k, in.v, bias, options, {16, 16});
  CHECK(actual.scalar_type() == torch::kFloat64);
  CHECK(tolerance_ratio(actual, expected) <= 1.0);

  // bfloat16: only the output's rounding to bfloat16 (relative 2^-8) differs.
  auto q = in.q.to(torch::kBFloat16), k = in.k.to(torch::kBFloat16), v = in.v.to(torch::kBFloat16);
  auto expected_bf16 = extrap::attention_reference(q.to(torch::kFloat64), k.to(torch::kFloat64),
                                                   v.to(torch::kFloat64), bias, options);
  auto actual_bf16 = extrap::attention_efficient(q, k, v, bias, options, {16, 16});
  CHECK(actual_bf16.scalar_type() == torch::kBFloat16);
  CHECK(torch::allclose(actual_bf16.to(torch::kFloat64), expected_bf16, /*rtol=*/1e-2,
                        /*atol=*/1e-2));
}

TEST_CASE("efficient attention asks a dense bias for tiles only, none above the diagonal",
          "[efficient]") {
  const int64_t t = 70;
  auto in = random_inputs(1, t, 8, 11);
  torch::manual_seed(5);
  auto table = torch::randn({kHeads, t, t});
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> requests;
  std::mutex lock;  // tiles may be requested from several threads
  auto bias = AttentionBias::dense_blocks([&](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    std::lock_guard<std::mutex> guard(lock);
    requests.emplace_back(q0, q1, k0, k1);
    return table.slice(1, q0, q1).slice(2, k0, k1);
  });
  AttentionOptions options;  // causal
  auto actual = extrap::attention_efficient(in.q, in.k, in.v, bias, options, {16, 32});
  REQUIRE(!requests.empty());
  for (const auto& [q0, q1, k0, k1] : requests) {
    CHECK(q1 - q0 <= 16);
    CHECK(k1 - k0 <= 32);
    CHECK(k0 < q1);  // never a tile entirely above the diagonal
  }
  auto expected = extrap::attention_reference(in.q, in.k, in.v, bias, options);
  CHECK(tolerance_ratio(actual, expected) <= 1.0);
}

TEST_CASE("attention() switches to the efficient path for long inference windows",
          "[efficient]") {
  const int64_t t = EfficientAttentionBlocks{}.query_block + 20;  // more than one query block
  auto in = random_inputs(1, t, 8, 13);
  std::set<std::pair<int64_t, int64_t>> query_ranges;
  std::mutex lock;
  auto bias = AttentionBias::dense_blocks([&](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    std::lock_guard<std::mutex> guard(lock);
    query_ranges.emplace(q0, q1);
    return torch::zeros({kHeads, q1 - q0, k1 - k0});
  });
  AttentionOptions options;
  options.efficient_threshold = t * t - 1;
  {
    torch::NoGradGuard no_grad;
    extrap::attention(in.q, in.k, in.v, bias, options);
  }
  CHECK(query_ranges.count({0, t}) == 0);  // tiles, never the whole window

  query_ranges.clear();
  options.efficient_threshold = t * t;  // at the threshold: the reference, one whole request
  {
    torch::NoGradGuard no_grad;
    extrap::attention(in.q, in.k, in.v, bias, options);
  }
  CHECK(query_ranges == std::set<std::pair<int64_t, int64_t>>{{0, t}});
}

TEST_CASE("efficient attention refuses inputs that require grad", "[efficient]") {
  auto in = random_inputs(1, 8, 4, 1);
  in.q.requires_grad_(true);
  AttentionOptions options;
  CHECK_THROWS_WITH(extrap::attention_efficient(in.q, in.k, in.v, AttentionBias::none(), options),
                    Catch::Contains("inference only"));
  torch::NoGradGuard no_grad;
  CHECK_NOTHROW(extrap::attention_efficient(in.q, in.k, in.v, AttentionBias::none(), options));
}

TEST_CASE("the reference path asks a dense bias for chunks of at most 65,536 query-key pairs, which make "
          "the whole bias", "[efficient]") {
  // 300 x 300 pairs: chunks of 218 keys (65,536 / 300). The bias is a formula of (h, i, j), and
  // the weights are checked against the softmax written out with the formula.
  const int64_t t = 300;
  auto in = random_inputs(1, t, 8, 13, torch::kFloat64);
  const auto formula = [](const torch::Tensor& h, const torch::Tensor& i, const torch::Tensor& j) {
    return torch::sin(0.05 * i + 0.11 * j) * (h + 1) - 0.01 * (i - j).abs();
  };
  auto calls = std::make_shared<std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>>();
  const auto bias = AttentionBias::dense_blocks([calls, formula](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    calls->emplace_back(q0, q1, k0, k1);
    const auto o = torch::TensorOptions().dtype(torch::kFloat64);
    return formula(torch::arange(kHeads, o).view({-1, 1, 1}), torch::arange(q0, q1, o).view({1, -1, 1}),
                   torch::arange(k0, k1, o).view({1, 1, -1}));
  });
  const auto o = torch::TensorOptions().dtype(torch::kFloat64);
  const auto whole = formula(torch::arange(kHeads, o).view({-1, 1, 1}), torch::arange(t, o).view({1, -1, 1}),
                             torch::arange(t, o).view({1, 1, -1}));
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    AttentionOptions options;
    options.causal = causal;
    calls->clear();
    const auto p = extrap::attention_probabilities(in.q, in.k, bias, options);
    auto scores = torch::matmul(in.q, in.k.transpose(-2, -1)) / std::sqrt(8.0) + whole;
    if (causal) scores = scores.masked_fill(torch::ones({t, t}, torch::kBool).triu(1), -INFINITY);
    CHECK((p - torch::softmax(scores, -1)).abs().max().item<double>() < 1e-12);
    REQUIRE(calls->size() == 2);  // keys [0, 218) and [218, 300)
    for (const auto& [q0, q1, k0, k1] : *calls) CHECK((q1 - q0) * (k1 - k0) <= 65536);
  }
  // A chunk of the wrong shape is refused by its shape.
  const auto wrong = AttentionBias::dense_blocks([](int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
    return torch::zeros({kHeads, q1 - q0, k1 - k0 + (k0 > 0 ? 1 : 0)});
  });
  AttentionOptions options;
  CHECK_THROWS_WITH(extrap::attention_probabilities(in.q.to(torch::kFloat32), in.k.to(torch::kFloat32), wrong, options),
                    Catch::Contains("dense bias: expected (4, 300, 82), got [4, 300, 83]"));
}
