// Tests for rotary, t5_bias, the ALiBi variants (symmetric, nonsymmetric, learned) and the
// local_window example plugin: exact bias matrices against plain loops, translation
// invariance, T5 buckets worked by hand, rotary against complex arithmetic, learned parameters
// that train. The methods since ALiBi have theirs in test_methods_since_alibi.cpp.
#include <catch2/catch.hpp>

#include "core/attention/attention.h"
#include "positions/alibi_slopes.h"
#include "positions/position.h"
#include "positions/t5_buckets.h"
#include "tests/support/position_support.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <filesystem>
#include <limits>

using namespace extrap;

namespace {

const float kInf = std::numeric_limits<float>::infinity();

using testing::make_method;
using testing::backward_through_attention;
using testing::parameter;
using testing::kPlugin;

// The bias with masked (-inf) entries replaced by 0, so that it can be summed into a loss.
torch::Tensor finite_part(const torch::Tensor& bias) {
  return torch::where(torch::isfinite(bias), bias, torch::zeros_like(bias));
}

}  // namespace

TEST_CASE("the new position methods are registered", "[positions]") {
  const auto names = PositionRegistry::instance().names();
  for (const char* name :
       {"rotary", "t5_bias", "alibi_symmetric", "alibi_nonsymmetric", "alibi_learned"})
    CHECK(std::count(names.begin(), names.end(), name) == 1);
}

TEST_CASE("alibi_symmetric bias is -m_h |i - j| on both sides", "[positions]") {
  const int64_t heads = 4, t = 5;
  auto method = make_method("alibi_symmetric", heads, /*causal=*/false);
  auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, /*causal=*/false);
  REQUIRE(bias.sizes() == torch::IntArrayRef{heads, t, t});
  auto expected = torch::empty({heads, t, t});
  for (int64_t h = 0; h < heads; ++h) {
    const double m = std::pow(2.0, -2.0 * double(h + 1));  // 4 heads: 1/4, 1/16, 1/64, 1/256
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j) expected[h][i][j] = float(-m * double(std::abs(i - j)));
  }
  CHECK(torch::equal(bias, expected));
  CHECK(torch::isfinite(bias).all().item<bool>());
}

TEST_CASE("alibi_nonsymmetric: first half of the heads looks left, second half right",
          "[positions]") {
  const int64_t heads = 8, t = 5;
  auto method = make_method("alibi_nonsymmetric", heads, /*causal=*/false);
  auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, /*causal=*/false);
  auto expected = torch::empty({heads, t, t});
  for (int64_t h = 0; h < heads; ++h) {
    // Slopes for 4 heads, used twice: 1/4, 1/16, 1/64, 1/256.
    const double m = std::pow(2.0, -2.0 * double(h % 4 + 1));
    const bool looks_left = h < 4;
    for (int64_t i = 0; i < t; ++i)
      for (int64_t j = 0; j < t; ++j) {
        const bool allowed = looks_left ? j <= i : j >= i;
        expected[h][i][j] = allowed ? float(-m * double(std::abs(i - j))) : -kInf;
      }
  }
  CHECK(torch::equal(bias, expected));
  // Each head sees exactly the diagonal plus one triangle: 15 of 25 entries.
  CHECK(torch::isfinite(bias).sum().item<int64_t>() == heads * 15);
}

TEST_CASE("odd head counts and unsupported modes are clear errors", "[positions]") {
  CHECK_THROWS_AS(make_method("alibi_nonsymmetric", 5, false), ConfigError);
  CHECK_THROWS_WITH(make_method("alibi_nonsymmetric", 5, false), Catch::Contains("H = 5"));
  CHECK_THROWS_WITH(make_method("alibi", 4, /*causal=*/false),
                    Catch::Contains("bidirectional") && Catch::Contains("'alibi_symmetric'"));
  CHECK_THROWS_WITH(make_method("alibi_symmetric", 4, /*causal=*/true),
                    Catch::Contains("causal") && Catch::Contains("use 'alibi'"));
  CHECK_THROWS_WITH(make_method("alibi_nonsymmetric", 4, /*causal=*/true),
                    Catch::Contains("use 'alibi'"));
  CHECK_THROWS_WITH(make_method("rotary", 4, true, "{fraction: 1.5}"), Catch::Contains("fraction"));
  CHECK_THROWS_WITH(make_method("t5_bias", 4, true, "{bucket: 8}"), Catch::Contains("bucket"));
  // Methods' own range checks name the key and the value (OptionReader's shared checks).
  CHECK_THROWS_WITH(make_method("rotary", 4, true, "{fraction: 0}"),
                    Catch::Contains("key 'fraction': must be in (0, 1], got 0"));
  CHECK_THROWS_WITH(make_method("rotary", 4, true, "{base: 1}"),
                    Catch::Contains("must be greater than 1, got 1"));
  CHECK_THROWS_WITH(make_method("fire", 4, true, "{eps: 0}"), Catch::Contains("must be positive, got 0"));
  CHECK_THROWS_WITH(make_method("cope", 4, true, "{npos: 1}"), Catch::Contains("must be at least 2, got 1"));
  CHECK_THROWS_WITH(make_method("t5_bias", 4, true, "{init_std: -1}"),
                    Catch::Contains("must not be negative, got -1"));
}

TEST_CASE("T5 buckets for hand-worked distances", "[positions]") {
  // 32 buckets up to 128. One-directional: n = max(i - j, 0); n < 16 exact, then
  // 16 + floor(16 * log(n / 16) / log(8)), at most 31.
  struct Case {
    int64_t distance, causal, left, right;  // buckets for j - i = -distance / +distance
  };
  // Bidirectional: 16 buckets per side, n < 8 exact, then 8 + floor(8 * log(n / 8) / log(16)),
  // at most 15; keys to the right add 16.
  const Case cases[] = {
      {0, 0, 0, 0},      {1, 1, 1, 17},     {7, 7, 7, 23},     {8, 8, 8, 24},
      {15, 15, 9, 25},   {16, 16, 10, 26},  {31, 21, 11, 27},  {32, 21, 12, 28},
      {63, 26, 13, 29},  {64, 26, 14, 30},  {127, 31, 15, 31}, {128, 31, 15, 31},
      {1000, 31, 15, 31},
  };
  for (const auto& c : cases) {
    INFO("distance " << c.distance);
    CHECK(t5_bucket(-c.distance, /*bidirectional=*/false, 32, 128) == c.causal);
    CHECK(t5_bucket(c.distance, /*bidirectional=*/false, 32, 128) == 0);  // keys to the right
    CHECK(t5_bucket(-c.distance, /*bidirectional=*/true, 32, 128) == c.left);
    CHECK(t5_bucket(c.distance, /*bidirectional=*/true, 32, 128) == c.right);
  }
}

TEST_CASE("t5_bias gathers its table by bucket, per layer when asked", "[positions]") {
  const int64_t heads = 3, t = 40;
  for (bool causal : {true, false}) {
    auto method = make_method("t5_bias", heads, causal, "{buckets: 8, max_distance: 20}");
    auto table = parameter(*method, "table");  // (1, buckets, H)
    REQUIRE(table.sizes() == torch::IntArrayRef{1, 8, heads});
    auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, causal);
    int64_t checked = 0;
    for (int64_t i = 0; i < t; i += 3)
      for (int64_t j = 0; j < t; j += 2) {
        if (causal && j > i) {
          CHECK(bias[0][i][j].item<float>() == -kInf);
          continue;
        }
        const auto bucket = t5_bucket(j - i, !causal, 8, 20);
        for (int64_t h = 0; h < heads; ++h)
          CHECK(bias[h][i][j].item<float>() == table[0][bucket][h].item<float>());
        ++checked;
      }
    CHECK(checked > 100);
  }
  auto per_layer = make_method("t5_bias", heads, true, "{shared_across_layers: false}", 8, 3);
  CHECK(parameter(*per_layer, "table").size(0) == 3);
  CHECK_FALSE(torch::equal(materialize_bias(per_layer->bias(layer_window(0, 8)), heads, 8, 8, true),
                           materialize_bias(per_layer->bias(layer_window(2, 8)), heads, 8, 8, true)));
}

namespace {
// Whether two evaluations of a bias at the same distances agree. A bias that is arithmetic in
// the distance (ALiBi's slopes times it, T5's integer buckets, a window's mask) must agree bit
// for bit. One that evaluates a transcendental function of it (KERPLE's pow and log1p,
// Sandwich's cosines) may differ by that function's rounding: ATen computes an element with
// SLEEF's vectorised code (within 1 ULP) or libm's scalar code (within 1 ULP) depending on
// where the element falls in the tensor and on the CPU's vector width, so a tile and the full
// matrix can round the same distance differently (seen on AVX2). Two such roundings are at most
// 2 ULPs apart; 4 ULPs of float (2^-21 relative) is the bound allowed, and the masked (-inf)
// entries must still match exactly.
bool same_bias(const torch::Tensor& a, const torch::Tensor& b, bool transcendental) {
  if (!transcendental) return torch::equal(a, b);
  return a.sizes() == b.sizes() && torch::equal(a.isinf(), b.isinf()) &&
         torch::allclose(a, b, /*rtol=*/std::ldexp(1.0, -21), /*atol=*/0.0);
}
}  // namespace

TEST_CASE("relative biases are translation-invariant and tile-consistent", "[positions]") {
  PositionRegistry::instance().load_plugin(kPlugin);
  struct Method {
    std::string name;
    bool causal;
  };
  const Method methods[] = {
      {"t5_bias", true},           {"t5_bias", false},        {"alibi", true},
      {"alibi_symmetric", false},  {"alibi_nonsymmetric", false},
      {"alibi_learned", true},     {"alibi_learned", false},  {"kerple_log", true},
      {"kerple_log", false},       {"kerple_power", true},    {"kerple_power", false},
      {"sandwich", true},          {"sandwich", false},       {"local_window", true},
      {"local_window", false},
  };
  const int64_t heads = 4, t = 24;
  struct Tile {
    int64_t q0, q1, k0, k1;
  };
  const Tile tiles[] = {{0, 5, 0, 5}, {3, 9, 0, 12}, {10, 14, 2, 6}, {0, 4, 6, 11}};
  for (const auto& m : methods) {
    INFO(m.name << (m.causal ? " (causal)" : " (bidirectional)"));
    const bool transcendental =
        m.name == "kerple_power" || m.name == "kerple_log" || m.name == "sandwich";
    auto method = make_method(m.name, heads, m.causal, m.name == "local_window" ? "{window: 4}" : "{}");
    torch::NoGradGuard no_grad;
    const auto bias = method->bias(layer_window(1, t));
    const auto full = materialize_bias(bias, heads, t, t, m.causal);  // (H, T, T)
    for (const auto& tile : tiles) {
      auto block = materialize_bias_block(bias, heads, tile.q0, tile.q1, tile.k0, tile.k1, m.causal);
      CHECK(same_bias(block, full.slice(1, tile.q0, tile.q1).slice(2, tile.k0, tile.k1), transcendental));
      for (int64_t shift : {1, 7, 1000}) {
        auto shifted = materialize_bias_block(bias, heads, tile.q0 + shift, tile.q1 + shift,
                                              tile.k0 + shift, tile.k1 + shift, m.causal);
        CHECK(same_bias(shifted, block, transcendental));
      }
    }
    // Not trivially invariant: the bias does depend on the distance.
    CHECK_FALSE(torch::equal(full[0][t - 1][t - 2], full[0][t - 1][t - 9]));
    // A dense bias of j - i alone says so (by_offset), and its offsets are the matrix's
    // diagonals: entry (i, j) is by_offset(lo, hi)[h][j - i - lo], bit for bit.
    const bool offset_method = m.name == "t5_bias" || m.name.rfind("kerple", 0) == 0 || m.name == "sandwich";
    CHECK(bool(bias.by_offset) == offset_method);
    if (offset_method) {
      const int64_t lo = -(t - 1), hi = m.causal ? 1 : t;
      const auto offsets = bias.by_offset(lo, hi);  // (H, hi - lo)
      REQUIRE(offsets.sizes() == torch::IntArrayRef({heads, hi - lo}));
      const auto i = torch::arange(t).view({-1, 1}), j = torch::arange(t).view({1, -1});
      const auto visible = m.causal ? (j <= i) : torch::ones({t, t}, torch::kBool);
      const auto spread = offsets.index({torch::indexing::Slice(), (j - i - lo).clamp(0, hi - lo - 1)});  // (H, T, T)
      CHECK(torch::equal(spread.masked_select(visible), full.masked_select(visible)));
    }
  }
}

TEST_CASE("rotary matches complex multiplication by exp(i p theta)", "[positions]") {
  struct Case {
    int64_t d_head;
    double fraction, base;
    int64_t offset;
  };
  // d_head 10 at fraction 0.5 rotates 4 dimensions (5 rounded down to even).
  const Case cases[] = {{8, 1.0, 10000.0, 0}, {10, 0.5, 10000.0, 3}, {6, 1.0, 100.0, 57}};
  for (const auto& c : cases) {
    INFO("d_head " << c.d_head << ", fraction " << c.fraction << ", offset " << c.offset);
    const int64_t heads = 2, t = 7;
    const int64_t rotated = 2 * int64_t(c.fraction * double(c.d_head) / 2.0);
    auto method = make_method("rotary", heads, true,
                              "{fraction: " + std::to_string(c.fraction) +
                                  ", base: " + std::to_string(c.base) + "}",
                              c.d_head);
    const auto q_in = torch::randn({1, heads, t, c.d_head}, torch::kFloat64);
    const auto k_in = torch::randn({1, heads, t, c.d_head}, torch::kFloat64);
    auto q = q_in.clone(), k = k_in.clone();
    method->rotate_qk(q, k, layer_window(0, t, c.offset));
    for (const auto& [in, out] : {std::pair{q_in, q}, std::pair{k_in, k}}) {
      auto x = in.accessor<double, 4>();
      auto y = out.accessor<double, 4>();
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t p = 0; p < t; ++p) {
          const double position = double(c.offset + p);
          for (int64_t i = 0; i < rotated / 2; ++i) {
            const double theta = std::pow(c.base, -2.0 * double(i) / double(rotated));
            const auto z = std::complex<double>(x[0][h][p][2 * i], x[0][h][p][2 * i + 1]) *
                           std::polar(1.0, position * theta);
            CHECK(y[0][h][p][2 * i] == Approx(z.real()).margin(1e-12));
            CHECK(y[0][h][p][2 * i + 1] == Approx(z.imag()).margin(1e-12));
          }
          for (int64_t d = rotated; d < c.d_head; ++d) CHECK(y[0][h][p][d] == x[0][h][p][d]);
        }
    }
  }
}

TEST_CASE("rotary and xpos scores depend only on relative position", "[positions]") {
  for (double fraction : {1.0, 0.5, 0.0}) {  // 0: xpos
    auto method = fraction == 0.0 ? make_method("xpos", 2, true)
                                  : make_method("rotary", 2, true, "{fraction: " + std::to_string(fraction) + "}", 8);
    const auto q = torch::randn({2, 2, 9, 8}), k = torch::randn({2, 2, 9, 8});
    auto scores_at = [&](int64_t offset) {
      auto q_rot = q.clone(), k_rot = k.clone();
      method->rotate_qk(q_rot, k_rot, layer_window(0, q.size(2), offset));
      return torch::matmul(q_rot, k_rot.transpose(-2, -1));  // (B, H, T, T)
    };
    const auto base = scores_at(0);
    CHECK_FALSE(torch::allclose(base, torch::matmul(q, k.transpose(-2, -1)), 1e-3, 1e-3));
    for (int64_t offset : {1, 5, 1000}) {
      INFO("fraction " << fraction << ", offset " << offset);
      CHECK(torch::allclose(scores_at(offset), base, 1e-4, 1e-4));
    }
  }
}

TEST_CASE("alibi_learned slopes start at ALiBi's, get gradients, train and stay positive",
          "[positions]") {
  const int64_t heads = 4, t = 6;
  const auto fixed = alibi_slopes(int(heads));
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    auto method = make_method("alibi_learned", heads, causal);
    const auto initial = method->log_values();
    REQUIRE(initial.size() == size_t(causal ? heads : 2 * heads));
    for (int64_t h = 0; h < heads; ++h) {
      const std::string index = "[" + std::to_string(h) + "]";
      CHECK(initial[h].first == (causal ? "slope" : "slope_left") + index);
      CHECK(initial[h].second == Approx(fixed[h]).epsilon(1e-5));
      if (!causal) {
        CHECK(initial[heads + h].first == "slope_right" + index);
        CHECK(initial[heads + h].second == Approx(fixed[h]).epsilon(1e-5));
      }
    }

    // Gradients reach every slope through the attention.
    backward_through_attention(*method, heads, 8, t, causal);
    for (const auto& p : method->parameters()) {
      REQUIRE(p.grad().defined());
      CHECK((p.grad().abs() > 0).all().item<bool>());
    }

    // A loss that rewards smaller slopes: they shrink but cannot cross zero.
    torch::optim::Adam optimizer(method->parameters(), torch::optim::AdamOptions(0.5));
    for (int step = 0; step < 5; ++step) {
      optimizer.zero_grad();
      auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, causal);
      (-finite_part(bias)).sum().backward();
      optimizer.step();
    }
    const auto trained = method->log_values();
    for (size_t n = 0; n < trained.size(); ++n) {
      INFO(trained[n].first);
      CHECK(trained[n].second < 0.5 * initial[n].second);
      CHECK(trained[n].second > 0.0);
    }
  }
  auto per_layer = make_method("alibi_learned", heads, true, "{shared_across_layers: false}", 8, 3);
  CHECK(per_layer->log_values().size() == size_t(3 * heads));
  CHECK(per_layer->log_values().front().first == "layer0.slope[0]");
}

TEST_CASE("t5_bias parameters get gradients through the attention", "[positions]") {
  const int64_t heads = 3, t = 6;
  for (bool causal : {true, false}) {
    INFO((causal ? "causal" : "bidirectional"));
    auto method = make_method("t5_bias", heads, causal);
    backward_through_attention(*method, heads, 8, t, causal);
    // Every head's parameters (the last dimension) get a gradient: a dead head fails.
    for (const auto& p : method->parameters()) {
      REQUIRE(p.grad().defined());
      const auto per_head = p.grad().abs().reshape({-1, heads}).sum(0);  // (H,)
      for (int64_t h = 0; h < heads; ++h) {
        INFO("head " << h);
        CHECK(per_head[h].item<double>() > 0);
      }
    }
  }
}

TEST_CASE("the local_window example plugin loads from its .so, once", "[positions]") {
  auto& registry = PositionRegistry::instance();
  REQUIRE(std::filesystem::exists(kPlugin));
  registry.load_plugin(kPlugin);
  auto names = registry.names();
  CHECK(std::count(names.begin(), names.end(), "local_window") == 1);
  CHECK(registry.get("local_window").origin.find("libextrap_local_window.so") != std::string::npos);

  // Loading the same file again, by another spelling of its path, is a no-op.
  const auto relative = std::filesystem::relative(kPlugin).string();
  CHECK_NOTHROW(registry.load_plugin(kPlugin));
  CHECK_NOTHROW(registry.load_plugin(relative));
  names = registry.names();
  CHECK(std::count(names.begin(), names.end(), "local_window") == 1);

  // Its bias: 0 where |i - j| < window_h, else masked; head h's window is
  // floor(window * 2^(h * spread / (H - 1))): 3 and 6 for window 3, spread 1, two heads.
  const int64_t heads = 2, t = 9;
  for (bool causal : {true, false}) {
    auto method = make_method("local_window", heads, causal, "{window: 3, spread: 1}");
    auto bias = materialize_bias(method->bias(layer_window(0, t)), heads, t, t, causal);
    const int64_t windows[] = {3, 6};
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < t; ++i)
        for (int64_t j = 0; j < t; ++j) {
          INFO("head " << h << ", i " << i << ", j " << j);
          const bool visible = std::abs(i - j) < windows[h] && !(causal && j > i);
          CHECK(bias[h][i][j].item<float>() == (visible ? 0.0f : -kInf));
        }
  }
  CHECK_THROWS_WITH(make_method("local_window", heads, true, "{window: 0}"),
                    Catch::Contains("window") && Catch::Contains("at least 1"));
}

TEST_CASE("plugin loading errors name the file and the problem", "[positions]") {
  auto& registry = PositionRegistry::instance();
  CHECK_THROWS_WITH(registry.load_plugin("/nonexistent/libmissing.so"),
                    Catch::Contains("/nonexistent/libmissing.so") && Catch::Contains("no such file"));
  const std::string libm = "/lib/x86_64-linux-gnu/libm.so.6";
  if (std::filesystem::exists(libm)) {
    CHECK_THROWS_WITH(registry.load_plugin(libm),
                      Catch::Contains("libm.so.6") && Catch::Contains("not an extrap plugin"));
    CHECK_THROWS_WITH(registry.load_plugin(libm), Catch::Contains("not an extrap plugin"));
  }
}
