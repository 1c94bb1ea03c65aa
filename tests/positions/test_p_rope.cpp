// p-RoPE (positions/p_rope.cpp) against its definition written here (REFERENCE.md, "The 2024-26
// wave"): with d = d_head, theta_i = base^(-2i / d), the pairs (2i, 2i+1) with i < floor(p d / 2)
// rotate by position x theta_i, the lowest-frequency rest stay as they were; p = 1 is rotary and
// p = 0 NoPE; attention scores depend on i - j only.
#include "positions/position.h"
#include "tests/support/position_support.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace extrap;
using testing::make_method;

namespace {

// q rotated as the definition says, float64, positions offset .. offset + T - 1.
torch::Tensor defined_rotation(const torch::Tensor& x, double keep, double base, int64_t offset) {
  const int64_t T = x.size(2), d = x.size(3), kept = int64_t(std::floor(keep * double(d / 2) + 1e-9));
  auto out = x.to(torch::kFloat64).clone();
  auto a = out.accessor<double, 4>();
  for (int64_t b = 0; b < x.size(0); ++b)
    for (int64_t h = 0; h < x.size(1); ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < kept; ++i) {
          const double angle = double(offset + t) * std::pow(base, -2.0 * double(i) / double(d));
          const double x0 = a[b][h][t][2 * i], x1 = a[b][h][t][2 * i + 1];
          a[b][h][t][2 * i] = x0 * std::cos(angle) - x1 * std::sin(angle);
          a[b][h][t][2 * i + 1] = x0 * std::sin(angle) + x1 * std::cos(angle);
        }
  return out;
}

}  // namespace

TEST_CASE("p_rope rotates the highest-frequency pairs as defined, and leaves the rest", "[positions][p_rope]") {
  const int64_t d = 16, T = 23;
  torch::manual_seed(3);
  const auto q0 = torch::randn({2, 3, T, d}, torch::kFloat64), k0 = torch::randn({2, 3, T, d}, torch::kFloat64);
  for (double keep : {0.0, 0.25, 0.5, 0.75, 0.8, 1.0})
    for (double base : {10000.0, 500.0}) {
      INFO("keep " << keep << ", base " << base);
      auto method = make_method("p_rope", 3, true, "{keep: " + std::to_string(keep) + ", base: " + std::to_string(base) + "}", d);
      auto q = q0.clone(), k = k0.clone();
      method->rotate_qk(q, k, layer_window(0, T, 5));
      CHECK((q - defined_rotation(q0, keep, base, 5)).abs().max().item<double>() < 1e-12);
      CHECK((k - defined_rotation(k0, keep, base, 5)).abs().max().item<double>() < 1e-12);
      // The unrotated pairs are the last ones, untouched.
      const int64_t kept = int64_t(std::floor(keep * double(d / 2) + 1e-9));
      CHECK(torch::equal(q.narrow(-1, 2 * kept, d - 2 * kept), q0.narrow(-1, 2 * kept, d - 2 * kept)));
    }
  // p = 1 is rotary; p = 0 changes nothing (NoPE).
  auto p1 = make_method("p_rope", 3, true, "{keep: 1}", d), rotary = make_method("rotary", 3, true, "{}", d);
  auto qa = q0.clone(), ka = k0.clone(), qb = q0.clone(), kb = k0.clone();
  p1->rotate_qk(qa, ka, layer_window(0, T));
  rotary->rotate_qk(qb, kb, layer_window(0, T));
  CHECK(torch::allclose(qa, qb, 0, 1e-12));
  auto p0 = make_method("p_rope", 3, true, "{keep: 0}", d);
  auto qc = q0.clone(), kc = k0.clone();
  p0->rotate_qk(qc, kc, layer_window(0, T));
  CHECK(torch::equal(qc, q0));
}

TEST_CASE("p_rope's scores depend on i - j only, and its options are checked", "[positions][p_rope]") {
  const int64_t d = 8;
  auto method = make_method("p_rope", 1, true, "{keep: 0.5}", d);
  torch::manual_seed(4);
  const auto q = torch::randn({1, 1, 1, d}, torch::kFloat64).expand({1, 1, 40, d}).contiguous();
  const auto k = torch::randn({1, 1, 1, d}, torch::kFloat64).expand({1, 1, 40, d}).contiguous();
  auto qa = q.clone(), ka = k.clone();
  method->rotate_qk(qa, ka, layer_window(0, 40));
  const auto scores = torch::matmul(qa, ka.transpose(-2, -1))[0][0];  // (40, 40)
  for (int64_t i = 1; i < 40; ++i)
    for (int64_t j = 1; j < 40; ++j) REQUIRE(scores[i][j].item<double>() == Approx(scores[i - 1][j - 1].item<double>()).margin(1e-9));
  CHECK_THROWS_WITH(make_method("p_rope", 1, true, "{keep: 1.5}", d), Catch::Contains("keep"));
  CHECK_THROWS_WITH(make_method("p_rope", 1, true, "{base: 1}", d), Catch::Contains("base"));
  CHECK_THROWS_WITH(make_method("p_rope", 1, true, "{}", 7), Catch::Contains("odd"));
}
