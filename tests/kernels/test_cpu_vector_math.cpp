// The kernels' element-wise helpers (core/kernels/cpu_vector_math.h) against the C library in
// float64: exp_float and log_float over their ranges, with the edge values the kernels rely on.
#include "core/kernels/cpu_vector_math.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>

using namespace extrap;

TEST_CASE("exp_float and log_float against the C library", "[kernels][vector_math]") {
  std::mt19937 rng(7);
  double worst_exp = 0, worst_log = 0;
  // exp over the normal range of its results, relative error below 2e-7 (plus float rounding).
  std::uniform_real_distribution<float> exponent(-86.0f, 88.0f);
  for (int n = 0; n < 200000; ++n) {
    const float x = exponent(rng);
    const double want = std::exp(double(x));
    worst_exp = std::max(worst_exp, std::abs(double(exp_float(x)) - want) / want);
  }
  CHECK(worst_exp < 4e-7);
  CHECK(exp_float(0.0f) == 1.0f);
  CHECK(exp_float(-200.0f) == 0.0f);  // below -87: exactly 0, as a masked weight needs
  // log over every binade of normal floats (the weights a softmax gives: 1e-38 .. 1), and past 1.
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int e = -126; e <= 20; ++e)
    for (int n = 0; n < 2000; ++n) {
      const float x = std::ldexp(mantissa(rng), e);
      const double want = std::log(double(x));
      // Relative where ln x is far from 0; absolute (in float's units) near x = 1.
      worst_log = std::max(worst_log, std::abs(double(log_float(x)) - want) / std::max(1.0, std::abs(want)));
    }
  CHECK(worst_log < 3e-7);
  CHECK(log_float(1.0f) == 0.0f);
  CHECK(std::abs(log_float(std::sqrt(2.0f)) - 0.5 * std::log(2.0)) < 1e-7);  // the range split
  // x ln x at 0 and at the smallest subnormal: 0 and (nearly) 0, never NaN.
  CHECK(0.0f * log_float(0.0f) == 0.0f);
  const float tiny = std::numeric_limits<float>::denorm_min();
  CHECK(std::abs(tiny * log_float(tiny)) < 1e-40);
  CHECK(std::isnan(log_float(std::numeric_limits<float>::quiet_NaN()) * std::numeric_limits<float>::quiet_NaN()));
}

TEST_CASE("tanh_float against the C library", "[kernels][vector_math]") {
  std::mt19937 rng(11);
  double worst = 0;
  // Relative error, on both sides of the series' range (|x| < 0.5) and far out: uniform over
  // [-12, 12] and over each binade from 2^-30 (where tanh x is x to float's precision).
  const auto check = [&](float x) {
    const double want = std::tanh(double(x));
    worst = std::max(worst, std::abs(double(tanh_float(x)) - want) / std::abs(want));
  };
  std::uniform_real_distribution<float> wide(-12.0f, 12.0f), mantissa(1.0f, 2.0f);
  for (int n = 0; n < 200000; ++n) check(wide(rng));
  for (int e = -30; e <= 4; ++e)
    for (int n = 0; n < 2000; ++n) check((n % 2 ? -1.0f : 1.0f) * std::ldexp(mantissa(rng), e));
  for (float x : {0.4999999f, 0.5f, 0.5000001f, -0.5f}) check(x);
  CHECK(worst < 5e-7);
  CHECK(tanh_float(0.0f) == 0.0f);
  CHECK(tanh_float(100.0f) == 1.0f);
  CHECK(tanh_float(-1e30f) == -1.0f);  // far out: the sign, never NaN
  CHECK(std::isnan(tanh_float(std::numeric_limits<float>::quiet_NaN())));
}
