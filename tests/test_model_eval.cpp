// The model and the evaluator: causality, and the evaluation modes against brute force.
#include "core/evaluator.h"
#include "core/model.h"
#include "tests/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>

using namespace extrap;

namespace {
TransformerLM tiny_model(const std::string& position, bool causal = true) {
  Config config = testing::tiny_config(position);
  if (!causal) config.model.objective = Objective::masked_lm;
  torch::manual_seed(7);
  auto model = build_model(config, 257);
  model->eval();
  return model;
}
}  // namespace

TEST_CASE("changing a future token never changes an earlier position's logits", "[model]") {
  for (const char* position : {"none", "sinusoidal", "learned", "alibi", "rotary", "t5_bias", "alibi_learned"}) {
    INFO(position);
    auto model = tiny_model(position);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(0, 256, {2, 12}, torch::kLong);
    auto changed = tokens.clone();
    changed.index_put_({torch::indexing::Slice(), 7}, (tokens.index({torch::indexing::Slice(), 7}) + 1) % 256);
    auto a = model->forward(tokens), b = model->forward(changed);
    using torch::indexing::Slice;
    REQUIRE(torch::allclose(a.index({Slice(), Slice(0, 7)}), b.index({Slice(), Slice(0, 7)}), 0, 0));
    REQUIRE_FALSE(torch::allclose(a.index({Slice(), Slice(7)}), b.index({Slice(), Slice(7)})));
  }
}

TEST_CASE("window plans cover every target exactly once", "[eval]") {
  for (int64_t n : {1, 2, 17, 100})
    for (int64_t L : {1, 4, 16, 200})
      for (int64_t S : {0, 1, 3, 4, 16}) {
        auto windows = plan_windows(n, L, S, /*causal=*/true);
        std::vector<int> seen(std::max<int64_t>(n, 1), 0);
        for (const auto& w : windows) {
          REQUIRE(w.size <= L);
          REQUIRE(w.begin + w.size <= n - 1);
          for (int64_t p = w.score_from; p < w.size; ++p) seen[w.begin + p + 1]++;  // target index
        }
        for (int64_t t = 1; t < n; ++t) REQUIRE(seen[t] == 1);
      }
  // Sliding: the first window scores all of its targets; later windows their last S.
  auto w = plan_windows(20, 8, 3, true);
  REQUIRE(w[0].begin == 0);
  REQUIRE(w[0].size == 8);
  REQUIRE(w[0].score_from == 0);
  REQUIRE(w[1].begin == 3);
  REQUIRE(w[1].size == 8);
  REQUIRE(w[1].score_from == 5);
}

// Brute force: score every target t with its own forward pass over exactly the context the
// definition gives it, taking the last position's log-probability.
static double brute_force_nll(TransformerLM& model, const TokenStream& stream, int64_t n, int64_t L, int64_t S) {
  torch::NoGradGuard no_grad;
  const int32_t* data = stream.data();
  double nll = 0;
  for (int64_t t = 1; t < n; ++t) {
    int64_t start;
    if (S <= 0 || S >= L) {
      start = ((t - 1) / L) * L;  // its non-overlapping window
    } else if (t <= L) {
      start = 0;                  // the first window
    } else {
      // Windows end at L, L+S, L+2S, ... (clipped at n-1); the one that scores t ends at the
      // first end >= t and starts L before it.
      const int64_t k = (t - L + S - 1) / S;
      const int64_t end = std::min(L + k * S, n - 1);
      start = std::max<int64_t>(0, end - L);
    }
    auto context = torch::empty({1, t - start}, torch::kLong);
    for (int64_t p = start; p < t; ++p) context[0][p - start] = data[p];
    auto logp = torch::log_softmax(model->forward(context)[0][t - start - 1], -1);
    nll -= logp[data[t]].item<double>();
  }
  return nll;
}

TEST_CASE("non-overlapping and sliding-window perplexity equal a brute-force computation", "[eval]") {
  auto corpus = testing::tiny_byte_corpus(2);
  for (const char* position : {"alibi", "sinusoidal"}) {
    INFO(position);
    auto model = tiny_model(position);
    const int64_t n = 61;
    for (auto [L, S] : std::vector<std::pair<int64_t, int64_t>>{{8, 0}, {8, 3}, {8, 1}, {16, 5}, {7, 7}}) {
      INFO("L " << L << " S " << S);
      EvalSpec spec;
      spec.length = L;
      spec.stride = S;
      spec.max_tokens = n;
      spec.batch_tokens = 24;  // several batches and a ragged last window
      auto r = evaluate(model, corpus, corpus.valid, spec);
      REQUIRE(r.scored_tokens == n - 1);
      const double expected = brute_force_nll(model, corpus.valid, n, L, S);
      REQUIRE(r.nll_sum == Approx(expected).epsilon(1e-5));
      REQUIRE(r.perplexity == Approx(std::exp(expected / double(n - 1))).epsilon(1e-5));
      REQUIRE(r.bits_per_byte == Approx(expected / (std::log(2.0) * double(n - 1))).epsilon(1e-5));
    }
  }
}

TEST_CASE("the efficient and reference attention paths give the same perplexity", "[eval]") {
  auto corpus = testing::tiny_byte_corpus(4);
  auto model = tiny_model("alibi");
  EvalSpec spec;
  spec.length = 100;
  spec.max_tokens = 401;
  model->set_attention_backend(AttentionBackend::Reference);
  auto reference = evaluate(model, corpus, corpus.valid, spec);
  model->set_attention_backend(AttentionBackend::Efficient);
  auto efficient = evaluate(model, corpus, corpus.valid, spec);
  REQUIRE(efficient.scored_tokens == reference.scored_tokens);
  REQUIRE(efficient.nll_sum == Approx(reference.nll_sum).epsilon(1e-5));
}

TEST_CASE("masked-LM evaluation scores a fixed selection, the same for every length", "[eval]") {
  auto corpus = testing::tiny_byte_corpus(20);
  auto model = tiny_model("alibi_symmetric", /*causal=*/false);
  int64_t selected = 0;
  const int64_t n = std::min<int64_t>(300, corpus.valid.size());
  for (int64_t p = 0; p < n; ++p)
    selected += mask_decision(p, corpus.valid.data()[p], 0.15, 1234, corpus.mask_token, 257).selected;
  REQUIRE(n == 300);
  REQUIRE(selected > 20);   // about 15% of 300
  REQUIRE(selected < 80);
  for (int64_t L : {int64_t(16), int64_t(64), n}) {
    EvalSpec spec;
    spec.length = L;
    spec.max_tokens = n;
    auto r = evaluate(model, corpus, corpus.valid, spec);
    REQUIRE(r.scored_tokens == selected);
    REQUIRE(std::isfinite(r.perplexity));
  }
}
