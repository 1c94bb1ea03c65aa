// The fused CPU training loss (core/kernels/fused_cpu_loss.h) against LibTorch's cross_entropy in
// float64: the summed loss and its gradient, float32 and bfloat16 logits, ignored rows, large
// logits; and the targets it refuses.
#include "core/kernels/fused_cpu_loss.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

using namespace extrap;

namespace {

std::pair<double, torch::Tensor> reference(const torch::Tensor& logits, const torch::Tensor& targets, double grad_scale) {
  auto x = logits.detach().to(torch::kFloat64).requires_grad_();
  const auto loss = torch::nn::functional::cross_entropy(
      x, targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
  (loss * grad_scale).backward();
  return {loss.item<double>(), x.grad()};
}

}  // namespace

TEST_CASE("fused CPU loss: the summed cross-entropy and its gradient equal LibTorch's in float64", "[loss]") {
  torch::manual_seed(31);
  for (int64_t V : {1, 7, 257, 1000}) {
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      for (double spread : {1.0, 30.0}) {  // 30: logits far apart (the max shift matters)
        INFO("V " << V << (dtype == torch::kFloat32 ? ", float32" : ", bfloat16") << ", spread " << spread);
        const int64_t N = 150;  // more than one task of rows
        const auto logits = (torch::randn({N, V}) * spread).to(dtype).requires_grad_();
        auto targets = torch::randint(0, V, {N}, torch::kLong);
        targets.index_put_({torch::arange(0, N, 7)}, -100);  // every 7th row ignored
        REQUIRE(cross_entropy_sum_unsupported_reason(logits, targets).empty());
        const auto loss = cross_entropy_sum(logits, targets, -100);
        REQUIRE(loss.scalar_type() == torch::kFloat32);
        (loss * 0.25).backward();
        const auto [expected_loss, expected_grad] = reference(logits, targets, 0.25);
        REQUIRE(loss.item<double>() == Approx(expected_loss).epsilon(1e-5).margin(1e-5));
        REQUIRE(logits.grad().scalar_type() == dtype);
        // float32 arithmetic (the log-sum-exp of logits near 100 is good to an ulp, 8e-6); a
        // bfloat16 gradient is rounded to 2^-9 relative.
        const double tolerance = dtype == torch::kFloat32 ? 3e-5 : 8e-3;
        const auto difference = (logits.grad().to(torch::kFloat64) - expected_grad).abs();
        REQUIRE((difference - tolerance * expected_grad.abs()).max().item<double>() < 1e-6);
        const auto ignored = logits.grad().index({torch::arange(0, N, 7)});
        REQUIRE(torch::all(ignored == 0).item<bool>());
      }
    }
  }
}

TEST_CASE("fused CPU loss: every row ignored is a zero loss, a target out of range is refused by value", "[loss]") {
  const auto logits = torch::randn({4, 10}).requires_grad_();
  const auto loss = cross_entropy_sum(logits, torch::full({4}, -100, torch::kLong), -100);
  REQUIRE(loss.item<float>() == 0.0f);
  loss.backward();
  REQUIRE(torch::all(logits.grad() == 0).item<bool>());
  for (int64_t bad : {10, -1, -101}) {
    INFO("target " << bad);
    const auto targets = torch::tensor({int64_t(1), int64_t(2), bad, int64_t(3)}, torch::kLong);
    REQUIRE_THROWS_WITH(cross_entropy_sum(logits, targets, -100),
                        Catch::Contains("target " + std::to_string(bad)) && Catch::Contains("row 2") &&
                            Catch::Contains("10 classes"));
  }
  REQUIRE_THAT(cross_entropy_sum_unsupported_reason(logits.to(torch::kFloat64), torch::zeros({4}, torch::kLong)),
               Catch::Contains("float32"));
  REQUIRE_THAT(cross_entropy_sum_unsupported_reason(logits, torch::zeros({4}, torch::kInt32)), Catch::Contains("int64"));
}

TEST_CASE("fused CPU loss: a confident row's small loss keeps its digits", "[loss]") {
  // Target at a maximum far above the rest: the loss is log(1 + 256 e^-20), about 5.3e-7, far
  // below the float32 spacing at the log-sum-exp (about 20: 1.9e-6).
  auto logits = torch::zeros({2, 257});
  logits.index_put_({torch::indexing::Slice(), 0}, 20.0f);
  const auto targets = torch::zeros({2}, torch::kLong);
  const double expected = 2 * std::log1p(256 * std::exp(-20.0));
  REQUIRE(cross_entropy_sum(logits, targets, -100).item<double>() == Approx(expected).epsilon(1e-4));
}
