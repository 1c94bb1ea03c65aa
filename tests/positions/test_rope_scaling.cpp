// Evaluation-time RoPE scaling: the frequencies and the attention factor against the formulas
// of ../shared/REFERENCE.md, written out here again one component at a time in plain doubles;
// what the scaling does to a rotation; `none` leaves rotary exactly as trained; refusals.
#include "core/eval/evaluator.h"
#include "core/model/model.h"
#include "positions/rotation.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace extrap;

namespace {

const double kPi = 3.14159265358979323846;

// theta_k = b^(-2k/d), one at a time.
std::vector<double> plain_frequencies(int d, double base) {
  std::vector<double> theta;
  for (int k = 0; k < d / 2; ++k) theta.push_back(std::pow(base, -2.0 * k / d));
  return theta;
}

// The formulas of REFERENCE.md, "Evaluation-time RoPE scaling".
std::vector<double> expected_frequencies(const std::string& kind, int d, double b, double s,
                                         double L, double l) {
  std::vector<double> theta = plain_frequencies(d, b), out;
  for (int k = 0; k < d / 2; ++k) {
    const double t = theta[k];
    if (kind == "linear") {
      out.push_back(t / s);
    } else if (kind == "ntk") {
      out.push_back(std::pow(b * std::pow(s, d / (d - 2.0)), -2.0 * k / d));
    } else if (kind == "dynamic") {
      const double base = l > L ? b * std::pow(s * l / L - (s - 1), d / (d - 2.0)) : b;
      out.push_back(std::pow(base, -2.0 * k / d));
    } else if (kind == "yarn") {  // Hugging Face's: a ramp over the pair index, rounded ends
      const auto dim_of = [&](double n) { return d * std::log(L / (n * 2 * kPi)) / (2 * std::log(b)); };
      const double low = std::max(0.0, std::floor(dim_of(32))), high0 = std::min(d - 1.0, std::ceil(dim_of(1)));
      const double high = high0 == low ? high0 + 0.001 : high0;
      const double ramp = std::min(1.0, std::max(0.0, (k - low) / (high - low)));
      const double extrapolation = 1 - ramp;  // HF's inv_freq_extrapolation_factor
      out.push_back(t / s * (1 - extrapolation) + t * extrapolation);
    } else if (kind == "yarn_paper") {
      const double lambda = 2 * kPi / t, r = L / lambda, alpha = 1, beta = 32;
      const double gamma = r < alpha ? 0 : r > beta ? 1 : (r - alpha) / (beta - alpha);
      out.push_back((1 - gamma) * t / s + gamma * t);
    } else if (kind == "llama3") {
      const double lambda = 2 * kPi / t, low = 1, high = 4;
      if (lambda > L / low) {
        out.push_back(t / s);
      } else if (lambda < L / high) {
        out.push_back(t);
      } else {
        const double smooth = (L / lambda - low) / (high - low);
        out.push_back((1 - smooth) * t / s + smooth * t);
      }
    } else {
      out.push_back(t);
    }
  }
  return out;
}

RopeScaling scaling(RopeScalingKind kind, double factor, int64_t L) {
  RopeScaling s;
  s.kind = kind;
  s.factor = factor;
  s.original_length = L;
  return s;
}

std::shared_ptr<PositionMethod> rotary(int64_t d_head, const std::string& options = "{}",
                                       const std::string& name = "rotary") {
  PositionContext context;
  context.num_heads = 2;
  context.d_head = d_head;
  context.d_model = 2 * d_head;
  return PositionRegistry::instance().create(name, context,
                                             OptionReader(YAML::Load(options), "test", "position"));
}

}  // namespace

TEST_CASE("scaled rotary frequencies equal the formulas, component by component", "[rope]") {
  const double base = 10000;
  for (int d : {8, 16, 64, 128})
    for (double s : {1.0, 2.0, 4.0, 16.0})
      for (int64_t L : {16, 64, 512, 4096})
        for (auto kind : {RopeScalingKind::none, RopeScalingKind::linear, RopeScalingKind::ntk,
                          RopeScalingKind::dynamic, RopeScalingKind::yarn,
                          RopeScalingKind::yarn_paper, RopeScalingKind::llama3})
          for (int64_t l : {L / 2, L, 3 * L}) {
            const std::string name = rope_scaling_name(kind);
            INFO(name << " d " << d << " s " << s << " L " << L << " l " << l);
            const auto got = scaled_rotary_frequencies(d, base, scaling(kind, s, L), l);
            const auto want = expected_frequencies(name, d, base, s, double(L), double(l));
            REQUIRE(got.numel() == int64_t(want.size()));
            for (int k = 0; k < d / 2; ++k)
              REQUIRE(got[k].item<double>() == Approx(want[k]).epsilon(1e-12).margin(0));
          }
}

TEST_CASE("each scaling keeps the fast components and slows the slow ones as its paper says",
          "[rope]") {
  // d = 64, L = 512, s = 4: theta_0 = 1 (wavelength 2 pi, r = 81 > 32: YaRN keeps it; 2 pi <
  // 512 / 4: Llama 3 keeps it); the slowest component (wavelength ~ 5e4 > L) is divided by s
  // by both; linear divides all; NTK keeps theta_0 and moves the slowest towards theta / s.
  const auto theta = plain_frequencies(64, 10000);
  const auto at = [&](RopeScalingKind kind, int k) {
    return scaled_rotary_frequencies(64, 10000, scaling(kind, 4, 512), 2048)[k].item<double>();
  };
  REQUIRE(at(RopeScalingKind::yarn, 0) == theta[0]);
  REQUIRE(at(RopeScalingKind::yarn_paper, 0) == theta[0]);
  REQUIRE(at(RopeScalingKind::llama3, 0) == theta[0]);
  REQUIRE(at(RopeScalingKind::ntk, 0) == theta[0]);
  REQUIRE(at(RopeScalingKind::yarn, 31) == Approx(theta[31] / 4).epsilon(1e-12));
  REQUIRE(at(RopeScalingKind::yarn_paper, 31) == Approx(theta[31] / 4).epsilon(1e-12));
  REQUIRE(at(RopeScalingKind::llama3, 31) == Approx(theta[31] / 4).epsilon(1e-12));
  REQUIRE(at(RopeScalingKind::linear, 0) == Approx(theta[0] / 4).epsilon(1e-12));
  // NTK: base 10000 * 4^(64/62); the last component is theta_31 / 4^(62/64 * 64/62) = theta / 4.
  REQUIRE(at(RopeScalingKind::ntk, 31) == Approx(theta[31] / 4).epsilon(1e-9));
  REQUIRE(at(RopeScalingKind::ntk, 16) < theta[16]);
  REQUIRE(at(RopeScalingKind::ntk, 16) > theta[16] / 4);
}

TEST_CASE("yarn (Hugging Face's ramp over the pair index) and yarn_paper (the paper's ramp in L / wavelength) "
          "differ at short training lengths", "[rope]") {
  // d = 16, L = 32, s = 4, base 10^4. Hugging Face: d(n) = 16 ln(32 / (2 pi n)) / (2 ln 10^4), so
  // low = max(floor(d(32)), 0) = 0 and high = ceil(d(1)) = ceil(1.414) = 2: pair 0 keeps its
  // frequency, pair 1 is half interpolated, pairs 2.. are divided by s. The paper: r_0 = 32 / (2 pi)
  // = 5.09, gamma_0 = (r_0 - 1) / 31 = 0.132, so pair 0 is 86.8% interpolated.
  const auto theta = plain_frequencies(16, 10000);
  const auto hf = scaled_rotary_frequencies(16, 10000, scaling(RopeScalingKind::yarn, 4, 32), 128);
  const auto paper = scaled_rotary_frequencies(16, 10000, scaling(RopeScalingKind::yarn_paper, 4, 32), 128);
  REQUIRE(hf[0].item<double>() == theta[0]);
  REQUIRE(hf[1].item<double>() == Approx(0.5 * theta[1] / 4 + 0.5 * theta[1]).epsilon(1e-12));
  for (int k = 2; k < 8; ++k) REQUIRE(hf[k].item<double>() == Approx(theta[k] / 4).epsilon(1e-12));
  const double gamma0 = (32 / (2 * kPi) - 1) / 31;
  REQUIRE(paper[0].item<double>() == Approx((1 - gamma0) * theta[0] / 4 + gamma0 * theta[0]).epsilon(1e-12));
  REQUIRE(gamma0 == Approx(0.132).margin(0.001));
  REQUIRE(rope_scaling_name(parse_rope_scaling("yarn_paper", "test")) == "yarn_paper");
}

TEST_CASE("YaRN's attention factor is 0.1 ln s + 1, and only YaRN has one", "[rope]") {
  REQUIRE(rope_attention_factor(scaling(RopeScalingKind::yarn, 4, 64)) ==
          Approx(0.1 * std::log(4.0) + 1).epsilon(1e-15));
  REQUIRE(rope_attention_factor(scaling(RopeScalingKind::yarn, 1, 64)) == 1.0);
  REQUIRE(rope_attention_factor(scaling(RopeScalingKind::yarn_paper, 4, 64)) ==
          Approx(0.1 * std::log(4.0) + 1).epsilon(1e-15));
  for (auto kind : {RopeScalingKind::none, RopeScalingKind::linear, RopeScalingKind::ntk,
                    RopeScalingKind::dynamic, RopeScalingKind::llama3})
    REQUIRE(rope_attention_factor(scaling(kind, 4, 64)) == 1.0);

  // Rotation keeps lengths, so YaRN's rotated q and k are 0.1 ln s + 1 times as long and
  // their scores (0.1 ln s + 1)^2 times those of the same frequencies without the factor.
  torch::manual_seed(3);
  auto method = rotary(16);
  auto q = torch::randn({1, 2, 24, 16}, torch::kFloat64), k = torch::randn({1, 2, 24, 16}, torch::kFloat64);
  auto q0 = q.clone(), k0 = k.clone();
  REQUIRE(method->set_rope_scaling(scaling(RopeScalingKind::yarn, 4, 8)));
  method->rotate_qk(q, k, layer_window(0, 24));
  const double m = 0.1 * std::log(4.0) + 1;
  REQUIRE(torch::allclose(q.norm(2, -1), m * q0.norm(2, -1), 1e-12, 0));
  REQUIRE(torch::allclose(k.norm(2, -1), m * k0.norm(2, -1), 1e-12, 0));
}

TEST_CASE("longrope divides pair k's frequency by short_factor[k] up to L and by long_factor[k] past it, and "
          "multiplies cos and sin by its attention factor",
          "[rope]") {
  RopeScaling s;
  s.kind = RopeScalingKind::longrope;
  s.factor = 4;
  s.original_length = 64;
  s.short_factor = {1.0, 1.5, 2.0, 3.0};
  s.long_factor = {2.0, 4.0, 8.0, 16.0};
  const std::vector<double> theta = plain_frequencies(8, 10000);
  for (const int64_t l : {1, 64, 65, 300}) {
    INFO("window ending at " << l);
    const auto got = scaled_rotary_frequencies(8, 10000, s, l);
    const std::vector<double>& ext = l > 64 ? s.long_factor : s.short_factor;
    for (int k = 0; k < 4; ++k) REQUIRE(got[k].item<double>() == Approx(theta[size_t(k)] / ext[size_t(k)]).epsilon(1e-14));
  }
  // Phi-3's default attention factor: sqrt(1 + ln s / ln L); 1 for s = 1; a given one as given.
  REQUIRE(rope_attention_factor(s) == Approx(std::sqrt(1 + std::log(4.0) / std::log(64.0))).epsilon(1e-15));
  s.attention_factor = 1.3;
  REQUIRE(rope_attention_factor(s) == 1.3);
  s.attention_factor = 0;
  s.factor = 1;
  REQUIRE(rope_attention_factor(s) == 1.0);
  // The factor lists come from a checkpoint: evaluation-time longrope has none; a list of the
  // wrong length, or a factor not above 0, is refused.
  REQUIRE_THROWS_WITH(rope_scaling_for(RopeScalingKind::longrope, 0, 64, 256),
                      Catch::Contains("RoPE scaling longrope needs short_factor and long_factor"));
  REQUIRE_THROWS_WITH(scaled_rotary_frequencies(6, 10000, s, 8), Catch::Contains("4 factors for 3 rotated pairs"));
  s.long_factor[2] = 0;
  REQUIRE_THROWS_WITH(check_rope_scaling(s), Catch::Contains("long_factor holds 0; each factor must be"));
}

TEST_CASE("linear interpolation by s turns position p into p / s", "[rope]") {
  // Under linear scaling with s = 2, the query at position 2m is rotated exactly as the
  // unscaled query at position m.
  torch::manual_seed(5);
  for (const char* name : {"rotary", "xpos"}) {
    INFO(name);
    auto scaled = rotary(16, "{}", name), plain = rotary(16, "{}", name);
    auto x = torch::randn({1, 2, 1, 16}, torch::kFloat64).expand({1, 2, 32, 16}).contiguous();
    auto q = x.clone(), k = x.clone(), q0 = x.clone(), k0 = x.clone();
    REQUIRE(scaled->set_rope_scaling(scaling(RopeScalingKind::linear, 2, 8)));
    scaled->rotate_qk(q, k, layer_window(0, 32));
    plain->rotate_qk(q0, k0, layer_window(0, 32));
    using torch::indexing::Slice;
    auto even = q.index({Slice(), Slice(), Slice(0, 32, 2)});
    if (std::string(name) == "rotary") {
      REQUIRE(torch::allclose(even, q0.index({Slice(), Slice(), Slice(0, 16)}), 1e-12, 1e-12));
    } else {
      // xpos: the decay still counts real positions; compare the angles (directions per pair).
      auto angle = [](const torch::Tensor& t) {
        auto pairs = t.unflatten(-1, {8, 2});
        return torch::atan2(pairs.select(-1, 1), pairs.select(-1, 0));
      };
      REQUIRE(torch::allclose(angle(even), angle(q0.index({Slice(), Slice(), Slice(0, 16)})),
                              1e-9, 1e-9));
    }
  }
}

TEST_CASE("dynamic NTK changes nothing up to the training length and rescales past it", "[rope]") {
  torch::manual_seed(9);
  auto scaled = rotary(16), plain = rotary(16);
  REQUIRE(scaled->set_rope_scaling(scaling(RopeScalingKind::dynamic, 1, 16)));
  for (int64_t T : {8, 16, 40}) {
    auto q = torch::randn({1, 2, T, 16}), k = torch::randn({1, 2, T, 16});
    auto q1 = q.clone(), k1 = k.clone();
    scaled->rotate_qk(q, k, layer_window(0, T));
    plain->rotate_qk(q1, k1, layer_window(0, T));
    if (T <= 16)
      REQUIRE(torch::equal(q, q1));
    else
      REQUIRE_FALSE(torch::allclose(q, q1));
  }
}

TEST_CASE("`none` leaves rotary exactly as trained, and evaluation restores it", "[rope]") {
  for (const char* name : {"rotary", "xpos"}) {
    INFO(name);
    Config config = testing::tiny_config(name);
    torch::manual_seed(11);
    auto model = build_model(config, 257);
    model->eval();
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, 256, {2, 40}, torch::kLong);
    const auto trained = model->forward(tokens);
    model->set_rope_scaling(RopeScaling{});  // none
    REQUIRE(torch::equal(model->forward(tokens), trained));
    model->set_rope_scaling(scaling(RopeScalingKind::yarn, 4, 16));
    REQUIRE_FALSE(torch::allclose(model->forward(tokens), trained));
    model->set_rope_scaling(RopeScaling{});
    REQUIRE(torch::equal(model->forward(tokens), trained));

    // An evaluation with a scaling leaves the model as it found it.
    auto corpus = testing::tiny_byte_corpus(2);
    EvalSpec spec;
    spec.length = 32;
    spec.max_tokens = 200;
    const double plain = evaluate(model, corpus, corpus.valid, spec).nll_sum;
    spec.rope_scaling = rope_scaling_for(RopeScalingKind::ntk, 0, 16, 32);
    REQUIRE(spec.rope_scaling.factor == 2.0);
    const double scaled = evaluate(model, corpus, corpus.valid, spec).nll_sum;
    REQUIRE(scaled != plain);
    REQUIRE_FALSE(model->rope_scaling().active());
    REQUIRE(torch::equal(model->forward(tokens), trained));
  }
}

TEST_CASE("the factor is the length ratio unless given, and never below 1", "[rope]") {
  REQUIRE(rope_scaling_for(RopeScalingKind::yarn, 0, 64, 256).factor == 4.0);
  REQUIRE(rope_scaling_for(RopeScalingKind::linear, 0, 64, 32).factor == 1.0);
  REQUIRE(rope_scaling_for(RopeScalingKind::llama3, 8, 64, 256).factor == 8.0);
  REQUIRE(rope_scaling_for(RopeScalingKind::dynamic, 0, 64, 256).factor == 1.0);
  REQUIRE(rope_variant_label(RopeScalingKind::none, 0) == "");
  REQUIRE(rope_variant_label(RopeScalingKind::yarn, 0) == "yarn");
  REQUIRE(rope_variant_label(RopeScalingKind::yarn, 4) == "yarn_x4");
  REQUIRE(rope_variant_label(RopeScalingKind::ntk, 2.5) == "ntk_x2.5");
}

TEST_CASE("RoPE scaling refuses methods without rotary angles and factors below 1", "[rope]") {
  Config config = testing::tiny_config("alibi");
  auto model = build_model(config, 257);
  REQUIRE_THROWS_WITH(model->set_rope_scaling(scaling(RopeScalingKind::yarn, 4, 16)),
                      Catch::Contains("'alibi' has no rotary angles"));
  model->set_rope_scaling(RopeScaling{});  // none: nothing to refuse
  REQUIRE_THROWS_WITH(rope_scaling_for(RopeScalingKind::linear, 0.5, 64, 64),
                      Catch::Contains("factor 0.5") && Catch::Contains("at least 1"));
  REQUIRE_THROWS_WITH(parse_rope_scaling("yarn2", "--rope-scaling"),
                      Catch::Contains("--rope-scaling: unknown RoPE scaling 'yarn2'"));
  REQUIRE_THROWS_WITH(scaled_rotary_frequencies(16, 10000, scaling(RopeScalingKind::yarn, 2, 0), 8),
                      Catch::Contains("needs the training length"));
}

namespace {

// Rotary as the paper writes it, in float64: pairs (2i, 2i+1) turned by p theta_i, theta_i =
// 10000^(-2i/d), each row at its own position p.
torch::Tensor rotate_at(const torch::Tensor& x, const std::vector<double>& positions) {
  auto out = x.to(torch::kFloat64).clone();
  const int64_t d = x.size(-1);
  for (int64_t t = 0; t < x.size(2); ++t)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double angle = positions[size_t(t)] * std::pow(10000.0, -2.0 * double(i) / double(d));
      const auto a = x.select(2, t).select(-1, 2 * i).to(torch::kFloat64), b = x.select(2, t).select(-1, 2 * i + 1).to(torch::kFloat64);
      out.select(2, t).select(-1, 2 * i).copy_(a * std::cos(angle) - b * std::sin(angle));
      out.select(2, t).select(-1, 2 * i + 1).copy_(a * std::sin(angle) + b * std::cos(angle));
    }
  return out;
}

}  // namespace

TEST_CASE("self_extend: keys within W of a query at their positions, farther ones at grouped positions "
          "(Jin et al.), in a rotary attention layer", "[rope][self-extend]") {
  // REFERENCE.md: relative distance i - j below the neighbour window W as trained; beyond it the
  // query at floor(i / G) + W - floor(W / G) and the key at floor(j / G).
  const int64_t T = 23, D = 32, H = 4, W = 4, G = 3;
  torch::manual_seed(21);
  PositionContext context;
  context.num_heads = H;
  context.d_head = D / H;
  context.d_model = D;
  const auto method =
      PositionRegistry::instance().create("rotary", context, OptionReader(YAML::Load("{}"), "test", "position"));
  SelfAttention attention(SelfAttentionOptions(D, H));
  attention->eval();
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({2, T, D});
  TokenPositions positions = TokenPositions::window(T);
  positions.neighbor_window = W;
  positions.group_size = G;
  AttentionOptions options;
  options.causal = true;
  for (const auto backend : {AttentionBackend::Reference, AttentionBackend::Efficient}) {
    options.backend = backend;
    const auto actual = attention->forward(x, *method, positions, options);
    // By the definition, in float64 from the layer's own weights.
    const auto qkv = torch::linear(x.to(torch::kFloat64), attention->qkv->weight.to(torch::kFloat64),
                                   attention->qkv->bias.to(torch::kFloat64))
                         .view({2, T, 3, H, D / H})
                         .permute({2, 0, 3, 1, 4});  // (3, B, H, T, Dh)
    std::vector<double> plain, grouped_q, grouped_k;
    for (int64_t p = 0; p < T; ++p) {
      plain.push_back(double(p));
      grouped_q.push_back(double(p / G + W - W / G));
      grouped_k.push_back(double(p / G));
    }
    const auto near = torch::matmul(rotate_at(qkv[0], plain), rotate_at(qkv[1], plain).transpose(-1, -2));
    const auto far = torch::matmul(rotate_at(qkv[0], grouped_q), rotate_at(qkv[1], grouped_k).transpose(-1, -2));
    const auto i = torch::arange(T).view({-1, 1}), j = torch::arange(T).view({1, -1});
    auto scores = torch::where(i - j >= W, far, near) / std::sqrt(double(D / H));
    scores = scores.masked_fill(j > i, -INFINITY);
    const auto context_rows = torch::matmul(torch::softmax(scores, -1), qkv[2]).transpose(1, 2).reshape({2, T, D});
    const auto expected = torch::linear(context_rows, attention->out->weight.to(torch::kFloat64),
                                        attention->out->bias.to(torch::kFloat64));
    INFO("backend " << enum_name(backend));
    CHECK((actual.to(torch::kFloat64) - expected).abs().max().item<double>() < 1e-5);
    // Without Self-Extend the layer differs (the far keys are seen at other distances).
    CHECK_FALSE(torch::allclose(attention->forward(x, *method, TokenPositions::window(T), options), actual, 1e-4, 1e-4));
  }
}

TEST_CASE("self_extend: the trained model up to L, a group size that keeps every distance below L past it, "
          "refusals", "[rope][self-extend]") {
  // L = 32, W = 16: G = 1 up to 32 tokens; at 128 tokens the least G with floor(127 / G) + 16 -
  // floor(16 / G) <= 31 is 8 (G = 7 gives 18 + 16 - 2 = 32).
  REQUIRE(rope_scaling_for(RopeScalingKind::self_extend, 0, 32, 32).factor == 1.0);
  const RopeScaling at128 = rope_scaling_for(RopeScalingKind::self_extend, 0, 32, 128);
  REQUIRE(at128.neighbor_window == 16);
  REQUIRE(at128.factor == 8.0);
  REQUIRE(rope_scaling_for(RopeScalingKind::self_extend, 5, 32, 128).factor == 5.0);
  REQUIRE(rope_variant_label(RopeScalingKind::self_extend, 0) == "self_extend");

  Config config = testing::tiny_config("rotary");
  torch::manual_seed(12);
  auto model = build_model(config, 257);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto tokens = torch::randint(0, 256, {2, 48}, torch::kLong);
  const auto trained = model->forward(tokens);
  model->set_rope_scaling(rope_scaling_for(RopeScalingKind::self_extend, 0, 16, 16));  // G = 1
  REQUIRE(torch::equal(model->forward(tokens), trained));
  model->set_rope_scaling(rope_scaling_for(RopeScalingKind::self_extend, 0, 16, 48));
  const auto extended = model->forward(tokens);
  REQUIRE_FALSE(torch::allclose(extended, trained, 1e-4, 1e-4));
  // The first W = 8 rows see no key that far back: the trained model's rows.
  REQUIRE(torch::allclose(extended.narrow(1, 0, 8), trained.narrow(1, 0, 8), 1e-5, 1e-5));
  model->set_rope_scaling(RopeScaling{});
  REQUIRE(torch::equal(model->forward(tokens), trained));

  RopeScaling bad = rope_scaling_for(RopeScalingKind::self_extend, 0, 16, 48);
  bad.factor = 2.5;
  REQUIRE_THROWS_WITH(check_rope_scaling(bad), Catch::Contains("whole number"));
  bad.factor = 2;
  bad.neighbor_window = 16;
  REQUIRE_THROWS_WITH(check_rope_scaling(bad), Catch::Contains("neighbour window"));
  REQUIRE_THROWS_WITH(build_model(testing::tiny_config("alibi"), 257)->set_rope_scaling(at128),
                      Catch::Contains("no rotary angles"));
}
