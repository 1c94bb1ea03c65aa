// Where the model looks (core/eval/attention_profile.h): the attention weights against the
// softmax written out, their row blocks against the whole matrix for every method, the profile's
// mass and entropy by distance bin against loops over every (query, key), and
// `extrap inspect attention`.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>

#include "core/attention/attention_observer.h"
#include "core/eval/attention_profile.h"
#include "core/eval/evaluator.h"
#include "tests/support/cli_harness.h"
#include "tests/support/test_support.h"

using namespace extrap;
using namespace extrap::testing;

namespace {

// Records each attention call's inputs (copies), in call order.
struct Recorder : AttentionObserver {
  struct Call {
    torch::Tensor q, k;
    AttentionBias bias;
    AttentionOptions options;
  };
  std::vector<Call> calls;
  torch::Tensor observe(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor&, const AttentionBias& bias,
                        const AttentionOptions& options) override {
    calls.push_back({q.clone(), k.clone(), bias, options});
    return {};
  }
};

// The distance bin of d >= 0 with edges 0, 1, 2, 4, ...: 0 for 0, else floor(log2 d) + 1.
int64_t bin_of(int64_t d) {
  int64_t b = 0;
  while (d > 0) {
    ++b;
    d /= 2;
  }
  return b;
}

// A model of `method` (2 layers, 4 heads, L = 16) with `attention` options, its parameters moved
// off their initial values; `causal` false: a masked LM.
TransformerLM options_model(const std::string& method, const AttentionConfig& attention, bool causal = true) {
  Config config = tiny_config(method);
  config.model.attention_options = attention;
  if (!causal) config.model.objective = Objective::masked_lm;
  torch::manual_seed(5);
  auto model = build_model(config, 257);
  model->eval();
  torch::NoGradGuard no_grad;
  for (auto& p : model->parameters()) p.add_(torch::randn_like(p) * 0.05);
  return model;
}

}  // namespace

TEST_CASE("attention weights: the softmax with bias, sink and window written out, and row blocks equal "
          "the whole for every method",
          "[attention][profile]") {
  // ALiBi slopes, a sink per head and a window of 4, float64, against loops.
  torch::manual_seed(1);
  const int64_t H = 2, T = 9, D = 4;
  const auto f64 = torch::TensorOptions().dtype(torch::kFloat64);
  const auto q = torch::randn({1, H, T, D}, f64), k = torch::randn({1, H, T, D}, f64);
  const std::vector<double> slopes = {0.5, 0.125}, sink = {0.7, -1.5};
  AttentionBias bias = AttentionBias::linear_causal(torch::tensor(slopes, f64));
  bias.sink = torch::tensor(sink, f64);
  bias.window = 4;
  const auto p = attention_probabilities(q, k, bias, AttentionOptions{});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) {
      std::vector<double> logits(size_t(T), -std::numeric_limits<double>::infinity());
      double z = std::exp(sink[size_t(h)]);
      for (int64_t j = std::max<int64_t>(0, i - 3); j <= i; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += q[0][h][i][d].item<double>() * k[0][h][j][d].item<double>();
        logits[size_t(j)] = dot / std::sqrt(double(D)) - slopes[size_t(h)] * double(i - j);
        z += std::exp(logits[size_t(j)]);
      }
      for (int64_t j = 0; j < T; ++j)
        CHECK(p[0][h][i][j].item<double>() == Approx(std::exp(logits[size_t(j)]) / z).margin(1e-12));
    }

  // Every causal method's layers, and a masked LM's: the row blocks of an awkward size equal the
  // whole matrix (the keys past a block's last query are absent, weight 0).
  std::vector<std::pair<std::string, TransformerLM>> models;
  for (const auto& name : causal_methods()) models.emplace_back(name, perturbed_model(name));
  AttentionConfig with_options;
  with_options.sink = true;
  with_options.ssmax = true;
  with_options.window = 5;
  models.emplace_back("rotary + sink, ssmax, window 5", options_model("rotary", with_options));
  models.emplace_back("alibi, masked LM", options_model("alibi_symmetric", AttentionConfig{}, false));
  const auto tokens = torch::randint(0, 256, {2, 19}, torch::kLong);
  for (auto& [name, model] : models) {
    INFO(name);
    Recorder recorder;
    {
      ObservedAttention observed(recorder);
      torch::NoGradGuard no_grad;
      model->hidden(tokens);
    }
    REQUIRE(recorder.calls.size() == 2);
    for (const auto& call : recorder.calls) {
      const auto whole = attention_probabilities(call.q, call.k, call.bias, call.options);
      auto blocks = torch::zeros_like(whole);
      for_each_probability_block(call.q, call.k, call.bias, call.options, 5,
                                 [&](int64_t r, const torch::Tensor& probs) {
                                   blocks.narrow(2, r, probs.size(2)).narrow(3, 0, probs.size(3)).copy_(probs);
                                 });
      CHECK(torch::allclose(blocks, whole, 1e-6, 1e-7));
      CHECK(whole.isfinite().all().item<bool>());
      CHECK(whole.sum(-1).le(1 + 1e-5).all().item<bool>());
    }
  }
}

namespace {

// `profile` (T-token windows of `stream`, `windows` of them) against the definition: every
// layer's whole weight matrix for the same windows, summed into bins by loops over every query
// and key; stick-breaking's rest of a row at distance 0, a sink's as the sink share.
void check_profile_by_definition(const std::string& name, TransformerLM& model, const TokenStream& stream,
                                 const AttentionProfile& profile, int64_t T, int64_t windows) {
  const bool causal = model->config().causal();
  const bool stick = name == "stick_breaking", has_sink = name.find("sink") != std::string::npos;
  // The definition: every layer's whole weight matrix, for the same windows.
  Recorder recorder;
  {
    ObservedAttention observed(recorder);
    torch::NoGradGuard no_grad;
    model->hidden(stream.slice(0, windows * T).to(torch::kLong).view({windows, T}));
  }
  REQUIRE(recorder.calls.size() == 2);
  const int64_t H = 4, bins = 6;
  for (int64_t l = 0; l < 2; ++l) {
    const auto& c = recorder.calls[size_t(l)];
    const auto p = attention_probabilities(c.q, c.k, c.bias, c.options).to(torch::kFloat64);
    std::vector<double> mass(size_t(H * bins), 0.0), entropy(size_t(H * bins), 0.0), rest(size_t(H), 0.0);
    for (int64_t w = 0; w < windows; ++w)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i) {
          double row = 0;
          for (int64_t j = 0; j < T; ++j) {
            const double x = p[w][h][i][j].item<double>();
            row += x;
            if (x == 0) continue;
            REQUIRE((!causal ? true : j <= i));
            const int64_t b = bin_of(std::abs(i - j));
            mass[size_t(h * bins + b)] += x;
            entropy[size_t(h * bins + b)] -= x * std::log(x);
          }
          const double r = std::max(0.0, 1 - row);
          if (stick) {
            mass[size_t(h * bins)] += r;
            if (r > 0) entropy[size_t(h * bins)] -= r * std::log(r);
          } else {
            rest[size_t(h)] += r;
          }
        }
    const double queries = double(windows * T);
    for (int64_t h = 0; h < H; ++h) {
      double total = 0;
      for (int64_t b = 0; b < bins; ++b) {
        CHECK(profile.mass[l][h][b].item<double>() == Approx(mass[size_t(h * bins + b)] / queries).margin(1e-6));
        CHECK(profile.entropy[l][h][b].item<double>() ==
              Approx(entropy[size_t(h * bins + b)] / queries).margin(1e-6));
        total += profile.mass[l][h][b].item<double>();
      }
      if (has_sink) {
        CHECK(profile.sink[l][h].item<double>() == Approx(rest[size_t(h)] / queries).margin(1e-6));
        CHECK(profile.sink[l][h].item<double>() > 1e-3);
        CHECK(total + profile.sink[l][h].item<double>() == Approx(1).margin(1e-5));
      } else {
        CHECK(profile.sink[l][h].item<double>() == 0);
        CHECK(total == Approx(1).margin(1e-5));
      }
      if (name == "rotary + window 6")  // nothing 6 or more back: bins 8-15 and 16-23 empty
        CHECK(profile.mass[l][h].slice(0, 4).abs().max().item<double>() == 0);
    }
  }
}

}  // namespace

TEST_CASE("attention profile: mass and entropy by distance bin as loops over every query and key",
          "[eval][profile]") {
  const auto tokens = torch::randint(0, 256, {200}, torch::TensorOptions().dtype(torch::kInt));
  const TokenStream stream = TokenStream::from_tokens(
      std::vector<int32_t>(tokens.data_ptr<int32_t>(), tokens.data_ptr<int32_t>() + tokens.size(0)));
  AttentionConfig sink;
  sink.sink = true;
  AttentionConfig window;
  window.window = 6;
  std::vector<std::pair<std::string, TransformerLM>> models;
  models.emplace_back("alibi", perturbed_model("alibi"));
  models.emplace_back("stick_breaking", perturbed_model("stick_breaking"));
  models.emplace_back("rotary + sink", options_model("rotary", sink));
  models.emplace_back("rotary + window 6", options_model("rotary", window));
  models.emplace_back("alibi, masked LM", options_model("alibi_symmetric", AttentionConfig{}, false));
  // The kernel's own softmax: no bias, linear, forget gates, a bias of j - i alone (t5_bias,
  // kerple_log), with masks, sink and logit scale; the others through attention_probabilities()
  // (FIRE: a dense bias of i as well; CoPE: contextual).
  AttentionConfig sink_chunk_ssmax;
  sink_chunk_ssmax.sink = true;
  sink_chunk_ssmax.chunk = 8;
  sink_chunk_ssmax.ssmax = true;
  AttentionConfig window_temperature;
  window_temperature.window = 5;
  window_temperature.temperature = 0.3;
  window_temperature.temperature_floor = 4;
  models.emplace_back("alibi + sink + chunk 8 + ssmax", options_model("alibi", sink_chunk_ssmax));
  models.emplace_back("none + window 5 + temperature", options_model("none", window_temperature));
  AttentionConfig softcap;  // a cap small enough to bend these scores (and to bound which keys ALiBi skips)
  softcap.softcap = 0.05;
  models.emplace_back("alibi + softcap 0.05", options_model("alibi", softcap));
  models.emplace_back("fox", perturbed_model("fox"));
  models.emplace_back("t5_bias", perturbed_model("t5_bias"));
  models.emplace_back("cope", perturbed_model("cope"));
  models.emplace_back("fire + sink", options_model("fire", sink));
  models.emplace_back("t5_bias + sink + chunk 8 + ssmax, masked LM", options_model("t5_bias", sink_chunk_ssmax, false));
  models.emplace_back("alibi_nonsymmetric, masked LM", options_model("alibi_nonsymmetric", AttentionConfig{}, false));
  models.emplace_back("kerple_log + window 5, masked LM", options_model("kerple_log", window_temperature, false));
  const int64_t T = 24, windows = 3;
  for (auto& [name, model] : models) {
    INFO(name);
    AttentionProfileSpec spec;
    spec.length = T;
    spec.windows = windows;
    spec.query_block = 5;
    const AttentionProfile profile = attention_profile(model, stream, spec);
    CHECK(profile.windows == windows);
    CHECK(profile.edges == std::vector<int64_t>{0, 1, 2, 4, 8, 16, 24});
    CHECK(profile.causal == model->config().causal());

    check_profile_by_definition(name, model, stream, profile, T, windows);
    // An edge at 12 (a training length, say) splits bin 8-15 in two and leaves the others.
    spec.split_at = 12;
    const AttentionProfile split = attention_profile(model, stream, spec);
    CHECK(split.edges == std::vector<int64_t>{0, 1, 2, 4, 8, 12, 16, 24});
    for (const auto& [a, b] : {std::pair{profile.mass, split.mass}, {profile.entropy, split.entropy}}) {
      // Each bin is summed in float32 within blocks of keys, so the halves round apart from the
      // whole, and so does the softmax's denominator (the bins' sum) where the profile makes it.
      CHECK(torch::allclose(b.slice(2, 0, 4), a.slice(2, 0, 4), 0, 1e-6));
      CHECK(torch::allclose(b.slice(2, 4, 6).sum(2), a.select(2, 4), 0, 1e-6));
      CHECK(torch::allclose(b.select(2, 6), a.select(2, 5), 0, 1e-6));
    }
    CHECK(distance_bin_edges(24, 16) == profile.edges);  // already an edge
    CHECK(distance_bin_edges(24, 24) == profile.edges);  // not inside
  }
}

TEST_CASE("attention profile: a long window in blocks of query rows, and a length the stream cannot fill",
          "[eval][profile]") {
  auto model = perturbed_model("alibi");
  const auto long_tokens = torch::randint(0, 256, {4096}, torch::TensorOptions().dtype(torch::kInt));
  const TokenStream long_stream = TokenStream::from_tokens(
      std::vector<int32_t>(long_tokens.data_ptr<int32_t>(), long_tokens.data_ptr<int32_t>() + 4096));
  AttentionProfileSpec spec;
  spec.length = 4096;
  const AttentionProfile profile = attention_profile(model, long_stream, spec);
  CHECK(profile.windows == 1);
  CHECK(profile.edges.back() == 4096);
  CHECK(profile.mass.sum(-1).sub(1).abs().max().item<double>() < 1e-5);
  spec.length = 4097;
  CHECK_THROWS_WITH(attention_profile(model, long_stream, spec),
                    "attention profile at length 4097: the stream's 4096 tokens cannot fill one window "
                    "(give a shorter length or more tokens)");
}

TEST_CASE("attention profile: ALiBi's far keys, skipped where they weigh below e^-64 of the row's largest, "
          "change no bin", "[eval][profile]") {
  // At 1024 keys the steepest head (slope 1/4) skips all but its last few hundred keys; its
  // bins past them hold the softmax's float32 underflow, 0 to 1e-28.
  const int64_t T = 1024;
  const auto tokens = torch::randint(0, 256, {T}, torch::TensorOptions().dtype(torch::kInt));
  const TokenStream stream = TokenStream::from_tokens(
      std::vector<int32_t>(tokens.data_ptr<int32_t>(), tokens.data_ptr<int32_t>() + T));
  AttentionConfig sink;
  sink.sink = true;
  std::vector<std::pair<std::string, TransformerLM>> models;
  models.emplace_back("alibi", perturbed_model("alibi"));
  models.emplace_back("alibi + sink", options_model("alibi", sink));
  models.emplace_back("alibi, masked LM", options_model("alibi_symmetric", AttentionConfig{}, false));
  models.emplace_back("alibi_nonsymmetric, masked LM", options_model("alibi_nonsymmetric", AttentionConfig{}, false));
  const auto index = torch::arange(T, torch::TensorOptions().dtype(torch::kLong));
  const auto distance = (index.view({-1, 1}) - index.view({1, -1})).abs();
  auto bin = torch::zeros_like(distance);  // bin_of(d) for every pair: floor(log2 d) + 1, 0 for d = 0
  for (int64_t e = 1; e < T; e *= 2) bin += (distance >= e).to(torch::kLong);
  for (auto& [name, model] : models) {
    INFO(name);
    AttentionProfileSpec spec;
    spec.length = T;
    spec.windows = 1;
    const AttentionProfile profile = attention_profile(model, stream, spec);
    const int64_t bins = int64_t(profile.edges.size()) - 1;
    REQUIRE(bins == 11);
    Recorder recorder;
    {
      ObservedAttention observed(recorder);
      torch::NoGradGuard no_grad;
      model->hidden(stream.slice(0, T).to(torch::kLong).view({1, T}));
    }
    REQUIRE(recorder.calls.size() == 2);
    for (int64_t l = 0; l < 2; ++l) {
      const auto& c = recorder.calls[size_t(l)];
      const auto p = attention_probabilities(c.q, c.k, c.bias, c.options).to(torch::kFloat64)[0];  // (H, T, T)
      for (int64_t h = 0; h < p.size(0); ++h) {
        const auto mass = torch::zeros({bins}, torch::kFloat64).index_add_(0, bin.flatten(), p[h].flatten()) / T;
        const auto entropy =
            torch::zeros({bins}, torch::kFloat64).index_add_(0, bin.flatten(), torch::special_xlogy(p[h], p[h]).neg().flatten()) / T;
        CHECK((profile.mass[l][h] - mass).abs().max().item<double>() < 1e-6);
        CHECK((profile.entropy[l][h] - entropy).abs().max().item<double>() < 1e-6);
      }
    }
  }
}

TEST_CASE("extrap inspect attention: a trained run's table, and refusals in one line", "[cli][profile]") {
  SweepDir d;
  std::string out;
  REQUIRE(run_cli(d, {"sweep", "tiny.yaml", "--set", "grid.position=[{name: alibi}]", "--set",
                      "grid.train.seed=[1]", "--set", "eval.strides=[]"}, &out) == 0);
  REQUIRE(run_cli(d, {"inspect", "attention", "--checkpoint", "runs/tiny/alibi-seed1", "--length", "64",
                      "--windows", "2"}, &out) == 0);
  INFO(out);
  CHECK(out.find("at length 64: 2 window(s) of the valid split, causal, distance i - j") != std::string::npos);
  CHECK(out.find("layer head  entropy   sink |         0         1       2-3       4-7      8-15     16-31     32-63\n") !=
        std::string::npos);
  auto loaded = load_cli_run(d, "runs/tiny/alibi-seed1");
  AttentionProfileSpec spec;
  spec.length = 64;
  spec.windows = 2;
  const AttentionProfile profile = attention_profile(loaded.run.model, loaded.corpus.valid, spec);
  char row[256];
  int n = std::snprintf(row, sizeof row, "%-5d %-4d %8.4f %6s |", 0, 1, profile.entropy[0][1].sum().item<double>(), "-");
  for (int64_t b = 0; b < 7; ++b)
    n += std::snprintf(row + n, sizeof row - size_t(n), " %9.4f", profile.mass[0][1][b].item<double>());
  CHECK(out.find(std::string(row) + "\n") != std::string::npos);

  CHECK(run_cli(d, {"inspect", "attention", "--checkpoint", "runs/tiny/alibi-seed1", "--length", "5000"}, &out) == 2);
  require_one_line_error(out, "attention profile at length 5000: the stream's");
  CHECK(run_cli(d, {"inspect", "attention", "--checkpoint", "runs/tiny/alibi-seed1", "--length", "64",
                    "--windows", "-1"}, &out) == 2);
  require_one_line_error(out, "--windows -1: must not be negative");
  if (!torch::cuda::is_available()) {
    CHECK(run_cli(d, {"inspect", "attention", "--checkpoint", "runs/tiny/alibi-seed1", "--length", "64",
                      "--device", "cuda"}, &out) == 2);
    require_one_line_error(out, "--device cuda, but ");
  }
  CHECK(run_cli(d, {"inspect", "attention", "--checkpoint", "runs/none", "--length", "64"}, &out) == 2);
  require_one_line_error(out, "runs/none");
}
