// The adaptive input and softmax (core/model/adaptive.h) against their definition, computed here
// word by word in double precision, and the ALiBi paper's WikiText-103 model built from its config.
#include "core/data/tokenizer.h"
#include "core/eval/evaluator.h"
#include "core/model/memory_estimate.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "experiments/sweep/sweep_spec.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

using namespace extrap;

namespace {

using Matrix = std::vector<std::vector<double>>;

Matrix matrix_of(const torch::Tensor& t) {
  const auto c = t.detach().to(torch::kFloat64).contiguous();
  Matrix m(c.size(0), std::vector<double>(c.size(1)));
  for (int64_t i = 0; i < c.size(0); ++i)
    for (int64_t j = 0; j < c.size(1); ++j) m[i][j] = c[i][j].item<double>();
  return m;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

double log_sum_exp(const std::vector<double>& z) {
  double top = -INFINITY, s = 0;
  for (double v : z) top = std::max(top, v);
  for (double v : z) s += std::exp(v - top);
  return top + std::log(s);
}

// The weights of an adaptive vocabulary, in double.
struct Bands {
  std::vector<int64_t> begin, end;
  std::vector<Matrix> E, P;  // E_k (size_k, dim_k), P_k (D, dim_k)
  Matrix C;                  // (bands - 1, D)
  explicit Bands(const AdaptiveVocabulary& a) {
    for (int64_t k = 0; k < a->bands(); ++k) {
      begin.push_back(a->band_begin(k));
      end.push_back(a->band_end(k));
      E.push_back(matrix_of(a->embeddings[k]));
      P.push_back(matrix_of(a->projections[k]));
    }
    C = a->bands() > 1 ? matrix_of(a->clusters) : Matrix{};
  }
  int64_t band_of(int64_t w) const {
    for (size_t k = 0;; ++k)
      if (w < end[k]) return int64_t(k);
  }
  // log p(w | h), from the definition: the head's softmax over band 0's words and one column per
  // tail band; a tail word's band probability times its softmax within the band.
  double log_prob(const std::vector<double>& h, int64_t w) const {
    std::vector<double> head;
    for (const auto& row : E[0]) head.push_back(dot(h, row));
    for (const auto& row : C) head.push_back(dot(h, row));
    const double head_lse = log_sum_exp(head);
    const int64_t k = band_of(w);
    if (k == 0) return head[w] - head_lse;
    const int64_t dim = int64_t(E[k][0].size());
    std::vector<double> reduced(dim, 0.0);  // h P_k
    for (int64_t j = 0; j < dim; ++j)
      for (size_t d = 0; d < h.size(); ++d) reduced[j] += h[d] * P[k][d][j];
    std::vector<double> tail;
    for (const auto& row : E[k]) tail.push_back(dot(reduced, row));
    return head[E[0].size() + k - 1] - head_lse + tail[w - begin[k]] - log_sum_exp(tail);
  }
  std::vector<double> embed(int64_t w) const {  // E_k[w - begin_k] P_k^T
    const int64_t k = band_of(w);
    std::vector<double> out;
    for (const auto& row : P[k]) out.push_back(dot(row, E[k][w - begin[k]]));
    return out;
  }
};

}  // namespace

TEST_CASE("adaptive softmax: every word's log-probability and each target's NLL equal the definition",
          "[model][adaptive]") {
  torch::manual_seed(3);
  const int64_t V = 50, D = 16;
  AdaptiveVocabulary adaptive(V, D, std::vector<int64_t>{10, 30}, int64_t(2), 0.3);
  adaptive->eval();
  // Weights off their initialisation's scale, so that the bands' probabilities differ.
  for (auto& p : adaptive->parameters()) p.data().mul_(3);
  const Bands bands(adaptive);
  REQUIRE(bands.E[1][0].size() == 8);
  REQUIRE(bands.E[2][0].size() == 4);

  const auto h = torch::randn({6, D});
  const auto lp = adaptive->log_probs(h);  // (6, V)
  REQUIRE(lp.sizes() == torch::IntArrayRef({6, V}));
  const Matrix hm = matrix_of(h);
  double worst = 0;
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t w = 0; w < V; ++w) {  // float32 against double, relative to the value's size
      const double expected = bands.log_prob(hm[n], w);
      worst = std::max(worst, std::abs(lp[n][w].item<double>() - expected) / (1 + std::abs(expected)));
    }
  INFO("largest difference " << worst);
  CHECK(worst < 2e-6);
  CHECK(torch::allclose(lp.exp().sum(1), torch::ones({6}), 1e-5, 1e-5));

  // NLL of targets in every band, one not scored (-100).
  const auto targets = torch::tensor({3, 12, 29, 30, -100, 49}, torch::kLong);
  const auto nll = adaptive->nll(h, targets);
  for (int64_t n = 0; n < 6; ++n) {
    const int64_t t = targets[n].item<int64_t>();
    INFO("row " << n << " target " << t);
    CHECK(nll[n].item<double>() == Approx(t < 0 ? 0.0 : -bands.log_prob(hm[n], t)).epsilon(1e-5).margin(1e-6));
  }
  REQUIRE_THROWS_WITH(adaptive->nll(h.narrow(0, 0, 1), torch::tensor({V}, torch::kLong)),
                      Catch::Contains("target 50 is out of bounds") && Catch::Contains("50 words"));

  // Input embeddings.
  const auto tokens = torch::tensor({{0, 9, 10}, {29, 30, 49}}, torch::kLong);
  const auto e = adaptive->embed(tokens);
  REQUIRE(e.sizes() == torch::IntArrayRef({2, 3, D}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t i = 0; i < 3; ++i) {
      const auto expected = bands.embed(tokens[b][i].item<int64_t>());
      for (int64_t d = 0; d < D; ++d) CHECK(e[b][i][d].item<double>() == Approx(expected[d]).margin(1e-5));
    }

  // In training, dropout (on h and each tail's projection) still gives distributions.
  adaptive->train();
  CHECK(torch::allclose(adaptive->log_probs(h).exp().sum(1), torch::ones({6}), 1e-5, 1e-5));
}

TEST_CASE("adaptive softmax: the NLL's gradients equal central differences of the definition", "[model][adaptive]") {
  torch::manual_seed(4);
  const int64_t V = 30, D = 8;
  AdaptiveVocabulary adaptive(V, D, std::vector<int64_t>{6, 18}, int64_t(2), 0.0);
  adaptive->to(torch::kFloat64);
  for (auto& p : adaptive->parameters()) p.data().mul_(2);
  const auto h = torch::randn({5, D}, torch::kFloat64).requires_grad_(true);
  const auto targets = torch::tensor({1, 7, 20, 29, 5}, torch::kLong);
  adaptive->nll(h, targets).sum().backward();

  const auto loss = [&]() {  // the summed NLL from the definition, at the module's current weights
    const Bands bands(adaptive);
    const Matrix hm = matrix_of(h);
    double s = 0;
    for (int64_t n = 0; n < 5; ++n) s -= bands.log_prob(hm[n], targets[n].item<int64_t>());
    return s;
  };
  std::vector<std::pair<std::string, torch::Tensor>> tensors{{"h", h}};
  for (const auto& p : adaptive->named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (auto& [name, tensor] : tensors) {
    INFO(name);
    if (name == "projection_0") {  // the input side's alone: the head reads h E_0^T
      CHECK_FALSE(tensor.grad().defined());
      continue;
    }
    REQUIRE(tensor.grad().defined());
    const auto flat = tensor.data().view({-1});
    const auto grad = tensor.grad().view({-1});
    for (int64_t i = 0; i < flat.size(0); i += std::max<int64_t>(1, flat.size(0) / 7)) {
      const double kept = flat[i].item<double>(), step = 1e-6;
      flat[i] = kept + step;
      const double up = loss();
      flat[i] = kept - step;
      const double down = loss();
      flat[i] = kept;
      INFO(name << "[" << i << "]");
      CHECK(grad[i].item<double>() == Approx((up - down) / (2 * step)).epsilon(1e-6).margin(1e-8));
    }
  }
}

TEST_CASE("a model with adaptive bands and no final LayerNorm: logits are log-probabilities on every path",
          "[model][adaptive]") {
  Config config = testing::tiny_config("alibi");
  config.model.adaptive_cutoffs = {40, 120};
  config.model.adaptive_factor = 2;
  config.model.final_norm = false;
  torch::manual_seed(5);
  auto model = build_model(config, 257);
  model->eval();
  torch::NoGradGuard no_grad;
  for (const auto& p : model->named_parameters()) CHECK(p.key().find("ln_final") == std::string::npos);
  CHECK(model->num_parameters() == parameter_count_estimate(config, 257));
  testing::check_causal_and_cached(model);
  const auto tokens = torch::randint(0, 257, {2, 20}, torch::kLong);
  const auto logits = model->forward(tokens);
  CHECK(torch::allclose(logits.exp().sum(-1), torch::ones({2, 20}), 1e-5, 1e-5));
  const auto hidden = model->hidden(tokens).reshape({40, -1});
  const auto targets = torch::randint(0, 257, {40}, torch::kLong);
  CHECK(torch::allclose(model->nll(hidden, targets),
                        -logits.reshape({40, -1}).gather(1, targets.unsqueeze(1)).squeeze(1), 1e-5, 1e-5));

  // Activation dropout acts in training only.
  Config dropped = config;
  dropped.model.activation_dropout = 0.5;
  auto with_dropout = build_model(dropped, 257);
  with_dropout->train();
  CHECK_FALSE(torch::equal(with_dropout->forward(tokens), with_dropout->forward(tokens)));
  with_dropout->eval();
  CHECK(torch::equal(with_dropout->forward(tokens), with_dropout->forward(tokens)));

  Config wrong = config;
  wrong.model.adaptive_cutoffs = {40, 257};
  REQUIRE_THROWS_WITH(build_model(wrong, 257), Catch::Contains("model.adaptive_cutoffs") &&
                                                   Catch::Contains("257") && Catch::Contains("below the vocabulary"));
}

TEST_CASE("the ALiBi paper's WikiText-103 model: 247M parameters, as fairseq counts them", "[model][adaptive]") {
  const Config config = load_sweep(EXTRAP_SOURCE_DIR "/configs/wikitext103-paper.yaml", {}).base_config;
  REQUIRE(config.position_name == "alibi");
  // fairseq's dictionary of WikiText-103 has 267,744 entries (4 specials, 267,735 words with
  // <unk>, padded to a multiple of 8); its model has 246,933,504 parameters: bands of 20000 x 1024,
  // 40000 x 256 and 207,744 x 64, their projections to 1024, two cluster logits, and 16 blocks of
  // 12,596,224. extrap's vocabulary of the same text: 267,735 ids (<eos>, <unk>, <mask>, the words).
  const int64_t V = 267735;
  const int64_t expected = 246933504 - (267744 - V) * 64;
  CHECK(parameter_count_estimate(config, V) == expected);
  torch::NoGradGuard no_grad;
  auto model = build_model(config, V);
  CHECK(model->num_parameters() == expected);
  CHECK(std::abs(double(expected) / 247e6 - 1) < 0.01);
  // fairseq's attention initialisation (model.init: fairseq): q, k and v Xavier-uniform with gain
  // 1/sqrt(2), bound sqrt(6 / 2048) / sqrt(2) = 0.0383 against LibTorch's 1/32; the output
  // Xavier-uniform, bound sqrt(6 / 2048) = 0.0541, with a zero bias.
  const auto& attention = *model->named_modules()["blocks.3.attention"]->as<SelfAttentionImpl>();
  for (const auto& part : attention.qkv->weight.chunk(3, 0)) {
    const double top = part.abs().max().item<double>();
    CHECK(top > 0.036);
    CHECK(top <= 0.0383);
  }
  CHECK(attention.out->weight.abs().max().item<double>() > 0.05);
  CHECK(attention.out->bias.abs().max().item<double>() == 0);
}
