// The model and the evaluator: causality, and the evaluation modes against brute force.
#include "core/eval/evaluator.h"
#include "core/model/model.h"
#include "tests/support/test_support.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

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

// The first input of the context the definition gives target t (1 <= t < n) at length L and
// stride S: its non-overlapping window, or the sliding window that scores it.
static int64_t context_start(int64_t t, int64_t n, int64_t L, int64_t S) {
  if (S <= 0 || S >= L) return ((t - 1) / L) * L;  // its non-overlapping window
  if (t <= L) return 0;                             // the first window
  // Windows end at L, L+S, L+2S, ... (clipped at n-1); the one that scores t ends at the first
  // end >= t and starts L before it.
  const int64_t k = (t - L + S - 1) / S;
  const int64_t end = std::min(L + k * S, n - 1);
  return std::max<int64_t>(0, end - L);
}

// Brute force: score every target t with its own forward pass over exactly the context the
// definition gives it, taking the last position's log-probability. by_position[p]: the NLL
// summed over the targets scored at window position p (their input's place in the window).
// `share_passes`: targets with the same context start take their log-probabilities from one
// pass over the longest of their contexts (the same numbers for a causal model, whose earlier
// positions never see later tokens; a test above checks that), for streams of thousands.
static double brute_force_nll(TransformerLM& model, const TokenStream& stream, int64_t n, int64_t L,
                              int64_t S, std::vector<double>* by_position = nullptr,
                              std::vector<int64_t>* counts = nullptr, bool share_passes = false) {
  torch::NoGradGuard no_grad;
  const int32_t* data = stream.data();
  double nll = 0;
  for (int64_t t = 1; t < n;) {
    const int64_t start = context_start(t, n, L, S);
    int64_t last = t;  // the targets t..last share this pass
    if (share_passes)
      while (last + 1 < n && context_start(last + 1, n, L, S) == start) ++last;
    auto context = torch::empty({1, last - start}, torch::kLong);
    for (int64_t p = start; p < last; ++p) context[0][p - start] = data[p];
    auto logp = torch::log_softmax(model->forward(context)[0], -1);  // (last - start, V)
    for (; t <= last; ++t) {
      const double target_nll = -logp[t - start - 1][data[t]].item<double>();
      nll += target_nll;
      if (by_position) (*by_position)[size_t(t - start - 1)] += target_nll;
      if (counts) (*counts)[size_t(t - start - 1)] += 1;
    }
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
      std::vector<std::pair<int64_t, int64_t>> progress;  // (done, total) after each batch
      spec.on_progress = [&](int64_t done, int64_t total) { progress.emplace_back(done, total); };
      auto r = evaluate(model, corpus, corpus.valid, spec);
      REQUIRE(r.scored_tokens == n - 1);
      REQUIRE(progress.size() >= 2);
      for (size_t i = 0; i < progress.size(); ++i) {
        CHECK(progress[i].second == r.windows);
        CHECK(progress[i].first > (i ? progress[i - 1].first : 0));
      }
      CHECK(progress.back().first == r.windows);
      const double expected = brute_force_nll(model, corpus.valid, n, L, S);
      REQUIRE(r.nll_sum == Approx(expected).epsilon(1e-5));
      REQUIRE(r.perplexity == Approx(std::exp(expected / double(n - 1))).epsilon(1e-5));
      REQUIRE(r.bits_per_byte == Approx(expected / (std::log(2.0) * double(n - 1))).epsilon(1e-5));
    }
  }
}

TEST_CASE("the bin edges are single positions up to 8, then four an octave, ending at the length",
          "[eval]") {
  REQUIRE(position_bin_edges(1) == std::vector<int64_t>{0, 1});
  REQUIRE(position_bin_edges(5) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  REQUIRE(position_bin_edges(40) ==
          std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 13, 16, 19, 23, 27, 32, 38, 40});
  for (int64_t L : {2, 9, 64, 100, 1000, 16384}) {
    const auto edges = position_bin_edges(L);
    REQUIRE(edges.front() == 0);
    REQUIRE(edges.back() == L);
    for (size_t i = 1; i < edges.size(); ++i) REQUIRE(edges[i] > edges[i - 1]);
    for (size_t i = 2; i + 1 < edges.size(); ++i)  // no bin wider than a fifth of its start
      REQUIRE(double(edges[i] - edges[i - 1]) <= std::max(1.0, 0.2 * double(edges[i - 1]) + 1));
  }
}

TEST_CASE("the loss by position in the window sums back to the total and equals brute force",
          "[eval]") {
  auto corpus = testing::tiny_byte_corpus(2);
  auto model = tiny_model("alibi");
  const int64_t n = 61;
  for (auto [L, S] : std::vector<std::pair<int64_t, int64_t>>{{16, 0}, {16, 5}, {12, 1}}) {
    INFO("L " << L << " S " << S);
    EvalSpec spec;
    spec.length = L;
    spec.stride = S;
    spec.max_tokens = n;
    spec.batch_tokens = 24;
    const auto r = evaluate(model, corpus, corpus.valid, spec);
    std::vector<double> nll(L, 0.0);
    std::vector<int64_t> counts(L, 0);
    brute_force_nll(model, corpus.valid, n, L, S, &nll, &counts);
    double total = 0;
    int64_t tokens = 0;
    const auto edges = position_bin_edges(L);
    size_t next = 0;  // bins without tokens are left out
    for (size_t b = 0; b + 1 < edges.size(); ++b) {
      double expected = 0;
      int64_t count = 0;
      for (int64_t p = edges[b]; p < edges[b + 1]; ++p) {
        expected += nll[p];
        count += counts[p];
      }
      if (count == 0) continue;
      REQUIRE(next < r.by_position.size());
      const PositionBin& bin = r.by_position[next++];
      REQUIRE(bin.begin == edges[b]);
      REQUIRE(bin.end == edges[b + 1]);
      REQUIRE(bin.scored_tokens == count);
      REQUIRE(bin.nll_sum == Approx(expected).epsilon(1e-5));
      total += bin.nll_sum;
      tokens += bin.scored_tokens;
    }
    REQUIRE(next == r.by_position.size());
    REQUIRE(tokens == r.scored_tokens);
    REQUIRE(total == Approx(r.nll_sum).epsilon(1e-12));
  }
}

// The evaluator projects a batch's scored rows to logits kLogitChunkRows at a time. Batches
// here hold two whole chunks and end in the middle of a third, in both modes, and a second
// batch and a last, shorter window follow: every target of every chunk must be scored
// against its own token, at its own position in the window.
TEST_CASE("batches of several logit chunks, ending mid-chunk, equal brute force token by token",
          "[eval]") {
  // The chunk: 4,096 rows, or fewer where a row's logits are many (about 16 MiB a chunk).
  CHECK(logit_chunk_rows(257) == kLogitChunkRows);
  CHECK(logit_chunk_rows(8000) == 524);
  CHECK(logit_chunk_rows(128256) == kLogitChunkMinRows);
  CHECK(logit_chunk_rows(int64_t(1) << 40) == kLogitChunkMinRows);
  auto corpus = testing::tiny_byte_corpus(300);
  auto model = tiny_model("alibi");
  const int64_t L = 64;
  const int64_t n = 3 * kLogitChunkRows + 1;  // targets in two batches: 2.x chunks, then the rest
  REQUIRE(corpus.valid.size() >= n);
  for (int64_t S : {int64_t(0), int64_t(16)}) {
    INFO("stride " << S);
    EvalSpec spec;
    spec.length = L;
    spec.stride = S;
    spec.max_tokens = n;
    // Windows a batch: 2.5 chunks of scored targets (a sliding window scores its last S).
    const int64_t scored_per_window = S > 0 ? S : L;
    spec.batch_tokens = L * (5 * kLogitChunkRows / 2 / scored_per_window);
    const int64_t scored_first_batch = spec.batch_tokens / L * scored_per_window;
    REQUIRE(scored_first_batch > 2 * kLogitChunkRows);
    REQUIRE(scored_first_batch % kLogitChunkRows != 0);
    REQUIRE(scored_first_batch < n - 1);

    const auto r = evaluate(model, corpus, corpus.valid, spec);
    REQUIRE(r.scored_tokens == n - 1);
    std::vector<double> nll(L, 0.0);
    std::vector<int64_t> counts(L, 0);
    const double expected = brute_force_nll(model, corpus.valid, n, L, S, &nll, &counts,
                                            /*share_passes=*/true);
    REQUIRE(r.nll_sum == Approx(expected).epsilon(1e-6));
    // Every window position's loss, so that a chunk matched to the wrong targets or the wrong
    // positions cannot cancel out in the total.
    const auto edges = position_bin_edges(L);
    REQUIRE(r.by_position.size() == edges.size() - 1);
    for (size_t b = 0; b + 1 < edges.size(); ++b) {
      double bin_nll = 0;
      int64_t bin_count = 0;
      for (int64_t p = edges[b]; p < edges[b + 1]; ++p) {
        bin_nll += nll[size_t(p)];
        bin_count += counts[size_t(p)];
      }
      INFO("bin " << edges[b] << ".." << edges[b + 1]);
      CHECK(r.by_position[b].scored_tokens == bin_count);
      CHECK(r.by_position[b].nll_sum == Approx(bin_nll).epsilon(1e-6));
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

TEST_CASE("the masked-LM selection depends on the seed and the position only, 80/10/10", "[eval]") {
  const int64_t n = 20000;
  int64_t selected = 0, masked = 0, random = 0, kept = 0;
  for (int64_t p = 0; p < n; ++p) {
    const int32_t token = int32_t(p % 251);
    const auto d = mask_decision(p, token, 0.15, 1234, 256, 257);
    // Neither the token nor anything else but (seed, position) decides the selection.
    REQUIRE(mask_decision(p, (token + 7) % 256, 0.15, 1234, 256, 257).selected == d.selected);
    if (!d.selected) {
      REQUIRE(d.input == token);
      continue;
    }
    ++selected;
    if (d.input == 256) {
      ++masked;
    } else {
      REQUIRE(d.input >= 0);  // a random replacement is a real token, never <mask>
      REQUIRE(d.input < 256);
      ++(d.input == token ? kept : random);
    }
  }
  // Binomial: 15% of 20000 is 3000 +- 50; within the selection 80/10/10 (+- 1.3% each).
  CHECK(std::abs(double(selected) - 3000.0) < 250.0);
  CHECK(std::abs(double(masked) / double(selected) - 0.8) < 0.03);
  CHECK(std::abs(double(random) / double(selected) - 0.1) < 0.03);  // a few "random" equal the token
  CHECK(std::abs(double(kept) / double(selected) - 0.1) < 0.03);
  // Another seed selects other positions.
  int64_t same = 0;
  for (int64_t p = 0; p < 2000; ++p)
    same += mask_decision(p, 0, 0.15, 1234, 256, 257).selected && mask_decision(p, 0, 0.15, 99, 256, 257).selected;
  CHECK(same < 100);  // independent selections share about 0.15^2 x 2000 = 45
}

// Brute force for the masked LM with non-overlapping windows: each window [b, b + L) on its own
// forward pass, its selected positions corrupted, the loss on each selected position's original
// token. `scored` receives the positions.
static double brute_force_masked_nll(TransformerLM& model, const Corpus& corpus, int64_t n,
                                     int64_t L, int64_t seed, std::vector<int64_t>& scored) {
  torch::NoGradGuard no_grad;
  const int32_t* data = corpus.valid.data();
  double nll = 0;
  scored.clear();
  for (int64_t begin = 0; begin < n; begin += L) {
    const int64_t size = std::min(L, n - begin);
    auto input = torch::empty({1, size}, torch::kLong);
    std::vector<int64_t> selected;
    for (int64_t p = 0; p < size; ++p) {
      const auto d = mask_decision(begin + p, data[begin + p], 0.15, seed, corpus.mask_token,
                                   corpus.vocab_size);
      input[0][p] = d.input;
      if (d.selected) selected.push_back(p);
    }
    auto logp = torch::log_softmax(model->forward(input)[0].to(torch::kFloat64), -1);  // (T, V)
    for (int64_t p : selected) {
      nll -= logp[p][data[begin + p]].item<double>();
      scored.push_back(begin + p);
    }
  }
  return nll;
}

TEST_CASE("masked-LM evaluation equals a brute-force computation on the same positions for every method and length",
          "[eval]") {
  auto corpus = testing::tiny_byte_corpus(20);
  const int64_t n = 300;
  REQUIRE(corpus.valid.size() >= n);
  for (const char* position : {"alibi_symmetric", "rotary"}) {
    auto model = tiny_model(position, /*causal=*/false);
    for (int64_t L : {int64_t(16), int64_t(64), n}) {
      INFO(position << " L " << L);
      EvalSpec spec;
      spec.length = L;
      spec.max_tokens = n;
      spec.batch_tokens = 100;  // several batches and a ragged last window
      spec.mask_seed = 1234;
      auto r = evaluate(model, corpus, corpus.valid, spec);
      std::vector<int64_t> positions;
      const double expected = brute_force_masked_nll(model, corpus, n, L, 1234, positions);
      REQUIRE(positions.size() > 20);  // about 15% of 300
      REQUIRE(positions.size() < 80);
      REQUIRE(r.scored_tokens == int64_t(positions.size()));
      // Equal sums for both methods at every length: each scored exactly these positions.
      REQUIRE(r.nll_sum == Approx(expected).epsilon(1e-5));
    }
  }
}

// The architecture written out in fp64 from the model's own parameters, with attention as
// explicit loops: pre-LN blocks x + attn(LN(x)), then h + FFN(LN(h)), a final LayerNorm, the
// token embedding scaled by sqrt(d_model), logits from the (tied or separate) output matrix,
// and ALiBi's -m_h |i - j| (with the causal mask when causal).
static torch::Tensor forward_by_hand(TransformerLM& model, const Config& config,
                                     const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const auto params = model->named_parameters();
  auto P = [&](const std::string& name) { return params[name].detach().to(torch::kFloat64); };
  const int64_t T = tokens.size(0), D = config.model.d_model, H = config.model.heads, Dh = D / H;
  const bool causal = config.model.causal();
  auto layer_norm = [](const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
    const auto mean = x.mean(-1, true);
    const auto var = (x - mean).pow(2).mean(-1, true);
    return (x - mean) / (var + 1e-5).sqrt() * w + b;
  };
  auto linear = [&](const torch::Tensor& x, const std::string& name) {
    return torch::matmul(x, P(name + ".weight").t()) + P(name + ".bias");
  };
  auto x = P("embedding.weight").index_select(0, tokens) * std::sqrt(double(D));  // (T, D)
  for (int64_t l = 0; l < config.model.layers; ++l) {
    const std::string block = "blocks." + std::to_string(l) + ".";
    const auto qkv = linear(layer_norm(x, P(block + "ln_attention.weight"), P(block + "ln_attention.bias")),
                            block + "attention.qkv");  // (T, 3D): q, k, v, each head by head
    auto y = torch::zeros({T, D}, torch::kFloat64);
    auto a = qkv.accessor<double, 2>();
    auto out = y.accessor<double, 2>();
    for (int64_t h = 0; h < H; ++h) {
      const double m = std::pow(2.0, -8.0 * double(h + 1) / double(H));
      for (int64_t i = 0; i < T; ++i) {
        std::vector<double> score(size_t(T), -INFINITY);
        double top = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (int64_t e = 0; e < Dh; ++e) dot += a[i][h * Dh + e] * a[j][D + h * Dh + e];
          score[size_t(j)] = dot / std::sqrt(double(Dh)) - m * double(std::abs(i - j));
          top = std::max(top, score[size_t(j)]);
        }
        double total = 0;
        for (auto& s : score) total += (s = std::exp(s - top));
        for (int64_t j = 0; j < T; ++j)
          for (int64_t e = 0; e < Dh; ++e) out[i][h * Dh + e] += score[size_t(j)] / total * a[j][2 * D + h * Dh + e];
      }
    }
    x = x + linear(y, block + "attention.out");
    auto f = linear(layer_norm(x, P(block + "ln_ffn.weight"), P(block + "ln_ffn.bias")), block + "ffn_in");
    f = config.model.activation == Activation::relu ? f.clamp_min(0.0)
                                                    : 0.5 * f * (1.0 + torch::erf(f / std::sqrt(2.0)));
    x = x + linear(f, block + "ffn_out");
  }
  x = layer_norm(x, P("ln_final.weight"), P("ln_final.bias"));
  return torch::matmul(x, (config.model.tie_embeddings ? P("embedding.weight") : P("head.weight")).t());
}

TEST_CASE("the model's forward pass equals the architecture written out by hand", "[model]") {
  for (bool causal : {true, false}) {
    INFO((causal ? "causal, alibi, gelu, tied" : "bidirectional, alibi_symmetric, relu, untied"));
    Config config = testing::tiny_config(causal ? "alibi" : "alibi_symmetric");
    if (!causal) {
      config.model.objective = Objective::masked_lm;
      config.model.activation = Activation::relu;
      config.model.tie_embeddings = false;
    }
    torch::manual_seed(3);
    auto model = build_model(config, 257);
    model->eval();
    // Non-trivial LayerNorm and bias parameters, so that dropping any of them shows.
    {
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) p.add_(0.1 * torch::randn_like(p));
    }
    const auto tokens = torch::randint(0, 256, {11}, torch::kLong);
    const auto expected = forward_by_hand(model, config, tokens);
    torch::NoGradGuard no_grad;
    const auto actual = model->forward(tokens.unsqueeze(0))[0].to(torch::kFloat64);
    REQUIRE(actual.sizes() == expected.sizes());
    CHECK((actual - expected).abs().max().item<double>() < 1e-4 * expected.abs().max().item<double>());
  }
}
