// ALiBi slopes and bias matrices, and the sinusoidal table, against independent computations.
#include "core/attention/attention.h"
#include "positions/alibi_slopes.h"
#include "positions/position.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace extrap;

namespace {

// Written straight from the definition: for n a power of two, slope_h = 2^(-8 (h+1) / n);
// otherwise the p = 2^floor(log2 n) slopes, then slopes 0, 2, 4, ... of the 2p-head set.
double expected_slope(int n, int h) {
  int p = 1 << int(std::floor(std::log2(double(n))));
  if (h < p) return std::pow(2.0, -8.0 * (h + 1) / p);
  const int k = 2 * (h - p);  // index into the 2p sequence
  return std::pow(2.0, -8.0 * (k + 1) / (2 * p));
}

std::shared_ptr<PositionMethod> make(const std::string& name, int64_t heads, bool causal = true) {
  PositionContext context;
  context.num_heads = heads;
  context.d_head = 8;
  context.d_model = heads * 8;
  context.causal = causal;
  return PositionRegistry::instance().create(name, context, OptionReader(YAML::Node(), "test", "position"));
}

}  // namespace

TEST_CASE("ALiBi slopes for 1..64 heads match the definition", "[alibi]") {
  for (int n = 1; n <= 64; ++n) {
    const auto slopes = alibi_slopes(n);
    REQUIRE(slopes.size() == size_t(n));
    for (int h = 0; h < n; ++h) REQUIRE(slopes[h] == expected_slope(n, h));  // the nearest double
  }
}

TEST_CASE("ALiBi slopes: the paper's worked examples", "[alibi]") {
  const auto s8 = alibi_slopes(8);
  for (int h = 0; h < 8; ++h) REQUIRE(s8[h] == std::ldexp(1.0, -(h + 1)));  // 1/2 ... 1/256 exactly
  const auto s16 = alibi_slopes(16);
  REQUIRE(s16[0] == Approx(1 / std::sqrt(2.0)).epsilon(1e-15));
  REQUIRE(s16[15] == Approx(1.0 / 256).epsilon(1e-15));
  // 12 heads: the 8-head slopes, then slopes 0, 2, 4, 6 of the 16-head set.
  const auto s12 = alibi_slopes(12);
  for (int h = 0; h < 8; ++h) REQUIRE(s12[h] == s8[h]);
  for (int i = 0; i < 4; ++i) REQUIRE(s12[8 + i] == Approx(s16[2 * i]).epsilon(1e-15));
  REQUIRE_THROWS_AS(alibi_slopes(0), ConfigError);
}

TEST_CASE("causal ALiBi bias matrix on small cases", "[alibi]") {
  for (int heads : {1, 3, 8}) {
    const int T = 6;
    auto method = make("alibi", heads);
    auto bias = materialize_bias(method->bias(layer_window(0, T)), heads, T, T, /*causal=*/true);  // (H, T, T)
    REQUIRE(bias.sizes() == torch::IntArrayRef({heads, T, T}));
    auto a = bias.accessor<float, 3>();
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < T; ++i)
        for (int j = 0; j < T; ++j) {
          if (j > i) {
            REQUIRE(std::isinf(a[h][i][j]));
            REQUIRE(a[h][i][j] < 0);
          } else {
            REQUIRE(a[h][i][j] == Approx(-expected_slope(heads, h) * (i - j)).margin(1e-6));
          }
        }
  }
}

TEST_CASE("a bias materialised in bfloat16 is the exact bias rounded once, past position 256", "[alibi]") {
  // bfloat16 holds integers exactly only to 256: positions must not be formed in it.
  const int heads = 4, T = 600;  // slopes 2^-2 .. 2^-8: every product exact in float32
  auto method = make("alibi_symmetric", heads, /*causal=*/false);
  const auto bias = materialize_bias(method->bias(layer_window(0, T)), heads, T, T, /*causal=*/false,
                                     torch::TensorOptions().dtype(torch::kBFloat16));
  REQUIRE(bias.scalar_type() == torch::kBFloat16);
  const auto got = bias.to(torch::kFloat32);
  auto expected = torch::empty({heads, T, T}, torch::kFloat64);
  auto e = expected.accessor<double, 3>();
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < T; ++i)
      for (int j = 0; j < T; ++j) e[h][i][j] = -expected_slope(heads, h) * std::abs(i - j);
  CHECK(torch::equal(got, expected.to(torch::kFloat32).to(torch::kBFloat16).to(torch::kFloat32)));
}

TEST_CASE("causal ALiBi is refused in bidirectional mode with a suggestion", "[alibi]") {
  try {
    make("alibi", 4, /*causal=*/false);
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("alibi_symmetric"));
  }
}

TEST_CASE("sinusoidal embeddings match Vaswani et al.", "[positions]") {
  const int64_t T = 5, offset = 3, d = 8;
  auto method = make("sinusoidal", 1);  // d_model = 8 (1 head x 8)
  // The input is added to, not replaced: a random input, and the table is what was added.
  torch::manual_seed(3);
  auto x = torch::randn({2, T, d});
  auto out = method->embed(x, TokenPositions::window(x.size(1), offset));
  REQUIRE(out.sizes() == x.sizes());
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t p = 0; p < T; ++p)
      for (int64_t i = 0; i < d / 2; ++i) {
        const double angle = double(p + offset) / std::pow(10000.0, 2.0 * double(i) / double(d));
        INFO("batch " << b << " position " << p << " pair " << i);
        REQUIRE(out[b][p][2 * i].item<double>() - x[b][p][2 * i].item<double>() ==
                Approx(std::sin(angle)).margin(1e-6));
        REQUIRE(out[b][p][2 * i + 1].item<double>() - x[b][p][2 * i + 1].item<double>() ==
                Approx(std::cos(angle)).margin(1e-6));
      }
}

TEST_CASE("learned absolute positions add their rows and refuse lengths past their maximum", "[positions]") {
  PositionContext context;
  context.num_heads = 2;
  context.d_model = 8;
  YAML::Node options;
  options["max_length"] = 10;
  auto method = PositionRegistry::instance().create("learned", context, OptionReader(options, "t.yaml", "position"));
  const auto table = method->named_parameters()["table"];
  REQUIRE(table.sizes() == torch::IntArrayRef({10, 8}));
  const auto x = torch::randn({1, 6, 8});
  // Positions offset .. offset + 5 are rows offset .. offset + 5 of the table.
  REQUIRE(torch::equal(method->embed(x, TokenPositions::window(6, 4)), x + table.narrow(0, 4, 6).unsqueeze(0)));
  REQUIRE_NOTHROW(method->embed(torch::zeros({1, 10, 8}), TokenPositions::window(10)));
  const auto message = [&](int64_t length, int64_t offset) {
    try {
      method->embed(torch::zeros({1, length, 8}), TokenPositions::window(length, offset));
    } catch (const c10::Error& e) {
      return std::string(e.what_without_backtrace());
    }
    return std::string("(no error)");
  };
  REQUIRE_THAT(message(12, 0), Catch::StartsWith("learned positions: asked for positions up to 12 "
                                                 "but max_length is 10"));
  REQUIRE_THAT(message(10, 1), Catch::Contains("up to 11 but max_length is 10"));  // the offset counts
}

TEST_CASE("the registry holds every built-in method and rejects unknown and duplicate names", "[registry]") {
  auto& registry = PositionRegistry::instance();
  for (const char* name : {"none", "sinusoidal", "learned", "alibi", "rotary", "t5_bias",
                           "alibi_symmetric", "alibi_nonsymmetric", "alibi_learned"})
    REQUIRE(registry.contains(name));
  try {
    registry.get("alibbi");
    FAIL("expected an error");
  } catch (const ConfigError& e) {
    REQUIRE_THAT(e.what(), Catch::Contains("alibbi") && Catch::Contains("sinusoidal"));
  }
  PositionInfo duplicate = registry.get("none");
  duplicate.origin = "test";
  REQUIRE_THROWS_WITH(registry.add(duplicate), Catch::Contains("registered twice"));
  // An unknown option key names the file and key.
  YAML::Node options;
  options["bsae"] = 10;
  PositionContext context;
  context.d_model = 8;
  REQUIRE_THROWS_WITH(registry.create("sinusoidal", context, OptionReader(options, "cfg.yaml", "position")),
                      Catch::Contains("cfg.yaml") && Catch::Contains("position.bsae"));
}
